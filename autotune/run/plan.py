"""What a run was asked for (RunRequest) and the same request validated (RunPlan): the values `runner.prepare`
checks once, and the stages after it (preflight, the result, the display) read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import space as space_module
from autotune import workloads
from autotune.machine.hardware import Hardware
from autotune.probe.command import TrainingCommand
from autotune.run import drift
from autotune.search import warmstart
from autotune.search.settings import TunerSettings
from autotune.trial.amp_curves import AmpCheckSettings
from autotune.trial.run_length import RunLength
from autotune.trial.slurm import SlurmSettings

if TYPE_CHECKING:
    from autotune.data.offline import Preparation
    from autotune.run.own_training import ReachCheck

__all__ = ["RunRequest", "RunPlan"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRequest:
    """Everything the user asked for."""

    model: str  # a workload's name; with --command, the result's name ("" : the training script's)
    data: str | None = None
    space: str | None = None
    storage: str | None = None
    out: str | None = None
    results_dir: str = "results"
    device: str = "auto"
    settings: TunerSettings = field(default_factory=TunerSettings)
    workload_options: dict[str, Any] = field(default_factory=dict)
    epoch_samples: int | None = None  # training samples per epoch for the prediction (default: the data list's size)
    epoch_hours: float | None = None  # hours of audio per epoch for the prediction (instead of epoch_samples)
    run_length: RunLength = field(default_factory=RunLength)  # the training one-off costs are charged over
    devices: int | None = None  # ranks per trial; default every visible GPU, or 1 on a CPU
    global_batch: int | None = None  # held fixed: the search varies the per-device micro-batch and accumulation
    warm_start: bool = True  # a rerun re-measures the previous winner and its neighbours first
    warm_fraction: float = 0.5  # share of --trials and --budget a warm-started rerun spends
    drift_threshold: float = drift.DEFAULT_THRESHOLD
    amp_check: AmpCheckSettings | None = field(default_factory=AmpCheckSettings)  # None: --no-amp-check
    compute_ceiling: bool = True  # measure the winner once more on batches already in memory
    slurm: SlurmSettings | None = None  # --executor slurm: each trial a SLURM job (trial/slurm.py); None: local
    nodes: int = 1  # --nodes: SLURM nodes per trial, `devices` ranks on each (trial/multinode.py)
    force: bool = False  # --force: the result may replace a file at --out that autotune did not write
    # --command: the user's own training instead of a built-in workload (run/own_training.py); --baseline KNOB=VALUE
    # items: its values today
    command: TrainingCommand | None = None
    baseline: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class RunPlan:
    """A validated request: every input checked, nothing measured yet."""

    request: RunRequest
    hardware: Hardware
    workload: workloads.Workload
    data: Any  # autotune.data.DataSource
    space: space_module.SearchSpace
    space_file: Path
    storage_url: str
    study_name: str
    out_path: Path
    workdir: Path
    options: dict[str, Any]
    world_size: int = 1  # ranks per trial, on all its nodes: devices x nodes
    nodes: int = 1
    warm_start: warmstart.WarmStart | None = None
    option_notes: tuple[str, ...] = ()  # what the workload says about its options (Workload.check_options)
    preparation: Preparation | None = None  # the workload's one-off data preparation, done by execute()
    started_s: float = field(default_factory=time.monotonic)  # when the run began checking its inputs (its budget)
    reach: ReachCheck | None = None  # --command: which of its values reached the training (run/own_training.py)
    written_beside: list[str] = field(default_factory=list)  # --command: the winner's command and config file

    def objective_run_length(self) -> RunLength:
        """The run the trials' objective charges one-off costs over (trial/run_length.py): the user's epoch where
        --epoch-samples or --epoch-hours gives it (hours through the data's audio per sample), the data's where the
        data is the user's, and on the synthetic stand-in with neither, no per-epoch cost."""
        request, samples = self.request, self.request.epoch_samples
        described = self.data.describe() if self.data is not None else {}
        if samples is None and request.epoch_hours is not None and described.get("total_audio_hours"):
            per_sample_h = described["total_audio_hours"] / max(1, described["n_utterances"])
            samples = max(1, round(request.epoch_hours / per_sample_h))
        stand_in = bool(described.get("synthetic")) and samples is None
        return replace(request.run_length, epoch_samples=samples, per_epoch_costs=not stand_in)
