"""SpeechBrain: top-level `precision` and `dataloader_options` (PER PROCESS under DDP) in the hparams YAML.

dataloader_options reaches torch unchanged: Brain.make_dataloader -> speechbrain.dataio.dataloader.make_dataloader
(dataset, **loader_kwargs) -> SaveableDataLoader (a torch DataLoader subclass) or DataLoader, so any DataLoader
keyword (prefetch_factor, persistent_workers) is accepted. TF32 comes from the allow_tf32 quirk in
speechbrain/utils/quirks.py, applied at import unless SB_DISABLE_QUIRKS lists it.
"""

from __future__ import annotations

from typing import Any

from autotune import yamlio
from autotune.exports.base import Export, ExportContext, register

_PRECISION = {"fp32": "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "fp16"}


@register("speechbrain")
def export_speechbrain(context: ExportContext) -> Export:
    config = context.config
    loader: dict[str, Any] = {}
    if context.max_frames_in_batch is None:  # a dynamic batch_sampler excludes batch_size
        loader["batch_size"] = config.per_device_batch_size
    loader |= {"num_workers": config.num_workers, "pin_memory": config.pin_memory, **context.loader_extras()}
    data = {
        "precision": _PRECISION[context.precision],
        "grad_accumulation_factor": config.grad_accum_steps,
        "dataloader_options": loader,
    }
    env = context.env_prefix() + ("SB_DISABLE_QUIRKS=allow_tf32 " if _strict_fp32(context) else "")
    script = f"train.py hparams/{context.model_name.replace('-', '_')}.yaml"
    launcher = f"torchrun --nproc_per_node={context.world_size}" if context.world_size > 1 else "python"
    command = f"{env}{launcher} {script}"
    return Export(target="speechbrain", yaml_text=yamlio.dump_yaml(data), command=command, notes=_notes(context))


def _strict_fp32(context: ExportContext) -> bool:
    return context.precision == "fp32" and context.on_cuda


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    notes = []
    if context.max_frames_in_batch is None:
        notes.append(
            f"dataloader_options.batch_size {config.per_device_batch_size} is per process (each DDP process loads its "
            f"own batches): global batch {context.global_batch_size} with {context.world_size} process(es) and "
            f"grad_accumulation_factor {config.grad_accum_steps}"
        )
    else:
        notes.append(
            f"Dynamic batching (max_frames_in_batch {context.max_frames_in_batch} per device) maps to SpeechBrain's "
            "DynamicBatchSampler passed as batch_sampler in dataloader_options; its max_batch_length is in the units "
            "of your length key, so it is not exported: set it yourself"
        )
    notes.append("Merge dataloader_options into your train loader's options (keep shuffle and any sampler)")
    if context.loader_extras():
        notes.append(
            "SpeechBrain passes dataloader_options unchanged to torch's DataLoader (make_dataloader -> "
            "SaveableDataLoader, a DataLoader subclass), so prefetch_factor and persistent_workers are accepted"
        )
    notes += _precision_notes(context)
    if config.cudnn_benchmark and context.on_cuda:
        notes.append(
            "The tuned run used cudnn.benchmark=True; SpeechBrain has no option for it and leaves torch's default "
            "(off on CUDA): set torch.backends.cudnn.benchmark = True in train.py to match"
        )
    return tuple(notes)


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if precision == "tf32":
        return [
            "tf32 is precision fp32 in SpeechBrain: its allow_tf32 quirk turns TF32 on for matmuls and cuDNN at "
            "import, so nothing else is needed (do not set SB_DISABLE_QUIRKS=allow_tf32)"
        ]
    if _strict_fp32(context):
        return [
            "Strict fp32 (as measured) needs SB_DISABLE_QUIRKS=allow_tf32 in the environment, as in the command "
            "above: SpeechBrain otherwise turns TF32 on at import through its allow_tf32 quirk. With the quirk off, "
            "torch's defaults apply, under which cuDNN convolutions may still use TF32 "
            "(torch.backends.cudnn.allow_tf32 defaults to True)"
        ]
    if precision == "fp16" and not context.on_cuda:
        return ["SpeechBrain rejects precision fp16 on CPU: use bf16 or fp32 there"]
    return []
