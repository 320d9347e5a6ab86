"""How several runs share one study safely: each trial owned, kept alive while it runs, and a dead run's trial
failed and queued once more. A run that dies (SIGKILL, power loss) leaves its current trial RUNNING;
the next run that asks for a trial fails it and enqueues it once more:

- on RDB storages through Optuna's heartbeat: the parent beats while its trial runs, and a trial whose beat is older
  than the grace period is failed by `optuna.storages.fail_stale_trials`. Optuna beats only inside
  `Study.optimize`; autotune asks and tells, so it beats itself (`heartbeat`) and calls the check before each ask;
- on storages without a heartbeat (the journal), through a lease: the owner refreshes the trial's `lease` user
  attribute (a wall-clock time) as often as it would beat, and a lease older than the grace period means a dead run;
- on any storage, at once, when the trial's owner (recorded in its user attributes: boot id, PID namespace, pid and
  the process's start time) was a process of this machine's current boot *and of this PID namespace* that no longer
  exists. Containers and pods on one host share its boot id, but a pid means something only inside its own PID
  namespace: a neighbour's trial is never judged by a pid looked up here, only by its heartbeat or lease. The journal
  storage has no heartbeat, so there an owner from an earlier boot of the same host counts as dead too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = [
    "FOLDER_ATTR",
    "GRACE_PERIOD_S",
    "HEARTBEAT_INTERVAL_S",
    "RESUME_ATTR",
    "ask_trial",
    "heartbeat",
    "live_owners",
    "owner_key",
    "recover_stale_trials",
    "retry_once",
]

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30


GRACE_PERIOD_S = 120  # four missed beats: a busy database is not a dead run


LEASE_ATTR = "lease"  # the wall-clock time a journal trial's owner last said it was alive


FOLDER_ATTR = "folder"  # where a trial's files are (its log; a SLURM trial's job)


RESUME_ATTR = "resume_folder"  # on a dead run's trial enqueued again: the folder it was measured in


class _Heartbeat(Protocol):
    """Optuna's heartbeat API (its BaseHeartbeat mix-in, on RDB storages), found on a storage by _heartbeat_interval."""

    def record_heartbeat(self, trial_id: int) -> None: ...


def _heartbeat_interval(study: optuna.Study) -> int | None:
    storage = study._storage  # Optuna keeps the storage private; its heartbeat API is public on the storage
    getter = getattr(storage, "get_heartbeat_interval", None)
    return getter() if getter else None


def ask_trial(study: optuna.Study, params: dict[str, Any] | None = None) -> optuna.Trial:
    """A new RUNNING trial owned by this process: with these fixed parameters, or what the sampler suggests.

    Stale trials of dead runs are failed (and re-enqueued once) first. A trial with fixed parameters is created
    directly rather than through `enqueue_trial` + `ask`: with several processes on one study, `ask` pops the oldest
    WAITING trial of *any* process, so another run could take this one's baseline or confirmation and leave it a
    random configuration under the wrong role. A plain ask still pops WAITING trials: that is how a re-enqueued
    stale trial gets measured.
    """
    recover_stale_trials(study)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed", category=UserWarning)
        if params is None:
            trial = study.ask()
        else:
            template = optuna.trial.create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": params})
            trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
            study._thread_local.cached_all_trials = None  # as ask() does: the sampler must see the new trial
            trial = optuna.Trial(study, trial_id)
    try:
        trial.set_user_attr("owner", _owner())
        if _heartbeat_interval(study):
            # a trial with no beat at all is never judged stale; a heartbeat interval means the storage has the API
            cast(_Heartbeat, study._storage).record_heartbeat(trial._trial_id)
        else:
            trial.set_user_attr(LEASE_ATTR, time.time())
    except BaseException:  # Ctrl-C (or a storage error) before the caller holds the trial: leave nothing RUNNING
        with contextlib.suppress(Exception):
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        raise
    return trial


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for `trial` from a thread while the block runs: Optuna's heartbeat on RDB storages, the `lease` user
    attribute elsewhere (the journal)."""
    storage, trial_id, stop = study._storage, trial._trial_id, threading.Event()
    interval = _heartbeat_interval(study)

    def beat() -> None:
        while not stop.wait(interval or HEARTBEAT_INTERVAL_S):
            try:
                if interval:
                    cast(_Heartbeat, storage).record_heartbeat(trial_id)  # a heartbeat interval: it has the API
                else:
                    storage.set_trial_user_attr(trial_id, LEASE_ATTR, time.time())
            except Exception as error:  # a busy database must not end the beating: the next beat may get through
                logger.warning("heartbeat of trial %d failed: %s", trial.number, type(error).__name__)

    thread = threading.Thread(target=beat, name=f"autotune-heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials of dead runs and enqueue each once more; returns their numbers.

    A trial is stale when its heartbeat is past the grace period (RDB storages) or its lease is (the journal), or
    at once when its owner was a process of this machine and PID namespace that no longer exists.
    """
    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return []
    heartbeats = bool(_heartbeat_interval(study))
    if heartbeats:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # calls retry_once for each trial it fails
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _is_stale(trial, heartbeats=heartbeats):
            try:
                if study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                    retry_once(study, study._storage.get_trial(trial._trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another run got there first
    finished = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))} & running
    for number in sorted(finished):
        logger.warning("trial %d was left running by a run that died; marked failed and enqueued again", number)
    return sorted(finished)


def _is_stale(trial: FrozenTrial, *, heartbeats: bool) -> bool:
    """Whether a RUNNING trial's run is provably gone, judged from here (Optuna's heartbeat check runs apart)."""
    owner = trial.user_attrs.get("owner")
    alive = _owner_alive(owner, trust_hostname=not heartbeats)
    if alive is not None:
        return not alive
    lease = trial.user_attrs.get(LEASE_ATTR)
    if heartbeats or not isinstance(lease, (int, float)):
        return False  # Optuna's heartbeat decides; a trial of an older autotune without a lease is never guessed at
    return time.time() - lease > GRACE_PERIOD_S


def retry_once(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a dead run's trial again, once: its configuration was never measured, it may well be fine. Its
    folder goes with it: where the trial ran as a job that outlived its run (SLURM), the retry re-attaches to it."""
    if "retry_of" in trial.user_attrs:
        return  # it died twice: perhaps it takes the machine down; leave it failed
    attrs = {"retry_of": trial.number, "role": trial.user_attrs.get("role", "search")}
    if FOLDER_ATTR in trial.user_attrs:
        attrs[RESUME_ATTR] = trial.user_attrs[FOLDER_ATTR]
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)


def owner_key(owner: Any) -> str | None:
    """One run's identity as text (host, boot, PID namespace, pid, start time), or None for a trial without owner."""
    if not isinstance(owner, dict):
        return None
    return "/".join(str(owner.get(key)) for key in ("host", "boot_id", "pid_ns", "pid", "start"))


def live_owners(study: optuna.Study) -> set[str]:
    """The runs working on this study right now (owner_key): a process of this machine and PID namespace that is
    still alive, or a run with a trial RUNNING that nothing shows stale. Their trials are a concurrent run's, not
    a previous run's: a rerun must not warm-start from them as if they were history. This process is never among
    them: its runs follow one another (a library user's loop, tests), so an earlier one here has ended."""
    heartbeats = bool(_heartbeat_interval(study))
    live: set[str] = set()
    me = owner_key(_owner())
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE)):
        owner = trial.user_attrs.get("owner")
        key = owner_key(owner)
        if key is None or key in live or key == me:
            continue
        alive = _owner_alive(owner, trust_hostname=not heartbeats)
        if alive or (alive is None and trial.state == TrialState.RUNNING and not _is_stale(trial, heartbeats=False)):
            live.add(key)
    return live


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None


def _pid_namespace() -> str | None:
    """This process's PID namespace ('pid:[4026531836]'), when this /proc describes it; else None.

    A pid looked up in /proc means something only in the namespace of the process that mounted that /proc. In a
    container with its own /proc that is the container's namespace; a process in a new PID namespace that still sees
    the host's /proc (`unshare --pid --fork` without --mount-proc) is listed there under another pid. NSpid in
    /proc/self/status names this process's pid in every namespace from the /proc's down to its own: one entry, and
    it equals getpid(), exactly when the two namespaces are the same.
    """
    try:
        namespace = os.readlink("/proc/self/ns/pid")
        status = Path("/proc/self/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), None)
    return namespace if nspid == [str(os.getpid())] else None


def _start_ticks(pid: int) -> str | None:
    """The process's start time since boot (field 22 of /proc/PID/stat): a reused pid has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name, which may contain spaces


def _owner() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_ns": _pid_namespace(),
        "pid": pid,
        "start": _start_ticks(pid),
    }


def _owner_alive(owner: Any, *, trust_hostname: bool) -> bool | None:
    """Whether the process that owns a trial still runs: True, False, or None when it cannot be told from here."""
    if not isinstance(owner, dict) or owner.get("boot_id") is None:
        return None
    if owner["boot_id"] != _boot_id():
        # Another machine, or this one before a reboot: only the hostname can tell, and cloned machines share
        # hostnames, so it is trusted only where no heartbeat can decide (journal storage: one host by design).
        return False if trust_hostname and owner.get("host") == socket.gethostname() else None
    if "pid_ns" in owner:  # recorded since autotune knows PID namespaces; older owners are judged as before
        here = _pid_namespace()
        if here is None or owner["pid_ns"] != here:
            return None  # a container or pod beside this one on the same host: its pids are not ours to look up
    start = _start_ticks(int(owner.get("pid", -1)))
    return start is not None and start == owner.get("start")
