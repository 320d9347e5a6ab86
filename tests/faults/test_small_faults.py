"""Item 9: the smaller faults of the audit, each with its guarantee.

A plugin whose load_data raises (or exits 0) is one line, exit 2; a second run beside a live first one on a fresh
study does not take the first one's trials for a previous run (and halve its budget); the result's folder is synced
after the rename, and atomic writes never touch the process umask; an audio file whose name is not UTF-8 is told to
be renamed. (A refused run leaving folders behind, and YAML anchors blowing up a result, are in test_full_disk.py and
test_bad_numbers_and_spaces.py.)
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import optuna
import pytest

from autotune import space, storage, yamlio
from autotune.data import load_source
from autotune.errors import DataError
from autotune.knobs.config import TrialConfig
from autotune.search import warmstart
from autotune.search.settings import TunerSettings
from autotune.storage import heartbeats
from tests.conftest import make_cpu
from tests.faults.conftest import error_line, invoke
from tests.fixtures.runs import FIXTURES, run_args


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        ("raising_load_data", "workload raises-in-load-data: load_data("),
        ("exiting_load_data", "workload exits-in-load-data: load_data("),
    ],
)
def test_a_plugin_whose_load_data_fails_is_one_line(tiny_corpus, tmp_path, factory, words):
    args = run_args(tiny_corpus, tmp_path / "results")
    args[args.index("--model") + 1] = f"tests.faults.plugins:{factory}"
    result = invoke(args)
    assert result.exit_code == 2, result.output  # never 0: a plugin's sys.exit(0) is no success
    line = error_line(result.stderr)
    assert words in line and ("KeyError: 'speaker_id column'" in line or "SystemExit: 0" in line)
    assert not (tmp_path / "results").exists()


def _owned_by(pid: int) -> dict:
    return dict(heartbeats._owner(), pid=pid, start=heartbeats._start_ticks(pid))


def test_a_second_run_beside_a_live_one_does_not_warm_start_from_it(tmp_path):
    study = optuna.create_study(
        storage=storage.open_storage(f"sqlite:///{tmp_path / 'studies.db'}"), study_name="s", direction="maximize"
    )
    fast = space.load(FIXTURES / "fast_space.yaml", make_cpu())
    first_run = subprocess.Popen(["sleep", "60"])  # stands for run A, alive and working on the study
    try:
        for batch, rate in ((5, 100.0), (7, 60.0)):
            config = TrialConfig(per_device_batch_size=batch, num_workers=0)
            trial = optuna.trial.create_trial(
                params={"per_device_batch_size": batch},
                distributions={"per_device_batch_size": fast.params[0].distribution},
                value=rate,
                user_attrs={"owner": _owned_by(first_run.pid), "config": config.to_dict(), "result": {"status": "ok"}},
            )
            study.add_trial(trial)
        settings = TunerSettings(trials=10, budget_s=600.0)

        def plan() -> warmstart.WarmStart:
            return warmstart.plan_warm_start(
                study, out_path=tmp_path / "r.yaml", study_name="s", space=fast, options={}, settings=settings
            )

        beside = plan()
        assert beside.points == () and beside.settings == settings  # run B searches with its whole budget
    finally:
        first_run.kill()
        first_run.wait()
    after = plan()  # A has ended: its trials are a previous run's now
    assert [point.role for point in after.points] == ["previous", "warm"]
    assert after.settings.budget_s == 300.0


def test_an_atomic_write_syncs_the_folder_after_the_rename_and_never_sets_the_umask(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    def no_umask(mask: int) -> int:
        raise AssertionError("os.umask changes the whole process's umask, under the heartbeat thread too")

    monkeypatch.setattr(yamlio.os, "fsync", recording_fsync)
    monkeypatch.setattr(yamlio.os, "umask", no_umask)
    path = yamlio.atomic_write_text(tmp_path / "result.yaml", "a: 1\n")
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / ".result.yaml."))  # the data, then:
    assert synced[1] == str(tmp_path)  # the folder, so that the rename survives a power loss
    umask = int(
        next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Umask:")).split()[
            1
        ],
        8,
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["result.yaml"]


def test_an_audio_file_whose_name_is_not_utf8_is_told_to_be_renamed(tiny_corpus, tmp_path):
    folder = tmp_path / "corpus" / "spk000"
    folder.mkdir(parents=True)
    original = next((tiny_corpus / "spk000").glob("*.wav"))
    shutil.copy(original, os.fsencode(folder) + b"/utt\xff.wav")
    with pytest.raises(DataError) as caught:
        load_source(tmp_path / "corpus")
    assert "utt\\xff.wav is not valid UTF-8; rename the file" in str(caught.value)
    assert "convert it" not in str(caught.value)
