"""One `autotune run`: validate everything up front, tune, write the result. The CLI only parses and prints."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from autotune import (
    __version__,
    assessment,
    drift,
    history,
    preflight,
    preloading,
    storage,
    warmstart,
    workloads,
    yamlio,
)
from autotune import space as space_module
from autotune.errors import MachineFailure, UserError, WorkloadError
from autotune.hardware import Hardware, probe
from autotune.reporting import Reporter
from autotune.results import TunedConfig, speedup_range, summarise_measurements
from autotune.run_output import check_writable, make_folders, remove_empty, write_result
from autotune.storage import redact_url
from autotune.trial import TrialConfig, TrialSpec
from autotune.trial.amp_check import AmpCheckSettings
from autotune.tuner import STORAGE_FAILED, Tuner, TunerSettings, TuningOutcome
from autotune.validation import check_request, check_workload_options

if TYPE_CHECKING:
    from autotune.data.offline import Preparation

__all__ = ["RunRequest", "RunPlan", "RunReport", "TuningFailed", "prepare", "execute", "redact_url"]

logger = logging.getLogger(__name__)


class TuningFailed(RuntimeError):
    """No configuration was both measured and stable."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRequest:
    """Everything the user asked for."""

    model: str
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
    devices: int | None = None  # ranks per trial; default every visible GPU, or 1 on a CPU
    global_batch: int | None = None  # held fixed: the search varies the per-device micro-batch and accumulation
    warm_start: bool = True  # a rerun re-measures the previous winner and its neighbours first
    warm_fraction: float = 0.5  # share of --trials and --budget a warm-started rerun spends
    drift_threshold: float = drift.DEFAULT_THRESHOLD
    amp_check: AmpCheckSettings | None = field(default_factory=AmpCheckSettings)  # None: --no-amp-check
    compute_ceiling: bool = True  # measure the winner once more on batches already in memory


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
    world_size: int = 1
    warm_start: warmstart.WarmStart | None = None
    option_notes: tuple[str, ...] = ()  # what the workload says about its options (Workload.check_options)
    preparation: Preparation | None = None  # the workload's one-off data preparation, done by execute()
    started_s: float = field(default_factory=time.monotonic)  # when the run began checking its inputs (its budget)


@dataclass(kw_only=True, slots=True)
class RunReport:
    """What a run did and produced."""

    plan: RunPlan
    outcome: TuningOutcome
    tuned: TunedConfig
    result_path: Path
    verdict: drift.DriftVerdict | None = None
    written: bool = True  # False: the previous YAML was kept as it was (no churn)


def _load_data(workload: workloads.Workload, path: str | None) -> Any:
    """The workload's data; a plugin's load_data that raises (or calls sys.exit) is one line naming it, not a
    traceback nor a silent exit 0."""
    try:
        return workload.load_data(path)
    except UserError:
        raise
    except (Exception, SystemExit) as error:
        said = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        raise WorkloadError(f"workload {workload.name}: load_data({path!r}) raised {said}") from None


def _open_study(url: str, name: str, space: space_module.SearchSpace, settings: TunerSettings) -> optuna.Study:
    from autotune.tuner import make_sampler

    sampler = make_sampler(settings.sampler, space, settings.seed)
    opened = storage.open_storage(url)
    try:
        return optuna.create_study(
            storage=opened, study_name=name, sampler=sampler, direction="maximize", load_if_exists=True
        )
    except UserError:
        raise
    except Exception as error:  # a database that opened but cannot be used (permissions, a broken schema)
        raise UserError(f"cannot use storage {redact_url(url)} ({type(error).__name__}); check --storage") from None


def prepare(request: RunRequest) -> RunPlan:
    """Check every input before any trial runs; raises UserError with one line for the first problem.

    Nothing is created until every input passed: a refused run leaves no folder, database or file behind.
    """
    started_s = time.monotonic()
    check_request(request)
    settings = request.settings
    workload = workloads.get(request.model)
    check_workload_options(workload, request.workload_options)
    hardware = probe(request.device)
    world_size = resolve_world_size(request, hardware)
    space_file = Path(request.space) if request.space else space_module.space_path(workload.space_file or workload.name)
    space = space_module.load(
        space_file,
        hardware,
        workload_knobs=tuple(workload.knobs),
        world_size=world_size,
        global_batch_size=request.global_batch,
    )
    if settings.sampler == "grid":
        space.points()  # raises a one-line SpaceError for a continuous space or one too large to walk
    safe_name = re.sub(r"[^A-Za-z0-9+._-]", "_", workload.name)
    out_path = (
        Path(request.out) if request.out else Path(request.results_dir) / safe_name / f"{hardware.fingerprint()}.yaml"
    )
    check_writable(out_path)
    if request.storage is None:
        check_writable(Path(request.results_dir) / "studies.db")
    storage_url = request.storage or f"sqlite:///{Path(request.results_dir).resolve() / 'studies.db'}"
    data = _load_data(workload, request.data)
    study_name = f"{safe_name}-{data.fingerprint()}-{hardware.fingerprint()}"
    if world_size > 1 or request.global_batch is not None:  # a different experiment: its own study
        study_name += f"-ws{world_size}" + (f"-gb{request.global_batch}" if request.global_batch else "")
    created = make_folders([out_path.parent, *([Path(request.results_dir)] if request.storage is None else [])])
    try:
        study = _open_study(storage_url, study_name, space, settings)  # a bad URL fails now, before any work
    except UserError:
        remove_empty(created)
        raise
    options = {**workload.options, **request.workload_options}
    option_notes = tuple(workload.check_options(options, data)) if workload.check_options else ()
    warm = warmstart.plan_warm_start(
        study,
        out_path=out_path,
        study_name=study_name,
        space=space,
        options=options,
        settings=settings,
        enabled=request.warm_start,
        fraction=request.warm_fraction,
    )
    request = dataclasses.replace(request, settings=warm.settings)  # a warm-started rerun searches less
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    workdir = Path(request.results_dir) / safe_name / "trials" / f"{study_name}-{stamp}-{os.getpid()}"
    return RunPlan(
        request=request,
        hardware=hardware,
        workload=workload,
        data=data,
        space=space,
        space_file=space_file,
        storage_url=storage_url,
        study_name=study_name,
        out_path=out_path,
        workdir=workdir,
        options=options,
        world_size=world_size,
        warm_start=warm,
        option_notes=option_notes,
        started_s=started_s,
    )


def resolve_world_size(request: RunRequest, hardware: Hardware) -> int:
    """Ranks per trial: --devices, else every visible GPU (1 on a CPU); checked against what the machine has."""
    if request.global_batch is not None and request.global_batch < 1:
        raise UserError(f"--global-batch must be at least 1, got {request.global_batch}")
    if request.devices is None:
        return hardware.device_count
    if request.devices < 1:
        raise UserError(f"--devices must be at least 1, got {request.devices}")
    if hardware.device_type == "cuda" and request.devices > len(hardware.gpus):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise UserError(f"--devices {request.devices} but only {len(hardware.gpus)} GPU(s) are visible{hint}")
    if hardware.device_type == "cpu" and request.devices > hardware.cpu_cores:
        raise UserError(
            f"--devices {request.devices} on a CPU needs a core per process; this machine lets a trial use "
            f"{hardware.cpu_cores}"
        )
    return request.devices


def execute(plan: RunPlan, reporter: Reporter | None = None) -> RunReport:
    """Run the study and write the result YAML atomically."""
    request = plan.request
    plan.workdir.mkdir(parents=True, exist_ok=True)
    data_file = yamlio.write_json(plan.workdir / "data.json", plan.data.to_dict())
    plan.preparation = prepare_data(plan)  # before the trials; its time comes off --budget (preflight)
    machine = preflight.measure_machine(request.settings, reporter)  # a busy machine gets longer windows
    settings = machine.settings

    def make_spec(config: TrialConfig, result_path: str) -> TrialSpec:
        return TrialSpec(
            workload=request.model,
            workload_options=dict(request.workload_options),
            data_file=str(data_file),
            config=config,
            timing=settings.timing,
            device_type=plan.hardware.device_type,
            result_path=result_path,
            seed=settings.seed,
            collective_timeout_s=settings.trial_timeout_s,
        )

    study = _open_study(plan.storage_url, plan.study_name, plan.space, settings)
    machine = preflight.check_precisions(machine, plan, make_spec)  # the trials get what is left of the budget
    search_settings, amp = machine.settings, machine.amp
    tuner = Tuner(
        study=study,
        space=plan.space,
        make_spec=make_spec,
        settings=search_settings,
        workdir=plan.workdir,
        reporter=reporter,
        world_size=plan.world_size,
        global_batch_size=request.global_batch,
        workload_knobs=tuple(plan.workload.knobs),
        strict_baseline=workloads.is_plugin(request.model),
        warm_start=plan.warm_start.trials() if plan.warm_start else (),
        rejected_precisions=amp.rejected() if amp else None,
        preload_probe=preloading.preload_probe(plan),
        closing_trials=1 if request.compute_ceiling else 0,
        before=machine.stages,
    )
    outcome = tuner.run()
    ceiling = None
    if request.compute_ceiling and outcome.stopped_by != STORAGE_FAILED:
        left_s = search_settings.budget_s - outcome.elapsed_s if search_settings.budget_s is not None else None
        ceiling = assessment.measure_ceiling(outcome, make_spec, plan.workdir, settings.trial_timeout_s, left_s)
    (plan.workdir / "data.json").unlink(missing_ok=True)
    if outcome.winner is None and outcome.stopped_by == "interrupted":
        raise KeyboardInterrupt  # nothing stable measured yet: nothing to write
    if outcome.winner is None and outcome.stopped_by == STORAGE_FAILED:
        raise MachineFailure(
            f"the study's storage failed mid-run ({outcome.failure}) before any stable configuration was measured; "
            "fix it (free space, bring the database back) and rerun to continue the study"
        )
    if outcome.winner is None:
        reasons = Counter(f"{r.result.status}: {r.result.reason}" for r in outcome.records if not r.result.feasible)
        common = "; ".join(f"{reason} (x{count})" for reason, count in reasons.most_common(3))
        busy = f"; {machine.load.describe()}: tune when it is quieter" if machine.load.busy else ""
        raise TuningFailed(f"no stable configuration among {len(outcome.records)} trials: {common}{busy}")
    tuned = _tuned_config(plan, outcome)
    preflight.record(machine, tuned, outcome.records)
    assessment.assess(tuned, plan=plan, outcome=outcome, ceiling=ceiling, amp=amp)
    again = drift.remeasured(outcome)
    verdict = drift.judge(
        previous=plan.warm_start.previous if plan.warm_start else None,
        again=again,
        winner=outcome.winner,
        threshold=request.drift_threshold,
        hardware=plan.hardware.to_dict(),
        version=__version__,
    )
    # The history gets what is in force after this run: the new result, or the kept winner as measured tonight.
    accepted: TunedConfig | None = tuned
    if verdict.write:
        result_path = write_result(tuned, plan.out_path)
    else:
        result_path = plan.out_path
        kept = dataclasses.replace(outcome, winner=again, winner_reason="") if again and again.feasible else None
        accepted = _tuned_config(plan, kept) if kept else None
    try:
        if accepted is not None:
            history.record(accepted, result_path, plan.request.results_dir)
    except OSError as error:  # the result itself is written; a history we cannot append to must not fail the run
        logger.warning("could not append to the history next to %s: %s", result_path, error)
    return RunReport(
        plan=plan, outcome=outcome, tuned=tuned, result_path=result_path, verdict=verdict, written=verdict.write
    )


def prepare_data(plan: RunPlan) -> Preparation | None:
    """The workload's one-off preparation (CMVN statistics, precomputed features), before any trial: what the recipe
    does once before training is neither repeated per trial nor counted in any throughput (data/offline.py)."""
    if plan.workload.prepare_data is None:
        return None
    preparation = plan.workload.prepare_data(plan.data, plan.options)
    if preparation is not None:
        logger.info("%s", preparation.note())
    return preparation


def _tuned_config(plan: RunPlan, outcome: TuningOutcome) -> TunedConfig:
    assert outcome.winner is not None
    winner = summarise_measurements([r.result for r in outcome.winner.records])
    baseline = summarise_measurements([r.result for r in outcome.baseline.records]) if outcome.baseline else {}
    speedup = None
    if baseline.get("status") == "ok":
        speedup = round(winner["samples_per_second"] / baseline["samples_per_second"], 3)
    notes = [f"baseline adapted to this machine: {note}" for note in plan.space.baseline_notes]
    notes += [f"space adapted to this machine: {note}" for note in plan.space.space_notes]
    if plan.data.synthetic:
        notes.append("measured on autotune's synthetic default corpus; rerun with --data on your own list to be sure")
    notes.extend(plan.option_notes)
    if baseline.get("status") not in (None, "ok"):
        notes.append(f"the recipe baseline could not be used here: {baseline['status']}: {baseline.get('reason', '')}")
    if outcome.winner_reason and outcome.winner_reason != "fastest by median":
        notes.append(outcome.winner_reason)
    if winner["measurements"] < 2:
        notes.append("the winner rests on a single measurement (budget too small for confirmation)")
    lr_note = learning_rate_advice(plan, outcome)
    if lr_note:
        notes.append(lr_note)
    if plan.preparation is not None:
        notes.append(plan.preparation.note())
    return TunedConfig(
        workload={
            "name": plan.workload.name,
            "model": plan.request.model,
            "task": plan.workload.task,
            "options": plan.options,
        },
        config=outcome.winner.config,
        device_type=plan.hardware.device_type,
        metrics={
            "objective": "samples_per_second",
            "winner": winner,
            "baseline": baseline,
            "speedup": speedup,
            "speedup_range": speedup_range(winner, baseline),
            "epoch": predict_epoch(plan, winner, baseline),
            "data_preparation": plan.preparation.to_dict() if plan.preparation else None,
        },
        hardware=plan.hardware.to_dict(),
        data=plan.data.describe(),
        search=_search_summary(plan, outcome),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        autotune_version=__version__,
        notes=notes,
    )


def learning_rate_advice(plan: RunPlan, outcome: TuningOutcome) -> str | None:
    """Without --global-batch the winner's global batch is free; say how to keep the optimisation comparable."""
    if plan.request.global_batch is not None or outcome.winner is None or outcome.baseline is None:
        return None
    new, recipe = outcome.winner.config.global_batch_size, outcome.baseline.config.global_batch_size
    if new == recipe:
        return None
    factor = new / recipe
    lr = plan.options.get("lr")
    example = f" (lr {lr:g} -> {lr * factor:.3g})" if isinstance(lr, (int, float)) and lr > 0 else ""
    return (
        f"the global batch changes from the baseline's {recipe} to {new} ({outcome.winner.config.per_device_batch_size}"
        f" per device x {plan.world_size} device(s) x {outcome.winner.config.grad_accum_steps} accumulation): by the "
        f"linear scaling rule multiply the learning rate by {factor:.3g}{example} and keep the warm-up, or rerun with "
        f"--global-batch {recipe} to hold the recipe's batch fixed"
    )


def predict_epoch(plan: RunPlan, winner: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Minutes per epoch for baseline and winner, as users think in epochs, on the devices a trial used.

    The epoch is --epoch-hours of audio (divided by the audio each sample carries, as measured), --epoch-samples,
    or the data list's size.
    """
    request = plan.request
    samples = request.epoch_samples or plan.data.describe()["n_utterances_total"]
    source = "--epoch-samples" if request.epoch_samples else "the data list (one sample per entry)"

    def minutes(metrics: dict[str, Any]) -> float | None:
        if metrics.get("status") != "ok":
            return None
        if request.epoch_hours is not None and metrics.get("audio_seconds_per_second"):
            return round(request.epoch_hours * 3600.0 / metrics["audio_seconds_per_second"] / 60.0, 1)
        rate = metrics.get("samples_per_second")
        return round(samples / rate / 60.0, 1) if rate else None

    prediction: dict[str, Any] = {"samples": samples, "samples_from": source}
    if request.epoch_hours is not None:
        prediction = {"audio_hours": request.epoch_hours, "samples_from": "--epoch-hours (audio per sample measured)"}
    return {
        **prediction,
        "devices": plan.world_size,
        "baseline_minutes": minutes(baseline),
        "winner_minutes": minutes(winner),
    }


def _search_summary(plan: RunPlan, outcome: TuningOutcome) -> dict[str, Any]:
    settings = plan.request.settings
    return {
        "space_file": str(plan.space_file),
        "space": plan.space.source,
        "baseline_config": outcome.baseline.config.to_dict() if outcome.baseline else None,
        "sampler": settings.sampler,
        "study_name": plan.study_name,
        "storage": redact_url(plan.storage_url),
        "trials_this_run": len(outcome.records),
        "trial_statuses": dict(Counter(r.result.status for r in outcome.records)),
        "stopped_by": outcome.stopped_by,
        "elapsed_s": round(outcome.elapsed_s, 1),
        "timing": settings.timing.to_dict(),
        "budget_plan": outcome.plan.to_dict() if outcome.plan else None,
    }
