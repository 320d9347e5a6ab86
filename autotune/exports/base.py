"""What every export shares: the Export record, the target registry and the view of a result exporters read."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.errors import UserError
from autotune.results import TunedConfig
from autotune.trial.spec import TrialConfig

__all__ = ["Export", "ExportContext", "Exporter", "TARGETS", "register", "export"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """A paste-ready snippet for one training framework, with plain notes on what it cannot express."""

    target: str
    yaml_text: str | None = None  # config override, valid YAML
    python_text: str | None = None  # Python to paste (Lightning)
    command: str | None = None  # launch command line
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        """What `autotune export` prints: each part under a '# ...' header, notes as comment lines."""
        sections = [f"# autotune export for {self.target}"]
        if self.yaml_text is not None:
            sections.append("# config override (YAML): merge into your training config\n" + self.yaml_text.rstrip())
        if self.python_text is not None:
            sections.append("# Python: paste into your training script\n" + self.python_text.rstrip())
        if self.command is not None:
            sections.append("# command\n" + self.command.rstrip())
        if self.notes:
            sections.append("# notes\n" + "\n".join(f"# - {note}" for note in self.notes))
        return "\n\n".join(sections) + "\n"


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportContext:
    """A tuned result as exporters read it, for a given number of devices."""

    tuned: TunedConfig
    world_size: int

    @property
    def config(self) -> TrialConfig:
        return self.tuned.config

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def step_batch_size(self) -> int:
        """Samples per forward/backward across all devices (one micro-step, before accumulation)."""
        return self.config.per_device_batch_size * self.world_size

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step across all devices."""
        return self.step_batch_size * self.config.grad_accum_steps

    @property
    def model_name(self) -> str:
        return str(self.tuned.workload.get("name") or "model")

    @property
    def on_cuda(self) -> bool:
        return self.tuned.device_type == "cuda"

    @property
    def max_frames_in_batch(self) -> int | None:
        """The dynamic-batching budget (frames per device batch) when the result was tuned with one."""
        frames = self.config.extra.get("max_frames_in_batch")
        return int(frames) if frames else None

    def loader_extras(self) -> dict[str, Any]:
        """prefetch_factor / persistent_workers: DataLoader accepts them only with workers; unset means its default."""
        if self.config.num_workers == 0:
            return {}
        extras: dict[str, Any] = {}
        if self.config.prefetch_factor is not None:
            extras["prefetch_factor"] = self.config.prefetch_factor
        extras["persistent_workers"] = self.config.persistent_workers
        return extras

    def env_prefix(self) -> str:
        threads = self.config.intra_op_threads
        return f"OMP_NUM_THREADS={threads} " if threads is not None else ""

    def fp32_defaults_note(self, framework: str) -> str:
        return (
            f"autotune measured fp32 as strict IEEE float32 (TF32 off in matmuls and cuDNN); {framework} leaves "
            "torch's defaults, under which cuDNN convolutions may still use TF32 on Ampere and newer GPUs "
            "(torch.backends.cudnn.allow_tf32 defaults to True): at least as fast, very slightly less exact"
        )

    def common_notes(self) -> tuple[str, ...]:
        notes = []
        measured = self.config.world_size
        if self.world_size != measured:
            notes.append(
                f"Measured with world_size={measured}; exported for {self.world_size} device(s) with the per-device "
                f"settings kept (per_device_batch_size={self.config.per_device_batch_size}, global batch "
                f"{self.global_batch_size}): throughput on {self.world_size} device(s) was not measured"
            )
        if self.config.intra_op_threads is not None:
            notes.append(
                f"intra_op_threads={self.config.intra_op_threads} was tuned: set OMP_NUM_THREADS="
                f"{self.config.intra_op_threads} for every training process (torchrun sets 1 when it starts several "
                "processes and OMP_NUM_THREADS is unset)"
            )
        if not self.on_cuda:
            notes.append(
                f"This result was measured on {self.tuned.device_type}; on a GPU machine re-run autotune there, since "
                "batch size, workers and precision trade off differently"
            )
        return tuple(notes)


Exporter = Callable[[ExportContext], Export]

TARGETS: dict[str, Exporter] = {}


def register(name: str) -> Callable[[Exporter], Exporter]:
    """Decorator: file an exporter under its CLI name."""

    def decorate(exporter: Exporter) -> Exporter:
        if name in TARGETS:
            raise ValueError(f"export target {name!r} registered twice")
        TARGETS[name] = exporter
        return exporter

    return decorate


def export(tuned: TunedConfig, target: str, *, world_size: int | None = None) -> Export:
    """A paste-ready snippet of a tuned result for one training framework.

    Args:
        tuned: the result, e.g. from autotune.load_config.
        target: a key of TARGETS ("3d-speaker", "wenet", "speechbrain", "espnet", "lightning").
        world_size: devices to launch on; default the world_size the result was measured with. Per-device
            settings are kept, so global batch sizes scale with it.

    Returns:
        The Export; its render() is what `autotune export` prints.

    Raises:
        UserError: unknown target (the message lists the valid ones), world_size below 1, or a precision this
            version does not know.
    """
    if target not in TARGETS:
        raise UserError(f"unknown export target {target!r}; choose one of {', '.join(sorted(TARGETS))}")
    if world_size is not None and world_size < 1:
        raise UserError(f"--world-size must be 1 or more, got {world_size}")
    if tuned.config.precision not in PRECISIONS:
        raise UserError(
            f"result precision {tuned.config.precision!r} is not one of {', '.join(PRECISIONS)}; pass a file written "
            "by 'autotune run'"
        )
    context = ExportContext(tuned=tuned, world_size=world_size or tuned.config.world_size)
    result = TARGETS[target](context)
    return dataclasses.replace(result, notes=result.notes + context.common_notes())
