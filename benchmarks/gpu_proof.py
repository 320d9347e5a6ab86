"""Run the GPU proof (`autotune doctor --gpu-proof`) and file its report under benchmarks/results/, named after the GPU.

On a CUDA machine every GPU-only path of autotune runs for real within the time limit (see autotune/gpu_proof and
benchmarks/gpu_proof.md), and the report lands in benchmarks/results/gpu_proof-<gpu>.md with a JSON twin. On a
machine without CUDA it writes nothing and exits 1 with `no CUDA device: nothing proven`.

    python benchmarks/gpu_proof.py --time-limit 540
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from autotune.gpu_proof import DEFAULT_TIME_LIMIT_S, ProofSettings, run_proof

RESULTS = Path(__file__).resolve().parent / "results"


def report_path(gpu_name: str) -> Path:
    """benchmarks/results/gpu_proof-<gpu>.md, e.g. gpu_proof-h100-80gb-hbm3.md for 'NVIDIA H100 80GB HBM3'."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower().replace("nvidia", "")).strip("-") or "gpu"
    return RESULTS / f"gpu_proof-{slug}.md"


def _gpu_name() -> str:
    from autotune.machine import gpus

    physical, _, _ = gpus.nvml_gpus()
    return physical[0].gpu.name if physical else "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, help="seconds for the whole proof")
    parser.add_argument("--out", type=Path, default=None, help="report path (default: named after the GPU)")
    parser.add_argument("--steps", nargs="+", default=None, help="only these steps, in the proof's order")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the steps' files and logs here")
    parser.add_argument(
        "--rehearse-on-cpu", action="store_true", help="the steps on the CPU: their plumbing only, nothing about CUDA"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    out = args.out or report_path("cpu-rehearsal" if args.rehearse_on_cpu else _gpu_name())
    steps = tuple(args.steps) if args.steps else None
    settings = ProofSettings(
        out=out, time_limit_s=args.time_limit, steps=steps, workdir=args.workdir, rehearse_on_cpu=args.rehearse_on_cpu
    )
    report = run_proof(settings)
    print(report.verdict_line())
    if not report.nothing_proven:
        print(f"report: {out}")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
