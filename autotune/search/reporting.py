"""What a run tells whoever watches it, as it goes: the CLI draws it (cli/display.py), tests may record it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.search.budget import BudgetPlan
    from autotune.search.candidates import TrialRecord

__all__ = ["Reporter", "SilentReporter"]


class Reporter(Protocol):
    """Receives progress: the machine as calibrated, the budget plan whenever it changes, each trial."""

    def machine_measured(self, description: str, busy: bool) -> None: ...

    def plan_changed(self, plan: BudgetPlan) -> None: ...

    def trial_started(self, number: int, role: str, config: TrialConfig) -> None: ...

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None: ...


class SilentReporter:
    """Tells nobody."""

    def machine_measured(self, description: str, busy: bool) -> None:
        return None

    def plan_changed(self, plan: BudgetPlan) -> None:
        return None

    def trial_started(self, number: int, role: str, config: TrialConfig) -> None:
        return None

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        return None
