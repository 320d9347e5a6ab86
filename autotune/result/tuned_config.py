"""The tuned configuration: what is written as YAML, read back with load_config, and applied in training code."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from autotune import yamlio
from autotune.errors import OutputError, UserError, describe_os_error
from autotune.knobs import compile_modes, length_batching, optimizer_kernels
from autotune.knobs import declarations as knobs
from autotune.knobs.config import TrialConfig
from autotune.knobs.dataloader import dataloader_kwargs, dynamic_batching
from autotune.knobs.precision import PrecisionSettings
from autotune.knobs.process import apply_process_settings
from autotune.result.measurements import Measurements
from autotune.result.sections import (
    ClusterSection,
    DataSection,
    HardwareSection,
    Metrics,
    SearchSection,
    WorkloadSection,
    check_sections,
)

if TYPE_CHECKING:
    from autotune.data.buckets import BucketBatchSampler, BucketPlan

__all__ = ["TunedConfig", "load_config", "write_config"]

_HEADER = """\
# autotune result: the fastest stable training configuration measured on this machine.
#
# Use it from Python:
#   cfg = autotune.load_config("{path}")
#   loader = torch.utils.data.DataLoader(dataset, **cfg.dataloader_kwargs())
#   cfg.apply_backend_flags()          # TF32 and cudnn.benchmark, set explicitly
#   with cfg.autocast(): loss = ...    # bf16/fp16 autocast; a no-op for fp32/fp32-default/tf32
#   scaler = cfg.grad_scaler()         # GradScaler for fp16 on CUDA, a no-op otherwise
#   opt = torch.optim.AdamW(model.parameters(), lr=..., **cfg.optimizer_kwargs())  # fused/foreach, or {{}}
#   if cfg.compile_kwargs() is not None: model.compile(**cfg.compile_kwargs())  # compile.mode; None: eager
# or copy the values into your recipe: batch.per_device_batch_size is per process (WeNet, SpeechBrain,
# Lightning); 3D-Speaker's and ESPnet's batch_size is per_device_batch_size x world_size (one step on all
# devices). batch.global_batch_size also counts grad_accum_steps: it is the batch per optimizer step, not a recipe's
# batch_size. `autotune export RESULT --to TARGET` prints each framework's own command.
# metrics: samples_per_second is end-to-end training throughput (data loading included), the median of
# `measurements` timed windows; speedup compares the winner with the recipe baseline measured in the same run.
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class TunedConfig:
    """A tuned configuration with the evidence behind it."""

    workload: WorkloadSection
    config: TrialConfig
    device_type: str
    metrics: Metrics
    hardware: HardwareSection
    data: DataSection
    search: SearchSection
    created: str
    autotune_version: str
    notes: list[str] = field(default_factory=list)
    # A multi-node result (--nodes): nodes, devices per node, the global batch, the ranks' hosts and the interconnect
    # facts (run/conclusion.py cluster_section); empty for one machine, and then not written.
    cluster: ClusterSection = field(default_factory=ClusterSection)

    @property
    def nodes(self) -> int:
        """Nodes the result was measured on (1 unless --nodes)."""
        return int(self.cluster.get("nodes") or 1)

    @property
    def precision(self) -> PrecisionSettings:
        return PrecisionSettings(
            precision=self.config.precision, device_type=self.device_type, cudnn_benchmark=self.config.cudnn_benchmark
        )

    @property
    def winner(self) -> Measurements:
        """The winner's measurements (metrics.winner), typed."""
        return Measurements.from_dict(self.metrics.get("winner") or {})

    @property
    def baseline(self) -> Measurements:
        """The recipe baseline's measurements (metrics.baseline; NOT_MEASURED when the run had none), typed."""
        return Measurements.from_dict(self.metrics.get("baseline") or {})

    @property
    def dynamic_batching(self) -> bool:
        """Tuned with WeNet-style dynamic batches (a frame budget per batch, not a sample count)."""
        return dynamic_batching(self.config)

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for torch.utils.data.DataLoader (per process: batch_size is the per-device batch).

        The very arguments the trials measured with (knobs/dataloader.py builds both). With dynamic batching the
        dataset pipeline forms the batches (WeNet's DataLoader(batch_size=None)): then batch_size is None and the
        frame budget is in the result's batch section (max_frames_in_batch).
        """
        return dataloader_kwargs(self.config)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """torch.autocast for bf16/fp16 on this result's device type; a no-op context for fp32/tf32."""
        return self.precision.autocast()

    def apply_backend_flags(self) -> str:
        """Set TF32 explicitly (both of torch's APIs where it has two, knobs/precision.py), cudnn.benchmark and the
        intra-op threads, as the trials set them (trial/process.py)."""
        return apply_process_settings(self.config, self.precision)

    def grad_scaler(self) -> Any:
        return self.precision.grad_scaler()

    def optimizer_kwargs(self) -> dict[str, bool]:
        """The keyword to add to your torch.optim constructor for the tuned implementation: {"fused": True},
        {"foreach": True}, or {} for `default` (torch's own choice, what a recipe builds)."""
        return optimizer_kernels.constructor_kwargs(self.config.optimizer_impl)

    def compile_kwargs(self) -> dict[str, Any] | None:
        """The keywords for torch.compile(module, **kwargs) of the tuned mode ({} for `default`, {"dynamic": True});
        None when the winner trains eagerly (compile off). Compile the network's modules, not the loss, as the trials
        did (compile_modes.compiled_modules)."""
        mode = self.config.compile
        return None if mode == compile_modes.OFF else compile_modes.compile_kwargs(mode)

    @property
    def bucket_plan(self) -> BucketPlan | None:
        """The winner's duration buckets and each one's batch size (batch_type bucket), as its trials formed them
        from the run's data (metrics.winner.epoch_accounting.buckets); None for other batching."""
        from autotune.data.buckets import BucketPlan

        if length_batching.batch_type(self.config.workload_knobs) != length_batching.BUCKET:
            return None
        recorded = (self.winner.epoch_accounting or {}).get("buckets")
        return BucketPlan.from_dict(recorded) if recorded else None

    def batch_sampler(
        self, frames: Sequence[int], *, seed: int = 0, rank: int | None = None, world_size: int | None = None
    ) -> BucketBatchSampler:
        """The sampler the trials measured, for your dataset, from each item's fbank frame count (10 ms hop):
        `DataLoader(dataset, batch_sampler=cfg.batch_sampler(frames), **kwargs)` with dataloader_kwargs() less its
        batch_size (None; DataLoader refuses one beside a batch_sampler). Each pass draws the next epoch's shuffle
        (set_epoch picks one); rank and world size default to torch.distributed's.

        Raises:
            ValueError: the result was not tuned with bucket batches.
        """
        from autotune.data.buckets import BucketBatchSampler

        plan = self.bucket_plan
        if plan is None:
            raise ValueError("this result was not tuned with batch_type bucket: it has no bucket plan")
        return BucketBatchSampler(frames, plan, seed=seed, rank=rank, world_size=world_size)

    def _batching(self) -> dict[str, Any]:
        if not self.dynamic_batching:
            return {}
        frames = self.config.workload_knobs.get(length_batching.FRAMES_KNOB)
        plan = self.bucket_plan
        if plan is not None:
            return {
                length_batching.TYPE_KNOB: length_batching.BUCKET,
                length_batching.FRAMES_KNOB: frames,
                **plan.to_dict(),
                "note": "bucket batches: items below bucket_boundaries[i] (fbank frames) form batches of "
                "bucket_batch_sizes[i], the rest of the last size; per_device_batch_size is unused",
            }
        if length_batching.batch_type(self.config.workload_knobs) == length_batching.BUCKET:  # no trial to read
            return {
                length_batching.TYPE_KNOB: length_batching.BUCKET,
                length_batching.FRAMES_KNOB: frames,
                "note": "no trial recorded its buckets",
            }
        return {
            length_batching.TYPE_KNOB: length_batching.DYNAMIC,
            length_batching.FRAMES_KNOB: frames,
            "note": "dynamic batches: a padded-frame budget per device batch; per_device_batch_size is unused",
        }

    def _audio_note(self) -> dict[str, Any]:
        if not self.config.preload_audio:
            return {}
        return {
            "note": "decode every utterance once into RAM (16-bit PCM) before the DataLoader starts, and crop from "
            "there: autotune.data.preload.PreloadedAudio does it for autotune's datasets; see metrics.preload",
        }

    def _knob_sections(self) -> dict[str, dict[str, Any]]:
        """Each knob under its section (knobs/declarations.py), with what derives from the knobs beside them. The
        dataloader section is what DataLoader is given (dataloader_kwargs): its knobs as torch accepts them, and read
        back from there."""
        config = self.config
        sections = knobs.result_sections(config.knob_values())
        sections["batch"] |= {"global_batch_size": config.global_batch_size, **self._batching()}
        sections["dataloader"] = self.dataloader_kwargs()
        sections["precision"] |= {
            "amp_dtype": self.precision.amp_dtype_name,
            "tf32": self.precision.tf32,
            "grad_scaler": self.precision.uses_grad_scaler,
        }
        sections["optimizer"] |= {"torch_kwargs": self.optimizer_kwargs()}
        sections["audio"] |= self._audio_note()
        kwargs = self.compile_kwargs()
        if kwargs is not None:
            sections["compile"] |= {"torch_kwargs": kwargs}
        return sections

    def to_dict(self) -> dict[str, Any]:
        return {
            "autotune_version": self.autotune_version,
            "created": self.created,
            "workload": self.workload,
            "device_type": self.device_type,
            **self._knob_sections(),
            "workload_knobs": dict(self.config.workload_knobs),
            "metrics": self.metrics,
            "notes": list(self.notes),
            "hardware": self.hardware,
            "data": self.data,
            "search": self.search,
            **({"cluster": self.cluster} if self.cluster else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TunedConfig:
        check_sections(data)
        config = TrialConfig(**knobs.read_result(data), workload_knobs=dict(data.get("workload_knobs") or {}))
        return cls(
            workload=data["workload"],
            config=config,
            device_type=data["device_type"],
            metrics=data["metrics"],
            hardware=data["hardware"],
            data=data["data"],
            search=data["search"],
            created=data["created"],
            autotune_version=data["autotune_version"],
            notes=list(data.get("notes") or []),
            cluster=cast(ClusterSection, dict(data.get("cluster") or {})),
        )

    def to_yaml(self, path_hint: str = "RESULT.yaml") -> str:
        shown = "".join(char if char.isprintable() else "?" for char in path_hint)  # a comment line stays one line
        return _HEADER.format(path=shown) + yamlio.dump_yaml(self.to_dict())

    @classmethod
    def from_yaml(cls, text: str) -> TunedConfig:
        import yaml

        return cls.from_dict(yaml.safe_load(text))


def write_config(tuned: TunedConfig, path: str | Path) -> Path:
    """Write the YAML atomically (temporary file + rename, the folder synced): the old file or the new one, never half.

    Raises:
        OutputError: the machine refused the write (a full disk, a read-only folder, a folder at the path); nothing
            is left behind and a result already at the path is untouched.
    """
    try:
        return yamlio.atomic_write_text(path, tuned.to_yaml(str(path)))
    except OSError as error:
        raise OutputError(f"cannot write the result {path} ({describe_os_error(error)})") from None


def load_config(path: str | Path) -> TunedConfig:
    """Read a result YAML written by autotune.

    Raises:
        UserError: the file is missing, not YAML, or not an autotune result.
    """
    data = yamlio.read_mapping(path, what="autotune result")
    try:
        tuned = TunedConfig.from_dict(data)
        tuned.winner, tuned.baseline  # noqa: B018 - typed now: a misspelled figure is refused here, not later
        return tuned
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise UserError(
            f"{path} is not an autotune result (missing or wrong field {error}); pass a file written by 'autotune run'"
        ) from None
