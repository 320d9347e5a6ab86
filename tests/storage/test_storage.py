"""Storage URLs, stale trials of dead runs (heartbeat and owner checks), a SIGKILLed run continued, and several
processes sharing one study: on a journal file, and on a real PostgreSQL server started on loopback."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune import storage
from autotune.cli import app
from autotune.errors import UserError
from autotune.storage import opening as storage_urls
from tests.fixtures import postgres
from tests.fixtures.runs import all_trials, run_args, sqlite_url, start, trial_processes, wait_for

PASSWORD = "s3cret-Pw0rd"


def _study(url: str, **kwargs) -> optuna.Study:
    return optuna.create_study(storage=storage.open_storage(url, **kwargs), study_name="s", direction="maximize")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://alice:s3/cr@t@db.example:5432/tune", "postgresql://alice:***@db.example:5432/tune"),
        (
            "postgresql://db.example/tune?user=alice&password=s3cret",
            "postgresql://db.example/tune?user=alice&password=***",
        ),
        ("sqlite:////tmp/studies.db", "sqlite:////tmp/studies.db"),
        ("journal:///tmp/study.log", "journal:///tmp/study.log"),
    ],
    ids=["userinfo", "query", "sqlite", "journal"],
)
def test_redact_url_hides_passwords_only(url, shown):
    assert storage_urls.redact_url(url) == shown


@pytest.mark.parametrize(
    ("installed", "url", "opened"),
    [
        (("psycopg", "psycopg2"), "postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        (("psycopg",), "postgres://u:pw@h:5432/db", "postgresql+psycopg://u:pw@h:5432/db"),
        (("psycopg2",), "postgresql://u@h/db", "postgresql+psycopg2://u@h/db"),
        ((), "postgresql://u@h/db", "postgresql://u@h/db"),  # nothing to name: SQLAlchemy's error, then the hint
        (("psycopg",), "postgresql+pg8000://u@h/db", "postgresql+pg8000://u@h/db"),  # the user's own choice
        (("psycopg",), "sqlite:////tmp/s.db", "sqlite:////tmp/s.db"),
    ],
    ids=["psycopg-first", "postgres-scheme", "psycopg2-only", "none", "named-driver", "sqlite"],
)
def test_a_postgresql_url_names_the_driver_that_is_installed(monkeypatch, installed, url, opened):
    # SQLAlchemy 2.0 (the newest for Python 3.10) reads a driverless postgresql:// as psycopg2, 2.1 as psycopg: the
    # driver the hint installs (psycopg) failed on every Python 3.10 until the URL named it
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name.startswith("psycopg"):
            return object() if name in installed else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert storage_urls.with_installed_driver(url) == opened


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("nosuchdb://alice:s3cret@localhost/x", "cannot open storage nosuchdb://alice:***@localhost/x"),
        ("results/studies.db", "use sqlite:///"),
        ("journal:///no/such/folder/study.log", "folder /no/such/folder does not exist"),
    ],
    ids=["scheme", "no-scheme", "journal-folder"],
)
def test_bad_storage_urls_are_one_line_user_errors(url, words):
    with pytest.raises(UserError) as error:
        storage.open_storage(url)
    assert words in str(error.value) and "s3cret" not in str(error.value)


def test_fixed_trials_are_not_taken_from_the_shared_queue(tmp_path):
    """A WAITING trial (another run's retry) goes to a plain ask, never to a trial with fixed parameters."""
    study = _study(f"journal://{tmp_path / 'study.log'}")
    study.enqueue_trial({"x": 1}, user_attrs={"retry_of": 7})
    fixed = storage.ask_trial(study, {"x": 2})
    assert fixed.suggest_categorical("x", [1, 2]) == 2 and "retry_of" not in fixed.user_attrs
    popped = storage.ask_trial(study)
    assert popped.suggest_categorical("x", [1, 2]) == 1 and popped.user_attrs["retry_of"] == 7
    assert popped.user_attrs["owner"]["pid"] == os.getpid()


def test_a_trial_of_a_dead_process_is_failed_at_once_and_retried_once(tmp_path):
    study = _study(f"journal://{tmp_path / 'study.log'}")
    trial = storage.ask_trial(study)
    trial.suggest_categorical("x", [1, 2])
    trial.set_user_attr(storage.FOLDER_ATTR, str(tmp_path / "trial-0000"))
    alive = storage.ask_trial(study)  # owned by this live process: left alone
    gone = subprocess.Popen(["true"])  # a pid that has just exited
    gone.wait()
    owner = dict(trial.user_attrs["owner"], pid=gone.pid)
    trial.set_user_attr("owner", owner)

    assert storage.recover_stale_trials(study) == [trial.number]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[trial.number] == TrialState.FAIL and states[alive.number] == TrialState.RUNNING
    retry = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("retry_of") == trial.number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    assert retry[0].system_attrs["fixed_params"] == trial.params
    assert retry[0].user_attrs[storage.RESUME_ATTR] == str(tmp_path / "trial-0000")  # where a SLURM job may live on

    # A retry that is itself left behind by a dead run is failed, not retried again.
    again = storage.ask_trial(study)
    assert again.user_attrs["retry_of"] == trial.number
    again.set_user_attr("owner", owner)
    assert storage.recover_stale_trials(study) == [again.number]
    assert not study.get_trials(deepcopy=False, states=(TrialState.WAITING,))


def test_heartbeat_fails_stale_trials_of_other_machines_and_spares_beating_ones(tmp_path):
    """Optuna's heartbeat only beats inside Study.optimize; autotune asks and tells, so it beats by itself."""
    study = _study(sqlite_url(tmp_path), heartbeat_interval_s=1, grace_period_s=2)
    silent = storage.ask_trial(study)
    silent.set_user_attr("owner", dict(silent.user_attrs["owner"], boot_id="another-machine"))
    beating = storage.ask_trial(study)
    with storage.heartbeat(study, beating):
        time.sleep(3.5)
        assert storage.recover_stale_trials(study) == [silent.number]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[silent.number] == TrialState.FAIL and states[beating.number] == TrialState.RUNNING
    assert [t.user_attrs["retry_of"] for t in study.get_trials(states=(TrialState.WAITING,))] == [silent.number]


def test_a_sigkilled_run_is_continued_without_losing_completed_trials(tiny_corpus, tmp_path):
    results = tmp_path / "results"
    url = sqlite_url(results)
    killed = start(run_args(tiny_corpus, results, "--trials", "3"), tmp_path / "first.log")

    def second_trial_running() -> bool:
        if not (results / "studies.db").exists():
            return False
        states = {t.number: t.state for t in all_trials(url)}
        return states.get(0) == TrialState.COMPLETE and states.get(1) == TrialState.RUNNING

    wait_for(second_trial_running, "trial 1 to run")
    wait_for(lambda: trial_processes(results), "trial 1's process")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    wait_for(lambda: not trial_processes(results), "the orphaned trial to die with its run", timeout_s=10)

    result = CliRunner().invoke(app, run_args(tiny_corpus, results, "--trials", "2", "--no-warm-start"))
    assert result.exit_code == 0, result.output
    trials = {t.number: t for t in all_trials(url)}
    assert trials[0].state == TrialState.COMPLETE and trials[0].user_attrs["result"]["status"] == "ok"
    assert trials[1].state == TrialState.FAIL
    retried = [t for t in trials.values() if t.user_attrs.get("retry_of") == 1]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE and retried[0].params == trials[1].params
    assert not [t for t in trials.values() if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert len(trials) == 4  # 0 kept, 1 failed, its retry and the second run's baseline


def _two_runs_at_once(tiny_corpus: Path, tmp_path: Path, url: str) -> list[str]:
    """Two `autotune run` processes on one study; returns their outputs."""
    processes = []
    for name in ("a", "b"):
        args = run_args(tiny_corpus, tmp_path / f"results-{name}", "--trials", "2", "--storage", url)
        processes.append((start(args, tmp_path / f"{name}.log"), tmp_path / f"{name}.log"))
    outputs = []
    for process, log in processes:
        assert process.wait(timeout=300) == 0, log.read_text()
        outputs.append(log.read_text())
    trials = all_trials(url)
    numbers = [t.number for t in trials]
    assert len(trials) == 4 and sorted(set(numbers)) == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    owners = sorted(t.user_attrs["owner"]["pid"] for t in trials)
    assert owners == sorted(2 * [process.pid for process, _ in processes])  # each run measured its own two
    return outputs


def test_two_processes_share_one_journal_study(tiny_corpus, tmp_path):
    _two_runs_at_once(tiny_corpus, tmp_path, f"journal://{tmp_path / 'study.log'}")


@pytest.fixture(scope="module")
def postgres_url() -> str:
    server = postgres.find_server()
    if server is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found; .ci/run installs the postgresql package")
    if postgres.server_user_missing():
        pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
    pytest.importorskip("psycopg", reason="psycopg is not installed; pip install -e '.[test]' brings it")
    with postgres.running(server, password=PASSWORD) as url:
        yield url


def test_two_processes_share_one_postgresql_study_and_the_password_never_shows(tiny_corpus, tmp_path, postgres_url):
    assert PASSWORD in postgres_url
    outputs = _two_runs_at_once(tiny_corpus, tmp_path, postgres_url)
    for output in outputs:
        assert PASSWORD not in output and "study:" in output
    written = [path for path in tmp_path.rglob("*") if path.is_file() and path.suffix != ".log"]
    assert any(path.suffix == ".yaml" for path in written)
    for path in written:
        assert PASSWORD.encode() not in path.read_bytes(), path
