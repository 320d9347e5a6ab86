"""A dead run's trial whose job outlived it (--executor slurm): where its retry is measured, and whether one waits.

The executor re-attaches to such a job in the trial's own folder (trial/slurm.py SlurmLauncher.can_reattach); a local
trial died with its run, so its retry gets a folder of its own and the dead one's log stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from autotune import storage

__all__ = ["trial_folder", "orphan_waiting"]


def trial_folder(trial: optuna.Trial, workdir: Path, launcher: Any) -> Path:
    """Where a trial's files go: a folder of this run's, or, for the retry of a dead run's trial whose job outlived
    it, that trial's folder, where the executor re-attaches to the job."""
    previous = trial.user_attrs.get(storage.RESUME_ATTR)
    if previous and _reattaches(launcher, Path(previous)):
        return Path(previous)
    return workdir / f"trial-{trial.number:04d}"


def orphan_waiting(study: optuna.Study, launcher: Any) -> bool:
    """Whether a dead run's trial waits to be retried where its job may still give its result: the search collects
    those first (the job ran on while no run watched it; its result is the study's, not to be lost)."""
    if getattr(launcher, "can_reattach", None) is None:
        return False
    storage.recover_stale_trials(study)  # a run that died on another host is seen once its grace is over
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    folders = [t.user_attrs.get(storage.RESUME_ATTR) for t in waiting]
    return any(_reattaches(launcher, Path(folder)) for folder in folders if folder)


def _reattaches(launcher: Any, folder: Path) -> bool:
    can_reattach = getattr(launcher, "can_reattach", None)  # executors whose trials outlive the run
    return bool(can_reattach and can_reattach(folder))
