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
Under fp16 a fresh GradScaler (scale 2**16) usually overflows and skips its first steps, and a skipped step
allocates no state: the first worst batch then repeats until GradScaler has taken a step, and once more holding
what that step allocated (bounded; see MAX_SCALE_SEARCH_STEPS). Loss scaling stays on, as in real training:
without it an overflowing step would write inf or NaN into the weights. Its peak memory is kept apart from the
window's (which resets the CUDA peak counter) and counts for the headroom gate; an OOM here makes the trial "oom"
with a reason naming the scan. On CUDA its peak is read at each step's end, as the window's is (trial/memory.py), and
with cudnn.benchmark the worst batches run a second time: the first met each shape, and cuDNN searched it mid-step,
emptying the allocator's cache after the step's peak, so that reading can be low; the second, searches done, is the
step's need. The largest shapes are where variable-length training runs out of memory, so they are read exactly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.knobs.precision import PrecisionSettings
    from autotune.trial.distributed import Forward
    from autotune.trial.scaler import SkipCountingScaler
    from autotune.workloads.base import TrainingSetup

__all__ = [
    "MAX_SCALE_SEARCH_STEPS",
    "WorstCaseScan",
    "WorstCaseOutOfMemoryError",
    "release_freed_memory",
    "scan_worst_case",
]

logger = logging.getLogger(__name__)

# A fresh GradScaler starts at 2**16 and halves its scale on every step it skips; 20 halvings take it to 2**-4.
# Gradients that still overflow there overflow unscaled too: that is not a scale still coming down, and waiting
# longer would only spend the trial's time. The window's skipped-step gate judges such a configuration.
MAX_SCALE_SEARCH_STEPS = 20


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
    second_pass: bool = False  # CUDA with cudnn.benchmark: the worst batches again, their shapes searched
    # False when a fresh optimiser never stepped in the scan (GradScaler skipped every step): the peak misses its state.
    optimizer_state_held: bool = True

    def summary(self) -> dict[str, Any]:
        """Fields of the trial result (None where the workload has no worst case)."""
        ran = self.batches > 0
        return {
            "worst_case_batches": self.batches,
            "worst_case_s": self.seconds if ran else None,
            "worst_case_peak_memory_bytes": self.peak_memory_bytes if ran else None,
            "worst_case_optimizer_state_held": self.optimizer_state_held if ran else None,
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
    from autotune.trial.loop import Stepper, check_finite, synchronize
    from autotune.trial.memory import PeakMemory

    if setup.worst_case_batches is None:
        return WorstCaseScan()
    batches = list(setup.worst_case_batches(config))
    if not batches:
        return WorstCaseScan()
    scan = WorstCaseScan(batches=len(batches), largest_batch_samples=max(setup.samples_in(b) for b in batches))
    fresh = not setup.optimizer.state  # the state a fresh optimiser allocates must be there for a worst step too
    step = Stepper(setup, forward, precision, 1)

    def run(batch: Any) -> None:
        step(setup.batch_to_device(batch, device, False))
        memory.step_done()  # a step's end: cuDNN's search for a new shape is behind it (trial/memory.py)
        scan.steps += 1

    memory = PeakMemory(device)
    started = time.perf_counter()
    memory.start()
    try:
        for batch in batches:
            run(batch)
        if fresh:
            scan.optimizer_state_held = _repeat_holding_state(lambda: run(batches[0]), setup.optimizer, step.scaler)
        if cudnn_searches(device):
            # Each was a new shape, searched mid-step, its cache emptied after its peak: read low (trial/memory.py).
            # Again, searches done, each step's end holds its need.
            for batch in batches:
                run(batch)
            scan.second_pass = True
        synchronize(device)
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
    check_finite(step.losses, "the worst-case scan")
    setup.optimizer.zero_grad(set_to_none=True)
    if not scan.optimizer_state_held:
        logger.warning(
            "worst-case scan: GradScaler skipped all %d steps, so the optimiser allocated no state and the scan's peak "
            "memory leaves it out (fp16 gradients overflow; the window's skipped-step gate judges this)",
            scan.steps,
        )
    return scan


def cudnn_searches(device: torch.device) -> bool:
    """Whether the first step of each new shape runs cuDNN's benchmark search (CUDA with cudnn.benchmark on)."""
    return device.type == "cuda" and bool(torch.backends.cudnn.benchmark)


def _repeat_holding_state(run_first: Callable[[], None], optimizer: Any, scaler: SkipCountingScaler) -> bool:
    """Run the first worst batch again until a run of it starts with the optimiser's first step taken; whether one did.

    Without loss scaling (or when the scan's steps were taken) that is one run. A step GradScaler skipped allocates
    no state, so under fp16 it repeats while the scale comes down, at most MAX_SCALE_SEARCH_STEPS times more. Asking
    the scaler whether it took a step reads its scale (a sync on CUDA): the scan is not timed for throughput.
    """
    for _ in range(1 + MAX_SCALE_SEARCH_STEPS):
        held = bool(optimizer.state) or scaler.has_taken_a_step()
        run_first()
        if held:
            return True
    return False


def release_freed_memory(device: torch.device) -> bool:
    """After the scan on a CPU: hand the heap the worst batches freed back to the system (glibc's malloc_trim), before
    the DataLoader's workers are forked. Kept, that heap is shared copy-on-write with the workers, and every step's
    reuse of it copies pages, which a user's training, forking its workers before any such batch, does not pay
    (benchmarks/results/conformer-own-figure-2026-12-04-vm.md). True where the heap was trimmed; a no-op (False) on an
    accelerator or without glibc."""
    if device.type != "cpu":
        return False
    import ctypes
    import ctypes.util

    try:  # as trial/lifeline.py loads libc; a C library without malloc_trim is not glibc
        return bool(ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
