"""GPT-SoVITS: s1's yaml keys and the ``s1_train.py`` command (RVC-Boss/GPT-SoVITS 48b1a01); s2's json keys and
command are `autotune.exports.gpt_sovits_s2`'s, and the knob table below gives each stage its own notes.

What carries what, from the recipe's code: ``train.batch_size`` (utterances per GPU: data_module.py:46-52, capped at a
quarter of the dataset), ``data.num_workers`` (data_module.py:25, 58) and ``train.precision`` (the Lightning Trainer's
``precision``, s1_train.py:123). s1_train.py reads the yaml with ``load_yaml_config`` (AR/utils/io.py:7-10,
``yaml.full_load``); the webui writes it as ``TEMP/tmp_s1.yaml`` from configs/s1longer-v2.yaml with its form's values
(webui.py:603-633) and starts ``python -s GPT_SoVITS/s1_train.py --config_file`` with ``_CUDA_VISIBLE_DEVICES``
(webui.py:630-636), which s1_train.py:4-5 copies to CUDA_VISIBLE_DEVICES; the Trainer takes every visible GPU
(``devices=-1``, s1_train.py:117). What the recipe hard-codes gets a note naming its file and line: accumulation
(t2s_lightning_module.py:54-57), the DataLoader's persistent_workers and prefetch_factor and its missing pin_memory
(data_module.py:53-61), Lightning's ``benchmark=False`` (s1_train.py:118) and TF32 matmuls (s1_train.py:22).
"""

from __future__ import annotations

from typing import Any

from autotune.exports.base import Export, ExportContext, KnobNotes, cannot, knob_table, register, takes, unsupported
from autotune.exports.gpt_sovits_s2 import MODEL as S2_MODEL
from autotune.exports.gpt_sovits_s2 import export_s2, s2_notes
from autotune.exports.knob_notes import THREADS, checkpointing_note, compile_note
from autotune.knobs.declarations import TORCH_DEFAULTS
from autotune.yamlio import dump_yaml

__all__ = ["LIGHTNING_PRECISION", "export_gpt_sovits", "s1_overrides"]

CONFIG = "GPT_SoVITS/configs/s1longer-v2.yaml"
TRAIN_PY = "GPT_SoVITS/s1_train.py"
DATA_MODULE = "GPT_SoVITS/AR/data/data_module.py"
LIGHTNING_MODULE = "GPT_SoVITS/AR/models/t2s_lightning_module.py"
RECIPE_ACCUMULATION = 4  # t2s_lightning_module.py:54: opt.step() when batch_idx % 4 == 0
RECIPE_LOADER = {"persistent_workers": True, "prefetch_factor": 16, "pin_memory": False}  # data_module.py:53-61
# Lightning's precision strings; float32 is the webui's "32" (webui.py:614).
LIGHTNING_PRECISION = {"fp16": "16-mixed", "bf16": "bf16-mixed"}


def s1_overrides(context: ExportContext) -> dict[str, Any]:
    """The s1 yaml keys with the tuned values, nested as s1longer-v2.yaml nests them."""
    precision = LIGHTNING_PRECISION.get(context.precision, "32") if context.on_cuda else "32"
    return {
        "train": {"batch_size": context.config.per_device_batch_size, "precision": precision},
        "data": {"num_workers": context.config.num_workers},
    }


@register("gpt-sovits")
def export_gpt_sovits(context: ExportContext) -> Export:
    if context.model_name == S2_MODEL:
        return export_s2(context)
    if context.model_name != "gpt-sovits-s1":
        return unsupported(
            "gpt-sovits",
            context,
            "autotune tunes GPT-SoVITS's s1 and s2 stages (the `gpt-sovits-s1` and `gpt-sovits-s2` workloads) only",
        )
    devices = ",".join(str(index) for index in range(context.devices_per_node)) if context.on_cuda else ""
    visible = f"_CUDA_VISIBLE_DEVICES={devices} " if context.on_cuda else ""
    tf32_off = context.tf32_env() if context.precision == "fp32" else ""  # overrides s1_train.py:22's TF32 matmuls
    environment = f"{context.env_prefix()}{tf32_off}{visible}hz=25hz version=v2"
    command = f"{environment} python -s {TRAIN_PY} --config_file TEMP/tmp_s1.yaml"
    notes = [
        f"Run from GPT-SoVITS's root with the YAML merged into TEMP/tmp_s1.yaml, the config the webui writes for the "
        f"experiment ({CONFIG} plus its paths and names, webui.py:603-633); the webui rewrites that file from its form "
        '(batch size, and precision "32" with the batch halved when not half, webui.py:613-616), so start training '
        "with this command, or enter the tuned values in the form. hz and version are the environment the webui sets, "
        "read by GPT_SoVITS/AR/data/dataset.py:14 and :91",
        f"train.batch_size {context.config.per_device_batch_size} is per GPU ({DATA_MODULE}:46-52 gives it to each "
        "rank's DataLoader; capped at a quarter of the dataset); the Trainer takes every GPU _CUDA_VISIBLE_DEVICES "
        f"lists (devices=-1, {TRAIN_PY}:117)",
        f"Keep use_distributed_sampler=False at {TRAIN_PY}:127 (PR 756, commit 4f8e1660): the bucket sampler deals the "
        "data by rank itself, and without it Lightning deals it again, so each rank trains on 1/N^2 of the data per "
        "epoch (issues 750, 1318); autotune measured the recipe with it",
    ]
    if context.nodes > 1:
        notes.append(
            f"Measured on {context.nodes} nodes: {TRAIN_PY}:111-128 builds its Trainer without num_nodes, so it trains "
            "on one node's GPUs; add num_nodes there and launch it on each node to match"
        )
    return Export(
        target="gpt-sovits",
        yaml_text=dump_yaml(s1_overrides(context)),
        command=command,
        notes=tuple(notes),
    )


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if not context.on_cuda:
        return [f'{precision} was measured on the CPU; the yaml trains float32 ("32") there']
    if precision in LIGHTNING_PRECISION:
        scaler = " and GradScaler" if precision == "fp16" else ""
        return [
            f"precision {LIGHTNING_PRECISION[precision]}: Lightning's autocast{scaler}; {TRAIN_PY}:22 also sets "
            'float32 matmul precision "high" (TF32) for what autocast leaves in float32, which the trials did not set '
            "(torch's default, IEEE float32 matmuls, outside autocast)"
        ]
    if precision == "tf32":
        return []  # "32" with s1_train.py:22's TF32 matmuls and cuDNN's TF32 convolutions: the recipe's own
    if precision == "fp32":
        note = context.tf32_env_note("GPT-SoVITS")
        return [f"{note}; it also overrides {TRAIN_PY}:22, where the recipe hard-codes TF32 matmuls"] if note else []
    return [
        f"{precision} was measured with IEEE float32 matmuls, but {TRAIN_PY}:22 hard-codes "
        'torch.set_float32_matmul_precision("high") (TF32): set it to "highest" there to train as measured'
    ]


def _loader_note(name: str) -> KnobNotes:
    """A DataLoader argument the recipe hard-codes, where the tuned value differs from it."""

    def note(context: ExportContext) -> list[str]:
        if context.config.num_workers == 0:
            return []
        value = getattr(context.config, name)
        recipe = RECIPE_LOADER.get(name, TORCH_DEFAULTS.get(name))
        if value is None or value == recipe:
            return []
        return [
            f"The tuned DataLoader had {name}={value}; the recipe hard-codes {name}={recipe} ({DATA_MODULE}:53-61, "
            f"train_dataloader): no yaml key reaches it, so change that call to train as measured"
        ]

    return note


def _accumulation_notes(context: ExportContext) -> list[str]:
    accumulation = context.config.grad_accum_steps
    if accumulation == RECIPE_ACCUMULATION:
        return []
    return [
        f"grad_accum_steps {accumulation} was measured, but the recipe steps every {RECIPE_ACCUMULATION} batches, "
        f"hard-coded ({LIGHTNING_MODULE}:54-57: `batch_idx % 4 == 0`; the yaml's gradient keys are never read): "
        f"change the 4 there to {accumulation} to train as measured"
    ]


def _cudnn_notes(context: ExportContext) -> list[str]:
    if not (context.config.cudnn_benchmark and context.on_cuda):
        return []
    return [
        f"The tuned run used cudnn.benchmark=True; the recipe hard-codes Trainer(benchmark=False) ({TRAIN_PY}:118): "
        "set it to True there to match"
    ]


def _feature_notes(context: ExportContext) -> list[str]:
    if context.config.feature_device is None:
        return []
    return [
        f"feature_device {context.config.feature_device} does not apply to GPT-SoVITS s1: its workers read prepared "
        "ids and BERT features, and no features are computed to move"
    ]


def _preload_notes(context: ExportContext) -> list[str]:
    if not context.config.preload_audio:
        return []
    return [
        "The tuned run read every item's BERT features into RAM once before training (preload); the recipe's "
        "Text2SemanticDataset torch.loads one file per item in its workers (GPT_SoVITS/AR/data/dataset.py:224-226): "
        "load them all in its __init__ to match"
    ]


def _optimizer_notes(context: ExportContext) -> list[str]:
    if context.config.optimizer_impl == "default":
        return []
    return [
        f"optimizer_impl {context.config.optimizer_impl} does not apply: the recipe trains with ScaledAdam "
        f"({LIGHTNING_MODULE}:124-132), which has no foreach or fused kernels"
    ]


def _by_stage(knob: str, s1: KnobNotes | None) -> KnobNotes:
    """A knob's notes for the stage the result tuned: s1's, or s2's (`autotune.exports.gpt_sovits_s2.s2_notes`)."""
    s2 = s2_notes(knob)

    def notes(context: ExportContext) -> list[str]:
        chosen = s2 if context.model_name == S2_MODEL else s1
        return list(chosen(context)) if chosen is not None else []

    return notes


KNOB_TABLE = knob_table(
    "gpt-sovits",
    {
        "per_device_batch_size": takes("train.batch_size (per GPU: s1's yaml, s2's json)"),
        "num_workers": takes("data.num_workers (s1; s2_train.py hard-codes 5)", _by_stage("num_workers", None)),
        "prefetch_factor": cannot(_by_stage("prefetch_factor", _loader_note("prefetch_factor"))),
        "pin_memory": cannot(_by_stage("pin_memory", _loader_note("pin_memory"))),
        "persistent_workers": cannot(_by_stage("persistent_workers", _loader_note("persistent_workers"))),
        "in_order": cannot(_by_stage("in_order", _loader_note("in_order"))),
        "precision": takes(
            "train.precision (s1: the Trainer's precision); train.fp16_run (s2)",
            notes=_by_stage("precision", _precision_notes),
        ),
        "optimizer_impl": cannot(_by_stage("optimizer_impl", _optimizer_notes)),
        "activation_checkpointing": cannot(
            checkpointing_note("GPT-SoVITS (AR/models/t2s_model.py, module/models.py)", "wrap each layer's forward")
        ),
        "intra_op_threads": THREADS,
        "cudnn_benchmark": cannot(_by_stage("cudnn_benchmark", _cudnn_notes)),
        "world_size": takes("_CUDA_VISIBLE_DEVICES (s1: the Trainer takes every listed GPU); train.gpu_numbers (s2)"),
        "grad_accum_steps": cannot(_by_stage("grad_accum_steps", _accumulation_notes)),
        "preload_audio": cannot(_by_stage("preload_audio", _preload_notes)),
        "feature_device": cannot(_by_stage("feature_device", _feature_notes)),
        "compile": cannot(
            _by_stage("compile", compile_note("GPT-SoVITS", f"{TRAIN_PY}, on model.model before trainer.fit"))
        ),
    },
)
