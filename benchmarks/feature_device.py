"""What moving the fbank from the DataLoader workers into the training step does to a trial's throughput.

For each of a few configurations of a model's own space on this machine (its recipe baseline and its seeds: those a
run measures first), the configuration with feature_device workers beside the same with feature_device device,
measured as real trials (autotune's own trial specification, runner.spec_maker) in interleaved rounds; each pair is
reported as the ratio of device's median samples/s to workers'. On a CPU "device" is the training process's CPU:
the work leaves the workers for the intra-op threads, the honest test of the mechanics, not of a GPU's gain.

    PYTHONPATH=. python benchmarks/feature_device.py --model cam++ --rounds 3 --out benchmarks/results/knob-costs/x.json

For the conformer, `--share` measures instead what share of a step the workers' featurisation costs, and the step
that computes it itself, side by side in one process (benchmarks/feature_share.py):

    PYTHONPATH=. python benchmarks/feature_device.py --model conformer --share --rounds 5 --out X.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from ablation import baseline_config, measure  # noqa: E402

from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.run import runner  # noqa: E402
from autotune.run.plan import RunRequest  # noqa: E402
from autotune.search.settings import TunerSettings  # noqa: E402


def pairs(plan: Any) -> dict[str, TrialConfig]:
    """The baseline and the seeds of the model's space, each with the fbank in the workers and in the step."""
    knobs = tuple(plan.workload.knobs)
    starts = [baseline_config(plan)]
    starts += [
        TrialConfig.from_params(seed, world_size=plan.world_size, workload_knobs=knobs) for seed in plan.space.seeds
    ]
    configs: dict[str, TrialConfig] = {}
    for start in starts:
        for placement in ("workers", "device"):
            config = dataclasses.replace(start, feature_device=placement)
            configs[f"{dataclasses.replace(start, feature_device=None).short()} | {placement}"] = config
    return configs


def summarise(values: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = []
    for name, rates in values.items():
        if not name.endswith("| device"):
            continue
        base = name.removesuffix("device") + "workers"
        workers, device = values[base], rates
        ratio = statistics.median(device) / statistics.median(workers) if workers and device else None
        rows.append(
            {
                "configuration": name.removesuffix(" | device"),
                "workers_samples_per_s": workers,
                "device_samples_per_s": device,
                "device_over_workers": None if ratio is None else round(ratio, 3),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cam++")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--share", action="store_true", help="conformer: the share of a step (feature_share.py)")
    args = parser.parse_args()
    if args.share:
        load_before = os.getloadavg()
        measured = share(args)
        return write(args, {"share": measured}, load_before, os.getloadavg())
    with tempfile.TemporaryDirectory() as scratch:
        request = RunRequest(
            model=args.model,
            results_dir=scratch,
            device=args.device,
            settings=TunerSettings(),
            warm_start=False,
        )
        plan = runner.prepare(request)
        configs = pairs(plan)
        load_before = os.getloadavg()
        values = measure(configs, plan, args.rounds, Path(scratch) / "trials")
        load_after = os.getloadavg()
    write(args, {"pairs": summarise(values)}, load_before, load_after)


def share(args: argparse.Namespace) -> dict[str, Any]:
    """--share: the conformer's worker featurisation as a share of its step (benchmarks/feature_share.py)."""
    from feature_share import measure_share

    if args.model != "conformer" or args.device != "cpu":
        raise SystemExit("--share measures the conformer on the CPU: --model conformer --device cpu")
    return measure_share(args.rounds)


def write(
    args: argparse.Namespace, measured: dict[str, Any], load_before: tuple[float, ...], load_after: tuple[float, ...]
) -> None:
    """Print the record (and write it to --out): the command, the date, the load average around it, the numbers."""
    record = {
        "what": __doc__.splitlines()[0],
        "command": "PYTHONPATH=. python benchmarks/feature_device.py " + " ".join(sys.argv[1:]),
        "date": dt.date.today().isoformat(),
        "model": args.model,
        "device": args.device,
        "rounds": args.rounds,
        "load_average_before": [round(value, 2) for value in load_before],
        "load_average_after": [round(value, 2) for value in load_after],
        "cpu_count": os.cpu_count(),
        **measured,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
