"""The GPU proof's record: one StepResult per step (passed or not, with what it measured), and the markdown report
committed under benchmarks/results/ with the device named."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune import yamlio

__all__ = ["NOTHING_PROVEN", "ProofReport", "StepResult"]

NOTHING_PROVEN = "no CUDA device: nothing proven"


@dataclass(kw_only=True, slots=True)
class StepResult:
    """What one proof step did.

    Attributes:
        name: the step's registry name.
        title: what it proves, one line.
        passed: True or False; None when it never ran (no time left).
        numbers: what it measured, names with units (`_s`, `_bytes`, `_tflops`, `_fraction`).
        notes: how to read the numbers, what was compared with what.
        error: why it failed, when it raised, timed out or crashed.
        seconds: wall time of the step.
    """

    name: str
    title: str
    passed: bool | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        return {True: "pass", False: "FAIL", None: "not run"}[self.passed]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        return cls(**data)


def _number(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{key}={_number(item)}" for key, item in value.items())
    return str(value)


@dataclass(kw_only=True, slots=True)
class ProofReport:
    """The whole proof: where it ran and every step's result, in order."""

    device: str  # "NVIDIA H100 80GB HBM3, driver 580.159.04" or why there was none
    environment: dict[str, Any] = field(default_factory=dict)  # torch, CUDA, cuDNN, NCCL, autotune versions
    steps: list[StepResult] = field(default_factory=list)
    started: str = ""
    seconds: float = 0.0
    time_limit_s: float = 0.0
    nothing_proven: bool = False

    @property
    def passed(self) -> bool:
        return not self.nothing_proven and bool(self.steps) and all(step.passed for step in self.steps)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def verdict_line(self) -> str:
        if self.nothing_proven:
            return f"{NOTHING_PROVEN} ({self.device})"
        counts = {outcome: sum(step.outcome == outcome for step in self.steps) for outcome in ("pass", "FAIL")}
        skipped = len(self.steps) - counts["pass"] - counts["FAIL"]
        line = f"GPU proof on {self.device}: {counts['pass']} of {len(self.steps)} steps passed"
        if counts["FAIL"]:
            line += f", {counts['FAIL']} failed ({', '.join(s.name for s in self.steps if s.passed is False)})"
        if skipped:
            line += f", {skipped} not run (time limit)"
        return line + f" in {self.seconds:.0f} s"

    def to_markdown(self) -> str:
        lines = [
            "# autotune GPU proof",
            "",
            f"- device: {self.device}",
            *(f"- {key}: {value}" for key, value in self.environment.items()),
            f"- started: {self.started}; took {self.seconds:.0f} s of a {self.time_limit_s:.0f} s limit",
            f"- verdict: {self.verdict_line()}",
            "",
            "Produced by `autotune doctor --gpu-proof`; every number below was measured in this run.",
            "",
            "| step | result | proves | s |",
            "| --- | --- | --- | --- |",
        ]
        lines += [f"| {s.name} | {s.outcome} | {s.title} | {s.seconds:.0f} |" for s in self.steps]
        for step in self.steps:
            lines += ["", f"## {step.name}: {step.outcome}", "", step.title, ""]
            if step.error:
                lines += [f"**error**: {step.error}", ""]
            lines += [f"- `{key}`: {_number(value)}" for key, value in step.numbers.items()]
            lines += [f"- note: {note}" for note in step.notes]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProofReport:
        fields = {key: value for key, value in data.items() if key != "passed"}
        fields["steps"] = [StepResult.from_dict(step) for step in fields.get("steps", [])]
        return cls(**fields)

    def write(self, path: Path) -> None:
        """The markdown at `path` and the same record as JSON beside it, each written atomically."""
        yamlio.atomic_write_text(path, self.to_markdown())
        yamlio.atomic_write_text(path.with_suffix(".json"), json.dumps(self.to_dict(), indent=2, default=str) + "\n")
