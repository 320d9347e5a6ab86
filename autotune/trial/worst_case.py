"""Worst case first: train on the most expensive batches before warm-up, so a config that OOMs on them fails now.

Where samples vary in length (ASR: length-sorted static batches, dynamic ``max_frames_in_batch`` batches), a short
timed window may never meet the longest utterances, and a configuration that fits the batches it happened to see
can run out of memory hours into real training. icefall scans its pessimistic batches for OOM before training
(``scan_pessimistic_batches_for_oom``); a trial does the same with the batches the workload names through
``TrainingSetup.worst_case_batches``. Fixed-length workloads (speaker models crop every sample to the same length)
leave it None and the scan is a no-op.

The scan runs full training steps (forward, backward, optimiser step). The first step of a fresh optimiser
allocates its state after the activations are freed; every later step holds both. So when the optimiser has no
state yet, the first worst batch runs once more at the end: that step's peak is the one real training reaches.
Its peak memory is kept apart from the window's (which resets the CUDA peak counter) and counts for the headroom
gate; an OOM here makes the trial "oom" with a reason naming the scan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autotune.trial.distributed import Forward
    from autotune.trial.precision import PrecisionSettings
    from autotune.trial.spec import TrialConfig
    from autotune.workloads.base import TrainingSetup

__all__ = ["WorstCaseScan", "WorstCaseOutOfMemoryError", "scan_worst_case"]


class WorstCaseOutOfMemoryError(torch.OutOfMemoryError):
    """Out of memory on the workload's most expensive batches (classified as "oom" like any other)."""


@dataclass(kw_only=True, slots=True)
class WorstCaseScan:
    """What the scan did: batches and steps run, their largest batch, time taken and peak memory."""

    batches: int = 0
    steps: int = 0
    largest_batch_samples: int = 0
    seconds: float = 0.0
    peak_memory_bytes: int = 0

    def summary(self) -> dict[str, Any]:
        """Fields of the trial result (None where the workload has no worst case)."""
        ran = self.batches > 0
        return {
            "worst_case_batches": self.batches,
            "worst_case_s": self.seconds if ran else None,
            "worst_case_peak_memory_bytes": self.peak_memory_bytes if ran else None,
        }


def scan_worst_case(
    setup: TrainingSetup,
    config: TrialConfig,
    *,
    forward: Forward,
    precision: PrecisionSettings,
    device: torch.device,
) -> WorstCaseScan:
    """Train on the workload's most expensive batches for `config`; a no-op when it names none.

    Raises:
        WorstCaseOutOfMemoryError: a worst batch does not fit.
        NonFiniteLossError: the loss of a worst batch is NaN or infinite.
    """
    from autotune.trial.loop import _check_finite, _Stepper, _synchronize
    from autotune.trial.memory import PeakMemory

    if setup.worst_case_batches is None:
        return WorstCaseScan()
    batches = list(setup.worst_case_batches(config))
    if not batches:
        return WorstCaseScan()
    scan = WorstCaseScan(batches=len(batches), largest_batch_samples=max(setup.samples_in(b) for b in batches))
    if not setup.optimizer.state:  # a fresh optimiser: the state it allocates must be there for a worst step too
        batches.append(batches[0])
    step = _Stepper(setup, forward, precision, 1)
    memory = PeakMemory(device)
    started = time.perf_counter()
    memory.start()
    try:
        for batch in batches:
            step(setup.batch_to_device(batch, device, False))
            scan.steps += 1
        _synchronize(device)
    except torch.OutOfMemoryError as error:
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        raise WorstCaseOutOfMemoryError(
            f"in the worst-case scan ({scan.batches} most expensive batch(es), up to {scan.largest_batch_samples} "
            f"samples): {first_line}"
        ) from error
    finally:
        scan.peak_memory_bytes = memory.sample()
        memory.stop()
    scan.seconds = time.perf_counter() - started
    _check_finite(step.losses, "the worst-case scan")
    setup.optimizer.zero_grad(set_to_none=True)
    return scan
