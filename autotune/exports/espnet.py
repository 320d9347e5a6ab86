"""ESPnet2: the recipe's run.sh training stage, with the tuned values passed through to the trainer.

spk.sh and asr.sh (egs2/TEMPLATE) build the full `python -m espnet2.bin.{spk,asr}_train` call (--output_dir, the
data and shape files from the earlier stages) and append `--spk_args` / `--asr_args` after `--config`, so those
override the recipe's YAML. Keys follow espnet2/tasks/abs_task.py (batch_size, num_workers, accum_grad, use_amp,
use_tf32, cudnn_benchmark, drop_last_iter). batch_size is the TOTAL across GPUs (each mini-batch is split
rank::world_size). The speaker recipe uses iterator_type category, whose batches are category-balanced (batch_type
folded maps to the catbel sampler there): its batch_type is left alone. espnet2/train/trainer.py autocasts with
torch.cuda.amp (bfloat16 where the GPU supports it in recent releases): use_amp does nothing on a CPU.

`--recipe espnet` runs the user's own `python -m espnet2.bin.asr_train ...` call (the one asr.sh's training stage
logs) with the same trainer arguments this export writes (TRAINER_OPTIONS, AMP_WORDS). Knobs ESPnet cannot take
without a code change are not searched there: pin_memory is `args.ngpu > 0` (espnet2/tasks/abs_task.py:1921), and
the DataLoader of espnet2/iterators/sequence_iter_factory.py:158 passes no prefetch_factor nor persistent_workers.
"""

from __future__ import annotations

import importlib.util
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.exports import recipe_input
from autotune.exports.base import (
    TF32_OFF_ENV,
    Export,
    ExportContext,
    KnobNotes,
    cannot,
    knob_table,
    register,
    takes,
    unsupported,
)
from autotune.exports.knob_notes import (
    THREADS,
    checkpointing_note,
    compile_note,
    feature_note,
    optimizer_note,
    preload_note,
    unordered_note,
)
from autotune.exports.recipe_input import command_words, read_mapping
from autotune.knobs.precision import TORCH_DEFAULT_FP32
from autotune.probe.command import TrainingCommand

# The one mapping, used both ways (the export below, and a `--recipe espnet` trial's arguments: exports/recipes.py):
# each knob as the trainer's argument (espnet2/tasks/abs_task.py), ESPnet's --use_amp word per precision (its
# autocast is torch.cuda.amp: bfloat16 on GPUs that have it, float16 on older ones; nothing on a CPU), and the
# precisions one --use_amp expresses per device type (tf32 needs --use_tf32 too, strict fp32 an environment variable).
TRAINER_OPTIONS = {"per_device_batch_size": "batch_size", "num_workers": "num_workers", "precision": "use_amp"}
AMP_WORDS = {TORCH_DEFAULT_FP32: "false", "fp32": "false", "tf32": "false", "bf16": "true", "fp16": "true"}
PRECISIONS = {"cpu": ("fp32",), "cuda": (TORCH_DEFAULT_FP32, "bf16")}  # a CPU has no TF32: its fp32 is strict
# batch_type values whose batches are counted in utterances by batch_size (espnet2/samplers/build_batch_sampler.py):
# folded shrinks it for long utterances by fold_length; numel and length pack batch_bins instead.
FIXED_COUNT_BATCH_TYPES = ("unsorted", "sorted", "folded")
TRAINER_MODULE = "espnet2.bin.asr_train"

_HOP_SAMPLES = 160  # 10 ms frame shift at 16 kHz


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    folder: str  # under egs2
    stage: int  # run.sh's training stage
    config_option: str  # run.sh option naming the training config
    config: str
    args_option: str  # run.sh option appended to the trainer's arguments
    sequence_batches: bool  # iterator_type sequence (batch_type applies) rather than category


_SPEAKER = Recipe(
    folder="voxceleb/spk1",
    stage=5,
    config_option="--spk_config",
    config="conf/train_ECAPA_mel.yaml",
    args_option="--spk_args",
    sequence_batches=False,
)
RECIPES = {
    "ecapa-tdnn": _SPEAKER,
    "ecapa-tdnn-512": _SPEAKER,
    "conformer": Recipe(
        folder="aishell/asr1",
        stage=11,
        config_option="--asr_config",
        config="conf/train_asr_conformer.yaml",
        args_option="--asr_args",
        sequence_batches=True,
    ),
}


@register("espnet")
def export_espnet(context: ExportContext) -> Export:
    recipe = RECIPES.get(context.model_name)
    if recipe is None:
        return unsupported("espnet", context, _unsupported_reason(context))
    ngpu = context.devices_per_node if context.on_cuda else 0  # run.sh's --ngpu is per node (launch.py)
    nodes = f"--num_nodes {context.nodes} " if context.nodes > 1 else ""
    trainer_args = " ".join(f"--{key} {value}" for key, value in trainer_overrides(context, recipe).items())
    env = context.env_prefix() + (TF32_OFF_ENV + " " if context.on_cuda and context.precision == "fp32" else "")
    command = (
        f"{env}./run.sh --stage {recipe.stage} --stop_stage {recipe.stage} --ngpu {ngpu} {nodes}"
        f"{recipe.config_option} {recipe.config} \\\n    {recipe.args_option} {shlex.quote(trainer_args)}"
    )
    return Export(target="espnet", command=command, notes=_notes(context, recipe) + _multinode_notes(context))


def _multinode_notes(context: ExportContext) -> tuple[str, ...]:
    """ESPnet starts its ranks itself (espnet2/bin/launch.py): across nodes only through slurm.pl (srun, then
    --dist_launcher slurm in the trainer) or MPI; run.pl refuses other nodes."""
    if context.nodes == 1:
        return ()
    return (
        f"Measured on {context.nodes} nodes of {context.devices_per_node} device(s) each: set cmd_backend='slurm' in "
        "cmd.sh (ESPnet's launch.py then submits the trainer through slurm.pl and srun with --dist_launcher slurm; "
        "its default run.pl refuses other nodes) and give slurm.pl's conf the partition the trials ran on",
    )


def trainer_overrides(context: ExportContext, recipe: Recipe) -> dict[str, str]:
    """The trainer's own arguments (ESPnet spells booleans true/false), in the order they are printed."""
    config = context.config
    values: dict[str, str] = {}
    if context.max_frames_in_batch is None and context.bucket_plan is None:
        if recipe.sequence_batches:
            values["batch_type"] = "sorted"  # a fixed batch_size of length-sorted utterances, as WeNet's static
        values[TRAINER_OPTIONS["per_device_batch_size"]] = str(context.step_batch_size)
    values |= {
        "accum_grad": str(config.grad_accum_steps),
        TRAINER_OPTIONS["num_workers"]: str(config.num_workers),
        "drop_last_iter": "true",
        TRAINER_OPTIONS["precision"]: AMP_WORDS.get(context.precision, "false") if context.on_cuda else "false",
        "use_tf32": _bool(context.on_cuda and context.precision == "tf32"),
        "cudnn_benchmark": _bool(config.cudnn_benchmark),
        "cudnn_deterministic": "false",
    }
    # --optim_conf key=value is merged into the recipe's optim_conf (NestedDictAction), which build_optimizers passes
    # to the optimizer class: optim_class(model.parameters(), **args.optim_conf) (espnet2/tasks/abs_task.py).
    for key in context.optimizer_flag():
        values["optim_conf"] = f"{key}=true"
    return values


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _unsupported_reason(context: ExportContext) -> str:
    if context.tuned.workload.get("task") == "tts":
        return (
            "ESPnet's FastSpeech2 (egs2/ljspeech/tts1) trains on durations from a teacher model (tts.sh's "
            "--teacher_dumpdir), not on the recipe autotune measured (ming024's); no command is given"
        )
    if context.tuned.workload.get("task") == "asr":
        return (
            "ESPnet's ASR recipes with a wav2vec2 front end (egs2/*/asr1 with an S3PRL upstream) train ESPnet's own "
            "encoder-decoder configuration, not SpeechBrain's wav2vec2 + DNN + CTC recipe that was measured"
        )
    return (
        "ESPnet's speaker recipes (egs2/voxceleb/spk1) train ECAPA-TDNN, RawNet3, SKA-TDNN, MFA-Conformer and "
        "x-vectors, not this model"
    )


def _notes(context: ExportContext, recipe: Recipe) -> tuple[str, ...]:
    config = context.config
    notes = [
        f"Run from ESPnet's egs2/{recipe.folder} after run.sh's data and statistics stages: run.sh's stage "
        f"{recipe.stage} builds the trainer's --output_dir, data and shape arguments and appends {recipe.args_option} "
        "after --config, so these values override the recipe's YAML"
    ]
    frames, plan = context.max_frames_in_batch, context.bucket_plan
    if plan is not None:
        notes.append(
            f"Bucket batches ({len(plan.batch_sizes)} duration buckets, {list(plan.batch_sizes)} utterances per GPU) "
            "have no ESPnet key: its batch_type folded divides batch_size by 1 + length // fold_length "
            "(espnet2/samplers/folded_batch_sampler.py), a batch shrinking about linearly with length "
            "(bucket_scaling 1), and numel/length pack a bin budget; none takes a batch size per bucket. Not exported: "
            "the recipe's batching is left as it is, measure it"
        )
    elif frames is None:
        batch = (
            f"batch_size {context.step_batch_size} is the total across {context.world_size} GPU(s) (ESPnet splits each "
            f"mini-batch rank::world_size, {config.per_device_batch_size} per GPU)"
        )
        if recipe.sequence_batches:
            batch += "; batch_type sorted keeps it fixed, as measured (the recipe's numel packs by size)"
        else:
            batch += (
                "; the recipe's iterator_type category keeps its category-balanced batches (batch_type is left as "
                "the recipe has it)"
            )
        notes.append(batch)
    else:
        notes.append(
            f"max_frames_in_batch {frames} (fbank frames per GPU) has no ESPnet key: batch_type numel counts "
            "batch_bins over all GPUs in the units of your shape files, about "
            f"{frames * context.world_size * _HOP_SAMPLES} for 16 kHz raw-audio shapes; not exported, measure it"
        )
    if context.model_name == "ecapa-tdnn-512":
        notes.append("ECAPA-TDNN with C=512: also pass --encoder_conf ndim=512 (the recipe trains ndim 1024)")
    notes.append(
        "drop_last_iter true drops each epoch's short last batch, as the tuned loader did; cudnn_deterministic false "
        "matches the measurement (ESPnet defaults to true)"
    )
    return tuple(notes)


def _pin_notes(context: ExportContext) -> list[str]:
    """ESPnet pins memory exactly when it trains on GPUs (pin_memory=ngpu>0): a tuned value that differs is said."""
    pinned = context.config.pin_memory
    if context.on_cuda and not pinned:
        return ["ESPnet always pins memory on GPU (pin_memory=ngpu>0); the tuned run did not"]
    if not context.on_cuda and pinned:
        return [
            "pin_memory was tuned on, but ESPnet pins memory only when it trains on GPUs (pin_memory=ngpu>0): on "
            "the CPU it trains unpinned, as this export's command will"
        ]
    return []


def _unexposed(name: str) -> KnobNotes:
    """ESPnet's iterator factories build the DataLoader without this argument: torch's default runs."""

    def notes(context: ExportContext) -> list[str]:
        value = context.loader_extras().get(name)
        if not value:  # unset, or persistent_workers off: what ESPnet's loader does anyway
            return []
        return [f"ESPnet's iterator factories do not expose {name}: the tuned {name}={value} is not exported"]

    return notes


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if not context.on_cuda:
        if precision in ("bf16", "fp16"):
            return [
                f"{precision} was measured on the CPU, but ESPnet's autocast is torch.cuda.amp, which does nothing "
                "with --ngpu 0: use_amp false, the command trains fp32"
            ]
        return []
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
    if precision == "fp32":
        return [
            f"Strict fp32: use_tf32 false leaves torch's defaults (cuDNN convolutions in TF32 on Ampere and newer), "
            f"so the command sets {TF32_OFF_ENV} (NVIDIA's cuBLAS and cuDNN then never use TF32)"
        ]
    return ["fp32-default is ESPnet's use_tf32 false: it leaves torch's TF32 defaults as they are"]


KNOB_TABLE = knob_table(
    "espnet",
    {
        "per_device_batch_size": takes("--batch_size, the total across GPUs (each gets rank::world_size)"),
        "num_workers": takes("--num_workers"),
        "prefetch_factor": cannot(_unexposed("prefetch_factor")),
        "pin_memory": cannot(_pin_notes),
        "persistent_workers": cannot(_unexposed("persistent_workers")),
        "in_order": cannot(unordered_note("ESPnet (espnet2/iterators/*_iter_factory.py build_iter)", carried=False)),
        "precision": takes(
            "--use_amp and --use_tf32 (and the TF32 environment for strict fp32)", notes=_precision_notes
        ),
        "optimizer_impl": takes(
            "--optim_conf fused=true / foreach=true (merged into the recipe's optim_conf)",
            notes=optimizer_note("--optim_conf, merged into the recipe's optim_conf (build_optimizers passes it)"),
        ),
        "activation_checkpointing": cannot(
            checkpointing_note(
                "ESPnet (espnet2/asr/encoder/conformer_encoder.py has no checkpointing option)",
                "wrap each encoder layer's call in torch.utils.checkpoint.checkpoint(..., use_reentrant=False)",
            )
        ),
        "intra_op_threads": THREADS,
        "cudnn_benchmark": takes("--cudnn_benchmark"),
        "world_size": takes("run.sh --ngpu"),
        "grad_accum_steps": takes("--accum_grad"),
        "preload_audio": cannot(preload_note("ESPnet")),
        "feature_device": takes(
            "the model's frontend, which computes the features on the device",
            notes=feature_note(
                "ESPnet",
                "device",
                "in the model's frontend during forward, on the device (espnet2 ESPnetASRModel._extract_feats, the "
                "frontend of the recipe's config)",
                "to train as measured, dump features in data preparation (feats_type) instead",
            ),
        ),
        "compile": cannot(
            compile_note("ESPnet", "espnet2/tasks/abs_task.py main_worker, after cls.build_model(args=args)")
        ),
    },
)


def recipe_command(template: str, *, cwd: str = ".") -> tuple[TrainingCommand, list[str]]:
    """`--recipe espnet`: the user's ESPnet2 ASR trainer call (`python -m espnet2.bin.asr_train --config ...`, as
    asr.sh's training stage runs it) with the tuned values as the trainer's own arguments (TRAINER_OPTIONS, --use_amp
    from AMP_WORDS; batch_size times the command's --ngpu, ESPnet's batch being the total across GPUs), and the
    config's values today as the baseline. Every argument on the command line overrides the YAML
    (espnet2/utils/config_argparse.py:46 makes the --config YAML the parser's defaults), so the appended ones reach
    the trainer. Each problem is one line, before any trial.

    Raises:
        UserError: ESPnet is not installed; the command is not espnet2.bin.asr_train; it names no readable --config
            YAML; it sets what autotune sets; its batch_type or iterator_type does not count utterances.
    """
    words = command_words("espnet", template, package="espnet2", install="espnet")
    if not any(word == TRAINER_MODULE or word.endswith("espnet2/bin/asr_train.py") for word in words):
        raise UserError(
            f"--recipe espnet runs ESPnet2's ASR trainer: give the `python -m {TRAINER_MODULE} --config ...` call "
            "that asr.sh's training stage runs (it is logged in exp/asr_*/train.log), not run.sh or asr.sh"
        )
    options = _options(words)
    for option in TRAINER_OPTIONS.values():
        if option in options:
            raise UserError(
                f"--recipe espnet: the command sets --{option} itself; leave it out: autotune sets it per trial "
                "(your value today is read from --config)"
            )
    if "config" not in options:
        raise UserError("--recipe espnet: the command names no --config; autotune reads your values from its YAML")
    name = options["config"]
    config = _read_config(Path(cwd) / name, name)
    defaults = _trainer_defaults()
    _check_batches({**defaults, **config, **options}, name)
    ngpu = _gpus(options.get("ngpu", config.get("ngpu", 0)))
    world = max(ngpu, 1)  # one process per GPU, one on the CPU
    appended = " ".join(f"--{option} {{{knob}}}" for knob, option in TRAINER_OPTIONS.items())
    command = TrainingCommand.checked(
        f"{template} {appended}",
        cwd=cwd,
        recipe="espnet",
        words={"precision": dict(AMP_WORDS)},
        precisions={device: tuple(names) for device, names in PRECISIONS.items()},
        scale={"per_device_batch_size": world},
    )
    return command, _baseline({**defaults, **config}, world, on_gpu=ngpu > 0)


def _options(words: list[str]) -> dict[str, str]:
    """The command's `--key value` and `--key=value` arguments, the last of each (argparse's rule)."""
    options: dict[str, str] = {}
    for index, word in enumerate(words):
        if not word.startswith("--") or len(word) == 2:
            continue
        key, equals, value = word[2:].partition("=")
        if not equals:
            following = words[index + 1] if index + 1 < len(words) else ""
            value = "" if following.startswith("--") else following
        options[key] = value
    return options


def _read_config(path: Path, name: str) -> dict[str, Any]:
    return read_mapping("espnet", path, f"--config {name}", what="the trainer's arguments")


def _check_batches(values: dict[str, Any], name: str) -> None:
    """batch_size counts utterances only for the fixed-count batch types of the sequence iterator."""
    batch_type = str(values.get("batch_type"))
    if batch_type not in FIXED_COUNT_BATCH_TYPES:
        raise UserError(
            f"--recipe espnet: batch_type {batch_type} (from {name} or the command) packs batch_bins, not "
            f"batch_size utterances, so autotune's batch size would not reach it: give --batch_type "
            f"{' or '.join(FIXED_COUNT_BATCH_TYPES)} in the command, or tune batch_bins yourself"
        )
    iterator = str(values.get("iterator_type", "sequence"))
    if iterator != "sequence":
        raise UserError(
            f"--recipe espnet: iterator_type {iterator} builds its batches its own way (chunks or categories); "
            "autotune tunes the sequence iterator's batch_size: give --iterator_type sequence"
        )


def _gpus(ngpu: Any) -> int:
    """The command's --ngpu (0: the CPU)."""
    try:
        return int(ngpu)
    except (TypeError, ValueError):
        raise UserError(f"--recipe espnet: --ngpu {ngpu} is not a number of GPUs") from None


# What espnet2/tasks/abs_task.py's parser gives when neither the command nor the config does (ESPnet 202511), used
# where its file cannot be read.
_KNOWN_DEFAULTS = {"batch_size": 20, "num_workers": 1, "batch_type": "folded", "use_amp": False}


def _trainer_defaults() -> dict[str, Any]:
    """The trainer's own defaults for what the baseline and the checks read, from espnet2/tasks/abs_task.py."""
    spec = importlib.util.find_spec("espnet2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found: dict[str, Any] = {}
    for folder in folders:
        found |= recipe_input.declared_defaults(Path(folder) / "tasks" / "abs_task.py", _KNOWN_DEFAULTS) or {}
    return _KNOWN_DEFAULTS | found


def _baseline(values: dict[str, Any], world: int, *, on_gpu: bool) -> list[str]:
    """The config's values today (the trainer's defaults where it has none), as --baseline items: use_amp true is
    bf16 on a GPU (AMP_WORDS) and nothing on the CPU."""
    items = [
        f"per_device_batch_size={max(int(values['batch_size']) // world, 1)}",
        f"num_workers={int(values['num_workers'])}",
    ]
    amp = on_gpu and values.get("use_amp") is True
    return [*items, f"precision={'bf16' if amp else TORCH_DEFAULT_FP32}"]
