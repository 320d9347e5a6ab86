"""SpeechBrain: the VoxCeleb ECAPA-TDNN recipe's command with the tuned values as command-line overrides.

SpeechBrain (speechbrain/speechbrain 9c826ef; PyPI 1.1.2) parses run options (--precision,
--grad_accumulation_factor, --device) with its own parser (speechbrain/utils/run_opts.py) and turns every other
`--key value` into a YAML override that hyperpyyaml merges into the hparams file with recursive_update: a mapping
given for `dataloader_options` is merged key by key into the recipe's, so its shuffle and its batch_size/num_workers
references stay unless the override names them. dataloader_options is per process under DDP and reaches torch's
DataLoader unchanged (Brain.make_dataloader), so prefetch_factor and persistent_workers are accepted. TF32 comes from
the allow_tf32 quirk in speechbrain/utils/quirks.py, applied at import unless SB_DISABLE_QUIRKS lists it; with it
disabled, torch's own defaults apply (matmuls IEEE, cuDNN convolutions TF32): exactly fp32-default.
"""

from __future__ import annotations

import shlex
from typing import Any

from autotune.exports.base import (
    TF32_OFF_ENV,
    Export,
    ExportContext,
    cannot,
    knob_table,
    register,
    takes,
    unsupported,
)
from autotune.exports.knob_notes import (
    THREADS,
    checkpointing_note,
    cudnn_benchmark_note,
    feature_note,
    optimizer_note,
    preload_note,
    unordered_note,
)
from autotune.knobs.precision import TORCH_DEFAULT_FP32

# recipes/VoxCeleb/SpeakerRec: the script and hparams file, run from that folder.
RECIPE_SCRIPT = "train_speaker_embeddings.py"
RECIPE_HPARAMS = "hparams/train_ecapa_tdnn.yaml"
_ECAPA = {"ecapa-tdnn": None, "ecapa-tdnn-512": 512}
_QUIRK_OFF = "SB_DISABLE_QUIRKS=allow_tf32"
# hparams/train_ecapa_tdnn.yaml's opt_class (9c826ef): `!name:torch.optim.Adam` with these arguments. An override
# replaces it whole, so the tuned implementation's flag is passed with the recipe's arguments.
_RECIPE_OPTIMIZER = "!name:torch.optim.Adam {lr: !ref <lr>, weight_decay: 0.000002"


@register("speechbrain")
def export_speechbrain(context: ExportContext) -> Export:
    if context.model_name not in _ECAPA:
        return unsupported("speechbrain", context, _unsupported_reason(context))
    config = context.config
    options: dict[str, Any] = {
        "batch_size": config.per_device_batch_size,
        "num_workers": config.num_workers,
        "pin_memory": config.pin_memory,
        **context.loader_extras(),
        "drop_last": True,
    }
    words = [
        f"{RECIPE_SCRIPT} {RECIPE_HPARAMS} --data_folder /path/to/VoxCeleb",
        f"--dataloader_options {shlex.quote(_flow_mapping(options))}",
    ]
    flag = context.optimizer_flag()
    if flag:
        (key,) = flag
        words.append(f"--opt_class {shlex.quote(f'{_RECIPE_OPTIMIZER}, {key}: true}}')}")
    precision = _precision_flag(context)
    if precision is not None:
        words.append(f"--precision {precision}")
    words += _compile_words(context)
    if config.grad_accum_steps > 1:
        words.append(f"--grad_accumulation_factor {config.grad_accum_steps}")
    if not context.on_cuda:
        words.append("--device cpu" + (" --distributed_backend gloo" if context.world_size > 1 else ""))
    launcher = f"torchrun --nproc_per_node={context.world_size}" if context.world_size > 1 else "python"
    if context.nodes > 1:  # SpeechBrain reads torchrun's RANK/LOCAL_RANK/WORLD_SIZE, on every node alike
        launcher = context.multinode_torchrun()
    command = context.env_prefix() + _tf32_env(context) + f"{launcher} " + " \\\n    ".join(words)
    notes = _notes(context) + tuple(filter(None, [context.multinode_note()]))
    return Export(target="speechbrain", command=command, notes=notes)


def _unsupported_reason(context: ExportContext) -> str:
    task = context.tuned.workload.get("task")
    if task == "asr":
        return (
            "SpeechBrain has no recipe for this WeNet conformer (train.py hparams/conformer.yaml exists only in its "
            "speech-translation recipes), and its ASR recipes (e.g. LibriSpeech conformer_small.yaml) read "
            "train_dataloader_opts, and under dynamic batching rebuild the loader options as {batch_sampler, "
            "num_workers}, so a tuned pin_memory, prefetch_factor or persistent_workers would never arrive"
        )
    return (
        "its speaker-recognition recipe (recipes/VoxCeleb/SpeakerRec) trains ECAPA-TDNN, x-vectors and ResNet, not "
        "this model, and no other SpeechBrain recipe matches what was measured"
    )


def _flow_mapping(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key}: {_scalar(value)}" for key, value in values.items()) + "}"


def _scalar(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _precision_flag(context: ExportContext) -> str | None:
    """SpeechBrain's --precision for the measured one; None keeps the recipe's fp32."""
    precision = context.precision
    if precision in ("bf16", "fp16") and not (precision == "fp16" and not context.on_cuda):
        return precision
    return None


def _tf32_env(context: ExportContext) -> str:
    if not context.on_cuda or context.precision not in ("fp32", TORCH_DEFAULT_FP32):
        return ""
    return _QUIRK_OFF + " " + (TF32_OFF_ENV + " " if context.precision == "fp32" else "")


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    notes = [
        "Run from SpeechBrain's recipes/VoxCeleb/SpeakerRec with --data_folder set to your VoxCeleb folder (the "
        "recipe's !PLACEHOLDER)",
        f"--dataloader_options is merged into the recipe's dataloader_options (its shuffle stays); batch_size "
        f"{config.per_device_batch_size} is per process (each DDP process loads its own batches): global batch "
        f"{context.global_batch_size} with {context.world_size} process(es) and grad_accumulation_factor "
        f"{config.grad_accum_steps}. The recipe passes the same options to its validation loader",
    ]
    if _ECAPA[context.model_name]:
        notes.append(
            f"ECAPA-TDNN with C={_ECAPA[context.model_name]}: set embedding_model's channels to [512, 512, 512, 512, "
            "1536] in hparams/train_ecapa_tdnn.yaml (the recipe trains C=1024)"
        )
    if context.max_frames_in_batch is not None:
        notes.append("max_frames_in_batch does not apply to this recipe's fixed-length crops: not exported")
    return tuple(notes)


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if not context.on_cuda:
        if precision == "fp16":
            return [
                "fp16 was measured on the CPU, but SpeechBrain rejects --precision fp16 there: the command trains the "
                "recipe's fp32 (bf16 is the CPU's autocast precision in SpeechBrain, not measured here)"
            ]
        return []
    if precision == "tf32":
        return [
            "tf32 is SpeechBrain's default: its allow_tf32 quirk turns TF32 on for matmuls and cuDNN at import, so "
            "nothing else is needed (do not set SB_DISABLE_QUIRKS=allow_tf32)"
        ]
    if precision == TORCH_DEFAULT_FP32:
        return [
            f"fp32-default (torch's TF32 defaults) needs {_QUIRK_OFF}, as in the command: SpeechBrain otherwise turns "
            "TF32 on for matmuls too at import; with the quirk off nothing touches torch's flags"
        ]
    if precision == "fp32":
        return [
            f"Strict fp32 needs {_QUIRK_OFF} (SpeechBrain otherwise turns TF32 on at import) and {TF32_OFF_ENV} "
            "(torch's own default runs cuDNN convolutions in TF32; NVIDIA's libraries then never use TF32)"
        ]
    if precision == "fp16":
        return ["--precision fp16 autocasts float16 and scales the loss with a GradScaler on CUDA"]
    return []


def _compile_words(context: ExportContext) -> list[str]:
    """Brain's run_opts for the tuned compile: --compile compiles every module of the recipe's `modules`
    (speechbrain/core.py Brain._compile) with dynamic=--compile_using_dynamic_shape_tracing."""
    kwargs = context.compile_kwargs()
    if kwargs is None:
        return []
    return ["--compile"] + (["--compile_using_dynamic_shape_tracing"] if kwargs.get("dynamic") else [])


def _compile_notes(context: ExportContext) -> list[str]:
    kwargs = context.compile_kwargs()
    if kwargs is None:
        return []
    notes = [
        "--compile compiles every module in the recipe's `modules` (compute_features, mean_var_norm, "
        "embedding_model, classifier) with torch.compile; the trials compiled the network and its loss head, and "
        "computed features in the loader workers"
    ]
    if not kwargs.get("dynamic"):
        notes.append(
            "compile default was measured with torch's dynamic=None (a changing dimension turns symbolic at its "
            "first recompile); SpeechBrain passes dynamic=False without --compile_using_dynamic_shape_tracing, "
            "which specialises every shape: the same with this recipe's fixed-length crops"
        )
    return notes


_LOADER_OPTIONS = takes("--dataloader_options (merged into the recipe's, per process)")
KNOB_TABLE = knob_table(
    "speechbrain",
    {
        "per_device_batch_size": _LOADER_OPTIONS,
        "num_workers": _LOADER_OPTIONS,
        "prefetch_factor": _LOADER_OPTIONS,
        "pin_memory": _LOADER_OPTIONS,
        "persistent_workers": _LOADER_OPTIONS,
        "in_order": takes(_LOADER_OPTIONS.how, notes=unordered_note("SpeechBrain", carried=True)),
        "precision": takes("--precision, SB_DISABLE_QUIRKS and the TF32 environment", notes=_precision_notes),
        "optimizer_impl": takes(
            "--opt_class (the recipe's Adam with the flag)",
            notes=optimizer_note("--opt_class, the recipe's !name:torch.optim.Adam plus the flag"),
        ),
        "activation_checkpointing": cannot(
            checkpointing_note(
                "SpeechBrain (its ECAPA_TDNN has no checkpointing option)",
                "wrap the model's blocks in torch.utils.checkpoint.checkpoint(..., use_reentrant=False)",
            )
        ),
        "intra_op_threads": THREADS,
        "cudnn_benchmark": cannot(
            cudnn_benchmark_note(
                "SpeechBrain has no option for it and leaves torch's default (off on CUDA)",
                "set torch.backends.cudnn.benchmark = True in the training script",
            )
        ),
        "world_size": takes("torchrun --nproc_per_node (python for one process)"),
        "grad_accum_steps": takes("--grad_accumulation_factor"),
        "preload_audio": cannot(preload_note("SpeechBrain")),
        "feature_device": takes(
            "compute_forward, where the recipes compute Fbank on the device",
            notes=feature_note(
                "SpeechBrain",
                "device",
                "in compute_forward, on the device, after the augmentation (the recipes' compute_features module, "
                "recipes/VoxCeleb/SpeakerRec/train_speaker_embeddings.py)",
                "to train as measured, compute it in the dataio pipeline's audio_pipeline instead",
            ),
        ),
        "compile": takes("--compile (and --compile_using_dynamic_shape_tracing for dynamic)", notes=_compile_notes),
    },
)
