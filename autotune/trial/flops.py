"""Work per sample: FLOPs of one training step counted with torch's FlopCounterMode, and known GPU peaks.

The count covers one forward and backward pass of a real batch (what a training step computes; the optimiser's
element-wise update is negligible and FlopCounterMode does not count it), divided by the samples in the batch. It
runs outside the timed window: counting dispatches every operator through Python and is slow. Achieved TFLOP/s is
FLOPs per sample times samples per second; the fraction of peak divides by the dense (no sparsity) tensor-core peak
of the device at the precision trained in, from the vendors' datasheets, where the GPU is in the table below.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from autotune.knobs.precision import TORCH_DEFAULT_FP32

if TYPE_CHECKING:
    import torch

    from autotune.knobs.precision import PrecisionSettings
    from autotune.workloads.base import TrainingSetup

__all__ = ["count_flops_per_sample", "peak_tflops", "achieved_tflops"]

# Dense peak TFLOP/s per precision (NVIDIA datasheets; sparsity figures halved, fp16/bf16 with fp32 accumulation as
# AMP trains). fp32 is the CUDA-core rate; tf32 is absent where the GPU has none (V100). First match wins, so the
# more specific names come first; a known family member with other clocks (H100/H200 NVL, 3090 Ti) maps to None.
_PEAKS: tuple[tuple[str, dict[str, float] | None], ...] = (
    (r"\bV100\b.*\bPCIe\b", {"fp32": 14.0, "fp16": 112.0}),
    (r"\bV100\b", {"fp32": 15.7, "fp16": 125.0}),  # SXM2
    (r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"\bH100\b.*\bPCIe\b", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"\bH100\b.*\bNVL\b", None),
    (r"\bH100\b", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),  # SXM5
    (r"\bH200\b.*\bNVL\b", None),
    (r"\bH200\b", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    (r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"RTX 4090\b", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    (r"RTX 3090 Ti\b", None),
    (r"RTX 3090\b", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0}),
)


def peak_tflops(gpu_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s of one GPU at a precision, or None when the GPU or the precision is not in the table.

    fp32-default (torch's TF32 defaults: convolutions in TF32 where the GPU has it) counts against the TF32 peak, the
    fastest maths it may use, so that a fraction of peak is never overstated.
    """
    for pattern, peaks in _PEAKS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            if peaks is None:
                return None
            if precision == TORCH_DEFAULT_FP32:
                precision = "tf32" if "tf32" in peaks else "fp32"
            return peaks.get(precision)
    return None


def achieved_tflops(flops_per_sample: float | None, samples_per_second: float | None) -> float | None:
    """TFLOP/s a throughput represents (None when either figure is missing)."""
    if not flops_per_sample or not samples_per_second:
        return None
    return flops_per_sample * samples_per_second / 1e12


def count_flops_per_sample(
    setup: TrainingSetup, batch: Any, precision: PrecisionSettings, device: torch.device
) -> float | None:
    """FLOPs of one forward and backward pass per sample of `batch` (a host or device batch), or None on failure.

    Gradients it leaves are cleared; the model's parameters are not updated.
    """
    import logging

    from torch.utils.flop_counter import FlopCounterMode

    batch = setup.batch_to_device(batch, device, False)
    samples = setup.samples_in(batch)
    try:
        with FlopCounterMode(display=False) as counter:
            with precision.autocast():
                loss = setup.loss_fn(setup.model, batch)
            loss.backward()
        total = counter.get_total_flops()
    except Exception as error:  # an operator the counter cannot trace must not cost the trial its measurement
        logging.getLogger(__name__).warning("could not count FLOPs: %s: %s", type(error).__name__, error)
        return None
    finally:
        setup.optimizer.zero_grad(set_to_none=True)
    return total / samples if samples and total else None
