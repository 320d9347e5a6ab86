"""The node side of a multi-node trial (trial/multinode.py, trial/torchrun_agent.py) at its boundaries: torchrun's
arguments as torch parses them, torch's own failure report as the agent writes it, and the first node's judgement
over every node's reports and rank results. The whole path runs on the test cluster (tests/slurm/test_multinode.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune import yamlio
from autotune.knobs.config import TrialConfig
from autotune.python_command import module_command
from autotune.trial import TimingSettings, TrialResult, TrialSpec
from autotune.trial.multinode import AGENT_FILE, NODE_FILE, NodeTask, _judge, torchrun_arguments
from autotune.trial.slurm import SlurmSettings, job_parameters

TASK = NodeTask(index=0, job="77", name="node1")


def _spec(tmp_path: Path, *, world_size: int = 2, nodes: int = 2, device: str = "cpu", workers: int = 0) -> TrialSpec:
    return TrialSpec(
        workload="cam++",
        workload_options={},
        data_file=str(tmp_path / "data.json"),
        config=TrialConfig(per_device_batch_size=4, world_size=world_size, num_workers=workers),
        timing=TimingSettings(),
        device_type=device,
        result_path=str(tmp_path / "result.json"),
        nodes=nodes,
    )


@pytest.mark.parametrize("index", (0, 1))
def test_torchrun_arguments_parse_in_torch(index: int, tmp_path: Path) -> None:
    from torch.distributed.run import parse_args

    task = NodeTask(index=index, job="77", name=f"node{index + 1}")
    args = parse_args(torchrun_arguments(_spec(tmp_path, world_size=8), "10.0.0.1:4242", task, tmp_path / "s.json", 60))
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == ("2", "4", "c10d")
    assert (args.rdzv_endpoint, args.rdzv_id, args.max_restarts) == ("10.0.0.1:4242", "autotune-77", 0)
    assert f"is_host={1 - index}" in args.rdzv_conf  # the first node hosts the store, whatever the names resolve to
    assert args.no_python and not args.module and args.training_script == sys.executable
    assert (
        args.training_script_args
        == module_command("autotune.trial.lifeline", "autotune.trial", str(tmp_path / "s.json"))[1:]
    )


def test_job_parameters_ask_for_every_node_and_each_nodes_share(tmp_path: Path) -> None:
    parameters = job_parameters(_spec(tmp_path, world_size=8, device="cuda", workers=3), 120, SlurmSettings())
    assert (parameters["nodes"], parameters["ntasks_per_node"], parameters["gpus_per_node"]) == (2, 1, 4)
    assert parameters["cpus_per_task"] == 4 * (1 + 3)  # per node: its ranks and their workers


def test_the_agent_reports_a_rank_killed_by_a_signal_with_torchs_own_failure(tmp_path: Path) -> None:
    report = tmp_path / "agent.json"
    command = [sys.executable, "-m", "autotune.trial.torchrun_agent", str(report), "--standalone", "--nnodes=1"]
    command += ["--nproc-per-node=1", "--monitor-interval=0.1", "--no-python", sys.executable, "-c"]
    command += ["import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 1, done.stderr[-2000:]
    written = yamlio.read_json(report)
    assert written["exit_code"] == 1 and written["failures"]["0"]["exitcode"] == -9
    assert written["failures"]["0"]["timestamp"] > 0


def _rank(spec: TrialSpec, rank: int, status: str, reason: str) -> None:
    path = spec.result_path if rank == 0 else f"{spec.result_path}.rank{rank}"
    yamlio.write_json(path, TrialResult(status=status, reason=reason).to_dict())
    time.sleep(0.02)  # the next file's mtime is later


def _reports(tmp_path: Path, first: dict, second: dict) -> None:
    yamlio.write_json(TASK.path(tmp_path, AGENT_FILE), first)
    yamlio.write_json(TASK.path(tmp_path, NODE_FILE, index=1), {"node": "node2", **second})


def test_a_rank_killed_on_another_node_is_the_cause_not_its_peers_error(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    _rank(spec, 0, "error", "rank 0 of 2: DistBackendError: Connection closed by peer")
    _reports(tmp_path, {"exit_code": 0}, {"exit_code": 1, "failures": {"1": {"exitcode": -9, "timestamp": 5}}})
    result = _judge(spec, tmp_path, TASK, "failed", 60)
    assert result.status == "signal" and result.reason.startswith("rank 1 of 2: killed by SIGKILL")
    assert result.reason.endswith("(on node node2)")


def test_without_a_crash_the_first_failed_result_is_the_cause(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    _rank(spec, 1, "oom", "rank 1 of 2: out of memory")
    _rank(spec, 0, "error", "rank 0 of 2: connection closed by peer")
    _reports(tmp_path, {"exit_code": 0}, {"exit_code": 0})
    result = _judge(spec, tmp_path, TASK, "failed", 60)
    assert (result.status, result.reason) == ("oom", "rank 1 of 2: out of memory")


def test_a_node_unlike_the_study_fails_the_trial_naming_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    _reports(tmp_path, {"exit_code": 0}, {"error": "node node2's hardware fingerprint cpu-x4-b is not the study's"})
    result = _judge(spec, tmp_path, TASK, "failed", 60)
    assert result.status == "error" and result.reason.startswith("node node2: node node2's hardware fingerprint")


def test_a_finished_trial_is_rank_zeros_result(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    _rank(spec, 1, "ok", "")
    _rank(spec, 0, "ok", "")
    assert _judge(spec, tmp_path, TASK, "done", 60).status == "ok"
    assert "no result within 60 s" in _judge(spec, tmp_path, TASK, "timeout", 60).reason
