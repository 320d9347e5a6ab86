"""Measured trials and the choice among them: a configuration's repeated measurements, its noise and its safety,
and the winner chosen on medians (the safer among leaders measured within 1%)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import PRECISIONS
from autotune.trial import TrialResult

if TYPE_CHECKING:
    from autotune.space.search_space import SearchSpace

__all__ = [
    "TrialRecord",
    "Candidate",
    "pick_winner",
    "config_params",
    "config_key",
    "group_by_config",
    "leaders",
    "noise_variance",
    "pooled_noise",
    "weighted_logs",
    "SAFETY_PRICE",
    "CONTENDER_FRACTION",
]

# Safety is worth at most this share of measured throughput: a safer leader whose median is within it of the fastest's
# wins (pick_winner says why). Wider zones cost users real speed on average (see pick_winner).
SAFETY_PRICE = 0.01
# A configuration whose median is below this share of the best's cannot overtake it within a machine's noise
# (docs/how-it-measures.md, step 7): confirmation does not spend trials on it.
CONTENDER_FRACTION = 0.7
# Memory counts for safety in quarters of the device's capacity: filling most of a card is a risk on longer real
# batches, a few hundred MiB more of a large machine is none (docs/how-it-measures.md, step 7).
MEMORY_SAFETY_STEP = 0.25
_FALLBACK_MEMORY_STEP_BYTES = 2**28  # records without a capacity: 256 MiB steps (finer is noise)
_SAFETY_WORDS = ("less of the device's memory", "fewer workers", "higher precision")
# fp16 can overflow; fp32 cannot. Ordered as PRECISIONS: from the most to the least exact maths.
_PRECISION_RISK = {name: risk for risk, name in enumerate(PRECISIONS)}


@dataclass(kw_only=True, slots=True)
class TrialRecord:
    """One measured trial of this run."""

    number: int
    role: str  # baseline | previous | warm | seed | search | preload | confirm
    config: TrialConfig
    result: TrialResult
    # The configuration is a rerun's previous winner (the drift check's), whatever this record's role: a previous
    # winner that is the recipe's own configuration is measured once, as the baseline (search/tuner.py).
    previous_winner: bool = False
    # config_key(config), computed once: the search loop groups every record so far by it at each step
    # (group_by_config), and encoding it each time would make a long search quadratic in JSON encodings (a 528-point
    # grid: 1.1 million).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = config_key(self.config)

    @property
    def value(self) -> float:
        return self.result.samples_per_second or 0.0


@dataclass(kw_only=True, slots=True)
class Candidate:
    """A configuration and every measurement of it in this run."""

    config: TrialConfig
    records: list[TrialRecord]

    @property
    def feasible(self) -> bool:
        """Measured ok at least once, and nothing measured rules it out: a trial the budget stopped or the pruner
        cut says nothing about the configuration, so another measurement of it stands (trial.spec NEUTRAL_STATUSES)."""
        return bool(self.values) and self.condemned_by is None

    @property
    def condemned_by(self) -> TrialResult | None:
        """The first result that rules this configuration out (oom, error, erratic, ...), if any."""
        return next((record.result for record in self.records if record.result.condemns), None)

    @property
    def is_previous(self) -> bool:
        """A rerun's previous winner (always re-measured with the leaders: the drift check compares its median)."""
        return any(record.role == "previous" or record.previous_winner for record in self.records)

    @property
    def values(self) -> list[float]:
        return [record.value for record in self.records if record.result.feasible]

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    @property
    def spread_fraction(self) -> float:
        """(max - min) / median of the measurements: this machine's noise for this configuration."""
        values = self.values
        return (max(values) - min(values)) / self.median if len(values) > 1 and self.median else 0.0

    def safety_key(self) -> tuple[int, int, int]:
        """Smaller is safer: memory (in MEMORY_SAFETY_STEP of the device's capacity), then workers, then precision."""
        peak = max((record.result.peak_memory_bytes or 0) for record in self.records)
        capacities = [
            record.result.memory_capacity_bytes for record in self.records if record.result.memory_capacity_bytes
        ]
        memory = int(peak / min(capacities) / MEMORY_SAFETY_STEP) if capacities else peak // _FALLBACK_MEMORY_STEP_BYTES
        return memory, self.config.num_workers, _PRECISION_RISK.get(self.config.precision, 9)


def config_key(config: TrialConfig) -> str:
    """The configuration as one string (the JSON of to_dict(), built from the fields without to_dict's deep copy)."""
    return json.dumps({each.name: getattr(config, each.name) for each in fields(config)}, sort_keys=True)


def group_by_config(records: Iterable[TrialRecord]) -> dict[str, Candidate]:
    """Every measurement of each configuration together, by config_key, in order of first measurement."""
    candidates: dict[str, Candidate] = {}
    for record in records:
        candidates.setdefault(record.key, Candidate(config=record.config, records=[])).records.append(record)
    return candidates


def leaders(candidates: Iterable[Candidate], top_k: int) -> list[Candidate]:
    """The configurations confirmation re-measures: the top_k feasible ones by median that could still win
    (CONTENDER_FRACTION), and a rerun's previous winner (the drift check compares the median of its measurements, so
    it gets the same re-measurements as the leaders)."""
    ranked = sorted((c for c in candidates if c.feasible), key=lambda c: -c.median)
    contenders = [c for c in ranked if c.median >= CONTENDER_FRACTION * ranked[0].median]
    top = contenders[: max(1, top_k)]
    previous = [c for c in ranked if c not in top and c.is_previous]
    return top + previous


Estimates = dict[str, float] | None  # samples/s by config_key, pooled with neighbours' windows (search/pooling.py)


def score(candidate: Candidate, estimates: Estimates = None) -> float:
    """What a candidate is ranked by: its pooled estimate where there is one, else its median."""
    return estimates.get(config_key(candidate.config), candidate.median) if estimates else candidate.median


def weighted_logs(candidates: Sequence[Candidate]) -> list[list[tuple[float, float]]]:
    """Each candidate's feasible windows as (log samples/s, weight): a window counts by its length, in units of the
    median window among them, because a GPU window's noise is white
    (benchmarks/results/budget-lab/window_noise-h200.md), so a window four times as long is worth four; a record without
    a length counts as one. Windows differ in length in a long run's confirmation (confirmation.py)."""
    feasible = [[r for r in c.records if r.result.feasible and r.value > 0] for c in candidates]
    lengths = [r.result.window_s for records in feasible for r in records if r.result.window_s]
    unit = statistics.median(lengths) if lengths else 1.0
    return [[(math.log(r.value), (r.result.window_s or unit) / unit) for r in records] for records in feasible]


def noise_variance(candidates: Sequence[Candidate]) -> tuple[float, int]:
    """sigma^2 of the log of a window of the unit length (weighted_logs), pooled over every configuration measured
    more than once, and its degrees of freedom."""
    return pooled_noise(weighted_logs(candidates))


def pooled_noise(logs: Sequence[Sequence[tuple[float, float]]]) -> tuple[float, int]:
    """noise_variance of windows already weighed (weighted_logs), so that a caller weighs them once."""
    squares, df = 0.0, 0
    for windows in logs:
        if len(windows) > 1:
            mean = sum(x * w for x, w in windows) / sum(w for _, w in windows)
            squares += sum(w * (x - mean) ** 2 for x, w in windows)
            df += len(windows) - 1
    return (squares / df if df else 0.0), df


def _gap_errors(candidates: Sequence[Candidate], reference: Candidate) -> dict[int, float]:
    """The standard error of each candidate's gap to the reference (of their weighted mean log windows, so relative),
    by id; the noise pooled over all of them, in one unit. Empty while no configuration was measured twice."""
    logs = weighted_logs(candidates)
    sigma2, df = pooled_noise(logs)
    weight = {id(c): sum(w for _, w in windows) for c, windows in zip(candidates, logs, strict=True)}
    if not df or not weight.get(id(reference)):
        return {}
    return {
        key: math.sqrt(sigma2 * (1.0 / total + 1.0 / weight[id(reference)])) for key, total in weight.items() if total
    }


def pick_winner(
    candidates: list[Candidate], estimates: Estimates = None, *, by: str = "pooled estimate"
) -> tuple[Candidate | None, str]:
    """The fastest by median (or by the estimates confirmation made, named by `by`: pooled with neighbours' windows
    on a long run, search/pooling.py, or compared pass by pass on a busy machine, search/confirmation.py); among leaders
    measured within SAFETY_PRICE of it, the safest (and say why). The winner's reported throughput stays its measured
    median.

    Safety is a tie-break, and a tie-break must not cost throughput: a median is an unbiased estimate however noisy the
    windows, so a leader measured 4% slower is expected to be 4% slower, even when the noise cannot rule out a tie. So
    the zone is a fixed price, never a share of the windows' range, which would grow with every re-measurement (a range
    widens with the number of windows, while a median's error shrinks).

    For the same reason a tie must be measured: a safer leader wins only where the gap's standard error (_gap_errors)
    is within SAFETY_PRICE too, so that its true cost is within about twice the price. Where the windows cannot tell
    1%, "within 1%" is chance, and the fastest wins. What wider or unmeasured ties cost on the simulated conformer:
    docs/how-it-measures.md, step 7, and benchmarks/README.md#search-at-gpu-scale-simulated.
    """
    if not candidates:
        return None, ""
    rate = {id(c): score(c, estimates) for c in candidates}
    by = by if estimates else "median"
    fastest = max(candidates, key=lambda c: rate[id(c)])
    errors = _gap_errors(candidates, fastest)
    tied = [
        candidate
        for candidate in candidates
        if candidate is fastest
        or rate[id(candidate)] >= rate[id(fastest)] * (1.0 - SAFETY_PRICE)
        and errors.get(id(candidate), math.inf) <= SAFETY_PRICE
    ]
    safest = min(tied, key=lambda c: (c.safety_key(), -rate[id(c)]))
    if safest is fastest:
        return fastest, f"fastest by {by}"
    gap, slower = 1.0 - rate[id(safest)] / rate[id(fastest)], f"slower by {by}" if estimates else "slower"
    keys = zip(_SAFETY_WORDS, safest.safety_key(), fastest.safety_key(), strict=True)
    why = next((word for word, mine, theirs in keys if mine < theirs), "no less safe on any count")  # an exact tie
    return safest, (
        f"chose {safest.config.short()} over the nominally fastest {fastest.config.short()}: {gap:.1%} {slower}, "
        f"within {SAFETY_PRICE:.0%} (+-{errors[id(safest)]:.1%}), and safer ({why})"
    )


def config_params(config: TrialConfig, space: SearchSpace) -> dict[str, Any]:
    """The search-space parameters that reproduce a configuration (for a fixed trial)."""
    params = {
        k: v for k, v in config.to_dict().items() if k not in ("world_size", "grad_accum_steps", "workload_knobs")
    }
    params.update(config.workload_knobs)
    fitted = _space_params(params, space)
    # Preloading is no search dimension (the tuner's preload probe tries it), but it is part of the configuration.
    return {**fitted, "preload_audio": True} if config.preload_audio else fitted


def _space_params(params: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """Only the parameters the space knows, so that enqueue_trial gets exactly what suggest() asks for."""
    names = {param.name for param in space.params} | set(space.fixed)
    return {key: value for key, value in params.items() if key in names}
