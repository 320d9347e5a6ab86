"""Run the proof: every step in a fresh process of its own, bounded by the proof's time limit, the report rewritten
after each step so that a proof cut short still leaves what it proved."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.gpu_proof.registry import STEPS, Step, StepContext, child_environment
from autotune.gpu_proof.report import NOTHING_PROVEN, ProofReport, StepResult
from autotune.python_command import module_command

__all__ = ["DEFAULT_TIME_LIMIT_S", "ProofSettings", "run_proof"]

logger = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT_S = 600.0  # the proof's bound: every GPU-only path in 10 minutes, one GPU (benchmarks/gpu_proof.md)
KILL_GRACE_S = 15.0  # past its budget a step is killed (its process group), but first allowed to finish its write
LOG_TAIL_CHARS = 1500


@dataclass(frozen=True, kw_only=True, slots=True)
class ProofSettings:
    """How to run the proof.

    Attributes:
        out: the markdown report (a JSON twin is written beside it).
        time_limit_s: the whole proof's bound; each step gets what is left after the least the later ones need.
        steps: which steps, in registry order (default all).
        workdir: where steps keep their files (default a temporary folder, kept for inspection).
        rehearse_on_cpu: run the steps on the CPU to check their plumbing (tests); proves nothing about CUDA.
    """

    out: Path
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    steps: tuple[str, ...] | None = None
    workdir: Path | None = None
    rehearse_on_cpu: bool = False


def _environment() -> dict[str, Any]:
    import torch

    from autotune import __version__
    from autotune.doctor.torch_checks import cudnn_version_text

    cudnn = cudnn_version_text(torch.backends.cudnn.version()) if torch.version.cuda else None
    nccl = None
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": nccl,
        "autotune": __version__,
    }


def _device() -> tuple[str, bool]:
    """(the GPU the proof runs on, as NVML names it, with the driver; or why there is none) and whether one is."""
    import torch

    from autotune.machine import gpus

    physical, driver, problem = gpus.nvml_gpus()
    if not torch.version.cuda:
        return f"torch {torch.__version__} is a CPU-only build", False
    if not physical:
        return problem or "NVML lists no GPU", False
    try:
        visible, _ = gpus.visible_gpus(physical, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except UserError as error:
        return str(error), False
    if not visible:
        return "CUDA_VISIBLE_DEVICES hides every GPU", False
    more = f" (+{len(visible) - 1} more)" if len(visible) > 1 else ""
    return f"{visible[0].name}{more}, driver {driver}", True


def _budget(step: Step, left_s: float, later: list[Step]) -> float:
    """A step's time: its own bound, within what is left once the later steps' least is kept for them."""
    return min(step.budget_s, left_s - sum(other.min_s for other in later))


def _run_step(step: Step, context: StepContext) -> StepResult:
    context.workdir.mkdir(parents=True, exist_ok=True)
    context_file, result_file = context.workdir / "context.json", context.workdir / "result.json"
    context_file.write_text(json.dumps(context.to_dict()))
    log_path = context.workdir / "step.log"
    started = time.perf_counter()
    env = child_environment()
    command = module_command("autotune.gpu_proof.child", step.name, str(context_file), str(result_file))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            process.wait(timeout=context.budget_s + KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except BaseException:  # Ctrl-C or SIGTERM on the proof: its step goes with it, not on alone
            os.killpg(process.pid, signal.SIGKILL)
            raise
    result = StepResult(name=step.name, title=step.title, seconds=time.perf_counter() - started)
    if result_file.exists():
        answer = json.loads(result_file.read_text())
        result.passed, result.numbers, result.notes = answer["passed"], answer["numbers"], answer["notes"]
        if not result.passed and answer["notes"] and answer["notes"][-1].startswith("raised "):
            result.error = answer["notes"][-1]
        return result
    tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:].replace("\n", " | ")
    killed = process.returncode == -signal.SIGKILL
    result.passed = False
    result.error = (f"killed after {context.budget_s:.0f} s" if killed else f"exit {process.returncode}") + f": {tail}"
    return result


def _check_writable(out: Path) -> None:
    """Fail before any step runs, with one line, where the report could not be written after it."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".autotune-check-"):
            pass
    except OSError as error:
        raise UserError(f"cannot write the report {out} ({error.strerror or error}); choose a writable --out") from None


def run_proof(settings: ProofSettings) -> ProofReport:
    """Run the proof's steps and write the report after each; on a machine without CUDA, prove nothing and say so.

    Returns:
        The report; `nothing_proven` when there was no CUDA device (then nothing is written).

    Raises:
        UserError: an unknown step name, a time limit that is not positive, a report that cannot be written.
    """
    names = list(settings.steps or STEPS)
    unknown = [name for name in names if name not in STEPS]
    if unknown or not settings.time_limit_s > 0 or not math.isfinite(settings.time_limit_s):  # NaN compares false
        raise UserError(
            f"unknown proof step {unknown[0]!r}; the steps are {', '.join(STEPS)}"
            if unknown
            else "the proof's time limit must be positive, e.g. 540"
        )
    started = time.monotonic()
    if settings.rehearse_on_cpu:
        device, present = "CPU rehearsal: the steps' plumbing only, nothing about CUDA", True
    else:
        device, present = _device()
    report = ProofReport(
        device=device,
        environment=_environment(),
        started=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        time_limit_s=settings.time_limit_s,
        nothing_proven=not present,
    )
    if not present:
        logger.debug("%s: %s", NOTHING_PROVEN, device)
        return report
    _check_writable(settings.out)
    kit_dir = settings.workdir or Path(tempfile.mkdtemp(prefix="autotune-gpu-proof-"))
    logger.info("GPU proof on %s; steps' files and logs under %s", device, kit_dir)
    steps = [STEPS[name] for name in names]
    for position, step in enumerate(steps):
        budget = _budget(step, settings.time_limit_s - (time.monotonic() - started), steps[position + 1 :])
        if budget < step.min_s:
            report.steps.append(
                StepResult(
                    name=step.name,
                    title=step.title,
                    error=f"not run: {budget:.0f} s left for it, needs {step.min_s:.0f}",
                )
            )
            continue
        logger.info("proof step %s (%.0f s at most)", step.name, budget)
        context = StepContext(
            device="cpu" if settings.rehearse_on_cpu else "cuda",
            workdir=kit_dir / step.name,
            kit_dir=kit_dir,
            budget_s=budget,
        )
        report.steps.append(_run_step(step, context))
        report.seconds = time.monotonic() - started
        report.write(settings.out)
    report.seconds = time.monotonic() - started
    report.write(settings.out)
    return report
