"""PyTorch Lightning: Trainer(...) and DataLoader(...) as Python to paste (no YAML).

Precision strings are Lightning 2.x's ("32-true", "16-mixed", "bf16-mixed"); the DataLoader batch is per process
under DDP; Trainer(benchmark=...) sets cudnn.benchmark. Lightning sets no TF32 flag of its own, so float32 runs
torch's defaults (fp32-default) unless the snippet sets them. Under dynamic batching the snippet builds autotune's
LengthSortedBatchSampler (WeNet's batching) as the loader's batch_sampler, and under bucket batching autotune's
BucketBatchSampler with the result's buckets; Lightning's distributed sampler is turned off then: each rank batches
its own stride of the dataset (dynamic) or takes its share of whole batches (bucket).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.exports.base import (
    Export,
    ExportContext,
    KnobNotes,
    cannot,
    knob_table,
    register,
    takes,
)
from autotune.exports.knob_notes import (
    THREADS,
    checkpointing_note,
    optimizer_note,
    preload_note,
    unordered_note,
)
from autotune.knobs.precision import LIGHTNING_PRECISION, TORCH_DEFAULT_FP32

_TF32_LINES = {
    "fp32": [
        "torch.backends.cuda.matmul.allow_tf32 = False  # strict IEEE float32, as measured",
        "torch.backends.cudnn.allow_tf32 = False",
    ],
    "tf32": [
        "torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls and convolutions, as measured",
        "torch.backends.cudnn.allow_tf32 = True",
    ],
}


@register("lightning")
def export_lightning(context: ExportContext) -> Export:
    config = context.config
    dynamic = context.max_frames_in_batch is not None or context.bucket_plan is not None
    trainer: dict[str, Any] = {"accelerator": "gpu" if context.on_cuda else "cpu", "devices": context.devices_per_node}
    if context.nodes > 1:
        trainer["num_nodes"] = context.nodes  # under srun: Lightning's SLURMEnvironment gives each task its rank
    if context.world_size > 1:
        trainer["strategy"] = "ddp"
    trainer |= {
        "precision": LIGHTNING_PRECISION[context.precision],
        "accumulate_grad_batches": config.grad_accum_steps,
        "benchmark": config.cudnn_benchmark,
    }
    if dynamic:
        trainer["use_distributed_sampler"] = False  # the batch sampler below takes this rank's share itself
    loader: dict[str, Any] = {"num_workers": config.num_workers, "pin_memory": config.pin_memory}
    loader |= context.loader_extras()
    lines = ["import torch", "from lightning.pytorch import Trainer", "from torch.utils.data import DataLoader"]
    if context.bucket_plan is not None:
        lines.append("from autotune.data.buckets import BucketBatchSampler, BucketPlan")
    elif dynamic:
        lines.append("from autotune.data.batching import LengthSortedBatchSampler")
    lines.append("")
    if config.intra_op_threads is not None:
        lines.append(f"torch.set_num_threads({config.intra_op_threads})")
    if context.on_cuda:
        lines += _TF32_LINES.get(context.precision, [])
    lines.append(_call("trainer = Trainer", trainer))
    flag = context.optimizer_flag()
    if flag:
        lines.append(f"optimizer_kwargs = {flag!r}  # add to the torch.optim constructor in configure_optimizers")
    compiled = context.compile_kwargs()
    if compiled is not None:
        lines.append(f"compile_kwargs = {compiled!r}  # network.compile(**compile_kwargs) in your LightningModule")
    if dynamic:
        lines += _batch_sampler_lines(context)
        lines.append("# collate_fn: your padding collate of variable-length items (torch's default cannot stack them)")
        first = ["train_dataset", "batch_sampler=batch_sampler", "collate_fn=collate_fn"]
        lines.append(_call("train_loader = DataLoader", loader, first=first))
    else:
        loader = {"batch_size": config.per_device_batch_size, "shuffle": True, **loader, "drop_last": True}
        lines.append(_call("train_loader = DataLoader", loader, first=["train_dataset"]))
    notes = _notes(context) + _nodes_notes(context)
    return Export(target="lightning", python_text="\n".join(lines) + "\n", notes=notes)


def _nodes_notes(context: ExportContext) -> tuple[str, ...]:
    """Lightning across nodes: one task per device, started by srun (SLURMEnvironment reads SLURM_PROCID,
    SLURM_LOCALID and SLURM_NTASKS; it checks --ntasks-per-node against devices), never torchrun."""
    if context.nodes == 1:
        return ()
    return (
        f"Measured on {context.nodes} nodes of {context.devices_per_node} device(s) each: in an sbatch job of "
        f"#SBATCH --nodes={context.nodes} --ntasks-per-node={context.devices_per_node}, start it as `srun python "
        "train.py` (one task per device: Lightning's SLURMEnvironment takes each task's rank from srun)",
    )


def _batch_sampler_lines(context: ExportContext) -> list[str]:
    plan = context.bucket_plan
    if plan is not None:
        return [
            "# train_frames: each item's fbank frame count (10 ms hop), indexed like train_dataset",
            "batch_sampler = BucketBatchSampler(",
            "    train_frames,",
            f"    BucketPlan(boundaries={plan.boundaries!r}, batch_sizes={plan.batch_sizes!r}),",
            "    seed=0,  # each pass over it draws the next epoch's shuffle",
            "    rank=trainer.global_rank,",
            "    world_size=trainer.world_size,",
            ")",
        ]
    return [
        "# train_frames: each item's frame count, indexed like train_dataset",
        "batch_sampler = LengthSortedBatchSampler(",
        "    train_frames,",
        "    num_batches=None,  # one epoch per pass, reshuffled each time",
        "    generator=torch.Generator().manual_seed(trainer.global_rank),",
        f"    max_frames_in_batch={context.max_frames_in_batch},",
        "    indices=range(trainer.global_rank, len(train_dataset), trainer.world_size),",
        ")",
    ]


def _call(head: str, kwargs: dict[str, Any], *, first: list[str] | None = None) -> str:
    arguments = (first or []) + [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"{head}(\n" + "".join(f"    {argument},\n" for argument in arguments) + ")"


def _notes(context: ExportContext) -> tuple[str, ...]:
    config = context.config
    plan = context.bucket_plan
    if plan is not None:
        batch = (
            f"Bucket batches: an item below boundaries[i] frames goes to bucket i, whose batches hold "
            f"batch_sizes[i] items per device ({list(plan.batch_sizes)}); the batches are shuffled each epoch and "
            "dealt whole, as many to every rank (needs autotune installed; define train_frames and collate_fn, your "
            "padding collate). Lightning's distributed sampler is off: the sampler takes the rank's share itself"
        )
    elif context.max_frames_in_batch is None:
        batch = (
            f"DataLoader batch_size {config.per_device_batch_size} is per process under DDP: global batch "
            f"{context.global_batch_size} with devices={context.world_size} and accumulate_grad_batches="
            f"{config.grad_accum_steps}"
        )
    else:
        batch = (
            f"Dynamic batching: each batch packs length-sorted items while the padded batch stays within "
            f"max_frames_in_batch={context.max_frames_in_batch} frames per device (needs autotune installed; define "
            "train_frames and collate_fn, your padding collate). Each rank batches its own stride of the dataset, so "
            "use_distributed_sampler is off; each epoch's last batch, however short, is kept (WeNet's batching keeps "
            "it too)"
        )
    return (batch,)


def _precision_notes(context: ExportContext) -> list[str]:
    precision = context.precision
    if precision in ("fp32", "tf32") and context.on_cuda:
        return [
            f'{precision} is precision="32-true" plus the TF32 flags set above (Lightning sets none itself); '
            "without them Lightning trains fp32-default"
        ]
    if precision == TORCH_DEFAULT_FP32:
        return ['fp32-default is precision="32-true" with no TF32 flag set, as Lightning leaves them']
    if precision == "fp16":
        if context.on_cuda:
            return ['precision="16-mixed" autocasts float16 and scales the loss with a GradScaler']
        return [
            'fp16 was measured on the CPU, but Lightning (since 2.0, #16783) warns and trains precision="16-mixed" '
            "as bf16-mixed on a CPU: what runs is bfloat16 autocast, not what was measured"
        ]
    return []


def _optimizer_notes(context: ExportContext) -> Sequence[str]:
    notes = optimizer_note("optimizer_kwargs, passed by your configure_optimizers (Lightning does not build it)")
    flag = context.optimizer_flag()
    precision = LIGHTNING_PRECISION[context.precision]
    if flag.get("fused") and precision != "32-true":
        return [
            *notes(context),
            f'Lightning refuses gradient_clip_val with a fused optimizer under precision="{precision}"'
            " (MixedPrecision.clip_gradients, lightning/pytorch/plugins/precision/amp.py: the optimizer unscales "
            "itself): a recipe that clips (conformer, FastSpeech 2) needs foreach there, or its clipping done "
            "before optimizer.step",
        ]
    return notes(context)


def _compile_notes(context: ExportContext) -> list[str]:
    if context.compile_kwargs() is None:
        return []
    return [
        f"compile {context.config.compile}: Lightning has no Trainer flag for torch.compile; call "
        f"{context.compile_call()} on each network module in your LightningModule's __init__ (or pass "
        "torch.compile(model) to trainer.fit, which Lightning unwraps and trains: lightning/pytorch/utilities/"
        "compile.py). The trials compiled the network, not the loss"
    ]


_OPTIMIZER: KnobNotes = _optimizer_notes


def _feature_notes(context: ExportContext) -> list[str]:
    """Lightning runs whatever the user's dataset and module do; the note says how to place the fbank as measured."""
    if context.config.feature_device != "device":
        return []  # unset or workers: the dataset's own fbank, as the recipe's
    if context.model_name == "conformer":
        return [
            "The tuned run computed fbank and SpecAugment batch-wise on the device (feature_device device): build "
            "train_dataset as autotune.data.asr.AsrDataset(..., featurise=False), pass "
            "collate_fn=autotune.data.asr_features.collate_asr_waveforms to the snippet's DataLoader, and in your "
            "LightningModule's "
            "on_after_batch_transfer, which Lightning calls on each batch once it is on the device before "
            "training_step, replace batch['waveforms'] and batch['sample_lengths'] by the feats and feat_lengths of "
            "autotune.data.asr_features.device_features(batch['waveforms'], batch['sample_lengths'], "
            "autotune.data.asr.WENET_FBANK, autotune.data.asr_features.SpecAugmentConfig())"
        ]
    return [
        "The tuned run computed the fbank batch-wise on the device (feature_device device): build train_dataset with "
        "featurise=False (autotune.data.SpeakerlabDataset returns the crop) and return "
        "(autotune.data.features.batched_fbank(batch[0]), batch[1]) from on_after_batch_transfer in your "
        "LightningModule, which Lightning calls on each batch once it is on the device, before training_step"
    ]


_LOADER = takes("DataLoader(...) in the snippet")
KNOB_TABLE = knob_table(
    "lightning",
    {
        "per_device_batch_size": takes("DataLoader(batch_size=...), per process under DDP"),
        "num_workers": _LOADER,
        "prefetch_factor": _LOADER,
        "pin_memory": _LOADER,
        "persistent_workers": _LOADER,
        "in_order": takes(_LOADER.how, notes=unordered_note("Lightning", carried=True)),
        "precision": takes("Trainer(precision=...) and the TF32 flags it sets", notes=_precision_notes),
        "optimizer_impl": takes("optimizer_kwargs in the snippet, for configure_optimizers", notes=_OPTIMIZER),
        "activation_checkpointing": cannot(
            checkpointing_note(
                "Lightning (checkpointing is model code, not a Trainer argument)",
                "build the model as measured (CAM++: memory_efficient=True/False; the conformer: WeNet's "
                "gradient_checkpointing, each encoder and decoder layer under torch.utils.checkpoint.checkpoint(..., "
                "use_reentrant=False))",
            )
        ),
        "intra_op_threads": takes("torch.set_num_threads(...) in the snippet", notes=THREADS.notes),
        "cudnn_benchmark": takes("Trainer(benchmark=...)"),
        "world_size": takes("Trainer(devices=...)"),
        "grad_accum_steps": takes("Trainer(accumulate_grad_batches=...)"),
        "preload_audio": cannot(preload_note("Lightning (your train_dataset)")),
        "feature_device": takes(
            "your train_dataset and LightningModule.on_after_batch_transfer (Lightning's hook on the batch once on "
            "the device)",
            notes=_feature_notes,
        ),
        "compile": takes("compile_kwargs in the snippet, for your LightningModule's network", notes=_compile_notes),
    },
)
