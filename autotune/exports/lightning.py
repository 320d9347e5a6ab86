"""PyTorch Lightning: Trainer(...) and DataLoader(...) keyword arguments as Python (no YAML).

Precision strings are Lightning 2.x's ("32-true", "16-mixed", "bf16-mixed"); the DataLoader batch is per process
under DDP; Trainer(benchmark=...) sets cudnn.benchmark.
"""

from __future__ import annotations

from typing import Any

from autotune.exports.base import Export, ExportContext, register

_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


@register("lightning")
def export_lightning(context: ExportContext) -> Export:
    config = context.config
    trainer: dict[str, Any] = {"accelerator": "gpu" if context.on_cuda else "cpu", "devices": context.world_size}
    if context.world_size > 1:
        trainer["strategy"] = "ddp"
    trainer |= {
        "precision": _PRECISION[context.precision],
        "accumulate_grad_batches": config.grad_accum_steps,
        "benchmark": config.cudnn_benchmark,
    }
    loader: dict[str, Any] = {}
    if context.max_frames_in_batch is None:
        loader["batch_size"] = config.per_device_batch_size
    loader |= {"shuffle": True, "num_workers": config.num_workers, "pin_memory": config.pin_memory}
    loader |= context.loader_extras()
    loader["drop_last"] = True
    lines = ["import torch", "from lightning.pytorch import Trainer", "from torch.utils.data import DataLoader", ""]
    if config.intra_op_threads is not None:
        lines.append(f"torch.set_num_threads({config.intra_op_threads})")
    if context.precision == "tf32":
        lines.append('torch.set_float32_matmul_precision("high")  # TF32 matmuls, as measured')
    lines += [_call("trainer = Trainer", trainer), _call("train_loader = DataLoader", loader, first="train_dataset")]
    return Export(target="lightning", python_text="\n".join(lines) + "\n", notes=_notes(context))


def _call(head: str, kwargs: dict[str, Any], *, first: str | None = None) -> str:
    arguments = ([first] if first else []) + [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"{head}(\n" + "".join(f"    {argument},\n" for argument in arguments) + ")"


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    if context.max_frames_in_batch is None:
        batch = (
            f"DataLoader batch_size {config.per_device_batch_size} is per process under DDP: global batch "
            f"{context.global_batch_size} with devices={context.world_size} and accumulate_grad_batches="
            f"{config.grad_accum_steps}"
        )
    else:
        batch = (
            f"Dynamic batching (max_frames_in_batch {context.max_frames_in_batch} per device) needs your own "
            "batch_sampler; it is not exported"
        )
    notes = [batch]
    if context.precision == "tf32":
        notes.append(
            'TF32 is not a Lightning precision: precision="32-true" plus torch.set_float32_matmul_precision("high") '
            "covers matmuls; cuDNN convolutions follow torch.backends.cudnn.allow_tf32 (True by default)"
        )
    elif context.precision == "fp16":
        notes.append('precision="16-mixed" autocasts float16 and scales the loss with a GradScaler')
        if not context.on_cuda:
            notes.append('Lightning rejects precision="16-mixed" on CPU: use "bf16-mixed" there')
    elif context.precision == "fp32" and context.on_cuda:
        notes.append(context.fp32_defaults_note("Lightning"))
    return tuple(notes)
