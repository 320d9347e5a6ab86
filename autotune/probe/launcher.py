"""Parent side of an own-training trial: the user's command run under the probe, in its own process group, with the
trials' timeout, and its result classified and judged knob by knob.

The command runs as the user would run it (no shell; `torchrun ...` in it starts its ranks itself), from the folder
autotune was started in, with the probe's folder first on PYTHONPATH and the trial's settings named by PROBE_ENV.
What can go wrong is said as the built-in trials say it: an out-of-memory, a crash, a hang (the timeout), a loss that
is not finite; and, its own: a command that never steps an optimizer, a training that ends before its window.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.probe.agent import ENDED_SUFFIX
from autotune.probe.command import TrainingCommand
from autotune.probe.in_force import accounting_mismatch, judge
from autotune.probe.lifeline import CANNOT_START
from autotune.probe.settings import PLAN_SUFFIX, PROBE_ENV, ProbeSettings, bootstrap_dir
from autotune.python_command import module_command
from autotune.trial.launch import ShouldPrune, describe_exit, kill_group, log_tail_of
from autotune.trial.lifeline import parent_environment
from autotune.trial.spec import LAUNCHED_AT_ENV, PROGRESS_SUFFIX, TrialResult, TrialSpec, rank_result_path

__all__ = ["CommandLauncher", "FIRST_STEP_TIMEOUT_S", "run_command"]

FIRST_STEP_TIMEOUT_S = 120.0  # a training that has not stepped an optimizer by then is not a training command
_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED")
_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$", re.MULTILINE)
_PROBE_FAILED = re.compile(r"^autotune probe: .*$", re.MULTILINE)


@dataclass(kw_only=True, slots=True)
class CommandLauncher:
    """Runs each trial's configuration as the user's training command (a Tuner's launcher)."""

    command: TrainingCommand
    first_step_timeout_s: float = FIRST_STEP_TIMEOUT_S
    environment: dict[str, str] = field(default_factory=dict)  # added to the command's (tests, the user's --env)

    def __call__(
        self, spec: TrialSpec, *, workdir: Path, timeout_s: float, should_prune: ShouldPrune | None = None
    ) -> TrialResult:
        workdir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        config_copy = self.command.write_config(spec.config, workdir)
        argv = self.command.argv(spec.config, config_copy)
        settings = ProbeSettings(
            result_path=spec.result_path,
            timing=spec.timing,
            device_type=spec.device_type,
            apply=self.command.apply_values(spec.config),
        )
        settings_path = yamlio.write_json(workdir / "probe.json", settings.to_dict())
        yamlio.write_json(workdir / "command.json", {"argv": argv, "cwd": self.command.cwd})
        for suffix in ("", PROGRESS_SUFFIX, PLAN_SUFFIX, ENDED_SUFFIX):
            Path(spec.result_path + suffix).unlink(missing_ok=True)
        log_path = workdir / "trial.log"
        try:
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    module_command("autotune.probe.lifeline", *argv),  # the training dies with this run
                    cwd=self.command.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._environment(settings_path),
                    start_new_session=True,
                )
        except OSError as error:  # this Python could not start: nothing ran
            return TrialResult(status="error", reason=f"the command could not start: {error.strerror}")
        try:
            ending, pruned = self._wait(process, spec, timeout_s, should_prune)
        finally:  # Ctrl-C in the parent too: the training never outlives the trial
            kill_group(process)
        if ending == "pruned":
            result = TrialResult(status="pruned", reason=pruned)
        else:
            result = self._result(spec, ending, process.returncode, log_path, timeout_s)
        result.wall_s = time.perf_counter() - started
        for suffix in (PROGRESS_SUFFIX, PLAN_SUFFIX):
            Path(spec.result_path + suffix).unlink(missing_ok=True)
        return result

    def _environment(self, settings_path: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.environment)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(bootstrap_dir()), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env[PROBE_ENV] = str(settings_path)
        env.update(parent_environment())  # the lifeline checks that this run still lives
        env[LAUNCHED_AT_ENV] = repr(time.time())
        return env

    def _wait(
        self, process: subprocess.Popen[bytes], spec: TrialSpec, timeout_s: float, should_prune: ShouldPrune | None
    ) -> tuple[str, str]:
        """("done" (the command exited, or every rank wrote its result) | "timeout" | "no-step" | "pruned", why it
        was pruned); rank 0's progress is read a few times a second, as a trial's is."""
        started = time.monotonic()
        first_step_s = min(timeout_s, self.first_step_timeout_s)
        progress_path = Path(spec.result_path + PROGRESS_SUFFIX)
        while True:
            if process.poll() is not None or _all_ranks_written(spec.result_path):
                return "done", ""
            waited = time.monotonic() - started
            if waited >= timeout_s:
                return "timeout", ""
            if waited >= first_step_s and not progress_path.exists():
                return "no-step", ""
            if should_prune is not None and progress_path.exists():
                try:
                    reason = should_prune(yamlio.read_json(progress_path))
                except (OSError, ValueError):
                    reason = None  # being replaced right now
                if reason:
                    return "pruned", reason
            time.sleep(0.1)

    def _result(
        self, spec: TrialSpec, ending: str, returncode: int | None, log_path: Path, timeout_s: float
    ) -> TrialResult:
        tail = log_tail_of(log_path)
        if ending == "timeout":
            return TrialResult(
                status="timeout", reason=f"no result within {timeout_s:.0f} s (hang or far too slow)", log_tail=tail
            )
        if ending == "no-step":
            return TrialResult(
                status="error",
                reason=f"no optimizer step in {self.first_step_timeout_s:.0f} s: is this a training command? "
                "(autotune times torch.optim optimizer steps)",
                log_tail=tail,
            )
        try:
            ranks = _rank_results(spec.result_path)
        except _Unreadable as error:
            return TrialResult(status="error", reason=str(error), log_tail=tail)
        if ranks:
            return self._judged(spec, ranks, tail)
        return _failure(spec.result_path, returncode, tail)

    def _judged(self, spec: TrialSpec, ranks: list[TrialResult], tail: str) -> TrialResult:
        """One result from every rank's: throughput summed, each knob judged, the ranks' epochs checked."""
        result = ranks[0]
        world_size = len(ranks)
        if world_size > 1:
            rates = [rank.samples_per_second or 0.0 for rank in ranks]
            result.samples_per_second = result.window_samples_per_second = sum(rates)
            result.per_rank_samples_per_second = rates
            result.window_s = max(rank.window_s or 0.0 for rank in ranks)
            failed = next((rank for rank in ranks if not rank.feasible), None)
            if failed is not None:
                result.status, result.reason = failed.status, failed.reason
        epochs = [rank.epoch_accounting for rank in ranks]
        record, mismatch = accounting_mismatch(epochs, world_size)
        result.epoch_accounting = record
        observed = result.observed or {}
        built_at = (record or {}).get("built_at")
        asked = self.command.values(spec.config)
        result.in_force = judge(asked, observed, self.command.knobs_by, built_at=built_at, device_type=spec.device_type)
        if mismatch and result.feasible:
            result.status, result.reason = "accounting", mismatch
        result.log_tail = tail
        return result


def run_command(
    command: dict[str, Any],
    spec: TrialSpec,
    *,
    workdir: Path,
    timeout_s: float,
    should_prune: ShouldPrune | None = None,
) -> TrialResult:
    """One trial of a recorded command (TrainingCommand.to_dict), as trial.launch runs one: what a SLURM job runs on
    its node for `--command --executor slurm` (bound with functools.partial, it pickles; the command's folder must be
    on the file system the node shares)."""
    return CommandLauncher(command=TrainingCommand.from_dict(command))(
        spec, workdir=workdir, timeout_s=timeout_s, should_prune=should_prune
    )


def _all_ranks_written(result_path: str) -> bool:
    try:
        first = yamlio.read_json(result_path)
    except (OSError, ValueError):
        return False
    world_size = int(first.get("world_size") or 1)
    return all(Path(rank_result_path(result_path, rank)).exists() for rank in range(1, world_size))


class _Unreadable(Exception):
    """A result the probe wrote that this autotune cannot read."""


def _rank_results(result_path: str) -> list[TrialResult]:
    """Every rank's result, rank 0 first; empty when rank 0 wrote none; _Unreadable when rank 0's cannot be read
    (another autotune's probe wrote it: the training's Python runs a different install)."""
    try:
        first = TrialResult.from_dict(yamlio.read_json(result_path))
    except OSError:
        return []
    except ValueError as error:
        raise _Unreadable(f"the probe's result could not be read: {error}") from None
    results = [first]
    for rank in range(1, first.world_size):
        try:
            results.append(TrialResult.from_dict(yamlio.read_json(rank_result_path(result_path, rank))))
        except (OSError, ValueError):
            results.append(TrialResult(status="error", reason=f"rank {rank} of {first.world_size} wrote no result"))
    return results


def _ended_note(result_path: str) -> dict[str, Any] | None:
    folder = Path(result_path).parent
    for path in sorted(folder.glob(Path(result_path).name + "*" + ENDED_SUFFIX)):
        try:
            return dict(yamlio.read_json(path))
        except (OSError, ValueError):
            continue
    return None


def _failure(result_path: str, returncode: int | None, tail: str) -> TrialResult:
    """Why a training wrote no result: what it raised, how it ended, or that it never stepped."""
    note = _ended_note(result_path)
    if note is not None and note.get("empty_loader"):
        return TrialResult(status="error", reason=_empty_loader_reason(note["empty_loader"]), log_tail=tail)
    if note is not None and note.get("status"):
        reason = f"the training failed after {note.get('steps', 0)} optimizer steps: {note.get('reason', '')}"
        return TrialResult(status=str(note["status"]), reason=reason, log_tail=tail)
    cannot_start = next((line for line in tail.splitlines() if line.startswith(CANNOT_START)), None)
    if cannot_start is not None:
        return TrialResult(status="error", reason=cannot_start.removeprefix("autotune: "), log_tail=tail)
    oom = _OOM.search(tail)
    if oom:
        return TrialResult(status="oom", reason=f"out of memory: {oom.group(0)}", log_tail=tail)
    if returncode is not None and returncode < 0:
        return TrialResult(status="signal", reason=f"the training was {describe_exit(returncode)}", log_tail=tail)
    if returncode:
        raised = _RAISED.findall(tail)
        probe = _PROBE_FAILED.findall(tail)
        why = probe[-1] if probe else (f"{raised[-1][0]}: {raised[-1][1]}".rstrip(": ") if raised else "")
        return TrialResult(
            status="error",
            reason=f"the training {describe_exit(returncode)}" + (f": {why}" if why else ""),
            log_tail=tail,
        )
    if note is not None:
        return TrialResult(
            status="error",
            reason=f"the training ended after {note.get('steps')} optimizer steps, before its window was measured: "
            "let it run longer (more epochs or data) or give a shorter --window",
            log_tail=tail,
        )
    probe = _PROBE_FAILED.findall(tail)
    return TrialResult(
        status="error",
        reason=probe[-1]
        if probe
        else "the command ended without an optimizer step: is it a training command? "
        "(autotune times torch.optim optimizer steps in Python processes it starts)",
        log_tail=tail,
    )


def _empty_loader_reason(empty: dict[str, Any]) -> str:
    """Why a training whose DataLoader had no batch never stepped, and what to change."""
    size, batch = empty.get("dataset_size"), empty.get("batch_size")
    sampler = empty.get("sampler")
    holds = f"{size} samples" if size is not None else "its data"
    if sampler == "DistributedSampler":
        holds += " shared among the ranks"
    at = f" at batch {batch} per process" if batch else ""
    return (
        f"the training's DataLoader (built at {empty.get('built_at')}) has no batch to give: {holds}{at}; give it a "
        "batch no larger than the samples each process gets, or more data"
    )
