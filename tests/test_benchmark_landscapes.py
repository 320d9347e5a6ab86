"""The simulated GPU landscapes (benchmarks/landscapes.py and published_landscapes.py) and one simulated search."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tests.test_benchmark_statistics import _load

landscapes = _load("landscapes")
published = _load("published_landscapes")
LANDSCAPES = published.LANDSCAPES


def _recipe(name: str, **changes):
    landscape = LANDSCAPES[name]
    return landscape, landscape.config({**landscape.space().baseline, **changes})


@pytest.mark.parametrize(
    ("figure", "model", "published", "tolerance"),
    published.calibration(),
    ids=[row[0] for row in published.calibration()],
)
def test_calibration_reproduces_the_published_figures(figure, model, published, tolerance):
    if tolerance is None:
        assert model >= published, figure
    else:
        assert model == pytest.approx(published, rel=tolerance), figure


@pytest.mark.parametrize("name", list(LANDSCAPES))
def test_a_landscape_searches_the_shipped_space_of_its_machine(name):
    landscape = LANDSCAPES[name]
    searched = landscape.space()
    # at least 500 points, counted no further (the conformer's space has some 20 million: walking it took 29 s)
    assert searched.device_type == "cuda" and sum(1 for _ in itertools.islice(searched.iter_points(), 500)) == 500
    assert searched.seeds, "the shipped cuda seeds are part of what is simulated"
    precisions = {
        choice for param in searched.params if param.name == "precision" for choice in param.distribution.choices
    }
    assert precisions == set(landscape.speedup)  # V100: fp32 and fp16 only; Ampere and Ada: all five
    workers = next(param for param in searched.params if param.name == "num_workers").distribution
    assert workers.high == landscape.machine.logical_cores // landscape.machine.devices  # `auto` per rank


def test_conformer_knobs_are_the_workloads():
    from autotune import workloads

    assert LANDSCAPES["conformer 1xRTX4090 short clips"].knobs == workloads.get("conformer").knobs


def test_out_of_memory_cliff_ends_a_trial_early_and_amp_moves_it():
    landscape, fits = _recipe("cam++ 4xV100", per_device_batch_size=256, precision="fp32")
    too_big = dataclasses.replace(fits, per_device_batch_size=384)
    assert landscape.evaluate(fits).status == "ok"
    oom = landscape.evaluate(too_big)
    assert oom.status == "oom" and oom.samples_per_second == 0.0
    assert oom.wall_s < landscape.evaluate(fits).wall_s - landscapes.WINDOW_S  # it fails in its first steps
    assert landscape.evaluate(dataclasses.replace(too_big, precision="fp16")).status == "ok"
    eres, eres_fits = _recipe("eres2net 4xV100")  # the recipe's 64 per GPU; 128 in fp32 does not fit 32 GB
    assert landscape.evaluate(eres_fits).status == "ok"
    assert eres.evaluate(dataclasses.replace(eres_fits, per_device_batch_size=128)).status == "oom"


@pytest.mark.parametrize("name", list(LANDSCAPES))
def test_a_simulated_trial_measures_as_long_a_window_as_a_real_one(name):
    """The window a real trial measures is sized by autotune/trial/steady.py (four fifths of the trial, 10 to 40 s):
    a simulated trial costs the same, where it once measured the 10-s floor alone and cost about half a real one."""
    from autotune.trial import TimingSettings
    from autotune.trial.steady import expected_trial_s, window_target_s

    landscape, config = _recipe(name)
    expected = landscape.evaluate(config)
    window_s = expected.wall_s - expected.until_window_s - landscapes.END_S
    assert window_s == pytest.approx(window_target_s(expected.until_window_s, TimingSettings()))
    assert window_s > 2 * landscapes.WINDOW_S  # GPU start-up of 15-25 s: the window is stretched, up to 40 s
    fixed_s = landscape.start_s + landscapes.END_S
    assert expected.wall_s == pytest.approx(expected_trial_s(expected.step_s, fixed_s, TimingSettings()), rel=0.25)


def test_headroom_band_measures_in_full_and_rejects():
    landscape, config = _recipe("conformer 1xRTX4090 short clips", per_device_batch_size=96, precision="fp32")
    expected = landscape.evaluate(config)
    capacity = landscape.machine.gpu_memory_gib
    assert 0.9 * capacity < expected.peak_memory_gib <= capacity
    assert expected.status == "headroom" and expected.wall_s > landscape.start_s + 10.0


def test_data_bound_plateau_grows_with_workers_until_the_cores_run_out():
    landscape, config = _recipe(
        "conformer 1xRTX4090 short clips", per_device_batch_size=128, precision="bf16", pin_memory=True
    )

    def rate(workers: int) -> float:
        return landscape.evaluate(dataclasses.replace(config, num_workers=workers)).samples_per_second

    assert rate(2) == pytest.approx(2 * rate(1), rel=0.05)  # data-bound: twice the workers, twice the rate
    assert rate(16) > 6 * rate(2)
    assert rate(24) - rate(16) < 0.5 * (rate(16) - rate(8))  # hyper-threads add less than cores
    assert landscape.evaluate(dataclasses.replace(config, num_workers=1)).data_wait_fraction > 0.9


def test_compute_bound_landscape_is_flat_in_workers_and_gains_from_fp16():
    landscape, config = _recipe("cam++ 4xV100", per_device_batch_size=256, pin_memory=True)

    def rate(**changes) -> float:
        return landscape.evaluate(dataclasses.replace(config, **changes)).samples_per_second

    assert rate(num_workers=4) == pytest.approx(rate(num_workers=20), rel=0.01)
    assert rate(num_workers=0) < 0.6 * rate(num_workers=4)  # the main process decodes between steps
    assert rate(precision="fp16") / rate() == pytest.approx(published.V100_FP16, rel=0.05)


def test_small_knobs_move_throughput_by_a_few_percent():
    landscape, config = _recipe(
        "conformer 1xRTX4090 short clips", per_device_batch_size=64, precision="bf16", num_workers=16
    )
    pinned = landscape.evaluate(dataclasses.replace(config, pin_memory=True)).samples_per_second
    unpinned = landscape.evaluate(dataclasses.replace(config, pin_memory=False)).samples_per_second
    assert 1.005 < pinned / unpinned < 1.1
    persistent = landscape.evaluate(dataclasses.replace(config, persistent_workers=True)).samples_per_second
    fresh = landscape.evaluate(dataclasses.replace(config, persistent_workers=False)).samples_per_second
    assert 1.0 < persistent / fresh < 1.02
    tuned = landscape.evaluate(dataclasses.replace(config, cudnn_benchmark=True)).samples_per_second
    assert tuned < 0.9 * landscape.evaluate(config).samples_per_second  # new shapes every step: re-timed


def test_one_simulated_search_runs_the_real_tuner_deterministically():
    simulate = _load("simulate")
    name = "cam++ 4xV100"
    outcome = simulate.search(name, "autotune", 0.05, seed=3)
    roles = [record.role for record in outcome.records]
    assert roles[0] == "baseline" and roles[1:3] == ["seed", "seed"] and "confirm" in roles
    assert outcome.stopped_by == "budget" and outcome.elapsed_s <= 0.05 * simulate.grid_s(name)
    assert outcome.winner is not None and outcome.winner.feasible
    again = simulate.search(name, "autotune", 0.05, seed=3)
    assert [r.config for r in again.records] == [r.config for r in outcome.records]
    assert [r.value for r in again.records] == [r.value for r in outcome.records]
    judged = simulate.judge(name, "autotune", 0.05, seed=3)
    assert judged.regret < 0.05 and judged.touched and judged.led  # the first cuda seed sits on this landscape's best
    unseeded = simulate.search(name, "autotune", 0.05, seed=3, variant=simulate.Variant(seeds=False))
    roles = [record.role for record in unseeded.records]
    assert roles[0] == "baseline" and "seed" not in roles and "search" in roles  # --no-seeds: TPE from the start


def test_seed_changes_measure_the_seeds_as_another_machine_would_have_them():
    """--seed-changes: every seed with the given knobs changed (seeds a few per cent off the best), the rest as
    shipped; the search still runs them first."""
    simulate = _load("simulate")
    name = "cam++ 4xV100"
    variant = simulate.Variant(seed_changes=(("num_workers", 8), ("pin_memory", False)))
    outcome = simulate.search(name, "autotune", 0.05, seed=3, variant=variant)
    seeds = [record.config for record in outcome.records if record.role == "seed"]
    shipped = simulate.shipped_space(name).seeds
    assert len(seeds) == len(shipped) == 2
    assert all(config.num_workers == 8 and config.pin_memory is False for config in seeds)
    assert [config.per_device_batch_size for config in seeds] == [seed["per_device_batch_size"] for seed in shipped]


def test_the_grid_leaves_out_knobs_no_landscape_models():
    """The budgets are fractions of the grid's time: a knob the landscapes ignore must not multiply the grid, or a new
    knob silently makes every budget larger (three such knobs made the conformer's 8x larger:
    benchmarks/README.md#search-at-gpu-scale-simulated). The point counts are those of the recorded figures
    (benchmarks/results/simulate.md)."""
    simulate = _load("simulate")
    counts = {name: sum(1 for _ in simulate.grid_space(name).points()) for name in simulate.LANDSCAPES}
    assert counts == {
        "cam++ 4xV100": 700,
        "eres2net 4xV100": 700,
        "ecapa-tdnn 1xA100": 1500,
        "conformer 1xRTX4090 short clips": 1300,
    }
    for name in simulate.LANDSCAPES:
        assert not set(simulate.UNMODELLED_KNOBS) & {param.name for param in simulate.grid_space(name).params}


def test_confirm_share_sets_the_share_where_the_tuner_reads_it():
    """benchmarks/confirm_share.py measures searches at other confirmation shares. The tuner reads the share in
    search/room.py as well as search/confirmation.py, and a benchmark that patched only one name would measure the
    shipped share: the share must reach every module that holds it, and be restored after."""
    from autotune.search import confirmation, room

    confirm_share = _load("confirm_share")
    shipped = confirmation.LONG_CONFIRM_SHARE
    with confirm_share.confirm_share(0.8):
        assert room.LONG_CONFIRM_SHARE == confirmation.LONG_CONFIRM_SHARE == 0.8
    assert room.LONG_CONFIRM_SHARE == confirmation.LONG_CONFIRM_SHARE == shipped


@pytest.mark.parametrize("name", list(LANDSCAPES))
def test_the_knobs_no_landscape_models_change_nothing_it_evaluates(name):
    """Landscape.best() holds UNMODELLED_KNOBS at one value (the conformer's 20 million points are 410,000
    evaluations): exact only while evaluate() never reads them, on every landscape, at every value the space offers."""
    landscape = LANDSCAPES[name]
    shipped = landscape.space()
    offered = {param.name: param for param in shipped.params if param.name in landscapes.UNMODELLED_KNOBS}
    assert offered, "the shipped spaces search these knobs"
    for start in (shipped.baseline, *shipped.seeds):
        expected = landscape.evaluate(landscape.config(start))
        for knob, param in offered.items():
            for value in param.distribution.choices:
                assert landscape.evaluate(landscape.config({**start, knob: value})) == expected, (knob, value)


def test_white_window_noise_grows_as_a_shorter_window_s_rule_shortens_the_window():
    """simulate.py --white-noise --timing: the H200's window noise fell with the window's length (2.65% at 5 s, 1.27% at
    20 s, benchmarks/results/budget-lab/window_noise-h200.md); a landscape's noise is calibrated at the window the
    shipped rule gives, and a rule that measures a quarter as long draws twice the noise, while the budget stays the
    shipped grid's fraction."""
    simulate = _load("simulate")
    name = "cam++ 4xV100"
    landscape, config = _recipe(name)
    short = dataclasses.replace(landscape, timing=dataclasses.replace(landscape.timing, max_window_factor=1.0))
    shipped_window, short_window = landscape.evaluate(config).window_s, short.evaluate(config).window_s
    assert shipped_window == pytest.approx(4 * short_window)
    white = simulate.Simulator(short, 0, reference=landscape)
    assert white._noise("k", config, short_window) == pytest.approx(2 * landscape.noise)
    assert simulate.Simulator(short, 0)._noise("k", config, short_window) == landscape.noise  # per trial: as drawn
    variant = simulate.Variant(timing=(("max_window_factor", 1.0),))  # white: the default
    cheap = simulate.search(name, "autotune", 0.05, seed=3, variant=variant)
    shipped = simulate.search(name, "autotune", 0.05, seed=3)
    assert len(cheap.records) > len(shipped.records)  # shorter windows: more trials in the same budget
    assert cheap.elapsed_s <= 0.05 * simulate.grid_s(name)


def test_a_simulated_trial_asked_for_a_longer_window_measures_it_and_is_quieter_for_it():
    """A long run's confirmation asks its trials for longer windows (TimingSettings.window_at_least_s,
    autotune/search/confirmation.py): the simulated trial measures that window, costs the difference, and draws the
    white noise of its length."""
    simulate = _load("simulate")
    name = "conformer 1xRTX4090 short clips"
    landscape, config = _recipe(name)
    standard = landscape.evaluate(config)
    timing = dataclasses.replace(landscape.timing, window_at_least_s=4 * standard.window_s)
    spec = simulate.simulated_spec(landscape.workload, config, timing)
    simulator = simulate.Simulator(landscape, 0, reference=landscape)
    result = simulator(spec)
    assert result.window_s == pytest.approx(4 * standard.window_s)
    assert result.wall_s == pytest.approx(standard.wall_s + 3 * standard.window_s, rel=0.01)
    assert simulator._noise("k", config, result.window_s) == pytest.approx(landscape.noise / 2)
