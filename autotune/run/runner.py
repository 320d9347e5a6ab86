"""One `autotune run`: validate everything up front, tune, write the result. The CLI only parses and prints."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from autotune import __version__, storage, workloads, yamlio
from autotune import space as space_module
from autotune.data import DataSource
from autotune.errors import MachineFailure, UserError
from autotune.exports.recipes import check_device
from autotune.knobs.config import TrialConfig
from autotune.machine.hardware import Hardware, probe
from autotune.probe.launcher import CommandLauncher, run_command
from autotune.result import history
from autotune.result.tuned_config import TunedConfig
from autotune.run import assessment, drift, own_training, preflight
from autotune.run import conclusion as run_result
from autotune.run import preload_probe as preloading
from autotune.run.output import check_replaceable, check_writable, make_folders, remove_empty, write_result
from autotune.run.plan import RunPlan, RunRequest
from autotune.run.validation import check_request, check_workload_options
from autotune.search import warmstart
from autotune.search.budget import BudgetTooShort, budget_that_holds, cut_window_notes, measurement_s
from autotune.search.reporting import Reporter
from autotune.search.settings import STORAGE_FAILED, TunerSettings, TuningOutcome
from autotune.search.tuner import Tuner
from autotune.space.knob_checks import check_checkpointing, check_complete, check_feature_device
from autotune.trial import TimingSettings, TrialResult, TrialSpec
from autotune.trial.slurm import SlurmLauncher, check_slurm
from autotune.trial.slurm_nodes import check_nodes, check_parallel
from autotune.workloads.registry import call_plugin

if TYPE_CHECKING:
    from autotune.data.offline import Preparation

__all__ = ["RunReport", "TuningFailed", "prepare", "execute"]

logger = logging.getLogger(__name__)


class TuningFailed(RuntimeError):
    """No configuration was both measured and stable."""


@dataclass(kw_only=True, slots=True)
class RunReport:
    """What a run did and produced."""

    plan: RunPlan
    outcome: TuningOutcome
    tuned: TunedConfig
    result_path: Path
    verdict: drift.DriftVerdict | None = None
    written: bool = True  # False: the previous YAML was kept as it was (no churn)


def _load_data(workload: workloads.Workload, path: str | None) -> DataSource:
    """The workload's data; a plugin's load_data that raises (or calls sys.exit) is one line naming it, not a
    traceback nor a silent exit 0."""
    return call_plugin(
        lambda: workload.load_data(path),
        f"workload {workload.name}: load_data({path!r})",
        DataSource,
        "not a DataSource; return autotune.data.load_source(path) or default_source()",
    )


def _open_study(url: str, name: str, space: space_module.SearchSpace, settings: TunerSettings) -> optuna.Study:
    from autotune.search.samplers import make_sampler

    sampler = make_sampler(settings.sampler, space, settings.seed)
    opened = storage.open_storage(url)
    with storage.storage_errors(url, doing="use", fix="check --storage"):  # opened, yet unusable: permissions, schema
        return optuna.create_study(
            storage=opened, study_name=name, sampler=sampler, direction="maximize", load_if_exists=True
        )


def prepare(request: RunRequest) -> RunPlan:
    """Check every input before any trial runs; raises UserError with one line for the first problem.

    Nothing is created until every input passed: a refused run leaves no folder, database or file behind.
    """
    started_s = time.monotonic()
    check_request(request)
    if request.nodes < 1 or (request.nodes > 1 and request.slurm is None):
        check_nodes(request.slurm, request.nodes)  # before asking any cluster anything
    if request.slurm is not None:
        check_slurm(request.slurm)  # the cluster answers, the partition and options are its own
        check_parallel(request.slurm, request.settings.parallel)  # no more trials in flight than nodes
        check_nodes(request.slurm, request.nodes, request.settings.parallel)  # M nodes per trial, xN in flight
    settings = request.settings
    if request.command is not None:
        check_own_training(request)
        # No AMP check (it trains autotune's model, not the user's) and no compute-only ceiling (it needs the model's
        # batches in memory): the probe's own checks stand for them (the loss, the values in force).
        request = dataclasses.replace(request, amp_check=None, compute_ceiling=False)
        workload = own_training.command_workload(request.command, request.model or None)  # type: ignore[arg-type]
    else:
        workload = workloads.get(request.model)
    check_workload_options(workload, request.workload_options)
    hardware = probe(request.device)
    if request.command is not None:  # a framework that cannot train here: refused before anything runs
        check_device(request.command.recipe, hardware.device_type)
    nodes = request.nodes
    world_size = resolve_world_size(request, hardware) * nodes  # --devices is per node: every node's ranks count
    space_file = Path(request.space) if request.space else space_module.space_path(workload.space_file or workload.name)
    if request.command is not None:
        baseline = own_training.baseline_values(request.command, list(request.baseline))
        space = own_training.command_space(request.command, baseline, hardware)
    else:
        space = space_module.load(
            space_file,
            # `auto` threads are one rank's share of its node's cores: the space divides by all ranks, of every node
            dataclasses.replace(hardware, cpu_cores=hardware.cpu_cores * nodes),
            workload_knobs=tuple(workload.knobs),
            world_size=world_size,
            global_batch_size=request.global_batch,
        )
    check_complete(space, str(space_file))
    check_feature_device(space, workload.name, workload.feature_devices, str(space_file))
    check_checkpointing(space, workload.name, workload.checkpointing is not None, str(space_file))
    if settings.sampler == "grid":
        space.points()  # raises a one-line SpaceError for a continuous space or one too large to walk
    safe_name = history.folder_name(workload.name)
    across = f"-nodes{nodes}" if nodes > 1 else ""  # a multi-node result never replaces a one-node one's file
    out_path = (
        Path(request.out)
        if request.out
        else Path(request.results_dir) / safe_name / f"{hardware.fingerprint()}{across}.yaml"
    )
    check_writable(out_path)
    check_replaceable(out_path, force=request.force)
    if request.storage is None:
        check_writable(Path(request.results_dir) / "studies.db")
    storage_url = request.storage or storage.sqlite_url(Path(request.results_dir).resolve() / "studies.db")
    data = _load_data(workload, request.data)
    study_name = f"{safe_name}-{data.fingerprint()}-{hardware.fingerprint()}"
    if world_size > 1 or request.global_batch is not None:  # a different experiment: its own study
        study_name += f"-ws{world_size}" + (f"-gb{request.global_batch}" if request.global_batch else "")
    if nodes > 1:  # M nodes of N ranks is not N*M ranks of one machine: neither compared nor warm-started together
        study_name += f"-nodes{nodes}"
    options = {**workload.options, **request.workload_options}
    option_notes = tuple(workload.check_options(options, data)) if workload.check_options else ()
    reach = None
    if request.command is not None:  # the user's training, run once after every other check, before anything is made
        reach = own_training.reach_check(
            request.command,
            space,
            workload.name,
            hardware.device_type,
            settings.trial_timeout_s,
            launcher=_command_launcher(request, hardware.fingerprint()),
        )
        space = own_training.after_reach(space, reach, request.command)
        for note in reach.notes():
            logger.warning("%s", note)
        if request.epoch_samples is None and request.epoch_hours is None and reach.dataset_size:
            # the epoch of the prediction: the training's own dataset, as its DataLoader reports it
            request = dataclasses.replace(request, epoch_samples=reach.dataset_size)
    created = make_folders([out_path.parent, *([Path(request.results_dir)] if request.storage is None else [])])
    default_db = Path(request.results_dir) / "studies.db" if request.storage is None else None
    fresh_db = default_db is not None and not default_db.exists()
    try:
        study = _open_study(storage_url, study_name, space, settings)  # a bad URL fails now, before any work
    except UserError:
        if fresh_db and default_db is not None:  # a database this run began and could not finish is no study
            for suffix in ("", "-journal", "-wal", "-shm"):
                Path(f"{default_db}{suffix}").unlink(missing_ok=True)
        remove_empty(created)
        raise
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
        nodes=nodes,
        warm_start=warm,
        option_notes=option_notes,
        started_s=started_s,
        reach=reach,
    )


def check_own_training(request: RunRequest) -> None:
    """What a run of the user's own command cannot take: its launcher, not autotune, starts its ranks; autotune's
    own data, space and trial machinery are not its."""
    refused = {
        "--devices": request.devices is not None,
        "--global-batch": request.global_batch is not None,
        "--data": request.data is not None,
        "--space": request.space is not None,
        "--option": bool(request.workload_options),
        "--nodes": request.nodes != 1,
    }
    lightning = request.command is not None and request.command.lightning is not None
    for option, given in refused.items():
        if given and lightning:
            raise UserError(
                f"{option} does not apply to --lightning: Lightning's Trainer starts the ranks and your factory reads "
                "the data (give --trainer devices=N, --trainer num_nodes=N)"
            )
        if given:
            raise UserError(
                f"{option} does not apply to --command: your command starts its own ranks and reads its own data "
                "(put torchrun or your launcher's options in the command)"
            )


def _command_measure(request: RunRequest) -> Callable[..., TrialResult] | None:
    """What a SLURM job runs its trial with: the user's command under the probe for --command (picklable: the
    recorded command bound to probe/launcher.py run_command); None, trial.launch, for a built-in workload."""
    if request.command is None:
        return None
    return functools.partial(run_command, request.command.to_dict())


def _command_launcher(request: RunRequest, fingerprint: str) -> Callable[..., TrialResult] | None:
    """Where the reach check runs the user's command under --executor slurm: as a SLURM job on a node like the
    trials' (None: here)."""
    if request.slurm is None:
        return None
    return SlurmLauncher(settings=request.slurm, fingerprint=fingerprint, measure=_command_measure(request))


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


def spec_maker(plan: RunPlan, settings: TunerSettings, data_file: Path) -> Callable[[TrialConfig, str], TrialSpec]:
    """How this run's trials are specified: a configuration and a result path give the TrialSpec its child runs (the
    workload, its options, the data list, the timing, the seed). Also what benchmarks/ablation.py measures with."""

    def make_spec(config: TrialConfig, result_path: str) -> TrialSpec:
        return TrialSpec(
            workload=plan.request.model,
            workload_options=dict(plan.request.workload_options),
            data_file=str(data_file),
            config=config,
            timing=settings.timing,
            device_type=plan.hardware.device_type,
            result_path=result_path,
            seed=settings.seed,
            collective_timeout_s=settings.trial_timeout_s,
            run_length=plan.objective_run_length(),
            nodes=plan.nodes,
        )

    return make_spec


def _budget_too_short(
    budget_s: float | None, trials_budget_s: float | None, outcome: TuningOutcome, timing: TimingSettings
) -> str:
    """Why a run whose every trial the budget stopped measured nothing: the budget, said as such (not the machine's
    load, not the configurations), with where its time went and, from the steps a stopped trial timed, the budget
    that would measure it and one configuration beside it."""
    given = "the budget"
    if budget_s is not None:
        given = f"the --budget of {budget_s:.0f} s" if budget_s < 120 else f"the --budget of {budget_s / 60:.1f} min"
    went: list[str] = []
    before_s = 0.0
    if budget_s is not None and trials_budget_s is not None and budget_s - trials_budget_s >= 1:
        before_s = budget_s - trials_budget_s
        went.append(f"what comes before the trials (data, calibration, AMP check) took {before_s:.0f} s")
    longest = max((r.result.wall_s or 0.0 for r in outcome.records), default=0.0)
    went.append(
        f"{len(outcome.records)} trial(s) stopped" + (f", the longest after {longest:.0f} s" if longest else "")
    )
    timed = [r for r in outcome.records if r.result.status == "stopped" and r.result.step_time_median_s]
    first = next((r for r in timed if r.role == "baseline"), timed[0] if timed else None)
    if first is None or first.result.step_time_median_s is None:
        fix = "give a larger --budget, or --budget none"
    else:
        step_s = first.result.step_time_median_s
        trial_s = measurement_s(step_s, timing)
        fix = (
            f"trial #{first.number} ({first.role}) takes steps of {step_s:.1f} s here, so measuring it takes about "
            f"{trial_s:.0f} s: give --budget {budget_that_holds(before_s, trial_s)}m or more, or --budget none"
        )
    return f"{given} ran out before any configuration was measured ({'; '.join(went)}): {fix}"


def execute(plan: RunPlan, reporter: Reporter | None = None) -> RunReport:
    """Run the study and write the result YAML atomically: tune, conclude, write."""
    searched = _tune(plan, reporter)
    tuned, verdict = _conclude(plan, searched)
    return _write(plan, searched.outcome, tuned, verdict)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Searched:
    """What tuning left for the conclusion: the search's outcome, the machine and the precisions as checked before
    it, and the winner's compute-only ceiling."""

    outcome: TuningOutcome
    machine: preflight.Preflight
    ceiling: TrialResult | None


def _tune(plan: RunPlan, reporter: Reporter | None) -> _Searched:
    """The machine calibrated, the precisions checked, the study searched, and the winner's ceiling measured."""
    request = plan.request
    plan.workdir.mkdir(parents=True, exist_ok=True)
    data_file = yamlio.write_json(plan.workdir / "data.json", plan.data.to_dict())
    plan.preparation = prepare_data(plan)  # before the trials; its time comes off --budget (preflight)
    machine = preflight.measure_machine(request.settings, reporter)  # a busy machine gets longer windows
    settings = machine.settings

    make_spec = spec_maker(plan, settings, data_file)
    launcher: Callable[..., TrialResult] | None = None  # trial.launch
    if request.command is not None:  # the user's own training
        launcher = CommandLauncher(command=request.command)
    study = _open_study(plan.storage_url, plan.study_name, plan.space, settings)
    machine = preflight.check_precisions(machine, plan, make_spec)  # the trials get what is left of the budget
    search_settings, amp = machine.settings, machine.amp
    if request.slurm is not None:  # each job checks that its node is like this machine (the study's fingerprint)
        fingerprint, budget_s = plan.hardware.fingerprint(), search_settings.budget_s  # budget: the pin wait's default
        launcher = SlurmLauncher(
            settings=request.slurm, fingerprint=fingerprint, budget_s=budget_s, measure=_command_measure(request)
        )
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
        strict_baseline=workloads.is_plugin(request.model) or request.command is not None,
        warm_start=plan.warm_start.trials() if plan.warm_start else (),
        rejected_precisions=amp.rejected() if amp else None,
        preload_probe=None
        if request.command is not None  # the training reads its own data: autotune cannot preload it
        else preloading.preload_probe(
            model=request.model,
            data=plan.data.describe(),
            world_size=plan.world_size // plan.nodes,  # the ranks that share one node's RAM
            memory_bytes=plan.hardware.memory_bytes,
        ),
        closing_trials=1 if request.compute_ceiling else 0,
        before=machine.stages,
        launcher=launcher,
        # the user's own command reads and prepares its data as it will: no estimate of its step from ours
        step_estimate=None
        if request.command is not None
        else preflight.baseline_step_estimate(amp, plan.hardware.device_type),
    )
    try:
        outcome = tuner.run()
    except BudgetTooShort:  # refused before the first trial: nothing of the run's trials is left behind
        (plan.workdir / "data.json").unlink(missing_ok=True)
        raise
    ceiling = None
    if request.compute_ceiling and outcome.stopped_by != STORAGE_FAILED:
        left_s = search_settings.budget_s - outcome.elapsed_s if search_settings.budget_s is not None else None
        ceiling = assessment.measure_ceiling(
            outcome, make_spec, plan.workdir, settings.trial_timeout_s, left_s, launcher=launcher
        )
    (plan.workdir / "data.json").unlink(missing_ok=True)
    return _Searched(outcome=outcome, machine=machine, ceiling=ceiling)


def _conclude(plan: RunPlan, searched: _Searched) -> tuple[TunedConfig, drift.DriftVerdict]:
    """The result of the search, assessed, and the verdict against the previous one; a search that found nothing
    stable ends the run here with why."""
    request, outcome, machine = plan.request, searched.outcome, searched.machine
    if outcome.winner is None and outcome.stopped_by == "interrupted":
        raise KeyboardInterrupt  # nothing stable measured yet: nothing to write
    if outcome.winner is None and outcome.stopped_by == STORAGE_FAILED:
        raise MachineFailure(
            f"the study's storage failed mid-run ({outcome.failure}) before any stable configuration was measured; "
            "fix it (free space, bring the database back) and rerun to continue the study"
        )
    stopped = all(r.result.status == "stopped" for r in outcome.records)
    if outcome.winner is None and stopped and (outcome.records or outcome.stopped_by == "budget"):
        raise TuningFailed(
            _budget_too_short(request.settings.budget_s, machine.settings.budget_s, outcome, machine.settings.timing)
        )
    if outcome.winner is None:
        reasons = Counter(f"{r.result.status}: {r.result.reason}" for r in outcome.records if not r.result.feasible)
        common = "; ".join(f"{reason} (x{count})" for reason, count in reasons.most_common(3))
        busy = f"; {machine.load.describe()}: tune when it is quieter" if machine.load.busy else ""
        raise TuningFailed(f"no stable configuration among {len(outcome.records)} trials: {common}{busy}")
    tuned = preflight.record(machine, run_result.tuned_config(plan, outcome), outcome.records)
    if plan.reach is not None:
        tuned = dataclasses.replace(tuned, notes=[*tuned.notes, *plan.reach.notes()])
    cut = cut_window_notes(outcome.records)  # windows the budget shortened: kept, and said so
    if cut:
        tuned = dataclasses.replace(tuned, notes=[*tuned.notes, *cut])
    assessed = assessment.assess(
        tuned.winner,
        tuned.config,
        hardware=plan.hardware,
        data=plan.data.describe(),
        space=plan.space,
        outcome=outcome,
        ceiling=searched.ceiling,
        amp=machine.amp,
    )
    verdict = drift.judge(
        previous=plan.warm_start.previous if plan.warm_start else None,
        again=drift.remeasured(outcome),
        winner=outcome.winner,
        threshold=request.drift_threshold,
        hardware=plan.hardware.to_dict(),
        version=__version__,
    )
    return assessed.applied_to(tuned), verdict


def _write(plan: RunPlan, outcome: TuningOutcome, tuned: TunedConfig, verdict: drift.DriftVerdict) -> RunReport:
    """The result written where the verdict says it is earned, and the history given what is in force after this
    run: the new result, or the kept winner as measured tonight."""
    accepted: TunedConfig | None = tuned
    if verdict.write:
        result_path = write_result(tuned, plan.out_path)
        if plan.request.command is not None:
            plan.written_beside = own_training.write_back(plan, tuned, result_path)
    else:
        result_path = plan.out_path
        again = drift.remeasured(outcome)
        kept = (
            dataclasses.replace(outcome, winner=again, winner_reason="", set_aside=0)
            if again and again.feasible
            else None
        )
        accepted = run_result.tuned_config(plan, kept) if kept else None
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
