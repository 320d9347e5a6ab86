"""GPT-SoVITS s2: the s2.json train keys and the ``s2_train.py`` command (RVC-Boss/GPT-SoVITS 48b1a01).

What carries what, from the recipe's code: ``train.batch_size`` (per GPU: the DistributedBucketSampler's batch,
s2_train.py:91-117), ``train.fp16_run`` (fp16 autocast and GradScaler, the only half precision it has) and
``train.gpu_numbers`` (s2_train.py:9 makes it CUDA_VISIBLE_DEVICES, and main spawns one process per visible GPU,
:53-68). s2_train.py reads the json through ``utils.get_hparams(stage=2)`` (``--config``); the webui writes it as
``TEMP/tmp_s2.json`` from configs/s2.json with its form's values (``fp16_run`` false and the batch halved when not
half). What s2_train.py hard-codes gets a note naming its line, so that a user knows which tuned values need a code
change: the DataLoader's workers, pin_memory, persistent_workers and prefetch_factor (s2_train.py:119-128),
cudnn.benchmark off and TF32 forced on (s2_train.py:41-46), bf16 (no key: its autocast is fp16 only), and the
AdamW constructors (no foreach or fused flag).
"""

from __future__ import annotations

import json
from typing import Any

from autotune.exports.base import Export, ExportContext, KnobNotes
from autotune.exports.knob_notes import compile_note
from autotune.knobs.declarations import TORCH_DEFAULTS

__all__ = ["MODEL", "RECIPE_LOADER", "export_s2", "s2_overrides", "s2_notes"]

MODEL = "gpt-sovits-s2"
TRAIN_PY = "GPT_SoVITS/s2_train.py"
CONFIG = "GPT_SoVITS/configs/s2.json"
DATASET = "GPT_SoVITS/module/data_utils.py"
# s2_train.py:119-128: DataLoader(num_workers=5, pin_memory=True, persistent_workers=True, prefetch_factor=3)
RECIPE_LOADER: dict[str, Any] = {"num_workers": 5, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 3}
_TF32 = f'{TRAIN_PY}:41-46 forces TF32 (allow_tf32 for matmuls and cuDNN, float32 matmul precision "medium")'


def s2_overrides(context: ExportContext) -> dict[str, Any]:
    """The s2.json train keys with the tuned values."""
    train: dict[str, Any] = {
        "batch_size": context.config.per_device_batch_size,
        "fp16_run": context.on_cuda and context.precision == "fp16",
    }
    if context.on_cuda:
        train["gpu_numbers"] = "-".join(str(index) for index in range(context.devices_per_node))
    return {"train": train}


def export_s2(context: ExportContext) -> Export:
    """The s2 export: the json to merge into TEMP/tmp_s2.json, the command, and what the launch assumes."""
    tf32_off = context.tf32_env() if context.precision == "fp32" else ""  # overrides s2_train.py:41-46's TF32
    command = f"{context.env_prefix()}{tf32_off}python -s {TRAIN_PY} --config TEMP/tmp_s2.json"
    gpus = f"; train.gpu_numbers lists the GPUs, one process each ({TRAIN_PY}:9, 53-68)" if context.on_cuda else ""
    notes = [
        f"Run from GPT-SoVITS's root with the JSON merged into TEMP/tmp_s2.json, the config the webui writes for the "
        f"experiment ({CONFIG} plus its paths, names and version); the webui rewrites that file from its form (batch "
        "size, and fp16_run false with the batch halved when not half), so start training with this command, or enter "
        "the tuned values in the form",
        f"train.batch_size {context.config.per_device_batch_size} is per GPU: each rank's DistributedBucketSampler "
        f"batch ({TRAIN_PY}:91-117), its buckets padded to whole batches of every rank{gpus}",
    ]
    if context.nodes > 1:
        notes.append(
            f"Measured on {context.nodes} nodes: {TRAIN_PY} spawns its processes on one machine (MASTER_ADDR "
            "localhost), so it trains on one node's GPUs; it needs a multi-node launch to match"
        )
    return Export(
        target="gpt-sovits",
        yaml_text=json.dumps(s2_overrides(context), indent=2) + "\n",
        command=command,
        notes=tuple(notes),
    )


def _loader_note(name: str) -> KnobNotes:
    def note(context: ExportContext) -> list[str]:
        if name != "num_workers" and context.config.num_workers == 0:
            return []  # without workers the DataLoader takes none of them: the workers' note says it
        if name == "pin_memory" and not context.on_cuda:
            return []  # pinned memory is for copies to a GPU: nothing was measured
        value = getattr(context.config, name)
        recipe = RECIPE_LOADER.get(name, TORCH_DEFAULTS.get(name))
        if value is None or value == recipe:
            return []
        return [
            f"The tuned DataLoader had {name}={value}; {TRAIN_PY}:119-128 hard-codes {name}={recipe} (s2.json has no "
            "key for it): change that DataLoader call to train as measured"
        ]

    return note


def _precision(context: ExportContext) -> list[str]:
    precision = context.precision
    if not context.on_cuda:
        return [f"{precision} was measured on the CPU; {TRAIN_PY} trains float32 there (its autocast is CUDA's)"]
    if precision == "fp16":
        return [
            f"fp16_run true: fp16 autocast and GradScaler; {_TF32} for what autocast leaves in float32, which the "
            "trials did not set (torch's default there, IEEE float32 matmuls)"
        ]
    if precision == "bf16":
        return [
            "bf16 was measured, but s2.json has no key for it (fp16_run is fp16 only): the export sets fp16_run "
            f"false; give both autocast(enabled=hps.train.fp16_run) calls in {TRAIN_PY}'s train_and_evaluate "
            "dtype=torch.bfloat16 and enabled=True, with the GradScaler off, to train as measured"
        ]
    if precision == "tf32":
        return []  # fp16_run false with s2_train.py's forced TF32: what was measured
    if precision == "fp32":
        note = context.tf32_env_note("GPT-SoVITS")
        return [f"{note}; it also overrides {_TF32}"] if note else []
    return [
        f"{precision} was measured with IEEE float32 matmuls, but {_TF32}: set them off and the precision to "
        '"highest" there to train as measured'
    ]


def _cudnn(context: ExportContext) -> list[str]:
    if not (context.config.cudnn_benchmark and context.on_cuda):
        return []
    return [
        f"The tuned run used cudnn.benchmark=True; {TRAIN_PY}:41 hard-codes torch.backends.cudnn.benchmark = False: "
        "set it True there to match"
    ]


def _accumulation(context: ExportContext) -> list[str]:
    if context.config.grad_accum_steps == 1:
        return []
    return [
        f"grad_accum_steps {context.config.grad_accum_steps} cannot be measured for s2: {TRAIN_PY} steps both models "
        "every batch, with no accumulation"
    ]


def _optimizer(context: ExportContext) -> list[str]:
    flag = context.optimizer_flag()
    if not flag:
        return []
    (key,) = flag
    return [
        f"optimizer_impl {key}: add {key}=True to both torch.optim.AdamW calls (optim_g and optim_d) in {TRAIN_PY}'s "
        "run; s2.json has no key for it. It computes the same update with fewer kernel launches"
    ]


def _preload(context: ExportContext) -> list[str]:
    if not context.config.preload_audio:
        return []
    return [
        "The tuned run decoded every item's audio into RAM once before training (preload); the recipe's "
        f"TextAudioSpeakerLoader starts ffmpeg for every item in its workers ({DATASET}, get_audio): decode them all "
        "in its __init__ to match"
    ]


def _feature(context: ExportContext) -> list[str]:
    if context.config.feature_device is None:
        return []
    return [
        f"feature_device {context.config.feature_device} does not apply to GPT-SoVITS s2: its workers compute the "
        f"spectrogram ({DATASET}, get_audio), and autotune measured it there"
    ]


def s2_notes(knob: str) -> KnobNotes | None:
    """s2's notes for a knob the s2 json cannot carry, or carries only partly; None where it adds nothing."""
    if knob in RECIPE_LOADER or knob == "in_order":
        return _loader_note(knob)
    return {
        "precision": _precision,
        "cudnn_benchmark": _cudnn,
        "grad_accum_steps": _accumulation,
        "optimizer_impl": _optimizer,
        "preload_audio": _preload,
        "feature_device": _feature,
        "compile": compile_note("GPT-SoVITS", f"{TRAIN_PY}'s run, on net_g and net_d before DDP wraps them"),
    }.get(knob)
