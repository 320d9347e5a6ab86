"""WeNet: dataset_conf.batch_conf is PER GPU (data is sharded by rank); loader settings are train.py flags.

Keys follow examples/aishell/s0/conf/train_conformer.yaml (dataset_conf.batch_conf, accum_grad) and
wenet/utils/train_utils.py (--num_workers, --pin_memory, --prefetch, --use_amp, --dtype under FSDP).
"""

from __future__ import annotations

from typing import Any

from autotune import yamlio
from autotune.exports.base import Export, ExportContext, register

_TORCH_DEFAULT_PREFETCH = 2  # what an unset prefetch_factor measured; WeNet's own --prefetch default is 100


@register("wenet")
def export_wenet(context: ExportContext) -> Export:
    config = context.config
    frames = context.max_frames_in_batch
    batch_conf: dict[str, Any] = (
        {"batch_type": "dynamic", "max_frames_in_batch": frames}
        if frames is not None
        else {"batch_type": "static", "batch_size": config.per_device_batch_size}
    )
    data = {"dataset_conf": {"batch_conf": batch_conf}, "accum_grad": config.grad_accum_steps}
    flags = [
        "--train_engine torch_ddp",
        "--config conf/train_conformer.yaml",
        "--data_type raw",
        "--train_data data/train/data.list",
        "--cv_data data/dev/data.list",
        f"--model_dir exp/{context.model_name}",
        f"--num_workers {config.num_workers}",
    ]
    if config.num_workers > 0:
        flags.append(f"--prefetch {config.prefetch_factor or _TORCH_DEFAULT_PREFETCH}")
    if config.pin_memory:
        flags.append("--pin_memory")
    if context.precision == "fp16":
        flags.append("--use_amp")
    command = (
        f"{context.env_prefix()}torchrun --standalone --nnodes=1 --nproc_per_node={context.world_size} "
        "wenet/bin/train.py \\\n    " + " \\\n    ".join(flags)
    )
    return Export(target="wenet", yaml_text=yamlio.dump_yaml(data), command=command, notes=_notes(context))


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    if context.max_frames_in_batch is not None:
        batch = (
            f"max_frames_in_batch {context.max_frames_in_batch} is the fbank-frame budget of each GPU's batch "
            "(WeNet shards data by rank)"
        )
    else:
        batch = (
            f"batch_conf.batch_size {config.per_device_batch_size} is per GPU (WeNet shards data by rank): global "
            f"batch {context.global_batch_size} with {context.world_size} GPU(s) and accum_grad "
            f"{config.grad_accum_steps}"
        )
    notes = [batch, *_precision_notes(context)]
    if config.num_workers == 0:
        notes.append(
            "WeNet's train.py always builds its DataLoader with persistent_workers=True and prefetch_factor=--prefetch"
            ", which torch rejects when num_workers is 0: the tuned winner used 0 workers, so pass --num_workers 1 or"
            " more"
        )
    elif not config.persistent_workers:
        notes.append("WeNet always uses persistent workers; the tuned run used non-persistent ones")
    if config.cudnn_benchmark:
        notes.append(
            "The tuned run used cudnn.benchmark=True; wenet/bin/train.py has no flag for it: add "
            "torch.backends.cudnn.benchmark = True to match"
        )
    return tuple(notes)


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if precision == "fp16":
        return ["--use_amp is WeNet's fp16 mixed precision (autocast float16 with a GradScaler)"]
    if precision == "bf16":
        return [
            "bf16 cannot be expressed with WeNet's DDP engine: --use_amp is fp16 only and the torch_ddp autocast "
            "ignores --dtype, so the command above trains fp32. bf16 needs FSDP: replace --train_engine torch_ddp "
            "with --train_engine torch_fsdp --fsdp_sharding_strategy no_shard --dtype bf16 (no_shard is DDP-like; "
            "WeNet versions with FSDP support only), or DeepSpeed with bf16 enabled in ds_config"
        ]
    if precision == "tf32":
        return [
            "WeNet has no TF32 setting: it trains with torch's defaults (TF32 off for matmuls). To train as measured "
            "(tf32) set torch.backends.cuda.matmul.allow_tf32 = True and torch.backends.cudnn.allow_tf32 = True (or "
            "call autotune.load_config(RESULT).apply_backend_flags()) in wenet/bin/train.py"
        ]
    return [context.fp32_defaults_note("WeNet")] if context.on_cuda else []
