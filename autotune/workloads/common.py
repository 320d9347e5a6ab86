"""Pieces several workloads share: data that must carry transcripts, audio preloaded into RAM when a trial asks for
it, a recipe's per-step optimiser work, and the worst-case batch of length-varying samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.workloads.base import WorkloadContext

__all__ = [
    "load_transcribed_data",
    "longest_batch",
    "longest_indices",
    "preload_if_asked",
    "scheduled_step_hook",
    "unscale_for_clipping",
]


def load_transcribed_data(path: str | None, *, task: str) -> DataSource:
    """`--data PATH` (a WeNet data.list, a Kaldi folder with text, ...) or the synthetic corpus, with transcripts.

    Args:
        path: what the user gave, or None for the embedded synthetic corpus.
        task: named in the error ("ASR", "TTS").

    Raises:
        DataError: the data cannot be read, or some utterance has no transcript.
    """
    from autotune import data

    source = data.default_source() if path is None else data.load_source(path)
    missing = [u.utt_id for u in source.utterances if u.text is None]
    if missing:
        raise DataError(
            f"{source.path}: {len(missing)} of {len(source.utterances)} utterances have no transcript (first: "
            f"{missing[0]}); {task} needs text: give a WeNet data.list (key/wav/txt) or a Kaldi folder with a text "
            "file"
        )
    return source


def preload_if_asked(dataset: Any, context: WorkloadContext) -> float:
    """Decode the dataset's utterances into RAM when the trial's config has preload_audio, and read from there.

    Runs after the dataset is built, so a dataset that filters its utterances (ASR, TTS) preloads only those it
    keeps; before the DataLoader starts, so its workers share the decoded audio instead of reading files.

    Args:
        dataset: a dataset with ``utterances`` and an ``audio`` reader (SpeakerCropDataset, AsrDataset, TtsDataset).
        context: the trial's context; ``context.config.preload_audio`` decides.

    Returns:
        Wall seconds spent preloading (TrainingSetup.preload_s); 0.0 when the trial does not preload.

    Raises:
        DataError: an audio file cannot be read now.
    """
    if not context.config.preload_audio:
        return 0.0
    from autotune.data.preload import PreloadedAudio

    dataset.audio = PreloadedAudio.load(dataset.utterances)
    return float(dataset.audio.load_s)


def scheduled_step_hook(
    model: torch.nn.Module, lr_at: Callable[[int], float], max_grad_norm: float
) -> Callable[..., None]:
    """An optimiser step pre-hook doing a recipe's per-step work: set the learning rate of this (1-based) step from
    its schedule, then clip the gradients' global norm. GradScaler.step unscales before it calls optimizer.step, or
    hands a fused optimizer the scale instead (unscaled here: `unscale_for_clipping`), so the hook clips true
    gradients under fp16 too, as the recipes do."""
    import torch

    steps = 0

    def hook(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        nonlocal steps
        steps += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(steps)
        unscale_for_clipping(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)

    return hook


def unscale_for_clipping(optimizer: torch.optim.Optimizer) -> None:
    """Unscale the gradients GradScaler left scaled for a fused optimizer, before they are clipped.

    For an optimizer with its own scale handling (fused SGD/Adam: `_step_supports_amp_scaling`) GradScaler.step does
    not unscale: it sets `optimizer.grad_scale` and `optimizer.found_inf` and the fused kernel divides by the scale
    (torch/amp/grad_scaler.py). A recipe clipping in a step pre-hook would then clip gradients 2**16 times too large,
    which shrinks every step to nothing. Dividing here and clearing grad_scale is what `scaler.unscale_(optimizer)`
    before the clip does in the recipes' own loops (WeNet's executor); found_inf stays set, so the kernel still skips
    a step whose gradients overflowed. Without a scale (no GradScaler, or not fused) nothing changes.
    """
    import torch

    scale = getattr(optimizer, "grad_scale", None)
    if scale is None:
        return
    grads = [param.grad for group in optimizer.param_groups for param in group["params"] if param.grad is not None]
    if grads:
        torch._foreach_mul_(grads, scale.double().reciprocal().float())  # GradScaler's own inverse, as unscale_
    optimizer.grad_scale = None  # type: ignore[attr-defined]


def longest_indices(count: int, lengths: Sequence[int], *more_lengths: Sequence[int]) -> list[int]:
    """Up to `count` dataset indices whose padded batch is the longest in every length at once.

    A padded batch costs what its size and its longest item in each dimension make it cost, so the worst one holds
    the `count` items longest in `lengths` (the one that dominates the cost, e.g. frames), with the longest item of
    each of `more_lengths` (e.g. text tokens) swapped in for the shortest of them where none of them reaches it.

    Args:
        count: items per batch.
        lengths: the primary length of each dataset item.
        more_lengths: further lengths of each item, in order of importance.
    """
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], *(-more[index] for more in more_lengths)))
    chosen = order[:count]
    slot = len(chosen)
    for more in more_lengths:
        top = max(range(len(more)), key=lambda index: (more[index], lengths[index]))
        if chosen and more[top] > max(more[index] for index in chosen) and slot > 1:  # slot 0 keeps the longest
            slot -= 1
            chosen[slot] = top
    return chosen


def longest_batch(dataset: Any, collate_fn: Callable[[list[Any]], Any], count: int, *lengths: Sequence[int]) -> Any:
    """The worst-case batch as the DataLoader would yield it: `dataset[i]` of `longest_indices`, collated."""
    return collate_fn([dataset[index] for index in longest_indices(count, *lengths)])
