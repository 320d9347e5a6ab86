"""The doctor's checks, in a plain dict keyed by name, filled by a decorator: a new check is one function.

A check takes the DoctorContext (a per-GPU check also the GpuHandle) and returns one Finding, built with ok(), info(),
warn() or fail(); the registry names it. A check that raises does not end the examination: its finding says that it
could not be made and why (the doctor runs on machines in states nobody planned for).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autotune.doctor.context import DoctorContext, DoctorRequest, prepare
from autotune.doctor.findings import DoctorReport, Finding, Verdict

__all__ = ["CHECKS", "Check", "check", "diagnose", "examine", "fail", "info", "ok", "warn"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Check:
    """A registered check: `run(context)`, or `run(context, gpu)` once per GPU when per_gpu."""

    name: str
    run: Callable[..., Finding]
    per_gpu: bool = False


CHECKS: dict[str, Check] = {}


def check(name: str, *, per_gpu: bool = False) -> Callable[[Callable[..., Finding]], Callable[..., Finding]]:
    """Decorator: file a check under `name`; the report lists findings in the order checks were registered."""

    def register(function: Callable[..., Finding]) -> Callable[..., Finding]:
        if name in CHECKS:
            raise ValueError(f"doctor check {name!r} registered twice")
        CHECKS[name] = Check(name, function, per_gpu)
        return function

    return register


def ok(value: str, **data: Any) -> Finding:
    return Finding(name="", value=value, verdict=Verdict.OK, data=data)


def info(value: str, fix: str = "", **data: Any) -> Finding:
    return Finding(name="", value=value, verdict=Verdict.INFO, fix=fix, data=data)


def warn(value: str, fix: str, **data: Any) -> Finding:
    return Finding(name="", value=value, verdict=Verdict.WARN, fix=fix, data=data)


def fail(value: str, fix: str, **data: Any) -> Finding:
    return Finding(name="", value=value, verdict=Verdict.FAIL, fix=fix, data=data)


def _run(name: str, function: Callable[..., Finding], *args: Any) -> Finding:
    try:
        finding = function(*args)
    except Exception as error:  # a machine in a state nobody planned for must not cost the other findings
        logger.debug("doctor check %s raised", name, exc_info=True)
        finding = warn(
            f"could not check: {type(error).__name__}: {error}".replace("\n", " "),
            "rerun with --verbose and report this as an autotune bug",
        )
    return replace(finding, name=name)


def _groups(checks: list[Check]) -> list[list[Check]]:
    """Consecutive per-GPU checks form one group, run GPU by GPU; every other check is a group of its own."""
    groups: list[list[Check]] = []
    for entry in checks:
        if entry.per_gpu and groups and groups[-1][0].per_gpu:
            groups[-1].append(entry)
        else:
            groups.append([entry])
    return groups


def examine(context: DoctorContext, checks: list[Check] | None = None) -> DoctorReport:
    """Run the checks (default: all registered) on a prepared context."""
    findings: list[Finding] = []
    for group in _groups(list(CHECKS.values()) if checks is None else checks):
        if not group[0].per_gpu:
            findings.append(_run(group[0].name, group[0].run, context))
            continue
        for gpu in context.nvml.devices:
            findings += [_run(f"gpu{gpu.index}.{entry.name}", entry.run, context, gpu) for entry in group]
    return DoctorReport(findings=tuple(findings))


def diagnose(request: DoctorRequest) -> DoctorReport:
    """Examine this machine for what the request's run needs.

    Raises:
        UserError: bad input (the CLI's exit code 2), before any check runs.
    """
    context = prepare(request)
    try:
        return examine(context)
    finally:
        context.close()
