"""Intra-op threads on a busy machine: CAM++ trials on every core against trials on the cores other processes leave,
side by side, beside N busy processes of the benchmark's own (as `benchmarks/short_budget.py --load N` makes them).

A parallel region of torch's intra-op pool ends when its slowest thread does; a thread another job preempts stalls
the others, so a step on more threads than free cores can run several times slower than on the free ones. The run's
calibration (machine/cpu_load.py) counts the free cores; the seeds and the AMP check train on them on a busy machine
(run/preflight.py adapt). This measures what that is worth: for each configuration, in every round, in alternating
order, a real trial (autotune.trial.launch, the run's window rules) with intra_op_threads = every core, and one with
the free cores the calibration finds beside the busy processes. Reported: window samples/s per round, the median of
each, and the ratio free / every per round.

    .venv/bin/python benchmarks/busy_threads.py --load 2 --rounds 2 --out benchmarks/results/busy-threads.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import workloads, yamlio  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.machine import cpu_load  # noqa: E402
from autotune.trial import TimingSettings, TrialSpec, launch  # noqa: E402
from benchmarks.short_budget import _busy  # noqa: E402
from benchmarks.tables import markdown_table, publish  # noqa: E402

# The recipe's configuration as a 2-core machine's run adapts it (the baseline) and the first bf16 seed without workers.
CONFIGS = {
    "bs64 w2 fp32 (baseline)": TrialConfig(
        per_device_batch_size=64, num_workers=2, prefetch_factor=2, precision="fp32"
    ),
    "bs32 w0 bf16 (seed)": TrialConfig(per_device_batch_size=32, num_workers=0, precision="bf16"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=2, help="busy processes of its own")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0, help="window_s of each trial (a busy run's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    workload = workloads.get("cam++")
    every = len(os.sched_getaffinity(0))
    started = time.monotonic()
    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="busy-threads-") as scratch:
        work = Path(scratch)
        data = yamlio.write_json(work / "data.json", workload.load_data(None).to_dict())
        busy = _busy(args.load)
        try:
            time.sleep(1.0)
            load = cpu_load.calibrate()
            free = load.free_cores
            print(f"calibration beside {args.load} busy processes: {load.describe()}; free cores {free} of {every}")
            rates: dict[tuple[str, int], list[float]] = {}
            for round_index in range(args.rounds):
                for name, config in CONFIGS.items():
                    order = [every, free] if round_index % 2 == 0 else [free, every]
                    for threads in order:
                        folder = work / f"r{round_index}-{name.split()[0]}-{name.split()[1]}-t{threads}"
                        spec = TrialSpec(
                            workload="cam++",
                            workload_options=workload.options,
                            data_file=str(data),
                            config=TrialConfig(**{**config.to_dict(), "intra_op_threads": threads}),
                            timing=TimingSettings(window_s=args.window, max_throughput_cv=None),
                            device_type="cpu",
                            result_path=str(folder / "result.json"),
                        )
                        result = launch(spec, workdir=folder, timeout_s=900)
                        rate = result.window_samples_per_second if result.status == "ok" else None
                        rates.setdefault((name, threads), []).append(rate or float("nan"))
                        raw.append({"round": round_index + 1, "config": name, "threads": threads,
                                    "status": result.status, "samples_per_second": rate,
                                    "median_step_s": result.step_time_median_s, "wall_s": result.wall_s})  # fmt: skip
                        print(raw[-1], flush=True)
        finally:
            for process in busy:
                process.kill()
                process.wait()
    for name in CONFIGS:
        mine, theirs = rates[(name, free)], rates[(name, every)]
        rows.append(
            {
                "configuration": name,
                f"{every} threads (rounds)": " / ".join(f"{v:.2f}" for v in theirs),
                f"{free} thread(s) (rounds)": " / ".join(f"{v:.2f}" for v in mine),
                "free / every, per round": " / ".join(f"{a / b:.2f}" for a, b in zip(mine, theirs, strict=True)),
                "medians' ratio": f"{statistics.median(mine) / statistics.median(theirs):.2f}",
            }
        )
    lines = [
        f"# CAM++ on every core against the free ones, beside {args.load} busy processes ({date.today()}, "
        f"{platform.node()}, CPU, {every} cores)",
        "",
        f"`.venv/bin/python benchmarks/busy_threads.py {' '.join(sys.argv[1:])}` "
        f"({(time.monotonic() - started) / 60:.0f} min); calibration: {load.describe()}, free cores {free}",
        "",
        *markdown_table(rows),
    ]
    publish(lines, args.out, raw)


if __name__ == "__main__":
    main()
