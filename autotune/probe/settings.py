"""What the parent tells the probe inside a training command: where to write, how to time, which knobs to apply."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.trial.spec import TimingSettings
from autotune.yamlio import from_fields

__all__ = ["PROBE_ENV", "PLAN_SUFFIX", "ProbeSettings", "bootstrap_dir"]

PROBE_ENV = "AUTOTUNE_PROBE"  # the settings file's path; the probe does nothing in a process without it
PLAN_SUFFIX = ".plan"  # beside the result: rank 0's window edges (the step numbers every rank starts and ends at)
# The DataLoader arguments the probe can set itself when the user asks (--apply): they reach DataLoader.__init__.
APPLICABLE = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


def bootstrap_dir() -> Path:
    """The folder whose sitecustomize.py starts the probe; put first on the command's PYTHONPATH."""
    return Path(__file__).resolve().parent / "bootstrap"


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeSettings:
    """One trial's instructions to the probe, as JSON in the file PROBE_ENV names."""

    result_path: str  # rank 0 writes the trial's result here, rank R beside it (trial/spec.py rank_result_path)
    timing: TimingSettings = field(default_factory=TimingSettings)
    device_type: str = "cpu"  # "cuda": window edges are synchronised
    # Knob values the probe sets in the training itself (APPLICABLE only): the user asked autotune to apply them.
    apply: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["timing"] = self.timing.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeSettings:
        data = dict(data)
        if "timing" in data:
            data["timing"] = TimingSettings.from_dict(data["timing"])
        return from_fields(cls, data)

    @classmethod
    def from_environment(cls) -> ProbeSettings | None:
        """This process's settings, or None where no probe was asked for (PROBE_ENV unset)."""
        from autotune import yamlio

        path = os.environ.get(PROBE_ENV)
        return cls.from_dict(yamlio.read_json(path)) if path else None
