"""The DataLoader's arguments: what a trial measures and what a user's load_config hands over come from one function.

`dataloader_kwargs` turns a configuration into torch.utils.data.DataLoader keyword arguments; TunedConfig's
dataloader_kwargs() returns exactly them, and the trials' loader (trial/loader.py: trials, the AMP check, the
compute-only ceiling) is built from them too. The only thing a trial replaces is how batches are formed: instead of
batch_size and drop_last it passes a batch sampler that deals this rank's share of each epoch and runs epoch after epoch
(trial/sampling.py), batching exactly as those two arguments would (per_device_batch_size, the last short batch
dropped) or as the workload's dynamic batches do. Nothing else can drift between what is measured and what is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.knobs import length_batching

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig

__all__ = [
    "BATCHING_KWARGS",
    "UNORDERED_NOTE",
    "dataloader_kwargs",
    "dynamic_batching",
    "in_order_unsupported",
]

BATCHING_KWARGS = ("batch_size", "drop_last")  # what a trial's batch sampler does in their place
# The result's note when the winner's loader hands over batches out of order.
UNORDERED_NOTE = (
    "dataloader.in_order false: batches are handed over as the workers finish them, so a slow item does not stall "
    "the ones behind it; each epoch still has the same batches, but their order follows the workers' timing, so a "
    "run is not reproducible batch for batch (set in_order: true for that, at the measured cost)"
)


def dynamic_batching(config: TrialConfig) -> bool:
    """Batches formed by the items' lengths (length_batching.py), not by one sample count."""
    return length_batching.by_length(config.workload_knobs)


def dataloader_kwargs(config: TrialConfig) -> dict[str, Any]:
    """Keyword arguments for torch.utils.data.DataLoader (per process: batch_size is the per-device batch).

    With dynamic batching the dataset pipeline forms the batches (WeNet's DataLoader(batch_size=None)): then
    batch_size is None and the frame budget is in the result's batch section (max_frames_in_batch). Worker options
    are left out without workers (DataLoader rejects them), and an unset prefetch_factor is DataLoader's own default.
    in_order is passed with workers, except True where this torch's DataLoader lacks the argument (older than 2.6):
    there it is the only behaviour, and a result tuned elsewhere still loads; False there fails in DataLoader, loudly,
    rather than running in order unannounced.
    """
    dynamic = dynamic_batching(config)
    kwargs: dict[str, Any] = {
        "batch_size": None if dynamic else config.per_device_batch_size,
        "num_workers": config.num_workers,
        "pin_memory": config.pin_memory,
    }
    if not dynamic:
        kwargs["drop_last"] = True
    if config.num_workers > 0:
        if config.prefetch_factor is not None:  # unset: DataLoader's own default, and the YAML reads back equal
            kwargs["prefetch_factor"] = config.prefetch_factor
        kwargs["persistent_workers"] = config.persistent_workers
        if not config.in_order or in_order_unsupported() is None:
            kwargs["in_order"] = config.in_order
    return kwargs


def in_order_unsupported() -> str | None:
    """Why this torch's DataLoader cannot run in_order=False (None if it can): read from its signature, not assumed
    from the version (the argument arrived in torch 2.6).

    With in_order=False the loader hands over whichever worker's batch is ready first instead of waiting for the
    next one in sampler order: a slow item (a long utterance, an augmentation drawn) no longer stalls the batches
    queued behind it. Every batch still comes once per epoch, with the same items; only their order depends on the
    workers' timing, so a run is no longer reproducible batch for batch.
    """
    import inspect

    import torch

    if "in_order" in inspect.signature(torch.utils.data.DataLoader.__init__).parameters:
        return None
    return f"torch {torch.__version__}'s DataLoader has no in_order argument (torch 2.6 added it)"
