"""`autotune run` with torch.compile in the space, as a user runs it on a CPU (inductor, g++): the compiled trials
report their compile, and over the default run length (one epoch of the data) a compile that cannot be repaid loses
to eager, however fast its steady state."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from tests.fixtures.inductor import NEEDS_INDUCTOR

pytestmark = [pytest.mark.slow, NEEDS_INDUCTOR]
FAULTY = "tests.fixtures.faulty_workload:workload"
QUICK = ["--window", "0.3", "--warmup-steps", "1", "--device", "cpu", "--no-prune", "--trial-timeout", "3m"]
SPACE = """\
workload: faulty
params:
  compile: {type: categorical, choices: ["off", dynamic]}
fixed: {per_device_batch_size: 5, num_workers: 0}
baseline: {compile: "off"}
"""


def test_a_compile_one_epoch_cannot_repay_does_not_win(tiny_corpus: Path, tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    out = tmp_path / "result.yaml"
    arguments = ["run", "--model", FAULTY, "--space", str(space_file), "--data", str(tiny_corpus)]
    arguments += ["--results-dir", str(tmp_path / "results"), "--out", str(out), *QUICK]
    arguments += ["--sampler", "grid", "--trials", "3", "--confirm", "0", "--no-amp-check", "--no-ceiling"]
    result = CliRunner().invoke(app, arguments, catch_exceptions=False)  # the baseline, then the grid's two points
    assert result.exit_code == 0, result.output
    tuned = load_config(out)
    # 64 vectors an epoch, a millisecond a step: seconds of compiling are never repaid within one epoch.
    assert tuned.config.compile == "off" and tuned.compile_kwargs() is None
    assert tuned.metrics["run_length"] == {"epochs": 1.0, "hours": None, "epoch_samples": None, "per_epoch_costs": True}
    assert "compile_s" not in tuned.metrics["winner"]
    storage = f"sqlite:///{tmp_path / 'results' / 'studies.db'}"
    (study,) = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    compiled = [t.user_attrs["result"] for t in trials if t.user_attrs["config"]["compile"] == "dynamic"]
    assert compiled and all(r["status"] == "ok" and r["compile_s"] > 0.2 for r in compiled)
    assert all(r["samples_per_second"] < 0.5 * r["window_samples_per_second"] for r in compiled)  # charged
    assert "compile " in result.stderr and "recompiles" in result.stderr  # the trial line shows the cost
