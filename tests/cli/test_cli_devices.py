"""`autotune run --devices N` as a user runs it on a CPU: every trial is N gloo processes; batch semantics explicit."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app

runner = CliRunner()
FAULTY = "tests.fixtures.faulty_workload:workload"
FAST_SPACE = str(Path(__file__).parents[1] / "fixtures" / "fast_space.yaml")
QUICK = ["--window", "0.3", "--warmup-steps", "1", "--device", "cpu", "--no-prune", "--trial-timeout", "2m"]


def _run(tiny_corpus: Path, results_dir: Path, *args: str):
    return runner.invoke(
        app,
        [
            "run",
            "--model",
            FAULTY,
            "--space",
            FAST_SPACE,
            "--data",
            str(tiny_corpus),
            "--results-dir",
            str(results_dir),
            *QUICK,
            *args,
        ],
        catch_exceptions=False,
    )


def test_two_devices_with_a_fixed_global_batch_accumulate_and_say_so(tiny_corpus, tmp_path):
    out = tmp_path / "ddp.yaml"
    result = _run(
        tiny_corpus,
        tmp_path / "results",
        "--devices",
        "2",
        "--global-batch",
        "20",
        "--trials",
        "1",
        "--confirm",
        "0",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "data-parallel on 2 processes (gloo), global batch held at 20" in result.stderr
    tuned = load_config(out)
    config = tuned.config
    # 5 per device x 2 devices x 2 accumulation steps = the 20 asked for.
    assert (config.per_device_batch_size, config.world_size, config.grad_accum_steps) == (5, 2, 2)
    assert config.global_batch_size == 20
    assert tuned.search["study_name"].endswith("-ws2-gb20")
    assert tuned.metrics["epoch"]["devices"] == 2
    winner = tuned.metrics["winner"]
    assert winner["world_size"] == 2 and len(winner["per_rank_samples_per_second"]) == 2
    assert winner["epoch_accounting"]["batches_per_epoch_per_rank"] == [6, 6]  # 64 samples, 32 per rank, 5 a batch
    assert not any("linear scaling" in note for note in tuned.notes)  # the global batch was held fixed
    assert any("--global-batch 20 over 2 device(s) -> 10" in note for note in tuned.notes)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--devices", "0"], "--devices must be at least 1"),
        (["--devices", "4096"], "needs a core per process"),
        (["--global-batch", "0"], "--global-batch must be at least 1"),
        (["--global-batch", "12", "--devices", "2"], "divides --global-batch 12"),
        (["--epoch-hours", "-1"], "--epoch-hours must be positive"),
    ],
    ids=["no-devices", "too-many", "zero-global", "indivisible", "negative-hours"],
)
def test_bad_device_and_batch_arguments_are_one_line_and_exit_2(tiny_corpus, tmp_path, args, words):
    result = _run(tiny_corpus, tmp_path / "results", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "results" / "faulty").exists() or not any((tmp_path / "results" / "faulty").glob("*.yaml"))
