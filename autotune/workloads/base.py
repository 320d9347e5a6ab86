"""The workload protocol: what a model family must provide so that trials can train it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from autotune.data import DataSource
    from autotune.data.offline import Preparation
    from autotune.knobs.config import TrialConfig

__all__ = ["Workload", "WorkloadContext", "TrainingSetup", "move_to_device"]


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadContext:
    """What a workload's build function gets inside a trial process."""

    data: DataSource
    config: TrialConfig
    options: dict[str, Any]
    device: torch.device


def move_to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """Move every tensor of a (nested) batch to the device."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(item, device, non_blocking) for item in batch)
    if isinstance(batch, dict):
        return {key: move_to_device(value, device, non_blocking) for key, value in batch.items()}
    return batch


# (config, generator, dataset indices of this rank) -> one epoch of batches of dataset indices
BatchSamplerFactory = Callable[["TrialConfig", "torch.Generator", Sequence[int]], Iterable[list[int]]]


@dataclass(kw_only=True, slots=True)
class TrainingSetup:
    """Live objects for one trial: the model (with its loss head), optimiser, data and the loss of a batch.

    Attributes:
        model: every module with trainable parameters (embedding network and classifier head).
        optimizer: built over model.parameters().
        dataset: a map-style dataset whose items are decoded and featurised in DataLoader workers.
        collate_fn: turns a list of items into a batch.
        loss_fn: (model, batch already on the device) -> scalar loss tensor.
        samples_in: number of training samples in a batch.
        audio_seconds_in: seconds of audio in a batch.
        batch_to_device: moves a batch to the device (non_blocking when memory is pinned).
        batch_sampler_factory: (config, generator, indices) -> one epoch of batches (lists of dataset indices) drawn
            from `indices`, the share of the dataset this rank trains on in this epoch, for workloads that batch by
            length (WeNet's sorted static and dynamic batches); None = shuffled batches of
            config.per_device_batch_size, the last short one dropped. autotune shards, reshuffles and repeats
            epochs itself.
        worst_case_batches: config -> the most expensive batches this configuration can meet (collated, on the
            host, as the DataLoader yields them), trained before warm-up so that a configuration that runs out of
            memory on them fails at once (icefall's pessimistic-batch scan; trial/worst_case.py). For workloads
            whose samples vary in length, e.g. the longest utterances packed to the batch limit; None where every
            batch costs the same (fixed-length crops).
        preload_s: wall seconds the build spent decoding the dataset's audio into RAM (config.preload_audio;
            `autotune.workloads.common.preload_if_asked`): part of the trial's setup_s, reported on its own so that
            a one-off cost can be weighed against the faster steps it buys. 0.0 when items are read from disk.
        item_audio_s: each dataset item's seconds of audio, as audio_seconds_in counts them, for workloads whose
            items differ in length: the trial prices its epoch's own mix of short and long batches from them
            (trial/epoch_mix.py), not only the stretch its window saw. None where every item is alike.
        find_unused_parameters: DDP's find_unused_parameters for the model, on for a recipe whose steps leave some
            parameters without a gradient (GPT-SoVITS s2's ssl_proj) and which turns it on itself.
        samples_per_epoch: (config, world size) -> the samples one epoch deals over all ranks, for a recipe whose
            own batch sampler drops or repeats items by design (GPT-SoVITS s2's buckets: items outside them dropped,
            each padded to whole global batches); the epoch accounting checks the ranks against it. None: the
            dataset's size.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    dataset: torch.utils.data.Dataset[Any]
    collate_fn: Callable[[list[Any]], Any] | None
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    samples_in: Callable[[Any], int]
    audio_seconds_in: Callable[[Any], float]
    batch_to_device: Callable[[Any, torch.device, bool], Any] = move_to_device
    batch_sampler_factory: BatchSamplerFactory | None = None
    worst_case_batches: Callable[[TrialConfig], list[Any]] | None = None
    preload_s: float = 0.0
    item_audio_s: Sequence[float] | None = None
    find_unused_parameters: bool = False
    samples_per_epoch: Callable[[TrialConfig, int], int] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """A trainable model family: how to build it, its data, its recipe and its search space.

    Attributes:
        name: the CLI name (`autotune run --model NAME`).
        task: "speaker-verification", "asr", "tts", ...
        description: one line for `autotune models`.
        build: makes the TrainingSetup inside a trial process.
        load_data: turns `--data PATH` (or None for the embedded default corpus) into a DataSource.
        count_parameters: builds the model alone and counts its parameters (no head, as papers count).
        published_parameters: the figure the model's authors publish, asserted by tests.
        space_file: the search-space YAML used when the user gives none.
        options: workload options and their defaults (e.g. crop_s), overridable per run.
        knobs: the workload's own knobs (search parameters beyond those of autotune/knobs/declarations.py, e.g. WeNet's
            max_frames_in_batch): a trial gets their values in TrialConfig.workload_knobs, and the result writes them
            in its `workload_knobs` section.
        checkpointing: what the activation_checkpointing knob recomputes in this workload, as its framework's own
            switch does (autotune/knobs/checkpointing.py); None: the knob does not apply, and a space naming it is
            refused.
        check_options: (the run's options, its data) -> notes for the result; runs once in the parent before any
            trial, raises a UserError for an option the user got wrong (one line, exit code 2) and prepares what
            trials will read (e.g. generates the synthetic noise set), so that a bad path never costs a trial.
        prepare_data: (data, options) -> what was prepared, or None: the recipe's one-off work before training
            (WeNet's CMVN statistics, ming024's feature extraction), done once per run in the parent before any
            trial and cached (`autotune.data.offline`), so that trials measure the training pipeline the recipe
            runs and not its preprocessing. Raises a UserError for bad data or options. None: nothing to prepare.
        feature_devices: where its pipeline can compute the input features, the recipe's placement first (workers,
            device: the feature_device knob, autotune/knobs/feature_device.py); empty: nothing to choose (the recipe's
            placement is the only one), and a space naming the knob is refused before any trial.
    """

    name: str
    task: str
    description: str
    build: Callable[[WorkloadContext], TrainingSetup]
    load_data: Callable[[str | None], DataSource]
    count_parameters: Callable[[], int] | None = None
    published_parameters: int | None = None
    space_file: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    knobs: Sequence[str] = ()
    checkpointing: str | None = None
    check_options: Callable[[dict[str, Any], DataSource], Sequence[str]] | None = None
    prepare_data: Callable[[DataSource, dict[str, Any]], Preparation | None] | None = None
    feature_devices: tuple[str, ...] = ()
