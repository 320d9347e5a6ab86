"""A trial across several SLURM nodes (--nodes M --devices N): torchrun on every node, the trial judged on the first.

The trial's job has M nodes and one task per node (trial/slurm.py job_parameters); submitit runs run_on_node in each
task, which for a multi-node spec lands here. Every node starts torch's own launcher (torchrun, in
trial/torchrun_agent.py) for its N ranks, and the M launchers meet in torchrun's c10d rendezvous, whose store the
first node hosts:

- Why torchrun and not srun's environment (SLURM_PROCID -> RANK...): torchrun is what the exported launch lines run
  (exports/), so the trial measures the launch a user will make; it sets every variable of torch's contract itself
  (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT) from a rendezvous that needs no port agreed in
  advance; and each node's launcher watches its own ranks, reporting which one failed, with what exit code, when.
  srun's environment would need one task per rank (ranks of one node no longer in one process group that a node
  can kill as one) and a MASTER_PORT chosen before the job starts.
- The first node (SLURM_NODEID 0) picks the rendezvous port, writes it to the trial's folder on the shared file
  system (RENDEZVOUS_FILE) and hosts the store (is_host=1; the others is_host=0: the emulated nodes of the tests share
  one address, and torchrun's guess from the host name would make both hosts).
- Every rank writes its result to the shared folder as on one node (rank_result_path). The first node judges the
  trial with the one-node rules (trial/launch.py): done when every rank wrote a feasible result; else the rank that
  crashed first (from every node's launcher report: AGENT_FILE, then NODE_FILE), else the rank whose failed result
  was written first; a rank that dies knocks its peers out of their collectives, so the first node waits up to
  SETTLE_S for every node's report before it names the cause. Then it writes STOP_FILE: every other node ends its
  launcher and ranks (their process groups) and leaves.
- The hard timeout is the first node's, as on one node; the others give up a little later if it never spoke.

Timestamps of different nodes are compared (which rank failed first): clocks must agree to a fraction of a second,
as NTP keeps a cluster's. The files' names carry the job's id: a trial measured again after its node was lost
(trial/slurm.py) never reads the files of its earlier job.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.python_command import module_command
from autotune.trial.interconnect import rank_host
from autotune.trial.launch import child_environment, kill_group, log_tail_of, rank_result, start_child
from autotune.trial.slurm_state import slurm_command
from autotune.trial.spec import PROGRESS_SUFFIX, TrialResult, TrialSpec, rank_result_path

__all__ = ["NodeTask", "run_node", "torchrun_arguments"]

logger = logging.getLogger(__name__)
RENDEZVOUS_FILE = "rendezvous-{job}.json"
AGENT_FILE = "agent-node{index}-{job}.json"  # the node's torchrun: which ranks failed, how, when
NODE_FILE = "node{index}-{job}.json"  # a node other than the first is done: its launcher's report, or why it ran none
STOP_FILE = "stop-{job}"
SETTLE_S = 10.0
POLL_S = 0.1
LATE_S = 30.0  # how long after the trial's timeout a node other than the first waits for the first to speak
_RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeTask:
    """This job task's place in a multi-node trial."""

    index: int  # SLURM_NODEID: 0 is the first node, which hosts the rendezvous and judges the trial
    job: str  # SLURM_JOB_ID
    name: str  # SLURM's name for the node

    @classmethod
    def from_environment(cls) -> NodeTask:
        env = os.environ
        return cls(index=int(env.get("SLURM_NODEID", "0")), job=env.get("SLURM_JOB_ID", "local"), name=rank_host())

    def path(self, folder: Path, pattern: str, index: int | None = None) -> Path:
        return folder / pattern.format(job=self.job, index=self.index if index is None else index)


def torchrun_arguments(spec: TrialSpec, endpoint: str, task: NodeTask, spec_path: Path, join_s: float) -> list[str]:
    """torchrun's arguments on this node: M nodes of world_size // M ranks, c10d at the first node."""
    return [
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.config.world_size // spec.nodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id=autotune-{task.job}",
        f"--rdzv-conf=is_host={1 if task.index == 0 else 0},join_timeout={max(30, int(join_s))}",
        "--max-restarts=0",  # a failed rank fails the trial, as on one node
        "--monitor-interval=0.1",
        # each rank as every child of a run starts (torchrun's own `python -u -m` would put the working folder on
        # its import path): under the lifeline, the working folder off sys.path; PYTHONUNBUFFERED is in its env
        "--no-python",
        *module_command("autotune.trial.lifeline", "autotune.trial", str(spec_path)),
    ]


def run_node(
    spec: TrialSpec, workdir: Path, timeout_s: float, mismatch: TrialResult | None = None
) -> TrialResult | None:
    """This node's part of the trial; the trial's result on the first node, None on the others (their task's return
    is not read). mismatch: this node's hardware is not the study's (trial/slurm_on_node.py): it runs no rank."""
    task = NodeTask.from_environment()
    if task.index == 0:
        return _first_node(spec, workdir, timeout_s, task, mismatch)
    _other_node(spec, workdir, timeout_s, task, mismatch)
    return None


def _agent_environment(spec: TrialSpec) -> dict[str, str]:
    """What torchrun starts with: a rank's environment on one node (import path, threads for this node's ranks, the
    lifeline), less the rank variables torchrun sets itself."""
    per_node = replace(spec, config=replace(spec.config, world_size=spec.config.world_size // spec.nodes))
    env = child_environment(per_node, 0, 0)
    for key in _RANK_ENV:
        env.pop(key, None)
    return env


def _start_agent(spec: TrialSpec, workdir: Path, task: NodeTask, endpoint: str, timeout_s: float) -> Any:
    spec_path = workdir / "spec.json"
    args = torchrun_arguments(spec, endpoint, task, spec_path, timeout_s)
    log = workdir / ("trial.log" if task.index == 0 else f"trial.node{task.index}.log")
    report = task.path(workdir, AGENT_FILE)
    report.unlink(missing_ok=True)
    logger.info("node %s (%d of %d): torchrun %s", task.name, task.index, spec.nodes, " ".join(args))
    return start_child(
        "autotune.trial.torchrun_agent", [str(report), *args], env=_agent_environment(spec), log_path=log
    )


def _node_address(name: str) -> str:
    """The address the other nodes reach this one at: SLURM's NodeAddr for it (what slurmctld itself uses), else
    this host's name."""
    done = slurm_command("scontrol", "show", "node", name, "--oneliner")
    for word in done.stdout.split() if done.returncode == 0 else []:
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    return socket.gethostname()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _first_node(
    spec: TrialSpec, workdir: Path, timeout_s: float, task: NodeTask, mismatch: TrialResult | None
) -> TrialResult:
    started = time.perf_counter()
    stop = task.path(workdir, STOP_FILE)
    if mismatch is not None:
        stop.touch()
        return mismatch
    for rank in range(spec.config.world_size):  # an earlier job's results must not pass for this one's
        Path(rank_result_path(spec.result_path, rank)).unlink(missing_ok=True)
    Path(spec.result_path + PROGRESS_SUFFIX).unlink(missing_ok=True)
    yamlio.write_json(workdir / "spec.json", spec.to_dict())
    endpoint = f"{_node_address(task.name)}:{_free_port()}"
    yamlio.write_json(task.path(workdir, RENDEZVOUS_FILE), {"endpoint": endpoint, "host": task.name})
    agent = _start_agent(spec, workdir, task, endpoint, timeout_s)
    try:
        outcome = _watch(spec, workdir, task, agent, timeout_s)
    finally:
        stop.touch()
        kill_group(agent)
    result = _judge(spec, workdir, task, outcome, timeout_s)
    result.wall_s = time.perf_counter() - started
    return result


def _other_node(spec: TrialSpec, workdir: Path, timeout_s: float, task: NodeTask, mismatch: TrialResult | None) -> None:
    report = task.path(workdir, NODE_FILE)
    report.unlink(missing_ok=True)
    if mismatch is not None:
        yamlio.write_json(report, {"node": task.name, "error": mismatch.reason})
        return
    stop, deadline = task.path(workdir, STOP_FILE), time.monotonic() + timeout_s + LATE_S
    rendezvous = task.path(workdir, RENDEZVOUS_FILE, index=0)
    while not rendezvous.exists():
        if stop.exists() or time.monotonic() > deadline:
            return
        time.sleep(POLL_S)
    endpoint = str(yamlio.read_json(rendezvous)["endpoint"])
    agent = _start_agent(spec, workdir, task, endpoint, timeout_s)
    try:
        while agent.poll() is None and not stop.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
    finally:
        kill_group(agent)
    yamlio.write_json(report, {"node": task.name, "exit_code": agent.returncode, **_agent_report(workdir, task)})


def _agent_report(workdir: Path, task: NodeTask, index: int | None = None) -> dict[str, Any]:
    try:
        return dict(yamlio.read_json(task.path(workdir, AGENT_FILE, index)))
    except (OSError, ValueError):
        return {}


def _reports(spec: TrialSpec, workdir: Path, task: NodeTask, agent: subprocess.Popen[bytes]) -> dict[int, dict]:
    """Each node's report once its launcher has ended: the first node's from its own launcher."""
    found: dict[int, dict] = {}
    if agent.poll() is not None:
        found[0] = {"node": task.name, "exit_code": agent.returncode, **_agent_report(workdir, task)}
    for index in range(1, spec.nodes):
        try:
            found[index] = dict(yamlio.read_json(task.path(workdir, NODE_FILE, index)))
        except (OSError, ValueError):
            continue
    return found


def _written(spec: TrialSpec) -> dict[int, tuple[int, str]]:
    """Each rank's result written so far: (mtime in ns, status)."""
    found = {}
    for rank in range(spec.config.world_size):
        path = rank_result_path(spec.result_path, rank)
        try:
            found[rank] = (os.stat(path).st_mtime_ns, str(yamlio.read_json(path).get("status")))
        except (OSError, ValueError):
            continue
    return found


def _failing(reports: dict[int, dict], written: dict[int, tuple[int, str]]) -> bool:
    if any(status != "ok" for _, status in written.values()):
        return True
    return any(report.get("failures") or report.get("error") or report.get("exit_code") for report in reports.values())


def _watch(spec: TrialSpec, workdir: Path, task: NodeTask, agent: Any, timeout_s: float) -> str:
    """Wait for the trial's end as the first node sees it: "done", "failed" or "timeout"."""
    deadline, settle_until = time.monotonic() + timeout_s, None
    while True:
        reports, written = _reports(spec, workdir, task, agent), _written(spec)
        if len(written) == spec.config.world_size and all(status == "ok" for _, status in written.values()):
            return "done"
        if _failing(reports, written):
            settle_until = settle_until or time.monotonic() + SETTLE_S
            crashed = {
                int(rank) for report in reports.values() for rank in report.get("failures") or {} if rank.isdigit()
            }
            # Every rank said how it ended (a result, or its launcher saw it die): a launcher that lingers (torchrun's
            # exit barrier waits for peers that failed) has nothing more to tell.
            settled = len(set(written) | crashed) == spec.config.world_size
            if settled or len(reports) == spec.nodes or time.monotonic() >= settle_until:
                return "failed"
        elif len(reports) == spec.nodes:
            return "failed"  # every launcher ended, not every rank wrote a result
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(POLL_S)


def _judge(spec: TrialSpec, workdir: Path, task: NodeTask, outcome: str, timeout_s: float) -> TrialResult:
    """The trial's result, by the one-node rules (trial/launch.py) over every node's ranks."""
    log = workdir / "trial.log"
    if outcome == "timeout":
        return TrialResult(
            status="timeout",
            reason=f"no result within {timeout_s:.0f} s (hang or far too slow)",
            log_tail=log_tail_of(log),
        )
    if outcome == "done":
        return rank_result(spec, 0, 0, log)
    time.sleep(POLL_S)  # the launchers just stopped: their reports are renamed into place
    reports = {index: report for index, report in _reports_after(spec, workdir, task).items()}
    crashed = [
        (failure["timestamp"], int(rank), failure["exitcode"], index)
        for index, report in reports.items()
        for rank, failure in (report.get("failures") or {}).items()
        if rank.isdigit() and failure.get("exitcode")
    ]
    if crashed:
        _, rank, code, index = min(crashed)
        result = rank_result(spec, rank, code, _node_log(workdir, index))
        result.reason += f" (on node {reports[index].get('node', index)})"
        return result
    failed = sorted((at_ns, rank) for rank, (at_ns, status) in _written(spec).items() if status != "ok")
    if failed:
        return rank_result(spec, failed[0][1], 0, log)
    for index, report in sorted(reports.items()):
        said = report.get("error") or (report.get("failures") or {}).get("agent", {}).get("error")
        if said:
            node = report.get("node", index)
            return TrialResult(
                status="error", reason=f"node {node}: {said}", log_tail=log_tail_of(_node_log(workdir, index))
            )
    missing = [str(index) for index in range(spec.nodes) if index not in reports]
    where = f"; no report from node(s) {', '.join(missing)}" if missing else ""
    result = rank_result(spec, 0, int(reports.get(0, {}).get("exit_code") or 1), log)
    result.reason += where
    return result


def _reports_after(spec: TrialSpec, workdir: Path, task: NodeTask) -> dict[int, dict]:
    """Every node's report after the first node's launcher was stopped (the others' may take SETTLE_S to come)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = {0: {"node": task.name, **_agent_report(workdir, task)}}
        for index in range(1, spec.nodes):
            try:
                found[index] = dict(yamlio.read_json(task.path(workdir, NODE_FILE, index)))
            except (OSError, ValueError):
                continue
        if len(found) == spec.nodes or time.monotonic() >= deadline:
            return found
        time.sleep(POLL_S)


def _node_log(workdir: Path, index: int) -> Path:
    return workdir / ("trial.log" if index == 0 else f"trial.node{index}.log")
