"""The file system's edges are one line and exit code 2, before any trial: a results folder that is a symlink loop,
a file name longer than the file system takes, a newline in --out, a report written where it cannot be, a nightly
job scheduled from a folder that is gone or whose crontab line cron would cut, a plugin whose data is not data, and
a storage that cannot be opened says what the database said."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from autotune.errors import UserError
from autotune.nightly.request import ScheduleRequest
from autotune.nightly.schedule import cron_line
from autotune.result import report
from tests.faults.conftest import error_line, invoke
from tests.fixtures.runs import run_args
from tests.result.test_results import make_tuned


def _refused(args: list[str]) -> str:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    return error_line(result.stderr)


def test_a_results_folder_that_is_a_symlink_loop(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    line = _refused(["run", "--model", "cam++", "--results-dir", str(loop)])
    assert f"--results-dir {loop} cannot be followed" in line


def test_a_file_name_longer_than_the_file_system_takes(tiny_corpus, tmp_path):
    out = tmp_path / ("x" * 300 + ".yaml")
    line = _refused(run_args(tiny_corpus, tmp_path / "results", "--out", str(out)))
    assert "is longer than the file system allows" in line
    assert not (tmp_path / "results").exists()


def test_a_newline_in_out_cannot_reach_the_result(tiny_corpus, tmp_path):
    out = tmp_path / "x\ncluster: {nodes: 8}\n#.yaml"
    line = _refused(run_args(tiny_corpus, tmp_path / "results", "--out", str(out)))
    assert "holds a control character (a newline?)" in line


def test_a_plugin_whose_load_data_returns_nothing(tiny_corpus, tmp_path):
    args = run_args(tiny_corpus, tmp_path / "r")
    args[args.index("--model") + 1] = "tests.faults.plugins:none_load_data"
    line = _refused(args)
    assert f"load_data({str(tiny_corpus)!r}) returned NoneType, not a DataSource" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("where", ["a file", "a read-only folder"])
def test_a_report_written_where_it_cannot_be(tmp_path, where, monkeypatch):
    """The study is not the point here (its reading has tests of its own): an empty one, then the writing fails."""
    monkeypatch.setattr(report, "load_study", lambda tuned, storage: None)
    monkeypatch.setattr(report, "trials_frame", lambda study: pd.DataFrame())
    monkeypatch.setattr(report, "make_plots", lambda frame, tuned, folder: folder.mkdir(parents=True) or [])
    result = tmp_path / "r.yaml"
    result.write_text(make_tuned().to_yaml())
    if where == "a file":
        out = tmp_path / "taken"
        out.write_text("mine")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder; the file case covers the same handling")
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "report"
    with pytest.raises(UserError, match="cannot write the report in .*; choose another --out"):
        report.build_report(result, out_dir=out)
    assert where != "a file" or out.read_text() == "mine"


def test_a_nightly_job_from_a_folder_that_is_gone(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(UserError, match="the current folder no longer exists"):
        ScheduleRequest(model="cam++", at="02:30")


def test_a_crontab_line_cron_would_cut_is_refused(tmp_path):
    request = ScheduleRequest(
        model="cam++", at="02:30", workdir=str(tmp_path), run_args=("--option", "x=" + "y" * 1200)
    )
    with pytest.raises(UserError, match=r"the crontab line would be 1,\d{3} characters.*use --systemd"):
        cron_line(request)


def test_a_storage_that_cannot_be_opened_says_what_the_database_said(tmp_path):
    folder = tmp_path / "plain-file"
    folder.write_text("")
    line = _refused(["run", "--model", "cam++", "--storage", f"sqlite:///{folder}/studies.db"])
    assert "unable to open database file" in line and "check the file or the server it names" in line
