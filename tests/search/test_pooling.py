"""Pooled estimates: a leader's throughput from its own windows and its neighbours' (autotune/search/pooling.py)."""

from __future__ import annotations

import math
import random

import pytest

from autotune.knobs.config import TrialConfig
from autotune.search.candidates import (
    Candidate,
    TrialRecord,
    config_key,
    group_by_config,
    noise_variance,
    pick_winner,
    weighted_logs,
)
from autotune.search.pooling import MIN_REPEAT_DF, knob_values, pooled_estimates
from autotune.trial import TrialResult


def _config(workers: int, prefetch: int = 2, precision: str = "bf16") -> TrialConfig:
    return TrialConfig(per_device_batch_size=64, num_workers=workers, prefetch_factor=prefetch, precision=precision)


def _records(config: TrialConfig, rates: list[float], start: int = 0) -> list[TrialRecord]:
    return [
        TrialRecord(
            number=start + i,
            role="search",
            config=config,
            result=TrialResult(status="ok", samples_per_second=r, window_samples_per_second=r, wall_s=10.0),
        )
        for i, r in enumerate(rates)
    ]


def test_a_configuration_is_its_knobs_with_the_workloads_own_knobs_beside_them():
    config = TrialConfig(per_device_batch_size=16, workload_knobs={"batch_type": "dynamic"})
    values = dict(knob_values(Candidate(config=config, records=[])))
    assert values["per_device_batch_size"] == "16" and values["workload.batch_type"] == "'dynamic'"
    assert "world_size" not in values and "workload_knobs" not in values


def test_the_noise_is_pooled_over_repeated_windows_only():
    once = Candidate(config=_config(1), records=_records(_config(1), [100.0]))
    twice = Candidate(config=_config(2), records=_records(_config(2), [100.0, 110.0]))
    variance, df = noise_variance([once, twice])
    assert df == 1 and variance == pytest.approx((math.log(110) - math.log(100)) ** 2 / 2)


def test_a_window_counts_by_its_length():
    """A long run's confirmation measures longer windows than its search (search/confirmation.py): a window's noise is
    white (an H200's fell as 1/sqrt(length)), so a 160-s window weighs four 40-s ones, in the noise and in the
    estimates."""
    config = _config(1)
    records = _records(config, [100.0, 110.0])
    records[0].result.window_s, records[1].result.window_s = 40.0, 160.0
    long_short = Candidate(config=config, records=records)
    [windows] = weighted_logs([long_short])  # the unit: the median window, 100 s
    assert windows == [(math.log(100.0), 0.4), (math.log(110.0), 1.6)]
    variance, df = noise_variance([long_short])
    mean = (0.4 * math.log(100.0) + 1.6 * math.log(110.0)) / 2.0
    expected = 0.4 * (math.log(100.0) - mean) ** 2 + 1.6 * (math.log(110.0) - mean) ** 2
    assert df == 1 and variance == pytest.approx(expected)
    # the estimates: five configurations measured twice, one of them once for 40 s at 100 and once for 160 s at 110
    others = [Candidate(config=_config(w), records=_records(_config(w), [100.0, 101.0])) for w in (2, 3, 4, 5)]
    for candidate in others:
        for record in candidate.records:
            record.result.window_s = 40.0
    estimates = pooled_estimates([long_short, *others])
    assert estimates is not None
    assert estimates[config_key(config)] > math.exp((math.log(100.0) + math.log(110.0)) / 2)  # nearer the long one


def test_no_estimate_until_repeated_windows_tell_the_noise():
    records = _records(_config(4), [100.0, 101.0]) + _records(_config(8), [120.0], start=2)
    assert MIN_REPEAT_DF > 1 and pooled_estimates(list(group_by_config(records).values())) is None


def _landscape(seed: int) -> tuple[list[Candidate], dict[str, float]]:
    """A data-bound plateau: throughput set by the workers (1000 samples/s at 16), prefetch and precision within 1%;
    5% window noise. Every configuration measured once; 16 workers with prefetch 4 ten times."""
    rng = random.Random(seed)
    truth: dict[str, float] = {}
    records: list[TrialRecord] = []
    for workers in (8, 12, 16):
        for prefetch in (2, 4, 8):
            for precision in ("bf16", "fp16", "tf32"):
                config = _config(workers, prefetch, precision)
                rate = 1000.0 * workers / 16 * (1 + 0.002 * prefetch) * (0.99 if precision == "tf32" else 1.0)
                truth[config_key(config)] = rate
                windows = 10 if (workers, prefetch, precision) == (16, 4, "bf16") else 1
                noisy = [rate * math.exp(rng.gauss(0.0, 0.05)) for _ in range(windows)]
                records += _records(config, noisy, start=len(records))
    return list(group_by_config(records).values()), truth


def test_pooling_with_neighbours_estimates_single_windows_better_than_the_windows_themselves():
    own_error, pooled_error = 0.0, 0.0
    for seed in range(5):
        candidates, truth = _landscape(seed)
        estimates = pooled_estimates(candidates)
        assert estimates is not None
        for candidate in candidates:
            actual = truth[config_key(candidate.config)]
            own_error += (math.log(candidate.median) - math.log(actual)) ** 2
            pooled_error += (math.log(estimates[config_key(candidate.config)]) - math.log(actual)) ** 2
    assert pooled_error < 0.5 * own_error


def test_a_well_measured_configuration_keeps_close_to_its_own_mean():
    candidates, _ = _landscape(0)
    estimates = pooled_estimates(candidates)
    assert estimates is not None
    (measured,) = [c for c in candidates if len(c.values) == 10]
    own = math.exp(sum(math.log(v) for v in measured.values) / 10)
    assert estimates[config_key(measured.config)] == pytest.approx(own, rel=0.02)


def test_the_winner_is_chosen_by_the_estimate_and_reports_its_own_median():
    lucky = Candidate(config=_config(8), records=_records(_config(8), [130.0]))
    steady = Candidate(config=_config(16), records=_records(_config(16), [120.0, 121.0]))
    winner, reason = pick_winner([lucky, steady], {config_key(lucky.config): 110.0, config_key(steady.config): 120.5})
    assert winner is steady and reason == "fastest by pooled estimate" and winner.median == 120.5
    assert pick_winner([lucky, steady]) == (lucky, "fastest by median")
