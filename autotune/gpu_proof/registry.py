"""Proof steps: each a function run in a fresh process of its own (a step that crashes CUDA, hangs or runs out of
memory costs that step only), filed in `STEPS` by the `step` decorator in the order the proof runs them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STEPS", "Proven", "Step", "StepContext", "child_environment", "step", "synchronize", "time_per_call"]


@dataclass(kw_only=True, slots=True)
class Proven:
    """What a step answers: whether the claim held, the numbers that say so, and how to read them."""

    passed: bool
    numbers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepContext:
    """What a step's process gets.

    Attributes:
        device: "cuda" for the proof; "cpu" rehearses a step's plumbing in tests and proves nothing about CUDA.
        workdir: this step's own folder.
        kit_dir: the proof's folder: a later step reads what an earlier one left in kit_dir / <step name>.
        budget_s: the time this step has; steps that run `autotune run` size its --budget from it.
    """

    device: str
    workdir: Path
    kit_dir: Path
    budget_s: float

    def to_dict(self) -> dict[str, Any]:
        return {key: str(value) if isinstance(value, Path) else value for key, value in asdict(self).items()}

    def sized(self, on_cuda: int, rehearsal: int) -> int:
        """A size for the proof on CUDA, or the small one a CPU rehearsal runs in seconds."""
        return on_cuda if self.device == "cuda" else rehearsal

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepContext:
        return cls(
            device=data["device"],
            workdir=Path(data["workdir"]),
            kit_dir=Path(data["kit_dir"]),
            budget_s=float(data["budget_s"]),
        )


@dataclass(frozen=True, slots=True)
class Step:
    """A registered step: what it proves, the most time it may take, and the least it is worth starting with."""

    name: str
    title: str
    run: Callable[[StepContext], Proven]
    budget_s: float
    min_s: float


STEPS: dict[str, Step] = {}


def step(name: str, title: str, *, budget_s: float, min_s: float) -> Callable[[Callable[..., Proven]], Any]:
    """Decorator: file a proof step under `name`."""

    def register(function: Callable[[StepContext], Proven]) -> Callable[[StepContext], Proven]:
        if name in STEPS:
            raise ValueError(f"proof step {name!r} registered twice")
        STEPS[name] = Step(name, title, function, budget_s, min_s)
        return function

    return register


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (a no-op on a CPU): timings on CUDA are taken at synchronised edges."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(function: Callable[[], Any], device: Any, *, repeats: int, warmup: int = 3) -> float:
    """Seconds per call of `function`, after `warmup` calls, between synchronised edges."""
    for _ in range(warmup):
        function()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    synchronize(device)
    return (time.perf_counter() - started) / repeats


def child_environment() -> dict[str, str]:
    """This process's environment for a process the proof starts: unbuffered output, and this autotune first on the
    import path (the checkout under proof, not an installed copy)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    return env
