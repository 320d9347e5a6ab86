"""What a training ran with, read inside it: each DataLoader's arguments and epoch, the maths in force in the step.

These are the values a tuned configuration claims to set. They are read from the objects the training really used
(the DataLoader that yielded the window's batches, autocast as the first module of a window step saw it, torch's
backend flags and threads during the step), never from what the command line asked for.
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoaderSeen", "batch_items", "built_at", "maths_in_force", "observed_values"]

# Frames of these packages are not where a user's DataLoader was built: the first frame outside them is.
# Code that builds a DataLoader for the user's training rather than being it: the frameworks' own loader makers
# (SpeechBrain's Brain.make_dataloader, ESPnet's iterator factories, speakerlab's and WeNet's builders).
_LIBRARY_PARTS = tuple(
    f"{os.sep}{name}{os.sep}"
    for name in (
        "torch",
        "lightning",
        "lightning_fabric",
        "pytorch_lightning",
        "speechbrain",
        "espnet2",
        "speakerlab",
        "wenet",
        os.path.join("autotune", "probe"),
    )
)


def batch_items(batch: Any) -> int:
    """Items in a batch: the first dimension of its first tensor (in a tuple, list or dict, depth first); a list of
    non-tensors counts its elements; another batch object its `batchsize` or its length. 0 when nothing in it says
    (the step's work is then unknown)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, dict):
        values: Any = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:  # a framework's batch object (SpeechBrain's PaddedBatch): its own count of the examples it holds
        size = getattr(batch, "batchsize", None)
        if isinstance(size, int):
            return size
        return len(batch) if hasattr(batch, "__len__") and not isinstance(batch, (str, bytes)) else 0
    for value in values:
        if isinstance(value, (dict, list, tuple)) or getattr(value, "shape", None) is not None:
            found = batch_items(value)
            if found:
                return found
    return len(values) if isinstance(batch, list) else 0


def built_at() -> str:
    """file:line of the user's code that is building a DataLoader now (the first frame outside torch, Lightning and
    the probe)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not any(part in filename for part in _LIBRARY_PARTS) and not filename.startswith("<"):
            relative = os.path.relpath(filename)
            return f"{filename if relative.startswith('..') else relative}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


@dataclass(kw_only=True, slots=True)
class LoaderSeen:
    """One DataLoader as the training used it: its arguments, where it was built, the batches it yielded."""

    arguments: dict[str, Any]
    built_at: str
    epoch: dict[str, Any]
    window_batches: int = 0
    window_items: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, loader: Any, where: str) -> LoaderSeen:
        workers = int(loader.num_workers)
        return cls(
            arguments={
                "num_workers": workers,
                "pin_memory": bool(loader.pin_memory),
                "prefetch_factor": loader.prefetch_factor if workers > 0 else None,
                "persistent_workers": bool(loader.persistent_workers),
                "batch_size": loader.batch_size,
            },
            built_at=where,
            epoch=_epoch_counts(loader),
        )


def _length(thing: Any) -> int | None:
    try:
        return len(thing)
    except TypeError:  # an IterableDataset, or a sampler without a length
        return None


def _epoch_counts(loader: Any) -> dict[str, Any]:
    """What one epoch of this rank holds, by the lengths the loader and its samplers report (iterating them would
    draw from the training's random state): dataset size, batches and samples, and the samplers' names."""
    from torch.utils.data import BatchSampler

    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else None
    sampler = inner if inner is not None else getattr(loader, "sampler", None)
    batches = _length(loader)
    samples = _length(sampler) if sampler is not None else None
    if samples is not None and batches is not None and loader.batch_size and getattr(loader, "drop_last", False):
        samples = batches * loader.batch_size
    if inner is not None and type(batch_sampler) is not BatchSampler and samples == batches:
        # A batch sampler of the training's own whose sampler hands out whole batches (Amphion's VariableSampler: a
        # sampler over a list of index lists): its length counts batches, not samples. The list tells the samples
        # without drawing from the random state; anything else is left unchecked rather than misread.
        samples = _batch_list_samples(getattr(inner, "data_source", None))
    return {
        "dataset_size": _length(loader.dataset),
        "batches_per_epoch": batches,
        "samples_per_epoch": samples,
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
    }


def _batch_list_samples(source: Any) -> int | None:
    """The samples in a list of batches (each a list or tuple of indices); None for anything else."""
    if not isinstance(source, (list, tuple)) or not all(isinstance(batch, (list, tuple)) for batch in source):
        return None
    return sum(len(batch) for batch in source)


def maths_in_force(torch: Any) -> dict[str, Any]:
    """Autocast on each device type, float32 maths, cuDNN's benchmark flag and threads, as they are right now (called
    from inside a step's forward)."""
    from autotune.knobs.precision import fp32_math

    autocast = {}
    for device_type in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device_type):
                autocast[device_type] = str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
        except (RuntimeError, TypeError, AttributeError):  # a device type this torch does not know
            continue
    return {
        "autocast": autocast,
        "fp32_math": fp32_math(torch),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "threads": int(torch.get_num_threads()),
    }


_PRECISION_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}


def observed_values(
    loader: LoaderSeen | None, maths: dict[str, Any] | None, *, steps: int, batches: int, device_type: str
) -> dict[str, Any]:
    """The knob values the window ran with, by the result's knob names (TrialConfig's fields); a knob the probe
    could not see is absent."""
    values: dict[str, Any] = {}
    if loader is not None:
        for name in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers"):
            values[name] = loader.arguments[name]
        if loader.window_items:
            values["per_device_batch_size"] = int(statistics.median(loader.window_items))
    if steps and batches:
        per_step = batches / steps
        values["grad_accum_steps"] = round(per_step) if abs(per_step - round(per_step)) < 0.05 else per_step
    if maths is not None:
        dtype = maths["autocast"].get(device_type)
        if dtype is not None:
            values["precision"] = _PRECISION_OF_DTYPE.get(dtype, dtype)
        elif device_type == "cuda":
            values["precision"] = "tf32" if maths["fp32_math"]["matmul"] == "tf32" else "fp32"
        else:
            values["precision"] = "fp32"
        values["cudnn_benchmark"] = maths["cudnn_benchmark"]
        values["intra_op_threads"] = maths["threads"]
    return values
