"""3D-Speaker (speakerlab): one self-contained torchrun command, with the tuned values as top-level overrides.

speakerlab/bin/train.py (modelscope/3D-Speaker 09e7806, the same file as PyPI speakerlab 0.0.6) passes every
unknown `--key value` to speakerlab/utils/config.py, which turns them into YAML and replaces the recipe's top-level
keys with them. The recipe YAML's `data`, `noise`, `reverb` and `exp_dir` are empty (run.sh passes them), so the
command carries them too: without exp_dir, build_config calls os.makedirs(None), and with no override at all it loads
an empty string. The YAML's batch_size is GLOBAL: train.py gives each process batch_size / world_size. A whole
`dataloader` block can be passed the same way (a YAML flow mapping), which is how prefetch_factor and
persistent_workers reach the recipe's DataLoader without editing its config.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UserError
from autotune.exports import recipe_input
from autotune.exports.base import (
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
    compile_note,
    feature_note,
    optimizer_note,
    preload_note,
    unordered_note,
)
from autotune.exports.recipe_input import command_words, read_mapping
from autotune.probe.command import TrainingCommand

_AUTOCAST = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
# run.sh's own paths (egs/voxceleb/sv-*/run.sh: data=data, exp=exp): the command runs from the recipe's folder.
_DATA_ARGS = ("--data", "data/vox2_dev/train.csv", "--noise", "data/musan/wav.scp", "--reverb", "data/rirs/wav.scp")
# The recipe's dataloader block (conf/*.yaml): what the tuned loader must keep.
_RECIPE_LOADER = {"pin_memory": True, "drop_last": True}
# The recipes' optimizer block (conf/cam++.yaml, eres2net.yaml, ecapa_tdnn.yaml: the same SGD in each); an override
# replaces a top-level key whole, so the tuned implementation's flag is passed with the rest of the block.
# cam++.yaml's embedding_model block (egs/voxceleb/sv-cam++/conf/cam++.yaml at 09e7806): the recipe's own references.
_CAMPPLUS = "speakerlab.models.campplus.DTDNN.CAMPPlus"
_RECIPE_CAMPPLUS_ARGS = {"feat_dim": "<fbank_dim>", "embedding_size": "<embedding_size>"}
_RECIPE_OPTIMIZER = {"params": None, "lr": "<lr>", "momentum": 0.9, "nesterov": True, "weight_decay": 0.0001}


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """Where a workload's 3D-Speaker recipe lives, and the top-level overrides that select its variant."""

    folder: str  # under egs/voxceleb
    config: str
    exp_dir: str
    overrides: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


RECIPES = {
    "cam++": Recipe(folder="sv-cam++", config="conf/cam++.yaml", exp_dir="exp/cam++"),
    "eres2net": Recipe(folder="sv-eres2net", config="conf/eres2net.yaml", exp_dir="exp/eres2net"),
    # The recipe's own comment: "if you use eres2net-large, you can change m_channels from 32 to 64".
    "eres2net-large": Recipe(
        folder="sv-eres2net", config="conf/eres2net.yaml", exp_dir="exp/eres2net_large", overrides={"m_channels": 64}
    ),
    "ecapa-tdnn": Recipe(folder="sv-ecapa", config="conf/ecapa_tdnn.yaml", exp_dir="exp/ecapa_tdnn"),
    "ecapa-tdnn-512": Recipe(
        folder="sv-ecapa",
        config="conf/ecapa_tdnn.yaml",
        exp_dir="exp/ecapa_tdnn_512",
        note="ECAPA-TDNN with C=512 has no recipe of its own: its channels are not a top-level key (they sit in "
        "embedding_model.args.channels), so set them to [512, 512, 512, 512, 1536] in conf/ecapa_tdnn.yaml",
    ),
}


@register("3d-speaker")
def export_3d_speaker(context: ExportContext) -> Export:
    recipe = RECIPES.get(context.model_name)
    if recipe is None:
        return unsupported(
            "3d-speaker",
            context,
            "3D-Speaker's training recipes are speaker-embedding models (CAM++, ERes2Net, "
            "ECAPA-TDNN); it has no recipe for this model's task",
        )
    config = context.config
    # train.py picks args.gpu[LOCAL_RANK]: the list is one node's GPUs (several nodes: torchrun on each, under srun)
    gpus = " ".join(str(index) for index in range(context.devices_per_node))
    launcher = context.multinode_torchrun() if context.nodes > 1 else f"torchrun --nproc_per_node={context.world_size}"
    words = [
        f"{launcher} speakerlab/bin/train.py --config {recipe.config} --gpu {gpus}",
        " ".join(_DATA_ARGS) + f" --exp_dir {recipe.exp_dir}",
        f"--batch_size {context.step_batch_size} --num_workers {config.num_workers}",
    ]
    words += [f"--{key} {value}" for key, value in recipe.overrides.items()]
    loader = _dataloader_override(context)
    if loader is not None:
        words.append(f"--dataloader {shlex.quote(loader)}")
    optimizer = _optimizer_override(context)
    if optimizer is not None:
        words.append(f"--optimizer {shlex.quote(optimizer)}")
    embedding_model = _embedding_model_override(context)
    if embedding_model is not None:
        words.append(f"--embedding_model {shlex.quote(embedding_model)}")
    command = context.env_prefix() + context.tf32_env() + " \\\n    ".join(words)
    notes = _notes(context, recipe, loader is not None) + _multinode_notes(context)
    return Export(target="3d-speaker", command=command, notes=notes)


def _multinode_notes(context: ExportContext) -> tuple[str, ...]:
    said = context.multinode_note()
    if said is None:
        return ()
    return (
        said,
        "3D-Speaker's train.py takes LOCAL_RANK for its rank (speakerlab/bin/train.py): on every node local rank 0 "
        "writes the log and checkpoints into --exp_dir, so give each node its own exp_dir or keep only the first "
        "node's",
    )


def dataloader_block(values: dict[str, str]) -> str:
    """The recipe's dataloader block as the YAML flow mapping one `--dataloader` override carries: its own
    <dataset>, <batch_size> and <num_workers> references, drop_last, and the given DataLoader arguments (written
    values: the export's, or a trial's placeholders)."""
    args = {"dataset": "<dataset>", "batch_size": "<batch_size>", "num_workers": "<num_workers>"}
    args |= {"pin_memory": values["pin_memory"], "drop_last": "true"}
    args |= {key: text for key, text in values.items() if key != "pin_memory"}
    return "{obj: torch.utils.data.DataLoader, args: {" + ", ".join(f"{k}: {v}" for k, v in args.items()) + "}}"


def _dataloader_override(context: ExportContext) -> str | None:
    """The recipe's dataloader block with the tuned extras, as the YAML flow mapping one override carries; None when
    the recipe's own block already says what was measured."""
    config = context.config
    tuned = {"pin_memory": config.pin_memory, "drop_last": True, **context.loader_extras()}
    if tuned == _RECIPE_LOADER:
        return None
    return dataloader_block({key: _yaml_scalar(value) for key, value in tuned.items() if key != "drop_last"})


def _optimizer_override(context: ExportContext) -> str | None:
    """The recipe's optimizer block with the tuned implementation's flag (speakerlab/bin/train.py fills its params and
    builds it: build('optimizer', config)); None for `default`, which is the recipe's block."""
    flag = context.optimizer_flag()
    if not flag:
        return None
    body = ", ".join(f"{key}: {_yaml_scalar(value)}" for key, value in {**_RECIPE_OPTIMIZER, **flag}.items())
    return "{obj: torch.optim.SGD, args: {" + body + "}}"


def _embedding_model_override(context: ExportContext) -> str | None:
    """CAM++'s embedding_model block with memory_efficient false, where checkpointing was tuned off; None where it
    runs as the recipe (memory_efficient is DTDNN.CAMPPlus's default, True, which cam++.yaml does not override)."""
    if context.model_name != "cam++" or context.config.activation_checkpointing is not False:
        return None
    args = {**_RECIPE_CAMPPLUS_ARGS, "memory_efficient": False}
    body = ", ".join(f"{key}: {_yaml_scalar(value)}" for key, value in args.items())
    return "{obj: " + _CAMPPLUS + ", args: {" + body + "}}"


def _checkpointing_notes(context: ExportContext) -> list[str]:
    value = context.config.activation_checkpointing
    if value is None:
        return []
    if context.model_name == "cam++":
        if value:
            return []  # the recipe's own memory_efficient
        return [
            "activation_checkpointing off: --embedding_model replaces the recipe's CAM++ block with the same one plus "
            "memory_efficient: false (DTDNN.CAMPPlus then keeps every dense layer's bottleneck input for backward: "
            "faster steps, more memory per sample, as measured)"
        ]
    return [
        f"activation_checkpointing was tuned for {context.model_name}, which 3D-Speaker builds without a switch for it"
    ]


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _notes(context: ExportContext, recipe: Recipe, loader_override: bool) -> tuple[str, ...]:
    config = context.config
    notes = [
        f"Run from 3D-Speaker's egs/voxceleb/{recipe.folder} (after run.sh's stages 1-2): the data, noise, reverb and "
        "exp_dir paths are run.sh's defaults, replace them with yours",
        f"batch_size {context.step_batch_size} is the global batch: train.py gives each of the {context.world_size} "
        f"processes batch_size / {context.world_size} = {config.per_device_batch_size} (the tuned per-device batch)",
    ]
    if loader_override:
        notes.append(
            "--dataloader replaces the recipe's dataloader block with the same one plus the tuned "
            "pin_memory/prefetch_factor/persistent_workers (its <dataset>, <batch_size> and <num_workers> references "
            "are the recipe's own)"
        )
    if recipe.note:
        notes.append(recipe.note)
    notes.append(
        "The recipe's WavReader needs torch and torchaudio 2.8 or older: torchaudio 2.9 removed sox_effects (its "
        "speed perturbation) and reads files through torchcodec; on a newer stack add --speed_pertub False and pip "
        "install torchcodec (`autotune run --recipe 3d-speaker` checks this before any trial)"
    )
    if not context.on_cuda:
        notes.append("speakerlab/bin/train.py needs CUDA (nccl, torch.cuda.set_device); it cannot train on a CPU")
    return tuple(notes)


def _accumulation_notes(context: ExportContext) -> list[str]:
    config = context.config
    if config.grad_accum_steps == 1:
        return []
    return [
        f"3D-Speaker has no gradient accumulation: the tuned effective batch {context.global_batch_size} "
        f"(grad_accum_steps={config.grad_accum_steps}) needs an accumulation loop in train(); raising batch_size "
        f"to {context.global_batch_size} instead would put {config.per_device_batch_size * config.grad_accum_steps}"
        " samples on each GPU, which was not measured and may not fit in memory"
    ]


def _cudnn_notes(context: ExportContext) -> list[str]:
    if context.config.cudnn_benchmark:
        return []
    return [
        "The tuned run had cudnn.benchmark off, but train.py sets cudnn.benchmark = True unconditionally: delete "
        "that line to match"
    ]


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if precision not in _AUTOCAST:
        env_note = context.tf32_env_note("3D-Speaker")
        return [env_note] if env_note else []
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


_LOADER_BLOCK = takes("the --dataloader block (a YAML flow mapping replacing the recipe's)")
KNOB_TABLE = knob_table(
    "3d-speaker",
    {
        "per_device_batch_size": takes("--batch_size, the global batch (train.py divides it by the world size)"),
        "num_workers": takes("--num_workers"),
        "prefetch_factor": _LOADER_BLOCK,
        "pin_memory": _LOADER_BLOCK,
        "persistent_workers": _LOADER_BLOCK,
        "in_order": takes(_LOADER_BLOCK.how, notes=unordered_note("3D-Speaker", carried=True)),
        "precision": takes("TF32 through the command's environment; AMP is a code change", notes=_precision_notes),
        "optimizer_impl": takes(
            "the --optimizer block (the recipe's SGD with the flag)",
            notes=optimizer_note("--optimizer, the recipe's SGD block plus the flag (train.py builds it)"),
        ),
        "activation_checkpointing": takes(
            "CAM++'s --embedding_model block (memory_efficient, DTDNN.CAMPPlus's switch)", notes=_checkpointing_notes
        ),
        "intra_op_threads": THREADS,
        "cudnn_benchmark": cannot(_cudnn_notes),
        "world_size": takes("torchrun --nproc_per_node and --gpu"),
        "grad_accum_steps": cannot(_accumulation_notes),
        "preload_audio": cannot(preload_note("3D-Speaker")),
        "feature_device": cannot(
            feature_note(
                "3D-Speaker",
                "workers",
                "in its dataset, per item (speakerlab/dataset/dataset.py WavSVDataset.__getitem__ calls the recipe's "
                "feature_extractor, processor.FBank), so in the DataLoader workers, and train.py has no option to move "
                "it",
                "to train as measured, have the dataset return the waveform and compute the fbank of each batch after "
                "x.cuda() in train() (autotune.data.features.batched_fbank gives FBank's features); as exported, its "
                "workers do the work the tuned run took off them",
            )
        ),
        "compile": cannot(
            compile_note(
                "3D-Speaker",
                "speakerlab/bin/train.py, after build('embedding_model', config) and build('classifier', config)",
            )
        ),
    },
)


# The one mapping, used both ways (the export above, and a `--recipe 3d-speaker` trial's overrides:
# exports/recipes.py): train.py's top-level keys for the batch (GLOBAL: train.py gives each process
# batch_size / world_size) and the workers, the dataloader block for the rest, null/false for what a configuration
# without workers leaves unset (torch's DataLoader refuses a prefetch_factor without workers).
TRAINER_OPTIONS = {"per_device_batch_size": "batch_size", "num_workers": "num_workers"}
LOADER_BLOCK = ("pin_memory", "prefetch_factor", "persistent_workers")
UNSET = {"prefetch_factor": "null", "persistent_workers": "false"}


def recipe_command(template: str, *, cwd: str = ".") -> tuple[TrainingCommand, list[str]]:
    """`--recipe 3d-speaker`: the user's `torchrun ... speakerlab/bin/train.py --config conf/X.yaml ...` with the
    tuned values as train.py's own overrides (build_config replaces top-level keys), and the recipe's values today as
    the baseline (its batch_size per process, its num_workers, its dataloader block's pin_memory). No precision
    knob: train.py has no AMP (the export says so), and its TF32 only moves through an environment variable.

    Raises:
        UserError: speakerlab is not installed; the command does not run speakerlab's train.py, names no readable
            --config, or sets what autotune sets itself.
    """
    words = command_words("3d-speaker", template, package="speakerlab", install="speakerlab")
    runs = [i for i, word in enumerate(words) if word.endswith("speakerlab/bin/train.py")]
    runs += [i + 1 for i, word in enumerate(words[:-1]) if word == "-m" and words[i + 1] == "speakerlab.bin.train"]
    if not runs:
        raise UserError(
            "--recipe 3d-speaker: the command does not run speakerlab/bin/train.py; give it as run.sh does, e.g. "
            "'torchrun --nproc_per_node=2 speakerlab/bin/train.py --config conf/cam++.yaml --gpu 0 1 ...'"
        )
    arguments = words[runs[0] + 1 :]
    config_name = _option(arguments, "--config")
    if not config_name:
        raise UserError("--recipe 3d-speaker: the command names no --config (conf/cam++.yaml, as run.sh passes it)")
    config = _read_config(Path(cwd) / config_name, config_name)
    check_audio_stack(config, arguments, config_name)
    for given in ("--batch_size", "--num_workers", "--dataloader"):
        if _option(arguments, given) is not None:
            raise UserError(
                f"--recipe 3d-speaker: the command sets {given} itself; leave it out: autotune sets it per trial (your "
                f"values today are read from {config_name})"
            )
    ranks = int(_option(words[: runs[0]], "--nproc_per_node") or 1)
    # The block's own braces are literal in the template, each value's placeholder fills: escape around markers.
    block = dataloader_block({name: f"\0{name}\1" for name in LOADER_BLOCK}).replace("{", "{{").replace("}", "}}")
    for name in LOADER_BLOCK:
        block = block.replace(f"\0{name}\1", "{" + name + "}")
    knobs = "--batch_size {per_device_batch_size} --num_workers {num_workers}"
    full = f"{template} {knobs} --dataloader {shlex.quote(block)}"
    command = TrainingCommand.checked(
        full, cwd=cwd, recipe="3d-speaker", unset=dict(UNSET), scale={"per_device_batch_size": ranks}
    )
    return command, _baseline(config, ranks)


# The recipes' audio reader (conf/*.yaml wav_reader at 09e7806): torchaudio.load per file, and with speed_pertub its
# speed perturbation through torchaudio.sox_effects (speakerlab/process/processor.py WavReader.__call__).
_RECIPE_WAV_READER = "speakerlab.process.processor.WavReader"


def check_audio_stack(config: dict[str, Any], arguments: list[str], config_name: str) -> None:
    """Refuse, before any trial, a recipe whose audio reader cannot run on this environment's torchaudio: torchaudio
    2.9 removed sox_effects (the reader's speed perturbation) and reads files through torchcodec, so every item would
    fail in the DataLoader's workers at the first batch, on every rank.

    Raises:
        UserError: the recipe's reader speed-perturbs without torchaudio.sox_effects, or torchaudio.load cannot read
            a WAV file here.
    """
    reader = config.get("wav_reader")
    if not isinstance(reader, dict) or reader.get("obj") != _RECIPE_WAV_READER:
        return  # a reader of the user's own: what it needs is theirs to know
    sox_effects, load_error = recipe_input.audio_stack()
    given = _option(arguments, "--speed_pertub")
    perturbs = yaml.safe_load(given) if given is not None else config.get("speed_pertub")
    if perturbs is True and not sox_effects:
        where = "--speed_pertub" if given is not None else f"speed_pertub: True in {config_name}"
        raise UserError(
            f"--recipe 3d-speaker: speakerlab's WavReader speed-perturbs through torchaudio.sox_effects ({where}), "
            f"which torchaudio {recipe_input.torchaudio_version()} no longer has (removed in 2.9): install torch and "
            "torchaudio 2.8 or older, or add --speed_pertub False to the command to train without it"
        )
    if load_error is not None:
        raise UserError(
            f"--recipe 3d-speaker: speakerlab's WavReader reads each file with torchaudio.load, which fails here "
            f"({load_error}): pip install torchcodec (the build for your torch), or torch and torchaudio 2.8 or older"
        )


def _option(words: list[str], name: str) -> str | None:
    """The value of `--name value` or `--name=value` among words; None where it is not given."""
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            return words[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _read_config(path: Path, name: str) -> dict[str, Any]:
    document = read_mapping("3d-speaker", path, name, what="training settings")
    missing = [key for key in ("batch_size", "num_workers", "dataloader") if key not in document]
    if missing:
        raise UserError(
            f"--recipe 3d-speaker: {name} has no {', '.join(missing)}: it is not a speakerlab training config"
        )
    return document


def _baseline(config: dict[str, Any], ranks: int) -> list[str]:
    items = []
    if isinstance(config.get("batch_size"), int):
        items.append(f"per_device_batch_size={max(1, config['batch_size'] // ranks)}")
    if isinstance(config.get("num_workers"), int):
        items.append(f"num_workers={config['num_workers']}")
    pin = ((config.get("dataloader") or {}).get("args") or {}).get("pin_memory")
    if isinstance(pin, bool):
        items.append(f"pin_memory={str(pin).lower()}")
    return items
