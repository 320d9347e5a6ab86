"""The warm-up and window rules by step time (trial/steady.py), as pure functions."""

from __future__ import annotations

import pytest

from autotune.trial.spec import TimingSettings
from autotune.trial.steady import expected_trial_s, settled, transient_front, warmup_done, window_target_s


@pytest.mark.parametrize(("times", "settled_now"), [([1.0, 0.5, 0.52], True), ([1.0, 0.5], False), ([0.5], False)])
def test_settled(times, settled_now):
    assert settled(times, 0.2) is settled_now


def test_settled_compares_chunks_so_a_loader_delivering_in_bursts_settles():
    bursty = [2.0] + [0.09, 0.01] * 20  # one step waits for its batch, the next finds it ready
    assert not settled(bursty, 0.2)  # step by step it never agrees
    assert settled(bursty, 0.2, chunk_s=0.5)


def test_warm_up_needs_its_steps_and_seconds_and_settles_only_where_asked():
    timing = TimingSettings(warmup_steps=1, window_s=10.0)  # warm-up 1 to 30 s
    assert not warmup_done([0.3, 0.3], timing, require_settled=False)  # under a second
    assert warmup_done([12.0], timing, require_settled=False)  # one long step: start-up is in it
    assert not warmup_done([12.0], timing, require_settled=True)  # the forward rule needs two to agree
    assert warmup_done([12.0, 10.5], timing, require_settled=True)
    assert warmup_done([5.0, 20.0, 11.0], timing, require_settled=True)  # 31 s after the first: the cap
    assert not warmup_done([5.0, 20.0, 6.0], timing, require_settled=True)  # 26 s after it: must still settle


def test_the_warm_up_cap_counts_from_the_second_step_so_a_long_start_up_is_never_the_window_s_front():
    """On an H200 a fresh CAM++ trial's first step took 31 s (gpu_proof-h200.md): past the 30-s cap at once, the window
    began right after it with nothing seen to settle."""
    timing = TimingSettings(warmup_steps=1, window_s=10.0)
    assert not warmup_done([31.0], timing, require_settled=True)
    assert not warmup_done([31.0, 0.4], timing, require_settled=True)  # one step after it: nothing to compare yet
    steady = [31.0] + [0.19] * 8  # chunks of 0.5 s: three steps each
    assert warmup_done(steady, timing, require_settled=True)
    assert warmup_done([31.0] + [0.19, 0.5] * 60, timing, require_settled=True)  # never settles: capped after 30 s
    assert warmup_done([31.0], timing, require_settled=False)  # a CPU rank judges with hindsight instead


def test_the_window_is_worth_three_times_the_trials_cost_before_it_within_bounds():
    timing = TimingSettings(window_s=10.0, min_timed_share=0.75, max_window_factor=6.0)  # up to 60 s
    assert window_target_s(2.0, timing) == 10.0  # window_s is the floor
    assert window_target_s(8.0, timing) == pytest.approx(24.0)
    assert window_target_s(100.0, timing) == 60.0  # a long setup (preloading) does not buy a 5-min window
    assert window_target_s(100.0, TimingSettings(window_s=10.0, min_timed_share=0.0)) == 10.0
    # a long run's confirmation trial asks for a longer window (search/confirmation.py); warm-up keeps window_s's scale
    longer = TimingSettings(window_s=10.0, min_timed_share=0.75, max_window_factor=6.0, window_at_least_s=150.0)
    assert window_target_s(8.0, longer) == 150.0 and longer.min_warmup_s == timing.min_warmup_s
    assert expected_trial_s(0.1, 5.0, longer) == pytest.approx(5.0 + 10.5 * 0.1 + 150.0)  # start, warm-up, window


@pytest.mark.parametrize(
    ("times", "front"),
    [
        ([1.5, 1.2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 1),  # a slow start-up front: its quarter goes to warm-up
        ([1.2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 1),  # (and the next check, on the rest, takes the next slow step)
        ([0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2),  # a fast front (a queue filled at start-up drains): too
        ([1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0, 1.0], 0),  # steady: kept whole
        ([1.0, 1.0], 0),  # too short to judge
    ],
)
def test_transient_front_trims_either_way(times, front):
    assert transient_front(times, [8] * len(times), 0.1) == front


def test_transient_front_judges_throughput_not_step_time():
    # Utterances of different lengths: long steps carry more audio; the front is as fast as the rest.
    times = [2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert transient_front(times, [20.0] + [10.0] * 7, 0.1) == 0


def test_expected_trial_s_follows_the_rules():
    timing = TimingSettings(window_s=10.0, min_window_steps=4, min_timed_share=0.75, max_window_factor=6.0)
    # A 12-s CPU step: one warm-up step (taken as 1.5), then 3 x (3 + 18) = 63 s of window, capped at 60: 5 steps.
    assert expected_trial_s(12.0, 3.0, timing) == pytest.approx(3.0 + 18.0 + 60.0)
    # A 50-ms GPU step: 20 warm-up steps for the second; the window 3 x (3 + 1.025) = 12.1 s.
    assert expected_trial_s(0.05, 3.0, timing) == pytest.approx(3.0 + 1.025 + 12.1, abs=0.05)
