"""What the SLURM controller says about a job, and what that means for its trial: the job's state and its
classification as today's trial statuses when the job ended without a result.

| how the job ended without a result       | status    |
|------------------------------------------|-----------|
| its time limit (TIMEOUT, or submitit's   | timeout   |
| warning signal before it)                |           |
| OUT_OF_MEMORY (the node's memory cgroup) | oom       |
| CANCELLED, PREEMPTED, NODE_FAIL,         | signal    |
| BOOT_FAIL, DEADLINE (killed from outside)|           |
| FAILED and anything else                 | error     |

The state comes from `scontrol show job` (the controller's own view, on every cluster, accounting or not; it keeps
a finished job for MinJobAge, 300 s by default) and from submitit's `sacct` watcher once the controller has forgotten
the job.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = ["JobState", "read_state", "classify", "slurm_command", "NODE_LOSSES", "SCHEDULER_KILLS"]

_STATE_CALL_TIMEOUT_S = 30.0
_OUTSIDE_KILLS = ("CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
SCHEDULER_KILLS = ("TIMEOUT", "OUT_OF_MEMORY", *_OUTSIDE_KILLS)  # the scheduler ended the job, not its task
NODE_LOSSES = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED")  # the node was lost or taken away: measured once more
_FINAL_STATES = ("COMPLETED", "FAILED", *SCHEDULER_KILLS)
_KNOWN_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", *_FINAL_STATES)


def slurm_command(*args: str) -> subprocess.CompletedProcess[str]:
    """A SLURM client command; a failure to run it at all (missing, hung) reads as a non-zero exit."""
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=_STATE_CALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(list(args), 1, "", str(error))


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as the controller reports it: JobState, Reason, ExitCode, NodeList (empty where it does not say)."""

    state: str
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""

    @property
    def final(self) -> bool:
        return self.state in _FINAL_STATES


def read_state(job_id: str, fallback: Any = None) -> JobState | None:
    """The job's state from `scontrol show job`, else from submitit's sacct watcher (fallback: the submitit job);
    None when neither knows it (yet)."""
    done = slurm_command("scontrol", "show", "job", "--oneliner", job_id)
    if done.returncode == 0 and done.stdout.strip():
        fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
        state = fields.get("JobState", "")
        if state:
            return JobState(state, fields.get("Reason", ""), fields.get("ExitCode", ""), fields.get("NodeList", ""))
    if fallback is not None:
        state = str(fallback.state).split()[0]  # sacct says "CANCELLED by 0"
        if state in _KNOWN_STATES:
            return JobState(state)
    return None


def classify(job_id: str, state: JobState) -> tuple[str, str]:
    """(status, reason) for a job that ended without writing its result (the table in this module's docstring)."""
    where = f"SLURM job {job_id}" + (f" on {state.nodes}" if state.nodes and state.nodes != "(null)" else "")
    why = f" ({state.reason})" if state.reason and state.reason != "None" else ""
    if state.state == "TIMEOUT":
        return "timeout", f"{where} reached its time limit before the trial wrote a result"
    if state.state == "OUT_OF_MEMORY":
        return "oom", f"{where} was killed for exceeding its memory (the node's out-of-memory handler)"
    if state.state in _OUTSIDE_KILLS:
        words = {"NODE_FAIL": "lost its node", "BOOT_FAIL": "could not boot its node"}
        ended = words.get(state.state, f"was {state.state.lower().replace('_', ' ')}")
        return "signal", f"{where} {ended} mid-trial{why}"
    code = f" with exit code {state.exit_code}" if state.exit_code else ""
    return "error", f"{where} ended {state.state}{code} and no result{why}"
