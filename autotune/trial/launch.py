"""Parent side of a trial: a fresh process in its own process group, a hard timeout, a classified result.

An OOM, a segfault, a SIGBUS in a worker or a hang costs one trial, never the study: the child runs in a new
session so that on timeout (or after it exits) the whole group, DataLoader workers included, is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.machine.hardware import available_cores
from autotune.trial.signals import describe_signal, describe_signal_name
from autotune.trial.spec import LAUNCHED_AT_ENV, PROGRESS_SUFFIX, TrialResult, TrialSpec, rank_result_path

__all__ = [
    "launch",
    "child_environment",
    "free_port",
    "kill_group",
    "log_tail_of",
    "rank_result",
    "run_child",
    "start_child",
]

logger = logging.getLogger(__name__)
LOG_TAIL_CHARS = 4000
_WORKER_BUS_ERROR = "Unexpected bus error encountered in worker"


def child_environment(spec: TrialSpec, rank: int = 0, port: int | None = None) -> dict[str, str]:
    """A rank's environment: the parent's import path (plugins resolve the same way), threads, and torchrun's
    rendezvous variables when the trial has several ranks."""
    env = dict(os.environ)
    paths = [entry for entry in sys.path if entry and Path(entry).exists()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *filter(None, [env.get("PYTHONPATH")])]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(_lifeline().parent_environment())  # the child checks, after its lifeline is set, that we still live
    env[LAUNCHED_AT_ENV] = repr(time.time())  # the child reports how long its start and imports took (start_s)
    world_size = spec.config.world_size
    threads = spec.config.intra_op_threads
    if threads is None and world_size > 1 and spec.device_type == "cpu":
        threads = max(1, available_cores() // world_size)  # ranks on one CPU share its cores, not each take all
    if threads is None and world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
        # GPU ranks as torchrun starts them (torch.distributed.run sets 1 when several processes share a node and
        # the variable is unset): the recipes' launches are measured, not ranks each taking every core.
        threads = 1
    if threads is not None:
        # OpenMP reads this before torch starts: it sizes the pool set_num_threads later draws from.
        env["OMP_NUM_THREADS"] = str(threads)
    if world_size > 1:
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return env


def _lifeline() -> Any:
    """autotune.trial.lifeline, imported when used: a child runs it as `python -m`, which warns if this package had
    imported it already."""
    from autotune.trial import lifeline

    return lifeline


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now (for the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_child(module: str, args: Sequence[str], *, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `python -m MODULE ARGS` as every child of a run starts: under the lifeline (it dies with this run, and
    a native crash leaves its stack in the log: trial/lifeline.py), in a new session (a process group of its own,
    DataLoader workers included, killed as one by kill_group), its output in log_path (a new file)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            _lifeline().child_command(module, *args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen[bytes], *, wait: bool = True) -> None:
    """SIGKILL a child's whole process group (the child, its DataLoader workers, anything they started) and reap it
    (wait=False: the caller reaps it, after killing its peers too)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
    if wait:
        process.wait()


def run_child(module: str, args: Sequence[str], *, env: dict[str, str], log_path: Path, timeout_s: float) -> int | None:
    """Run one child (start_child) to its end or its hard timeout; its group is killed afterwards either way, and at
    once when this process is interrupted. Returns its exit code (negative: the signal that ended it), None on
    timeout."""
    process = start_child(module, args, env=env, log_path=log_path)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:  # Ctrl-C in the parent too: take the child down with us
        kill_group(process)


def describe_exit(returncode: int) -> str:
    """How a child that wrote no result ended: 'killed by SIGBUS: hint' or 'exited with code 3'."""
    return f"killed by {describe_signal(-returncode)}" if returncode < 0 else f"exited with code {returncode}"


def log_tail_of(log_path: Path) -> str:
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


@dataclass(kw_only=True, slots=True)
class _Ranks:
    """The processes of one trial, each rank leading its own session (its DataLoader workers join its group)."""

    processes: list[subprocess.Popen[bytes]]
    spec: TrialSpec
    logs: list[Path]

    def kill(self) -> None:
        for process in self.processes:  # every rank at once: none is left waiting in a collective for the others
            kill_group(process, wait=False)
        for process in self.processes:
            process.wait()

    def failed_rank(self) -> int | None:
        """The rank that brought the trial down, if one did: a rank that crashed (non-zero exit, a signal), else the
        rank whose failed result was written first. A failure knocks its peers out of their collectives ("connection
        closed by peer"), and their failed results come after it: the earliest one is the cause."""
        for rank, process in enumerate(self.processes):
            code = process.poll()
            if code is not None and code != 0:
                return rank
        if self.spec.config.world_size == 1:
            return None
        written = [(found, rank) for rank in range(len(self.processes)) if (found := self._written(rank))]
        failed = [(at_ns, rank) for (at_ns, status), rank in written if status != "ok"]
        return min(failed)[1] if failed else None

    def _written(self, rank: int) -> tuple[int, str] | None:
        """When this rank wrote its result (ns) and its status; None while it has not (files are renamed into place
        whole)."""
        path = rank_result_path(self.spec.result_path, rank)
        try:
            return os.stat(path).st_mtime_ns, str(yamlio.read_json(path).get("status"))
        except (OSError, ValueError):
            return None

    def all_exited(self) -> bool:
        return all(process.poll() is not None for process in self.processes)

    def all_succeeded(self) -> bool:
        """Every rank has written a feasible result: the trial is over, whatever the interpreters still tear down."""
        return all((found := self._written(rank)) and found[1] == "ok" for rank in range(len(self.processes)))


def _wait(ranks: _Ranks, timeout_s: float, should_prune: ShouldPrune | None) -> tuple[str, int | None, str | None]:
    """Wait for the ranks: ("done" | "failed" | "timeout" | "pruned", rank that failed, prune reason)."""
    deadline = time.monotonic() + timeout_s
    while True:
        failed = ranks.failed_rank()
        if failed is not None:
            return "failed", failed, None
        # Results are written last thing; DataLoader workers and the interpreter's teardown after that are no part
        # of the trial (seconds per trial), and the parent kills the process groups anyway.
        if ranks.all_exited() or ranks.all_succeeded():
            return "done", None, None
        if time.monotonic() >= deadline:
            return "timeout", None, None
        progress = _read_progress(ranks.spec) if should_prune else None
        reason = should_prune(progress) if progress and should_prune else None
        if reason:
            return "pruned", None, reason
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _start(spec: TrialSpec, spec_path: Path, workdir: Path) -> _Ranks:
    """Start every rank of the trial, each in a new session (a process group of its own, killed as one)."""
    world_size = spec.config.world_size
    port = free_port() if world_size > 1 else None
    ranks = _Ranks(processes=[], spec=spec, logs=[])
    for rank in range(world_size):
        log_path = workdir / ("trial.log" if rank == 0 else f"trial.rank{rank}.log")
        Path(rank_result_path(spec.result_path, rank)).unlink(missing_ok=True)
        env = child_environment(spec, rank, port)
        ranks.processes.append(start_child("autotune.trial", [str(spec_path)], env=env, log_path=log_path))
        ranks.logs.append(log_path)
    return ranks


def launch(spec: TrialSpec, *, workdir: Path, timeout_s: float, should_prune: ShouldPrune | None = None) -> TrialResult:
    """Run one trial in child processes (one per rank) and return its result, whatever happens to them.

    Args:
        spec: the trial; its result_path must lie inside workdir. config.world_size ranks are started.
        workdir: a folder for this trial's spec, results and logs.
        timeout_s: wall-clock limit for the whole trial (start-up, warm-up and window).
        should_prune: looks at rank 0's progress ({"phase", "samples_per_second", "elapsed_s"}, summed over ranks)
            a few times a second and returns a reason when the trial is hopeless; it is then stopped and "pruned".

    A rank that fails ends the trial at once: every rank and DataLoader worker is killed, and the result is that
    rank's, its reason naming the rank.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    yamlio.write_json(spec_path, spec.to_dict())
    started = time.perf_counter()
    ranks = _start(spec, spec_path, workdir)
    try:
        outcome, failed, pruned = _wait(ranks, timeout_s, should_prune)
    except BaseException:  # Ctrl-C in the parent: take the whole trial down with us
        ranks.kill()
        raise
    ranks.kill()  # whatever is left: hung peers of a failed rank, workers that outlived their parent
    Path(spec.result_path + PROGRESS_SUFFIX).unlink(missing_ok=True)
    if outcome == "pruned":
        result = TrialResult(status="pruned", reason=pruned or "")
    elif outcome == "timeout":
        result = TrialResult(
            status="timeout",
            reason=f"no result within {timeout_s:.0f} s (hang or far too slow)",
            log_tail=log_tail_of(ranks.logs[0]),
        )
    else:
        rank = failed or 0
        result = rank_result(spec, rank, ranks.processes[rank].returncode, ranks.logs[rank])
    result.wall_s = time.perf_counter() - started
    return result


def rank_result(spec: TrialSpec, rank: int, returncode: int, log_path: Path) -> TrialResult:
    tail = log_tail_of(log_path)
    where = f"rank {rank} of {spec.config.world_size}: " if spec.config.world_size > 1 else ""
    result_path = Path(rank_result_path(spec.result_path, rank))
    if result_path.exists():  # written last thing: whatever ended the process afterwards (we may have) is moot
        result = TrialResult.from_dict(yamlio.read_json(result_path))
        if result.status == "signal" and _WORKER_BUS_ERROR in tail:
            # torch's worker handler prints this before dying; the parent only sees "exited unexpectedly".
            result.reason = f"{where}a DataLoader worker was killed: {describe_signal_name('SIGBUS')}"
        result.log_tail = result.log_tail or tail
        return result
    if returncode < 0:
        return TrialResult(status="signal", reason=f"{where}{describe_exit(returncode)}", log_tail=tail)
    return TrialResult(
        status="error", reason=f"{where}trial process exited with code {returncode} and no result", log_tail=tail
    )
