"""The SLURM executor: a trial as a SLURM job, submitted through submitit, with trial.launch's signature.

The job runs trial.launch on its node (the same ranks, process groups, hard timeout and classified result as a local
trial), in the trial's folder, which must be on a file system the node shares with this process: the spec goes out
there, and the result, the progress file (for pruning) and every log come back there. What only the scheduler knows
(the job cancelled, preempted, killed for its time limit or its memory, its node lost) is read from the controller and
classified as today's statuses:

| how the job ended without a result       | status    |
|------------------------------------------|-----------|
| its time limit (TIMEOUT, or submitit's   | timeout   |
| warning signal before it)                |           |
| OUT_OF_MEMORY (the node's memory cgroup) | oom       |
| CANCELLED, PREEMPTED, NODE_FAIL,         | signal    |
| BOOT_FAIL, DEADLINE (killed from outside)|           |
| FAILED and anything else                 | error     |

A trial that ran and failed (an OOM, a NaN, a crashed rank) keeps the status its own launcher gave it; one whose
ranks died of the SIGTERM the scheduler sends when it ends a job takes the scheduler's status and reason.

The job's state comes from `scontrol show job` (the controller's own view, on every cluster, accounting or not; it
keeps a finished job for MinJobAge, 300 s by default) and from submitit's `sacct` watcher once the controller has
forgotten the job.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.errors import UserError
from autotune.trial.launch import ShouldPrune, launch
from autotune.trial.spec import PROGRESS_SUFFIX, TrialResult, TrialSpec

__all__ = ["SlurmSettings", "SlurmLauncher", "check_slurm", "job_parameters", "run_on_node"]

logger = logging.getLogger(__name__)
RESULT_FILE = "slurm-result.json"  # beside the trial's own files: what run_on_node returns, as JSON
JOB_FOLDER = "slurm"  # submitit's pickles and the job's stdout/stderr, inside the trial's folder
START_GRACE_S = 60.0  # the job's time limit covers the trial's timeout plus the interpreter's start and the unpickling
WARNING_SIGNAL_S = 30  # submitit's USR2 before the time limit: the trial is stopped and its result written in time
POLL_S = 0.5  # the trial's files on the shared folder
STATE_POLL_S = 5.0  # the controller (scontrol): a trial's end is read from its result file, not from here
FINAL_STATE_WAIT_S = 10.0  # after a signalled trial's result: how long to wait for the job's final state
_STATE_CALL_TIMEOUT_S = 30.0
_OUTSIDE_KILLS = ("CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
_SCHEDULER_KILLS = ("TIMEOUT", "OUT_OF_MEMORY", *_OUTSIDE_KILLS)  # the scheduler ended the job, not its task
_FINAL_STATES = ("COMPLETED", "FAILED", *_SCHEDULER_KILLS)
_KNOWN_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", *_FINAL_STATES)


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmSettings:
    """Where and how trials are submitted: the partition and any further submitit/sbatch parameter (time, mem,
    cpus_per_task, account, qos, constraint, exclusive...), which override what the executor derives per trial."""

    partition: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise UserError(
            "--executor slurm needs submitit: pip install 'autotune[slurm]' (or pip install submitit)"
        ) from None
    return submitit


def _valid_parameters() -> dict[str, Any]:
    from submitit.slurm.slurm import _get_default_parameters

    return dict(_get_default_parameters())


def check_slurm(settings: SlurmSettings) -> None:
    """Before any trial: submitit importable, SLURM's clients on PATH, a controller that answers, the partition it
    knows, and every option one submitit passes to sbatch. Raises UserError with one line for the first problem."""
    _submitit()
    missing = [name for name in ("sbatch", "scontrol", "scancel", "sinfo") if shutil.which(name) is None]
    if missing:
        raise UserError(
            f"--executor slurm: {', '.join(missing)} not found on PATH; run autotune where SLURM's client commands "
            "are installed (a login node or a compute node), or use --executor local"
        )
    valid = _valid_parameters()
    unknown = sorted(set(settings.options) - set(valid) - {"partition"})
    if unknown:
        raise UserError(
            f"--slurm-option {', '.join(unknown)}: not a parameter submitit passes to sbatch; valid ones: "
            + ", ".join(sorted(name for name in valid if not name.startswith("_")))
        )
    partition = settings.partition or settings.options.get("partition")
    done = _slurm_command("sinfo", "--noheader", "--format=%P", *(["--partition", str(partition)] if partition else []))
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UserError(f"--executor slurm: the SLURM controller does not answer sinfo ({detail})")
    if partition and not done.stdout.strip():
        raise UserError(f"--slurm-partition {partition}: no such partition on this cluster (sinfo lists the ones)")


def _slurm_command(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=_STATE_CALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(list(args), 1, "", str(error))


def job_parameters(spec: TrialSpec, timeout_s: float, settings: SlurmSettings) -> dict[str, Any]:
    """What one trial asks of the scheduler, as submitit's SlurmExecutor parameters.

    One node and one task: the task is trial.launch, which starts the ranks itself as it does locally. On CUDA one
    GPU per rank. The whole node by default (exclusive): a throughput trial that shares its node measures its
    neighbours. CPUs: one per rank and per DataLoader worker, the least the trial needs (an exclusive job gets the
    node's every CPU anyway, and srun gives its one task all of them). The time limit is the trial's hard timeout
    plus START_GRACE_S, in whole minutes as SLURM counts them. settings.options override any of these.
    """
    config = spec.config
    parameters: dict[str, Any] = {
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": config.world_size * (1 + config.num_workers),
        "time": max(1, math.ceil((timeout_s + START_GRACE_S + WARNING_SIGNAL_S) / 60)),
        "exclusive": True,
        "signal_delay_s": WARNING_SIGNAL_S,
        "job_name": f"autotune-{Path(spec.result_path).parent.name}",
    }
    if spec.device_type == "cuda":
        parameters["gpus_per_node"] = config.world_size
    if settings.partition:
        parameters["partition"] = settings.partition
    parameters.update(settings.options)
    for key in ("setup", "teardown"):  # shell lines of the job script: one from the command line
        if isinstance(parameters.get(key), str):
            parameters[key] = [parameters[key]]
    if isinstance(parameters.get("srun_args"), str):
        parameters["srun_args"] = shlex.split(parameters["srun_args"])
    if parameters.get("exclusive") is False:
        del parameters["exclusive"]  # submitit writes a flag for any value it is given
    return parameters


def run_on_node(spec_data: dict[str, Any], workdir: str, timeout_s: float) -> dict[str, Any]:
    """The job: one trial through trial.launch on this node; its result also written to RESULT_FILE (atomically),
    so that the submitting process reads it from the shared file system whatever submitit does afterwards.

    submitit's warning signal (USR2, WARNING_SIGNAL_S before the time limit) raises in here: trial.launch then kills
    its ranks, and the result says the time limit came first (or the job was preempted)."""
    from submitit.core.utils import UncompletedJobError

    folder = Path(workdir)
    try:
        result = launch(TrialSpec.from_dict(spec_data), workdir=folder, timeout_s=timeout_s)
    except UncompletedJobError:
        # submitit's handler calls any USR2 a time-out for jobs under 50 minutes (core/job_environment.py
        # has_timed_out), which trials are; USR2 is what --signal asked for before the limit. A preemption sends
        # SIGTERM, which reaches the ranks (the parent then reads PREEMPTED from the controller).
        job = os.environ.get("SLURM_JOB_ID", "?")
        result = TrialResult(
            status="timeout",
            reason=f"SLURM job {job} reached its time limit's warning signal before the trial ended (raise it: "
            "--trial-timeout, or --slurm-option time=MINUTES)",
        )
    data = result.to_dict()
    yamlio.write_json(folder / RESULT_FILE, data)
    return data


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as the controller reports it: JobState, Reason, ExitCode, NodeList (empty where it does not say)."""

    state: str
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""

    @property
    def final(self) -> bool:
        return self.state in _FINAL_STATES


def read_state(job_id: str, fallback: Any = None) -> JobState | None:
    """The job's state from `scontrol show job`, else from submitit's sacct watcher (fallback: the submitit job);
    None when neither knows it (yet)."""
    done = _slurm_command("scontrol", "show", "job", "--oneliner", job_id)
    if done.returncode == 0 and done.stdout.strip():
        fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
        state = fields.get("JobState", "")
        if state:
            return JobState(state, fields.get("Reason", ""), fields.get("ExitCode", ""), fields.get("NodeList", ""))
    if fallback is not None:
        state = str(fallback.state).split()[0]  # sacct says "CANCELLED by 0"
        if state in _KNOWN_STATES:
            return JobState(state)
    return None


def classify(job_id: str, state: JobState) -> tuple[str, str]:
    """(status, reason) for a job that ended without writing its result (the table in this module's docstring)."""
    where = f"SLURM job {job_id}" + (f" on {state.nodes}" if state.nodes and state.nodes != "(null)" else "")
    why = f" ({state.reason})" if state.reason and state.reason != "None" else ""
    if state.state == "TIMEOUT":
        return "timeout", f"{where} reached its time limit before the trial wrote a result"
    if state.state == "OUT_OF_MEMORY":
        return "oom", f"{where} was killed for exceeding its memory (the node's out-of-memory handler)"
    if state.state in _OUTSIDE_KILLS:
        words = {"NODE_FAIL": "lost its node", "BOOT_FAIL": "could not boot its node"}
        ended = words.get(state.state, f"was {state.state.lower().replace('_', ' ')}")
        return "signal", f"{where} {ended} mid-trial{why}"
    code = f" with exit code {state.exit_code}" if state.exit_code else ""
    return "error", f"{where} ended {state.state}{code} and no result{why}"


@dataclass(kw_only=True)
class SlurmLauncher:
    """Runs each trial as a SLURM job; called as trial.launch is (the Tuner's launcher)."""

    settings: SlurmSettings = field(default_factory=SlurmSettings)
    poll_s: float = POLL_S
    state_poll_s: float = STATE_POLL_S

    def __call__(
        self, spec: TrialSpec, *, workdir: Path, timeout_s: float, should_prune: ShouldPrune | None = None
    ) -> TrialResult:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / RESULT_FILE).unlink(missing_ok=True)
        executor = _submitit().SlurmExecutor(folder=workdir / JOB_FOLDER)
        executor.update_parameters(**job_parameters(spec, timeout_s, self.settings))
        started = time.perf_counter()
        try:
            job = executor.submit(run_on_node, spec.to_dict(), str(workdir), timeout_s)
        except Exception as error:  # sbatch refused it (a resource the cluster lacks): this trial, not the study
            line = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            return TrialResult(status="error", reason=f"sbatch refused the trial's job: {line}", wall_s=0.0)
        logger.info("trial %s: SLURM job %s", spec.config.short(), job.job_id)
        try:
            result = self._wait(job, spec, workdir, should_prune)
        except BaseException:  # Ctrl-C in the controller: the job goes with it
            job.cancel(check=False)
            raise
        Path(spec.result_path + PROGRESS_SUFFIX).unlink(missing_ok=True)
        if result.wall_s is None:
            result.wall_s = time.perf_counter() - started
        return result

    def _wait(self, job: Any, spec: TrialSpec, workdir: Path, should_prune: ShouldPrune | None) -> TrialResult:
        """Files every poll_s (the result, the progress for pruning: the shared file system, cheap); the controller
        every state_poll_s (an RPC to slurmctld, which busy clusters ration)."""
        result_file = workdir / RESULT_FILE
        seen, asked_at = None, -math.inf
        while True:
            if result_file.exists():
                return self._killed_from_outside(job, TrialResult.from_dict(yamlio.read_json(result_file)))
            reason = _prune_reason(spec, should_prune)  # a progress file exists only while the trial runs
            if reason:
                job.cancel(check=False)
                return TrialResult(status="pruned", reason=reason)
            if time.monotonic() - asked_at >= self.state_poll_s:
                asked_at, state = time.monotonic(), read_state(job.job_id, job)
                if state is not None and (state.state, state.reason) != seen:
                    seen = (state.state, state.reason)
                    logger.info("SLURM job %s: %s (%s)", job.job_id, state.state, state.reason)
                if state is not None and state.final:
                    time.sleep(self.poll_s)  # a result renamed into place as the job ended: read it, not the state
                    if result_file.exists():
                        continue
                    status, reason = classify(job.job_id, state)
                    return TrialResult(status=status, reason=reason, log_tail=_log_tail(workdir, job))
            time.sleep(self.poll_s)

    def _killed_from_outside(self, job: Any, result: TrialResult) -> TrialResult:
        """A trial killed by a signal in a job the scheduler ended (cancelled, preempted, its time limit, its memory,
        its node): the scheduler's reason is the cause (its SIGTERM reached the ranks, which the trial's launcher saw
        as a signal)."""
        if result.status != "signal":
            return result
        deadline = time.monotonic() + FINAL_STATE_WAIT_S
        state = read_state(job.job_id, job)
        while (state is None or not state.final) and time.monotonic() < deadline:
            time.sleep(self.poll_s)  # the job ends a moment after its task wrote the result
            state = read_state(job.job_id, job)
        if state is not None and state.state in _SCHEDULER_KILLS:
            result.status, reason = classify(job.job_id, state)
            result.reason = f"{reason}; the trial was {result.reason}"
        return result


def _prune_reason(spec: TrialSpec, should_prune: ShouldPrune | None) -> str | None:
    if should_prune is None:
        return None
    try:
        progress = yamlio.read_json(spec.result_path + PROGRESS_SUFFIX)
    except (OSError, ValueError):
        return None
    return should_prune(progress) if progress else None


def _log_tail(workdir: Path, job: Any, chars: int = 4000) -> str:
    """The trial's own log when it started, else the job's (submitit's stderr: an import error, a missing path)."""
    for path in (workdir / "trial.log", Path(str(job.paths.stderr)), Path(str(job.paths.stdout))):
        try:
            return path.read_text(errors="replace")[-chars:]
        except OSError:
            continue
    return ""
