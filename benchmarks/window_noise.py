"""How a window's noise splits: per trial (what a longer window cannot average away) and within it (what it can).

Real trials of one configuration (each its own subprocess, as `autotune run` measures them), REPS at each of two or
more window lengths, interleaved (the lengths' order alternates from one repetition to the next, so a machine that
drifts drifts for all of them). For each length L:

- total: the spread of the windows' log throughput across trials, s(L);
- within: the part the window's own quarters show (TrialResult.throughput_cv, the spread of its quarters' rates: the
  window's rate is their mean, with 1/(n-1) of the quarters' variance for n quarters);
- per trial: what is left, sqrt(s(L)^2 - within^2): process start, placement, clocks, anything a trial keeps for its
  whole life.

If the noise within a window is white, within^2 falls as 1/L and the per-trial part is the same at every length.
Why it matters: where a window's noise is drawn once per trial whatever its length (benchmarks/simulate.py
--per-trial-noise), a confirmation trial's cost is mostly start-up and a shorter window is as good as a long one; where
the noise is white, a longer window is quieter. The simulator's figures for the conformer move by several points
between the two (benchmarks/results/budget-lab/NOTES.md), and which one a GPU has is what this measures there:

    .venv/bin/python benchmarks/window_noise.py --windows 10 40 --reps 6 --out benchmarks/results/window_noise-cpu.md
    python benchmarks/window_noise.py --device cuda --windows 5 20 --reps 5    # on a lent GPU, about 8 minutes
    python benchmarks/window_noise.py --device cuda --workload conformer --windows 10 40 --reps 4 --shuffle-each

The conformer's utterances differ in length: with --shuffle-each every repetition reaches another stretch of the
sorted epoch, as two configurations do, and "objective total" is the spread of what confirmation compares (the
window priced at the epoch's mix, trial/epoch_mix.py) beside the window's own.

With --out the table is rewritten after every trial, so a run cut short keeps what it measured; --from-log reads the
lines a run printed instead of measuring (the H200's run, cut at its time limit before the table was written:
benchmarks/results/budget-lab/window_noise-h200.log).

The statistics assume few trials: with 6 per length, a standard deviation is known to about +-30%, so read the split
as which part dominates, not to the digit.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import yamlio  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.run import runner  # noqa: E402
from autotune.run.plan import RunPlan, RunRequest  # noqa: E402
from autotune.search.settings import TunerSettings  # noqa: E402
from autotune.trial import TimingSettings, TrialResult, launch  # noqa: E402
from autotune.trial.window_record import MIN_STABILITY_PART_S  # noqa: E402
from benchmarks.tables import markdown_table, publish  # noqa: E402

QUARTERS = 4  # throughput_cv's parts of a window, at most (trial/window_record.py)


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """The noise of one window length, as standard deviations of the log throughput (about a relative deviation)."""

    window_s: float  # the median window measured
    trials: int
    total: float
    within: float
    per_trial: float  # sqrt(max(0, total^2 - within^2))
    # the objective's spread (samples_per_second: what confirmation compares), where it differs from the window's:
    # the epoch's mix of a workload whose utterances differ in length (trial/epoch_mix.py), an epoch's restart
    objective: float | None = None


def window_parts(result: TrialResult) -> int:
    """How many parts throughput_cv cut this trial's window into (trial/window_record.py throughput_cv's rule)."""
    steps, seconds = result.window_steps, result.window_s or 0.0
    return min(QUARTERS, steps // 2, int(seconds / MIN_STABILITY_PART_S))


def within_variance(result: TrialResult) -> float | None:
    """Variance of the window's log rate that its own parts show: their relative variance (throughput_cv is a
    population spread: n/(n-1) makes it a sample one) over their count."""
    parts = window_parts(result)
    if result.throughput_cv is None or parts < 2:
        return None
    return result.throughput_cv**2 / (parts - 1)


def _window_rate(result: TrialResult) -> float:
    """The timed window's own rate (its quarters are what throughput_cv cuts), else the objective."""
    return result.window_samples_per_second or result.samples_per_second or 0.0


def split(results: Sequence[TrialResult]) -> Split | None:
    """The split of one window length's trials; None with fewer than two measured trials or none with parts."""
    ok = [r for r in results if r.feasible and _window_rate(r) and r.window_s]
    within = [v for v in (within_variance(r) for r in ok) if v is not None]
    if len(ok) < 2 or not within:
        return None
    total2 = statistics.variance([math.log(_window_rate(r)) for r in ok])
    within2 = statistics.fmean(within)
    objectives = [math.log(r.samples_per_second) for r in ok if r.samples_per_second]
    return Split(
        window_s=statistics.median(r.window_s or 0.0 for r in ok),
        trials=len(ok),
        total=math.sqrt(total2),
        within=math.sqrt(within2),
        per_trial=math.sqrt(max(0.0, total2 - within2)),
        objective=statistics.stdev(objectives) if len(objectives) == len(ok) else None,
    )


def white_density(splits: Sequence[Split]) -> float | None:
    """q (variance x seconds) of white within-window noise fitted to every length's within part, weighted by trials;
    the within part at length L is then sqrt(q / L)."""
    if not splits:
        return None
    return sum(s.trials * s.within**2 * s.window_s for s in splits) / sum(s.trials for s in splits)


def run_plan(workload: str, device: str, folder: Path) -> RunPlan:
    """What `autotune run --model WORKLOAD` would measure here: its space with the workload's own knobs, its data (the
    embedded corpus) and the recipe's one-off preparation (the conformer's CMVN), as a run makes them."""
    request = RunRequest(
        model=workload, data=None, space=None, results_dir=str(folder / "plan"), device=device, warm_start=False
    )
    plan = runner.prepare(request)
    runner.prepare_data(plan)
    return plan


def configuration(plan: RunPlan, seed: int) -> TrialConfig:
    """The shipped space's seed (0: its baseline) as this machine resolves it."""
    params = plan.space.baseline if seed == 0 else plan.space.seeds[seed - 1]
    return TrialConfig.from_params(
        {**plan.space.fixed, **params}, world_size=plan.world_size, workload_knobs=tuple(plan.workload.knobs)
    )


def timing(window_s: float) -> TimingSettings:
    """A window of exactly window_s: not stretched to a share of the trial, not beyond window_s."""
    return TimingSettings(window_s=window_s, min_timed_share=0.0, max_window_factor=1.0)


def _row(splits: dict[float, Split | None], window_s: float, q: float | None) -> dict[str, object]:
    found = splits[window_s]
    if found is None:
        return {"window asked (s)": f"{window_s:g}", "trials": 0}
    white = f"{math.sqrt(q / found.window_s):.2%}" if q else "-"
    return {
        "window asked (s)": f"{window_s:g}",
        "window measured (s)": f"{found.window_s:.1f}",
        "trials": found.trials,
        "total": f"{found.total:.2%}",
        "within (quarters)": f"{found.within:.2%}",
        "within if white (all lengths)": white,
        "per trial": f"{found.per_trial:.2%}",
        "per-trial share of the variance": f"{found.per_trial**2 / found.total**2:.0%}" if found.total else "-",
        "objective total": f"{found.objective:.2%}" if found.objective is not None else "-",
    }


_LOG_LINE = re.compile(
    r"rep (?P<rep>\d+) window +(?P<asked>[\d.]+) s: (?P<status>\w+) +(?P<rate>[\d.]+) samples/s, quarters' CV "
    r"(?P<cv>[\d.]+), window +(?P<window>[\d.]+) s \((?P<steps>\d+) steps\), wall +(?P<wall>[\d.]+) s"
)


def read_log(text: str) -> dict[float, list[TrialResult]]:
    """The trials a run printed, by asked window length. Every printed window counts, whatever its status said: the
    H200's run printed 'headroom' for each, from a peak that counted cuDNN's search (fixed since, trial/memory.py);
    its rates and quarters are the windows' own."""
    results: dict[float, list[TrialResult]] = {}
    for found in _LOG_LINE.finditer(text):
        rate = float(found["rate"])
        results.setdefault(float(found["asked"]), []).append(
            TrialResult(
                status="ok",
                samples_per_second=rate,
                window_samples_per_second=rate,
                throughput_cv=float(found["cv"]),
                window_s=float(found["window"]),
                window_steps=int(found["steps"]),
                wall_s=float(found["wall"]),
            )
        )
    return results


def _publish(results: dict[float, list[TrialResult]], windows: Sequence[float], out: Path | None, note: str) -> None:
    splits = {window: split(results.get(window, [])) for window in windows}
    q = white_density([found for found in splits.values() if found is not None])
    lines = markdown_table([_row(splits, window, q) for window in windows])
    lines.append("\n" + note)
    publish(
        lines,
        out,
        {f"{window:g}": [r.to_dict() | {"log_tail": ""} for r in results.get(window, [])] for window in windows},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda where there is one")
    parser.add_argument("--workload", default="cam++")
    parser.add_argument("--seed", type=int, default=2, help="the space's seed to measure, 1-based (0: the baseline)")
    parser.add_argument("--windows", type=float, nargs="+", default=[10.0, 40.0], help="window lengths in seconds")
    parser.add_argument("--reps", type=int, default=6, help="trials per window length")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown, + .json)")
    parser.add_argument("--from-log", type=Path, default=None, help="a run's printed lines, instead of measuring")
    parser.add_argument("--note", default="", help="with --from-log: what the table's last line says of the run")
    parser.add_argument(
        "--shuffle-each",
        action="store_true",
        help="each repetition shuffles the data with its own seed (a run's trials share one): where utterances "
        "differ in length, the stretch of the epoch a window reaches then varies as it does between configurations",
    )
    args = parser.parse_args()
    if args.from_log:
        logged = read_log(args.from_log.read_text())
        _publish(logged, sorted(logged), args.out, args.note or f"read from {args.from_log}")
        return
    results: dict[float, list[TrialResult]] = {window: [] for window in args.windows}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        plan = run_plan(args.workload, args.device or "auto", Path(folder))
        device = plan.hardware.device_type
        config = configuration(plan, args.seed)
        data_file = yamlio.write_json(Path(folder) / "data.json", plan.data.to_dict())
        make_spec = runner.spec_maker(plan, TunerSettings(), data_file)
        for rep in range(args.reps):
            for window in args.windows if rep % 2 == 0 else list(reversed(args.windows)):
                workdir = Path(folder) / f"{rep}-{window:g}"
                spec = dataclasses.replace(
                    make_spec(config, str(workdir / "result.json")),
                    timing=timing(window),
                    seed=rep if args.shuffle_each else 0,
                )
                result = launch(spec, workdir=workdir, timeout_s=600)
                results[window].append(result)
                print(
                    f"rep {rep} window {window:4g} s: {result.status:<8} {result.samples_per_second or 0:8.2f} "
                    f"samples/s, quarters' CV {result.throughput_cv or 0:.3f}, window {result.window_s or 0:5.1f} s "
                    f"({result.window_steps} steps), wall {result.wall_s or 0:5.1f} s",
                    flush=True,
                )
                if args.out:  # after every trial: a run cut short keeps what it measured
                    _publish(results, args.windows, args.out, _note(args, config, device, load_before, rep))
    _publish(results, args.windows, args.out, _note(args, config, device, load_before, args.reps - 1))


def _note(args: argparse.Namespace, config: TrialConfig, device: str, load_before: tuple[float, ...], rep: int) -> str:
    return (
        f"{args.workload} {config.short()} on {device}; load average (1 min) {load_before[0]:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} now; {rep + 1} of {args.reps} trials per length, interleaved"
        + ("; each repetition its own shuffle" if args.shuffle_each else "")
    )


if __name__ == "__main__":
    main()
