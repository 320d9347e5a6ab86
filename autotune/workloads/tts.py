"""TTS workloads trained as ming024/FastSpeech2's LJSpeech recipe (config/LJSpeech/train.yaml).

Adam with betas (0.9, 0.98), eps 1e-9, no weight decay; the learning rate is the Noam schedule
``hidden^-0.5 * min(step^-0.5, step * 4000^-1.5)`` (``model/optimizer.py`` ScheduledOptim, annealed by 0.3 after
300k, 400k and 500k steps); gradients are clipped to norm 1.0 before each step. An optimiser step pre-hook does both,
so the trial loop needs no scheduler. fp32, batch_size 16.

Batching as ming024's loader: it draws batch_size x group_size (4) utterances, sorts them by text length and cuts
them into 4 batches, dropping a short last one; here `LengthSortedBatchSampler` sorts windows of 4 x batch_size by
symbol count. Option ``model`` overrides FastSpeech2's keyword arguments (a small model in tests).

Option ``features`` says where the mel/pitch/energy/duration targets come from. ``precomputed`` (the default, the
recipe): ming024's preprocess.py step runs once per run before the trials (cached by corpus and settings; its cost is
reported beside the result, not charged to the throughput) and the DataLoader workers load four .npy files per item,
as ming024's Dataset; the pitch/energy bins span the corpus's normalised range, as its stats.json sets them.
``on_the_fly``: the workers compute the targets from the audio for every item, for users whose pipeline does that.
It is an option, not a search knob: the two are different pipelines, not settings of one (ming024 has no switch to
export, and computing per item is never the faster way to feed the same model), so the user says which one they run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError, WorkloadError
from autotune.knobs.optimizer_kernels import build as build_optimizer
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import load_transcribed_data, longest_batch, preload_if_asked, scheduled_step_hook
from autotune.workloads.registry import register

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.data.offline import Preparation
    from autotune.knobs.config import TrialConfig

__all__ = ["load_tts_data", "noam_lr", "recipe_optimizer"]

RECIPE_BETAS = (0.9, 0.98)
RECIPE_EPS = 1e-9
RECIPE_WARMUP_STEPS = 4000
RECIPE_ANNEAL_STEPS = (300_000, 400_000, 500_000)
RECIPE_ANNEAL_RATE = 0.3
RECIPE_GRAD_CLIP = 1.0
RECIPE_GROUP_SIZE = 4
FEATURE_SOURCES = ("precomputed", "on_the_fly")


def load_tts_data(path: str | None) -> DataSource:
    """`--data PATH` (a WeNet data.list, a Kaldi folder with text, ...) or the synthetic corpus: text + audio pairs."""
    return load_transcribed_data(path, task="TTS")


def noam_lr(step: int, d_model: int = 256, warmup_steps: int = RECIPE_WARMUP_STEPS) -> float:
    """ming024's ScheduledOptim learning rate at 1-based optimiser step ``step``."""
    lr = d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    return lr * RECIPE_ANNEAL_RATE ** sum(step > anneal for anneal in RECIPE_ANNEAL_STEPS)


def _batch_sampler_factory(token_counts: tuple[int, ...]) -> Any:
    from autotune.data.batching import LengthSortedBatchSampler

    def factory(config: TrialConfig, generator: torch.Generator, indices: Sequence[int]) -> Iterator[list[int]]:
        """One epoch of text-length-sorted batches over this rank's share, short batches dropped."""
        size = config.per_device_batch_size
        sampler = LengthSortedBatchSampler(
            token_counts,
            num_batches=None,
            generator=generator,
            batch_size=size,
            sort_size=size * RECIPE_GROUP_SIZE,
            indices=indices,
        )
        return (batch for batch in sampler if len(batch) == size)

    return factory


def _feature_source(options: dict[str, Any]) -> str:
    source = options.get("features", "precomputed")
    if source not in FEATURE_SOURCES:
        raise WorkloadError(
            f"option features={source!r} is not one of {', '.join(FEATURE_SOURCES)}; precomputed reads ming024's "
            "preprocessed targets, on_the_fly computes them per item"
        )
    return str(source)


def _usable(data: DataSource, options: dict[str, Any]) -> tuple[Any, Any]:
    """The utterances FastSpeech 2 trains on and their symbol ids; DataError when there are none."""
    from autotune.data.tts import MelConfig, usable_for_tts

    max_frames = int(options["model"].get("max_seq_len", 1000))
    utterances, tokens = usable_for_tts(data.utterances, MelConfig(), max_frames)
    if not utterances:
        raise DataError(
            f"none of the {len(data.utterances)} utterances is usable for TTS (a transcript with known characters or "
            f"{{ARPAbet}} phones, at most {max_frames} mel frames = {max_frames * 256 / 22050:.1f} s); check the "
            "transcripts and durations"
        )
    return utterances, tokens


def _prepare_fastspeech2(data: DataSource, options: dict[str, Any]) -> Preparation | None:
    """ming024's preprocess.py, once per run before the trials (cached), unless the targets are computed on the fly."""
    if _feature_source(options) != "precomputed":
        return None
    from autotune.data.tts_features import ensure_tts_features

    return ensure_tts_features(*_usable(data, options))[1]


def _dataset(context: WorkloadContext) -> tuple[Any, dict[str, Any], float]:
    """(dataset, the model's pitch/energy bin ranges, seconds spent preloading) for the option ``features``."""
    from autotune.data.tts import TtsDataset
    from autotune.data.tts_features import PrecomputedTtsDataset, ensure_tts_features

    utterances, tokens = _usable(context.data, context.options)
    if _feature_source(context.options) == "on_the_fly":
        dataset = TtsDataset(utterances, max_frames=int(context.options["model"].get("max_seq_len", 1000)))
        return dataset, {}, preload_if_asked(dataset, context)
    store, _ = ensure_tts_features(utterances, tokens)  # prepared before the trials: read from the cache
    features = PrecomputedTtsDataset(store, utterances, tokens)
    ranges = {"pitch_range": store.pitch.bin_range, "energy_range": store.energy.bin_range}
    return features, ranges, features.preload() if context.config.preload_audio else 0.0


def recipe_optimizer(model: torch.nn.Module, d_model: int, implementation: str) -> torch.optim.Optimizer:
    """ming024's Adam over the model, stepping with `implementation` (knobs/optimizer_kernels.py), with ScheduledOptim's
    learning rate and the recipe's clipping in a step pre-hook."""
    import torch

    optimizer = build_optimizer(
        torch.optim.Adam, model.parameters(), implementation, lr=noam_lr(1, d_model), betas=RECIPE_BETAS, eps=RECIPE_EPS
    )
    optimizer.register_step_pre_hook(scheduled_step_hook(model, lambda step: noam_lr(step, d_model), RECIPE_GRAD_CLIP))
    return optimizer


def _build_fastspeech2(context: WorkloadContext) -> TrainingSetup:
    from torch import nn

    from autotune.data.tts import SYMBOLS, collate_tts_batch
    from autotune.models.fastspeech2 import FastSpeech2, fastspeech2_loss

    dataset, bin_ranges, preload_s = _dataset(context)
    options = {"n_symbols": len(SYMBOLS) + 1, **bin_ranges, **context.options["model"]}
    model = FastSpeech2(**options)
    d_model = int(options.get("d_model", 256))
    optimizer = recipe_optimizer(model, d_model, context.config.optimizer_impl)

    def loss_fn(module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        outputs = module(
            batch["tokens"],
            batch["token_lengths"],
            batch["mel_lengths"],
            batch["pitch"],
            batch["energy"],
            batch["durations"],
        )
        return fastspeech2_loss(outputs, batch)

    return TrainingSetup(
        model=model,
        optimizer=optimizer,
        dataset=dataset,
        collate_fn=collate_tts_batch,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch["token_lengths"].shape[0]),
        audio_seconds_in=lambda batch: float(batch["durations_s"].sum()),
        batch_sampler_factory=_batch_sampler_factory(dataset.token_counts),
        worst_case_batches=_worst_case_batches(dataset),
        preload_s=preload_s,
        item_audio_s=tuple(utterance.duration_s for utterance in dataset.utterances),  # as durations_s counts them
    )


def _worst_case_batches(dataset: Any) -> Any:
    """The costliest batch a configuration can meet: batch_size utterances with the most mel frames (the decoder's
    length, at most max_seq_len), holding the one with the most symbols too (the encoder's), padded as the
    DataLoader pads them. No batch of the text-sorted sampler costs more: each is padded to its longest item in
    both lengths."""
    from autotune.data.tts import collate_tts_batch

    def worst(config: TrialConfig) -> list[Any]:
        count = config.per_device_batch_size
        return [longest_batch(dataset, collate_tts_batch, count, dataset.frames, dataset.token_counts)]

    return worst


def _count_fastspeech2_parameters() -> int:
    from autotune.data.tts import SYMBOLS
    from autotune.models.fastspeech2 import FastSpeech2

    return sum(p.numel() for p in FastSpeech2(n_symbols=len(SYMBOLS) + 1).parameters())


@register
def fastspeech2() -> Workload:
    return Workload(
        name="fastspeech2",
        task="tts",
        description="FastSpeech 2 acoustic model (ming024 LJSpeech recipe: 4+6 FFT blocks, variance adaptor), Adam",
        build=_build_fastspeech2,
        load_data=load_tts_data,
        count_parameters=_count_fastspeech2_parameters,
        # No total is published (the paper says "27M" for its own configuration); this is the per-component
        # arithmetic of ming024's LJSpeech configuration, spelled out in autotune/models/fastspeech2.py, and the
        # trainable parameters of ming024's own model (tests/models/reference/ming024_fastspeech2_ljspeech.json).
        published_parameters=34_646_339,
        space_file="fastspeech2.yaml",
        options={"model": {}, "features": "precomputed"},
        prepare_data=_prepare_fastspeech2,
    )
