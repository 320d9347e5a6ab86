"""3D-Speaker (speakerlab): the recipe YAML's batch_size is GLOBAL; train.py gives each process batch_size / world_size.

Keys follow egs/voxceleb/sv-cam++/conf/cam++.yaml (top-level batch_size, num_workers; a dataloader block whose args
reference them) and speakerlab/bin/train.py (torchrun, --gpu ids, no AMP, cudnn.benchmark = True hard-coded).
"""

from __future__ import annotations

from autotune import yamlio
from autotune.exports.base import Export, ExportContext, register

_AUTOCAST = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


@register("3d-speaker")
def export_3d_speaker(context: ExportContext) -> Export:
    config = context.config
    loader_args = {
        "dataset": "<dataset>",
        "batch_size": "<batch_size>",  # train.py overwrites it with batch_size / world_size
        "num_workers": "<num_workers>",
        "pin_memory": config.pin_memory,
        "drop_last": True,
        **context.loader_extras(),
    }
    data = {
        "batch_size": context.step_batch_size,
        "num_workers": config.num_workers,
        "dataloader": {"obj": "torch.utils.data.DataLoader", "args": loader_args},
    }
    conf = context.model_name.replace("-", "_")
    gpus = " ".join(str(index) for index in range(context.world_size))
    command = (
        f"{context.env_prefix()}torchrun --nproc_per_node={context.world_size} speakerlab/bin/train.py "
        f"--config conf/{conf}.yaml --gpu {gpus}"
    )
    return Export(target="3d-speaker", yaml_text=yamlio.dump_yaml(data), command=command, notes=_notes(context))


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    notes = [
        f"batch_size {context.step_batch_size} is the global batch: train.py gives each of the {context.world_size} "
        f"processes batch_size / {context.world_size} = {config.per_device_batch_size} (the tuned per-device batch)",
        "Replace the recipe's dataloader block with this one (obj, dataset and the <batch_size>/<num_workers> "
        "references are the recipe's own)",
    ]
    if config.grad_accum_steps > 1:
        notes.append(
            f"3D-Speaker has no gradient accumulation: the tuned effective batch {context.global_batch_size} "
            f"(grad_accum_steps={config.grad_accum_steps}) needs an accumulation loop in train(); raising batch_size "
            f"to {context.global_batch_size} instead would put {config.per_device_batch_size * config.grad_accum_steps}"
            " samples on each GPU, which was not measured and may not fit in memory"
        )
    notes += _precision_notes(context)
    if not config.cudnn_benchmark:
        notes.append(
            "The tuned run had cudnn.benchmark off, but train.py sets cudnn.benchmark = True unconditionally: delete "
            "that line to match"
        )
    if not context.on_cuda:
        notes.append("speakerlab/bin/train.py needs CUDA (nccl, torch.cuda.set_device); it cannot train on CPU")
    if context.max_frames_in_batch is not None:
        notes.append("3D-Speaker has no dynamic batching: max_frames_in_batch is not exported")
    return tuple(notes)


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if precision == "fp32":
        return [context.fp32_defaults_note("3D-Speaker")] if context.on_cuda else []
    if precision == "tf32":
        return [
            "3D-Speaker has no TF32 switch: the recipe trains fp32 with torch's defaults (TF32 off for matmuls). To "
            "train as measured (tf32) call autotune.load_config(RESULT).apply_backend_flags() in "
            "speakerlab/bin/train.py before the training loop (or set torch.backends.cuda.matmul.allow_tf32 = True "
            "and torch.backends.cudnn.allow_tf32 = True)"
        ]
    change = f'wrap the forward and loss in train() in `with torch.autocast("cuda", dtype={_AUTOCAST[precision]}):`'
    if precision == "fp16":
        change += (
            ' and scale the loss with scaler = torch.amp.GradScaler("cuda"): scaler.scale(loss).backward(); '
            "scaler.step(optimizer); scaler.update()"
        )
    return [
        f"3D-Speaker has no AMP switch: the recipe trains fp32, so the measured {precision} speed needs a code "
        f"change in speakerlab/bin/train.py: {change}. Without it the run is fp32, slower, and this batch size may "
        "not fit in GPU memory"
    ]
