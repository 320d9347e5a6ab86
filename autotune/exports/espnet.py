"""ESPnet2: top-level batch_size is the TOTAL across GPUs (each mini-batch is split rank::world_size).

Keys follow espnet2/tasks/abs_task.py (batch_size, num_workers, accum_grad, use_amp, use_tf32, cudnn_benchmark,
cudnn_deterministic) and espnet2/train/trainer.py, whose use_amp autocasts to bfloat16 where the GPU supports it
(recent releases) and to float16 otherwise, always with a GradScaler.
"""

from __future__ import annotations

from typing import Any

from autotune import yamlio
from autotune.exports.base import Export, ExportContext, register

_TASKS = {"speaker-verification": "spk", "asr": "asr", "tts": "tts"}
_HOP_SAMPLES = 160  # 10 ms frame shift at 16 kHz


@register("espnet")
def export_espnet(context: ExportContext) -> Export:
    config = context.config
    data: dict[str, Any] = {}
    if context.max_frames_in_batch is None:
        data["batch_size"] = context.step_batch_size
    data |= {
        "accum_grad": config.grad_accum_steps,
        "num_workers": config.num_workers,
        "use_amp": context.precision in ("bf16", "fp16"),
    }
    if context.precision == "tf32":
        data["use_tf32"] = True
    data |= {"cudnn_benchmark": config.cudnn_benchmark, "cudnn_deterministic": False}
    task = _TASKS.get(str(context.tuned.workload.get("task")), "asr")
    command = (
        f"{context.env_prefix()}python -m espnet2.bin.{task}_train --config conf/train_{task}.yaml "
        f"--ngpu {context.world_size if context.on_cuda else 0}"
    )
    if context.world_size > 1:
        command += " --multiprocessing_distributed true"
    return Export(target="espnet", yaml_text=yamlio.dump_yaml(data), command=command, notes=_notes(context))


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    notes = []
    frames = context.max_frames_in_batch
    if frames is None:
        notes.append(
            f"batch_size {context.step_batch_size} is the total across {context.world_size} GPU(s) (ESPnet splits "
            f"each mini-batch rank::world_size, {config.per_device_batch_size} per GPU). With ESPnet's default "
            "batch_type folded it shrinks for long utterances; batch_type unsorted or sorted keeps it fixed as measured"
        )
    else:
        notes.append(
            f"max_frames_in_batch {frames} (fbank frames per GPU) has no ESPnet key: batch_type numel or length counts "
            "batch_bins over all GPUs in the units of your shape files, about "
            f"{frames * context.world_size * _HOP_SAMPLES} for 16 kHz raw-audio shapes; not exported, measure it"
        )
    notes.append(
        "cudnn_deterministic false matches the measurement (ESPnet defaults to true for reproducibility, at some speed "
        "cost); drop the line to keep ESPnet's default"
    )
    notes += _precision_notes(context)
    if context.on_cuda and not config.pin_memory:
        notes.append("ESPnet always pins memory on GPU (pin_memory=ngpu>0); the tuned run did not")
    extras = context.loader_extras()
    if extras.get("prefetch_factor") is not None or extras.get("persistent_workers"):
        tuned = ", ".join(f"{key}={value}" for key, value in extras.items())
        notes.append(f"ESPnet's iterator factories expose neither prefetch_factor nor persistent_workers ({tuned})")
    return tuple(notes)


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if precision == "bf16":
        return [
            "use_amp true gives bf16 in recent ESPnet2 releases on GPUs that support it (espnet2/train/trainer.py "
            "autocasts with dtype bfloat16 when torch.cuda.is_bf16_supported()); older releases autocast float16 "
            "only, so check autocast_args in your trainer.py"
        ]
    if precision == "fp16":
        return [
            "use_amp cannot force fp16 on a bf16-capable GPU in recent ESPnet2 releases: the trainer picks bfloat16 "
            "there, so fp16 as measured needs autocast_args emptied in espnet2/train/trainer.py (older releases "
            "autocast float16)"
        ]
    if precision == "tf32":
        return [
            "use_tf32 true sets torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 (ESPnet asserts it is "
            "not combined with use_amp)"
        ]
    return [context.fp32_defaults_note("ESPnet with use_tf32 false")] if context.on_cuda else []
