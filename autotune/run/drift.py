"""Drift detection: has the previous winner slowed down, and does a new configuration earn a rewrite of the YAML?

A rerun re-measures the previous winner (warm start) and compares the median of those measurements with the
throughput its result YAML recorded:

- slower by more than the threshold -> a regression, reported with what changed in the environment (torch, CUDA,
  driver, GPU, autotune versions); the CLI exits with REGRESSION_EXIT_CODE so that cron or CI notices;
- a new configuration faster than the previous winner (as re-measured now) by more than the threshold -> the new
  YAML is written;
- otherwise the YAML is left byte for byte as it is (no churn in users' configs).

The YAML keeps the throughput recorded when it was written, so a slow decline adds up night after night until it
crosses the threshold, and a regression is reported every night until it is fixed or the YAML is replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.search.candidates import Candidate
from autotune.search.settings import TuningOutcome
from autotune.search.warmstart import PreviousResult

__all__ = [
    "DEFAULT_THRESHOLD",
    "REGRESSION_EXIT_CODE",
    "EnvChange",
    "DriftVerdict",
    "environment_diff",
    "judge",
    "remeasured",
]

DEFAULT_THRESHOLD = 0.10
REGRESSION_EXIT_CODE = 3
# (label, key in the result's `hardware` section); the GPU and the autotune version are handled apart.
_VERSIONED = (
    ("torch", "torch_version"),
    ("CUDA", "cuda_version"),
    ("driver", "driver_version"),
    ("torchaudio", "torchaudio_version"),
    ("python", "python_version"),
    ("CPU", "cpu_model"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvChange:
    """One thing that differs between the previous result's environment and this run's."""

    name: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.name} {self.before} -> {self.after}"


@dataclass(frozen=True, kw_only=True, slots=True)
class DriftVerdict:
    """What a rerun concluded against the previous result."""

    write: bool  # write the new YAML
    regression: bool  # the previous winner slowed down past the threshold, or fails now
    summary: str  # one line
    threshold: float
    previous_path: Path | None = None
    recorded_rate: float | None = None  # the previous YAML's winner throughput
    remeasured_rate: float | None = None  # the same configuration, measured in this run
    winner_rate: float | None = None
    environment: tuple[EnvChange, ...] = ()

    def lines(self) -> list[str]:
        """The summary, and for a regression what changed in the environment (or that nothing did)."""
        lines = [self.summary]
        if self.regression:
            if self.environment:
                lines.append("environment changes since then: " + "; ".join(map(str, self.environment)))
            else:
                lines.append(
                    "no change in torch, CUDA, driver, GPU or autotune versions: look at the machine itself "
                    "(other jobs, clocks and thermals, the data's storage)"
                )
        return lines


def _gpus(hardware: Mapping[str, Any]) -> str:
    return ", ".join(str(gpu.get("name")) for gpu in hardware.get("gpus") or []) or "none"


def environment_diff(
    before: Mapping[str, Any], before_version: str, after: Mapping[str, Any], after_version: str
) -> tuple[EnvChange, ...]:
    """What differs between two results' `hardware` sections and autotune versions."""
    pairs = [(label, before.get(key), after.get(key)) for label, key in _VERSIONED]
    pairs += [("GPU", _gpus(before), _gpus(after)), ("autotune", before_version, after_version)]
    return tuple(
        EnvChange(name=name, before=str(old), after=str(new)) for name, old, new in pairs if str(old) != str(new)
    )


def remeasured(outcome: TuningOutcome) -> Candidate | None:
    """Every measurement in this run of the previous winner's configuration (as the baseline too, where it is the
    recipe's); None where it was not measured, or only stopped by the budget (nothing to compare)."""
    first = next((r for r in outcome.records if r.role == "previous" or r.previous_winner), None)
    if first is None:
        return None
    again = Candidate(config=first.config, records=[r for r in outcome.records if r.config == first.config])
    return again if again.values or again.condemned_by is not None else None


def judge(
    *,
    previous: PreviousResult | None,
    again: Candidate | None,
    winner: Candidate,
    threshold: float,
    hardware: dict[str, Any],
    version: str,
) -> DriftVerdict:
    """Compare this run with the previous result.

    Args:
        previous: the previous result YAML (None: nothing to compare, the new YAML is written).
        again: the previous winner as re-measured in this run (None when it was not: interrupted, or outside the
            current space; then only a winner faster than the recorded figure by the threshold is written).
        winner: this run's winner.
        threshold: fraction, e.g. 0.10.
        hardware, version: this run's environment, for the diff.
    """
    if previous is None:
        return DriftVerdict(write=True, regression=False, summary="no previous result to compare", threshold=threshold)
    recorded, path = previous.samples_per_second, previous.path
    common: dict[str, Any] = {
        "threshold": threshold,
        "previous_path": path,
        "recorded_rate": recorded,
        "winner_rate": winner.median,
        "environment": environment_diff(previous.tuned.hardware, previous.tuned.autotune_version, hardware, version),
    }
    old = previous.tuned.config.short()
    if again is None:
        write = winner.median > recorded * (1 + threshold)
        reason = f"{winner.config.short()} at {winner.median:,.1f} samples/s vs {recorded:,.1f} recorded"
        summary = f"previous winner {old} was not re-measured; " + (
            f"writing {path}: {reason}" if write else f"kept {path} unchanged: {reason}"
        )
        return DriftVerdict(write=write, regression=False, summary=summary, **common)
    failed = again.condemned_by
    if failed is not None:
        summary = f"regression: the previous winner {old} now fails ({failed.status}: {failed.reason}); writing {path}"
        return DriftVerdict(write=True, regression=True, summary=summary, **common)
    now, change = again.median, again.median / recorded - 1
    regression = change < -threshold
    gain = winner.median / now - 1
    write = winner.config != again.config and gain > threshold
    if regression:
        summary = (
            f"regression: the previous winner {old} now runs at {now:,.1f} samples/s, {-change:.1%} below the "
            f"{recorded:,.1f} recorded on {previous.tuned.created[:10]} (threshold {threshold:.0%})"
        )
    elif write:
        summary = (
            f"new winner {winner.config.short()} is {gain:.1%} faster than the previous winner {old} re-measured now "
            f"({winner.median:,.1f} vs {now:,.1f} samples/s): writing {path}"
        )
    else:
        summary = (
            f"kept {path} unchanged: the previous winner {old} re-measured at {now:,.1f} samples/s "
            f"({change:+.1%} vs recorded), and nothing beats it by more than {threshold:.0%}"
        )
    if regression and again.spread_fraction > threshold:
        # A nightly on a busy node must not cry wolf unannounced; the verdict stands (a real regression must surface).
        summary += (
            f"; its windows tonight spread {again.spread_fraction:.0%}, more than the threshold, so confirm with a "
            "rerun on a quiet machine"
        )
    if regression:
        summary += (
            f"; {winner.config.short()} is {gain:.1%} faster now: writing {path}"
            if write
            else f"; kept {path} unchanged (nothing beats the previous winner by more than {threshold:.0%} now)"
        )
    return DriftVerdict(write=write, regression=regression, remeasured_rate=now, summary=summary, **common)
