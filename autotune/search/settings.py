"""What a tuning session is given and what it returns (autotune/search/tuner.py): typed values that cross from the CLI
and the runner into the Tuner and back."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.search.budget import BudgetPlan
from autotune.search.candidates import Candidate, TrialRecord
from autotune.trial import TimingSettings

__all__ = ["STORAGE_FAILED", "TunerSettings", "TuningOutcome"]

STORAGE_FAILED = "storage failure"  # TuningOutcome.stopped_by when the machine failed the study mid-run


@dataclass(frozen=True, kw_only=True, slots=True)
class TunerSettings:
    """How long and how carefully to search."""

    trials: int = 24
    budget_s: float | None = None
    sampler: str = "tpe"  # tpe | random | grid
    seed: int = 0
    confirm_top_k: int = 3
    confirm_repeats: int = 2
    trial_timeout_s: float = 300.0
    timing: TimingSettings = field(default_factory=TimingSettings)
    prune: bool = True
    # Stop a search trial running below this share of the best so far in its window; in warm-up, below the second
    # share over steps after the first two, or the third from the steps after the first alone (search/pruning.py).
    prune_window_fraction: float = 0.5
    prune_warmup_fraction: float = 0.25
    prune_early_fraction: float = 0.125
    parallel: int = (
        1  # search trials in flight at once, each on a node of its own (--executor slurm; search/in_flight.py)
    )
    # On a busy machine, the cores other processes left at the calibration (run/preflight.py adapt): a seed that trains
    # on every core trains on these instead (search/seeds.py on_free_cores). None: the space's seeds as written.
    free_cores: int | None = None


@dataclass(kw_only=True, slots=True)
class TuningOutcome:
    """What a run found."""

    records: list[TrialRecord]
    baseline: Candidate | None
    winner: Candidate | None
    stopped_by: str
    elapsed_s: float
    confirmed: list[Candidate] = field(default_factory=list)
    winner_reason: str = ""
    failure: str = ""  # with stopped_by STORAGE_FAILED: what failed (a full disk, a database gone)
    plan: BudgetPlan | None = None  # the budget plan as the run left it
    # Windows of a confirmation pass the budget cut short: in the records and the report, not in the winner's choice
    # or its summary (search/confirmation.py, Confirmation._each).
    set_aside: int = 0
    skipped: list[str] = field(default_factory=list)  # queued trials (seeds, a warm start) --budget had no room for
