"""Turning the command line's text into values: durations and workload options.

Kept apart from the commands so that they can be tested and reused without typer, and free of heavy imports so that
`autotune --help` stays fast.
"""

from __future__ import annotations

import json
import re

from autotune.errors import UserError

__all__ = ["NO_BUDGET", "parse_budget", "parse_duration", "parse_workload_options"]

NO_BUDGET = ("none", "off")  # --budget none: only --trials limits the run


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
        except ValueError:
            options[key.strip()] = value
    return options
