"""A confirmation pinned to its leader's node waits in the queue for it a bounded time, then runs on another node and
says so (trial/slurm_pinning.py): the default wait, the launcher's rule with its jobs stood in for, the result's note,
and for real on the two-node test cluster with the pinned node held by another job."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from autotune.knobs.config import TrialConfig
from autotune.search.candidates import Candidate, TrialRecord
from autotune.search.in_flight import placement_notes
from autotune.trial import TrialResult, slurm_pinning
from autotune.trial.slurm import SlurmLauncher, SlurmSettings, read_state
from autotune.trial.slurm_pinning import NodeNotFree, default_pin_wait_s
from tests.fixtures.slurm import NODES, PARTITION
from tests.slurm.test_job_parameters import SPEC
from tests.trial.tiny_setups import faulty_spec


@pytest.mark.parametrize(
    ("budget_s", "wait_s"),
    [(None, 600.0), (300.0, 60.0), (900.0, 60.0), (3600.0, 108.0), (8 * 3600.0, 600.0)],
    ids=["no-budget", "5m", "15m-default", "1h", "8h"],
)
def test_a_pinned_job_waits_a_share_of_the_budget_within_bounds(budget_s, wait_s) -> None:
    assert default_pin_wait_s(budget_s) == pytest.approx(wait_s)


def test_a_pinned_job_past_its_wait_runs_elsewhere_and_its_node_is_not_waited_for_again(tmp_path, monkeypatch) -> None:
    # The rule alone, jobs stood in for (the real thing: the cluster test below).
    asked: list[str | None] = []

    class Job:
        job_id = "40"

    def submit(self, spec, workdir, timeout_s, node=None):
        asked.append(node)
        return Job()

    def wait(self, job, spec, workdir, should_prune, pinned_until):
        if pinned_until is not None:
            raise NodeNotFree(job.job_id)
        return TrialResult(status="ok", samples_per_second=10.0, node="node1"), None

    monkeypatch.setattr(SlurmLauncher, "_submit", submit)
    monkeypatch.setattr(SlurmLauncher, "_wait", wait)
    monkeypatch.setattr(slurm_pinning, "available", lambda node: True)
    launcher = SlurmLauncher(node="node2", settings=SlurmSettings(pin_wait_s=1.0))
    first = launcher(SPEC, workdir=tmp_path / "a", timeout_s=60)
    second = launcher(SPEC, workdir=tmp_path / "b", timeout_s=60)
    assert asked == ["node2", None, None]  # pinned, then any node; the next confirmation does not wait again
    assert first.asked_node == second.asked_node == "node2" and first.node == "node1"
    launcher.node = None
    assert launcher(SPEC, workdir=tmp_path / "c", timeout_s=60).asked_node == ""  # a search trial asks for none


def _record(number: int, node: str, asked: str = "") -> TrialRecord:
    result = TrialResult(status="ok", samples_per_second=10.0 + number, node=node, asked_node=asked)
    return TrialRecord(
        number=number, role="confirm" if asked else "search", config=TrialConfig(per_device_batch_size=8), result=result
    )


def test_the_result_notes_confirmations_that_ran_on_another_node() -> None:
    moved = Candidate(
        config=TrialConfig(per_device_batch_size=8), records=[_record(1, "node2"), _record(5, "node1", "node2")]
    )
    stayed = Candidate(
        config=TrialConfig(per_device_batch_size=8), records=[_record(2, "node1"), _record(6, "node1", "node1")]
    )
    (note,) = placement_notes([moved, stayed])
    assert note.startswith("1 confirmation(s) of ") and "ran on node1, not on node2 where it was first measured" in note
    assert "--slurm-pin-wait" in note and "mixes windows of like nodes" in note


@pytest.mark.slow
def test_a_confirmation_whose_node_is_held_runs_on_the_other(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    # node2 is held by someone else's job: a trial pinned to it pends (Resources), is cancelled after its wait and
    # runs on node1; the next trial pinned to node2 goes to any node at once.
    hold = ("--exclusive", f"--partition={PARTITION}", f"--nodelist={NODES[1]}", "--output=/dev/null")
    blocker = slurm_cluster.command("sbatch", "--parsable", *hold, "--wrap", "sleep 300").strip()
    try:
        deadline = time.monotonic() + 30
        while (state := read_state(blocker)) is None or state.state != "RUNNING":
            assert time.monotonic() < deadline, slurm_cluster.logs()
            time.sleep(0.2)
        settings = SlurmSettings(partition=PARTITION, pin_wait_s=3.0)
        launcher = SlurmLauncher(settings=settings, node=NODES[1], poll_s=0.2, state_poll_s=1.0)
        result = launcher(faulty_spec(tmp_path, tiny_corpus, 5), workdir=tmp_path / "trial", timeout_s=120)
        assert result.status == "ok", (result.reason, result.log_tail, slurm_cluster.logs())
        assert result.node == NODES[0] and result.asked_node == NODES[1]
        jobs = sorted(int(path.name.split("_")[0]) for path in (tmp_path / "trial" / "slurm").glob("*_submission.sh"))
        assert len(jobs) == 2, jobs
        pinned = dict(re.findall(r"(\w+)=(\S*)", slurm_cluster.command("scontrol", "show", "job", str(jobs[0]), "-o")))
        assert pinned["JobState"] == "CANCELLED" and pinned["ReqNodeList"] == NODES[1], pinned  # it pended, pinned
        assert pinned["NodeList"] in ("(null)", ""), pinned  # never started
        (tmp_path / "again").mkdir()
        spec, folder = faulty_spec(tmp_path / "again", tiny_corpus, 5), tmp_path / "again" / "trial"
        again = launcher(spec, workdir=folder, timeout_s=120)
        assert again.status == "ok" and again.node == NODES[0] and again.asked_node == NODES[1]
        assert len(list((folder / "slurm").glob("*_submission.sh"))) == 1  # not pinned, not waited for again
    finally:
        slurm_cluster.command("scancel", blocker, check=False)
