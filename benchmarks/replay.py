"""Replay autotune's search over a benchmark run's recorded measurements: hundreds of seeded searches in seconds.

search_efficiency.py runs each method once per run, about 40 minutes, and one search on a noisy machine is one draw:
it cannot say how often the search lands within 2% of the best. This script answers that from the figures a run
recorded. It runs the real Tuner (the space's seeds, TPE, the budget and its reserve for confirmation, confirmation
of the leaders, the winner rule) many times, each with its own sampler seed, and replaces each trial subprocess with
a draw from what that configuration measured:

- a configuration re-measured after the grid (the grid's top five and every method's pick): one of those windows;
- any other: its grid window times a relative deviation drawn from all re-measured configurations' windows about
  their medians (this machine's noise, as that run saw it).

Each trial costs the wall time the grid recorded for its configuration, on the Tuner's clock, so "15% budget" is 15%
of that run's grid time, as in search_efficiency.py. Regret is judged as there: on the reference figure (the median
of the re-measurements, else the grid window) of the configuration picked, against the best reference figure.

What it does not model: pruning (a hopeless trial costs its full grid time here, so budgets buy slightly fewer trials
than in a live run), slow drift of the machine during a run, and configurations the run never measured (the space is
search_efficiency.py's slice, which its grid covers completely).

    .venv/bin/python benchmarks/replay.py --out benchmarks/results/replay.md

Use it to judge a change to the search (seeds, sampler settings, the winner rule) before spending a benchmark run on
it; the live benchmark stays the test of record.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import space  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.machine.hardware import Hardware  # noqa: E402
from autotune.search.samplers import make_sampler  # noqa: E402
from autotune.search.settings import TunerSettings, TuningOutcome
from autotune.search.tuner import Tuner
from autotune.trial import TimingSettings, TrialResult, TrialSpec
from benchmarks.search_efficiency import WITHIN, slice_space_text  # noqa: E402
from benchmarks.tables import markdown_table  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RECORDED_CORES = 2  # the machine the recorded runs measured on: the slice's seeds resolve "auto" threads to it


@dataclass(kw_only=True, slots=True)
class Recorded:
    """What one benchmark run measured, by configuration (TrialConfig.short())."""

    name: str
    grid: dict[str, float]  # the grid's one window
    status: dict[str, str]  # the grid trial's status ("ok", "oom", ...)
    wall_s: dict[str, float]  # the grid's wall time for it
    remeasured: dict[str, list[float]]
    deviations: list[float]  # window / median of its configuration, over every re-measured configuration

    @property
    def reference(self) -> dict[str, float]:
        return {**self.grid, **{key: statistics.median(values) for key, values in self.remeasured.items()}}

    @property
    def grid_s(self) -> float:
        return sum(self.wall_s.values())

    @classmethod
    def load(cls, path: Path) -> Recorded:
        data = json.loads(path.read_text())
        rows = [row for row in data["exhaustive grid"] if row["role"] == "search"]
        remeasured = {key: entry["remeasured"] for key, entry in data["reference samples/s"].items()}
        deviations = [
            value / statistics.median(values) for values in remeasured.values() if len(values) > 1 for value in values
        ]
        return cls(
            name=path.stem,
            grid={row["config"]: row["samples_per_second"] or 0.0 for row in rows},
            status={row["config"]: row["status"] for row in rows},
            wall_s={row["config"]: row["wall_s"] for row in rows},
            remeasured={key: values for key, values in remeasured.items() if values},
            deviations=deviations,
        )

    def draw(self, key: str, rng: random.Random) -> float:
        if key in self.remeasured:
            return rng.choice(self.remeasured[key])
        return self.grid[key] * rng.choice(self.deviations)


def slice_space() -> space.SearchSpace:
    """search_efficiency.py's slice, with the shipped CPU seeds, as the recorded machine saw it."""
    with tempfile.TemporaryDirectory() as folder:
        space_file = Path(folder) / "space.yaml"
        space_file.write_text(slice_space_text())
        return space.load(space_file, Hardware(device_type="cpu", cpu_cores=RECORDED_CORES))


def replay(
    recorded: Recorded, cam: space.SearchSpace, budget_fraction: float, seed: int, baseline_cost: float = 1.0
) -> TuningOutcome:
    """One search under budget_fraction of the recorded grid's time; the baseline's trials (the Tuner measures it
    first) cost baseline_cost times their recorded wall time."""
    rng, now, baseline = random.Random(seed), [0.0], []

    def launcher(spec: TrialSpec, **_: object) -> TrialResult:
        key = spec.config.short()
        baseline.append(baseline[0] if baseline else key)
        wall_s = recorded.wall_s[key] * (baseline_cost if key == baseline[0] else 1.0)
        now[0] += wall_s
        if recorded.status[key] != "ok":
            return TrialResult(status=recorded.status[key], reason="as recorded", wall_s=wall_s)
        rate = recorded.draw(key, rng)  # the window's rate too: the budget plan predicts unmeasured trials from it
        return TrialResult(status="ok", samples_per_second=rate, window_samples_per_second=rate, wall_s=wall_s)

    def make_spec(config: TrialConfig, path: str) -> TrialSpec:
        return TrialSpec(
            workload="cam++",
            workload_options={},
            data_file="",
            config=config,
            timing=TimingSettings(),
            device_type="cpu",
            result_path=path,
        )

    # search_efficiency.py's autotune settings, but for the seed
    settings = TunerSettings(trials=10_000, budget_s=budget_fraction * recorded.grid_s, sampler="tpe", seed=seed)
    with tempfile.TemporaryDirectory() as workdir:
        study = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", cam, seed))
        tuner = Tuner(
            study=study,
            space=cam,
            make_spec=make_spec,
            settings=settings,
            workdir=Path(workdir),
            launcher=launcher,
            clock=lambda: now[0],
        )
        return tuner.run()


def summarise(
    recorded: Recorded, cam: space.SearchSpace, budget_fraction: float, reps: int, baseline_cost: float = 1.0
) -> dict[str, str]:
    reference = recorded.reference
    best = max(reference.values())
    outcomes = [replay(recorded, cam, budget_fraction, seed, baseline_cost) for seed in range(reps)]
    regrets = sorted(
        1.0 - reference[outcome.winner.config.short()] / best if outcome.winner else 1.0 for outcome in outcomes
    )
    return {
        "recorded run": recorded.name,
        "budget": f"{budget_fraction:.0%}",
        "searches": str(reps),
        "within 2%": f"{sum(regret <= WITHIN for regret in regrets) / reps:.0%}",
        "mean regret": f"{statistics.mean(regrets):.1%}",
        "median regret": f"{regrets[reps // 2]:.1%}",
        "90th percentile": f"{regrets[reps * 9 // 10]:.1%}",
        "trials (median)": f"{statistics.median(len(outcome.records) for outcome in outcomes):.0f}",
        "seeds run (mean)": f"{statistics.mean(sum(r.role == 'seed' for r in o.records) for o in outcomes):.1f}",
        "time (median, of grid)": f"{statistics.median(o.elapsed_s for o in outcomes) / recorded.grid_s:.1%}",
        "noise (sd of windows)": f"{statistics.pstdev(recorded.deviations):.1%}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", default=sorted(RESULTS.glob("search_efficiency*.json")))
    parser.add_argument("--budget-fractions", type=float, nargs="+", default=[0.15, 0.3])
    parser.add_argument("--reps", type=int, default=200, help="searches per run and budget, seeds 0 to reps-1")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    parser.add_argument(
        "--baseline-cost",
        type=float,
        default=1.0,
        help="the baseline's trials cost this many times their recorded wall time (on a CPU the recipe's batch "
        "made the baseline 128 s, five times a seed)",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autotune").setLevel(logging.ERROR)  # each search's budget warnings, hundreds of times
    cam = slice_space()
    rows = [
        summarise(Recorded.load(path), cam, fraction, args.reps, args.baseline_cost)
        for path in args.runs
        for fraction in args.budget_fractions
    ]
    header = list(rows[0])
    lines = markdown_table(rows, header)
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
