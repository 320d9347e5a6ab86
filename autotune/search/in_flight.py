"""A trial between the study's ask and its tell, and search trials in flight at once (--parallel N with --executor
slurm): each trial's launch waits in a thread of its own while its job runs on a node of its own; everything else
stays in the Tuner's main thread.

The design keeps all bookkeeping single-threaded: the main thread asks Optuna for each trial, builds its spec, starts
it here, and takes each result back (InFlight.next_done) to tell the study, append the record, move the budget and
call the reporter, exactly as for a trial measured alone. A thread only runs `measure` (the launcher's wait for its
job, with the trial's heartbeat), so no lock guards the Tuner's records, reporter or budget. Optuna's storage is the
one coordinator between trials in flight (ask and tell are the main thread's; the heartbeats are threads already).

Ctrl-C reaches the main thread only: InFlight.cancel_all sets the launcher's stop event, each waiting thread cancels
its job (scancel through submitit) and ends, and the main thread tells the study each of those trials FAILED.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.knobs.config import TrialConfig
from autotune.search.candidates import Candidate, TrialRecord
from autotune.search.pruning import Pruner
from autotune.trial import TrialResult, TrialSpec

__all__ = ["Started", "InFlight", "measure", "tell", "on_node", "placement_notes", "FEASIBILITY", "RESULT_RESERVE_S"]

logger = logging.getLogger(__name__)
FEASIBILITY = "infeasible"  # the constraint told to Optuna: > 0 means the configuration cannot be used
WAIT_S = 0.5  # the main thread's wait for a finished trial, in slices Ctrl-C can interrupt
# Seconds a trial the budget cuts keeps, between its window's end and the budget's kill, to write its result: the
# summary, the DataLoader workers' shutdown and the JSON, with room for a loaded machine (docs/how-it-measures.md).
RESULT_RESERVE_S = 5.0


@dataclass(kw_only=True, slots=True)
class Started:
    """A trial asked from the study and specified, not yet told: what its launch and its record need."""

    trial: optuna.Trial
    role: str
    config: TrialConfig
    folder: Path
    spec: TrialSpec
    pruner: Pruner | None


class InFlight:
    """Up to `size` trials measured side by side; `measure` runs in a worker thread per trial.

    Args:
        size: trials in flight at most (--parallel).
        measure: launches one started trial and returns its result (the Tuner's heartbeat-wrapped launch).
        stop: the launcher's stop event (SlurmLauncher.stop), set on Ctrl-C; None where the launcher has none.
    """

    def __init__(
        self, size: int, measure: Callable[[Started], TrialResult], stop: threading.Event | None = None
    ) -> None:
        self.size, self.measure, self.stop = size, measure, stop
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="autotune-trial")
        self._running: dict[concurrent.futures.Future[TrialResult], Started] = {}

    def __len__(self) -> int:
        return len(self._running)

    @property
    def full(self) -> bool:
        return len(self._running) >= self.size

    def start(self, started: Started) -> None:
        self._running[self._pool.submit(self.measure, started)] = started

    def next_done(self) -> tuple[Started, TrialResult]:
        """Wait for any trial in flight to end; its result (an exception in its thread is raised here)."""
        while True:
            done, _ = concurrent.futures.wait(self._running, timeout=WAIT_S, return_when="FIRST_COMPLETED")
            if done:
                future = next(iter(done))
                started = self._running.pop(future)
                return started, future.result()

    def cancel_all(self) -> list[tuple[Started, Any]]:
        """Cancel every trial in flight (their jobs with them) and wait for their threads; each trial with its result
        where it ended meanwhile, else with the exception that ended it."""
        if self.stop is not None:
            self.stop.set()
        ended: list[tuple[Started, TrialResult | BaseException]] = []
        for future, started in list(self._running.items()):
            try:
                ended.append((started, future.result()))
            except BaseException as error:  # the KeyboardInterrupt each cancelled wait raises
                ended.append((started, error))
        self._running.clear()
        if self.stop is not None:
            self.stop.clear()  # the launcher serves the run's closing trials
        if ended:
            logger.warning("cancelled %d trial(s) in flight", len(ended))
        return ended

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def measure(
    launch_trial: Callable[..., TrialResult],
    spec: TrialSpec,
    folder: Path,
    pruner: Pruner | None,
    *,
    timeout_s: float,
    cut_by_budget: bool,
    room: Callable[[float], bool],
) -> TrialResult:
    """Launch a trial; one whose throughput was erratic is measured once more, and only a second erratic window
    condemns it (a passing load on a shared machine must not; a configuration that stalls does it again).

    A window other processes disturbed (trial/child.py's gate) is kept as it is, not retried at once into the same
    load: a disturbed leader is re-measured in confirmation, interleaved with the others.

    timeout_s: the trial's, cut to what is left of --budget where cut_by_budget; room(seconds): whether the budget
    has room for measuring it once more. Where the budget cuts it, the child is told when (less RESULT_RESERVE_S to
    write its result): a window that has timed enough by then is kept, shorter and marked so (window_cut_by_budget), a
    measurement like any other; one that has not is "stopped", as is a trial the budget's kill ends."""

    def launched(spec: TrialSpec, workdir: Path) -> TrialResult:
        if cut_by_budget:  # the child ends its window in time to write what it timed (trial/loop.py measure)
            deadline = time.time() + max(timeout_s, 1.0) - RESULT_RESERVE_S
            spec = dataclasses.replace(spec, window_deadline_unix_s=deadline)
        result = launch_trial(spec, workdir=workdir, timeout_s=max(timeout_s, 1.0), should_prune=pruner)
        if result.status == "timeout" and cut_by_budget:  # the budget's end, not the configuration's verdict
            result.status, result.reason = "stopped", f"stopped when --budget ran out, after {timeout_s:.0f} s"
        if result.window_cut_by_budget:
            logger.warning(
                "%s: --budget ran out during its window; kept as measured over %.0f s of the %.0f s planned",
                spec.config.short(),
                result.window_s or 0.0,
                result.window_planned_s or 0.0,
            )
        return result

    result = launched(spec, folder)
    if result.disturbed:
        logger.warning("%s: %s", spec.config.short(), result.reason)
    if result.status != "erratic":
        return result
    if not room(result.wall_s or 0.0):
        result.reason += "; no room left in --budget to measure it again"
        return result
    logger.warning("%s: %s; measuring it once more", spec.config.short(), result.reason)
    retry_spec = dataclasses.replace(spec, result_path=str(folder / "retry" / "result.json"))
    retry = launched(retry_spec, folder / "retry")
    retry.wall_s = (retry.wall_s or 0.0) + (result.wall_s or 0.0)
    if retry.status == "erratic":
        retry.reason = f"{retry.reason}, and CV {result.throughput_cv:.2f} in the first window"
    return retry


def tell(study: optuna.Study, started: Started, record: TrialRecord) -> None:
    """Record the trial in the study. If another run has meanwhile failed it as stale (this run's heartbeat went
    unheard, e.g. the database was unreachable), the study keeps that verdict; this run keeps its measurement."""
    trial, result, pruner = started.trial, record.result, started.pruner
    try:
        trial.set_user_attr("role", record.role)
        trial.set_user_attr("config", record.config.to_dict())
        trial.set_user_attr("result", {k: v for k, v in result.to_dict().items() if k != "log_tail"})
        if result.status == "stopped":  # no verdict: the samplers leave a failed trial out, as for an interruption
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif result.status == "pruned" and pruner is not None:
            # Optuna's samplers read a pruned trial through its last intermediate value.
            trial.report(pruner.last_rate, step=0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            trial.set_constraint(FEASIBILITY, 0.0 if result.feasible else 1.0)
            study.tell(trial, record.value)
    except (RuntimeError, ValueError) as error:
        state = study._storage.get_trial(trial._trial_id).state  # noqa: SLF001 - no public accessor
        if not state.is_finished():
            raise
        logger.warning(
            "trial #%d was marked %s by another run while this one measured it (%s); its result counts in this run "
            "only",
            trial.number,
            state.name,
            error,
        )


@contextlib.contextmanager
def on_node(launcher: Any, leader: Candidate) -> Iterator[None]:
    """Trials launched in the block ask for the node that first measured `leader` (SlurmLauncher.node), so that a
    leader's confirmations compare like with like when its search trials ran on several nodes at once. Where that
    node is down, drained or not free within the pinned queue wait (trial/slurm_pinning.py, which says why another node
    is better than no confirmation) the trial runs on another, and its result's node and asked_node say so. A launcher
    without nodes (a local run) is left as it is."""
    node = next((record.result.node for record in leader.records if record.result.node), "")
    if not node or not hasattr(launcher, "node"):
        yield
        return
    launcher.node = node
    try:
        yield
    finally:
        launcher.node = None


def placement_notes(candidates: list[Candidate]) -> list[str]:
    """A note for each confirmed leader whose confirmations ran on a node other than the one they asked for (on_node):
    its median then mixes windows of like nodes (the study's fingerprint) but not of one node."""
    notes = []
    for candidate in candidates:
        results = [record.result for record in candidate.records]
        elsewhere = [result for result in results if result.asked_node and result.node != result.asked_node]
        if elsewhere:
            asked = elsewhere[0].asked_node
            ran = ", ".join(sorted({result.node or "an unknown node" for result in elsewhere}))
            notes.append(
                f"{len(elsewhere)} confirmation(s) of {candidate.config.short()} ran on {ran}, not on {asked} where it "
                f"was first measured ({asked} was down, drained or not free within --slurm-pin-wait): its median "
                "mixes windows of like nodes, not of one"
            )
    return notes
