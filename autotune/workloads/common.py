"""Pieces several workloads share: data that must carry transcripts, and a recipe's per-step optimiser work."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource

__all__ = ["load_transcribed_data", "scheduled_step_hook"]


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


def scheduled_step_hook(
    model: torch.nn.Module, lr_at: Callable[[int], float], max_grad_norm: float
) -> Callable[..., None]:
    """An optimiser step pre-hook doing a recipe's per-step work: set the learning rate of this (1-based) step from
    its schedule, then clip the gradients' global norm. GradScaler.step unscales before it calls optimizer.step, so
    the hook clips true gradients under fp16 too, as the recipes do."""
    import torch

    steps = 0

    def hook(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        nonlocal steps
        steps += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(steps)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)

    return hook
