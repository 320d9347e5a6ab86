"""ASR workloads trained as the WeNet aishell recipe: conformer CTC/attention, Adam, gradient clipping at 5.

WeNet examples/aishell/s0/conf/train_conformer.yaml: Adam lr 0.002 under WarmupLR (25000 warm-up steps), grad_clip
5 (``clip_grad_norm_`` after the AMP scaler unscales). A step pre-hook on the optimiser does both, so the trial loop
needs no scheduler. The warm-up costs nothing measurable, but it is not there for fidelity alone: at the full 0.002
from step one Adam makes the loss jump within a few steps, and a loss that turns non-finite in a long timed window
would mark a configuration infeasible for a reason that has nothing to do with throughput.

Global CMVN lives in the model, as the recipe's ``cmvn: global_cmvn``: its statistics come from the training list,
computed once per run before the trials as run.sh stage 1 does (`autotune.data.cmvn`, cached), so items are raw
fbank. The recipe accumulates gradients over 4 batches (``accum_grad: 4``): the space file holds that as
grad_accum_steps.

Batching follows the recipe's batch_conf through the workload knob ``batch_type``: static (``per_device_batch_size``
length-sorted utterances, the recipe's 16), dynamic (``max_frames_in_batch`` padded frames per batch; see
`autotune.data.batching`) or bucket (WeNet's bucket_boundaries and bucket_batch_sizes: ``num_buckets`` duration
buckets, each with its own batch from ``max_frames_in_batch`` and ``bucket_scaling``; see `autotune.data.buckets`).
Option ``model`` overrides ConformerASR's keyword arguments (e.g. a small model in tests).

Features: the recipe computes fbank and SpecAugment per utterance in the workers; the knob ``feature_device: device``
has the workers stop at the speed-perturbed waveform and the step compute both for the batch, inside the timed window
(`autotune.data.asr_features`, WeNet PR 152's move). The batches are the same either way: the batch samplers read the
frame counts the dataset computes from the utterances' durations, not the items.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError
from autotune.knobs import length_batching
from autotune.knobs.checkpointing import enabled
from autotune.knobs.feature_device import DEVICE, WORKERS
from autotune.knobs.optimizer_kernels import build as build_optimizer
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import load_transcribed_data, longest_batch, preload_if_asked, scheduled_step_hook
from autotune.workloads.registry import register

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.data.buckets import BucketPlan
    from autotune.data.offline import Preparation
    from autotune.knobs.config import TrialConfig

__all__ = ["PUBLISHED_VOCAB_SIZE", "load_asr_data", "recipe_optimizer", "warmup_lr"]

RECIPE_LR = 0.002
RECIPE_WARMUP_STEPS = 25000
RECIPE_GRAD_CLIP = 5.0
PUBLISHED_VOCAB_SIZE = 4233  # aishell's character dictionary, which the published 46.2M parameters count
DEFAULT_MAX_FRAMES_IN_BATCH = 12000  # WeNet's default for batch_type dynamic
DEFAULT_NUM_BUCKETS = 8
DEFAULT_BUCKET_SCALING = 1.0  # WeNet's dynamic budget in every bucket
FEATURE_DEVICES = (WORKERS, DEVICE)  # the recipe's placement first (autotune/knobs/feature_device.py)


def load_asr_data(path: str | None) -> DataSource:
    """`--data PATH` (a WeNet data.list, a Kaldi folder with text, ...) or the synthetic corpus, with transcripts.

    Raises:
        DataError: the data cannot be read, or some utterance has no transcript.
    """
    return load_transcribed_data(path, task="ASR")


def bucket_plan(frames: Sequence[int], config: TrialConfig) -> BucketPlan:
    """The duration buckets of this data and each one's batch, from the configuration's bucket knobs."""
    from autotune.data.buckets import plan_buckets

    knobs = config.workload_knobs
    return plan_buckets(
        frames,
        num_buckets=int(knobs.get("num_buckets", DEFAULT_NUM_BUCKETS)),
        max_frames_in_batch=int(knobs.get("max_frames_in_batch", DEFAULT_MAX_FRAMES_IN_BATCH)),
        scaling=float(knobs.get("bucket_scaling", DEFAULT_BUCKET_SCALING)),
    )


def _batch_sampler_factory(frames: tuple[int, ...], sort_size: int) -> Any:
    from autotune.data.batching import LengthSortedBatchSampler
    from autotune.data.buckets import BucketBatchSampler

    def factory(config: TrialConfig, generator: torch.Generator, indices: Sequence[int]) -> Any:
        """One epoch of WeNet-style batches over one rank's share of the list; bucket batches are dealt whole, so
        that every rank gets as many: the sampler takes every item and this rank's batches (torch.distributed's
        rank, as lhotse's samplers read it), from the same generator on every rank."""
        batch_type = length_batching.batch_type(config.workload_knobs)
        if batch_type not in length_batching.BATCH_TYPES:
            raise ValueError(f"batch_type {batch_type!r} is not one of {', '.join(length_batching.BATCH_TYPES)}")
        if batch_type == length_batching.BUCKET:
            return BucketBatchSampler(frames, bucket_plan(frames, config), generator=generator)
        size: dict[str, int] = {"batch_size": config.per_device_batch_size}
        if batch_type == length_batching.DYNAMIC:
            frames_in_batch = config.workload_knobs.get("max_frames_in_batch", DEFAULT_MAX_FRAMES_IN_BATCH)
            size = {"max_frames_in_batch": int(frames_in_batch)}
        return LengthSortedBatchSampler(
            frames, num_batches=None, generator=generator, sort_size=sort_size, indices=indices, **size
        )

    return factory


def warmup_lr(step: int, base_lr: float = RECIPE_LR, warmup_steps: int = RECIPE_WARMUP_STEPS) -> float:
    """WeNet's WarmupLR (Noam without the model-size factor) at 1-based optimiser step `step`."""
    return base_lr * warmup_steps**0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def _recipe_step_hook(model: torch.nn.Module) -> Any:
    """An optimiser step pre-hook doing the recipe's per-step work: set the warm-up learning rate, clip gradients."""
    return scheduled_step_hook(model, warmup_lr, RECIPE_GRAD_CLIP)


def recipe_optimizer(model: torch.nn.Module, implementation: str) -> torch.optim.Optimizer:
    """WeNet's Adam over the model, stepping with `implementation` (knobs/optimizer_kernels.py), with the recipe's
    warm-up and clipping in a step pre-hook (GradScaler unscales first, so the hook clips true gradients, as WeNet
    does)."""
    import torch

    optimizer = build_optimizer(torch.optim.Adam, model.parameters(), implementation, lr=warmup_lr(1))
    optimizer.register_step_pre_hook(_recipe_step_hook(model))
    return optimizer


def _build_conformer(context: WorkloadContext) -> TrainingSetup:
    from torch import nn

    from autotune.data.asr import WENET_SPEEDS, AsrDataset, CharVocabulary
    from autotune.data.asr_features import SpecAugmentConfig
    from autotune.data.cmvn import global_cmvn
    from autotune.models.conformer import MIN_INPUT_FRAMES, ConformerASR

    options = context.options
    placement = context.config.feature_device
    if placement is not None and placement not in FEATURE_DEVICES:
        raise ValueError(f"feature_device {placement!r} is not a placement the conformer runs")
    utterances = context.data.utterances
    vocabulary = CharVocabulary.from_texts(u.text or "" for u in utterances)
    dataset = AsrDataset(
        utterances,
        vocabulary,
        speeds=WENET_SPEEDS if options["speed_perturb"] else (1.0,),
        spec_aug=SpecAugmentConfig() if options["spec_aug"] else None,
        min_input_frames=MIN_INPUT_FRAMES,
        featurise=placement != DEVICE,
    )
    if len(dataset) == 0:
        raise DataError(
            f"none of the {len(utterances)} utterances passes WeNet's filter (1-200 tokens, at least "
            f"{MIN_INPUT_FRAMES} frames); check the transcripts and durations"
        )
    preload_s = preload_if_asked(dataset, context)  # before the worst-case copy below, which shares the reader
    model = ConformerASR(
        **{**options["model"], "vocab_size": len(vocabulary), "sos_eos": vocabulary.SOS_EOS_ID},
        gradient_checkpointing=enabled(context.config.activation_checkpointing, recipe=False),  # the aishell recipe
    )
    cmvn, _ = global_cmvn(utterances, dataset.fbank)  # prepared before the trials: read from the cache
    model.encoder.global_cmvn.set_stats(*cmvn.mean_istd())
    optimizer = recipe_optimizer(model, context.config.optimizer_impl)
    collate_fn, features = _features(dataset)

    def loss_fn(module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        feats, feat_lengths = features(batch)
        return module(feats, feat_lengths, batch["tokens"], batch["token_lengths"])["loss"]

    return TrainingSetup(
        model=model,
        optimizer=optimizer,
        dataset=dataset,
        collate_fn=collate_fn,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch["token_lengths"].shape[0]),
        audio_seconds_in=lambda batch: float(batch["durations_s"].sum()),
        batch_sampler_factory=_batch_sampler_factory(dataset.max_frames, int(options["sort_size"])),
        worst_case_batches=_worst_case_batches(dataset, collate_fn),
        preload_s=preload_s,
        item_audio_s=tuple(utterance.duration_s for utterance in dataset.utterances),  # as durations_s counts them
    )


def _features(dataset: Any) -> tuple[Any, Any]:
    """The collate function and the step's features of its batch: (feats, feat_lengths) collated by the workers, or
    computed in the step from the waveforms (feature_device device; part of the step, so inside the timed window)."""
    from autotune.data.asr import collate_asr_batch
    from autotune.data.asr_features import collate_asr_waveforms, device_features

    if dataset.featurise:
        return collate_asr_batch, lambda batch: (batch["feats"], batch["feat_lengths"])
    fbank, spec_aug = dataset.fbank, dataset.spec_aug
    return collate_asr_waveforms, lambda batch: device_features(
        batch["waveforms"], batch["sample_lengths"], fbank, spec_aug
    )


def _worst_case_batches(dataset: Any, collate_fn: Any) -> Any:
    """The costliest batch a configuration can meet: the longest utterances, at the slowest speed perturbation (the
    most frames), packed to the batch limit: batch_size of them (static), or as many as fit max_frames_in_batch
    padded to the longest (dynamic); with buckets, each bucket's longest items at that bucket's batch, as NeMo's
    OOMptimizer probes each bucket's longest (a bucket with fewer items repeats its longest to fill the batch a
    larger corpus would give it)."""
    import copy

    frames = dataset.max_frames
    slowest = copy.copy(dataset)  # the same items, always at the slowest speed
    slowest.speeds = (min(dataset.speeds),)

    def worst(config: TrialConfig) -> list[Any]:
        if length_batching.batch_type(config.workload_knobs) == length_batching.BUCKET:
            from autotune.data.buckets import worst_batches

            return [
                collate_fn([slowest[index] for index in batch])
                for batch in worst_batches(frames, bucket_plan(frames, config))
            ]
        count = config.per_device_batch_size
        if length_batching.batch_type(config.workload_knobs) == length_batching.DYNAMIC:
            budget = int(config.workload_knobs.get("max_frames_in_batch", DEFAULT_MAX_FRAMES_IN_BATCH))
            count = max(1, budget // max(frames))
        return [longest_batch(slowest, collate_fn, count, frames)]

    return worst


def _prepare_conformer(data: DataSource, options: dict[str, Any]) -> Preparation:
    """run.sh stage 1: the global CMVN statistics of every utterance of the training list, once per run (cached)."""
    from autotune.data.asr import WENET_FBANK
    from autotune.data.cmvn import global_cmvn

    return global_cmvn(data.utterances, WENET_FBANK)[1]


def _count_conformer_parameters() -> int:
    from autotune.models.conformer import ConformerASR

    return sum(p.numel() for p in ConformerASR(vocab_size=PUBLISHED_VOCAB_SIZE).parameters())


@register
def conformer() -> Workload:
    return Workload(
        name="conformer",
        task="asr",
        description="WeNet conformer ASR (aishell recipe: 12 conformer + 6 decoder blocks, CTC/attention), Adam",
        build=_build_conformer,
        load_data=load_asr_data,
        count_parameters=_count_conformer_parameters,
        published_parameters=46_197_266,
        space_file="conformer.yaml",
        options={"speed_perturb": True, "spec_aug": True, "sort_size": 500, "model": {}},
        knobs=length_batching.KNOBS,
        feature_devices=FEATURE_DEVICES,
        checkpointing="WeNet's gradient_checkpointing: every encoder and decoder layer recomputed in backward",
        prepare_data=_prepare_conformer,
    )
