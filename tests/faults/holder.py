"""A run's stand-in that holds one RUNNING trial and beats for it: `python -m tests.faults.holder URL INTERVAL_S`.

Started in a PID namespace of its own (a container beside the test), it prints 'ready NUMBER PID_NAMESPACE' once its
trial exists, then beats (Optuna's heartbeat on SQLite, the lease on a journal) until it is killed.
"""

from __future__ import annotations

import sys
import time

import optuna

from autotune import storage
from autotune.storage import heartbeats


def main(url: str, interval_s: str) -> None:
    heartbeats.HEARTBEAT_INTERVAL_S = float(interval_s)  # the lease's beat (journal storage)
    beat_s = max(1, round(float(interval_s)))  # Optuna's heartbeat counts whole seconds (SQLite)
    opened = storage.open_storage(url, heartbeat_interval_s=beat_s, grace_period_s=2 * beat_s)
    study = optuna.create_study(storage=opened, study_name="shared", direction="maximize", load_if_exists=True)
    trial = storage.ask_trial(study)
    trial.suggest_categorical("x", [1, 2])
    with storage.heartbeat(study, trial):
        print("ready", trial.number, trial.user_attrs["owner"]["pid_ns"], flush=True)
        time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:])
