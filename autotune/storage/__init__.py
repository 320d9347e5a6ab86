"""Where studies live, and how several runs share one: a storage URL opened as Optuna's storage, its password hidden
and its driver named (opening.py); trials owned, kept alive by heartbeats or leases, and a dead run's trial failed
and queued once more (heartbeats.py)."""

from __future__ import annotations

from autotune.storage.heartbeats import (
    FOLDER_ATTR,
    GRACE_PERIOD_S,
    HEARTBEAT_INTERVAL_S,
    RESUME_ATTR,
    ask_trial,
    heartbeat,
    live_owners,
    owner_key,
    recover_stale_trials,
)
from autotune.storage.opening import (
    JOURNAL_PREFIX,
    SQLITE_PREFIX,
    URL_FORMS,
    describe_failure,
    local_file,
    open_storage,
    redact_url,
    sqlite_url,
    storage_errors,
    storage_failures,
)

__all__ = [
    "FOLDER_ATTR",
    "GRACE_PERIOD_S",
    "HEARTBEAT_INTERVAL_S",
    "JOURNAL_PREFIX",
    "SQLITE_PREFIX",
    "RESUME_ATTR",
    "URL_FORMS",
    "ask_trial",
    "describe_failure",
    "heartbeat",
    "live_owners",
    "local_file",
    "open_storage",
    "owner_key",
    "recover_stale_trials",
    "redact_url",
    "sqlite_url",
    "storage_errors",
    "storage_failures",
]
