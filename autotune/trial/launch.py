"""Parent side of a trial: a fresh process in its own process group, a hard timeout, a classified result.

An OOM, a segfault, a SIGBUS in a worker or a hang costs one trial, never the study: the child runs in a new
session so that on timeout (or after it exits) the whole group, DataLoader workers included, is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.trial.signals import describe_signal, describe_signal_name
from autotune.trial.spec import PROGRESS_SUFFIX, TrialResult, TrialSpec

__all__ = ["launch", "child_environment"]

logger = logging.getLogger(__name__)
LOG_TAIL_CHARS = 4000
_WORKER_BUS_ERROR = "Unexpected bus error encountered in worker"


def child_environment(spec: TrialSpec) -> dict[str, str]:
    """The child's environment: the parent's import path (plugins resolve the same way) and thread settings."""
    env = dict(os.environ)
    paths = [entry for entry in sys.path if entry and Path(entry).exists()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *filter(None, [env.get("PYTHONPATH")])]))
    env["PYTHONUNBUFFERED"] = "1"
    threads = spec.config.intra_op_threads
    if threads is not None:
        # OpenMP reads this before torch starts: it sizes the pool set_num_threads later draws from.
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _tail(log_path: Path) -> str:
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log_path.stat().st_size - LOG_TAIL_CHARS))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


ShouldPrune = Callable[[dict[str, Any]], "str | None"]


def _read_progress(spec: TrialSpec) -> dict[str, Any] | None:
    try:
        return yamlio.read_json(spec.result_path + PROGRESS_SUFFIX)
    except (OSError, ValueError):
        return None  # not written yet, or being replaced right now


def _wait(process: subprocess.Popen[bytes], spec: TrialSpec, timeout_s: float, should_prune: ShouldPrune | None):
    """Wait for the child; returns (returncode or None on timeout, prune reason or None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return process.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic()))), None
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return None, None
        progress = _read_progress(spec) if should_prune else None
        reason = should_prune(progress) if progress and should_prune else None
        if reason:
            return None, reason


def launch(spec: TrialSpec, *, workdir: Path, timeout_s: float, should_prune: ShouldPrune | None = None) -> TrialResult:
    """Run one trial in a child process and return its result, whatever happens to the child.

    Args:
        spec: the trial; its result_path must lie inside workdir.
        workdir: a folder for this trial's spec, result and log.
        timeout_s: wall-clock limit for the whole child (start-up, warm-up and window).
        should_prune: looks at the child's progress ({"phase", "samples_per_second", "elapsed_s"}) twice a second
            and returns a reason when the trial is hopeless; the trial is then stopped and marked "pruned".
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, log_path = workdir / "spec.json", workdir / "trial.log"
    yamlio.write_json(spec_path, spec.to_dict())
    Path(spec.result_path).unlink(missing_ok=True)
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "autotune.trial", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_environment(spec),
            start_new_session=True,
        )
        try:
            returncode, pruned = _wait(process, spec, timeout_s, should_prune)
            if returncode is None:
                _kill_group(process)
                process.wait()
        except BaseException:  # Ctrl-C in the parent: take the whole trial down with us
            _kill_group(process)
            process.wait()
            raise
        finally:
            _kill_group(process)  # workers that outlived their parent
    Path(spec.result_path + PROGRESS_SUFFIX).unlink(missing_ok=True)
    if pruned:
        result = TrialResult(status="pruned", reason=pruned)
    else:
        result = _result(spec, returncode, timeout_s, log_path)
    result.wall_s = time.perf_counter() - started
    return result


def _result(spec: TrialSpec, returncode: int | None, timeout_s: float, log_path: Path) -> TrialResult:
    tail = _tail(log_path)
    if returncode is None:
        return TrialResult(
            status="timeout", reason=f"no result within {timeout_s:.0f} s (hang or far too slow)", log_tail=tail
        )
    result_path = Path(spec.result_path)
    if returncode == 0 and result_path.exists():
        result = TrialResult.from_dict(yamlio.read_json(result_path))
        if result.status == "signal" and _WORKER_BUS_ERROR in tail:
            # torch's worker handler prints this before dying; the parent only sees "exited unexpectedly".
            result.reason = f"a DataLoader worker was killed: {describe_signal_name('SIGBUS')}"
        result.log_tail = result.log_tail or tail
        return result
    if returncode < 0:
        return TrialResult(status="signal", reason=f"killed by {describe_signal(-returncode)}", log_tail=tail)
    return TrialResult(
        status="error", reason=f"trial process exited with code {returncode} and no result", log_tail=tail
    )
