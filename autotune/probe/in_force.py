"""Whether each value a trial asked for was in force in the training, and whether the ranks' epochs add up.

The probe reads back what the training ran with (readback.py); here each knob the command carries is judged against
it, per knob, in words a user can act on, and the ranks' epochs are checked against the dataset as the trials' own
are (trial/sampling.py EpochAccounting): a sampler sharded twice gives each rank 1/N of its share (1/N^2 of the data
per rank, GPT-SoVITS under Lightning's use_distributed_sampler), one not sharded at all gives every rank all of it.
"""

from __future__ import annotations

from typing import Any

from autotune.knobs.precision import TORCH_DEFAULT_FP32
from autotune.trial.sampling import EpochAccounting

__all__ = ["accounting_mismatch", "judge"]

# Where the probe's reading of a knob comes from, for the line that says it was not in force.
_READ_FROM = {
    "num_workers": "its DataLoader",
    "pin_memory": "its DataLoader",
    "prefetch_factor": "its DataLoader",
    "persistent_workers": "its DataLoader",
    "per_device_batch_size": "the batches its DataLoader yielded",
    "grad_accum_steps": "the batches per optimizer step",
    "precision": "autocast inside the step",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark during the step",
    "intra_op_threads": "torch.get_num_threads() during the step",
}


def _same(name: str, asked: Any, ran: Any, device_type: str) -> bool:
    if name == "precision":
        if asked == TORCH_DEFAULT_FP32:
            return ran in ("fp32", "tf32")
        if device_type == "cpu" and asked == "tf32":
            return ran == "fp32"  # TF32 is a CUDA mode: on a CPU its maths is fp32's
    return bool(asked == ran)


def judge(
    asked: dict[str, Any],
    observed: dict[str, Any],
    knobs_by: dict[str, str],
    *,
    built_at: str | None,
    device_type: str,
) -> dict[str, dict[str, Any]]:
    """Per knob the command carries: {"asked", "ran", "in_force" (None: not seen), "by", "note"}."""
    workers = observed.get("num_workers")
    verdicts: dict[str, dict[str, Any]] = {}
    for name, value in asked.items():
        by = knobs_by.get(name, "command")
        entry: dict[str, Any] = {"asked": value, "ran": observed.get(name), "by": by}
        if name in ("prefetch_factor", "persistent_workers") and workers == 0:
            entry.update(in_force=None, note=f"{name}: not used: the training's DataLoader runs without workers")
        elif name not in observed:
            entry.update(in_force=None, note=f"{name}: the probe could not see {_READ_FROM.get(name, 'it')}")
        elif _same(name, value, observed[name], device_type):
            entry.update(in_force=True, note="")
            if by == "autotune":
                entry["note"] = f"{name}: applied by autotune inside the training; set {name}={value} in your code"
        else:
            where = (
                f" ({built_at} builds the DataLoader)" if built_at and _READ_FROM.get(name) == "its DataLoader" else ""
            )
            entry.update(
                in_force=False,
                note=f"{name}: your training ran with {observed[name]}, not {value}: the value does not reach "
                f"{_READ_FROM.get(name, 'the training')}{where}",
            )
        verdicts[name] = entry
    return verdicts


def accounting_mismatch(epochs: list[dict[str, Any] | None], world_size: int) -> tuple[dict[str, Any] | None, str]:
    """The ranks' epochs as EpochAccounting's dict, and one line when they do not add up to the dataset ("" when
    they do or cannot be checked: a rank whose loader has no length)."""
    if not epochs or any(
        epoch is None
        or epoch.get("dataset_size") is None
        or epoch.get("samples_per_epoch") is None
        or epoch.get("batches_per_epoch") is None
        for epoch in epochs
    ):
        return (epochs[0] if epochs else None), ""
    counted = [epoch for epoch in epochs if epoch is not None]
    first = counted[0]
    per_batch = max(1, -(-int(first["samples_per_epoch"]) // max(1, int(first["batches_per_epoch"]))))
    accounting = EpochAccounting(
        dataset_size=int(first["dataset_size"]),
        world_size=world_size,
        per_device_batch_size=per_batch,
        batches_per_rank=tuple(int(epoch["batches_per_epoch"]) for epoch in counted),
        samples_per_rank=tuple(int(epoch["samples_per_epoch"]) for epoch in counted),
        largest_batch=per_batch,
    )
    record = {**accounting.to_dict(), "sampler": first.get("sampler"), "built_at": first.get("built_at")}
    mismatch = accounting.mismatch()
    if not mismatch:
        return record, ""
    share = accounting.dataset_size / world_size
    rank_samples = accounting.samples_per_rank[0]
    if world_size > 1 and rank_samples * world_size <= 1.5 * share:
        fix = (
            f"each rank sees {rank_samples} samples per epoch, about 1/{world_size} of its share of {share:.0f}: the "
            f"data is sharded twice (the {first.get('sampler')} over a sampler that already shards by rank); shard it "
            "once: with Lightning, Trainer(use_distributed_sampler=False) when your sampler shards by rank itself"
        )
    elif world_size > 1:
        fix = (
            f"every rank sees {rank_samples} of the {accounting.dataset_size} samples per epoch: the data is not "
            "sharded by rank (use a DistributedSampler, or Lightning's use_distributed_sampler=True)"
        )
    else:
        fix = mismatch
    return record, fix
