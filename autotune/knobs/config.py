"""TrialConfig: one point of the search, a typed field per declared knob, the value every layer passes around."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autotune.knobs import compile_modes
from autotune.knobs import declarations as knobs
from autotune.yamlio import from_fields

__all__ = ["TrialConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialConfig:
    """One point of the search: DataLoader, precision and thread settings for one training device.

    One field per knob declared in declarations.py (tests/knobs/test_knobs.py holds them equal), plus the workload's
    own.
    """

    per_device_batch_size: int
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    in_order: bool = True  # DataLoader's own default; False hands over whichever worker's batch is ready (torch 2.6+)
    precision: str = "fp32"  # one of precision.PRECISIONS
    optimizer_impl: str = "default"  # the recipe's optimizer as torch builds it (optimizer_kernels.py)
    activation_checkpointing: bool | None = None  # None: the recipe's own (checkpointing.py)
    cudnn_benchmark: bool = True
    intra_op_threads: int | None = None
    world_size: int = 1
    grad_accum_steps: int = 1
    preload_audio: bool = False  # decode the corpus into RAM once, before the DataLoader starts (data/preload.py)
    feature_device: str | None = None  # workers | device; None: where the recipe computes them (feature_device.py)
    compile: str = compile_modes.OFF  # torch.compile of the model's modules (compile_modes.py); off: eager
    workload_knobs: dict[str, Any] = field(default_factory=dict)  # the workload's own knobs (Workload.knobs)

    def __post_init__(self) -> None:
        # DataLoader rejects these without workers; normalising here keeps equal configs equal.
        if self.num_workers == 0:
            for name in knobs.WORKER_KNOBS:
                object.__setattr__(self, name, _FIELD_DEFAULTS[name])

    @property
    def global_batch_size(self) -> int:
        return self.per_device_batch_size * self.world_size * self.grad_accum_steps

    @classmethod
    def from_params(
        cls, params: dict[str, Any], *, world_size: int = 1, workload_knobs: tuple[str, ...] = ()
    ) -> TrialConfig:
        """Build from the flat parameter dict a search space suggests; `workload_knobs` names the workload's own."""
        core = {key: value for key, value in params.items() if key not in workload_knobs}
        own = {key: value for key, value in params.items() if key in workload_knobs}
        return from_fields(cls, {**core, "world_size": world_size, "workload_knobs": own})

    @property
    def extra(self) -> dict[str, Any]:
        """The workload's knobs under their earlier name, for code written against older results (load_config).

        A compatibility shim: it goes in autotune 0.2, with `extra` in from_dict and declarations.flat_values."""
        return self.workload_knobs

    def knob_values(self) -> dict[str, Any]:
        """The declared knobs' values by name (knobs.NAMES; the workload's own are in `workload_knobs`)."""
        return {name: getattr(self, name) for name in knobs.NAMES}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        # A configuration stored before the workload's knobs had their name (a trial's attribute): read until 0.2.
        if "extra" in data:
            data = {**{key: value for key, value in data.items() if key != "extra"}, "workload_knobs": data["extra"]}
        return from_fields(cls, data)

    def short(self) -> str:
        """A compact human description, e.g. 'bs=64 w=4 pf=2 pin bf16': each knob's word (knobs/declarations.py), then
        the workload's knobs."""
        words = knobs.trial_words(self.knob_values())
        return " ".join(words + [f"{key}={value}" for key, value in self.workload_knobs.items()])


# A knob DataLoader takes only with workers reads as its field's default without them (knobs.WORKER_KNOBS).
_FIELD_DEFAULTS = {item.name: item.default for item in fields(TrialConfig)}
