"""Search at GPU scale, by simulation: the real Tuner over synthetic GPU landscapes, hundreds of searches each.

replay.py replays the Tuner over a CPU run's recorded windows; this does the same over the GPU throughput models of
benchmarks/landscapes.py, which no recorded run covers. Each search runs the real Tuner (the shipped space with its
`cuda:` seeds, TPE, pruning, the budget and its reserve for confirmation, the winner rule) on its own clock, with a
launcher that answers each trial from the landscape (benchmarks/simulated_trials.py): a window drawn around the
configuration's modelled throughput (the landscape's 2-5% noise at the shipped window, falling as 1/sqrt of a longer
window's length as an H200's did), its modelled wall time (an out-of-memory trial
ends in its first steps), and the pruner asked as a live trial asks it (once on a warm-up step, once a quarter into
the window).

Three methods, each under 5% and 10% of the exhaustive grid's time:
- autotune: TPE with the space's seeds, confirmation of the top three twice, as `autotune run` does;
- random: the shipped space sampled at random, no seeds, no confirmation (as search_efficiency.py runs it);
- grid: GRIDS' ladder of the same knobs (700-1200 points: no one grids every worker count), in a seeded random
  order, no pruning, no confirmation. Its complete run is the time the budgets are fractions of.
Regret is judged on the noise-free throughput of the configuration picked against the best of the whole shipped
space (every point evaluated).

    .venv/bin/python benchmarks/simulate.py --out benchmarks/results/simulate.md
    .venv/bin/python benchmarks/simulate.py --methods autotune --searches 100 --tpe '{"n_startup_trials": 10}'

Use it to judge a change to the search on GPU-shaped problems before a GPU run; the target: regret <= 2% in >= 90% of
searches at 5% of the grid's time, on each landscape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import space  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.search.samplers import make_sampler  # noqa: E402
from autotune.search.settings import TunerSettings, TuningOutcome
from autotune.search.tuner import Tuner
from autotune.trial import TimingSettings, TrialSpec
from benchmarks.landscapes import UNMODELLED_KNOBS, without_bucket_batches  # noqa: E402
from benchmarks.published_landscapes import LANDSCAPES  # noqa: E402
from benchmarks.simulated_trials import Simulator  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
WITHIN = 0.02
METHODS = ("autotune", "random", "grid")
# The grid a person would write over the same knobs: a ladder of worker counts, two prefetch depths; ASR with the
# knobs everyone sets (pinned memory, persistent workers) fixed, or its grid would pass 4000 points.
_WORKERS = [0, 1, 2, 4, 8, 16, 32]
_SPEAKER_GRID = {"prefetch_factor": [2, 8]}
GRIDS: dict[str, dict[str, list[Any]]] = {
    "cam++ 4xV100": _SPEAKER_GRID,
    "eres2net 4xV100": _SPEAKER_GRID,
    "ecapa-tdnn 1xA100": _SPEAKER_GRID,
    "conformer 1xRTX4090 short clips": {
        "per_device_batch_size": [8, 16, 32, 64, 128],
        "max_frames_in_batch": [8000, 16000, 24000, 32000, 48000],
        "prefetch_factor": [2, 8],
        "persistent_workers": [True],
        "pin_memory": [True],
    },
}


@cache
def shipped_space(name: str) -> space.SearchSpace:
    return LANDSCAPES[name].space()


@cache
def grid_space(name: str) -> space.SearchSpace:
    """The shipped space with GRIDS' ladders in place of its ranges (conditions and baseline kept)."""
    landscape = LANDSCAPES[name]
    data = without_bucket_batches(space.read(space.space_path(landscape.workload)))  # `extends` merged in
    params = {**data["params"], **(data.get("cuda") or {}).get("params", {})}
    # No landscape models the optimizer kernel, torch.compile, activation checkpointing, where the fbank is computed
    # or the DataLoader's in_order (their GPU gains and costs are not calibrated here): the grid leaves them at the
    # recipe's default, so the grid's time (what the budgets are fractions of) is what it was before the knobs. Left
    # in, the last three multiplied the conformer's grid by 8 (1300 -> 10400 points) and with it every budget: 5% of
    # that grid bought 513 trials instead of about 70, and 99% of searches within 2% measured the larger budget, not
    # the search (benchmarks/README.md#search-at-gpu-scale-simulated).
    for knob in UNMODELLED_KNOBS:
        params.pop(knob, None)
    auto = landscape.machine.logical_cores // landscape.machine.devices
    ladders = {"num_workers": sorted({w for w in _WORKERS if w <= auto} | {auto}), **GRIDS[name]}
    for knob, values in ladders.items():
        params[knob] = {
            "type": "categorical",
            "choices": values,
            **({"when": params[knob]["when"]} if "when" in params[knob] else {}),
        }
    data = {key: value for key, value in data.items() if key not in ("cpu", "cuda")} | {"params": params}
    return space.from_dict(
        data, landscape.machine.hardware(), workload_knobs=landscape.knobs, world_size=landscape.machine.devices
    )


@cache
def best_rate(name: str) -> float:
    return LANDSCAPES[name].best()[1]


@cache
def grid_s(name: str) -> float:
    """The exhaustive grid's time: every point of the grid space in full (no pruning), and the baseline."""
    landscape, grid = LANDSCAPES[name], grid_space(name)
    points = [grid.baseline, *grid.points()]
    return sum(landscape.evaluate(landscape.config(point)).wall_s for point in points)


@dataclass(frozen=True, kw_only=True, slots=True)
class Variant:
    """Changes to the search to try: TPESampler keywords over make_sampler's, TunerSettings fields over the
    method's (JSON on the command line: --tpe '{"n_startup_trials": 10}' --tuner '{"prune_window_fraction": 0.7}');
    seeds=False (--no-seeds): the shipped space without its seeds; seed_changes (--seed-changes '{"pin_memory":
    false, "num_workers": 28}'): every seed with these knobs changed.

    Why --no-seeds: the first `cuda:` seed of CAM++'s and the conformer's spaces is their landscape's best
    configuration (both were written from the same published figures), so with the seeds a search there judges
    mostly confirmation: keeping a best that the first trials already measured. Without them it judges the search
    itself, as on a model or machine the seeds were not written for. Between the two, --seed-changes: seeds a few per
    cent off the best, as seeds written for another machine would be (the conformer's with pin_memory off and 28 of
    its 32 workers are 5.4% off), so that the search has to find the last few per cent from near them."""

    tpe: tuple[tuple[str, Any], ...] = ()
    tuner: tuple[tuple[str, Any], ...] = ()
    seeds: bool = True
    seed_changes: tuple[tuple[str, Any], ...] = ()
    # TimingSettings fields for the trials (--timing '{"max_window_factor": 2}'): their windows and so their cost;
    # the budgets stay fractions of the shipped grid's time
    timing: tuple[tuple[str, Any], ...] = ()
    # a window's noise falls with its length (simulate.Simulator), as an H200's did
    # (benchmarks/results/budget-lab/window_noise-h200.md); False (--per-trial-noise): drawn once per trial whatever its
    # length
    white: bool = True

    def trial_timing(self) -> TimingSettings:
        return dataclasses.replace(TimingSettings(), **dict(self.timing))

    def sampler(self, name: str, searched: space.SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
        if name != "tpe" or not self.tpe:
            return make_sampler(name, searched, seed)
        tpe = optuna.samplers.TPESampler
        with mock.patch.object(optuna.samplers, "TPESampler", lambda **given: tpe(**{**given, **dict(self.tpe)})):
            return make_sampler(name, searched, seed)


def simulated_spec(workload: str, config: TrialConfig, timing: TimingSettings, path: str = "") -> TrialSpec:
    """A trial's spec as the simulated launcher reads it: the configuration and its timing (no data, a GPU)."""
    return TrialSpec(
        workload=workload,
        workload_options={},
        data_file="",
        config=config,
        timing=timing,
        device_type="cuda",
        result_path=path,
    )


def search(name: str, method: str, budget_fraction: float, seed: int, variant: Variant = Variant()) -> TuningOutcome:
    """One search of a landscape under budget_fraction of its grid's time."""
    landscape = LANDSCAPES[name]
    searched = grid_space(name) if method == "grid" else shipped_space(name)
    if not variant.seeds:
        searched = dataclasses.replace(searched, seeds=())
    elif variant.seed_changes:  # the Tuner measures seeds on a TPE search only (random and grid stay unseeded)
        changes = dict(variant.seed_changes)
        searched = dataclasses.replace(searched, seeds=tuple({**seed, **changes} for seed in searched.seeds))
    sampler = {"autotune": "tpe", "random": "random", "grid": "grid"}[method]
    settings = TunerSettings(
        trials=100_000,
        budget_s=budget_fraction * grid_s(name),
        sampler=sampler,
        seed=seed,
        confirm_top_k=3 if method == "autotune" else 0,
        prune=method != "grid",
    )
    if method != "grid":
        settings = dataclasses.replace(settings, **dict(variant.tuner))
    timing = variant.trial_timing()
    settings = dataclasses.replace(settings, timing=timing)
    shipped = landscape
    landscape = dataclasses.replace(landscape, timing=timing) if variant.timing else landscape
    simulator = Simulator(landscape, seed, reference=shipped if variant.white else None)

    def make_spec(config: TrialConfig, path: str) -> TrialSpec:
        return simulated_spec(landscape.workload, config, timing, path)

    with tempfile.TemporaryDirectory() as workdir:
        study = optuna.create_study(direction="maximize", sampler=variant.sampler(sampler, searched, seed))
        tuner = Tuner(
            study=study,
            space=searched,
            make_spec=make_spec,
            settings=settings,
            workdir=Path(workdir),
            world_size=landscape.machine.devices,
            workload_knobs=landscape.knobs,
            launcher=simulator,
            clock=simulator.clock,
        )
        return tuner.run()


@dataclass(kw_only=True, slots=True)
class Searched:
    """What one search found, judged on the landscape's noise-free figures."""

    regret: float
    touched: bool  # measured a configuration within WITHIN of the best at least once
    led: bool  # and kept one among the leaders confirmation re-measured (the rest of a loss is confirmation's)
    trials: int
    time_fraction: float  # of the grid's time


def judge(name: str, method: str, budget_fraction: float, seed: int, variant: Variant = Variant()) -> Searched:
    landscape, best = LANDSCAPES[name], best_rate(name)
    outcome = search(name, method, budget_fraction, seed, variant)
    picked = landscape.evaluate(outcome.winner.config).samples_per_second if outcome.winner else 0.0

    def top(config: TrialConfig) -> bool:
        return landscape.evaluate(config).samples_per_second >= (1 - WITHIN) * best

    return Searched(
        regret=1.0 - picked / best,
        touched=any(top(record.config) for record in outcome.records),
        led=any(top(leader.config) for leader in outcome.confirmed),
        trials=len(outcome.records),
        time_fraction=outcome.elapsed_s / grid_s(name),
    )


def _judge_job(job: tuple[str, str, float, int, Variant]) -> tuple[tuple[str, str, float], Searched]:
    name, method, fraction, seed, variant = job
    return (name, method, fraction), judge(name, method, fraction, seed, variant)


def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autotune").setLevel(logging.ERROR)  # each search's budget warnings, hundreds of times


def summarise(found: list[Searched]) -> dict[str, str]:
    regrets = sorted(item.regret for item in found)
    count = len(regrets)
    return {
        "searches": str(count),
        "within 2%": f"{sum(regret <= WITHIN for regret in regrets) / count:.0%}",
        "mean regret": f"{statistics.mean(regrets):.1%}",
        "median": f"{regrets[count // 2]:.1%}",
        "90th pct": f"{regrets[count * 9 // 10]:.1%}",
        "worst": f"{regrets[-1]:.1%}",
        "measured a top config": f"{sum(item.touched for item in found) / count:.0%}",
        "top config among leaders": f"{sum(item.led for item in found) / count:.0%}",
        "trials (median)": f"{statistics.median(item.trials for item in found):.0f}",
        "time (median, of grid)": f"{statistics.median(item.time_fraction for item in found):.1%}",
    }


def describe(name: str) -> dict[str, str]:
    landscape = LANDSCAPES[name]
    config, rate = landscape.best()
    baseline = landscape.evaluate(landscape.config(shipped_space(name).baseline)).samples_per_second
    return {
        "landscape": name,
        "bottleneck": landscape.bottleneck,
        "shipped space (points)": str(sum(1 for _ in shipped_space(name).iter_points())),
        "grid (points)": str(len(grid_space(name).points())),
        "grid time (h)": f"{grid_s(name) / 3600:.1f}",
        "best (samples/s)": f"{config.short()} ({rate:.0f})",
        "recipe baseline": f"{baseline / rate:.0%} of best",
        "noise": f"{landscape.noise:.0%}",
    }


def table(rows: list[dict[str, str]]) -> list[str]:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row[column] for column in header) + " |" for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", nargs="+", default=list(LANDSCAPES), choices=list(LANDSCAPES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--budget-fractions", type=float, nargs="+", default=[0.05, 0.1])
    parser.add_argument("--searches", type=int, default=200, help="per landscape, method and budget: seeds 0..N-1")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--tpe", type=json.loads, default={}, help="TPESampler keywords to try (JSON)")
    parser.add_argument("--tuner", type=json.loads, default={}, help="TunerSettings fields to try (JSON)")
    parser.add_argument("--no-seeds", action="store_true", help="search without the shipped space's seeds")
    parser.add_argument(
        "--seed-changes",
        type=json.loads,
        default={},
        help="knobs to change in every seed (JSON), as seeds for another machine",
    )
    parser.add_argument("--timing", type=json.loads, default={}, help="TimingSettings fields for the trials (JSON)")
    parser.add_argument(
        "--white-noise", action="store_true", help="a window's noise falls as 1/sqrt(its length): the default"
    )
    parser.add_argument(
        "--per-trial-noise", action="store_true", help="a window's noise drawn once per trial, whatever its length"
    )
    parser.add_argument(
        "--noise", type=float, default=None, help="every landscape's window noise (sd, e.g. 0.02) instead of its own"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here (markdown, and .json)")
    args = parser.parse_args()
    _quiet()
    started = time.monotonic()
    if args.noise is not None:  # before the workers fork: they read the landscapes from here
        for name in args.landscapes:
            LANDSCAPES[name] = dataclasses.replace(LANDSCAPES[name], noise=args.noise)
    described = [describe(name) for name in args.landscapes]  # fills the caches before the workers fork
    variant = Variant(
        tpe=tuple(sorted(args.tpe.items())),
        tuner=tuple(sorted(args.tuner.items())),
        seeds=not args.no_seeds,
        seed_changes=tuple(sorted(args.seed_changes.items())),
        timing=tuple(sorted(args.timing.items())),
        white=not args.per_trial_noise,
    )
    jobs = [
        (name, method, fraction, seed, variant)
        for name in args.landscapes
        for method in args.methods
        for fraction in args.budget_fractions
        for seed in range(args.searches)
    ]
    with multiprocessing.get_context("fork").Pool(args.jobs, initializer=_quiet) as pool:
        results = pool.map(_judge_job, jobs, chunksize=max(1, args.searches // 4))
    found: dict[tuple[str, str, float], list[Searched]] = {}
    for key, item in results:
        found.setdefault(key, []).append(item)
    rows = [
        {"landscape": name, "method": method, "budget": f"{fraction:.0%}", **summarise(items)}
        for (name, method, fraction), items in found.items()
    ]
    lines = [*table(described), "", *table(rows)]
    if (
        args.tpe
        or args.tuner
        or args.no_seeds
        or args.seed_changes
        or args.timing
        or args.per_trial_noise
        or args.noise is not None
    ):
        seeds = "no seeds" if args.no_seeds else "the space's seeds"
        seeds += f" with {args.seed_changes}" if args.seed_changes and not args.no_seeds else ""
        noise = "per trial" if args.per_trial_noise else "white (falls with the window's length)"
        lines += [
            "",
            f"Variant: TPESampler {args.tpe or 'as shipped'}, TunerSettings {args.tuner or 'as shipped'}, {seeds}; "
            f"trial timing {args.timing or 'as shipped'}; window noise {noise}"
            + (f", {args.noise:.1%} on every landscape." if args.noise is not None else "."),
        ]
    lines += ["", f"{len(jobs)} searches in {time.monotonic() - started:.0f} s with {args.jobs} processes."]
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        raw = {
            f"{name} | {method} | {fraction}": [item.regret for item in items]
            for (name, method, fraction), items in found.items()
        }
        args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
