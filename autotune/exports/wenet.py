"""WeNet: the aishell conformer recipe's torchrun command, with the tuned values as its flags and config overrides.

Argument names, defaults and the DataLoader construction follow wenet/bin/train.py and wenet/utils/train_utils.py
(wenet-e2e/wenet 0154699; recorded in tests/data/wenet_train_args.json): --num_workers, --pin_memory, --prefetch,
--use_amp, --device, --ddp.dist_backend, --override_config "key.path value" (the key must exist in the config; the
value is converted to its type). The DataLoader is DataLoader(batch_size=None, persistent_workers=True,
prefetch_factor=--prefetch): torch rejects that with 0 workers. dataset_conf.batch_conf is PER GPU (data is sharded
by rank); examples/aishell/s0/conf/train_conformer.yaml has a static batch_size 16 and accum_grad 4.

`--recipe wenet` runs the user's own `torchrun ... wenet/bin/train.py ...` (run.sh's stage 4) with the same
arguments this export writes (LOADER_FLAGS, FLAG_WORDS, BATCH_KEY). Knobs WeNet cannot take without a code change
are not searched there: persistent_workers is True in both DataLoaders (wenet/utils/train_utils.py:397), which also
pass no in_order; train.py has no flag for cudnn.benchmark nor for threads; its DDP autocast is
torch.cuda.amp.autocast(enabled=scaler is not None) (train_utils.py:693), float16 on CUDA only, so a CPU trains fp32.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune import yamlio
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
    cudnn_benchmark_note,
    feature_note,
    optimizer_note,
    preload_note,
    unordered_note,
)
from autotune.exports.recipe_input import read_mapping
from autotune.knobs.declarations import TORCH_DEFAULTS
from autotune.knobs.precision import PRECISIONS, TORCH_DEFAULT_FP32
from autotune.probe.command import TrainingCommand, fill_value

# What an unset prefetch_factor measured (torch's default); WeNet's own --prefetch default is 100.
_TORCH_DEFAULT_PREFETCH = TORCH_DEFAULTS["prefetch_factor"]
RECIPE_CONFIG = "conf/train_conformer.yaml"
MODEL_DIR = "exp/conformer"  # run.sh: dir=exp/conformer
# conf/train_conformer.yaml's optim_conf (optim: adam); init_optimizer_and_scheduler passes it whole to
# optim.Adam(params, **optim_conf) (wenet/utils/train_utils.py).
RECIPE_OPTIM_CONF = {"lr": 0.002}

# The one mapping, used both ways (the export's command, and a `--recipe wenet` trial's arguments: exports/recipes.py):
# each knob as train.py's own argument (wenet/utils/train_utils.py add_dataset_args, add_ddp_args) or the config key
# --override_config replaces. --pin_memory and --use_amp are store_true flags: given for one value, left out ("")
# for the others; --use_amp is WeNet's only precision under DDP (fp16 autocast with a GradScaler, on CUDA).
LOADER_FLAGS = {"num_workers": "--num_workers", "prefetch_factor": "--prefetch"}
BATCH_KEY = "dataset_conf.batch_conf.batch_size"  # per GPU: WeNet shards its data by rank
FLAG_WORDS = {
    "pin_memory": {"true": "--pin_memory", "false": ""},
    "precision": {name: "--use_amp" if name == "fp16" else "" for name in PRECISIONS},
}
PRECISION_CHOICES = {"cpu": ("fp32",), "cuda": (TORCH_DEFAULT_FP32, "fp16")}  # a CPU has no TF32: its fp32 is strict
# Its DataLoaders pass persistent_workers=True and prefetch_factor=--prefetch (train_utils.py:393-406), which torch
# rejects without workers.
LEAST = {"num_workers": 1}


@register("wenet")
def export_wenet(context: ExportContext) -> Export:
    if context.model_name != "conformer":
        return unsupported(
            "wenet",
            context,
            "WeNet trains ASR models; its recipe for what autotune measures is the aishell "
            "conformer (autotune's `conformer` workload)",
        )
    frames = context.max_frames_in_batch
    edits: dict[str, Any] = {}
    if frames is not None:  # batch_conf has no max_frames_in_batch key to override: the config needs editing
        edits["dataset_conf"] = {"batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": frames}}
    if (plan := context.bucket_plan) is not None:  # dataset.py's batch_type bucket: both lists, per GPU
        bucket = {"bucket_boundaries": list(plan.boundaries), "bucket_batch_sizes": list(plan.batch_sizes)}
        edits["dataset_conf"] = {"batch_conf": {"batch_type": "bucket", **bucket}}
    if context.optimizer_flag():  # neither has optim_conf a fused/foreach key to override
        edits["optim_conf"] = {**RECIPE_OPTIM_CONF, **context.optimizer_flag()}
    if context.config.activation_checkpointing:  # the recipe sets no gradient_checkpointing key (False by default)
        edits["encoder_conf"] = {"gradient_checkpointing": True}
        edits["decoder_conf"] = {"gradient_checkpointing": True}
    yaml_text = yamlio.dump_yaml(edits) if edits else None
    notes = _notes(context) + tuple(filter(None, [context.multinode_note()]))
    return Export(target="wenet", yaml_text=yaml_text, command=_command(context), notes=notes)


def runnable_workers(context: ExportContext) -> int:
    """WeNet's loader cannot run without workers: 1 is the nearest that runs."""
    return max(1, context.config.num_workers)


def _command(context: ExportContext) -> str:
    config = context.config
    backend = "nccl" if context.on_cuda else "gloo"
    flags = [
        "--train_engine torch_ddp",
        f"--config {RECIPE_CONFIG}",
        "--data_type raw",
        "--train_data data/train/data.list",
        "--cv_data data/dev/data.list",
        f"--model_dir {MODEL_DIR}",
        "--tensorboard_dir tensorboard",
        f"--ddp.dist_backend {backend}",
    ]
    if not context.on_cuda:
        flags.append("--device cpu")
    workers = runnable_workers(context)
    prefetch = config.prefetch_factor if config.num_workers > 0 and config.prefetch_factor else _TORCH_DEFAULT_PREFETCH
    flags += [f"{LOADER_FLAGS['num_workers']} {workers}", f"{LOADER_FLAGS['prefetch_factor']} {prefetch}"]
    pinned = FLAG_WORDS["pin_memory"][fill_value("pin_memory", bool(config.pin_memory))]
    amp = FLAG_WORDS["precision"].get(context.precision, "") if context.on_cuda else ""
    flags += [flag for flag in (pinned, amp) if flag]
    if context.max_frames_in_batch is None and context.bucket_plan is None:
        flags.append(f'--override_config "{BATCH_KEY} {config.per_device_batch_size}"')
    flags.append(f'--override_config "accum_grad {config.grad_accum_steps}"')
    launcher = (
        context.multinode_torchrun()
        if context.nodes > 1
        else f"torchrun --standalone --nnodes=1 --nproc_per_node={context.world_size}"
    )
    return f"{context.env_prefix()}{context.tf32_env()}{launcher} wenet/bin/train.py \\\n    " + " \\\n    ".join(flags)


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    notes = [
        "Run from WeNet's examples/aishell/s0 after run.sh's data stages (data.list, dict, global_cmvn); the paths "
        "are run.sh's"
    ]
    plan = context.bucket_plan
    if plan is not None:
        notes.append(
            f"Bucket batches: an utterance below bucket_boundaries[i] fbank frames goes to bucket i, the rest to the "
            f"last; each bucket's batches hold its bucket_batch_sizes entry per GPU ({list(plan.batch_sizes)}). Merge "
            "the YAML into conf/train_conformer.yaml (--override_config cannot add keys). autotune bucketed each "
            "utterance by its length at the slowest speed perturbation (0.9) and shuffled whole batches; WeNet buckets "
            "the perturbed length in its sorted stream, so a few items land one bucket lower there"
        )
    elif context.max_frames_in_batch is not None:
        notes.append(
            f"max_frames_in_batch {context.max_frames_in_batch} is the fbank-frame budget of each GPU's batch (WeNet "
            "shards data by rank): merge the YAML into conf/train_conformer.yaml (its batch_conf has no "
            "max_frames_in_batch key, which --override_config cannot add)"
        )
    else:
        notes.append(
            f"batch_conf.batch_size {config.per_device_batch_size} is per GPU (WeNet shards data by rank): global "
            f"batch {context.global_batch_size} with {context.world_size} GPU(s) and accum_grad "
            f"{config.grad_accum_steps}"
        )
    notes.append(
        "WeNet keeps each epoch's last, short batch (no drop_last); the tuned loader dropped it: no measurable effect "
        "on throughput"
    )
    return tuple(notes)


def _workers_notes(context: ExportContext) -> list[str]:
    if context.config.num_workers > 0:
        return []
    return [
        "The tuned winner loaded data in the training process (0 workers), which WeNet cannot do: train.py builds "
        "its DataLoader with persistent_workers=True and prefetch_factor=--prefetch, which torch rejects at 0 "
        "workers. The command uses 1 worker with prefetch 2 (torch's default), the nearest that runs: not measured"
    ]


def _persistent_notes(context: ExportContext) -> list[str]:
    config = context.config
    if config.num_workers == 0 or config.persistent_workers:  # 0 workers: the workers' note says it all
        return []
    return ["WeNet always uses persistent workers; the tuned run used non-persistent ones"]


def _checkpointing_notes(context: ExportContext) -> list[str]:
    if not context.config.activation_checkpointing:
        return []  # off (or unset) is the aishell recipe's own
    return [
        "activation_checkpointing on: the YAML sets encoder_conf and decoder_conf gradient_checkpointing: true "
        "(wenet/models/transformer/encoder.py and decoder.py recompute every layer in backward, use_reentrant=False; "
        "the recipe has no such key, so override_config cannot add it); wrap_cuda_model then builds DDP with "
        "find_unused_parameters=False"
    ]


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if not context.on_cuda:
        if precision in ("bf16", "fp16"):
            return [
                f"{precision} was measured on the CPU, but WeNet's autocast is torch.cuda.amp (and its bf16 needs "
                "FSDP on a GPU): on a CPU the command trains fp32"
            ]
        return []
    if precision == "fp16":
        return ["--use_amp is WeNet's fp16 mixed precision (torch.cuda.amp autocast float16 with a GradScaler)"]
    if precision == "bf16":
        return [
            "bf16 cannot be expressed with WeNet's DDP engine (torch_ddp): --use_amp is float16 only and its autocast "
            "ignores --dtype, so the command trains fp32. WeNet's bf16 is FSDP: --train_engine torch_fsdp --dtype bf16 "
            "(--fsdp_sharding_strategy no_shard keeps every parameter on every GPU) wraps the model in FSDP with "
            "MixedPrecision(param_dtype, reduce_dtype, buffer_dtype all bfloat16): bf16 parameters in forward and "
            "backward, gradients all-reduced in bf16, plus bf16 autocast. That is not what was measured (bf16 autocast "
            "over fp32 parameters and fp32 gradient all-reduce under DDP); DeepSpeed with bf16 in ds_config is the "
            "other route"
        ]
    env_note = context.tf32_env_note("WeNet")
    return [env_note] if env_note else []


KNOB_TABLE = knob_table(
    "wenet",
    {
        "per_device_batch_size": takes('--override_config "dataset_conf.batch_conf.batch_size N" (per GPU)'),
        "num_workers": takes("--num_workers (at least 1)", notes=_workers_notes),
        "prefetch_factor": takes("--prefetch"),
        "pin_memory": takes("--pin_memory"),
        "persistent_workers": cannot(_persistent_notes),
        "in_order": cannot(
            unordered_note("WeNet (wenet/utils/train_utils.py init_dataset_and_dataloader)", carried=False)
        ),
        "precision": takes("--use_amp (fp16) and the TF32 environment", notes=_precision_notes),
        "optimizer_impl": takes(
            "optim_conf in the config (the YAML to merge): override_config cannot add a key",
            notes=optimizer_note("optim_conf, which init_optimizer_and_scheduler passes to optim.Adam"),
        ),
        "activation_checkpointing": takes(
            "encoder_conf/decoder_conf gradient_checkpointing in the config (the YAML to merge)",
            notes=_checkpointing_notes,
        ),
        "intra_op_threads": THREADS,
        "cudnn_benchmark": cannot(
            cudnn_benchmark_note("wenet/bin/train.py has no flag for it", "add torch.backends.cudnn.benchmark = True")
        ),
        "world_size": takes("torchrun --nproc_per_node"),
        "grad_accum_steps": takes('--override_config "accum_grad N"'),
        "preload_audio": cannot(preload_note("WeNet")),
        "feature_device": cannot(
            feature_note(
                "WeNet",
                "workers",
                "in its dataset pipeline (wenet/dataset/processor.py compute_fbank, run by the DataLoader workers) and "
                "has no option to move it",
                "to train as measured, take compute_fbank and spec_aug out of the processor chain in "
                "wenet/dataset/dataset.py (the workers then yield the resampled, speed-perturbed waveforms, padded) "
                "and compute both on each batch on the device in wenet/utils/train_utils.py batch_forward before "
                "model(...), each utterance's SpecAugment masks within its own frames "
                "(autotune.data.asr_features.device_features does this); as exported, its workers do the work the "
                "tuned run took off them",
            )
        ),
        "compile": cannot(
            compile_note(
                "WeNet (train.py has no such flag)",
                "wenet/bin/train.py, after init_model(args, configs) and trace_and_print_model(...), which scripts it",
            )
        ),
    },
)


TRAIN_SCRIPT = "wenet/bin/train.py"
_LAUNCHERS = ("torchrun", "torch.distributed.run")
_GIVEN = ("num_workers", "prefetch", "pin_memory", "use_amp")  # the command's own: the baseline, replaced per trial
_STORE_TRUE = ("pin_memory", "use_amp", "jit", "print_model", "fp16_grad_sync", "use_lora", "only_optimize_lora")
# What train.py's parser gives without the flag (add_dataset_args), where its file cannot be read.
_KNOWN_DEFAULTS = {"num_workers": 0, "prefetch": 100}
_IMPORT_TIMEOUT_S = 300.0


def recipe_command(template: str, *, cwd: str = ".") -> tuple[TrainingCommand, list[str]]:
    """`--recipe wenet`: the user's `torchrun ... wenet/bin/train.py ...` (as run.sh's stage 4 runs it, from the
    recipe folder with the checkout on PYTHONPATH) with the tuned values as train.py's own arguments (LOADER_FLAGS,
    FLAG_WORDS, --override_config BATCH_KEY), and the recipe's values today as the baseline: the command's own
    --num_workers, --prefetch, --pin_memory, --use_amp and batch override (taken out of it: each trial gives them)
    or else the config's batch_size and train.py's defaults. Each problem is one line, before any trial.

    Raises:
        UserError: the command does not run train.py under torchrun; train.py or its code does not import here; the
            config, a data file or the model folder is missing or WeNet would reject it; an --override_config key is
            not in the config.
    """
    try:
        words = shlex.split(template)
    except ValueError as error:
        raise UserError(f"--command cannot be split into words as a shell would: {error}") from None
    at = next((i for i, word in enumerate(words) if word.endswith(TRAIN_SCRIPT)), None)
    if at is None or not any(word.endswith(_LAUNCHERS) for word in words[:at]):
        raise UserError(
            f"--recipe wenet runs WeNet's {TRAIN_SCRIPT} under torchrun (train.py always starts a process group): "
            "give it as run.sh's stage 4 does, e.g. 'torchrun --standalone --nproc_per_node=1 wenet/bin/train.py "
            "--device cpu --ddp.dist_backend gloo --config conf/train_conformer.yaml ...'"
        )
    folder = Path(cwd)
    _check_imports(folder, words[at])
    options, overrides, kept = _arguments(words[at + 1 :])
    _check_engine(options)
    name = options.get("config")
    if not name:
        raise UserError("--recipe wenet: the command names no --config; autotune reads your values from its YAML")
    config = read_mapping("wenet", folder / name, f"--config {name}", what="training settings")
    _check_config(config, name, overrides)
    _check_paths(options, config, folder)
    literal = shlex.join([*words[: at + 1], *kept]).replace("{", "{{").replace("}", "}}")
    appended = " ".join(
        [
            *(f"{flag} {{{knob}}}" for knob, flag in LOADER_FLAGS.items()),
            *(f"{{{knob}}}" for knob in FLAG_WORDS),
            f"--override_config '{BATCH_KEY} {{per_device_batch_size}}'",
        ]
    )
    command = TrainingCommand.checked(
        f"{literal} {appended}",
        cwd=cwd,
        recipe="wenet",
        words={name: dict(words) for name, words in FLAG_WORDS.items()},
        precisions=dict(PRECISION_CHOICES),
        least=dict(LEAST),
    )
    defaults = _trainer_defaults(folder / words[at])
    batch = overrides.get(BATCH_KEY, config["dataset_conf"]["batch_conf"]["batch_size"])
    return command, _baseline(options, batch, defaults)


def _check_imports(folder: Path, script: str) -> None:
    """train.py's own imports, in this environment, from where the trials run it (torchrun puts the script's folder
    first on sys.path; the checkout comes from PYTHONPATH, as the recipe's path.sh sets it)."""
    path = folder / script
    if not path.is_file():
        raise UserError(
            f"--recipe wenet: {script} is not in {folder.resolve()}: run autotune from the recipe folder (WeNet's "
            "examples/aishell/s0 links wenet/ to the checkout's code)"
        )
    code = f"import sys; sys.path[0] = {str(path.parent)!r}; import wenet.bin.train as t; print(t.__file__)"
    try:
        ran = subprocess.run(
            [sys.executable, "-c", code],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=_IMPORT_TIMEOUT_S,
            env=os.environ.copy(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"--recipe wenet: importing {script} took over {_IMPORT_TIMEOUT_S:.0f} s") from None
    if ran.returncode != 0:
        lines = [line.strip() for line in ran.stderr.splitlines() if line.strip()]
        error = lines[-1] if lines else "no message"
        if "No module named 'wenet" in error:
            fix = "put the checkout on PYTHONPATH (examples/aishell/s0's path.sh puts ../../../ there)"
        elif error.startswith("ModuleNotFoundError"):
            fix = "install WeNet's requirements.txt in this environment (the trials run train.py in it)"
        else:
            fix = "this checkout's code does not run with this environment's packages (torch, torchaudio)"
        raise UserError(f"--recipe wenet: WeNet's train.py does not import here ({error}): {fix}")
    imported = Path(ran.stdout.strip().splitlines()[-1]).resolve()
    if imported != path.resolve():
        raise UserError(
            f"--recipe wenet: the wenet package imported here is {imported.parent.parent.parent}, not the checkout "
            f"{script} belongs to: put that checkout first on PYTHONPATH"
        )


def _arguments(words: list[str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """train.py's arguments: `--key value` (the last of each; "true" for a store_true flag), its --override_config
    items (key -> value) and the words left once those autotune gives per trial (_GIVEN, the batch override) are
    taken out."""
    options: dict[str, str] = {}
    overrides: dict[str, str] = {}
    kept: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        key, equals, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        takes_value = bool(key) and not equals and key not in _STORE_TRUE
        if takes_value:
            value = words[index + 1] if index + 1 < len(words) else ""
        step = 2 if takes_value else 1
        if key:
            options[key] = value if takes_value or equals else "true"
        if key == "override_config":
            parts = value.split()
            if len(parts) != 2:
                raise UserError(
                    f"--recipe wenet: --override_config {value!r} is not 'key.path value': WeNet skips it "
                    "(wenet/utils/config.py override_config)"
                )
            overrides[parts[0]] = parts[1]
        if key not in _GIVEN and not (key == "override_config" and value.split()[0] == BATCH_KEY):
            kept += words[index : index + step]
        index += step
    return options, overrides, kept


def _check_engine(options: dict[str, str]) -> None:
    engine = options.get("train_engine", "torch_ddp")
    if engine != "torch_ddp":
        raise UserError(
            f"--recipe wenet: --train_engine {engine} takes its precision (and DeepSpeed its batches) from elsewhere; "
            "autotune tunes WeNet's torch_ddp engine, the recipe's default: leave --train_engine out"
        )
    if options.get("device") == "cpu" and options.get("ddp.dist_backend", "nccl") == "nccl":
        raise UserError(
            "--recipe wenet: --device cpu with the nccl backend (train.py's default) cannot start: add "
            "--ddp.dist_backend gloo"
        )


def _check_config(config: dict[str, Any], name: str, overrides: dict[str, str]) -> None:
    """What WeNet would reject in the config and in the command's overrides, before it trains."""
    for key in overrides:
        node: Any = config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise UserError(
                    f"--recipe wenet: --override_config {key} is not a key of {name}: WeNet's override_config "
                    "replaces keys and never adds one (wenet/utils/config.py raises KeyError)"
                )
            node = node[part]
    found = config.get("dataset_conf")
    dataset: dict[str, Any] = found if isinstance(found, dict) else {}
    batch = dataset.get("batch_conf")
    if not isinstance(batch, dict) or "batch_size" not in batch:
        raise UserError(
            f"--recipe wenet: {name} has no dataset_conf.batch_conf.batch_size, which autotune replaces per trial "
            "(--override_config cannot add it)"
        )
    batch_type = overrides.get("dataset_conf.batch_conf.batch_type", batch.get("batch_type", "static"))
    if batch_type != "static":
        raise UserError(
            f"--recipe wenet: batch_type {batch_type} (from {name} or the command) packs its batches by frames or "
            "buckets, not batch_size utterances: give --override_config 'dataset_conf.batch_conf.batch_type static'"
        )
    sox_effects, load_error = recipe_input.audio_stack()
    perturb = overrides.get("dataset_conf.speed_perturb", dataset.get("speed_perturb", False))
    if str(perturb).lower() == "true" and not sox_effects:
        raise UserError(
            f"--recipe wenet: {name} has speed_perturb true, which WeNet applies with torchaudio.sox_effects "
            f"(wenet/dataset/processor.py speed_perturb), gone from torchaudio {recipe_input.torchaudio_version()} "
            "(removed in 2.9): set it false"
        )
    if load_error is not None:
        raise UserError(
            f"--recipe wenet: WeNet reads each file with torchaudio.load (wenet/dataset/processor.py decode_wav), "
            f"which fails here ({load_error}): pip install torchcodec (the build for your torch) and FFmpeg's "
            "shared libraries"
        )


def _check_paths(options: dict[str, str], config: dict[str, Any], folder: Path) -> None:
    """The files train.py opens, relative to where it runs, and the model folder it writes train.yaml into before
    it makes it (wenet/utils/train_utils.py:354; run.sh makes it first)."""
    files: list[tuple[str, Any]] = [(f"--{key}", options.get(key, "")) for key in ("train_data", "cv_data")]
    files += [
        ("cmvn_conf.cmvn_file", (config.get("cmvn_conf") or {}).get("cmvn_file")),
        ("tokenizer_conf.symbol_table_path", (config.get("tokenizer_conf") or {}).get("symbol_table_path")),
    ]
    for what, path in files:
        if isinstance(path, str) and path and not (folder / path).is_file():
            raise UserError(f"--recipe wenet: {what} {path} is not a file here: run run.sh's data stages first")
    model_dir = options.get("model_dir", "")
    if not model_dir or not (folder / model_dir).is_dir():
        raise UserError(
            f"--recipe wenet: --model_dir {model_dir or '(none)'} is not a folder here: make it first (mkdir -p), "
            "as run.sh does; train.py writes its train.yaml there before it makes it"
        )


def _trainer_defaults(script: Path) -> dict[str, Any]:
    """train.py's defaults for --num_workers and --prefetch, from the checkout's wenet/utils/train_utils.py."""
    found = recipe_input.declared_defaults(script.parent.parent / "utils" / "train_utils.py", _KNOWN_DEFAULTS)
    return _KNOWN_DEFAULTS | (found or {})


def _baseline(options: dict[str, str], batch: Any, defaults: dict[str, Any]) -> list[str]:
    """The recipe's values today as --baseline items: at least one worker (LEAST; WeNet cannot run with none)."""
    try:
        workers = int(options.get("num_workers", defaults["num_workers"]))
        prefetch = int(options.get("prefetch", defaults["prefetch"]))
        per_device = int(batch)
    except ValueError as error:
        raise UserError(f"--recipe wenet: {error}: --num_workers, --prefetch and batch_size are numbers") from None
    precision = "fp16" if options.get("use_amp") == "true" else TORCH_DEFAULT_FP32
    return [
        f"per_device_batch_size={per_device}",
        f"num_workers={max(workers, LEAST['num_workers'])}",
        f"prefetch_factor={prefetch}",
        f"pin_memory={options.get('pin_memory') == 'true'}".lower(),
        f"precision={precision}",
    ]
