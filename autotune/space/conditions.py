"""Conditions as data: when a knob of a search space exists (`when: {num_workers: {at_least: 1}}`).

A condition's key is `device` or an earlier parameter; its value is a scalar (equals), a list (one of), or a mapping
with `at_least`, `at_most`, `equals` or `one_of`. `check_when` validates one when a space is loaded, so that a rule
comparing a number with text fails there, in one line, rather than in the middle of a search; `holds` evaluates it.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.errors import SpaceError

__all__ = ["CONDITION_OPS", "check_rule", "check_when", "holds"]

CONDITION_OPS = {"at_least", "at_most", "equals", "one_of"}


def check_when(when: Any, earlier: dict[str, bool], where: str) -> dict[str, Any]:
    """Validate a knob's `when`; `earlier` maps each earlier parameter to whether all its values are numbers."""
    if not isinstance(when, dict):
        raise SpaceError(f"{where}: 'when' must be a mapping of device or an earlier parameter to a condition")
    for key, rule in when.items():
        if key != "device" and key not in earlier:
            raise SpaceError(f"{where}: 'when' refers to {key!r}, which is neither 'device' nor an earlier parameter")
        if isinstance(rule, dict) and (not rule or set(rule) - CONDITION_OPS):
            raise SpaceError(f"{where}: condition on {key!r} may use only {', '.join(sorted(CONDITION_OPS))}")
        check_rule(key, rule, where)
        bounded = isinstance(rule, dict) and bool({"at_least", "at_most"} & set(rule))
        if bounded and not earlier.get(key, False):
            raise SpaceError(f"{where}: condition on {key!r} uses at_least/at_most, but {key!r} is not a number")
    return dict(when)


def check_rule(key: str, rule: Any, where: str) -> None:
    """A condition's operands: bounds are finite numbers, one_of a non-empty list, every value a scalar (a rule that
    compares a number with text would raise in the middle of a search, not here)."""
    operands = rule if isinstance(rule, dict) else {"one_of" if isinstance(rule, list) else "equals": rule}
    for op, operand in operands.items():
        values = operand if op == "one_of" else [operand]
        if op == "one_of" and (not isinstance(operand, list) or not operand):
            raise SpaceError(f"{where}: condition on {key!r}: one_of needs a non-empty list of values")
        for value in values:
            bound = op in ("at_least", "at_most")
            finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if bound and not finite:
                raise SpaceError(f"{where}: condition on {key!r}: {op} needs a finite number, got {value!r}")
            if not isinstance(value, (str, int, float)) or (isinstance(value, float) and not math.isfinite(value)):
                raise SpaceError(f"{where}: condition on {key!r}: {value!r} is not a single number, word or flag")


def holds(value: Any, rule: Any) -> bool:
    """Whether a value satisfies a rule that check_when accepted."""
    if isinstance(rule, list):
        return value in rule
    if not isinstance(rule, dict):
        return value == rule
    if value is None:
        return False
    checks = {
        "at_least": lambda bound: value >= bound,
        "at_most": lambda bound: value <= bound,
        "equals": lambda expected: value == expected,
        "one_of": lambda options: value in options,
    }
    return all(checks[op](arg) for op, arg in rule.items())
