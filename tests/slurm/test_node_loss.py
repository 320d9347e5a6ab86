"""A multi-node trial that fails while one of its nodes is lost is the node's loss, measured once more
(trial/slurm_loss.py): the rule at its boundary with the controller's answers stood in for, and for real on the
two-node test cluster with node2 killed mid-trial."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import threading
import time
from pathlib import Path

import pytest

from autotune import yamlio
from autotune.trial import TimingSettings, TrialResult, slurm_loss
from autotune.trial.slurm import SlurmLauncher, SlurmSettings, read_state
from autotune.trial.slurm_on_node import result_file
from autotune.trial.slurm_state import JobState
from tests.fixtures import slurm
from tests.fixtures.slurm import NODES, PARTITION
from tests.slurm.test_multinode import _spec


def _answers(monkeypatch, states: list[JobState], sinfo: str = "") -> list[str]:
    """The controller's answers: each read of the job's state the next of `states` (the last repeats), sinfo's node
    lines as given. Returns the calls made to it."""
    calls: list[str] = []
    monkeypatch.setattr(slurm_loss, "read_state", lambda *_: states.pop(0) if len(states) > 1 else states[0])

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        calls.append(" ".join(args))
        return subprocess.CompletedProcess(list(args), 0, sinfo, "")

    monkeypatch.setattr(slurm_loss, "slurm_command", command)
    monkeypatch.setattr(slurm_loss, "detection_s", lambda: 5.0)
    return calls


class _Job:
    job_id = "41"
    cancelled = False

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


def _failed() -> TrialResult:
    return TrialResult(status="error", reason="rank 0 of 2: RuntimeError: Connection closed by peer")


def test_a_failure_whose_job_ends_node_fail_is_the_node_s_loss(monkeypatch) -> None:
    _answers(monkeypatch, [JobState("RUNNING", nodes="node[1-2]"), JobState("NODE_FAIL", "None", nodes="node[1-2]")])
    result, state = slurm_loss.multinode_loss(_Job(), _failed(), poll_s=0.01, state_poll_s=0.01)
    assert slurm_loss.lost_its_node(result, state) and result.status == "signal"
    assert result.reason.startswith("SLURM job 41 on node[1-2] lost its node mid-trial; the trial's ranks on the")
    assert "Connection closed by peer" in result.reason


def test_a_failure_while_a_node_stops_answering_is_the_node_s_loss(monkeypatch) -> None:
    calls = _answers(monkeypatch, [JobState("RUNNING", nodes="node[1-2]")], sinfo="node1 alloc\nnode2 alloc*\n")
    monkeypatch.setattr(slurm_loss, "FINAL_STATE_WAIT_S", 0.05)  # the nodes are asked of once the job's end is overdue
    job = _Job()
    result, state = slurm_loss.multinode_loss(job, _failed(), poll_s=0.01, state_poll_s=0.01)
    assert slurm_loss.lost_its_node(result, state) and job.cancelled  # it would hold node1 until SLURM gave up
    assert "(node2 down or not responding)" in result.reason
    assert calls == ["sinfo --noheader --Node --nodes node[1-2] --format=%N %t"]


@pytest.mark.parametrize(
    ("states", "sinfo", "cancelled"),
    [
        ([JobState("RUNNING", nodes="node[1-2]"), JobState("COMPLETED", nodes="node[1-2]")], "", False),
        ([JobState("RUNNING", nodes="node[1-2]")], "node1 alloc\nnode2 drain\n", True),
    ],
    ids=["job-ends", "nodes-answer-until-the-bound"],
)
def test_a_failure_with_every_node_alive_stays_the_trial_s(monkeypatch, states, sinfo, cancelled) -> None:
    _answers(monkeypatch, states, sinfo)
    monkeypatch.setattr(slurm_loss, "FINAL_STATE_WAIT_S", 0.0)
    monkeypatch.setattr(slurm_loss, "detection_s", lambda: 0.2)
    job = _Job()
    result, state = slurm_loss.multinode_loss(job, _failed(), poll_s=0.01, state_poll_s=0.01)
    assert not slurm_loss.lost_its_node(result, state) and result.status == "error"
    assert result.reason == _failed().reason and job.cancelled is cancelled


@pytest.mark.parametrize(
    ("config", "seconds"),
    [
        ("SlurmdTimeout           = 10 sec\n", 10 + 10 / 3 + 15),
        ("SlurmdTimeout = 0 sec\n", 100 + 15),
        ("", 300 + 100 + 15),
    ],
    ids=["tests-cluster", "never-down", "unsaid"],
)
def test_the_wait_for_the_controller_is_its_own_detection_time(monkeypatch, config: str, seconds: float) -> None:
    monkeypatch.setattr(
        slurm_loss, "slurm_command", lambda *args: subprocess.CompletedProcess(list(args), 0, f"X = 1\n{config}", "")
    )
    slurm_loss.detection_s.cache_clear()
    try:
        assert slurm_loss.detection_s() == seconds
    finally:
        slurm_loss.detection_s.cache_clear()


@pytest.mark.slow
def test_a_two_node_trial_whose_second_node_dies_is_measured_again(slurm_cluster, tiny_corpus, tmp_path, caplog):
    # node2 dies mid-window (its slurmd, slurmstepd and ranks killed; the controller not told: it finds out by its own
    # pings, as on a real cluster). node1's ranks fail at once and the first node writes the trial's failure before
    # the controller knows; the launcher asks it, finds node2 lost, and measures the trial once more in a new job,
    # which runs once node2 is back.
    timing = TimingSettings(warmup_steps=1, window_s=4.0, min_window_steps=2, min_timed_share=0)
    spec = dataclasses.replace(_spec(tmp_path, tiny_corpus), timing=timing)  # 4 s of window: killed within it
    progress, killed = Path(spec.result_path + ".progress"), {}

    def kill_node2_mid_trial() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            if progress.exists():
                killed["jobs"] = slurm.kill_node(slurm_cluster, NODES[1], tell_controller=False)
            time.sleep(0.2)
        job = killed.get("jobs", [None])[0]
        while job and time.monotonic() < deadline and not (read_state(job) or JobState("")).final:
            time.sleep(0.2)  # the launcher's verdict first: the controller still counts node2's job as running
        if killed:
            slurm.revive_node(slurm_cluster, NODES[1], wait_idle=False)  # the trial's new job takes it at once

    caplog.set_level(logging.WARNING, logger="autotune.trial.slurm")
    killer = threading.Thread(target=kill_node2_mid_trial)
    killer.start()
    try:
        launcher = SlurmLauncher(settings=SlurmSettings(partition=PARTITION), poll_s=0.2, state_poll_s=1.0)
        result = launcher(spec, workdir=tmp_path / "trial", timeout_s=150)
    finally:
        killer.join()
    assert killed, "node2 was never seen running the trial"
    assert result.status == "ok" and result.nodes == 2, (result.reason, result.log_tail, slurm_cluster.logs())
    jobs = sorted(int(path.name.split("_")[0]) for path in (tmp_path / "trial" / "slurm").glob("*_submission.sh"))
    assert len(jobs) == 2 and killed["jobs"] == [str(jobs[0])]  # the job that lost node2 and the one that measured
    first = read_state(str(jobs[0]))
    assert first.state in ("NODE_FAIL", "CANCELLED"), first  # SLURM's verdict, or cancelled on node2's flag
    lost = yamlio.read_json(result_file(tmp_path / "trial", str(jobs[0])))
    assert lost["status"] != "ok", lost  # the first node wrote the trial's failure before the controller knew
    said = [r.getMessage() for r in caplog.records if "measured again in a new job" in r.getMessage()]
    assert len(said) == 1 and "lost its node mid-trial" in said[0], said
    deadline = time.monotonic() + 30  # the trial's result comes a moment before its job's end
    while not (second := read_state(str(jobs[1])) or JobState("")).final and time.monotonic() < deadline:
        time.sleep(0.2)
    assert second.state == "COMPLETED" and second.nodes == "node[1-2]", second
