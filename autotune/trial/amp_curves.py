"""Loss curves for the AMP check (trial/amp_check.py): trained from identical weights, judged against fp32's."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.knobs.compile_modes import OFF as COMPILE_OFF

if TYPE_CHECKING:
    from autotune.knobs.precision import PrecisionSettings
    from autotune.trial.spec import TrialSpec
    from autotune.workloads.base import TrainingSetup

__all__ = [
    "AmpCheckSettings",
    "PrecisionVerdict",
    "CurveRunner",
    "calibrate_scaler",
    "compare_curves",
    "judge",
    "train_curve",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class AmpCheckSettings:
    """How the check runs: a tiny batch, a few batches reused, a short curve."""

    steps: int = 20
    batch_size: int = 4  # tiny: on a CPU a step of the real model is what the check costs
    batches: int = 4
    tolerance_fraction: float = 0.05
    smoothing_steps: int = 4  # one pass over the batches: each smoothed point averages every batch once
    perturbation: float = 2.0**-9  # relative weight noise of the fp32 noise-floor runs: bf16's rounding (half an ulp)
    # Where training is chaotic, a precision may stray floor_margin times as far as fp32 does from perturbed weights,
    # the worst of up to floor_runs such runs (one more only while some precision is still beyond the allowance).
    # Fewer runs or a smaller margin reject a sound precision on the draw of one noise (benchmarks/amp_floor.py;
    # benchmarks/README.md#trust-checks-the-amp-check-flops-the-compute-only-ceiling).
    floor_margin: float = 2.0
    floor_runs: int = 3
    timeout_s: float = 600.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AmpCheckSettings:
        from autotune.yamlio import from_fields

        return from_fields(cls, data)


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
    floor_runs: int = 1,
) -> PrecisionVerdict:
    """Accept or reject one precision's curve against fp32's.

    Args:
        floor: how far fp32 itself strays from perturbed initial weights (the most of floor_runs runs); when given,
            a precision may stray max(tolerance, floor_margin x floor).
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
            why += f", the most of {floor_runs} perturbed runs" if floor_runs > 1 else ""
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


def train_curve(
    setup: TrainingSetup,
    batches: list[Any],
    precision: PrecisionSettings,
    steps: int,
    seed: int,
    learning_rates: list[float] | None = None,
    on_step: Callable[[int, float], None] | None = None,
):
    """The losses of `steps` training steps; `learning_rates` (if given) gets the rate each step trained at, as the
    recipe's own schedule (a workload's step hook) set it; `on_step` (if given) gets each step's index and seconds,
    and may raise to stop the curve."""
    import time

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
        began = time.perf_counter()
        with precision.autocast():
            loss = setup.loss_fn(setup.model, batches[step % len(batches)])
        scaler.scale(loss).backward()
        scaler.step(setup.optimizer)
        scaler.update()
        setup.optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().float()))
        if learning_rates is not None:
            learning_rates.append(float(setup.optimizer.param_groups[0]["lr"]))
        if on_step is not None:
            on_step(step, time.perf_counter() - began)
    return losses


class CurveRunner:
    """Trains loss curves in this process: the workload built afresh for each, from the same initial weights, on
    the same few batches (collated once, already on the device)."""

    def __init__(self, trial: TrialSpec, settings: AmpCheckSettings) -> None:
        from autotune.trial.loader import build_loader
        from autotune.trial.process import TrialProcess

        self.settings = settings
        self.learning_rates: list[float] = []  # of the last curve trained, step by step
        self.process = TrialProcess.open(trial)  # the device, workload and data as a trial sets them up
        self.seed, self.device = trial.seed, self.process.device
        self.config = dataclasses.replace(
            trial.config, per_device_batch_size=self.settings.batch_size, num_workers=0, pin_memory=False
        )
        reference, _ = self._build("fp32")
        self.initial = copy.deepcopy(reference.model.state_dict())
        loader = build_loader(reference, self.config, total_batches=self.settings.batches, seed=self.seed)
        count = self.settings.batches
        self.batches = [reference.batch_to_device(b, self.device, False) for b in itertools.islice(loader, count)]

    def _build(self, precision: str) -> tuple[TrainingSetup, PrecisionSettings]:
        from autotune.knobs.process import apply_process_settings

        config = dataclasses.replace(self.config, precision=precision)
        # cudnn.benchmark off and TF32 off: the reference is strict IEEE fp32, the others are autocast only.
        settings = self.process.precision(config, cudnn_benchmark=False)
        apply_process_settings(config, settings)
        return self.process.build(config), settings

    def curve(
        self,
        precision: str,
        perturbation: float = 0.0,
        compile_mode: str = COMPILE_OFF,
        draw: int = 0,
        on_step: Callable[[int, float], None] | None = None,
    ) -> list[float]:
        """Losses of `steps` training steps; `perturbation` scales relative Gaussian noise on the initial weights (its
        `draw`-th draw: each a different noise); `compile_mode` compiles the network as a trial does
        (compile_modes.apply); `on_step` as train_curve's."""
        import torch

        from autotune.knobs import compile_modes

        setup, settings = self._build(precision)
        compile_modes.apply(setup.model, compile_mode)
        weights = self.initial
        if perturbation:
            noise = torch.Generator().manual_seed(self.seed + 1 + draw)
            weights = {
                name: value * (1 + perturbation * torch.randn(value.shape, generator=noise).to(value.device))
                if value.is_floating_point()
                else value
                for name, value in self.initial.items()
            }
        setup.model.load_state_dict(weights)
        self.learning_rates = []
        return train_curve(
            setup, self.batches, settings, self.settings.steps, self.seed, self.learning_rates, on_step=on_step
        )
