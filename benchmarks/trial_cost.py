"""What a trial costs against what it measures, under two sets of window rules, side by side in one run.

Real CAM++ trials (each its own subprocess, the embedded synthetic corpus, the recipe's 3-s crops) of the shipped CPU
space's baseline and seeds, as `autotune run --model cam++` measures them on this machine, each configuration
REPS times under each rule set, interleaved (rule sets alternate within each configuration's repetitions, so a
machine that slows down slows both). Printed per configuration and rule set:

- overhead: the share of the trials' wall time outside their timed windows (process start and imports, setup,
  warm-up, teardown as the parent sees it), the target being <= 25% over a CPU run's trials;
- the median trial wall time, warm-up and window;
- the spread of the repeated trials' throughput ((max - min) / median) and its CV: shorter trials must not widen it;
- other processes' share of the CPU during the windows (machine/cpu_load.py): a busy machine widens every spread.

    .venv/bin/python benchmarks/trial_cost.py --reps 4 --out benchmarks/results/trial_cost.md

"before" is a rule set by step counts (at least 3 warm-up steps, then until two consecutive steps agree, at most 12; a
window of 10 s and at least 5 steps); "after" is TimingSettings's default (trial/steady.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import (
    space,  # noqa: E402
    yamlio,
)
from autotune.data import default_source  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.machine.hardware import probe  # noqa: E402
from autotune.trial import TimingSettings, TrialResult, TrialSpec, launch
from benchmarks.tables import markdown_table, publish  # noqa: E402

RULES = {
    "before": TimingSettings(
        warmup_steps=3,
        max_warmup_steps=12,
        min_warmup_fraction=0.0,
        max_warmup_factor=1e6,
        settle_chunk_s=0.0,
        trim_transient=False,
        min_window_steps=5,
        min_timed_share=0.0,
    ),
    "after": TimingSettings(),
}


def configurations() -> dict[str, TrialConfig]:
    """The shipped CPU space's baseline and seeds, as this machine resolves them."""
    cam = space.load(space.space_path("cam++"), probe("cpu"))
    named = {"baseline": cam.baseline, **{f"seed {i + 1}": seed for i, seed in enumerate(cam.seeds)}}
    return {name: TrialConfig.from_params({**cam.fixed, **params}) for name, params in named.items()}


def _median_pair(seconds: list[float], steps: list[int]) -> str:
    return f"{statistics.median(seconds):.1f} ({statistics.median(steps):.0f})" if seconds else "-"


def _row(name: str, rules: str, results: list[TrialResult]) -> dict[str, object]:
    ok = [result for result in results if result.feasible or result.disturbed]
    walls = [result.wall_s or 0.0 for result in ok]
    windows = [result.window_s or 0.0 for result in ok]
    rates = [result.samples_per_second or 0.0 for result in ok]
    others = [result.others_cpu_fraction for result in ok if result.others_cpu_fraction is not None]
    median = statistics.median(rates) if rates else 0.0
    return {
        "configuration": name,
        "rules": rules,
        "trials ok": f"{len(ok)}/{len(results)}",
        "overhead": f"{1 - sum(windows) / sum(walls):.1%}" if walls else "-",
        "wall s": f"{statistics.median(walls):.1f}" if walls else "-",
        "warm-up s (steps)": _median_pair([r.warmup_s or 0.0 for r in ok], [r.warmup_steps or 0 for r in ok]),
        "window s (steps)": _median_pair(windows, [r.window_steps for r in ok]),
        "samples/s": f"{median:.2f}",
        "spread": f"{(max(rates) - min(rates)) / median:.1%}" if len(rates) > 1 and median else "-",
        "CV": f"{statistics.stdev(rates) / statistics.fmean(rates):.1%}" if len(rates) > 1 and median else "-",
        "others' CPU": f"{statistics.median(others):.0%}" if others else "-",
        "_walls": walls,
        "_windows": windows,
        "_rates": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4, help="trials per configuration and rule set")
    parser.add_argument("--configs", nargs="+", default=None, help="names to measure (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown, + .json)")
    args = parser.parse_args()
    configs = configurations()
    if args.configs:
        configs = {name: configs[name] for name in args.configs}
    results: dict[tuple[str, str], list[TrialResult]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        data_file = str(yamlio.write_json(Path(folder) / "data.json", default_source().to_dict()))
        for rep in range(args.reps):
            for name, config in configs.items():
                order = list(RULES) if rep % 2 == 0 else list(reversed(RULES))
                for rules in order:
                    workdir = Path(folder) / f"{len(results)}-{rep}-{name}-{rules}".replace(" ", "_")
                    spec = TrialSpec(
                        workload="cam++",
                        workload_options={},
                        data_file=data_file,
                        config=config,
                        timing=RULES[rules],
                        device_type="cpu",
                        result_path=str(workdir / "result.json"),
                    )
                    result = launch(spec, workdir=workdir, timeout_s=600)
                    results.setdefault((name, rules), []).append(result)
                    print(
                        f"rep {rep} {name:<9} {rules:<6} {result.status:<8} {result.samples_per_second or 0:6.2f} "
                        f"samples/s, wall {result.wall_s or 0:5.1f} s, window {result.window_s or 0:5.1f} s, "
                        f"others {result.others_cpu_fraction if result.others_cpu_fraction is not None else -1:.2f}",
                        flush=True,
                    )
    rows = [_row(name, rules, results[(name, rules)]) for name in configs for rules in RULES]
    for rules in RULES:  # every configuration together: the run-level overhead share
        walls = [wall for row in rows if row["rules"] == rules for wall in row["_walls"]]  # type: ignore[union-attr]
        windows = [w for row in rows if row["rules"] == rules for w in row["_windows"]]  # type: ignore[union-attr]
        print(f"{rules}: overhead {1 - sum(windows) / sum(walls):.1%} of {sum(walls):.0f} s of trials")
    header = [key for key in rows[0] if not key.startswith("_")]
    lines = markdown_table(rows, header)
    load_after = os.getloadavg()
    lines.append(
        f"\nload average (1/5/15 min) at the start {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
        f"at the end {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f}; {args.reps} trials per row"
    )
    raw = {f"{name} / {rules}": [r.to_dict() | {"log_tail": ""} for r in rs] for (name, rules), rs in results.items()}
    publish(lines, args.out, raw)


if __name__ == "__main__":
    main()
