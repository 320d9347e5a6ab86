"""Nothing autotune reads can hang it or exhaust the machine: a named pipe where audio or a list is expected, a path to
/dev/zero for a space, a result or a history, an absurd device count; each is one line and exit code 2, at once. The
commands run as real subprocesses with a time limit, so that a regression hangs nothing but fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import yamlio
from autotune.errors import SpaceError
from tests.faults.conftest import python_env
from tests.fixtures.runs import ROOT
from tests.result.test_results import make_tuned

LIMIT_S = 120  # a refused input answers in seconds; a hang would wait forever


def _refused(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env=python_env(),
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_named_pipe_listed_as_audio_is_refused_by_the_input_check(tiny_corpus, tmp_path):
    pipe = tmp_path / "stuck.wav"
    os.mkfifo(pipe)
    real = next(tiny_corpus.glob("spk000/*.wav"))
    listing = tmp_path / "train.csv"
    listing.write_text(f"ID,dur,path,start,stop,spk\nu1,1.0,{real},0,1,s1\nu2,1.0,{pipe},0,1,s2\n")
    line = _refused("run", "--model", "cam++", "--data", str(listing), "--results-dir", str(tmp_path / "results"))
    assert f"audio file {pipe} is not a regular file (a named pipe)" in line
    assert not (tmp_path / "results").exists()


def test_a_named_pipe_given_as_the_data_list_is_refused(tmp_path):
    listing = tmp_path / "train.csv"
    os.mkfifo(listing)
    line = _refused("run", "--model", "cam++", "--data", str(listing), "--results-dir", str(tmp_path / "results"))
    assert f"data list {listing} is not a regular file (a named pipe)" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--model", "cam++", "--space", "/dev/zero"], "is not a regular file (a character device)"),
        (["export", "/dev/zero", "--to", "wenet"], "autotune result file /dev/zero is not a regular file"),
        (["doctor", "--result", "/dev/zero"], "/dev/zero is not a regular file"),
    ],
    ids=["space", "export", "doctor"],
)
def test_an_endless_file_is_never_read(tmp_path, args, words):
    assert words in _refused(*args, cwd=tmp_path)  # run's default --results-dir lands in tmp_path


def test_a_history_linked_to_dev_zero_is_refused_not_read(tmp_path):
    folder = tmp_path / "results" / "cam++"
    folder.mkdir(parents=True)
    (folder / "history.jsonl").symlink_to("/dev/zero")
    line = _refused("history", "--model", "cam++", "--results-dir", str(tmp_path / "results"))
    assert "is not a regular file (a character device)" in line


def test_an_export_for_absurdly_many_devices_is_refused_at_once(tmp_path):
    result = tmp_path / "r.yaml"
    result.write_text(make_tuned().to_yaml())
    line = _refused("export", str(result), "--to", "3d-speaker", "--world-size", "1000000000000")
    assert "--world-size must be between 1 and 65,536 devices, got 1000000000000" in line


def test_a_yaml_too_large_to_be_a_space_is_refused_unread(tmp_path):
    big = tmp_path / "space.yaml"
    with open(big, "wb") as handle:
        handle.truncate(yamlio.MAX_YAML_BYTES + 1)  # sparse: no disk written
    with pytest.raises(SpaceError, match="holds 16,777,217 bytes, more than any search space"):
        yamlio.read_mapping(big, what="search space", error=SpaceError)


def test_a_space_that_names_a_key_twice_is_refused(tmp_path):
    """YAML itself keeps the last of two equal keys, silently: the first one's values would be lost."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "params:\n  per_device_batch_size: {type: categorical, choices: [8]}\n"
        "params:\n  num_workers: {type: int, low: 0, high: 2}\n"
    )
    line = _refused("run", "--model", "cam++", "--space", str(space), "--results-dir", str(tmp_path / "r"))
    assert "key 'params' appears twice on lines 1 and 3" in line
    assert not (tmp_path / "r").exists()
