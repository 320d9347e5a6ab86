"""The training run a result is for, and a trial's throughput over it with its one-off costs paid.

A configuration that compiles its model (knobs/compile_modes.py) pays minutes once and then steps faster; one without
persistent workers pays the workers' start-up every epoch. Which is faster depends on how long the user trains: a
compile that costs 8 minutes and saves 8% pays off after 100 minutes of training, not in a 10-minute fine-tune
(pytorch issue 93468 reports such a case, OpenNMT's: docs/how-it-measures.md). So the objective every trial reports
(TrialResult.samples_per_second) is the throughput over the run, with each one-off cost charged where it falls:

- **epochs** (the default: one epoch of the data, so that each epoch's loader restart is charged once):
  ``run samples / (run samples / window rate + epochs x new epoch + compile)``, a new epoch's cost measured at a real
  epoch end (epoch_boundary.py);
- **hours**: ``epoch rate x max(0, T - compile) / T`` over T seconds of training: compiling eats into the run.

An epoch is the user's: ``--epoch-samples`` (or ``--epoch-hours``) where given, else the data's. On autotune's
synthetic stand-in corpus with neither given, no per-epoch cost is charged: the stand-in's epochs are a few steps at a
GPU's batch, no training's, and charging their loader restarts ranks configurations by how they suit such an epoch
(benchmarks/gpu_proof.md#results); a real corpus' epochs are thousands of steps, where the charge is under 1%.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autotune.yamlio import from_fields

__all__ = ["RunLength", "run_rate"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunLength:
    """How long the user trains with the result: epochs of the data (per rank's share) or wall-clock hours."""

    epochs: float | None = 1.0
    hours: float | None = None
    # The user's epoch in samples where the trials' data is not it (--epoch-samples, --epoch-hours); None: the data's
    epoch_samples: int | None = None
    # False on the synthetic stand-in with no epoch given: its epochs say nothing of the user's (module docstring)
    per_epoch_costs: bool = True

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.hours is None):
            raise ValueError("a run length is either epochs or hours")
        value = self.epochs if self.epochs is not None else self.hours
        if value is None or not math.isfinite(value) or value <= 0:
            raise ValueError(f"a run length must be positive and finite, not {value!r}")
        if self.epoch_samples is not None and self.epoch_samples < 1:
            raise ValueError(f"an epoch holds at least one sample, not {self.epoch_samples!r}")

    def describe(self) -> str:
        if self.hours is not None:
            return f"{self.hours:g} h"
        return f"{self.epochs:g} epoch" + ("" if self.epochs == 1 else "s")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunLength:
        return from_fields(cls, data)


def run_rate(window_rate: float, epoch_samples: int, restart_s: float, compile_s: float, run: RunLength) -> float:
    """Samples per second over the run: the window's steady rate with loader restarts (each epoch) and compiling
    (once) charged (module docstring)."""
    epoch_samples = max(epoch_samples, 1)
    epoch_s = epoch_samples / window_rate + restart_s
    if run.hours is not None:
        run_s = run.hours * 3600.0
        return epoch_samples / epoch_s * max(0.0, run_s - compile_s) / run_s
    assert run.epochs is not None
    return run.epochs * epoch_samples / (run.epochs * epoch_s + compile_s)
