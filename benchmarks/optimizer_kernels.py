"""What each optimizer implementation costs per step, side by side: each workload's own optimizer (3D-Speaker's SGD,
SpeechBrain's Adam, WeNet's and ming024's Adam with their step hooks) over the recipe-size network, stepped with
default, foreach and fused in interleaved rounds on the same gradients; the median step time of each and its ratio to
default's. This is the optimizer step alone: what it buys end to end is its share of a training step (a trial
measures that), so a 2x faster step on a model whose step is 5 % optimizer is a 2.5 % gain.

    PYTHONPATH=. python benchmarks/optimizer_kernels.py [--device cpu|cuda] [--rounds 7] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune.knobs import optimizer_kernels

Factory = Callable[[torch.nn.Module, str], torch.optim.Optimizer]


def _workloads() -> dict[str, tuple[Callable[[], torch.nn.Module], Factory]]:
    """Recipe-size networks (the published parameter counts) with the optimizer each workload builds."""
    from autotune.models.campplus import CAMPPlus
    from autotune.models.conformer import ConformerASR
    from autotune.models.ecapa_tdnn import ECAPATDNN
    from autotune.models.fastspeech2 import FastSpeech2
    from autotune.workloads import asr, tts
    from autotune.workloads.speaker import speaker_optimizer

    return {
        "cam++ (SGD)": (
            lambda: CAMPPlus(embedding_size=512),
            lambda model, impl: speaker_optimizer("sgd", 0.1, model.parameters(), impl),
        ),
        "ecapa-tdnn (Adam)": (
            lambda: ECAPATDNN(channels=1024, embedding_size=192),
            lambda model, impl: speaker_optimizer("adam", 0.001, model.parameters(), impl),
        ),
        "conformer (Adam + clip)": (ConformerASR, lambda model, impl: asr.recipe_optimizer(model, impl)),
        "fastspeech2 (Adam + clip)": (FastSpeech2, lambda model, impl: tts.recipe_optimizer(model, 256, impl)),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, build: Callable[[], torch.nn.Module], make: Factory, device: torch.device, rounds: int):
    implementations = optimizer_kernels.offered(list(optimizer_kernels.IMPLEMENTATIONS), device.type)
    torch.manual_seed(0)
    models = {impl: build().to(device) for impl in implementations}
    optimizers = {impl: make(models[impl], impl) for impl in implementations}
    for model in models.values():  # the same gradients for every implementation, kept between steps
        generator = torch.Generator().manual_seed(1)
        for param in model.parameters():
            param.grad = torch.randn(param.shape, generator=generator).to(device)
    times: dict[str, list[float]] = {impl: [] for impl in implementations}
    for round_index in range(rounds + 1):  # round 0 warms up (state allocation, kernel selection)
        for impl in implementations:
            _sync(device)
            start = time.perf_counter()
            optimizers[impl].step()
            _sync(device)
            if round_index:
                times[impl].append(time.perf_counter() - start)
    parameters = sum(param.numel() for param in models[implementations[0]].parameters())
    default = statistics.median(times["default"])
    rows = {
        impl: {"median_ms": 1e3 * statistics.median(t), "ratio_to_default": statistics.median(t) / default}
        for impl, t in times.items()
    }
    return {
        "workload": name,
        "parameters": parameters,
        "steps": rows,
        "left_out": optimizer_kernels.left_out(list(optimizer_kernels.IMPLEMENTATIONS), device.type),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    results: list[dict[str, Any]] = []
    print(f"torch {torch.__version__} on {device.type}, {torch.get_num_threads()} threads, {args.rounds} rounds")
    print("| workload | parameters | " + " | ".join(optimizer_kernels.IMPLEMENTATIONS) + " |")
    print("|---|---|" + "---|" * len(optimizer_kernels.IMPLEMENTATIONS))
    for name, (build, make) in _workloads().items():
        result = measure(name, build, make, device, args.rounds)
        results.append(result)
        cells = []
        for impl in optimizer_kernels.IMPLEMENTATIONS:
            row = result["steps"].get(impl)
            cells.append("left out" if row is None else f"{row['median_ms']:.1f} ms ({row['ratio_to_default']:.2f}x)")
        print(f"| {name} | {result['parameters']:,} | " + " | ".join(cells) + " |", flush=True)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"torch": torch.__version__, "device": device.type, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
