"""The SLURM executor: a trial as a SLURM job, submitted through submitit, with trial.launch's signature.

The job runs trial.launch on its node (trial/slurm_on_node.py: the same ranks, process groups, hard timeout and
classified result as a local trial), in the trial's folder, which must be on a file system the node shares with this
process: the spec goes out there, and the result, the progress file (for pruning) and every log come back there. What
only the scheduler knows (the job cancelled, preempted, killed for its time limit or its memory, its node lost) is
read from the controller and classified as today's statuses (trial/slurm_state.py).

A trial that ran and failed (an OOM, a NaN, a crashed rank) keeps the status its own launcher gave it; one whose
ranks died of the SIGTERM the scheduler sends when it ends a job takes the scheduler's status and reason.

A job whose node the scheduler lost or took away (NODE_FAIL, BOOT_FAIL, PREEMPTED; for a multi-node trial, also a
failure that coincides with a node going down) says nothing about the trial's configuration: the trial is measured
once more in a new job (trial/slurm_loss.py). A job pinned to a node (a leader's confirmation) waits for it in the
queue a bounded time, then runs on another node (trial/slurm_pinning.py).

A job outlives the autotune process that submitted it. The job's id and spec are written beside the trial's files
(JOB_FILE), and the trial's folder is recorded in the study, so a rerun that retries a trial of a run that died
re-attaches to its job in that folder (running, queued or finished: its result is read from the shared folder) instead
of measuring it again; see SlurmLauncher.can_reattach.
"""

from __future__ import annotations

import logging
import math
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.errors import UserError
from autotune.trial.launch import ShouldPrune
from autotune.trial.slurm_loss import NODE_LOSS_ATTEMPTS, killed_from_outside, lost_its_node, multinode_loss
from autotune.trial.slurm_on_node import result_file, run_on_node
from autotune.trial.slurm_pinning import NodeNotFree, default_pin_wait_s, pinned_node
from autotune.trial.slurm_state import JobState, classify, read_state, slurm_command
from autotune.trial.spec import PROGRESS_SUFFIX, TrialResult, TrialSpec

__all__ = [
    "SlurmSettings",
    "SlurmLauncher",
    "check_slurm",
    "job_parameters",
    "same_trial",
]

logger = logging.getLogger(__name__)
JOB_FOLDER = "slurm"  # submitit's pickles and the job's stdout/stderr, inside the trial's folder
JOB_FILE = "slurm-job.json"  # the trial's current job: its id and spec, for a rerun to re-attach to
START_GRACE_S = 60.0  # the job's time limit covers the trial's timeout plus the interpreter's start and the unpickling
WARNING_SIGNAL_S = 30  # submitit's USR2 before the time limit: the trial is stopped and its result written in time
POLL_S = 0.5  # the trial's files on the shared folder
STATE_POLL_S = 5.0  # the controller (scontrol): a trial's end is read from its result file, not from here
# What may differ between two specs of one trial: paths (each run has its own data file) and the timing, which a run
# lengthens on a busy machine (preflight); the configuration, workload, options, device and seed may not.
# (the budget's deadline for the window, too: a rerun's budget ends at another time)
_RUN_FIELDS = ("data_file", "result_path", "timing", "collective_timeout_s", "window_deadline_unix_s")


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmSettings:
    """Where and how trials are submitted: the partition and any further submitit/sbatch parameter (time, mem,
    cpus_per_task, account, qos, constraint, exclusive...), which override what the executor derives per trial."""

    partition: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    pin_wait_s: float | None = None  # a pinned job's queue wait (trial/slurm_pinning.py); None: from --budget


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
    done = slurm_command("sinfo", "--noheader", "--format=%P", *(["--partition", str(partition)] if partition else []))
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UserError(f"--executor slurm: the SLURM controller does not answer sinfo ({detail})")
    if partition and not done.stdout.strip():
        raise UserError(f"--slurm-partition {partition}: no such partition on this cluster (sinfo lists the ones)")


def job_parameters(spec: TrialSpec, timeout_s: float, settings: SlurmSettings) -> dict[str, Any]:
    """What one trial asks of the scheduler, as submitit's SlurmExecutor parameters.

    One node and one task: the task is trial.launch, which starts the ranks itself as it does locally; a trial of
    --nodes M asks for M nodes, one task on each (torchrun there: trial/multinode.py). On CUDA one GPU per rank.
    The whole node by default (exclusive): a throughput trial that shares its node measures its neighbours. CPUs
    (per node): one per rank and per DataLoader worker, the least the trial needs (an exclusive job gets the
    node's every CPU anyway, and srun gives its one task all of them). The time limit is the trial's hard timeout
    plus START_GRACE_S, in whole minutes as SLURM counts them. settings.options override any of these.
    """
    config = spec.config
    per_node = config.world_size // spec.nodes  # --nodes M: M nodes, one task each (trial/multinode.py)
    parameters: dict[str, Any] = {
        "nodes": spec.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": per_node * (1 + config.num_workers),
        "time": max(1, math.ceil((timeout_s + START_GRACE_S + WARNING_SIGNAL_S) / 60)),
        "exclusive": True,
        "signal_delay_s": WARNING_SIGNAL_S,
        "job_name": f"autotune-{Path(spec.result_path).parent.name}",
    }
    if spec.device_type == "cuda":
        parameters["gpus_per_node"] = per_node
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
    # autotune measures a trial again when its node is lost (SlurmLauncher); SLURM's own requeue would hold the job
    # back two minutes and run it again unseen, over the first run's files.
    parameters["additional_parameters"] = {"no_requeue": True, **(parameters.get("additional_parameters") or {})}
    return parameters


def same_trial(recorded: dict[str, Any], spec: TrialSpec) -> bool:
    """Whether a recorded spec (JOB_FILE) measures the same trial as this one: only paths and timing may differ."""
    mine = spec.to_dict()
    return all(recorded.get(key) == value for key, value in mine.items() if key not in _RUN_FIELDS)


@dataclass(kw_only=True)
class SlurmLauncher:
    """Runs each trial as a SLURM job; called as trial.launch is (the Tuner's launcher)."""

    settings: SlurmSettings = field(default_factory=SlurmSettings)
    poll_s: float = POLL_S
    state_poll_s: float = STATE_POLL_S
    fingerprint: str | None = None  # the study's hardware fingerprint: each job checks its node's (run_on_node)
    # Set by the controller (search/in_flight.py) when Ctrl-C reaches it: every trial waiting in another thread cancels
    # its job and raises KeyboardInterrupt there (a signal reaches only the main thread).
    stop: threading.Event = field(default_factory=threading.Event)
    # The node the next jobs ask for (a leader's confirmations, where it was measured first: in_flight.on_node);
    # None: any node of the partition.
    node: str | None = None
    budget_s: float | None = None  # the run's --budget: a pinned job's default queue wait (trial/slurm_pinning.py)
    # What each job runs its trial with (slurm_on_node.run_on_node's measure): trial.launch where None; the user's own
    # training command's launcher for `--command` (picklable: submitit sends it to the node).
    measure: Callable[..., TrialResult] | None = None
    _not_free: set[str] = field(default_factory=set, repr=False)  # pinned nodes that did not come free in the wait

    def __call__(
        self, spec: TrialSpec, *, workdir: Path, timeout_s: float, should_prune: ShouldPrune | None = None
    ) -> TrialResult:
        workdir.mkdir(parents=True, exist_ok=True)
        started, asked = time.perf_counter(), self.node
        job, pinned_until = self._reattach(spec, workdir), None
        lost: list[str] = []  # the job ids of earlier jobs of this trial that lost their node
        while True:
            if job is None:
                node = pinned_node(asked, self._not_free, spec.config.short())
                job = self._submit(spec, workdir, timeout_s, node)
                if isinstance(job, TrialResult):
                    return job
                pinned_until = time.monotonic() + self._pin_wait_s() if node else None
            try:
                result, state = self._wait(job, spec, workdir, should_prune, pinned_until)
            except NodeNotFree:
                self._not_free.add(str(asked))
                job = None
                continue
            except BaseException:  # Ctrl-C in the controller: the job goes with it
                job.cancel(check=False)
                raise
            if not lost_its_node(result, state) or len(lost) + 1 >= NODE_LOSS_ATTEMPTS:
                break
            lost.append(job.job_id)
            logger.warning("%s; the trial is measured again in a new job", result.reason)
            job, pinned_until = None, None
        Path(spec.result_path + PROGRESS_SUFFIX).unlink(missing_ok=True)
        if lost and lost_its_node(result, state):
            result.reason += f"; its earlier job {', '.join(lost)} had lost its node too"
        if result.wall_s is None:
            result.wall_s = time.perf_counter() - started
        result.asked_node = asked or ""
        return result

    def _pin_wait_s(self) -> float:
        wait_s = self.settings.pin_wait_s
        return default_pin_wait_s(self.budget_s) if wait_s is None else wait_s

    @staticmethod
    def can_reattach(workdir: Path) -> bool:
        """Whether a trial folder holds a job that a rerun may re-attach to (the Tuner then measures a dead run's
        trial in its own folder rather than a new one)."""
        return (workdir / JOB_FILE).is_file()

    def _submit(self, spec: TrialSpec, workdir: Path, timeout_s: float, node: str | None = None) -> Any:
        """A new job for the trial (a submitit job) on `node` where one is given, or the error TrialResult when sbatch
        refuses it. The progress an earlier job of this trial left goes first (the pruner reads it); its logs and
        result file stay."""
        Path(spec.result_path + PROGRESS_SUFFIX).unlink(missing_ok=True)
        executor = _submitit().SlurmExecutor(folder=workdir / JOB_FOLDER)
        parameters = job_parameters(spec, timeout_s, self.settings)
        if node:
            parameters["nodelist"] = node
        executor.update_parameters(**parameters)
        try:
            job = executor.submit(run_on_node, spec.to_dict(), str(workdir), timeout_s, self.fingerprint, self.measure)
        except Exception as error:  # sbatch refused it (a resource the cluster lacks): this trial, not the study
            line = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            return TrialResult(status="error", reason=f"sbatch refused the trial's job: {line}", wall_s=0.0)
        yamlio.write_json(workdir / JOB_FILE, {"job_id": job.job_id, "spec": spec.to_dict()})
        logger.info("trial %s: SLURM job %s", spec.config.short(), job.job_id)
        return job

    def _reattach(self, spec: TrialSpec, workdir: Path) -> Any | None:
        """The job an earlier autotune process submitted for this trial in this folder, if its result can still be
        had: the job is queued or running (its measurement is as good as a new one: the node is its own, the
        controller takes no part in it), or it ended and the controller or its result file says how. A job that
        measures another configuration is cancelled; one nobody knows any more, without a result, is lost. None
        then: the trial runs in a new job."""
        try:
            recorded = yamlio.read_json(workdir / JOB_FILE)
            job_id = str(recorded["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        job = _submitit().SlurmJob(folder=workdir / JOB_FOLDER, job_id=job_id)
        if not same_trial(recorded.get("spec") or {}, spec):
            job.cancel(check=False)
            logger.warning("SLURM job %s in %s measured another trial; cancelled, the trial runs anew", job_id, workdir)
            return None
        state = read_state(job_id, job)
        if not result_file(workdir, job_id).exists() and state is None:
            logger.warning("SLURM job %s of an earlier run is gone without a result; the trial runs anew", job_id)
            return None
        logger.info(
            "trial %s: re-attached to SLURM job %s of an earlier run (%s)",
            spec.config.short(),
            job_id,
            state.state if state else "its result is written",
        )
        return job

    def _wait(
        self, job: Any, spec: TrialSpec, workdir: Path, should_prune: ShouldPrune | None, pinned_until: float | None
    ) -> tuple[TrialResult, JobState | None]:
        """The trial's result and the job's final state where it was read. Files every poll_s (the result, the
        progress for pruning: the shared file system, cheap); the controller every state_poll_s (an RPC to
        slurmctld, which busy clusters ration). A pinned job still pending at pinned_until (monotonic) is cancelled
        and NodeNotFree raised."""
        written = result_file(workdir, job.job_id)
        seen, asked_at = None, -math.inf
        while True:
            if self.stop.is_set():
                raise KeyboardInterrupt  # __call__ cancels the job
            if written.exists():
                return self._explained(job, spec, TrialResult.from_dict(yamlio.read_json(written)))
            reason = _prune_reason(spec, should_prune)  # a progress file exists only while the trial runs
            if reason:
                job.cancel(check=False)
                return TrialResult(status="pruned", reason=reason), None
            if time.monotonic() - asked_at >= self.state_poll_s:
                asked_at, state = time.monotonic(), read_state(job.job_id, job)
                if state is not None and (state.state, state.reason) != seen:
                    seen = (state.state, state.reason)
                    logger.info("SLURM job %s: %s (%s)", job.job_id, state.state, state.reason)
                if state is not None and state.state == "PENDING" and pinned_until and asked_at >= pinned_until:
                    job.cancel(check=False)
                    logger.warning(
                        "SLURM job %s waited %.0f s for its node (%s) and was cancelled; trial %s runs on another node",
                        job.job_id, self._pin_wait_s(), state.reason, spec.config.short(),
                    )  # fmt: skip
                    raise NodeNotFree(job.job_id)
                if state is not None and state.final:
                    time.sleep(self.poll_s)  # a result renamed into place as the job ended: read it, not the state
                    if written.exists():
                        continue
                    status, reason = classify(job.job_id, state)
                    return TrialResult(status=status, reason=reason, log_tail=_log_tail(workdir, job)), state
            time.sleep(self.poll_s)

    def _explained(self, job: Any, spec: TrialSpec, result: TrialResult) -> tuple[TrialResult, JobState | None]:
        """A trial's own result with what the scheduler knows of its end (trial/slurm_loss.py): a signal the scheduler
        sent, and for a multi-node trial that failed, a node lost meanwhile."""
        if spec.nodes > 1 and not result.feasible:
            return multinode_loss(job, result, poll_s=self.poll_s, state_poll_s=self.state_poll_s)
        return killed_from_outside(job, result, self.poll_s)


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
