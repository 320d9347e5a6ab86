"""Item 1: a run in another PID namespace on the same host (a container or pod beside this one) keeps its trial.

Containers on one host share its boot id, and a pid means something only inside its own PID namespace: the owner of
a trial records its namespace, and a run elsewhere leaves that trial to Optuna's heartbeat (RDB storages) or to the
lease the owner refreshes (journal). Once the neighbour is really gone (SIGKILLed), its trial is failed and enqueued
again after the grace period: nothing is lost either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import storage
from autotune.storage import heartbeats
from tests.faults.conftest import (
    NAMESPACE,
    kill_session,
    processes_with,
    python_env,
    require_namespaces,
    start_python,
)
from tests.fixtures.runs import ROOT, all_trials, run_args, start, wait_for

# Beats and grace periods, short: Optuna's heartbeat (SQLite) counts whole seconds, the journal's lease does not.
TIMING = {"sqlite": (1.0, 2.0), "journal": (0.25, 1.0)}


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> tuple[str, float, float]:
    """The storage URL, beat and grace of one kind; the grace applies to this process's checks."""
    interval_s, grace_s = TIMING[kind]
    monkeypatch.setattr(heartbeats, "GRACE_PERIOD_S", grace_s)  # the journal's lease
    monkeypatch.setattr(heartbeats, "HEARTBEAT_INTERVAL_S", interval_s)
    url = f"sqlite:///{tmp_path / 'studies.db'}" if kind == "sqlite" else f"journal://{tmp_path / 'study.log'}"
    return url, interval_s, grace_s


def _open(url: str) -> optuna.Study:
    opened = storage.open_storage(url, heartbeat_interval_s=1, grace_period_s=2)  # TIMING's SQLite figures
    return optuna.create_study(storage=opened, study_name="shared", direction="maximize", load_if_exists=True)


def _outlives_grace(study: optuna.Study, grace_s: float) -> None:
    """Checks for stale trials, several times over twice the grace period, fail nothing."""
    deadline = time.monotonic() + 2 * grace_s
    while time.monotonic() < deadline:
        assert storage.recover_stale_trials(study) == []
        time.sleep(grace_s / 4)


def _states(study: optuna.Study) -> dict[int, TrialState]:
    return {t.number: t.state for t in study.get_trials(deepcopy=False)}


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_neighbour_in_another_pid_namespace_keeps_its_trial_until_it_dies(tmp_path, monkeypatch, kind):
    require_namespaces()
    url, interval_s, grace_s = _setup(tmp_path, monkeypatch, kind)
    log = tmp_path / "holder.log"
    holder = start_python(["-m", "tests.faults.holder", url, str(interval_s)], log, prefix=NAMESPACE)
    try:
        wait_for(lambda: "ready" in log.read_text(), "the neighbour's trial", timeout_s=60)
        number, namespace = log.read_text().split("ready", 1)[1].split()[:2]
        assert namespace != os.readlink("/proc/self/ns/pid")  # it really is another namespace
        study = _open(url)
        owner = study.trials[int(number)].user_attrs["owner"]
        assert owner["pid"] < 10  # its pid in its own namespace, which means another process here (or none)
        _outlives_grace(study, grace_s)  # the live neighbour is left alone
        assert _states(study)[int(number)] == TrialState.RUNNING
        assert "marked FAIL" not in log.read_text()
    finally:
        kill_session(holder)  # SIGKILL: the neighbour dies with its trial RUNNING
    time.sleep(grace_s + 2 * interval_s)
    assert storage.recover_stale_trials(study) == [int(number)]
    states = _states(study)
    assert states[int(number)] == TrialState.FAIL
    retry = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("retry_of") == int(number)]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING  # measured again by the next run


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_an_owner_recorded_in_another_namespace_is_judged_by_its_beat_not_a_pid_here(tmp_path, monkeypatch, kind):
    """The injected twin of the test above (no unshare needed): the owner's pid is one that is dead here."""
    url, interval_s, grace_s = _setup(tmp_path, monkeypatch, kind)
    study = _open(url)
    neighbour = storage.ask_trial(study)
    gone = subprocess.Popen(["true"])
    gone.wait()
    neighbour.set_user_attr("owner", dict(neighbour.user_attrs["owner"], pid=gone.pid, pid_ns="pid:[4026530000]"))
    with storage.heartbeat(study, neighbour):  # it still beats: alive, wherever its pid points here
        _outlives_grace(study, grace_s)
    assert _states(study)[neighbour.number] == TrialState.RUNNING
    time.sleep(grace_s + 2 * interval_s)  # silent now: its run is gone
    assert storage.recover_stale_trials(study) == [neighbour.number]
    # Within this namespace a dead owner is still recognised at once, without waiting for any grace period.
    local = storage.ask_trial(study)
    local.set_user_attr("owner", dict(local.user_attrs["owner"], pid=gone.pid))
    assert storage.recover_stale_trials(study) == [local.number]


def test_a_process_that_sees_another_namespaces_proc_records_no_namespace(tmp_path):
    """`unshare --pid --fork` without --mount-proc: getpid() is this namespace's pid, /proc is the host's. Nobody
    may then judge the owner by pid (and it may judge nobody)."""
    require_namespaces()
    code = "from autotune.storage import heartbeats as h; print(h._owner()['pid_ns'], h._pid_namespace())"
    done = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=python_env(),
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["None", "None"]


@pytest.mark.slow
def test_two_runs_on_one_study_one_in_a_container_neither_fails_the_other(tiny_corpus, tmp_path):
    """The audit's reproduction: run A in a PID namespace with a long trial, run B on the same SQLite study."""
    require_namespaces()
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    steady = ["--trials", "1", "--storage", url, "--no-ceiling", "--max-throughput-cv", "0"]  # a busy CI is no fault
    a_args = run_args(tiny_corpus, tmp_path / "a", *steady, "--window", "6")
    with open(tmp_path / "a.log", "wb") as output:
        a = subprocess.Popen(
            [*NAMESPACE, sys.executable, "-m", "autotune", *a_args, "--no-amp-check"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=python_env(),
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: any(t.state == TrialState.RUNNING for t in _all(url)), "A's trial to run", timeout_s=120)
        b = start(run_args(tiny_corpus, tmp_path / "b", *steady), tmp_path / "b.log")
        assert b.wait(timeout=300) == 0, (tmp_path / "b.log").read_text()
        assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()
    finally:
        kill_session(a)
    a_log, b_log = (tmp_path / "a.log").read_text(), (tmp_path / "b.log").read_text()
    assert "marked FAIL" not in a_log and "left running by a run that died" not in b_log
    assert "warm start" not in b_log  # A's trials are a concurrent run's, not a previous run's
    trials = _all(url)
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    assert not processes_with(str(tmp_path))  # nothing left running


def _all(url: str) -> list[optuna.trial.FrozenTrial]:
    return all_trials(url) if Path(url.split(":///", 1)[1]).exists() else []
