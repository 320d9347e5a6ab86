"""Where studies live, and how several runs share one safely: storage URLs, heartbeats, stale trials, retries.

`--storage` takes an SQLAlchemy URL for Optuna's RDBStorage (`sqlite:///results/studies.db`,
`postgresql://user@host/db` for several machines) or `journal:///path/to/study.log` (Optuna's JournalStorage on a
file, for several processes on one host). A run that dies (SIGKILL, power loss) leaves its current trial RUNNING;
the next run that asks for a trial fails it and enqueues it once more:

- on RDB storages through Optuna's heartbeat: the parent beats while its trial runs, and a trial whose beat is older
  than the grace period is failed by `optuna.storages.fail_stale_trials`. Optuna beats only inside
  `Study.optimize`; autotune asks and tells, so it beats itself (`heartbeat`) and calls the check before each ask;
- on any storage, at once, when the trial's owner (recorded in its user attributes: boot id, pid and the process's
  start time) was a process of this machine's current boot that no longer exists. The journal storage has no
  heartbeat, so there an owner from an earlier boot of the same host counts as dead too.

Credentials never leave this module unredacted: every message names the storage through `redact_url`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import UserError

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "JOURNAL_PREFIX",
    "GRACE_PERIOD_S",
    "redact_url",
    "open_storage",
    "ask_trial",
    "heartbeat",
    "recover_stale_trials",
]

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30
GRACE_PERIOD_S = 120  # four missed beats: a busy database is not a dead run
JOURNAL_PREFIX = "journal://"
_SQLITE_TIMEOUT_S = 60
_SCHEMA_ATTEMPTS = 4  # concurrent runs on one SQLite file wait for its lock instead of failing
_URL_FORMS = "sqlite:///path/to/file.db, postgresql://user@host/db or journal:///path/to/file.log"


def redact_url(url: str) -> str:
    """A storage URL without its password (user:password@ or a password= query), for anything printed or written."""
    url = re.sub(r"(//[^/:@]*):.*@", r"\1:***@", url)
    return re.sub(r"(?i)(password=)[^&]*", r"\1***", url)


def open_storage(
    url: str, *, heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S, grace_period_s: int = GRACE_PERIOD_S
) -> BaseStorage:
    """An Optuna storage for a URL; the error for a bad one is one line with the password redacted.

    Args:
        url: `journal://PATH` or an SQLAlchemy database URL (sqlite, postgresql, mysql).
        heartbeat_interval_s: seconds between a running trial's heartbeats (RDB storages).
        grace_period_s: a RUNNING trial whose last heartbeat is older than this is failed by the next run.

    Raises:
        UserError: an unknown scheme, a missing driver, an unreachable or unwritable database.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if url.startswith(JOURNAL_PREFIX):
                return _journal(url)
            if "://" not in url:
                raise ValueError("no scheme")
            engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
            if url.startswith("sqlite"):
                engine_kwargs = {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}}
            return _rdb(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval_s,
                grace_period=grace_period_s,
                heartbeat_stale_trial_callback=_retry_once,
            )
    except UserError:
        raise
    except ImportError:  # SQLAlchemy's default PostgreSQL driver is psycopg (3)
        raise UserError(
            f"cannot open storage {redact_url(url)}: its database driver is not installed "
            "(for PostgreSQL: pip install 'psycopg[binary]')"
        ) from None
    except Exception as error:  # SQLAlchemy raises many kinds for a bad URL; all mean the same to the user
        raise UserError(f"cannot open storage {redact_url(url)} ({type(error).__name__}); use {_URL_FORMS}") from None


def _rdb(url: str, **kwargs: Any) -> BaseStorage:
    """RDBStorage, tried again when another process is creating the same fresh database's tables right now."""
    import sqlalchemy.exc

    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as e:
            racing = not isinstance(e, sqlalchemy.exc.OperationalError) or "already exists" in str(e)
            if not racing or attempt == _SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.5 + attempt)  # the other process's CREATE TABLE / version row wins the race; then load
    raise AssertionError("unreachable")


def _journal(url: str) -> BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    path = Path(url[len(JOURNAL_PREFIX) :]).expanduser()
    if not path.name or not path.parent.is_dir():
        raise UserError(f"journal storage {url}: folder {path.parent} does not exist; create it or use {_URL_FORMS}")
    return JournalStorage(JournalFileBackend(str(path)))


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
    trial.set_user_attr("owner", _owner())
    if _heartbeat_interval(study):
        study._storage.record_heartbeat(trial._trial_id)  # a trial with no beat at all is never judged stale
    return trial


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for `trial` from a thread while the block runs (RDB storages with a heartbeat; a no-op otherwise)."""
    interval = _heartbeat_interval(study)
    if not interval:
        yield
        return
    storage, trial_id, stop = study._storage, trial._trial_id, threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                storage.record_heartbeat(trial_id)
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

    A trial is stale when its heartbeat is past the grace period (RDB storages), or at once when its owner was a
    process of this machine that no longer exists.
    """
    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return []
    if _heartbeat_interval(study):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # calls _retry_once for each trial it fails
    heartbeats = bool(_heartbeat_interval(study))
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _owner_is_dead(trial.user_attrs.get("owner"), trust_hostname=not heartbeats):
            try:
                if study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                    _retry_once(study, study._storage.get_trial(trial._trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another run got there first
    finished = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))} & running
    for number in sorted(finished):
        logger.warning("trial %d was left running by a run that died; marked failed and enqueued again", number)
    return sorted(finished)


def _retry_once(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a dead run's trial again, once: its configuration was never measured, it may well be fine."""
    if "retry_of" in trial.user_attrs:
        return  # it died twice: perhaps it takes the machine down; leave it failed
    attrs = {"retry_of": trial.number, "role": trial.user_attrs.get("role", "search")}
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> str | None:
    """The process's start time since boot (field 22 of /proc/PID/stat): a reused pid has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name, which may contain spaces


def _owner() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start": _start_ticks(pid)}


def _owner_is_dead(owner: Any, *, trust_hostname: bool) -> bool:
    """Whether the process that owns a trial is provably gone (False when it cannot be told from here)."""
    if not isinstance(owner, dict) or owner.get("boot_id") is None:
        return False
    if owner["boot_id"] != _boot_id():
        # Another machine, or this one before a reboot: only the hostname can tell, and cloned machines share
        # hostnames, so it is trusted only where no heartbeat can decide (journal storage: one host by design).
        return trust_hostname and owner.get("host") == socket.gethostname()
    start = _start_ticks(int(owner.get("pid", -1)))
    return start is None or start != owner.get("start")
