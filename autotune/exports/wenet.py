"""WeNet: the aishell conformer recipe's torchrun command, with the tuned values as its flags and config overrides.

Argument names, defaults and the DataLoader construction follow wenet/bin/train.py and wenet/utils/train_utils.py
(wenet-e2e/wenet 0154699; recorded in tests/data/wenet_train_args.json): --num_workers, --pin_memory, --prefetch,
--use_amp, --device, --ddp.dist_backend, --override_config "key.path value" (the key must exist in the config; the
value is converted to its type). The DataLoader is DataLoader(batch_size=None, persistent_workers=True,
prefetch_factor=--prefetch): torch rejects that with 0 workers. dataset_conf.batch_conf is PER GPU (data is sharded
by rank); examples/aishell/s0/conf/train_conformer.yaml has a static batch_size 16 and accum_grad 4.
"""

from __future__ import annotations

from typing import Any

from autotune import yamlio
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
from autotune.knobs.declarations import TORCH_DEFAULTS

# What an unset prefetch_factor measured (torch's default); WeNet's own --prefetch default is 100.
_TORCH_DEFAULT_PREFETCH = TORCH_DEFAULTS["prefetch_factor"]
RECIPE_CONFIG = "conf/train_conformer.yaml"
MODEL_DIR = "exp/conformer"  # run.sh: dir=exp/conformer
# conf/train_conformer.yaml's optim_conf (optim: adam); init_optimizer_and_scheduler passes it whole to
# optim.Adam(params, **optim_conf) (wenet/utils/train_utils.py).
RECIPE_OPTIM_CONF = {"lr": 0.002}


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
    flags += [f"--num_workers {workers}", f"--prefetch {prefetch}"]
    if config.pin_memory:
        flags.append("--pin_memory")
    if context.precision == "fp16" and context.on_cuda:
        flags.append("--use_amp")
    if context.max_frames_in_batch is None and context.bucket_plan is None:
        flags.append(f'--override_config "dataset_conf.batch_conf.batch_size {config.per_device_batch_size}"')
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
