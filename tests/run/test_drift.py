"""Drift verdicts against a previous result, and a real rerun that finds a regression: exit 3, YAML untouched."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import yamlio
from autotune.cli import app
from autotune.cli.exit import EXIT_REGRESSION
from autotune.knobs.config import TrialConfig
from autotune.result import history
from autotune.result.tuned_config import TunedConfig, load_config, write_config
from autotune.run.drift import REGRESSION_EXIT_CODE, environment_diff, judge
from autotune.search.candidates import Candidate, TrialRecord
from autotune.search.warmstart import PreviousResult
from autotune.trial import TrialResult
from tests.conftest import make_cuda
from tests.fixtures.runs import run_args

OLD = TrialConfig(per_device_batch_size=64, num_workers=4, precision="bf16")
NEW = TrialConfig(per_device_batch_size=128, num_workers=8, precision="bf16")
HARDWARE = make_cuda().to_dict()


def _previous(rate: float = 100.0, **hardware: str) -> PreviousResult:
    tuned = TunedConfig(
        workload={"name": "cam++", "model": "cam++", "task": "speaker", "options": {}},
        config=OLD,
        device_type="cuda",
        metrics={"winner": {"status": "ok", "samples_per_second": rate}},
        hardware={**HARDWARE, **hardware},
        data={},
        search={},
        created="2026-11-01T02:30:00+00:00",
        autotune_version="0.1.0",
    )
    return PreviousResult(path=Path("results/cam++/a100.yaml"), tuned=tuned)


def _measured(config: TrialConfig, *rates: float, status: str = "ok") -> Candidate:
    records = [
        TrialRecord(
            number=i, role="previous", config=config, result=TrialResult(status=status, samples_per_second=rate)
        )
        for i, rate in enumerate(rates)
    ]
    return Candidate(config=config, records=records)


def _judge(previous, again, winner, threshold=0.10):
    return judge(previous=previous, again=again, winner=winner, threshold=threshold, hardware=HARDWARE, version="0.1.0")


def test_the_exit_code_is_documented_and_distinct():
    assert EXIT_REGRESSION == REGRESSION_EXIT_CODE == 3
    assert "3 regression" in CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output


def test_without_a_previous_result_the_new_one_is_written():
    verdict = _judge(None, None, _measured(NEW, 90.0))
    assert verdict.write and not verdict.regression


def test_a_slower_previous_winner_is_a_regression_with_the_environment_diff():
    previous = _previous(100.0, torch_version="2.3.1", driver_version="550.54")
    again = _measured(OLD, 52.0, 54.0, 55.0)
    verdict = _judge(previous, again, again)
    assert verdict.regression and not verdict.write
    assert verdict.remeasured_rate == 54.0 and verdict.recorded_rate == 100.0
    text = "\n".join(verdict.lines())
    assert "46.0% below the 100.0 recorded on 2026-11-01" in text and "kept results/cam++/a100.yaml unchanged" in text
    assert "torch 2.3.1 -> x" in text and "driver 550.54 -> 560.35" in text


def test_a_regression_without_environment_change_says_to_look_at_the_machine():
    verdict = _judge(_previous(100.0), _measured(OLD, 80.0), _measured(OLD, 80.0))
    assert verdict.regression and verdict.environment == ()
    assert "no change in torch, CUDA, driver, GPU or autotune versions" in verdict.lines()[1]


def test_a_regression_measured_noisily_says_to_confirm_it_and_still_counts():
    noisy = _judge(_previous(100.0), _measured(OLD, 60.0, 85.0, 70.0), _measured(OLD, 70.0))
    assert noisy.regression  # a real regression must surface even on a noisy machine
    assert "its windows tonight spread 36%, more than the threshold, so confirm with a rerun" in noisy.summary
    steady = _judge(_previous(100.0), _measured(OLD, 69.0, 70.0, 71.0), _measured(OLD, 70.0))
    assert steady.regression and "confirm with a rerun" not in steady.summary


def test_a_previous_winner_that_now_fails_is_a_regression_and_the_new_winner_is_written():
    verdict = _judge(_previous(), _measured(OLD, 0.0, status="oom"), _measured(NEW, 70.0))
    assert verdict.regression and verdict.write and "now fails (oom" in verdict.summary


@pytest.mark.parametrize(
    ("winner_rate", "write"), [(112.0, True), (108.0, False)], ids=["beats-threshold", "within-threshold"]
)
def test_a_new_configuration_is_written_only_when_it_beats_the_threshold(winner_rate, write):
    verdict = _judge(_previous(100.0), _measured(OLD, 100.0, 99.0, 101.0), _measured(NEW, winner_rate))
    assert verdict.write is write and not verdict.regression
    assert ("writing" if write else "kept results/cam++/a100.yaml unchanged") in verdict.summary


def test_the_same_configuration_faster_is_no_churn():
    again = _measured(OLD, 150.0)
    verdict = _judge(_previous(100.0), again, again)
    assert not verdict.write and not verdict.regression and "+50.0% vs recorded" in verdict.summary


@pytest.mark.parametrize(("winner_rate", "write"), [(111.0, True), (105.0, False)], ids=["faster", "not-faster"])
def test_without_a_remeasurement_the_recorded_figure_is_the_bar(winner_rate, write):
    verdict = _judge(_previous(100.0), None, _measured(NEW, winner_rate))
    assert verdict.write is write and not verdict.regression and "was not re-measured" in verdict.summary


def test_environment_diff_names_gpu_and_autotune_changes():
    after = dict(HARDWARE, gpus=[dict(HARDWARE["gpus"][0], name="NVIDIA H100 80GB HBM3")])
    changes = [str(change) for change in environment_diff(HARDWARE, "0.1.0", after, "0.2.0")]
    assert changes == ["GPU NVIDIA A100-SXM4-80GB -> NVIDIA H100 80GB HBM3", "autotune 0.1.0 -> 0.2.0"]


def test_a_rerun_that_finds_a_regression_exits_3_keeps_the_yaml_and_records_the_history(tiny_corpus, tmp_path):
    results = tmp_path / "results"
    cli = CliRunner()
    # No compute-only ceiling (its own tests: test_assessment, test_cli): a trial per run that the verdict never reads.
    first = cli.invoke(app, run_args(tiny_corpus, results, "--trials", "1", "--no-ceiling"))
    assert first.exit_code == 0, first.output
    (path,) = (results / "faulty").glob("*.yaml")
    # As if the previous night had measured a hundred times faster, under another torch. (Ten times was not enough
    # when the first run measured on a machine loaded by other jobs and the second on an idle one: 64x apart.)
    tuned = load_config(path)
    winner = dict(tuned.metrics["winner"], samples_per_second=tuned.metrics["winner"]["samples_per_second"] * 100)
    hardware = dict(tuned.hardware, torch_version="1.0.0")
    write_config(dataclasses.replace(tuned, metrics={**tuned.metrics, "winner": winner}, hardware=hardware), path)
    before = path.read_bytes()

    second = cli.invoke(app, run_args(tiny_corpus, results, "--trials", "2", "--no-ceiling"), terminal_width=300)
    assert second.exit_code == EXIT_REGRESSION, second.output
    output = " ".join(second.output.split())
    assert f"warm start: re-measuring the previous winner bs=5 w=0 fp32 from previous result {path}" in output
    assert "regression: the previous winner bs=5 w=0 fp32 now runs at" in output
    assert f"torch 1.0.0 -> {yamlio.plain(tuned.hardware['torch_version'])}" in output
    assert path.read_bytes() == before  # no churn, even in a regression
    frame = history.load(results, "tests.fixtures.faulty_workload:workload")
    assert len(frame) == 2 and frame["samples_per_second"].iloc[1] < winner["samples_per_second"] * 0.9
