"""Amphion: NaturalSpeech2's exp_config.json train keys and its `accelerate launch` command (Amphion d3de90f0).

What carries what, from the recipe's code: ``train.max_tokens`` and ``train.max_sentences`` (per GPU: ns2_trainer.py
multiplies them by the processes, lines 268-275), ``train.dataloader.num_worker`` and ``pin_memory`` (the DataLoader,
lines 287-295), ``train.gradient_accumulation_step`` (``Accelerator(gradient_accumulation_steps=...)``, line 244) and
``train.adam`` (``AdamW(**cfg.train.adam)``, lines 355-359, which also takes fused/foreach). The Accelerator is built
without mixed_precision (lines 243-248), so AMP is accelerate's: ``accelerate launch --mixed_precision``. The config
is JSON read by json5 (utils/util.py load_config, merging each file over its base_config): the export is a JSON
object, which is also valid YAML, to merge into exp_config.json. What the recipe hard-codes gets a note naming its
file and line: TF32 and cudnn.benchmark (bins/tts/train.py 33-43), the DataLoader's missing prefetch_factor,
persistent_workers and in_order (ns2_trainer.py 287-295).
"""

from __future__ import annotations

import json
from typing import Any

from autotune.exports.base import Export, ExportContext, KnobNotes, cannot, knob_table, register, takes, unsupported
from autotune.exports.knob_notes import THREADS, checkpointing_note, compile_note, optimizer_note
from autotune.knobs.declarations import TORCH_DEFAULTS

__all__ = ["RECIPE_ADAM", "export_amphion"]

CONFIG = "egs/tts/NaturalSpeech2/exp_config.json"
TRAIN_PY = "bins/tts/train.py"
TRAINER = "models/tts/naturalspeech2/ns2_trainer.py"
RECIPE_ADAM = {"lr": 1.0e-4}  # exp_config.json train.adam: replaced whole by a merge that names adam
RECIPE_MAX_TOKENS = 7500  # what the result holds when it names none (the workload's default)
RECIPE_MAX_SENTENCES = 32
_MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16"}  # accelerate's values; anything else trains float32 ("no")


def train_section(context: ExportContext) -> dict[str, Any]:
    """exp_config.json's train keys with the tuned values, as Amphion names them."""
    config = context.config
    knobs = config.workload_knobs
    train: dict[str, Any] = {
        "use_dynamic_batchsize": True,
        "max_tokens": int(knobs.get("max_frames_in_batch") or RECIPE_MAX_TOKENS),
        "max_sentences": int(knobs.get("max_sentences", RECIPE_MAX_SENTENCES)),
        "gradient_accumulation_step": config.grad_accum_steps,
        "dataloader": {"num_worker": config.num_workers, "pin_memory": config.pin_memory},
    }
    if context.optimizer_flag():
        train["adam"] = {**RECIPE_ADAM, **context.optimizer_flag()}
    return {"train": train}


@register("amphion")
def export_amphion(context: ExportContext) -> Export:
    if context.model_name != "naturalspeech2":
        return unsupported(
            "amphion", context, "autotune tunes Amphion's NaturalSpeech2 recipe (the `naturalspeech2` workload) only"
        )
    mixed = _MIXED_PRECISION.get(context.precision, "no") if context.on_cuda else "no"
    launch = f"accelerate launch --num_processes {context.world_size} --mixed_precision {mixed}"
    if context.world_size > 1:
        launch += " --multi_gpu"
    if not context.on_cuda:
        launch += " --cpu"
    tf32_off = context.tf32_env() if context.precision == "fp32" else ""  # overrides train.py's allow_tf32
    command = (
        f"{context.env_prefix()}{tf32_off}{launch} \\\n    {TRAIN_PY} --config {CONFIG} --exp_name naturalspeech2 "
        "--log_level debug"
    )
    notes = [
        f"Run from Amphion's root with the JSON merged into {CONFIG} (its train section; Amphion reads it with json5 "
        "and merges it over exp_config_base.json). run_train.sh calls `accelerate` without `launch`: use this line",
        f"max_tokens {train_section(context)['train']['max_tokens']} (codec frames, 75 per second) and max_sentences "
        f"are per GPU: {TRAINER}:268-275 multiplies both by the number of processes ({context.world_size}) and deals "
        "each batch over them",
    ]
    if context.multinode_note():
        notes.append("Several nodes: run the line on each with --num_machines, --machine_rank and --main_process_ip")
    return Export(
        target="amphion",
        yaml_text=json.dumps(train_section(context), indent=2) + "\n",
        command=command,
        notes=tuple(notes),
    )


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if not context.on_cuda:
        return [f"{precision} was measured on the CPU; the command trains float32 there (--cpu)"]
    if precision in _MIXED_PRECISION:
        return [
            f"--mixed_precision {precision}: accelerate's autocast around the model's forward. {TRAINER}:436 and "
            ":461-464 call code_to_latent and latent_to_code (the CE term's codebook searches) through "
            "self.model.module, outside it: they run in float32 there, where the trials ran them under autocast too"
        ]
    if precision == "tf32":
        return []  # the recipe's own: train.py forces TF32
    if precision == "fp32":
        env_note = context.tf32_env_note("Amphion")
        return (
            [f"{env_note}; it also overrides {TRAIN_PY}:36 and :39, where the recipe hard-codes allow_tf32 = True"]
            if env_note
            else []
        )
    return [
        f"{precision} was measured with IEEE float32 matmuls, but {TRAIN_PY}:36 (cuda_relevant) sets "
        "torch.backends.cuda.matmul.allow_tf32 = True: the recipe hard-codes this; set it to False there to train "
        "as measured"
    ]


def _cudnn_notes(context: ExportContext) -> list[str]:
    if context.config.cudnn_benchmark or not context.on_cuda:
        return []
    return [
        f"The tuned run had cudnn.benchmark off, but the recipe hard-codes it on: {TRAIN_PY}:42 sets "
        "torch.backends.cudnn.benchmark = not deterministic (cuda_relevant() is called without arguments, line 135): "
        "set it to False there to match"
    ]


def _loader_note(name: str) -> KnobNotes:
    """The note for a DataLoader argument the recipe cannot take from its config (its call passes none of these),
    where the tuned value is not torch's default, which the recipe runs."""

    def note(context: ExportContext) -> list[str]:
        value = context.loader_extras().get(name)
        if value is None or value == TORCH_DEFAULTS.get(name):
            return []
        return [
            f"The tuned DataLoader had {name}={value}; the recipe hard-codes torch's default: {TRAINER}:287-295 "
            f"builds DataLoader(train_dataset, collate_fn, num_workers, batch_sampler, pin_memory) and no config key "
            f"reaches the rest: add {name}={value} to that call to train as measured"
        ]

    return note


def _feature_notes(context: ExportContext) -> list[str]:
    if context.config.feature_device is None:
        return []
    return [
        f"feature_device {context.config.feature_device} does not apply to NaturalSpeech2: its workers read prepared "
        "codes, pitch and durations, and no features are computed to move"
    ]


def _preload_notes(context: ExportContext) -> list[str]:
    if not context.config.preload_audio:
        return []
    return [
        "The tuned run read every utterance's pickle into RAM once before training (preload); Amphion opens one "
        "pickle per item in its workers (models/tts/naturalspeech2/ns2_dataset.py:187-196): load them all in "
        "NS2Dataset.__init__ (the maintainer's advice in Amphion#120, 'preload all data into memory') to match"
    ]


KNOB_TABLE = knob_table(
    "amphion",
    {
        "per_device_batch_size": takes("not read: the dynamic batches are train.max_tokens and train.max_sentences"),
        "num_workers": takes("train.dataloader.num_worker"),
        "prefetch_factor": cannot(_loader_note("prefetch_factor")),
        "pin_memory": takes("train.dataloader.pin_memory"),
        "persistent_workers": cannot(_loader_note("persistent_workers")),
        "in_order": cannot(_loader_note("in_order")),
        "precision": takes("accelerate launch --mixed_precision (TF32 is train.py's)", notes=_precision_notes),
        "optimizer_impl": takes(
            "train.adam (the JSON)", notes=optimizer_note(f"train.adam, which {TRAINER}:355-359 passes to AdamW")
        ),
        "activation_checkpointing": cannot(
            checkpointing_note("Amphion (models/tts/naturalspeech2/ns2.py)", "wrap its WaveNet and predictor layers")
        ),
        "intra_op_threads": THREADS,
        "cudnn_benchmark": cannot(_cudnn_notes),
        "world_size": takes("accelerate launch --num_processes"),
        "grad_accum_steps": takes(f"train.gradient_accumulation_step ({TRAINER}:244, accelerator.accumulate at :637)"),
        "preload_audio": cannot(_preload_notes),
        "feature_device": cannot(_feature_notes),
        "compile": cannot(compile_note("Amphion", f"{TRAINER} _build_model, before accelerator.prepare")),
    },
)
