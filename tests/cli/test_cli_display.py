"""What a run shows: the summary's assessment lines, drawn from a result's metrics, and the live budget plan."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from rich.console import Console

from autotune.cli.display import _print_assessment, _stopped_line


def _shown(metrics: dict) -> str:
    console = Console(file=io.StringIO(), width=200)
    _print_assessment(console, metrics)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_a_pipeline_above_its_ceiling_is_shown_as_at_the_ceiling():
    compute = {"flops_per_sample": 1.0e10, "achieved_tflops": 0.148, "ceiling_samples_per_second": 13.35}
    above = _shown({"compute": {**compute, "pipeline_efficiency": 1.1021}})
    assert "pipeline efficiency 110% (at the ceiling: above 100% is measurement noise)" in above
    below = _shown({"compute": {**compute, "pipeline_efficiency": 0.62}})
    assert "pipeline efficiency 62%" in below and "measurement noise" not in below


def test_the_measurement_noise_is_shown_when_something_was_measured_twice():
    noise = {"configurations": 3, "median_spread_fraction": 0.14, "max_spread_fraction": 0.261}
    assert (
        "measurement noise: repeated windows of one configuration spread 14% (median over 3 re-measured; up to 26%)"
        in _shown({"noise": noise})
    )
    assert "measurement noise" not in _shown({"noise": {"configurations": 0}})


def test_a_precision_the_amp_check_had_no_time_to_judge_is_shown_as_not_judged_not_as_rejected():
    """A check cut short keeps bf16's curve (52.8% off fp32's, beyond the 5% tolerance) without fp32's noise floor,
    which decides it where training is chaotic: shown as rejected it contradicted a bf16 winner in the same summary."""
    from autotune.trial.amp_check import AmpCheckResult
    from autotune.trial.amp_curves import PrecisionVerdict

    strays = PrecisionVerdict(
        precision="bf16", accepted=False, max_deviation_fraction=0.528, allowed_deviation_fraction=0.05
    )
    cut = AmpCheckResult(status="partial", verdicts=[strays], final=[], settings={"steps": 20})
    shown = _shown({"amp_check": cut.report()})
    assert "AMP check bf16: not judged (the check's time ran out first: not rejected), its loss curve strays up to" in (
        shown
    )
    done = AmpCheckResult(status="ok", verdicts=[strays], final=["bf16"], settings={"steps": 20})
    assert "AMP check bf16: rejected, its loss curve strays up to 52.8%" in _shown({"amp_check": done.report()})


def test_the_budget_plan_is_drawn_live_above_the_trial_bar():
    from rich.console import Group
    from rich.progress import TextColumn

    from autotune.cli.display import _PlanProgress
    from autotune.search.budget import BudgetPlan, Stage

    plan = BudgetPlan(
        budget_s=300.0,
        elapsed_s=95.0,
        stages=(
            Stage(name="AMP check", done=1, spent_s=36.0),
            Stage(name="baseline", done=1, spent_s=45.0),
            Stage(name="seeds", done=1, planned=1, spent_s=14.0, expected_s=20.0),
            Stage(name="search", planned=4, expected_s=80.0),
            Stage(name="confirmation", note="once two configurations are measured"),
        ),
    )
    text = plan.describe()
    assert text == (
        "plan: 1.6 of 5.0 min: AMP check 1 done | baseline 1 done | seeds 1/2, ~20 s more | search 0/4, ~80 s more | "
        "confirmation once two configurations are measured"
    )
    progress = _PlanProgress(TextColumn("{task.description}"), console=Console(file=io.StringIO()))
    progress.add_task("#2 seed: bs=32 w=0 bf16", total=3)
    progress.plan_text = text
    console = Console(file=io.StringIO(), width=250)
    console.print(Group(*progress.get_renderables()))
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert drawn.index("plan: 1.6 of 5.0 min") < drawn.index("#2 seed")


def test_the_summary_reads_the_typed_measurements_and_says_why_a_baseline_has_none():
    import dataclasses
    from types import SimpleNamespace

    from autotune.cli.display import print_summary
    from autotune.search.settings import TuningOutcome
    from tests.result.test_results import make_tuned

    winner = {"status": "ok", "samples_per_second": 123.456, "measurements": 3, "setup_s": 2.0, "trial_wall_s": 20.0}
    outcome = TuningOutcome(records=[], baseline=None, winner=None, stopped_by="trials", elapsed_s=60.0)

    def shown(baseline: dict) -> list[str]:
        tuned = make_tuned()
        tuned = dataclasses.replace(
            tuned, metrics={"winner": winner, "baseline": baseline}, search={**tuned.search, "stopped_by": "trials"}
        )
        console = Console(file=io.StringIO(), width=200)
        plan = SimpleNamespace(request=SimpleNamespace(settings=SimpleNamespace(budget_s=None)), started_s=0.0)
        report = SimpleNamespace(tuned=tuned, outcome=outcome, written=True, result_path="r.yaml", plan=plan)
        print_summary(console, report)
        lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
        return [" ".join(line.replace("│", " ").split()) for line in lines]

    failed = shown({"status": "oom", "reason": "out of memory"})
    assert "samples/s (median) 123.5 oom" in failed and "measurements 3 oom" in failed
    assert "trial setup s / wall s 2.0 / 20.0 -" in failed
    assert "samples/s (median) 123.5 -" in shown({})  # no baseline in this run
    assert not any(line.startswith("new epoch's wait s") for line in failed)  # nothing measured it
    winner["epoch_start_s"] = 1.4  # a small corpus: each epoch's first batch waited (trial/epoch_boundary.py)
    assert "new epoch's wait s 1.400 oom" in shown({"status": "oom", "reason": "out of memory"})


def test_the_closing_line_gives_the_whole_run_beside_the_search():
    """A 15-min run whose search stopped at 8 min said 'after 8.0 min', as if 7 were unused, while the set-up, the AMP
    check and the ceiling had spent them: the line now names both, and the budget."""
    started = time.monotonic() - 14 * 60
    report = SimpleNamespace(
        plan=SimpleNamespace(request=SimpleNamespace(settings=SimpleNamespace(budget_s=900.0)), started_s=started),
        outcome=SimpleNamespace(elapsed_s=480.0),
        tuned=SimpleNamespace(search={"stopped_by": "budget"}),
    )
    expected = "search stopped by budget after 8.0 min; the run took 14.0 min of its 15.0-min budget"
    assert _stopped_line(report) == expected
    report.plan.request.settings.budget_s = None
    report.tuned.search["stopped_by"] = "trials"
    assert _stopped_line(report).endswith("the run took 14.0 min")


def test_a_trial_whose_epochs_mix_moved_its_figure_shows_the_windows_own_rate_beside_it():
    from autotune.cli.display import _mix_text
    from autotune.trial import TrialResult

    moved = TrialResult(status="ok", samples_per_second=27.64, window_samples_per_second=29.25, epoch_mix_factor=0.945)
    assert "window 29.2, x0.94 for the epoch's mix" in _mix_text(moved)
    assert _mix_text(TrialResult(status="ok", window_samples_per_second=29.0, epoch_mix_factor=0.99)) == ""
    assert _mix_text(TrialResult(status="ok", window_samples_per_second=29.0)) == ""  # fixed-length crops


def test_the_speedup_range_says_what_the_measurements_support():
    """A baseline of one window carries this machine's noise unmeasured: where the run measured its noise and the
    windows' range is narrower, the line gives the speedup within that noise, and says the baseline had one window."""
    from autotune.cli.display import _speedup_range, _spread
    from autotune.result.measurements import Measurements

    windows = {"low": 3.85, "high": 4.0, "winner_measurements": 2, "baseline_measurements": 1}
    noisy = _speedup_range(3.93, {"speedup_range": windows, "noise": {"median_spread_fraction": 0.17}})
    assert "3.85-4.00x across 2 winner and 1 baseline window(s)" in noisy
    assert "the baseline rests on one window, and repeated windows here disagree by 17%: about 3.26-4.60x" in noisy
    quiet = _speedup_range(3.93, {"speedup_range": windows, "noise": {"median_spread_fraction": 0.01}})
    assert quiet == " (3.85-4.00x across 2 winner and 1 baseline window(s); the baseline rests on one window)"
    assert _spread(Measurements.from_dict({"status": "ok", "samples_per_second": 2.2, "measurements": 1})) == (
        "- (one window)"
    )


def test_the_live_display_fits_80_and_120_columns():
    """Each live line is cut to the terminal's width: a line wider than the terminal wraps, and every redraw of a
    wrapped live line leaves its fragments in the scrollback."""
    from rich.console import Group

    from autotune.cli.display import RichReporter
    from autotune.search.budget import BudgetPlan, Stage
    from autotune.search.settings import TunerSettings

    plan = BudgetPlan(
        budget_s=900.0,
        elapsed_s=186.0,
        stages=(
            Stage(name="set-up", done=1, spent_s=60.0),
            Stage(name="AMP check", done=1, spent_s=120.0),
            Stage(name="baseline", planned=1, expected_s=130.0),
            Stage(name="seeds", planned=2, expected_s=120.0),
            Stage(name="search", note="the time the others leave"),
            Stage(name="confirmation", note="once two configurations are measured"),
            Stage(name="ceiling", planned=1, expected_s=60.0),
        ),
    )
    for width in (80, 120):
        console = Console(file=io.StringIO(), width=width, force_terminal=True)
        reporter = RichReporter(console, TunerSettings())
        reporter.progress.plan_text = plan.describe()
        reporter.progress.update(reporter.task, description="#12 search: bs=32 w=1 pf=4 persist bf16 thr=2")
        console.print(Group(*reporter.progress.get_renderables()))
        lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
        assert len(plan.describe()) > 120 and len(lines) == 2, lines  # the plan and the bar, one line each
        assert "(--trials 24 + 6 confirmations)" in console.file.getvalue() or width == 80  # type: ignore[attr-defined]


def test_a_library_warning_prints_through_the_console_as_a_word_not_a_logger_line(monkeypatch):
    """Log records go through the stderr console (above a live display, not through it), as 'warning: ...'."""
    import logging

    from autotune.cli import output

    console = Console(file=io.StringIO(), width=120)
    monkeypatch.setattr(output, "stderr_console", console)
    logger = logging.getLogger("autotune.search.confirmation")
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "budget spent [%s]", ("x",), None)
    output.ConsoleLogHandler().emit(record)
    assert console.file.getvalue() == "warning: budget spent [x]\n"  # type: ignore[attr-defined]


def test_the_cli_s_logging_set_up_prints_a_library_warning_as_the_word_and_the_message_alone(monkeypatch):
    """Through `setup_logging` as every command calls it: basicConfig formats a handler that has no formatter as
    'WARNING:autotune.run.assessment:...', which printed 'warning: WARNING:autotune...' after the word."""
    import importlib
    import logging

    from autotune.cli import output

    cli_app = importlib.import_module("autotune.cli.app")  # the package's `app` is the Typer application
    console = Console(file=io.StringIO(), width=200)
    monkeypatch.setattr(output, "stderr_console", console)
    monkeypatch.setattr(logging.root, "handlers", [])  # basicConfig configures only a root without handlers
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    cli_app.setup_logging(verbose=False)
    logging.getLogger("autotune.run.assessment").warning("the ceiling was not measured: %s", "no room")
    assert console.file.getvalue() == "warning: the ceiling was not measured: no room\n"  # type: ignore[attr-defined]
