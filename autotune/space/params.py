"""One searched knob of a space file: its declared type and least value (from autotune/knobs/declarations.py), its
Optuna distribution built from YAML, and the checks of every value a space gives it (choices, fixed, baseline, seeds).
autotune.space.search_space assembles a SearchSpace from these; each check raises a SpaceError of one line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna.distributions as od

from autotune.errors import SpaceError
from autotune.knobs import declarations as knobs
from autotune.knobs import length_batching
from autotune.space.conditions import check_when, holds
from autotune.space.fit import resolve_auto

if TYPE_CHECKING:
    from autotune.machine.hardware import Hardware

__all__ = [
    "CORE_PARAMS",
    "MAXIMUM",
    "MINIMUM",
    "RECIPE_SETTINGS",
    "Param",
    "build_param",
    "check_fixed",
    "check_name",
    "check_seeds",
    "check_value",
    "check_values",
    "numeric_values",
]

# Every knob a space may search, with its type; a workload may add its own (Workload.knobs). Declared in
# knobs/declarations.py.
CORE_PARAMS: dict[str, type] = {knob.name: knob.type for knob in knobs.KNOBS if knob.space == "searched"}
# The least value a count knob may take: a batch of one, no workers, one thread.
MINIMUM: dict[str, int] = {
    knob.name: knob.minimum for knob in knobs.KNOBS if knob.space == "searched" and knob.minimum is not None
}
_DECLARED = {knob.name: knob for knob in knobs.KNOBS}
# The most a count knob's value may be: a fixed, baseline or seed value past it (a typo's batch of 10**12) is refused,
# not trained. A range may reach past it: the search measures what its sampler picks and learns where it fails.
MAXIMUM: dict[str, int] = {knob.name: knob.maximum for knob in knobs.KNOBS if knob.maximum is not None}
# Recipe settings a space may fix (in `fixed`, so for every configuration, the baseline included) but not search.
RECIPE_SETTINGS: dict[str, type] = {knob.name: knob.type for knob in knobs.KNOBS if knob.space == "fixed"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Param:
    """One searched knob: its Optuna distribution and the conditions under which it exists."""

    name: str
    distribution: od.BaseDistribution
    when: dict[str, Any] = field(default_factory=dict)

    def applies(self, values: dict[str, Any], device_type: str) -> bool:
        """Whether this knob exists given the values chosen so far."""
        context = dict(values, device=device_type)
        return all(holds(context.get(key), rule) for key, rule in self.when.items())


def check_name(name: Any, known: dict[str, Any], origin: str) -> None:
    if name not in known and name in length_batching.KNOBS:  # said why, not as an unknown name
        raise SpaceError(
            f"{origin}: {name} batches items by their length (the conformer's batch_type dynamic or bucket), and this "
            "workload's batches are not formed by length (fixed-length crops, or its recipe's own batching): remove it"
        )
    if name not in known:
        raise SpaceError(f"{origin}: unknown parameter {name!r}; valid ones are {', '.join(sorted(known))}")


def check_values(
    values: Any, known: dict[str, Any], origin: str, section: str, *, seed: bool = False
) -> dict[str, Any]:
    """A fixed, baseline or seed mapping: known knobs with values of their kind (a seed may also say `auto` for a
    count, or give a list of values in order of preference)."""
    if not isinstance(values, dict):
        raise SpaceError(f"{origin}: '{section}' must be a mapping of parameter name to value")
    for name, value in values.items():
        check_name(name, known, origin)
        where = f"{origin}: {section} {name}"
        if seed and isinstance(value, list):
            if not value:
                raise SpaceError(f"{where}: an empty list; give a value or a list of preferred values")
            for item in value:
                check_value(name, item, where, auto=True)
        else:
            check_value(name, value, where, auto=seed)
    return dict(values)


def check_value(name: str, value: Any, where: str, *, auto: bool = False) -> None:
    """One value of a knob (a choice, a fixed, baseline or seed value): a single number, word or flag of the knob's
    type, a known precision, not below a count's minimum. `auto` (the cores) is accepted for counts where allowed.

    Raises:
        SpaceError: one line naming the value and what the knob takes.
    """
    expected = CORE_PARAMS.get(name)
    if auto and value == "auto" and expected is int:
        return
    if not isinstance(value, (str, int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        raise SpaceError(f"{where}: {value!r} is not a single finite number, word or true/false")
    if expected is not None and not _is_type(value, expected):
        raise SpaceError(f"{where}: {value!r} is not a {expected.__name__}")
    choices = knobs.get(name).choices if name in CORE_PARAMS else ()
    if choices and value not in choices:
        raise SpaceError(f"{where}: unknown {name} {value!r}; use {', '.join(choices)}")
    if name in MINIMUM:
        assert not isinstance(value, str)  # every knob with a minimum is an int, so _is_type above let no word by
        if value < MINIMUM[name]:
            raise SpaceError(f"{where}: {value!r} is below the least {name} ({MINIMUM[name]})")
    if name in MAXIMUM and isinstance(value, int) and value > MAXIMUM[name]:
        raise SpaceError(f"{where}: {value!r} is above the most {name} autotune trains ({MAXIMUM[name]:,})")


def check_fixed(values: Any, known: dict[str, Any], origin: str) -> dict[str, Any]:
    fixed = check_values(values, {**known, **RECIPE_SETTINGS}, origin, "fixed")
    accumulation = fixed.get("grad_accum_steps", 1)
    if not _is_type(accumulation, int) or accumulation < 1:
        raise SpaceError(f"{origin}: fixed grad_accum_steps must be a whole number >= 1, got {accumulation!r}")
    return fixed


def check_seeds(raw: Any, known: dict[str, Any], origin: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise SpaceError(f"{origin}: 'seeds' must be a list of mappings of parameter name to value")
    return [check_values(entry, known, origin, "seeds", seed=True) for entry in raw]


def numeric_values(distribution: od.BaseDistribution) -> bool:
    """Whether every value of a distribution is a number (a condition may then bound it with at_least / at_most)."""
    if isinstance(distribution, od.CategoricalDistribution):
        return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in distribution.choices)
    return True


def build_param(name: str, spec: Any, hardware: Hardware, origin: str, earlier: dict[str, bool]) -> Param | None:
    where = f"{origin}: parameter {name!r}"
    if not isinstance(spec, dict) or "type" not in spec:
        raise SpaceError(f"{where} needs a mapping with 'type' (int, float or categorical)")
    spec = dict(spec)
    when = check_when(spec.pop("when", None) or {}, earlier, where)
    kind = spec.pop("type")
    distribution: od.BaseDistribution
    if kind == "categorical":
        distribution = _categorical(name, spec, hardware, where)
    elif kind in ("int", "float"):
        distribution = _numeric(name, kind, spec, hardware, where)
    else:
        raise SpaceError(f"{where}: unknown type {kind!r}; use int, float or categorical")
    # The device never changes within a study: a knob for another device is validated, then dropped here.
    if "device" in when and not holds(hardware.device_type, when.pop("device")):
        return None
    return Param(name=name, distribution=distribution, when=when)


def _categorical(name: str, spec: dict[str, Any], hardware: Hardware, where: str) -> od.CategoricalDistribution:
    if set(spec) != {"choices"} or not isinstance(spec["choices"], list) or not spec["choices"]:
        raise SpaceError(f"{where}: a categorical needs exactly a non-empty 'choices' list")
    choices = spec["choices"]
    for choice in choices:
        check_value(name, choice, f"{where}: choice")
    if len(set(map(repr, choices))) != len(choices):
        raise SpaceError(f"{where}: choices repeat a value")
    if name == "precision":
        choices = [c for c in choices if c in hardware.supported_precisions()]
    left = left_out(name, choices, hardware.device_type)
    choices = [choice for choice in choices if choice not in left]
    if not choices:
        raise SpaceError(f"{where}: none of the choices runs on this hardware ({hardware.describe()})")
    return od.CategoricalDistribution(choices)


def left_out(name: str, choices: list[Any], device_type: str) -> dict[Any, str]:
    """The choices of knob `name` the search leaves out on this device type, each with its note (Knob.left_out)."""
    knob = _DECLARED.get(name)
    if knob is None or knob.left_out is None:
        return {}
    return knob.left_out(choices, device_type)


def check_runs_here(fixed: dict[str, Any], device_type: str, origin: str) -> None:
    """Refuse a fixed value this torch and machine cannot run (Knob.unsupported), with the reason.

    Raises:
        SpaceError: one line naming the knob, its value and why.
    """
    for name, value in fixed.items():
        knob = _DECLARED.get(name)
        why = None if knob is None or knob.unsupported is None else knob.unsupported(value, device_type)
        if why is not None:
            shown = str(value).lower() if isinstance(value, bool) else repr(value)
            raise SpaceError(f"{origin}: fixed {name} {shown} cannot run here: {why}")


def _is_type(value: Any, expected: type) -> bool:
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _numeric(name: str, kind: str, spec: dict[str, Any], hardware: Hardware, where: str) -> od.BaseDistribution:
    allowed = {"low", "high", "step", "log"}
    if set(spec) - allowed or not {"low", "high"} <= set(spec):
        raise SpaceError(f"{where}: an {kind} needs 'low' and 'high' (optional 'step', 'log') and nothing else")
    expected = CORE_PARAMS.get(name)
    if expected is not None and expected is not int:
        raise SpaceError(f"{where}: takes {expected.__name__} values; search it as a categorical with choices")
    if expected is int and kind != "int":
        raise SpaceError(f"{where}: takes whole numbers; use type int")
    low, high = resolve_auto(spec["low"], hardware), resolve_auto(spec["high"], hardware)
    number = int if kind == "int" else (int, float)
    if not all(isinstance(v, number) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
        raise SpaceError(f"{where}: 'low' and 'high' must be finite {kind}s (or 'auto' for the CPU cores)")
    if low > high:
        raise SpaceError(f"{where}: low {low} is above high {high}")
    if name in MINIMUM and low < MINIMUM[name]:
        raise SpaceError(f"{where}: low {low} is below the least {name} ({MINIMUM[name]})")
    log, step = spec.get("log", False), spec.get("step")
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: 'log' must be true or false")
    if step is not None and not (isinstance(step, number) and not isinstance(step, bool) and 0 < step < math.inf):
        raise SpaceError(f"{where}: 'step' must be a positive {kind}")
    if log and step not in (None, 1):
        raise SpaceError(f"{where}: 'log' and 'step' cannot be combined")
    if log and low <= 0:
        raise SpaceError(f"{where}: 'log' needs low > 0")
    try:
        if kind == "int":
            return od.IntDistribution(low, high, log=log, step=int(step or 1))
        return od.FloatDistribution(float(low), float(high), log=log, step=step)
    except ValueError as error:
        raise SpaceError(f"{where}: {error}") from None
