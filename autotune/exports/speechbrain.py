"""SpeechBrain: the VoxCeleb ECAPA-TDNN recipe's and the CommonVoice wav2vec2 CTC recipe's command with the tuned
values as command-line overrides.

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

import ast
import importlib.util
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UserError
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
from autotune.exports.recipe_input import command_words, read_mapping
from autotune.knobs.precision import TORCH_DEFAULT_FP32
from autotune.probe.command import TrainingCommand

_QUIRK_OFF = "SB_DISABLE_QUIRKS=allow_tf32"
# The one mapping, used both ways (the export below, and a `--recipe speechbrain` trial's overrides:
# exports/recipes.py): each DataLoader knob as a key of the recipe's loader options (torch's DataLoader keywords,
# per process), the keys recipes keep those options under, SpeechBrain's --precision word for each precision it trains
# without an environment variable (on a CPU its fp32 is torch's float32; on CUDA the allow_tf32 quirk makes it TF32),
# and what a knob unset by a configuration is written as (YAML's null: prefetch_factor without workers).
LOADER_OPTIONS = {
    "per_device_batch_size": "batch_size",
    "num_workers": "num_workers",
    "pin_memory": "pin_memory",
    "prefetch_factor": "prefetch_factor",
    "persistent_workers": "persistent_workers",
}
LOADER_KEYS = ("dataloader_options", "train_dataloader_opts")
PRECISION_WORDS = {"fp32": "fp32", TORCH_DEFAULT_FP32: "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "fp16"}
# On a CPU fp32 is the one float32 (no TF32: the hardware offers fp32, not fp32-default); on CUDA strict fp32 and
# fp32-default need SB_DISABLE_QUIRKS, an environment variable, which a trial's overrides cannot carry.
PRECISIONS = {"cpu": ("fp32", "bf16"), "cuda": ("tf32", "bf16", "fp16")}
UNSET = {"prefetch_factor": "null", "persistent_workers": "false"}


def loader_override(values: dict[str, str]) -> str:
    """The loader options override, `{batch_size: 16, num_workers: 2}`, from knob -> written value."""
    return "{" + ", ".join(f"{LOADER_OPTIONS[name]}: {text}" for name, text in values.items()) + "}"


@dataclass(frozen=True, kw_only=True, slots=True)
class _Recipe:
    """One SpeechBrain recipe: where it runs, its data, what its loader keeps, and its optimizers as hparams keys.

    ``optimizers`` are (hparams key, the yaml's `!name:` value up to its closing brace, the optimizer_impl values the
    class takes): an override replaces the key whole, so the tuned flag is passed with the recipe's arguments.
    """

    folder: str
    script: str
    hparams: str
    data_folder: str
    data: str
    drop_last: bool
    order: str
    validation: str
    modules: str
    optimizers: tuple[tuple[str, str, tuple[str, ...]], ...]


_BOTH_KERNELS = ("foreach", "fused")
# recipes/VoxCeleb/SpeakerRec (9c826ef): opt_class `!name:torch.optim.Adam` with lr and weight_decay 2e-6.
_ECAPA_RECIPE = _Recipe(
    folder="recipes/VoxCeleb/SpeakerRec",
    script="train_speaker_embeddings.py",
    hparams="hparams/train_ecapa_tdnn.yaml",
    data_folder="/path/to/VoxCeleb",
    data="your VoxCeleb folder",
    drop_last=True,
    order="its shuffle stays",
    validation="The recipe passes the same options to its validation loader",
    modules="compute_features, mean_var_norm, embedding_model, classifier",
    optimizers=(("opt_class", "!name:torch.optim.Adam {lr: !ref <lr>, weight_decay: 0.000002", _BOTH_KERNELS),),
)
# recipes/CommonVoice/ASR/CTC (v1.0.0 a8b67d9; the same keys at 9c826ef): Adam for wav2vec2, Adadelta for the head
# (torch has no fused Adadelta: the workload steps it with foreach where that is tuned, torch's default otherwise).
# The script turns the loader's shuffle off for sorting: ascending; its loader keeps the last short batch.
_WAV2VEC2_RECIPE = _Recipe(
    folder="recipes/CommonVoice/ASR/CTC",
    script="train_with_wav2vec.py",
    hparams="hparams/train_fr_with_wav2vec.yaml",
    data_folder="/path/to/cv-corpus/fr",
    data="your CommonVoice language folder",
    drop_last=False,
    order="the script still turns shuffle off for sorting ascending or descending",
    validation="Its validation and test loaders keep test_dataloader_options",
    modules="wav2vec2, enc, ctc_lin",
    optimizers=(
        ("wav2vec_opt_class", "!name:torch.optim.Adam {lr: !ref <lr_wav2vec>", _BOTH_KERNELS),
        ("model_opt_class", "!name:torch.optim.Adadelta {lr: !ref <lr>, rho: 0.95, eps: 1.e-8", ("foreach",)),
    ),
)
_RECIPES = {"ecapa-tdnn": _ECAPA_RECIPE, "ecapa-tdnn-512": _ECAPA_RECIPE, "wav2vec2-ctc": _WAV2VEC2_RECIPE}
_ECAPA_CHANNELS = {"ecapa-tdnn-512": 512}


@register("speechbrain")
def export_speechbrain(context: ExportContext) -> Export:
    recipe = _RECIPES.get(context.model_name)
    if recipe is None:
        return unsupported("speechbrain", context, _unsupported_reason(context))
    config = context.config
    extras = context.loader_extras()
    values = {
        name: _scalar(getattr(config, name))
        for name in LOADER_OPTIONS
        if name in ("per_device_batch_size", "num_workers", "pin_memory") or name in extras
    }
    override = loader_override(values)
    if "in_order" in extras:
        override = override[:-1] + f", in_order: {_scalar(extras['in_order'])}}}"
    if recipe.drop_last:
        override = override[:-1] + ", drop_last: true}"
    words = [
        f"{recipe.script} {recipe.hparams} --data_folder {recipe.data_folder}",
        f"--dataloader_options {shlex.quote(override)}",
    ]
    words += _optimizer_words(recipe, config.optimizer_impl)
    if context.model_name == "wav2vec2-ctc":
        words += _wav2vec2_option_words(context)
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
    notes = _notes(context, recipe) + tuple(filter(None, [context.multinode_note()]))
    return Export(target="speechbrain", command=command, notes=notes)


def _optimizer_words(recipe: _Recipe, implementation: str) -> list[str]:
    """The recipe's optimizer keys that take the tuned implementation's flag, each with the recipe's arguments."""
    words = []
    for key, opening, takes_flag in recipe.optimizers:
        if implementation in takes_flag:
            words.append(f"--{key} {shlex.quote(f'{opening}, {implementation}: true}}')}")
    return words


# The wav2vec2-ctc workload's options that are the recipe's hparams keys, with the recipe's values.
_WAV2VEC2_HPARAMS = {"sorting": ("sorting", "ascending"), "max_duration_s": ("avoid_if_longer_than", 10.0)}
_WAV2VEC2_HPARAMS |= {"lr": ("lr", 1.0), "lr_wav2vec": ("lr_wav2vec", 0.0001)}


def _wav2vec2_option_words(context: ExportContext) -> list[str]:
    """The measured workload options that differ from the recipe's, as overrides of its hparams keys."""
    options = context.tuned.workload.get("options") or {}
    return [
        f"--{key} {options[name]}"
        for name, (key, recipe) in _WAV2VEC2_HPARAMS.items()
        if options.get(name, recipe) != recipe
    ]


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


def _scalar(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _precision_flag(context: ExportContext) -> str | None:
    """SpeechBrain's --precision for the measured one; None keeps the recipe's fp32."""
    precision = context.precision
    if precision in ("bf16", "fp16") and not (precision == "fp16" and not context.on_cuda):
        return PRECISION_WORDS[precision]
    return None


def _tf32_env(context: ExportContext) -> str:
    if not context.on_cuda or context.precision not in ("fp32", TORCH_DEFAULT_FP32):
        return ""
    return _QUIRK_OFF + " " + (TF32_OFF_ENV + " " if context.precision == "fp32" else "")


def _notes(context: ExportContext, recipe: _Recipe) -> tuple[str, ...]:
    config = context.config
    notes = [
        f"Run from SpeechBrain's {recipe.folder} with --data_folder set to {recipe.data} (the recipe's !PLACEHOLDER)",
        f"--dataloader_options is merged into the recipe's dataloader_options ({recipe.order}); batch_size "
        f"{config.per_device_batch_size} is per process (each DDP process loads its own batches): global batch "
        f"{context.global_batch_size} with {context.world_size} process(es) and grad_accumulation_factor "
        f"{config.grad_accum_steps}. {recipe.validation}",
    ]
    if context.model_name in _ECAPA_CHANNELS:
        notes.append(
            f"ECAPA-TDNN with C={_ECAPA_CHANNELS[context.model_name]}: set embedding_model's channels to [512, 512, "
            "512, 512, 1536] in hparams/train_ecapa_tdnn.yaml (the recipe trains C=1024)"
        )
    if context.model_name == "wav2vec2-ctc":
        notes += _wav2vec2_notes(context)
    if context.max_frames_in_batch is not None:
        notes.append("max_frames_in_batch does not apply to this recipe's fixed-length crops: not exported")
    return tuple(notes)


def _wav2vec2_notes(context: ExportContext) -> list[str]:
    options = context.tuned.workload.get("options") or {}
    notes = []
    if options.get("size") == "reduced":
        notes.append(
            "The result measured the reduced wav2vec2 (option size=reduced); the command trains the recipe's "
            "LeBenchmark wav2vec2-FR-7K-large, whose speed with these values was not measured: rerun autotune with "
            "the full size on the training machine before relying on its batch size"
        )
    if options.get("wav_augment") is False:
        notes.append(
            "Measured without wav_augment (option wav_augment=false): remove wav_augment from the recipe's yaml to "
            "train as measured (compute_forward augments whenever the key exists)"
        )
    if context.config.optimizer_impl == "fused":
        notes.append(
            "fused reaches wav2vec_opt_class (Adam) only: torch has no fused Adadelta, so model_opt_class keeps the "
            "recipe's, as was measured"
        )
    return notes


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
    modules = _RECIPES.get(context.model_name, _ECAPA_RECIPE).modules
    notes = [
        f"--compile compiles every module in the recipe's `modules` ({modules}) with torch.compile; the trials "
        "compiled the network and its loss head"
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
            "--opt_class, or --wav2vec_opt_class and --model_opt_class (the recipe's optimizers with the flag)",
            notes=optimizer_note(
                "the recipe's optimizer keys (--opt_class; for wav2vec2 CTC --wav2vec_opt_class and "
                "--model_opt_class), each the recipe's !name:torch.optim class and arguments plus the flag"
            ),
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


def recipe_command(template: str, *, cwd: str = ".") -> tuple[TrainingCommand, list[str]]:
    """`--recipe speechbrain`: the user's SpeechBrain command with the tuned values as SpeechBrain's own overrides
    (the loader options mapping of LOADER_OPTIONS, --precision from PRECISION_WORDS), and the recipe's values today
    as the baseline (its hparams' loader options, --precision fp32). Each problem is one line, before any trial.

    Raises:
        UserError: SpeechBrain is not installed; the command names no hparams file, or one that cannot be read or
            has no loader options; the command already sets what autotune tunes; it overrides a key the hparams
            file does not have.
    """
    words = command_words("speechbrain", template, package="speechbrain", install="speechbrain")
    hparams_name = next((word for word in words if word.endswith((".yaml", ".yml"))), None)
    if hparams_name is None:
        raise UserError(
            "--recipe speechbrain: the command names no hparams file; write it as you run the recipe, e.g. "
            "'python train.py hparams/train.yaml --data_folder data'"
        )
    hparams = _read_hparams(Path(cwd) / hparams_name, hparams_name)
    key = next((name for name in LOADER_KEYS if isinstance(hparams.get(name), dict)), None)
    if key is None:
        raise UserError(
            f"--recipe speechbrain: {hparams_name} has no loader options ({' or '.join(LOADER_KEYS)}): autotune "
            "tunes the DataLoader through them"
        )
    _check_overrides(words, hparams, hparams_name, key)
    mapping = loader_override({name: "{" + name + "}" for name in LOADER_OPTIONS})
    override = "{{" + mapping[1:-1] + "}}"  # the mapping's own braces are literal in the template, its values fill
    full = f"{template} --{key} {shlex.quote(override)} --precision {{precision}}"
    command = TrainingCommand.checked(
        full,
        cwd=cwd,
        recipe="speechbrain",
        words={"precision": dict(PRECISION_WORDS)},
        unset=dict(UNSET),
        precisions={device: tuple(names) for device, names in PRECISIONS.items()},
    )
    return command, _baseline(hparams, hparams[key])


class _TagsAsText(yaml.SafeLoader):
    """HyperPyYAML read without building anything: a tagged node is its text (`!ref <batch_size>` is
    "<batch_size>"), so that the loader options and the top-level keys can be read."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_TagsAsText.add_multi_constructor("!", _tagged)


def _read_hparams(path: Path, name: str) -> dict[str, Any]:
    return read_mapping("speechbrain", path, name, what="hparams", loader=_TagsAsText)


def _run_options() -> set[str]:
    """SpeechBrain's run options (--device, --precision...), read from its run_opts.py without importing it (the
    import applies its quirks to this process); empty where the file is not where it was (then nothing is refused)."""
    spec = importlib.util.find_spec("speechbrain")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        try:
            tree = ast.parse((Path(folder) / "utils" / "run_opts.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "HELP_TEXTS" for t in node.targets):
                value = ast.literal_eval(node.value)
                return {*value, "jit_module_keys", "compile_module_keys"}
    return set()


def _check_overrides(words: list[str], hparams: dict[str, Any], name: str, key: str) -> None:
    """The command's own `--key value` overrides: none of what autotune sets, each a key the hparams file has (or
    a run option): an override SpeechBrain would add silently is a value the recipe never reads."""
    options = _run_options()
    for word in words:
        if not word.startswith("--") or len(word) == 2:
            continue
        given = word[2:].split("=", 1)[0]
        if given in (key, "precision"):
            raise UserError(
                f"--recipe speechbrain: the command sets --{given} itself; leave it out: autotune sets it per trial "
                f"(your values today are read from {name})"
            )
        if options and given not in options and given not in hparams:
            keys = ", ".join(sorted(k for k in hparams if not k.startswith("__")))
            raise UserError(f"--recipe speechbrain: --{given} is not a key of {name} (its keys: {keys})")


def _baseline(hparams: dict[str, Any], loader: dict[str, Any]) -> list[str]:
    """The recipe's values today, as --baseline items: its loader options, a `!ref <key>` read from the top level."""
    items = []
    for knob, option in LOADER_OPTIONS.items():
        value = loader.get(option)
        if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
            value = hparams.get(value[1:-1])
        if isinstance(value, (bool, int)) and value is not None:
            items.append(f"{knob}={str(value).lower() if isinstance(value, bool) else value}")
    return items
