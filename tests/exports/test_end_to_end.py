"""A real `autotune run` result, exported through the CLI and applied in 3D-Speaker's train.py and Lightning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from tests.exports.common import loader_settings
from tests.exports.test_lightning import _dataset, _fit, _Probe
from tests.exports.test_speakerlab import run_train_py

FAST = ["--crop-seconds", "0.5", "--window", "1", "--warmup-steps", "1", "--device", "cpu", "--no-amp-check"]
# CAM++ over small batches; one trial (the baseline: a worker, prefetch, persistent workers) takes seconds.
SPACE = """\
workload: cam++
params:
  per_device_batch_size: {type: categorical, choices: [4, 8]}
  num_workers: {type: categorical, choices: [0, 1]}
  prefetch_factor: {type: int, low: 2, high: 3, when: {num_workers: {at_least: 1}}}
  persistent_workers: {type: categorical, choices: [true], when: {num_workers: {at_least: 1}}}
fixed: {precision: fp32-default, intra_op_threads: 1}
baseline: {per_device_batch_size: 4, num_workers: 1, prefetch_factor: 2, persistent_workers: true}
"""


def _section(printed: str, header: str) -> str:
    """One part of what `autotune export` prints: the lines under '# <header>' up to the next part's header."""
    after = printed.split(f"# {header}\n", 1)[1]
    return re.split(r"\n\n(?=# (?:config override|Python:|command|notes))", after, maxsplit=1)[0]


@pytest.mark.slow
def test_a_real_result_trains_in_3d_speaker_and_lightning(tiny_corpus: Path, tmp_path: Path, monkeypatch) -> None:
    runner = CliRunner()
    out, space = tmp_path / "cam.yaml", tmp_path / "space.yaml"
    space.write_text(SPACE)
    args = ["run", "--model", "cam++", "--data", str(tiny_corpus), "--space", str(space), "--trials", "1"]
    args += ["--confirm", "0", "--no-ceiling"]
    args += ["--max-throughput-cv", "0", "--results-dir", str(tmp_path / "results"), "--out", str(out), *FAST]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    tuned = load_config(out)
    config = tuned.config

    printed = runner.invoke(app, ["export", str(out), "--to", "3d-speaker"], catch_exceptions=False).output
    assert f"Measured: {config.precision} on the CPU" in printed
    workdir = tmp_path / "3d-speaker"
    workdir.mkdir()
    loader, log = run_train_py(workdir, monkeypatch, _section(printed, "command"))
    expected = tuned.dataloader_kwargs()  # what autotune measured, as DataLoader keywords
    settings = loader_settings(loader)
    assert {key: settings[key] for key in expected} == expected
    assert "Epoch: [1][0/" in log

    monkeypatch.chdir(tmp_path)
    snippet = runner.invoke(app, ["export", str(out), "--to", "lightning"], catch_exceptions=False).output
    probe = _Probe()
    trainer = _fit(_section(snippet, "Python: paste into your training script"), {"train_dataset": _dataset(40)}, probe)
    settings = loader_settings(trainer.train_dataloader)
    assert {key: settings[key] for key in expected} == expected
    assert probe.batch_sizes and set(probe.batch_sizes) == {config.per_device_batch_size}
