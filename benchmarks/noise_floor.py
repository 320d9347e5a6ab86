"""This machine's noise floor: how much the same training step's throughput drifts with nothing else changing.

One process trains CAM++ (the real model, bf16 autocast, a fixed batch of 1-s crops already in memory: no data
pipeline, no subprocess, no warm-up effects after the first chunk) for --seconds, and reports its throughput over
consecutive chunks of 3 s and of 10 s (the tool's default window). The spread of those chunks is the smallest
difference between two configurations that single windows on this machine can tell apart; search_efficiency.py's
regret cannot be resolved below it.

    .venv/bin/python benchmarks/noise_floor.py --seconds 90
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from autotune.machine.cpu_load import cpu_sample, others_fraction
from autotune.models.campplus import CAMPPlus

FRAMES_PER_SECOND = 100  # 10-ms fbank hop
FIRST_CHUNK_S = 3.0  # dropped: allocator growth and oneDNN kernel choice


def _chunks(marks: list[tuple[float, int]], chunk_s: float) -> list[float]:
    """Samples per second over consecutive chunks of at least chunk_s (step boundaries as (time, samples))."""
    rates, start = [], marks[0]
    for mark in marks[1:]:
        if mark[0] - start[0] >= chunk_s:
            rates.append((mark[1] - start[1]) / (mark[0] - start[0]))
            start = mark
    return rates


def _describe(rates: list[float]) -> str:
    if len(rates) < 2:
        return f"{len(rates)} chunk(s): too few, run longer"
    median = statistics.median(rates)
    return (
        f"{len(rates)} chunks, median {median:.1f} samples/s, min {min(rates):.1f}, max {max(rates):.1f}"
        f" (+-{(max(rates) - min(rates)) / 2 / median:.1%}), CV {statistics.stdev(rates) / statistics.mean(rates):.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--chunks", type=float, nargs="+", default=[3.0, 10.0], help="chunk lengths in seconds")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = CAMPPlus(embedding_size=512)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    features = torch.randn(args.batch, FRAMES_PER_SECOND, 80)
    marks: list[tuple[float, int]] = []
    before = cpu_sample()  # who else used the CPUs meanwhile: a busy machine widens every spread below
    samples, start = 0, time.perf_counter()
    while (now := time.perf_counter()) - start < args.seconds:
        if now - start >= FIRST_CHUNK_S:
            marks.append((now, samples))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(features).float().pow(2).mean()
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        samples += args.batch
    others = others_fraction(before, cpu_sample())
    print(f"CAM++ bs={args.batch} bf16, {args.threads} intra-op threads, {args.seconds:.0f} s:")
    busy = f"{others:.0%}" if others is not None else "unknown"
    print(f"  other processes took {busy} of the CPU meanwhile; load average {os.getloadavg()[0]:.1f}")
    for chunk_s in args.chunks:
        print(f"  {chunk_s:.0f}-s chunks: {_describe(_chunks(marks, chunk_s))}")


if __name__ == "__main__":
    main()
