"""ZenithTune's side of the peer comparison: its CommandOutputTuner over peers_train.py's command line.

Runs in the peers' own virtualenv (peers.py makes it). As ZenithTune's docs have it, the user writes the search space
and the command template in Python and a regex reads the objective from the command's log. The space is what its
tuning components cover on one machine: DataLoader workers and prefetch, intra-op (OMP) threads, and the micro-batch;
precision is not among them, so it stays the recipe's. Trials are capped in steps (its ~100-iteration cap, scaled to
the budget by peers.py). `optimize` takes a trial count, not a time, so the driver asks for one trial at a time until
the budget is spent, and a TimeoutPruner stops a trial that would run past it.

    benchmarks/.peers-venv/bin/python benchmarks/peers_zenith.py --budget-s 300 --steps 8 --data-file data.json \
        --recipe RECIPE_JSON --out rec.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parent / "peers_train.py"
THROUGHPUT = re.compile(r"throughput: ([0-9.]+) samples/s")


def command_for(args: argparse.Namespace) -> Any:
    cores = os.cpu_count() or 1

    def generate(trial: Any, **_: Any) -> str:
        workers = trial.suggest_int("num_workers", 0, cores)
        flags = {
            "--batch-size": trial.suggest_categorical("batch_size", [args.batch // 4, args.batch // 2, args.batch]),
            "--num-workers": workers,
            "--threads": trial.suggest_int("threads", 1, cores),
        }
        if workers > 0:
            flags["--prefetch-factor"] = trial.suggest_categorical("prefetch_factor", [2, 4, 8])
        argv = [sys.executable, str(TRAIN), "--model", args.model, "--data-file", args.data_file]
        argv += ["--steps", str(args.steps), "--warmup-steps", str(max(1, args.steps // 5))]
        argv += [item for flag, value in flags.items() for item in (flag, str(value))]
        return shlex.join(argv)

    return generate


def extract(log_path: str) -> float | None:
    found = THROUGHPUT.findall(Path(log_path).read_text(encoding="utf-8", errors="replace"))
    return float(found[-1]) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True, help="timed steps per trial")
    parser.add_argument("--model", default="cam++")
    parser.add_argument("--data-file", required=True)
    parser.add_argument("--recipe", required=True, help="the recipe's knobs as JSON: Optuna's first trial")
    parser.add_argument("--workdir", default="zenith-outputs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from aibooster.intelligence.zenith_tune import CommandOutputTuner
    from aibooster.intelligence.zenith_tune.auto_pruners import TimeoutPruner

    started = time.monotonic()
    deadline = started + args.budget_s
    timeout = TimeoutPruner(timeout=args.budget_s)
    tuner = CommandOutputTuner(output_dir=args.workdir, auto_pruners=[timeout], maximize=True)
    recipe = json.loads(args.recipe)
    args.batch = recipe["batch_size"]
    trials = 0
    while time.monotonic() < deadline:
        timeout.timeout = deadline - time.monotonic()  # no trial runs past the budget
        tuner.optimize(command_for(args), extract, n_trials=1, default_params=recipe if trials == 0 else None)
        trials += 1
    completed = [t for t in tuner.study.trials if t.value is not None]
    best = max(completed, key=lambda t: t.value).params if completed else {}
    args.out.write_text(
        json.dumps({"tuning_s": time.monotonic() - started, "knobs": best, "trials": trials}), encoding="utf-8"
    )


if __name__ == "__main__":
    main()
