"""Mixed precision must train like fp32: compare loss curves from identical weights on identical batches.

Once per run, before the search, a child process (``python -m autotune.trial.amp_check SPEC.json``, isolated like a
trial: the parent never touches CUDA) builds the workload with a tiny batch, collates a few batches once (no
workers), and trains ``steps`` steps over them in fp32 (strict IEEE) and in each autocast precision of the search
space, every run from the same initial weights and the same seed (so dropout draws the same masks). A precision
whose smoothed loss curve strays from fp32's by more than allowed, or whose loss turns non-finite, is rejected for
this workload: every trial with it is infeasible without being launched, and the result says why, with the numbers.
fp16 on CUDA first calibrates its loss scale on the first batch without touching the weights, so the few steps a
fresh GradScaler skips while it searches for a scale do not count against fp16.

The deviation at step i is |s_amp(i) - s_fp32(i)| / |s_fp32(i)|, with s a trailing mean over ``smoothing_steps``
steps (one pass over the batches: each batch's loss differs; the comparison is about the trend). What is allowed
is the tolerance (5%), unless training itself is chaotic: rounding differences grow as two runs' weights drift
apart, and at a recipe's peak learning rate from the first step (3D-Speaker's SGD at 0.1, whose schedule really
warms up over epochs) they grow fast. So when a precision strays beyond the tolerance, fp32 is trained once more
from initial weights perturbed by rounding-sized noise (2**-9 relative, bf16's half ulp), and the precision may
stray up to 1.5 times as far as fp32 itself does. Measured on the real CAM++ (3 s crops, batch 8, CPU, bf16):
bf16 strays 17.0%, perturbed fp32 16.6%: accepted. A precision that really trains differently (a loss 1.5 times
off) strays far beyond both.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import yamlio
from autotune.trial.spec import TrialSpec

if TYPE_CHECKING:
    import torch

    from autotune.space import SearchSpace
    from autotune.trial.precision import PrecisionSettings
    from autotune.workloads.base import TrainingSetup

__all__ = [
    "AmpCheckSettings",
    "AmpCheckSpec",
    "AmpCheckResult",
    "PrecisionVerdict",
    "amp_precisions",
    "space_precisions",
    "compare_curves",
    "calibrate_scaler",
    "run_check",
    "run_amp_check",
]

logger = logging.getLogger(__name__)
_LOG_TAIL_CHARS = 4000


@dataclass(frozen=True, kw_only=True, slots=True)
class AmpCheckSettings:
    """How the check runs: a tiny batch, a few batches reused, a short curve."""

    steps: int = 20
    batch_size: int = 4  # tiny: on a CPU a step of the real model is what the check costs
    batches: int = 4
    tolerance_fraction: float = 0.05
    smoothing_steps: int = 4  # one pass over the batches: each smoothed point averages every batch once
    perturbation: float = 2.0**-9  # relative weight noise of the fp32 noise-floor run: bf16's rounding (half an ulp)
    floor_margin: float = 1.5  # a precision may stray this many times as far as fp32 does from perturbed weights
    timeout_s: float = 600.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AmpCheckSettings:
        return cls(**{key: value for key, value in data.items() if key in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True, slots=True)
class AmpCheckSpec:
    """The check's one JSON input: the trial template (workload, data, device, seed, result path) and what to test."""

    trial: TrialSpec
    precisions: tuple[str, ...]
    settings: AmpCheckSettings = field(default_factory=AmpCheckSettings)

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.trial.to_dict(), "precisions": list(self.precisions), "settings": self.settings.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AmpCheckSpec:
        return cls(
            trial=TrialSpec.from_dict(data["trial"]),
            precisions=tuple(data["precisions"]),
            settings=AmpCheckSettings.from_dict(data.get("settings") or {}),
        )


@dataclass(kw_only=True, slots=True)
class PrecisionVerdict:
    """One autocast precision against fp32."""

    precision: str
    accepted: bool
    reason: str = ""
    max_deviation_fraction: float | None = None
    final_deviation_fraction: float | None = None
    allowed_deviation_fraction: float | None = None
    losses: list[float] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class AmpCheckResult:
    """The check's answer. status "error" means it could not judge (the fp32 reference failed): nothing is rejected."""

    status: str
    reason: str = ""
    reference_losses: list[float] = field(default_factory=list)
    verdicts: list[PrecisionVerdict] = field(default_factory=list)
    floor_losses: list[float] = field(default_factory=list)  # fp32 from perturbed weights, run only when needed
    floor_deviation_fraction: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    log_tail: str = ""

    def rejected(self) -> dict[str, str]:
        """Precision -> why every trial with it is infeasible."""
        return {v.precision: v.reason for v in self.verdicts if not v.accepted} if self.status == "ok" else {}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AmpCheckResult:
        data = dict(data)
        data["verdicts"] = [PrecisionVerdict(**verdict) for verdict in data.get("verdicts") or []]
        return cls(**{key: value for key, value in data.items() if key in cls.__dataclass_fields__})

    def report(self) -> dict[str, Any]:
        """What the result YAML keeps: the verdicts with their deviations, and both curves, rounded."""
        report: dict[str, Any] = {"status": self.status, **self.settings}
        if self.reason:
            report["reason"] = self.reason
        report["fp32_losses"] = _rounded(self.reference_losses)
        if self.floor_losses:
            report["fp32_perturbed_losses"] = _rounded(self.floor_losses)
            report["fp32_perturbed_deviation_fraction"] = _round(self.floor_deviation_fraction)
        report["precisions"] = {
            v.precision: {
                "accepted": v.accepted,
                "max_deviation_fraction": _round(v.max_deviation_fraction),
                "final_deviation_fraction": _round(v.final_deviation_fraction),
                "allowed_deviation_fraction": _round(v.allowed_deviation_fraction),
                "losses": _rounded(v.losses),
                **({"reason": v.reason} if v.reason else {}),
            }
            for v in self.verdicts
        }
        if self.wall_s is not None:
            report["wall_s"] = round(self.wall_s, 1)
        return report


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(f"{value:.5g}")


def _rounded(values: Sequence[float]) -> list[float | None]:
    return [_round(value) for value in values]


def space_precisions(space: SearchSpace) -> tuple[str, ...]:
    """Every precision a search space may try: its choices, or its fixed value."""
    choices: list[Any] = [space.fixed["precision"]] if "precision" in space.fixed else []
    for param in space.params:
        if param.name == "precision":
            choices += list(getattr(param.distribution, "choices", ()))
    return tuple(dict.fromkeys(str(choice) for choice in choices))


def amp_precisions(space: SearchSpace) -> tuple[str, ...]:
    """The autocast precisions (bf16, fp16) a search space may try; fp32 and tf32 need no check."""
    return tuple(precision for precision in space_precisions(space) if precision in ("bf16", "fp16"))


def _smooth(values: Sequence[float], window: int) -> list[float]:
    window = max(1, window)
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def compare_curves(reference: Sequence[float], candidate: Sequence[float], smoothing_steps: int) -> tuple[float, float]:
    """(max, final) relative deviation of the candidate's smoothed loss curve from the reference's."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(f"curves of {len(reference)} and {len(candidate)} steps cannot be compared")
    ref, cand = _smooth(reference, smoothing_steps), _smooth(candidate, smoothing_steps)
    deviations = [abs(c - r) / max(abs(r), 1e-12) for r, c in zip(ref, cand, strict=True)]
    return max(deviations), deviations[-1]


def judge(
    precision: str,
    reference: Sequence[float],
    losses: Sequence[float],
    settings: AmpCheckSettings,
    *,
    floor: float | None = None,
) -> PrecisionVerdict:
    """Accept or reject one precision's curve against fp32's.

    Args:
        floor: how far fp32 itself strays from perturbed initial weights; when given, a precision may stray
            max(tolerance, floor_margin x floor).
    """
    bad = next((step for step, loss in enumerate(losses) if not math.isfinite(loss)), None)
    if bad is not None:
        reason = f"{precision} rejected by the AMP check: its loss became non-finite at step {bad + 1} (fp32's did not)"
        return PrecisionVerdict(precision=precision, accepted=False, reason=reason, losses=list(losses))
    worst, final = compare_curves(reference, losses, settings.smoothing_steps)
    allowed = settings.tolerance_fraction
    if floor is not None:
        allowed = max(allowed, settings.floor_margin * floor)
    verdict = PrecisionVerdict(
        precision=precision,
        accepted=worst <= allowed,
        max_deviation_fraction=worst,
        final_deviation_fraction=final,
        allowed_deviation_fraction=allowed,
        losses=list(losses),
    )
    if not verdict.accepted:
        why = f"tolerance {settings.tolerance_fraction:.0%}"
        if floor is not None:
            why += f"; fp32 itself strays {floor:.1%} from rounding-sized weight noise"
        verdict.reason = (
            f"{precision} rejected by the AMP check: its smoothed loss curve strays up to {worst:.1%} from fp32's "
            f"over {len(losses)} steps on identical batches (allowed {allowed:.1%}: {why})"
        )
    return verdict


def calibrate_scaler(scaler: Any, compute_loss: Callable[[], Any], optimizer: Any, max_rounds: int = 32) -> int:
    """Find the loss scale the gradients fit, as a fresh GradScaler does over its first steps, without stepping.

    Each round scales and back-propagates the loss, unscales (which checks the gradients for overflow) and updates
    the scale, which halves on overflow; the first round whose scale did not go down ends it. Returns rounds run.
    """
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        optimizer.zero_grad(set_to_none=True)
        before = scaler.get_scale()
        scaler.scale(compute_loss()).backward()
        scaler.unscale_(optimizer)
        scaler.update()
        if scaler.get_scale() >= before:
            break
    optimizer.zero_grad(set_to_none=True)
    return rounds


def _train_curve(setup: TrainingSetup, batches: list[Any], precision: PrecisionSettings, steps: int, seed: int):
    import torch

    scaler = precision.grad_scaler()

    def compute_loss() -> torch.Tensor:
        with precision.autocast():
            return setup.loss_fn(setup.model, batches[0])

    if precision.uses_grad_scaler:
        calibrate_scaler(scaler, compute_loss, setup.optimizer)
    torch.manual_seed(seed)  # the same dropout masks in every precision's run
    losses: list[float] = []
    for step in range(steps):
        with precision.autocast():
            loss = setup.loss_fn(setup.model, batches[step % len(batches)])
        scaler.scale(loss).backward()
        scaler.step(setup.optimizer)
        scaler.update()
        setup.optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().float()))
    return losses


class _CurveRunner:
    """Trains loss curves in this process: the workload built afresh for each, from the same initial weights, on
    the same few batches (collated once, already on the device)."""

    def __init__(self, spec: AmpCheckSpec) -> None:
        import torch

        from autotune import workloads
        from autotune.data import DataSource
        from autotune.trial.loop import build_loader

        trial, self.settings = spec.trial, spec.settings
        if trial.config.intra_op_threads is not None:
            torch.set_num_threads(trial.config.intra_op_threads)
        self.seed = trial.seed
        self.device = torch.device("cuda", 0) if trial.device_type == "cuda" else torch.device("cpu")
        self.workload = workloads.get(trial.workload)
        self.data = DataSource.from_dict(yamlio.read_json(trial.data_file))
        self.options = {**self.workload.options, **trial.workload_options}
        self.config = dataclasses.replace(
            trial.config, per_device_batch_size=self.settings.batch_size, num_workers=0, pin_memory=False
        )
        reference, _ = self._build("fp32")
        self.initial = copy.deepcopy(reference.model.state_dict())
        loader = build_loader(reference, self.config, total_batches=self.settings.batches, seed=self.seed)
        count = self.settings.batches
        self.batches = [reference.batch_to_device(b, self.device, False) for b in itertools.islice(loader, count)]

    def _build(self, precision: str) -> tuple[TrainingSetup, PrecisionSettings]:
        import torch

        from autotune.trial.precision import PrecisionSettings
        from autotune.workloads.base import WorkloadContext

        torch.manual_seed(self.seed)
        config = dataclasses.replace(self.config, precision=precision)
        setup = self.workload.build(
            WorkloadContext(data=self.data, config=config, options=self.options, device=self.device)
        )
        setup.model.to(self.device).train()
        settings = PrecisionSettings(precision=precision, device_type=self.device.type, cudnn_benchmark=False)
        settings.apply_backend_flags()  # TF32 off: the reference is strict IEEE fp32, the others are autocast only
        return setup, settings

    def curve(self, precision: str, perturbation: float = 0.0) -> list[float]:
        """Losses of `steps` training steps; `perturbation` scales relative Gaussian noise on the initial weights."""
        import torch

        setup, settings = self._build(precision)
        weights = self.initial
        if perturbation:
            noise = torch.Generator().manual_seed(self.seed + 1)
            weights = {
                name: value * (1 + perturbation * torch.randn(value.shape, generator=noise).to(value.device))
                if value.is_floating_point()
                else value
                for name, value in self.initial.items()
            }
        setup.model.load_state_dict(weights)
        return _train_curve(setup, self.batches, settings, self.settings.steps, self.seed)


def run_check(spec: AmpCheckSpec) -> AmpCheckResult:
    """Train the fp32 reference and each precision's curve in this process; never raises for a failing precision.

    Only when some precision strays beyond the fixed tolerance is fp32's own divergence measured (the noise floor):
    fp32 again from initial weights perturbed by rounding-sized noise. Where training is chaotic (a high learning
    rate from the first step), that floor is large and the precision is judged against it.
    """
    settings = spec.settings
    result = AmpCheckResult(status="ok", settings=settings.to_dict())
    try:
        runner = _CurveRunner(spec)
        result.reference_losses = runner.curve("fp32")
    except Exception as error:
        result.status, result.reason = "error", f"the fp32 reference failed: {type(error).__name__}: {error}"[:300]
        result.log_tail = traceback.format_exc()[-_LOG_TAIL_CHARS:]
        return result
    if not all(math.isfinite(loss) for loss in result.reference_losses):
        result.status, result.reason = "error", "the fp32 reference loss became non-finite: nothing to compare with"
        return result
    for precision in spec.precisions:
        try:
            losses = runner.curve(precision)
        except Exception as error:  # e.g. an operator without a kernel for this dtype on this device
            reason = f"{precision} rejected by the AMP check: training raised {type(error).__name__}: {error}"
            result.verdicts.append(PrecisionVerdict(precision=precision, accepted=False, reason=reason[:300]))
            continue
        result.verdicts.append(judge(precision, result.reference_losses, losses, settings))
    if any(not v.accepted and v.max_deviation_fraction is not None for v in result.verdicts):
        result.floor_losses = runner.curve("fp32", perturbation=settings.perturbation)
        result.floor_deviation_fraction = compare_curves(
            result.reference_losses, result.floor_losses, settings.smoothing_steps
        )[0]
        result.verdicts = [
            judge(v.precision, result.reference_losses, v.losses, settings, floor=result.floor_deviation_fraction)
            if v.max_deviation_fraction is not None
            else v
            for v in result.verdicts
        ]
    return result


def main(argv: list[str]) -> int:
    """`python -m autotune.trial.amp_check SPEC.json`: write the AmpCheckResult to the spec's result_path."""
    started = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    spec = AmpCheckSpec.from_dict(yamlio.read_json(argv[0]))
    result = run_check(spec)
    result.wall_s = time.perf_counter() - started
    yamlio.write_json(spec.trial.result_path, result.to_dict())
    return 0


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def run_amp_check(spec: AmpCheckSpec, workdir: Path) -> AmpCheckResult:
    """Run the check in a child process with a hard timeout (parent side); a crash or hang gives status "error"."""
    from autotune.trial.launch import child_environment

    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, log_path = workdir / "amp_check.json", workdir / "amp_check.log"
    result_path = Path(spec.trial.result_path)
    yamlio.write_json(spec_path, spec.to_dict())
    result_path.unlink(missing_ok=True)
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "autotune.trial.amp_check", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_environment(spec.trial),
            start_new_session=True,
        )
        try:
            returncode: int | None = process.wait(timeout=spec.settings.timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            _kill_group(process)
            process.wait()
    if returncode == 0 and result_path.exists():
        result = AmpCheckResult.from_dict(yamlio.read_json(result_path))
    else:
        why = f"no result within {spec.settings.timeout_s:.0f} s" if returncode is None else f"exit code {returncode}"
        result = AmpCheckResult(status="error", reason=f"the AMP check process failed ({why}); see {log_path}")
        result.settings = spec.settings.to_dict()
    result.wall_s = time.perf_counter() - started
    if result.status != "ok":
        result.log_tail = result.log_tail or log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
