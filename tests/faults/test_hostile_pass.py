"""The defects of the recorded hostile pass (benchmarks/results/hostile-pass-2026-12-02.md), each reproduced: every
one is now one `error:` line and exit code 2 before anything is written, or a clean outcome."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import space, storage
from autotune.cli.parsing import parse_slurm_options, parse_workload_options
from autotune.errors import DataError, SpaceError, UserError
from autotune.result import report
from autotune.result.history import load as load_history
from tests.faults.conftest import error_line, invoke, python_env
from tests.fixtures.runs import ROOT
from tests.result.test_results import make_tuned


def _refused(args: list[str]) -> str:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    return error_line(result.stderr)


def test_a_unicode_digit_in_a_slurm_option_stays_text():
    """str.isdigit() is true for a superscript, which int() refuses (a ValueError traceback)."""
    assert parse_slurm_options(["time=²", "mem=64"]) == {"time": "²", "mem": 64}


def test_an_option_nested_past_pythons_stack_is_text_and_refused_as_such():
    deep = "[" * 100_000
    assert parse_workload_options([f"crop_s={deep}"], None) == {"crop_s": deep}
    assert "--crop-seconds (--option crop_s) must be a finite number" in _refused(
        ["run", "--model", "cam++", "--option", f"crop_s={deep}"]
    )


def test_a_yaml_nested_past_pythons_stack_is_one_line(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("params: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SpaceError, match="nests deeper than any search space"):
        space.read(path)


def test_an_extends_chain_deeper_than_any_space_is_one_line(tmp_path):
    for index in range(40):
        (tmp_path / f"s{index}.yaml").write_text(f"extends: s{index + 1}.yaml\n" if index < 39 else "params: {}\n")
    with pytest.raises(SpaceError, match="'extends' goes 32 files deep; a space builds on at most 31 others"):
        space.read(tmp_path / "s0.yaml")


def test_a_history_line_nested_past_pythons_stack_is_skipped(tmp_path):
    folder = tmp_path / "cam++"
    folder.mkdir()
    good = {"created": "2026-11-01T00:00:00+00:00", "model": "cam++", "fingerprint": "cpu-x2", "speedup": 1.5}
    (folder / "history.jsonl").write_text(json.dumps(good) + "\n" + "[" * 100_000 + "\n")
    assert list(load_history(tmp_path, "cam++")["speedup"]) == [1.5]


def test_a_journal_storage_naming_a_users_file_is_refused_and_the_file_untouched(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my precious notes, do not touch\n")
    with pytest.raises(UserError, match="holds something else than an Optuna journal"):
        storage.open_storage(f"journal://{notes}")
    assert notes.read_text() == "my precious notes, do not touch\n"
    journal = tmp_path / "study.log"
    storage.open_storage(f"journal://{journal}")  # a new file, and later the journal Optuna wrote, are taken


@pytest.fixture
def empty_study(monkeypatch):
    """A report whose study reading is not the point: an empty one (its reading has tests of its own)."""
    import pandas as pd

    monkeypatch.setattr(report, "load_study", lambda tuned, storage: None)
    monkeypatch.setattr(report, "trials_frame", lambda study: pd.DataFrame(columns=list(report.TRIAL_COLUMNS)))
    monkeypatch.setattr(
        report, "make_plots", lambda frame, tuned, folder: folder.mkdir(parents=True, exist_ok=True) or []
    )


@pytest.mark.parametrize("case", ["fifo", "users-file", "empty"])
def test_report_csv_never_replaces_what_it_did_not_write(tmp_path, empty_study, case):
    result = tmp_path / "r.yaml"
    result.write_text(make_tuned().to_yaml())
    target: str = {"fifo": str(tmp_path / "t.csv"), "users-file": str(tmp_path / "mine.csv"), "empty": ""}[case]
    if case == "fifo":
        os.mkfifo(target)
    if case == "users-file":
        Path(target).write_text("name,score\nann,3\n")
    words = {"fifo": "is not a regular file (a named pipe)", "users-file": "did not write", "empty": "--csv is empty"}
    with pytest.raises(UserError, match=re.escape(words[case])):
        report.build_report(result, csv=target)
    assert not any(path.name.startswith("report-") for path in tmp_path.iterdir())  # refused before writing
    if case == "users-file":
        assert Path(target).read_text() == "name,score\nann,3\n"
    report.build_report(result, csv=tmp_path / "new.csv")
    report.build_report(result, csv=tmp_path / "new.csv")  # its own table, written again


def test_a_foreign_fingerprint_keeps_the_report_beside_the_result(tmp_path, empty_study):
    data = make_tuned().to_dict()
    data["hardware"]["fingerprint"] = "../../escaped"
    result = tmp_path / "results" / "r.yaml"
    result.parent.mkdir()
    from autotune import yamlio

    result.write_text(yamlio.dump_yaml(data))
    files = report.build_report(result)
    assert files.out_dir.parent == result.parent


def test_a_typer_app_named_as_a_plugin_is_one_line():
    line = _refused(["history", "--model", "autotune.cli:app"])
    assert "'app' is a Typer, not a function or class that returns an autotune.Workload" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--seed", "1e3"], "Invalid value for '--seed'"),
        (["nosuch"], "No such command 'nosuch'; see '"),
        (["schedule"], "Missing option '--model'"),
        (["run"], "give --model NAME (see 'autotune models'), --command"),
        (["models", "extra"], "unexpected extra argument"),
    ],
    ids=["bad-value", "unknown-command", "missing-option", "neither-model-nor-command", "extra-argument"],
)
def test_a_command_line_the_parser_refuses_is_one_error_line(args, words):
    """Through the console entry point itself (click's usage box is what typer prints otherwise)."""
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=python_env(),
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], done.stderr


def test_a_nul_in_a_listed_path_is_shown_escaped(tmp_path):
    listing = tmp_path / "train.csv"
    listing.write_text("ID,dur,path,start,stop,spk\nu1,1.0,a\x00.wav,0,1,s1\n")
    with pytest.raises(DataError) as caught:
        from autotune.data import load_source

        load_source(listing)
    assert "\x00" not in str(caught.value) and "\\x00" in str(caught.value)


def test_a_list_saved_with_a_byte_order_mark_reads_as_its_text(tiny_corpus, tmp_path):
    from autotune.data import load_source

    wav = next(tiny_corpus.glob("spk000/*.wav"))
    listing = tmp_path / "train.csv"
    listing.write_bytes(b"\xef\xbb\xbf" + f"ID,dur,path,start,stop,spk\nu1,1.0,{wav},0,1,s1\n".encode())
    assert [u.utt_id for u in load_source(listing).utterances] == ["u1"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["doctor", "--model", "cam++", "--batch-size", "1000000000000"], "--batch-size must be at most 1,048,576"),
        (["doctor", "--model", "cam++", "--workers", "100000"], "--workers must be at most 4,096"),
        (["doctor", "--gpu-proof", "--time-limit", "nan"], "time limit"),
        (["run", "--model", "cam++", "--storage", "sqlite://"], "is an in-memory database"),
    ],
    ids=["doctor-batch", "doctor-workers", "proof-nan", "in-memory"],
)
def test_values_no_check_can_use_are_refused(tmp_path, args, words):
    assert words in _refused([*args, *(["--out", str(tmp_path / "p.md")] if "--gpu-proof" in args else [])])


def test_schedule_reads_the_space_its_job_will_read(tmp_path):
    listed = tmp_path / "space.yaml"
    listed.write_text("- a\n- b\n")
    line = _refused(["schedule", "--model", "cam++", "--", "--space", str(listed)])
    assert "must hold a YAML mapping" in line
