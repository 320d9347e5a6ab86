"""Items 5 and 6: every child of a run dies with it, from its first moment.

The AMP check's child had no lifeline: a SIGKILLed run left it (and its workers) running for up to 600 s. Trials set
theirs only after importing torch (over a second): a run killed in that window left a permanent orphan, and nothing
checked afterwards whether the parent was still there. Children now start under `python -P -m
autotune.trial.lifeline`, which sets PR_SET_PDEATHSIG before any heavy import and then checks the parent's pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from autotune.python_command import module_command_without_flag
from autotune.trial.lifeline import ORPHAN_EXIT_CODE, PARENT_PID_ENV, child_command
from tests.faults.conftest import alive, processes_with, python_env, start_python
from tests.fixtures.runs import ROOT, wait_for


@pytest.mark.parametrize(
    "command",
    [child_command, lambda *args: module_command_without_flag("autotune.trial.lifeline", *args)],
    ids=["default", "python3.10-form"],  # Python 3.10 has no -P: run here too, where CI's Python has it
)
def test_a_child_has_its_lifeline_before_torch_and_never_imports_from_the_working_folder(tmp_path, command):
    (tmp_path / "json.py").write_text("raise SystemExit('the working folder was on the import path')\n")
    done = subprocess.run(
        command("tests.faults.probe"),
        env={**python_env(), PARENT_PID_ENV: str(os.getpid())},
        cwd=tmp_path,  # a run started from a folder holding a json.py (or typer.py, torch.py)
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == {"pdeathsig": signal.SIGKILL, "torch_loaded": False}


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    done = subprocess.run(
        child_command("tests.faults.probe"),
        env={**python_env(), PARENT_PID_ENV: "1"},  # not its parent: the one that started it has died meanwhile
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == ORPHAN_EXIT_CODE and done.stdout == ""  # its module never ran


def test_a_trial_whose_run_dies_while_it_starts_does_not_stay_behind(tiny_corpus, tmp_path):
    parent = subprocess.run(
        [sys.executable, "-m", "tests.faults.parents", "orphan", str(tiny_corpus), str(tmp_path)],
        env=python_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    child = int(parent.stdout.split()[0])
    wait_for(lambda: not alive(child), "the orphaned trial to exit", timeout_s=30)
    assert not (tmp_path / "result.json").exists() and not processes_with(str(tmp_path))


@pytest.mark.slow
def test_the_amp_check_dies_with_a_sigkilled_run(tiny_corpus, tmp_path):
    log = tmp_path / "parent.log"
    parent = start_python(["-m", "tests.faults.parents", "amp-check", str(tiny_corpus), str(tmp_path)], log)
    spec = str(tmp_path / "amp" / "amp_check.json")
    try:
        wait_for(lambda: processes_with(spec), "the AMP check's child", timeout_s=60)
        wait_for(lambda: all(_has_torch(pid) for pid in processes_with(spec)), "it to be training", timeout_s=60)
        children = processes_with(spec)
        os.kill(parent.pid, signal.SIGKILL)  # the run only: its child is in a session of its own
        parent.wait()
        wait_for(lambda: not any(alive(pid) for pid in children), "the AMP check to die with its run", timeout_s=30)
        assert not processes_with(spec)
    finally:
        for pid in processes_with(spec):
            os.kill(pid, signal.SIGKILL)


def _has_torch(pid: int) -> bool:
    """Whether a process has loaded torch (it is past its start-up, into the workload)."""
    try:
        return "libtorch" in open(f"/proc/{pid}/maps").read()
    except OSError:
        return False
