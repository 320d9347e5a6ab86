"""A user's file is never overwritten, and every path autotune derives stays where the user named: what is at --out
is a regular file autotune wrote (or --force says to replace it), a workload named `..` keeps its folder inside
--results-dir, and a folder name that looks like a URL query stays a folder name in the study's SQLite URL."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from autotune import storage
from autotune.errors import OutputError
from autotune.result.history import folder_name
from autotune.run import runner
from autotune.run.plan import RunRequest
from autotune.search.settings import TunerSettings
from tests.faults.conftest import error_line, invoke
from tests.fixtures.runs import FIXTURES, run_args
from tests.result.test_results import make_tuned


def _refused(args: list[str]) -> str:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    return error_line(result.stderr)


def test_an_out_that_holds_a_file_autotune_did_not_write_is_refused_before_anything(tiny_corpus, tmp_path):
    notes = tmp_path / "notes.yaml"
    notes.write_text("my notes\n")
    results = tmp_path / "results"
    line = _refused(run_args(tiny_corpus, results, "--out", str(notes)))
    assert f"--out {notes} holds a file autotune did not write" in line and "pass --force to replace it" in line
    assert notes.read_text() == "my notes\n"  # untouched
    assert not results.exists()  # no study, no folder: refused before anything was created


def test_force_lets_the_result_replace_it_and_an_earlier_result_needs_no_force(tiny_corpus, tmp_path):
    """What prepare() accepts: a foreign file with --force, and autotune's own result without it (a rerun)."""
    notes = tmp_path / "notes.yaml"
    notes.write_text("my notes\n")
    request = RunRequest(
        model="tests.fixtures.faulty_workload:workload",
        data=str(tiny_corpus),
        space=str(FIXTURES / "fast_space.yaml"),
        out=str(notes),
        results_dir=str(tmp_path / "results"),
        device="cpu",
        settings=TunerSettings(trials=1),
    )
    with pytest.raises(OutputError, match="holds a file autotune did not write"):
        runner.prepare(request)
    assert runner.prepare(dataclasses.replace(request, force=True)).out_path == notes
    ours = tmp_path / "ours.yaml"
    ours.write_text(make_tuned().to_yaml())
    assert runner.prepare(dataclasses.replace(request, out=str(ours))).out_path == ours


@pytest.mark.parametrize("kind", ["character device", "named pipe"])
def test_an_out_that_is_not_a_regular_file_is_refused_even_with_force(tiny_corpus, tmp_path, kind):
    if kind == "named pipe":
        special = tmp_path / "pipe.yaml"
        os.mkfifo(special)
    else:
        special = Path("/dev/null")
    results = tmp_path / "results"
    line = _refused(run_args(tiny_corpus, results, "--out", str(special), "--force"))
    assert f"--out {special} is not a regular file (a {kind})" in line
    assert not results.exists()
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize(
    ("name", "folder"),
    [("..", "__"), (".", "_"), ("cam++", "cam++"), ("my model/v2", "my_model_v2"), ("...x", "...x")],
)
def test_a_workload_folder_stays_inside_the_results_folder(name, folder, tmp_path):
    assert folder_name(name) == folder
    results = tmp_path / "results"
    assert (results / folder_name(name)).resolve().parent == results.resolve()


def test_a_results_folder_named_like_a_url_query_stays_a_folder_in_the_study_url(tmp_path):
    """`--results-dir 'rd?mode=ro'` once wrote the study as a file named `rd` beside it (the folder string reached a
    SQLite URL unquoted): the URL quotes it, and SQLAlchemy reads back the same file."""
    folder = tmp_path / "rd?mode=ro"
    folder.mkdir()
    url = storage.sqlite_url(folder / "studies.db")
    assert "?" not in url and storage.local_file(url) == folder / "studies.db"
    storage.open_storage(url)  # creates the database where it was named
    assert (folder / "studies.db").is_file() and not (tmp_path / "rd").exists()
