"""Warm start: a rerun first re-measures the previous winner and its best neighbours, then searches less.

The previous winner is the result YAML at the output path when it comes from this same study (same model, data and
hardware, same workload options), else the study's best feasible configuration. Its neighbours are the next best
configurations the study has measured. They are measured right after the baseline (a previous winner that is the
baseline's configuration is not measured twice), and the search that follows gets `fraction` of the trials and of the
budget (never more than the user's `--trials` and `--budget`, and never less budget than the baseline, the points, a
search trial and two confirmations need at the wall times the study recorded).

Example::

    warm = plan_warm_start(study, out_path=Path("results/cam++/cpu-x2-cec72d5a08.yaml"), study_name=name,
                           space=space, options=options, settings=settings)
    Tuner(..., settings=warm.settings, warm_start=warm.trials())
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune import space as space_module
from autotune import storage, yamlio
from autotune.errors import UserError
from autotune.knobs.config import TrialConfig
from autotune.result.tuned_config import TunedConfig, load_config
from autotune.search.candidates import config_params
from autotune.search.settings import TunerSettings
from autotune.space.fit import contains

__all__ = ["PreviousResult", "WarmPoint", "WarmStart", "plan_warm_start", "read_previous"]

logger = logging.getLogger(__name__)

DEFAULT_NEIGHBOURS = 2
# Trials a warm-started run needs besides the baseline and its points: one search trial and two confirmations.
WARM_EXTRA_TRIALS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class PreviousResult:
    """The result YAML a rerun compares itself with."""

    path: Path
    tuned: TunedConfig

    @property
    def samples_per_second(self) -> float:
        return float(self.tuned.winner.samples_per_second or 0.0)

    def describe(self) -> str:
        return f"{self.path} ({self.tuned.created[:10]}, {self.samples_per_second:,.1f} samples/s)"


@dataclass(frozen=True, kw_only=True, slots=True)
class WarmPoint:
    """One configuration to re-measure before the search."""

    role: str  # "previous" (the winner to re-check) | "warm" (a neighbour)
    config: TrialConfig
    params: dict[str, Any]
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class WarmStart:
    """What a rerun re-measures first, and the smaller search after it."""

    previous: PreviousResult | None
    points: tuple[WarmPoint, ...]
    settings: TunerSettings  # trimmed when there are points, else the user's
    requested: TunerSettings
    notes: tuple[str, ...] = ()

    def trials(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """(role, parameters) for Tuner(warm_start=...)."""
        return tuple((point.role, dict(point.params)) for point in self.points)

    def describe(self) -> list[str]:
        """Human lines: what the run warm-starts from and how much it searches after."""
        lines = list(self.notes)
        if not self.points:
            return lines
        for index, point in enumerate(self.points):
            lead = "  and " if index else "warm start: re-measuring "
            what = "the previous winner " if point.role == "previous" else "its neighbour " if index else ""
            lines.append(f"{lead}{what}{point.config.short()} from {point.source}")
        budget = (
            f", budget {self.requested.budget_s / 60:.1f} -> {self.settings.budget_s / 60:.1f} min"
            if self.requested.budget_s and self.settings.budget_s and self.settings.budget_s != self.requested.budget_s
            else ""
        )
        lines.append(f"  then a shorter search: {self.requested.trials} -> {self.settings.trials} trials{budget}")
        return lines


def read_previous(out_path: Path, study_name: str, options: dict[str, Any]) -> tuple[PreviousResult | None, str]:
    """The result YAML at the output path when a rerun can compare with it; else None and why not ('' if absent)."""
    if not out_path.exists():
        return None, ""
    try:
        tuned = load_config(out_path)
    except UserError as error:
        return None, f"previous result not used: {error}"
    if tuned.search.get("study_name") != study_name:
        other = tuned.search.get("study_name")
        return None, f"previous result {out_path} is from another study ({other}); not compared"
    if tuned.workload.get("options") != yamlio.plain(options):
        return None, f"previous result {out_path} was measured with other workload options; not compared"
    if not tuned.winner.samples_per_second:
        return None, f"previous result {out_path} records no throughput; not compared"
    return PreviousResult(path=out_path, tuned=tuned), ""


def plan_warm_start(
    study: optuna.Study,
    *,
    out_path: Path,
    study_name: str,
    space: space_module.SearchSpace,
    options: dict[str, Any],
    settings: TunerSettings,
    enabled: bool = True,
    fraction: float = 0.5,
    neighbours: int = DEFAULT_NEIGHBOURS,
) -> WarmStart:
    """Read the previous result and the study; choose what to re-measure first and trim the search.

    Args:
        study: the (possibly continued) study of this run.
        out_path: where the result YAML goes (and where the previous one is).
        study_name: this run's study; a YAML from another study is not compared.
        space: this run's space; a configuration it cannot express is not re-measured (and said so).
        options: the workload options of this run.
        settings: the user's settings; `fraction` of their trials and budget remain for a warm-started run.
        enabled: False measures nothing first (the previous result is still read, for the keep-or-write decision).
    """
    previous, note = read_previous(out_path, study_name, options)
    notes = [note] if note else []
    if not enabled:
        return WarmStart(previous=previous, points=(), settings=settings, requested=settings, notes=tuple(notes))
    head: list[WarmPoint] = []
    if previous is not None:
        config = previous.tuned.config
        reason = _misfit(space, config_params(config, space))
        if reason:  # then nothing is "previous": the drift check must not compare another configuration
            notes.append(f"warm start skips the previous winner {config.short()} ({reason})")
        else:
            source = f"previous result {previous.describe()}"
            head.append(WarmPoint(role="previous", config=config, params=config_params(config, space), source=source))
    wanted = neighbours + (0 if previous is not None else 1)
    found = _fitting_study_configs(study, space, wanted, skip=head[0].config if head else None, notes=notes)
    if previous is None and found:
        found[0] = dataclasses.replace(found[0], role="previous")  # the study's best stands in for the winner
    points = head + found
    need_s = _warm_need_s(study, points)
    trimmed = _trim(settings, len(points), fraction, need_s) if points else settings
    if points and settings.budget_s and trimmed.budget_s == settings.budget_s and fraction < 1:
        notes.append(
            f"warm start keeps the whole --budget {settings.budget_s / 60:.1f} min: {fraction:g} of it would not hold "
            f"the baseline, the {len(points)} re-measured configuration(s), a search trial and two confirmations "
            f"(~{need_s / 60:.1f} min at the trial times this study recorded)"
        )
    return WarmStart(previous=previous, points=tuple(points), settings=trimmed, requested=settings, notes=tuple(notes))


def _fitting_study_configs(
    study: optuna.Study, space: space_module.SearchSpace, wanted: int, *, skip: TrialConfig | None, notes: list[str]
) -> list[WarmPoint]:
    """The study's best `wanted` feasible configurations that this space can express (misfits noted), as "warm"."""
    points: list[WarmPoint] = []
    for config, rate, number in _ranked_configs(study):
        if len(points) >= wanted:
            break
        if skip is not None and _key(config) == _key(skip):
            continue
        params = config_params(config, space)
        reason = _misfit(space, params)
        if reason:
            notes.append(f"warm start skips {config.short()} ({reason})")
            continue
        source = f"study trial #{number} ({rate:,.1f} samples/s)"
        points.append(WarmPoint(role="warm", config=config, params=params, source=source))
    return points


def _trim(settings: TunerSettings, n_points: int, fraction: float, need_s: float) -> TunerSettings:
    """`fraction` of the trials (enough for the baseline, the points and one search trial) and of the budget, where
    that fraction holds need_s (what the warm start itself needs, _warm_need_s); else as much as that, up to the whole
    budget: a short --budget cut by the fraction could leave room for the baseline alone (tests/search/test_budget.py
    replays such a nightly rerun)."""
    trials = min(settings.trials, max(math.ceil(settings.trials * fraction), n_points + 2))
    budget = settings.budget_s
    if budget:
        budget = min(budget, max(budget * fraction, need_s))
    return dataclasses.replace(settings, trials=trials, budget_s=budget)


def _warm_need_s(study: optuna.Study, points: list[WarmPoint]) -> float:
    """Seconds the warm start needs at the wall times the study recorded: the baseline (its own trials' time; it is
    usually the most expensive), each point (its configuration's), and a search trial and two confirmations at the
    median trial's. 0 when the study recorded no wall time."""
    walls: dict[str, list[float]] = {}
    baseline: list[float] = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        wall, config = (trial.user_attrs.get("result") or {}).get("wall_s"), trial.user_attrs.get("config")
        if not isinstance(wall, (int, float)) or wall <= 0:
            continue
        walls.setdefault(json.dumps(config, sort_keys=True), []).append(float(wall))
        if trial.user_attrs.get("role") == "baseline":
            baseline.append(float(wall))
    every = [wall for each in walls.values() for wall in each]
    if not every:
        return 0.0
    median = statistics.median(every)
    points_s = sum(statistics.median(walls.get(_key(point.config)) or [median]) for point in points)
    return statistics.median(baseline or [max(every)]) + points_s + WARM_EXTRA_TRIALS * median


def _key(config: TrialConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


def _ranked_configs(study: optuna.Study) -> list[tuple[TrialConfig, float, int]]:
    """Feasible configurations earlier runs measured, best median first: (config, median samples/s, best trial).
    Trials of runs still working on the study are left out: a second run started beside a first one on a fresh
    study would otherwise take the first one's trials for a previous run and warm-start (halving its budget)."""
    measured: dict[str, list[tuple[float, int, TrialConfig]]] = {}
    states = (optuna.trial.TrialState.COMPLETE,)
    concurrent = storage.live_owners(study)  # a run working on the study right now is no previous run
    for trial in study.get_trials(deepcopy=False, states=states):
        if storage.owner_key(trial.user_attrs.get("owner")) in concurrent:
            continue
        result, config = trial.user_attrs.get("result") or {}, trial.user_attrs.get("config")
        if result.get("status") != "ok" or not config or not trial.value:
            continue
        try:
            parsed = TrialConfig.from_dict(config)
        except (TypeError, ValueError) as error:  # written by an autotune whose knobs differ: not comparable
            logger.warning("the warm start leaves out trial %d of the study: %s", trial.number, error)
            continue
        measured.setdefault(_key(parsed), []).append((trial.value, trial.number, parsed))
    ranked = [
        (runs[0][2], statistics.median(value for value, _, _ in runs), max(runs)[1]) for runs in measured.values()
    ]
    return sorted(ranked, key=lambda item: -item[1])


def _misfit(space: space_module.SearchSpace, params: dict[str, Any]) -> str:
    """Why the space cannot express these parameters ('' when it can), checked the way suggest() walks it."""
    values: dict[str, Any] = {}
    for param in space.params:
        if not param.applies(values, space.device_type):
            continue
        value = params.get(param.name)
        if not contains(param.distribution, value):
            return f"{param.name}={value!r} is outside the current search space"
        values[param.name] = value
    for name, value in space.fixed.items():
        if name in params and params[name] != value:
            return f"{name}={params[name]!r} where the space fixes {value!r}"
    return ""
