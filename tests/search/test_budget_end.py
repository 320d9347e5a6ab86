"""The budget's end during a trial (search/in_flight.py measure): a real trial subprocess that has timed enough of its
window keeps it, shorter and marked so; one that has not is stopped, as before."""

from __future__ import annotations

import time

from autotune.search.in_flight import RESULT_RESERVE_S, measure
from autotune.trial import TimingSettings, launch
from tests.trial.tiny_setups import faulty_spec

# The faulty workload's batch 7 trains at 0.3 s a step; its rules ask for a window of a minute at least.
LONG_WINDOW = TimingSettings(warmup_steps=1, window_s=60.0, min_warmup_fraction=0.0, min_window_steps=2)


def test_a_trial_the_budget_ends_mid_window_keeps_its_partial_window(tmp_path, tiny_corpus):
    spec = faulty_spec(tmp_path, tiny_corpus, 7, timing=LONG_WINDOW)
    budget_left_s = 25.0
    started = time.monotonic()
    result = measure(
        launch, spec, tmp_path / "trial", None, timeout_s=budget_left_s, cut_by_budget=True, room=lambda s: False
    )
    assert result.status == "ok", (result.reason, result.log_tail)
    assert result.window_cut_by_budget and result.window_planned_s >= 60.0
    assert 2.0 <= result.window_s < budget_left_s - RESULT_RESERVE_S  # what it timed, not what its rules asked
    assert result.window_steps >= 4 and result.throughput_cv is not None  # enough for a spread: its own figure
    assert result.samples_per_second > 0 and result.all_losses_finite
    assert result.wall_s < budget_left_s and time.monotonic() - started < budget_left_s + 1.0  # before the kill


def test_a_trial_the_budget_ends_before_any_window_step_is_stopped(tmp_path, tiny_corpus):
    spec = faulty_spec(tmp_path, tiny_corpus, 7, timing=LONG_WINDOW)
    result = measure(launch, spec, tmp_path / "trial", None, timeout_s=3.0, cut_by_budget=True, room=lambda s: False)
    assert result.status == "stopped" and result.reason.startswith("stopped when --budget ran out")
    assert not result.window_cut_by_budget
