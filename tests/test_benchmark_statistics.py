"""The statistics behind the benchmarks' published numbers (benchmarks/ is scripts, not a package: loaded by path)."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_noise_floor_chunks_a_steady_rate_into_equal_chunks():
    noise_floor = _load("noise_floor")
    marks = [(0.5 * step, 5 * step) for step in range(61)]  # 10 samples/s for 30 s, a step every 0.5 s
    rates = noise_floor._chunks(marks, 3.0)
    assert len(rates) == 10 and all(rate == pytest.approx(10.0) for rate in rates)
    assert "+-0.0%" in noise_floor._describe(rates)
    assert "too few" in noise_floor._describe(noise_floor._chunks(marks, 20.0))


def test_noise_floor_sees_a_slow_phase():
    noise_floor = _load("noise_floor")
    marks, samples = [], 0
    for step in range(40):  # 1 s steps: 10 samples each, then 5 each from the 20th second
        marks.append((float(step), samples))
        samples += 10 if step < 20 else 5
    rates = noise_floor._chunks(marks, 10.0)
    assert rates == pytest.approx([10.0, 10.0, 5.0])


def test_regret_interval_is_zero_for_a_clear_winner_and_wide_for_a_tie():
    efficiency = _load("search_efficiency")
    remeasured = {"fast": [30.0, 30.5, 29.5, 30.2, 29.8], "slow": [24.0, 24.5, 23.5, 24.2, 23.8]}
    assert efficiency._regret_interval("fast", remeasured, {}) == (0.0, 0.0)
    low, high = efficiency._regret_interval("slow", remeasured, {})
    assert 0.17 < low <= high < 0.23  # about 1 - 24/30 = 20%
    tied = {"a": [30.0, 27.0, 29.0, 31.0, 26.0], "b": [28.0, 31.0, 27.5, 30.5, 28.5]}
    low, high = efficiency._regret_interval("a", tied, {})
    assert low == 0.0 and high > 0.02  # cannot tell them apart: the interval starts at zero
    assert efficiency._regret_interval("never re-measured", tied, {}) is None


def test_regret_interval_counts_a_better_grid_only_figure():
    efficiency = _load("search_efficiency")
    remeasured = {"pick": [20.0, 20.0, 20.0]}
    assert efficiency._regret_interval("pick", remeasured, {"pick": 99.0, "other": 25.0}) == (
        pytest.approx(0.2),
        pytest.approx(0.2),
    )
    assert efficiency._spread([9.0, 10.0, 11.0]) == pytest.approx(0.1)


def test_search_efficiency_measures_the_shipped_cpu_seeds(tmp_path):
    from autotune import space
    from tests.conftest import make_cpu

    efficiency = _load("search_efficiency")
    path = tmp_path / "space.yaml"
    path.write_text(efficiency.slice_space_text())
    shipped = space.read(efficiency.SHIPPED_SPACE)["cpu"]["seeds"]
    seeds = space.load(path, make_cpu(2)).seeds
    assert len(seeds) == len(shipped) >= 2
    for seed, original in zip(seeds, shipped, strict=True):
        assert seed["per_device_batch_size"] == original["per_device_batch_size"]
        assert seed["num_workers"] == original["num_workers"] and seed["precision"] == original["precision"]
        assert seed["intra_op_threads"] == 2  # auto: this machine's cores, within the slice's 1-2


def _recorded_run(path: Path, figure) -> Path:
    """A search_efficiency.py result file over its slice: one grid window per configuration (figure(config)), the
    top five re-measured five times with +-2% noise, 17 s a trial."""
    from autotune import space
    from autotune.knobs.config import TrialConfig
    from tests.conftest import make_cpu

    space_file = path.parent / "slice.yaml"
    space_file.write_text(_load("search_efficiency").slice_space_text())
    configs = [TrialConfig.from_params(point) for point in space.load(space_file, make_cpu(2)).points()]
    grid = [
        {"role": "search", "config": c.short(), "status": "ok", "samples_per_second": figure(c), "wall_s": 17.0}
        for c in configs
    ]
    top = sorted(configs, key=lambda c: -figure(c))[:5]
    reference = {
        c.short(): {"grid": figure(c), "remeasured": [figure(c) * f for f in (0.98, 0.99, 1, 1.01, 1.02)]} for c in top
    }
    path.write_text(json.dumps({"exhaustive grid": grid, "reference samples/s": reference}))
    return path


def _throughput(config) -> float:
    """bf16 on two threads without workers is far ahead: any reasonable search finds it."""
    value = 10.0 * (2.0 if config.precision == "bf16" else 1.0) * config.intra_op_threads
    return value * (1.5 if config.num_workers == 0 else 1.0) * (1.0 + config.per_device_batch_size / 100)


def test_replay_runs_the_real_search_on_recorded_figures_and_its_budget(tmp_path):
    replay = _load("replay")
    recorded = replay.Recorded.load(_recorded_run(tmp_path / "run.json", _throughput))
    assert recorded.grid_s == pytest.approx(36 * 17.0)
    assert sorted(recorded.deviations)[0] == pytest.approx(0.98) and len(recorded.deviations) == 25
    best = "bs=32 w=0 bf16 thr=2"
    assert max(recorded.reference, key=recorded.reference.get) == best
    cam = replay.slice_space()
    # 15% of 612 s is 92 s, a ceiling: a trial starts only if it will end (at 17 s) before the quarter kept for
    # confirmation. Baseline, both CPU seeds, one search trial; then the one confirmation that still fits.
    roles = ["baseline", "seed", "seed", "search", "confirm"]
    for outcome in (replay.replay(recorded, cam, 0.15, seed) for seed in range(3)):
        assert [record.role for record in outcome.records] == roles
        assert outcome.elapsed_s == pytest.approx(5 * 17.0) and outcome.stopped_by == "budget"
        assert outcome.winner.config.short() == best  # the second CPU seed is this best
    row = replay.summarise(recorded, cam, 0.15, reps=2)
    assert row["within 2%"] == "100%" and row["mean regret"] == "0.0%" and row["noise (sd of windows)"] == "1.4%"


def test_replay_judges_a_pick_on_its_reference_figure(tmp_path):
    replay = _load("replay")

    def one_thread_fp32_is_best(config) -> float:  # everything else, the baseline included, is 30% behind
        return 30.0 if config.precision == "fp32" and config.intra_op_threads == 1 else 21.0

    recorded = replay.Recorded.load(_recorded_run(tmp_path / "run.json", one_thread_fp32_is_best))
    # 37 s of a 612-s grid: room for the baseline and one 17-s seed (a budget under one honest trial is refused)
    row = replay.summarise(recorded, replay.slice_space(), 0.06, reps=2)
    assert row["within 2%"] == "0%" and row["mean regret"] == "30.0%"


def test_ablation_flips_each_knob_the_winner_changed_back_to_the_recipe():
    from autotune.knobs.config import TrialConfig

    ablation = _load("ablation")
    recipe = TrialConfig(
        per_device_batch_size=256, num_workers=16, prefetch_factor=2, pin_memory=True, precision="fp32"
    )
    winner = TrialConfig(per_device_batch_size=32, num_workers=0, pin_memory=True, precision="bf16")
    flipped = ablation.flips(winner, recipe)
    assert set(flipped) == {"per_device_batch_size 32 -> 256", "num_workers 0 -> 16", "precision bf16 -> fp32"}
    assert flipped["precision bf16 -> fp32"] == TrialConfig(
        per_device_batch_size=32, num_workers=0, pin_memory=True, precision="fp32"
    )
    # prefetch_factor differs (unset against 2) but does not exist without workers: no row for it.
    assert not any(name.startswith("prefetch_factor") for name in flipped)


def test_ablation_flips_the_loader_order_and_checkpointing_back():
    """in_order and activation_checkpointing get their rows like any knob; the order only with workers."""
    from autotune.knobs.config import TrialConfig

    ablation = _load("ablation")
    recipe = TrialConfig(per_device_batch_size=256, num_workers=16, activation_checkpointing=True)
    winner = TrialConfig(per_device_batch_size=256, num_workers=4, in_order=False, activation_checkpointing=False)
    flipped = ablation.flips(winner, recipe)
    assert set(flipped) == {"num_workers 4 -> 16", "in_order False -> True", "activation_checkpointing False -> True"}
    assert flipped["in_order False -> True"].in_order is True
    assert flipped["activation_checkpointing False -> True"].activation_checkpointing is True
    back = flipped["num_workers 4 -> 16"]
    assert (back.in_order, back.activation_checkpointing) == (False, False)  # only the one knob changes


def test_ablation_sends_worker_only_knobs_back_with_the_workers():
    from autotune.knobs.config import TrialConfig

    ablation = _load("ablation")
    recipe = TrialConfig(per_device_batch_size=32, num_workers=0, precision="fp32")
    winner = TrialConfig(
        per_device_batch_size=32, num_workers=4, prefetch_factor=8, persistent_workers=True, precision="fp32"
    )
    flipped = ablation.flips(winner, recipe)
    back = flipped["num_workers 4 -> 0"]
    assert (back.num_workers, back.prefetch_factor, back.persistent_workers) == (0, None, False)
    assert flipped["prefetch_factor 8 -> None"].prefetch_factor is None
    conformer_recipe = TrialConfig(
        per_device_batch_size=16, workload_knobs={"batch_type": "static", "max_frames_in_batch": 12000}
    )
    conformer_winner = TrialConfig(
        per_device_batch_size=16, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 48000}
    )
    names = set(ablation.flips(conformer_winner, conformer_recipe))
    assert names == {"batch_type dynamic -> static", "max_frames_in_batch 48000 -> 12000"}


def _window(rate: float, cv: float | None, window_s: float, steps: int):
    from autotune.trial import TrialResult

    return TrialResult(
        status="ok",
        samples_per_second=rate,
        window_samples_per_second=rate,
        throughput_cv=cv,
        window_s=window_s,
        window_steps=steps,
    )


def test_window_noise_splits_the_spread_into_the_quarters_part_and_the_rest():
    """window_noise.py: a window's variance is the quarters' (the population CV of n parts over n - 1) plus a
    per-trial part; the white density q makes the quarters' part at length L sqrt(q / L)."""
    window_noise = _load("window_noise")
    # four-part windows (16 steps over 40 s) with a quarters' CV of 6%: within^2 = 0.06^2 / 3
    results = [_window(rate, 0.06, 40.0, 16) for rate in (100.0, 112.0, 92.0, 104.0)]
    found = window_noise.split(results)
    total2 = statistics.variance([math.log(r.samples_per_second) for r in results])
    assert found.trials == 4 and found.window_s == 40.0
    assert found.total == pytest.approx(math.sqrt(total2))
    assert found.objective == pytest.approx(found.total)  # the objective is the window's rate here
    assert found.within == pytest.approx(0.06 / math.sqrt(3))
    assert found.per_trial == pytest.approx(math.sqrt(total2 - 0.06**2 / 3))
    # nothing left per trial when the quarters explain more than the spread
    calm = window_noise.split([_window(rate, 0.2, 40.0, 16) for rate in (100.0, 100.5)])
    assert calm.per_trial == 0.0
    # q from two lengths, weighted by trials: within^2 x L
    short = window_noise.Split(window_s=10.0, trials=2, total=0.05, within=0.04, per_trial=0.03)
    long = window_noise.Split(window_s=40.0, trials=2, total=0.035, within=0.02, per_trial=0.029)
    assert window_noise.white_density([short, long]) == pytest.approx((0.04**2 * 10 + 0.02**2 * 40) / 2)


def test_window_noise_counts_parts_as_the_trial_loop_cuts_them():
    """A window of 3 steps has one part (throughput_cv's rule: two steps and a second each), so it says nothing of
    the noise within it; one trial alone has no spread."""
    window_noise = _load("window_noise")
    assert window_noise.window_parts(_window(10.0, 0.0, 6.0, 3)) == 1
    assert window_noise.within_variance(_window(10.0, 0.0, 6.0, 3)) is None
    assert window_noise.window_parts(_window(10.0, 0.1, 3.5, 8)) == 3  # three 1-s parts in 3.5 s
    assert window_noise.within_variance(_window(10.0, 0.1, 3.5, 8)) == pytest.approx(0.01 / 2)
    assert window_noise.split([_window(10.0, 0.1, 40.0, 16)]) is None
    assert window_noise.timing(25.0).max_window_s == 25.0
    assert window_noise.timing(25.0).min_timed_share == 0.0


def test_amp_floor_rejection_rate_is_exact_on_the_empirical_draws():
    """amp_floor.py: a rule (runs, margin) rejects an AMP draw d when every one of `runs` fp32 draws strayed less than
    d / margin; on empirical draws that is F(d / m) ** runs, averaged over the AMP draws."""
    amp_floor = _load("amp_floor")
    fp32 = [0.1, 0.2, 0.3, 0.4]
    # d = 0.5: 0.5 / 2 = 0.25 -> F = 2/4; d = 0.1: F(0.05) = 0
    assert amp_floor.rejection_rate(fp32, [0.5, 0.1], runs=1, margin=2.0) == pytest.approx((0.5 + 0.0) / 2)
    assert amp_floor.rejection_rate(fp32, [0.5, 0.1], runs=3, margin=2.0) == pytest.approx((0.125 + 0.0) / 2)
    # strictly less: a floor equal to d / m allows d
    assert amp_floor.rejection_rate(fp32, [0.4], runs=1, margin=2.0) == pytest.approx(0.25)
    assert amp_floor.rejection_rate(fp32, [10.0], runs=2, margin=1.5) == 1.0


def test_window_noise_reads_back_the_h200_run_it_printed():
    """The H200's run reached its time limit before writing its table: the committed table is read from its log, and
    every printed window counts (their 'headroom' came from the peak-memory bug, not from the windows)."""
    window_noise = _load("window_noise")
    log = BENCHMARKS / "results" / "budget-lab" / "window_noise-h200.log"
    found = window_noise.read_log(log.read_text())
    assert sorted(found) == [5.0, 20.0] and [len(found[5.0]), len(found[20.0])] == [5, 4]
    first = found[5.0][0]
    assert first.window_samples_per_second == pytest.approx(1262.33) and first.throughput_cv == pytest.approx(0.049)
    assert first.window_steps == 25 and first.wall_s == pytest.approx(46.0)
    short, long = window_noise.split(found[5.0]), window_noise.split(found[20.0])
    assert short.total == pytest.approx(0.0265, abs=5e-4) and long.total == pytest.approx(0.0127, abs=5e-4)
    assert long.within == pytest.approx(0.0091, abs=5e-4)
    table = (BENCHMARKS / "results" / "budget-lab" / "window_noise-h200.md").read_text()
    assert "| 5 | 5.1 | 5 | 2.65% |" in table and "| 20 | 20.2 | 4 | 1.27% |" in table
