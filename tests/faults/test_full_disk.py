"""Item 2 (and the leftover folders of item 9): outputs that cannot be written, found before any trial where they can
be, and a disk that fills during or at the end of a run.

Bad output paths are one line, exit 2, before any trial, and leave nothing behind. A disk that is full when the
result is written, or that fills mid-run under the study, is one line and exit 4: the trials the study recorded stay
in it, the best so far is written wherever the disk allows (and named in the error line where it does not), no
temporary file is left, nothing keeps running. Each disk test runs on a real small tmpfs; its twin injects ENOSPC at
the same call (os.fsync, a storage write) where no tmpfs can be mounted.
"""

from __future__ import annotations

import errno
import os

import optuna
import pytest
from optuna.trial import TrialState

from autotune import load_config, storage, yamlio
from autotune.errors import MachineFailure, OutputError
from autotune.result import history
from autotune.run import output as run_output
from autotune.trial import TrialResult
from tests.faults.conftest import error_line, fill, invoke, processes_with
from tests.fixtures.runs import all_trials, run_args, sqlite_url, start, wait_for
from tests.result.test_results import WITH_WORKERS, make_tuned

STEADY = ["--no-amp-check", "--no-ceiling", "--max-throughput-cv", "0"]  # a busy machine must not fail these runs
ONE_TRIAL = ["--trials", "1", *STEADY]


def test_an_out_that_is_a_folder_is_refused_before_anything_is_made(tiny_corpus, tmp_path):
    results = tmp_path / "results"
    result = invoke(run_args(tiny_corpus, results, "--out", str(tmp_path)))
    assert result.exit_code == 2
    assert f"--out {tmp_path} is a folder; give a file path" in error_line(result.stderr)
    assert not results.exists()


def test_an_out_with_a_name_that_is_not_utf8_is_refused_before_anything_is_made(tiny_corpus, tmp_path):
    results, out = tmp_path / "results", os.fsdecode(bytes(tmp_path / "r") + b"\xff.yaml")  # 'r\udcff.yaml'
    result = invoke(run_args(tiny_corpus, results, "--out", out))
    assert result.exit_code == 2 and "is not a valid UTF-8 name; rename it" in error_line(result.stderr)
    assert "\\xff" in error_line(result.stderr)  # shown, not a UnicodeEncodeError
    assert not results.exists() and not any(tmp_path.iterdir())


def test_a_refused_run_leaves_no_folders_behind(tmp_path):
    """Bad data is found after the output paths are checked: neither results/<model>/ nor --out's parents remain."""
    results, out = tmp_path / "results", tmp_path / "deep" / "er" / "r.yaml"
    result = invoke(run_args(tmp_path / "no-such-corpus", results, "--out", str(out)))
    assert result.exit_code == 2 and "no-such-corpus" in error_line(result.stderr)
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_full_disk_at_the_result_write_is_one_line_and_the_study_keeps_the_trials(tiny_corpus, tmp_path, small_disk):
    disk = small_disk(64)
    filler = fill(disk)  # an empty file still fits (the run's up-front check passes); the YAML does not
    results, log = tmp_path / "results", tmp_path / "run.log"
    process = start(run_args(tiny_corpus, results, *ONE_TRIAL, "--out", str(disk / "r.yaml")), log)
    assert process.wait(timeout=300) == 4, log.read_text()
    line = " ".join(error_line(log.read_text()).split())
    assert f"cannot write the result {disk / 'r.yaml'} (No space left on device)" in line
    assert "the winner was bs=5 w=0 fp32 at" in line and "the measured trials stay in the study" in line
    assert list(disk.iterdir()) == [filler]  # no half file, no temporary file
    trials = all_trials(sqlite_url(results))
    assert [t.state for t in trials] == [TrialState.COMPLETE] and trials[0].user_attrs["result"]["status"] == "ok"
    assert not processes_with(str(results))


def test_a_full_disk_at_the_result_write_injected(tmp_path, monkeypatch):
    """The twin: ENOSPC from fsync of the result's temporary file, the call a full disk fails first."""
    real_fsync = os.fsync

    def full_disk(descriptor: int) -> None:
        if os.readlink(f"/proc/self/fd/{descriptor}").startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(descriptor)

    monkeypatch.setattr(yamlio.os, "fsync", full_disk)
    with pytest.raises(MachineFailure) as caught:
        run_output.write_result(make_tuned(WITH_WORKERS), tmp_path / "r.yaml")
    assert caught.value.exit_code == 4 and "\n" not in str(caught.value)
    assert f"cannot write the result {tmp_path / 'r.yaml'} (No space left on device)" in str(caught.value)
    assert "the winner was bs=" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_disk_that_fills_under_the_study_mid_run_writes_the_best_so_far(tiny_corpus, tmp_path, small_disk):
    disk = small_disk(4096)
    url, results, log = f"sqlite:///{disk / 'studies.db'}", tmp_path / "results", tmp_path / "run.log"
    process = start(run_args(tiny_corpus, results, "--trials", "3", "--storage", url, *STEADY), log)

    def second_trial_running() -> bool:
        states = {t.number: t.state for t in all_trials(url)} if (disk / "studies.db").exists() else {}
        return states.get(0) == TrialState.COMPLETE and states.get(1) == TrialState.RUNNING

    wait_for(second_trial_running, "trial 1 to run")
    filler = fill(disk)
    assert process.wait(timeout=120) == 4, log.read_text()
    line = " ".join(error_line(log.read_text()).split())
    assert "the study's storage failed mid-run (OperationalError: database or disk is full)" in line
    (written,) = (results / "faulty").glob("*.yaml")
    assert f"best so far written to {written}" in line
    tuned = load_config(written)
    assert tuned.search["stopped_by"] == "storage failure" and tuned.metrics["winner"]["status"] == "ok"
    assert tuned.search["trials_this_run"] == 2  # trial 1 was measured: it counts, though the study could not record it
    assert len(history.load(results, "faulty")) == 1  # and the history has it
    assert not processes_with(str(results))
    filler.unlink()  # space again: the next run fails the trial left RUNNING and measures it once more
    study = optuna.load_study(study_name=None, storage=storage.open_storage(url))
    assert study.trials[0].state == TrialState.COMPLETE  # nothing recorded was lost
    assert storage.recover_stale_trials(study) == [1]
    assert [t.user_attrs.get("retry_of") for t in study.get_trials(states=(TrialState.WAITING,))] == [1]


def test_a_storage_that_fails_mid_run_injected(tiny_corpus, tmp_path, monkeypatch):
    """The twin, in this process: trials are canned results (no subprocess) and the storage fails at the second
    trial's first write after its measurement, as SQLite does on a full disk."""
    from autotune.search import tuner

    monkeypatch.setattr(tuner, "launch", lambda spec, **kwargs: TrialResult(status="ok", samples_per_second=50.0))
    real_set = optuna.trial.Trial.set_user_attr

    def failing_set(self, key, value):
        if key == "role" and self.number >= 1:
            raise optuna.exceptions.StorageInternalError("commit failed") from OSError(
                errno.ENOSPC, "database or disk is full"
            )
        real_set(self, key, value)

    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", failing_set)
    results = tmp_path / "results"
    result = invoke(run_args(tiny_corpus, results, "--trials", "3", "--no-amp-check", "--no-ceiling"))
    assert result.exit_code == 4, result.output
    line = error_line(result.stderr)
    assert "the study's storage failed mid-run (database or disk is full); best so far written to" in line
    (written,) = (results / "faulty").glob("*.yaml")
    assert load_config(written).search["stopped_by"] == "storage failure"
    assert load_config(written).search["trials_this_run"] == 2
    assert list(history.load(results, "faulty")["result_path"]) == [str(written)]


def test_a_folder_where_the_default_result_goes_is_found_before_any_trial(tmp_path):
    """The default output (results/<model>/<fingerprint>.yaml) is no --out the validation sees: the writability
    check catches a folder of that name, as it catches a file in place of a folder."""
    (tmp_path / "taken.yaml").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match=r"taken.yaml \(a folder of that name is in the way\)"):
        run_output.check_writable(tmp_path / "taken.yaml")
    with pytest.raises(OutputError, match=r"is a file, not a folder"):
        run_output.check_writable(tmp_path / "file" / "deeper" / "r.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "taken.yaml"]


def test_a_full_disk_when_the_study_is_created_is_exit_4_and_leaves_no_database(tiny_corpus, tmp_path, small_disk):
    """Before any trial: the study's database cannot be created on a full disk. The machine failed (exit 4, its own
    words), and the half-made database is removed with the folders the run made."""
    disk = small_disk(64)
    filler = fill(disk)
    results = disk / "results"
    result = invoke(run_args(tiny_corpus, results, *ONE_TRIAL))
    assert result.exit_code == 4, result.output
    line = error_line(result.stderr)
    assert "storage" in line and ("full" in line or "No space left" in line) and "free space" in line, line
    assert list(disk.iterdir()) == [filler]


def test_a_full_disk_when_the_study_is_created_injected(tiny_corpus, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        import sqlalchemy.exc

        (tmp_path / "results" / "studies.db").write_bytes(b"half")  # what SQLite left before it failed
        raise sqlalchemy.exc.OperationalError("CREATE TABLE", {}, Exception("database or disk is full"))

    monkeypatch.setattr(optuna, "create_study", full)
    results = tmp_path / "results"
    result = invoke(run_args(tiny_corpus, results, *ONE_TRIAL))
    assert result.exit_code == 4, result.output
    assert "database or disk is full" in error_line(result.stderr)
    assert not results.exists()
