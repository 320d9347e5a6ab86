"""What a trial's SLURM job runs on its node: trial.launch there, its result written where the submitter reads it.

submitit unpickles run_on_node in the job's task and calls it; the submitting side (trial/slurm.py SlurmLauncher)
never shares memory with it, only the trial's folder on the shared file system: the spec goes out in the job, and the
result comes back in a file named by the job (RESULT_FILE), beside the trial's own files.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.trial.launch import launch
from autotune.trial.spec import TrialResult, TrialSpec

__all__ = ["RESULT_FILE", "result_file", "run_on_node"]

RESULT_FILE = "slurm-result-{job_id}.json"  # beside the trial's own files: what run_on_node returns, as JSON


def run_on_node(
    spec_data: dict[str, Any],
    workdir: str,
    timeout_s: float,
    fingerprint: str | None = None,
    measure: Callable[..., TrialResult] | None = None,
) -> dict[str, Any]:
    """The job: one trial through trial.launch on this node; its result also written to RESULT_FILE (atomically),
    so that the submitting process reads it from the shared file system whatever submitit does afterwards. The
    file is named by the job: a job on a node the controller gave up for lost (cut off, not dead) may still finish,
    and must not pass its result for that of the job that measures the trial again.

    submitit's warning signal (USR2, trial/slurm.py WARNING_SIGNAL_S before the time limit) raises in here:
    trial.launch then kills its ranks, and the result says the time limit came first (or the job was preempted).

    fingerprint: the study's hardware fingerprint (machine/hardware.py); a node whose own differs measures nothing and
    the result is an error naming both, so that unlike nodes of a partition never mix their measurements into a
    study.

    measure: what runs the trial on the node, called as trial.launch is (a picklable callable: the user's own
    training command's launcher, probe/launcher.py run_command); trial.launch where None."""
    from submitit.core.utils import UncompletedJobError

    folder, spec = Path(workdir), TrialSpec.from_dict(spec_data)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    first = os.environ.get("SLURM_NODEID", "0") == "0"  # a multi-node trial's first node speaks for it
    try:
        mismatch = _unlike_node(spec, node, fingerprint)
        if spec.nodes > 1:
            from autotune.trial.multinode import run_node

            measured = run_node(spec, folder, timeout_s, mismatch)
            if measured is None:
                return {}  # another node of the trial: its task's return is not read
            result = measured
        else:
            result = mismatch or (measure or launch)(spec, workdir=folder, timeout_s=timeout_s)
    except UncompletedJobError:
        if not first:
            return {}
        # submitit's handler calls any USR2 a time-out for jobs under 50 minutes (core/job_environment.py
        # has_timed_out), which trials are; USR2 is what --signal asked for before the limit. A preemption sends
        # SIGTERM, which reaches the ranks (the parent then reads PREEMPTED from the controller).
        job = os.environ.get("SLURM_JOB_ID", "?")
        result = TrialResult(
            status="timeout",
            reason=f"SLURM job {job} reached its time limit's warning signal before the trial ended (raise it: "
            "--trial-timeout, or --slurm-option time=MINUTES)",
        )
    result.node = node
    data = result.to_dict()
    yamlio.write_json(result_file(folder, os.environ.get("SLURM_JOB_ID", "")), data)
    return data


def _unlike_node(spec: TrialSpec, node: str, fingerprint: str | None) -> TrialResult | None:
    """The error result for a node whose hardware is not the study's (None where it is, or nothing was asked)."""
    if fingerprint is None:
        return None
    from autotune.machine.hardware import probe

    own = probe(spec.device_type).fingerprint()
    if own == fingerprint:
        return None
    return TrialResult(
        status="error",
        reason=f"node {node}'s hardware fingerprint {own} is not the study's {fingerprint}: its measurements would "
        "not compare; submit to like nodes only (--slurm-partition, or --slurm-option constraint=...)",
        wall_s=0.0,
    )


def result_file(workdir: Path, job_id: str) -> Path:
    """Where a job writes the trial's result (RESULT_FILE)."""
    return workdir / RESULT_FILE.format(job_id=job_id)
