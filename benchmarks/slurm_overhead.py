"""What running a trial as a SLURM job costs on top of running it here, side by side in one run.

The same short trial (tests/fixtures/faulty_workload.py at batch 5: trains fine, one CPU rank) REPS times through
trial.launch (a subprocess here) and through the SLURM executor (a job on the tests' two-node cluster, started from
Debian's packages by tests/fixtures/slurm.py: needs root and slurmctld, slurmd, munge), interleaved so that a machine
that slows down slows both. Printed: each executor's median time as the caller waits for it, the trial's own wall
time, and their difference (submission, scheduling, the job's start and its Python's start, the state polls).

    sudo .venv/bin/python benchmarks/slurm_overhead.py --reps 5 --out benchmarks/results/slurm_overhead.md

An idle single-host cluster: on a real one the queue's wait comes on top (that is the cluster's, not autotune's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune.data.synth import generate_corpus  # noqa: E402
from autotune.trial import launch  # noqa: E402
from autotune.trial.slurm import SlurmLauncher, SlurmSettings  # noqa: E402
from benchmarks.tables import markdown_table, publish  # noqa: E402
from tests.fixtures import slurm  # noqa: E402
from tests.trial.tiny_setups import faulty_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    why = slurm.unavailable()
    if why:
        sys.exit(f"cannot start the test cluster: {why}")
    folder = Path(tempfile.mkdtemp(prefix="slurm-overhead-"))
    corpus = generate_corpus(
        folder / "corpus", n_speakers=4, files_per_speaker=3, min_duration_s=1.0, max_duration_s=2.0
    )
    times: dict[str, list[tuple[float, float]]] = {"local": [], "slurm": []}
    with slurm.running() as cluster:
        os.environ.update(cluster.env)
        executors = {"local": launch, "slurm": SlurmLauncher(settings=SlurmSettings(partition=cluster.partition))}
        for rep in range(args.reps):
            for name, run in executors.items():
                trial = folder / f"{name}-{rep}"
                trial.mkdir()
                started = time.perf_counter()
                result = run(faulty_spec(trial, corpus, 5), workdir=trial / "trial", timeout_s=120)
                if result.status != "ok":
                    sys.exit(f"{name} trial {rep}: {result.status}: {result.reason}")
                times[name].append((time.perf_counter() - started, result.wall_s or 0.0))
    rows = []
    for name, pairs in times.items():
        waited, own = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        extra = statistics.median(p[0] - p[1] for p in pairs)
        rows.append(
            {"executor": name, "waited_s": f"{waited:.2f}", "trial_wall_s": f"{own:.2f}", "extra_s": f"{extra:.2f}"}
        )
    load = os.getloadavg()
    lines = [
        f"# SLURM executor overhead ({args.reps} interleaved trials each; load average {load[0]:.2f} on "
        f"{os.cpu_count()} cores)",
        "",
        *markdown_table(rows),
    ]
    publish(lines, args.out, raw=times)


if __name__ == "__main__":
    main()
