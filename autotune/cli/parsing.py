"""Turning the command line's text into values: durations, workload options and the executor.

Kept apart from the commands so that they can be tested and reused without typer, and free of heavy imports so that
`autotune --help` stays fast.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from autotune.errors import UserError
from autotune.trial.run_length import RunLength

if TYPE_CHECKING:
    from autotune.trial.slurm import SlurmSettings

__all__ = [
    "NO_BUDGET",
    "EXECUTORS",
    "parse_budget",
    "parse_duration",
    "parse_executor",
    "parse_run_length",
    "parse_workload_options",
]

NO_BUDGET = ("none", "off")  # --budget none: only --trials limits the run
EXECUTORS = ("local", "slurm")


def parse_duration(text: str) -> float:
    """'90s', '15m', '1h30m' or a plain number of seconds -> seconds (never NaN or infinite: those do not match)."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    if not text or match is None:
        raise UserError(f"cannot read duration {text!r}; write it like 90s, 15m or 1h30m")
    hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def parse_budget(text: str | None) -> float | None:
    """--budget: a duration, or 'none' for no budget. An empty value is an error, not a silent 'no budget'."""
    if text is None or text.strip().lower() in NO_BUDGET:
        return None
    if not text.strip():
        raise UserError("--budget is empty; write it like 15m or 1h, or none for no budget")
    return parse_duration(text)


def parse_workload_options(pairs: list[str] | None, crop_seconds: float | None) -> dict[str, object]:
    """`--option KEY=VALUE` pairs (and --crop-seconds) as workload options; a VALUE that reads as JSON (4, 0.5,
    true, "text") takes that type, anything else stays a string. The runner rejects keys the workload lacks."""
    options: dict[str, object] = {} if crop_seconds is None else {"crop_s": crop_seconds}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--option {pair!r} is not KEY=VALUE; write it like --option augment_copies=4")
        try:
            options[key.strip()] = json.loads(value)
        except (ValueError, RecursionError):  # not JSON (or nested past Python's stack): the text as typed
            options[key.strip()] = value
    return options


def parse_executor(
    executor: str, partition: str | None, options: list[str] | None, pin_wait: str | None = None
) -> SlurmSettings | None:
    """--executor and its --slurm-* options: None for local trials, the SLURM settings for slurm. The cluster itself
    is checked later, with the other inputs (runner.prepare: trial/slurm.py check_slurm)."""
    name = executor.strip().lower()
    if name not in EXECUTORS:
        raise UserError(f"--executor {executor!r}: unknown; use one of {', '.join(EXECUTORS)}")
    if name == "local":
        flags = (("--slurm-partition", partition), ("--slurm-option", options), ("--slurm-pin-wait", pin_wait))
        given = [flag for flag, value in flags if value]
        if given:
            raise UserError(f"{' and '.join(given)} apply to SLURM trials only; add --executor slurm")
        return None
    from autotune.trial.slurm import SlurmSettings

    try:
        pin_wait_s = None if pin_wait is None else parse_duration(pin_wait)
    except UserError as error:
        raise UserError(f"--slurm-pin-wait: {error}") from None
    return SlurmSettings(partition=partition, options=parse_slurm_options(options), pin_wait_s=pin_wait_s)


def parse_slurm_options(pairs: list[str] | None) -> dict[str, Any]:
    """`--slurm-option KEY=VALUE` pairs: integers and true/false take that type (time=30, exclusive=false); keys
    may be written with dashes as sbatch spells them (cpus-per-task) or underscores as submitit does."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if not sep or not key or not value:
            raise UserError(f"--slurm-option {pair!r} is not KEY=VALUE; write it like --slurm-option mem=64G")
        options[key] = (
            int(value)
            if value.isascii() and value.isdigit()
            else {"true": True, "false": False}.get(value.lower(), value)
        )
    return options


def parse_run_length(text: str) -> RunLength:
    """--run-length: '3ep' / '3 epochs' / '3' (epochs of the data) or a duration '12h', '90m', '1h30m' (hours).

    Raises:
        UserError: anything else, or a length that is not positive.
    """
    cleaned = text.strip().lower()
    epochs = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:ep|epoch|epochs)?", cleaned)
    try:
        if epochs is not None:
            return RunLength(epochs=float(epochs.group(1)))
        return RunLength(epochs=None, hours=parse_duration(cleaned) / 3600.0)
    except (UserError, ValueError):
        raise UserError(
            f"cannot read --run-length {text!r}; write epochs like 3ep (the default is 1ep, one epoch of the data) "
            "or a training time like 12h or 90m, greater than zero"
        ) from None
