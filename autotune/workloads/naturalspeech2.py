"""NaturalSpeech2 trained as Amphion's recipe (open-mmlab/Amphion d3de90f0, egs/tts/NaturalSpeech2).

``NS2Trainer`` (models/tts/naturalspeech2/ns2_trainer.py): AdamW over the trainable parameters with exp_config.json's
``adam: {lr: 1e-4}`` (torch's other defaults), diffusers' ``get_scheduler("cosine")`` with 5000 warm-up steps of
800k, stepped after every optimiser step (so the first step runs at lr 0), and the gradients' norm clipped to 0.5
(hard-coded) before each step; an optimiser step pre-hook does both. The loss is the model's (pitch, duration, x0,
noise and codebook CE terms: `autotune.models.naturalspeech2`). Precision is accelerate's (``accelerate launch
--mixed_precision``); bins/tts/train.py forces TF32 and cudnn.benchmark on, so the recipe's fp32 is ``tf32``.

Data: Amphion's one pickle per utterance, written once per run before the trials (`autotune.data.ns2_prep`, cached)
and read by the DataLoader workers with the prompt cut and phone expansion of NS2Dataset (`autotune.data.ns2`).
Batches are the recipe's dynamic ones (``use_dynamic_batchsize: true``, the only mode its config uses): the workload
knobs ``max_frames_in_batch`` (Amphion's ``train.max_tokens``: padded codec frames per GPU, 7500) and
``max_sentences`` (32 per GPU), under ``batch_type: dynamic`` (autotune/knobs/length_batching.py), so that the result,
the exports and the batch back-off read the frame budget where they read every workload's. ns2_trainer.py multiplies
both by the number of processes, packs the whole sorted set and deals each batch over the ranks: per GPU the same
limits; here each rank packs its own share.

Options:
- ``size``: ``full`` (the recipe's 378M-parameter model, the default) or ``reduced`` (`NS2_REDUCED`: every kind of
  layer at width 32, for CPU trials and tests, where one full-size step takes minutes). A workload option and not a
  knob: a different model is a different recipe, not a faster setting of it, and the result names it.
- ``read_latency_ms``: seconds each pickle read waits, as data read from cloud or network storage does (0: a local
  disk); what more workers or the preload knob buy against it is then measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError, WorkloadError
from autotune.knobs import length_batching
from autotune.knobs.optimizer_kernels import build as build_optimizer
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import load_transcribed_data, longest_batch, scheduled_step_hook
from autotune.workloads.registry import register

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.data.offline import Preparation
    from autotune.knobs.config import TrialConfig

__all__ = ["KNOBS", "load_ns2_data", "RECIPE_MAX_SENTENCES", "RECIPE_MAX_TOKENS", "cosine_warmup_lr"]

RECIPE_LR = 1e-4  # exp_config.json train.adam.lr
RECIPE_WARMUP_STEPS = 5000
RECIPE_TRAIN_STEPS = 800_000
RECIPE_GRAD_CLIP = 0.5
RECIPE_MAX_TOKENS = 7500
RECIPE_MAX_SENTENCES = 32
SENTENCES_KNOB = "max_sentences"
KNOBS = (length_batching.TYPE_KNOB, length_batching.FRAMES_KNOB, SENTENCES_KNOB)
SIZES = ("full", "reduced")


def load_ns2_data(path: str | None) -> DataSource:
    """`--data PATH` (a WeNet data.list, a Kaldi folder with text, ...) or the synthetic corpus: text + audio pairs."""
    return load_transcribed_data(path, task="TTS")


def cosine_warmup_lr(step: int, base_lr: float = RECIPE_LR) -> float:
    """diffusers' cosine schedule (warm-up 5000, 800k steps, half a cycle) at 1-based optimiser step ``step``: the
    scheduler steps after the optimiser, so step n runs at the schedule's value for n - 1."""
    done = step - 1
    if done < RECIPE_WARMUP_STEPS:
        return base_lr * done / RECIPE_WARMUP_STEPS
    progress = (done - RECIPE_WARMUP_STEPS) / (RECIPE_TRAIN_STEPS - RECIPE_WARMUP_STEPS)
    return base_lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def batch_limits(config: TrialConfig) -> tuple[int, int]:
    """(max_tokens, max_sentences) per device of a configuration; the recipe's where it names none."""
    knobs = config.workload_knobs
    max_tokens = length_batching.frame_budget(knobs) or RECIPE_MAX_TOKENS
    return max_tokens, int(knobs.get(SENTENCES_KNOB, RECIPE_MAX_SENTENCES))


def _model_config(options: dict[str, Any]) -> Any:
    from autotune.models.naturalspeech2 import NS2_BASE, NS2_REDUCED

    size = options.get("size", "full")
    if size not in SIZES:
        raise WorkloadError(f"option size={size!r} is not one of {', '.join(SIZES)}")
    # Amphion's phone map has 89 symbols of the recipe's 100 rows; the reduced model keeps the recipe's rows.
    return NS2_BASE if size == "full" else dataclasses.replace(NS2_REDUCED, vocab_size=NS2_BASE.vocab_size)


def _read_latency_s(options: dict[str, Any]) -> float:
    latency = options.get("read_latency_ms", 0)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= latency <= 60_000:
        raise WorkloadError(f"option read_latency_ms={latency!r} must be a number of milliseconds from 0 to 60000")
    return float(latency) / 1000.0


def _usable(data: DataSource) -> Any:
    from autotune.data.ns2_prep import MIN_PHONES, usable_for_ns2

    utterances = usable_for_ns2(data.utterances)
    if not utterances:
        raise DataError(
            f"none of the {len(data.utterances)} utterances has {MIN_PHONES} or more phones (vowel letters, or "
            "{ARPAbet} phones, in its transcript); NaturalSpeech2's prompt cut needs them"
        )
    return utterances


def _check_options(options: dict[str, Any], data: DataSource) -> Sequence[str]:
    _model_config(options)
    latency = _read_latency_s(options)
    notes = [f"read_latency_ms={latency * 1000:g}: every pickle read waits that long (slow storage)"] if latency else []
    return notes


def _prepare(data: DataSource, options: dict[str, Any]) -> Preparation:
    """The recipe's offline step (Amphion does not ship it: its issue #43): one pickle per utterance, once (cached)."""
    from autotune.data.ns2_prep import ensure_ns2_metadata

    return ensure_ns2_metadata(_usable(data))[1]


def _batch_sampler_factory(frames: tuple[int, ...]) -> Any:
    from autotune.data.ns2 import batch_by_size

    def factory(config: TrialConfig, generator: torch.Generator, indices: Sequence[int]) -> list[list[int]]:
        """One epoch of this rank's batches by size, in a shuffled order (the recipe shuffles its batches once)."""
        import torch

        max_tokens, max_sentences = batch_limits(config)
        batches = batch_by_size(frames, indices, max_tokens=max_tokens, max_sentences=max_sentences)
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]

    return factory


def _worst_case_batches(dataset: Any) -> Any:
    """The costliest batch: the longest utterances, as many as max_tokens and max_sentences let in one batch."""
    from autotune.data.ns2 import collate_ns2_batch

    def worst(config: TrialConfig) -> list[Any]:
        max_tokens, max_sentences = batch_limits(config)
        count = max(1, min(max_sentences, max_tokens // max(dataset.frames)))
        return [longest_batch(dataset, collate_ns2_batch, count, dataset.frames)]

    return worst


def _build(context: WorkloadContext) -> TrainingSetup:
    import torch
    from torch import nn

    from autotune.data.ns2 import Ns2Dataset, collate_ns2_batch
    from autotune.data.ns2_prep import ensure_ns2_metadata
    from autotune.models.naturalspeech2 import NaturalSpeech2

    metadata, _ = ensure_ns2_metadata(_usable(context.data))  # prepared before the trials: read from the cache
    dataset = Ns2Dataset(metadata, read_latency_s=_read_latency_s(context.options))
    preload_s = dataset.preload() if context.config.preload_audio else 0.0
    model = NaturalSpeech2(_model_config(context.options))
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = build_optimizer(torch.optim.AdamW, trainable, context.config.optimizer_impl, lr=cosine_warmup_lr(1))
    optimizer.register_step_pre_hook(scheduled_step_hook(model, cosine_warmup_lr, RECIPE_GRAD_CLIP))
    keys = ("code", "pitch", "duration", "phone_id", "ref_code", "phone_mask", "mask", "ref_mask")

    def loss_fn(module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return module(**{key: batch[key] for key in keys}).total

    return TrainingSetup(
        model=model,
        optimizer=optimizer,
        dataset=dataset,
        collate_fn=collate_ns2_batch,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch["code"].shape[0]),
        audio_seconds_in=lambda batch: float(batch["durations_s"].sum()),
        batch_sampler_factory=_batch_sampler_factory(dataset.frames),
        worst_case_batches=_worst_case_batches(dataset),
        preload_s=preload_s,
        item_audio_s=dataset.duration_s,
    )


def _count_parameters() -> int:
    from autotune.models.naturalspeech2 import NaturalSpeech2

    return sum(p.numel() for p in NaturalSpeech2().parameters() if p.requires_grad)


@register
def naturalspeech2() -> Workload:
    return Workload(
        name="naturalspeech2",
        task="tts",
        description="NaturalSpeech2 latent diffusion TTS (Amphion recipe: EnCodec codes, dynamic batches), AdamW",
        build=_build,
        load_data=load_ns2_data,
        count_parameters=_count_parameters,
        published_parameters=378_210_434,  # Amphion's own model, trainable (tests/models/test_naturalspeech2.py)
        space_file="naturalspeech2.yaml",
        options={"size": "full", "read_latency_ms": 0},
        knobs=KNOBS,
        check_options=_check_options,
        prepare_data=_prepare,
    )
