"""What `autotune doctor` reports: one Finding per check (and per GPU), and the report that sums them up."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXIT_FAILED", "EXIT_OK", "Finding", "DoctorReport", "Verdict"]

EXIT_OK = 0
EXIT_FAILED = 1  # a check failed: something on this machine will break or invalidate a run


class Verdict(str, enum.Enum):
    """How much a finding matters before a long run.

    ok: nothing to do. info: worth knowing, costs nothing (or cannot be read: the value says why). warn: costs speed
    or makes measurements noisy. fail: will break a run or make its measurements wrong.
    """

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One check's answer.

    Attributes:
        name: the check's registry name, with the GPU for per-GPU checks, e.g. "torch.build" or "gpu0.ecc".
        value: what was found, one line ("unknown (NVML: Not Supported)" where it could not be read).
        verdict: ok, info, warn or fail.
        fix: one line saying what to do; empty when there is nothing to do.
        data: the raw figures behind the value, for --json (bytes, MHz, counts; names carry their units).
    """

    name: str
    value: str
    verdict: Verdict
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "verdict": self.verdict.value,
            "fix": self.fix,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            name=data["name"],
            value=data["value"],
            verdict=Verdict(data["verdict"]),
            fix=data.get("fix", ""),
            data=dict(data.get("data") or {}),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorReport:
    """Every finding of one `autotune doctor`, in the order the checks ran."""

    findings: tuple[Finding, ...]

    @property
    def exit_code(self) -> int:
        """0 when nothing fails, 1 when a check fails (warnings alone do not fail)."""
        return EXIT_FAILED if any(f.verdict is Verdict.FAIL for f in self.findings) else EXIT_OK

    def counts(self) -> dict[str, int]:
        counted = Counter(f.verdict.value for f in self.findings)
        return {verdict.value: counted.get(verdict.value, 0) for verdict in Verdict}

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [finding.to_dict() for finding in self.findings],
            "counts": self.counts(),
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DoctorReport:
        return cls(findings=tuple(Finding.from_dict(item) for item in data["findings"]))
