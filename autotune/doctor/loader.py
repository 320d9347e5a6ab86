"""What a DataLoader of a given workload and batch holds at once: the batches in shared memory and the file
descriptors that carry them, measured on a batch the workload's own dataset produces (never a per-model table).

DataLoader workers hand each collated batch to the training process through shared memory (/dev/shm): at most
prefetch_factor batches per worker are in flight, plus the one being trained on, per training process. Under
torch's default sharing strategy on Linux (file_descriptor) every tensor in flight also holds an open descriptor.
Audio preloaded into RAM (config.preload_audio) lives in shared memory too, one copy per training process.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.doctor.context import DoctorContext
from autotune.knobs.declarations import TORCH_DEFAULTS

if TYPE_CHECKING:
    from autotune.data import DataSource
    from autotune.knobs.config import TrialConfig
    from autotune.workloads import Workload

__all__ = ["LoaderEstimate", "batch_size_of", "estimate_loader", "loader_config"]

logger = logging.getLogger(__name__)

SAMPLE_UTTERANCES = 64  # of --data: enough for a batch's worth of real lengths, cheap to validate
SAMPLE_ITEMS = 4  # items decoded and collated to measure a fixed-size batch, then scaled to the batch size
DEFAULT_PREFETCH_FACTOR = TORCH_DEFAULTS["prefetch_factor"]  # DataLoader's own, with workers
SYNTHETIC_SECONDS = 8.0  # the longest file of the embedded corpus (synth.generate_corpus's max_duration_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderEstimate:
    """A loader's shared-memory and descriptor needs per machine (all training processes together)."""

    config: TrialConfig
    config_from: str  # where batch, workers and prefetch came from
    ranks: int  # training processes on this machine, each with its own loader
    batch_bytes: int  # one collated batch's tensors
    tensors_per_batch: int
    measured_on: str  # which batch was measured
    preload_bytes: int = 0  # decoded audio in shared memory per process (config.preload_audio)

    @property
    def batches_in_flight(self) -> int:
        workers = self.config.num_workers
        if workers == 0:
            return 0
        return self.ranks * (workers * (self.config.prefetch_factor or DEFAULT_PREFETCH_FACTOR) + 1)

    @property
    def shm_bytes(self) -> int:
        return self.batches_in_flight * self.batch_bytes + self.ranks * self.preload_bytes

    @property
    def descriptors(self) -> int:
        return self.batches_in_flight * self.tensors_per_batch

    def describe(self) -> str:
        config = self.config
        prefetch = config.prefetch_factor or DEFAULT_PREFETCH_FACTOR
        text = (
            f"{self.ranks} process(es) x {config.num_workers} workers x prefetch {prefetch} (+1) of "
            f"{self.batch_bytes / 2**20:.1f} MiB batches (bs={config.per_device_batch_size}, {self.config_from})"
        )
        if self.preload_bytes:
            text += f", + {self.preload_bytes / 2**30:.2f} GiB of preloaded audio per process"
        return text


def _tensors(batch: Any) -> list[Any]:
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [tensor for value in batch.values() for tensor in _tensors(value)]
    if isinstance(batch, (list, tuple)):
        return [tensor for value in batch for tensor in _tensors(value)]
    return []


def batch_size_of(batch: Any) -> tuple[int, int]:
    """(bytes, tensors) of a collated batch (nested tuples, lists and dicts of tensors)."""
    tensors = _tensors(batch)
    return sum(t.numel() * t.element_size() for t in tensors), len(tensors)


def loader_config(context: DoctorContext, workload: Workload) -> tuple[TrialConfig, str]:
    """The loader to size: the --result's winner or the recipe's baseline as `autotune run` measures it on this
    machine, with --batch-size, --workers and --prefetch-factor laid over it."""
    from autotune.knobs.config import TrialConfig

    request = context.request
    if context.tuned is not None:
        config, origin = context.tuned.config, "the --result's winner"
    else:
        config, origin = _baseline(context, workload), f"{workload.name}'s recipe baseline"
    overrides = {
        key: value
        for key, value in (
            ("per_device_batch_size", request.per_device_batch_size),
            ("num_workers", request.num_workers),
            ("prefetch_factor", request.prefetch_factor),
        )
        if value is not None
    }
    if overrides:
        origin += " with " + ", ".join(f"{key}={value}" for key, value in overrides.items())
        fields = {**config.to_dict(), **overrides}
        if fields["num_workers"] and fields["prefetch_factor"] is None:
            fields["prefetch_factor"] = DEFAULT_PREFETCH_FACTOR
        config = TrialConfig.from_dict(fields)
    return config, origin


def _baseline(context: DoctorContext, workload: Workload) -> TrialConfig:
    from autotune import space
    from autotune.errors import UserError
    from autotune.knobs.config import TrialConfig
    from autotune.machine import hardware

    try:
        machine = hardware.probe("auto")
    except UserError:  # CUDA_VISIBLE_DEVICES and friends have their own finding; size for what the CPU run gets
        machine = hardware.probe("cpu")
    knobs = tuple(workload.knobs)
    loaded = space.load(space.space_path(workload.space_file or workload.name), machine, workload_knobs=knobs)
    return TrialConfig.from_params(loaded.baseline, workload_knobs=knobs)


def _sample_source(context: DoctorContext, folder: str) -> tuple[DataSource, str]:
    from autotune import data

    if context.request.data is not None:
        source = data.load_source(context.request.data, max_utterances=SAMPLE_UTTERANCES)
        return source, f"{len(source.utterances)} utterances of --data"
    corpus = data.generate_corpus(
        folder,
        n_speakers=2,
        files_per_speaker=2,
        min_duration_s=SYNTHETIC_SECONDS,
        max_duration_s=SYNTHETIC_SECONDS,
        seed=0,
    )
    return data.load_source(corpus), f"the embedded corpus's longest files ({SYNTHETIC_SECONDS:g} s)"


def _measure(setup: Any, config: TrialConfig) -> tuple[int, int, str]:
    """(batch bytes, tensors per batch, what was measured) of the workload's own batches."""
    if setup.worst_case_batches is not None:
        batches = setup.worst_case_batches(config)
        if batches:
            sizes = [batch_size_of(batch) for batch in batches]
            return max(size for size, _ in sizes), max(count for _, count in sizes), "its worst-case batch"
    from torch.utils.data import default_collate

    dataset = setup.dataset
    count = min(SAMPLE_ITEMS, len(dataset), config.per_device_batch_size)
    items = [dataset[index] for index in range(count)]
    batch = (setup.collate_fn or default_collate)(items)
    size, tensors = batch_size_of(batch)
    return round(size * config.per_device_batch_size / count), tensors, f"{count} items scaled to the batch"


def _preload_bytes(context: DoctorContext, source: DataSource) -> int:
    """16-bit PCM of the whole data list: the --result's recorded hours, else --data's sample scaled to its list."""
    from autotune.data.pcm import pcm_bytes_of_seconds

    if context.tuned is not None and context.tuned.data.get("total_audio_hours"):
        rates = context.tuned.data.get("sample_rates") or [16000]
        return pcm_bytes_of_seconds(float(context.tuned.data["total_audio_hours"]) * 3600, int(max(rates)))
    if context.request.data is None:
        return 0
    kept = sum(pcm_bytes_of_seconds(u.duration_s, u.sample_rate or 16000) for u in source.utterances)
    total = source.n_utterances_total or len(source.utterances)
    return round(kept * total / max(1, len(source.utterances)))


def estimate_loader(context: DoctorContext) -> LoaderEstimate | str:
    """The loader's needs, measured once and shared by the checks; a string says why they cannot be measured."""
    if "loader" not in context.cache:
        from autotune.errors import UserError

        try:
            context.cache["loader"] = _estimate(context)
        except (UserError, ValueError) as error:  # e.g. --data without the transcripts an ASR workload needs
            context.cache["loader"] = f"its batches cannot be built: {error}"
    return context.cache["loader"]


def _estimate(context: DoctorContext) -> LoaderEstimate | str:
    workload = context.workload
    if workload is None:
        return "no --model or --result to size the loader for"
    import torch

    from autotune.workloads import WorkloadContext

    config, origin = loader_config(context, workload)
    options = dict(context.tuned.workload.get("options") or {}) if context.tuned else dict(workload.options)
    ranks = context.tuned.config.world_size if context.tuned else max(1, len(context.nvml.visible))
    with tempfile.TemporaryDirectory(prefix="autotune-doctor-") as folder:
        source, where = _sample_source(context, folder)
        build = WorkloadContext(data=source, config=config, options=options, device=torch.device("cpu"))
        setup = workload.build(build)
        batch_bytes, tensors, measured = _measure(setup, config)
    preload = _preload_bytes(context, source) if config.preload_audio else 0
    return LoaderEstimate(
        config=config,
        config_from=origin,
        ranks=ranks,
        batch_bytes=batch_bytes,
        tensors_per_batch=tensors,
        measured_on=f"{measured}, on {where}",
        preload_bytes=preload,
    )
