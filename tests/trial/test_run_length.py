"""The run a result is for: one-off costs (compiling) charged over it, so that a compile the run does not repay never
wins; and --run-length read from the command line."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.cli.parsing import parse_run_length
from autotune.errors import UserError
from autotune.knobs.config import TrialConfig
from autotune.trial.run_length import RunLength, run_rate
from autotune.trial.window_record import WindowMeasurement


def test_one_epoch_without_compiling_is_the_objective_as_it_was() -> None:
    """1 epoch, no compile: epoch samples over (epoch at the window's rate + one loader restart), as before."""
    assert run_rate(10.0, 1000, 5.0, 0.0, RunLength()) == pytest.approx(1000 / (100 + 5))
    assert run_rate(10.0, 1000, 0.0, 0.0, RunLength(epochs=7)) == pytest.approx(10.0)


def test_a_compile_is_paid_once_over_the_run_and_wins_only_when_the_run_repays_it() -> None:
    """OpenNMT's shape (pytorch issue 93468): +8% steady, minutes of compiling. Eager 100/s; compiled 108/s after
    520 s of compiling, on a 10 000-sample epoch."""
    eager = lambda run: run_rate(100.0, 10_000, 0.0, 0.0, run)  # noqa: E731
    compiled = lambda run: run_rate(108.0, 10_000, 0.0, 520.0, run)  # noqa: E731
    assert compiled(RunLength()) < 0.2 * eager(RunLength())  # one 100-s epoch cannot repay 520 s
    assert compiled(RunLength(epochs=100)) > eager(RunLength(epochs=100))  # 100 epochs repay it
    # Break-even: 520 s saved at 100/s -> 108/s needs 520 / (1/100 - 1/108) samples, about 70 epochs.
    assert compiled(RunLength(epochs=60)) < eager(RunLength(epochs=60)) < compiled(RunLength(epochs=80))
    assert compiled(RunLength(epochs=None, hours=1)) < eager(RunLength(epochs=None, hours=1))
    assert compiled(RunLength(epochs=None, hours=24)) > eager(RunLength(epochs=None, hours=24))
    assert run_rate(108.0, 10_000, 0.0, 7200.0, RunLength(epochs=None, hours=1)) == 0.0  # never trains


def test_loader_restarts_are_charged_each_epoch_and_compiling_once() -> None:
    rate = run_rate(10.0, 100, 2.0, 30.0, RunLength(epochs=3))
    assert rate == pytest.approx(300 / (3 * (10 + 2) + 30))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1ep", RunLength(epochs=1.0)),
        ("3", RunLength(epochs=3.0)),
        ("2.5 epochs", RunLength(epochs=2.5)),
        ("12h", RunLength(epochs=None, hours=12.0)),
        ("90m", RunLength(epochs=None, hours=1.5)),
        ("1h30m", RunLength(epochs=None, hours=1.5)),
    ],
)
def test_run_length_reads_epochs_or_a_training_time(text: str, expected: RunLength) -> None:
    assert parse_run_length(text) == expected
    assert RunLength.from_dict(expected.to_dict()) == expected


@pytest.mark.parametrize("text", ["", "0", "0h", "-3ep", "three epochs", "5 fortnights"])
def test_a_run_length_that_is_no_length_is_a_one_line_user_error(text: str) -> None:
    with pytest.raises(UserError, match="cannot read --run-length") as error:
        parse_run_length(text)
    assert "\n" not in str(error.value) and error.value.exit_code == 2


def test_a_bad_run_length_stops_the_cli_before_any_trial(tmp_path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    arguments = ["run", "--model", "cam++", "--run-length", "soon", "--results-dir", str(tmp_path)]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2
    assert "cannot read --run-length 'soon'" in result.output and "Traceback" not in result.output
    assert not any(tmp_path.iterdir())  # nothing written


def _window(epoch_boundary_s: float | None) -> WindowMeasurement:
    """A 10-s window of 100 samples (10 samples/s), ten steps, a loader that started in 1 s."""
    return WindowMeasurement(
        samples=100,
        audio_s=300.0,
        window_s=10.0,
        loader_start_s=1.0,
        epoch_boundary_s=epoch_boundary_s,
        step_times_s=[1.0] * 10,
        step_samples=[10] * 10,
        step_audio_s=[30.0] * 10,
    )


@pytest.mark.parametrize("boundary_s", [2.0, None], ids=["measured", "a trial's cold start"])
def test_the_stand_in_corpus_is_charged_no_per_epoch_cost(boundary_s: float | None) -> None:
    """Epochs of autotune's synthetic corpus are no training's: its new epochs are measured but not charged, so the
    objective is the steady rate; the user's --epoch-samples charges the same wait over the user's epoch."""
    config = TrialConfig(per_device_batch_size=10, num_workers=2, persistent_workers=False)
    window = _window(boundary_s)
    restart = boundary_s if boundary_s is not None else 1.0
    charged = window.summary(100, config, RunLength())
    assert charged["samples_per_second"] == pytest.approx(100 / (10 + restart))
    stand_in = window.summary(100, config, RunLength(per_epoch_costs=False))
    assert stand_in["samples_per_second"] == pytest.approx(10.0)
    assert stand_in["epoch_boundary_s"] == boundary_s  # still reported


def test_an_epoch_holds_a_sample() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        RunLength(epoch_samples=0)


def test_the_objective_prices_epochs_of_the_users_corpus_where_the_run_is_told_it() -> None:
    """RunPlan.objective_run_length: --epoch-samples, --epoch-hours through the data's audio per sample, the data's
    own epochs, and none on the synthetic stand-in."""
    from types import SimpleNamespace

    from autotune.run.plan import RunPlan, RunRequest

    def run_length(synthetic: bool, **asked: Any) -> RunLength:
        data = SimpleNamespace(
            describe=lambda: {"synthetic": synthetic, "n_utterances": 2000, "total_audio_hours": 2.0}
        )
        plan = SimpleNamespace(request=RunRequest(model="cam++", **asked), data=data)
        return RunPlan.objective_run_length(plan)  # type: ignore[arg-type]

    assert run_length(False) == RunLength()  # the user's data: its epochs
    assert run_length(True) == RunLength(per_epoch_costs=False)
    assert run_length(True, epoch_samples=1_000_000) == RunLength(epoch_samples=1_000_000)
    assert run_length(True, epoch_hours=2000.0) == RunLength(epoch_samples=2_000_000)  # 3.6 s a sample
    hours = run_length(False, epoch_hours=10.0, run_length=RunLength(epochs=None, hours=4.0))
    assert hours == RunLength(epochs=None, hours=4.0, epoch_samples=10_000)
