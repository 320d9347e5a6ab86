"""What activation checkpointing saves per sample: the bytes autograd keeps for backward in one training step of the
recipe-size CAM++ (3 s crops) and conformer (10 s utterances), with the workload's checkpointing off and on, and the
step's time beside it (forward and backward, one thread, median of interleaved rounds).

The bytes are counted with torch.autograd.graph.saved_tensors_hooks around the step: every tensor saved for backward
outside a checkpointed segment (checkpoint's own hooks keep what is inside from being saved), each storage once. They
are the activations' share of a GPU's peak, the part that grows with the batch, and do not depend on the device; the
weights, gradients and optimizer state come on top, the same with and without. The time ratio on a CPU says what the
recomputation costs in arithmetic; on a GPU a trial measures it (with the larger batch the memory allows).

    PYTHONPATH=. python benchmarks/checkpointing_memory.py [--rounds 3] [--out FILE.json]
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

Step = Callable[[torch.nn.Module], torch.Tensor]


def _campplus(checkpointed: bool) -> tuple[torch.nn.Module, Step, int]:
    from autotune.models.campplus import CAMPPlus

    batch = 4
    features = torch.randn(batch, 300, 80)  # 3 s of 10 ms fbank frames, the recipe's crop
    return CAMPPlus(memory_efficient=checkpointed).train(), lambda model: model(features).square().mean(), batch


def _conformer(checkpointed: bool) -> tuple[torch.nn.Module, Step, int]:
    from autotune.models.conformer import ConformerASR

    batch = 2
    feats, lengths = torch.randn(batch, 1000, 80), torch.tensor([1000, 900])  # 10 s utterances
    tokens, token_lengths = torch.randint(3, 4000, (batch, 20)), torch.tensor([20, 18])
    model = ConformerASR(gradient_checkpointing=checkpointed).train()
    return model, lambda module: module(feats, lengths, tokens, token_lengths)["loss"], batch


WORKLOADS = {"cam++": _campplus, "conformer": _conformer}


def saved_bytes(model: torch.nn.Module, step: Step) -> int:
    """Bytes autograd keeps for backward in one step (each storage once), then the backward run."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step(model)
    loss.backward()
    return sum(storages.values())


def measure(name: str, rounds: int) -> dict[str, Any]:
    built = {checkpointed: WORKLOADS[name](checkpointed) for checkpointed in (False, True)}
    batch = built[False][2]
    saved = {checkpointed: saved_bytes(model, step) for checkpointed, (model, step, _) in built.items()}
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for checkpointed, (model, step, _) in built.items():
            model.zero_grad()
            started = time.perf_counter()
            step(model).backward()
            times[checkpointed].append(time.perf_counter() - started)
    plain, ckpt = (statistics.median(times[flag]) for flag in (False, True))
    return {
        "batch": batch,
        "saved_mib_per_sample": {
            "off": round(saved[False] / batch / 2**20, 2),
            "on": round(saved[True] / batch / 2**20, 2),
        },
        "saved_ratio_on_to_off": round(saved[True] / saved[False], 3),
        "step_s": {"off": round(plain, 3), "on": round(ckpt, 3)},
        "step_ratio_on_to_off": round(ckpt / plain, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    results = {name: measure(name, args.rounds) for name in WORKLOADS}
    text = json.dumps({"torch": torch.__version__, "rounds": args.rounds, "workloads": results}, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
