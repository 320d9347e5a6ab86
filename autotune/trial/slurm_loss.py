"""A trial's job that the scheduler ended from outside or whose node it lost, and the rule that measures such a trial
once more.

A trial killed by a signal in a job the scheduler ended (cancelled, preempted, its time limit, its memory, its node)
takes the scheduler's status and reason: the scheduler's SIGTERM reached the ranks, which the trial's launcher saw as
a signal (killed_from_outside).

A job whose node the scheduler lost or took away (NODE_FAIL, BOOT_FAIL, PREEMPTED) says nothing about the trial's
configuration: the trial is measured once more in a new job (trial/slurm.py; never SLURM's own requeue, which jobs are
submitted without: it holds a requeued job back two minutes, hides the loss from autotune and reruns it over the first
run's files). A trial that loses its node twice keeps the status above (NODE_LOSS_ATTEMPTS), as a local trial that
took its run down twice stays failed (storage/heartbeats.py): perhaps it takes nodes down.

A multi-node trial (--nodes M) that loses a node other than the first fails before SLURM knows: the first node's ranks
fail at once (their peers' sockets close, a collective times out, the rendezvous never completes) and the first node
writes the trial's failure (trial/multinode.py), while the controller still counts the dead node as up. It declares a
node DOWN, and ends its jobs NODE_FAIL, only when the node has not answered for SlurmdTimeout (300 s by default). So a
failed multi-node trial is not taken at its word while its job still runs (multinode_loss): with every node alive the
job ends within seconds of the result (the other nodes stop on the first node's word), and a job that goes on is a
node's task that did not end. The controller is asked until the job ends or one of its nodes is flagged down or not
responding, for at most detection_s (how long the controller takes to notice a dead node); a failure that coincides
with a lost node is the node's loss, measured once more; one with every node alive keeps its status.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from typing import Any

from autotune.trial.slurm_state import NODE_LOSSES, SCHEDULER_KILLS, JobState, classify, read_state, slurm_command
from autotune.trial.spec import TrialResult

__all__ = [
    "NODE_LOSS_ATTEMPTS",
    "detection_s",
    "killed_from_outside",
    "lost_its_node",
    "lost_nodes",
    "multinode_loss",
]

logger = logging.getLogger(__name__)
NODE_LOSS_ATTEMPTS = 2  # jobs a trial may lose its node in: the last one's status stands
FINAL_STATE_WAIT_S = 10.0  # after a signalled trial's result: how long to wait for the job's final state
# slurmctld pings each node every SlurmdTimeout/3 (100 s where SlurmdTimeout is 0, which never marks a node DOWN but
# still flags it not responding) and marks it DOWN once its last answer is SlurmdTimeout old: a dead node is flagged
# within one ping interval and DOWN within SlurmdTimeout plus one. The margin covers the ping's own RPC timeout and the
# controller's round of ending the node's jobs.
DETECTION_MARGIN_S = 15.0
_DEFAULT_SLURMD_TIMEOUT_S = 300.0  # SLURM's default, where `scontrol show config` does not say
_NO_TIMEOUT_PING_S = 100.0


def lost_its_node(result: TrialResult, state: JobState | None) -> bool:
    """Whether a trial failed because the scheduler lost or took away its node (its configuration is not at fault)."""
    return not result.feasible and state is not None and state.state in NODE_LOSSES


def killed_from_outside(job: Any, result: TrialResult, poll_s: float) -> tuple[TrialResult, JobState | None]:
    """A trial killed by a signal in a job the scheduler ended (cancelled, preempted, its time limit, its memory, its
    node): the scheduler's reason is the cause. Other results are returned as they are, without the job's state."""
    if result.status != "signal":
        return result, None
    deadline = time.monotonic() + FINAL_STATE_WAIT_S
    state = read_state(job.job_id, job)
    while (state is None or not state.final) and time.monotonic() < deadline:
        time.sleep(poll_s)  # the job ends a moment after its task wrote the result
        state = read_state(job.job_id, job)
    if state is not None and state.state in SCHEDULER_KILLS:
        result.status, reason = classify(job.job_id, state)
        result.reason = f"{reason}; the trial was {result.reason}"
    return result, state


def multinode_loss(
    job: Any, result: TrialResult, *, poll_s: float, state_poll_s: float
) -> tuple[TrialResult, JobState | None]:
    """A failed multi-node trial's result as the scheduler explains it (this module's docstring): where the job ended
    in a node loss, or one of its nodes is down or not responding while the job still runs (the job is cancelled
    then: it would hold the live nodes until the controller ends it), the result takes the loss's status and reason
    and the state returned is a node loss (lost_its_node). Else the result stands; a job still running after
    detection_s with every node answering is cancelled."""
    started, limit_s = time.monotonic(), detection_s()
    state = read_state(job.job_id, job)
    while state is None or not state.final:
        waited_s = time.monotonic() - started
        settled = waited_s >= FINAL_STATE_WAIT_S  # a job whose nodes are all alive has ended by now: ask of its nodes
        down = lost_nodes(state.nodes) if settled and state is not None and state.nodes else []
        if down:
            job.cancel(check=False)
            nodes = state.nodes if state is not None else ""
            state = JobState("NODE_FAIL", reason=f"{', '.join(down)} down or not responding", nodes=nodes)
            break
        if waited_s >= limit_s:
            job.cancel(check=False)
            logger.warning(
                "SLURM job %s still ran %.0f s after its trial failed, every node answering; cancelled", job.job_id,
                waited_s,
            )  # fmt: skip
            return result, state
        time.sleep(state_poll_s if settled else poll_s)  # the controller's RPC at its pace once the end is overdue
        state = read_state(job.job_id, job)
    if state.state in NODE_LOSSES:
        result.status, reason = classify(job.job_id, state)
        result.reason = f"{reason}; the trial's ranks on the nodes left failed with it: {result.reason}"
    elif result.status == "signal" and state.state in SCHEDULER_KILLS:
        result.status, reason = classify(job.job_id, state)
        result.reason = f"{reason}; the trial was {result.reason}"
    return result, state


def lost_nodes(nodes: str) -> list[str]:
    """The nodes of a hostlist (node[1-2]) that the controller counts as lost: DOWN, or not responding (sinfo's `*`).
    A drained node is not lost (its jobs run on)."""
    done = slurm_command("sinfo", "--noheader", "--Node", "--nodes", nodes, "--format=%N %t")
    lost = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, _, state = line.strip().partition(" ")
        state = state.strip()
        if name not in lost and (state.endswith("*") or state.rstrip("~#%$@^-*") == "down"):
            lost.append(name)
    return lost


@functools.lru_cache(maxsize=1)
def detection_s() -> float:
    """How long the controller may take to notice a dead node: SlurmdTimeout plus one ping interval plus
    DETECTION_MARGIN_S (read once from `scontrol show config`; SLURM's default 300 s where it does not say)."""
    done = slurm_command("scontrol", "show", "config")
    found = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", done.stdout, re.MULTILINE) if done.returncode == 0 else None
    timeout_s = float(found.group(1)) if found else _DEFAULT_SLURMD_TIMEOUT_S
    ping_s = timeout_s / 3 if timeout_s else _NO_TIMEOUT_PING_S
    return timeout_s + ping_s + DETECTION_MARGIN_S
