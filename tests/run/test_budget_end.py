"""A run whose --budget ends during its only trial's window concludes with what that window timed, and says the window
was shortened (search/in_flight.py measure, search/budget.py cut_window_notes)."""

from __future__ import annotations

import pytest

from autotune.run.plan import RunRequest
from autotune.search.settings import TunerSettings
from autotune.trial import TimingSettings

# faulty_workload trains at batch 7 at 0.3 s a step; its window's rules ask for a minute at least.
SPACE = """workload: faulty
params:
  per_device_batch_size: {type: categorical, choices: [7]}
fixed: {num_workers: 0}
baseline: {per_device_batch_size: 7}
"""


@pytest.mark.slow
def test_a_run_whose_budget_cuts_its_baseline_mid_window_concludes_with_the_shortened_window(
    tmp_path, tiny_corpus, monkeypatch
):
    """Found on a loaded 2-core machine: `--budget 5m` stopped CAM++'s baseline in its window and the run ended
    "the --budget of 5.0 min ran out before any configuration was measured" (exit 1, no result). The floors that would
    refuse so short a budget before its first trial are lowered here, so that a 30-s budget cuts a 60-s window."""
    from autotune.run import runner, validation
    from autotune.search import budget

    monkeypatch.setattr(validation, "MIN_BUDGET_S", 0.5)
    monkeypatch.setattr(budget, "shortest_trial_s", lambda timing: 0.0)
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    timing = TimingSettings(warmup_steps=1, window_s=60.0, min_warmup_fraction=0.0, min_window_steps=2)
    request = RunRequest(
        model="tests.fixtures.faulty_workload:workload",
        data=str(tiny_corpus),
        space=str(space_file),
        results_dir=str(tmp_path / "results"),
        device="cpu",
        settings=TunerSettings(trials=1, budget_s=30.0, confirm_top_k=0, prune=False, timing=timing),
        warm_start=False,
        compute_ceiling=False,
        amp_check=None,
    )
    report = runner.execute(runner.prepare(request))
    baseline = report.outcome.records[0].result
    assert baseline.status == "ok" and baseline.window_cut_by_budget and baseline.window_s < 30.0
    assert baseline.window_planned_s >= 60.0  # twice that where the calibration found the machine busy
    assert report.outcome.winner is not None and report.outcome.winner.config.per_device_batch_size == 7
    assert report.result_path.exists()
    notes = [note for note in report.tuned.notes if "shortened by --budget" in note]
    assert len(notes) == 1 and "trial #0 (baseline" in notes[0]
    assert f"over {baseline.window_s:.0f} s of the {baseline.window_planned_s:.0f} s its rules asked for" in notes[0]
