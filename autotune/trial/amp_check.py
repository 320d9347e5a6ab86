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
warms up over epochs) they grow fast. So when a precision strays beyond the tolerance, fp32 is trained again from
initial weights perturbed by rounding-sized noise (2**-9 relative, bf16's half ulp), and the precision may stray up
to twice as far as fp32 itself does: the most of up to three such runs, each with its own noise, run one at a time
while some precision is still beyond that. How far chaotic training strays is itself a matter of chance, so a floor
from one run would reject a sound precision on the draw of one noise; the most of three runs, doubled, rarely does
(benchmarks/README.md#trust-checks-the-amp-check-flops-the-compute-only-ceiling, from benchmarks/amp_floor.py). A
precision that really trains differently (a loss 1.5 times off from the first step, where training is not chaotic)
strays far beyond the floor.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import yamlio
from autotune.knobs.compile_modes import OFF as COMPILE_OFF
from autotune.trial.amp_curves import (
    AmpCheckSettings,
    CurveRunner,
    PrecisionVerdict,
    compare_curves,
    judge,
)
from autotune.trial.spec import TrialSpec
from autotune.yamlio import from_fields

if TYPE_CHECKING:
    from autotune.space.search_space import SearchSpace

__all__ = [
    "AUTOCAST_PRECISIONS",
    "AmpCheckSpec",
    "AmpCheckResult",
    "amp_precisions",
    "space_compile_modes",
    "space_precisions",
    "run_check",
    "run_amp_check",
]

logger = logging.getLogger(__name__)
_LOG_TAIL_CHARS = 4000
AUTOCAST_PRECISIONS = ("bf16", "fp16")  # what the check judges against fp32; fp32 and tf32 need no check
# A check judges nothing unless its fp32 reference and each precision's curve all fit in its time limit. After
# PACE_STEPS steps of the reference (the first carries start-up and is left out) it projects the rest; where even
# at AUTOCAST_PACE of fp32's step time for each autocast curve (bf16 on AMX or tensor cores trains about twice as
# fast) the curves end past the limit, it stops and says so: a slow or busy machine on a short --budget then spends
# seconds, not its whole limit, learning what the limit would have taught it, and the run keeps that time for trials.
PACE_STEPS = 3
AUTOCAST_PACE = 0.5


class _TooSlow(Exception):
    """The check's curves cannot fit in its time limit at the pace its first steps set."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AmpCheckSpec:
    """The check's one JSON input: the trial template (workload, data, device, seed, result path) and what to test."""

    trial: TrialSpec
    precisions: tuple[str, ...]
    settings: AmpCheckSettings = field(default_factory=AmpCheckSettings)
    # torch.compile modes to train in fp32 against eager fp32 (knobs/compile_modes.py): a compiler that changes what the
    # model computes beyond rounding is caught here, as a precision that does not train like fp32 is.
    compile_modes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial.to_dict(),
            "precisions": list(self.precisions),
            "settings": self.settings.to_dict(),
            "compile_modes": list(self.compile_modes),
        }

    def labels(self) -> list[str]:
        """What the check judges: each precision, then each compile mode's label (compile_modes.check_label)."""
        from autotune.knobs.compile_modes import check_label

        return [*self.precisions, *(check_label(mode) for mode in self.compile_modes)]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AmpCheckSpec:
        return cls(
            trial=TrialSpec.from_dict(data["trial"]),
            precisions=tuple(data["precisions"]),
            settings=AmpCheckSettings.from_dict(data.get("settings") or {}),
            compile_modes=tuple(data.get("compile_modes") or ()),
        )


@dataclass(kw_only=True, slots=True)
class AmpCheckResult:
    """The check's answer. status "error" means it could not judge (the fp32 reference failed): nothing is rejected."""

    status: str
    reason: str = ""
    # "partial": the check ran out of time; only the verdicts named in `final` stand (a precision beyond the tolerance
    # whose floor runs were not all taken is not final, and not rejected)
    final: list[str] = field(default_factory=list)
    reference_losses: list[float] = field(default_factory=list)
    verdicts: list[PrecisionVerdict] = field(default_factory=list)
    # fp32 from perturbed weights, run only while some precision strays beyond what is allowed: each run's deviation,
    # and the curve of the one that strayed most (which sets the allowance)
    floor_deviations: list[float] = field(default_factory=list)
    floor_losses: list[float] = field(default_factory=list)
    floor_deviation_fraction: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    # the learning rate of the fp32 reference's first and last step, as the recipe's schedule set it: a check trained
    # under a warm-up (WeNet's 25000 steps: 1.6e-6 at step 20) compares rounding more than training at speed
    learning_rates: list[float] = field(default_factory=list)
    # the fp32 reference's median step at the check's batch, its first step (start-up) left out: on a CPU, where a
    # step's cost grows with its batch, what the run's first trial should take per step (run/preflight.py)
    fp32_step_s: float | None = None
    wall_s: float | None = None
    log_tail: str = ""

    def rejected(self) -> dict[str, str]:
        """Precision -> why every trial with it is infeasible."""
        if self.status == "partial":
            return {v.precision: v.reason for v in self.verdicts if not v.accepted and v.precision in self.final}
        return {v.precision: v.reason for v in self.verdicts if not v.accepted} if self.status == "ok" else {}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AmpCheckResult:
        data = dict(data)
        data["verdicts"] = [PrecisionVerdict(**verdict) for verdict in data.get("verdicts") or []]
        return from_fields(cls, data)

    def report(self) -> dict[str, Any]:
        """What the result YAML keeps: the verdicts with their deviations, and both curves, rounded."""
        report: dict[str, Any] = {"status": self.status, **self.settings}
        if self.reason:
            report["reason"] = self.reason
        report["fp32_losses"] = _rounded(self.reference_losses)
        if self.floor_losses:
            report["fp32_perturbed_losses"] = _rounded(self.floor_losses)
            report["fp32_perturbed_deviation_fraction"] = _round(self.floor_deviation_fraction)
            report["fp32_perturbed_deviations"] = _rounded(self.floor_deviations)
        # a verdict the check had no time to make final (status "partial") is neither: accepted None, and not rejected
        judged = {v.precision for v in self.verdicts} if self.status == "ok" else set(self.final)
        report["precisions"] = {
            v.precision: {
                "accepted": v.accepted if v.precision in judged else None,
                "max_deviation_fraction": _round(v.max_deviation_fraction),
                "final_deviation_fraction": _round(v.final_deviation_fraction),
                "allowed_deviation_fraction": _round(v.allowed_deviation_fraction),
                "losses": _rounded(v.losses),
                **({"reason": v.reason} if v.reason else {}),
            }
            for v in self.verdicts
        }
        if self.learning_rates:
            report["learning_rates"] = _rounded(self.learning_rates)
        if self.wall_s is not None:
            report["wall_s"] = round(self.wall_s, 1)
        return report


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(f"{value:.5g}")


def _rounded(values: Sequence[float]) -> list[float | None]:
    return [_round(value) for value in values]


def _space_choices(space: SearchSpace, name: str) -> tuple[str, ...]:
    """Every value of a word knob a search space may try: its choices, or its fixed value."""
    choices: list[Any] = [space.fixed[name]] if name in space.fixed else []
    for param in space.params:
        if param.name == name:
            choices += list(getattr(param.distribution, "choices", ()))
    return tuple(dict.fromkeys(str(choice) for choice in choices))


def space_precisions(space: SearchSpace) -> tuple[str, ...]:
    """Every precision a search space may try: its choices, or its fixed value."""
    return _space_choices(space, "precision")


def space_compile_modes(space: SearchSpace) -> tuple[str, ...]:
    """The torch.compile modes a search space may try (compile off needs no check)."""
    return tuple(mode for mode in _space_choices(space, "compile") if mode != COMPILE_OFF)


def amp_precisions(space: SearchSpace) -> tuple[str, ...]:
    """The autocast precisions (bf16, fp16) a search space may try; fp32 and tf32 need no check."""
    return tuple(precision for precision in space_precisions(space) if precision in AUTOCAST_PRECISIONS)


def run_check(spec: AmpCheckSpec, save: Callable[[AmpCheckResult], None] = lambda result: None) -> AmpCheckResult:
    """Train the fp32 reference and each precision's curve in this process; never raises for a failing precision.

    Only when some precision strays beyond the fixed tolerance is fp32's own divergence measured (the noise floor):
    fp32 again from initial weights perturbed by rounding-sized noise. Where training is chaotic (a high learning
    rate from the first step), that floor is large and the precision is judged against it.

    The precisions are judged to the end first, floor included, then the compile modes (compiling is slow on a GPU):
    `save` gets the result, status "partial", each time more of it is final, so that a check stopped at its time
    limit keeps what it judged (run_amp_check).
    """
    settings = spec.settings
    result = AmpCheckResult(status="ok", settings=settings.to_dict())
    started = time.perf_counter()

    def progress(what: str) -> None:  # the log says where the check's time went, also when it is killed
        print(f"AMP check: {what} at {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)

    try:
        runner = CurveRunner(spec.trial, spec.settings)
        progress("built")
        step_times: list[float] = []
        pace = _pace(started, len(spec.labels()), settings)

        def on_step(step: int, step_s: float) -> None:
            step_times.append(step_s)
            pace(step, step_s)

        reference_started = time.perf_counter()
        try:
            result.reference_losses = runner.curve("fp32", on_step=on_step)
        finally:
            if len(step_times) >= 2:
                result.fp32_step_s = statistics.median(step_times[1:])
        reference_s = time.perf_counter() - reference_started
        result.learning_rates = [runner.learning_rates[0], runner.learning_rates[-1]] if runner.learning_rates else []
        progress("fp32 reference trained")
    except _TooSlow as slow:
        result.status, result.reason = "error", str(slow)
        progress("stopped: too slow to finish in time")
        return result
    except Exception as error:
        result.status, result.reason = "error", f"the fp32 reference failed: {type(error).__name__}: {error}"[:300]
        result.log_tail = traceback.format_exc()[-_LOG_TAIL_CHARS:]
        return result
    if not all(math.isfinite(loss) for loss in result.reference_losses):
        result.status, result.reason = "error", "the fp32 reference loss became non-finite: nothing to compare with"
        return result
    _save_partial(result, save)  # nothing judged yet; a check stopped from here on still says what fp32 steps take
    for precision in spec.precisions:
        try:
            losses = runner.curve(precision)
        except Exception as error:  # e.g. an operator without a kernel for this dtype on this device
            reason = f"{precision} rejected by the AMP check: training raised {type(error).__name__}: {error}"
            result.verdicts.append(PrecisionVerdict(precision=precision, accepted=False, reason=reason[:300]))
            continue
        finally:
            progress(f"{precision} trained")
        result.verdicts.append(judge(precision, result.reference_losses, losses, settings))

    def room() -> bool:  # for one more fp32 curve (a perturbed run) before the limit
        return time.perf_counter() - started + reference_s <= settings.timeout_s

    floor_why = (
        f"how far fp32 itself strays (another curve of {reference_s:.0f} s) could not be measured within the check's "
        f"{settings.timeout_s:.0f} s limit"
    )
    if not _judge_on_the_floor(runner, result, settings, progress, room):
        progress("stopped: no time for the noise floor")
        return _floor_cut_short(result, floor_why)
    _save_partial(result, save)
    reference = result.reference_losses
    for mode in spec.compile_modes:
        result.verdicts.append(_compiled_verdict(runner, mode, reference, settings))
        progress(f"{result.verdicts[-1].precision} trained")
    if not _judge_on_the_floor(runner, result, settings, progress, room):
        return _floor_cut_short(result, floor_why)
    result.final = [v.precision for v in result.verdicts]
    return result


def _pace(started: float, curves: int, settings: AmpCheckSettings) -> Callable[[int, float], None]:
    """The fp32 reference's step hook: after PACE_STEPS steps, raise _TooSlow where the reference's rest and the
    `curves` other curves (each at AUTOCAST_PACE of its step time) would end past settings.timeout_s."""
    seconds: list[float] = []

    def on_step(step: int, step_s: float) -> None:
        seconds.append(step_s)
        if len(seconds) != PACE_STEPS or PACE_STEPS >= settings.steps:
            return
        pace_s = statistics.median(seconds[1:])
        rest_s = (settings.steps - len(seconds)) * pace_s + curves * settings.steps * pace_s * AUTOCAST_PACE
        elapsed_s = time.perf_counter() - started
        if elapsed_s + rest_s > settings.timeout_s:
            raise _TooSlow(
                f"its curves would end at about {elapsed_s + rest_s:.0f} s, past its {settings.timeout_s:.0f} s "
                f"limit (an fp32 step of its batch of {settings.batch_size} takes {pace_s:.1f} s here), so it "
                f"stopped after {elapsed_s:.0f} s: nothing is rejected; a longer --budget or a quieter machine "
                "checks it"
            )

    return on_step


def _save_partial(result: AmpCheckResult, save: Callable[[AmpCheckResult], None]) -> None:
    """Hand `save` the result as it stands, every verdict in it final (the floor is behind them)."""
    verdicts = list(result.verdicts)
    save(dataclasses.replace(result, status="partial", verdicts=verdicts, final=[v.precision for v in verdicts]))


def _judge_on_the_floor(
    runner: CurveRunner,
    result: AmpCheckResult,
    settings: AmpCheckSettings,
    progress: Callable[[str], None] = lambda what: None,
    room: Callable[[], bool] = lambda: True,
) -> bool:
    """Where a curve strays beyond the tolerance, measure how far fp32 itself strays from rounding-sized weight noise
    and judge again against the most it strayed: one perturbed run at a time, while some precision is still beyond
    the allowance, up to settings.floor_runs. Training that is chaotic (a high learning rate from the first step)
    strays far and by chance: one draw is too few to say how far (AmpCheckSettings).

    Returns False, having run nothing more, where a perturbed run is still wanted and `room` says it cannot end
    within the check's limit: the precisions still beyond the allowance are then not judged (a check killed in the
    middle of that run would have judged nothing at all)."""
    measured = list(result.verdicts)  # on the tolerance alone
    reference = result.reference_losses

    def still_out() -> bool:
        return any(not v.accepted and v.max_deviation_fraction is not None for v in result.verdicts)

    while still_out() and len(result.floor_deviations) < settings.floor_runs:
        if not room():
            return False
        draw = len(result.floor_deviations)
        losses = runner.curve("fp32", perturbation=settings.perturbation, draw=draw)
        progress(f"perturbed fp32 {draw + 1} trained")
        deviation = compare_curves(reference, losses, settings.smoothing_steps)[0]
        result.floor_deviations.append(deviation)
        if not math.isfinite(deviation):  # perturbed fp32 blew up: it says nothing of how far rounding moves a curve
            continue
        if result.floor_deviation_fraction is None or deviation > result.floor_deviation_fraction:
            result.floor_losses, result.floor_deviation_fraction = losses, deviation
        floor, runs = result.floor_deviation_fraction, len(result.floor_deviations)
        result.verdicts = [
            judge(v.precision, reference, v.losses, settings, floor=floor, floor_runs=runs)
            if v.max_deviation_fraction is not None
            else v
            for v in measured
        ]
    return True


def _floor_cut_short(result: AmpCheckResult, why: str) -> AmpCheckResult:
    """The result where the noise floor found no time: the verdicts still beyond the allowance are not final (and so
    reject nothing), the others stand; `why` says what the floor would have cost against the limit."""
    out = [v.precision for v in result.verdicts if not v.accepted and v.max_deviation_fraction is not None]
    result.status, result.final = "partial", [v.precision for v in result.verdicts if v.precision not in out]
    result.reason = f"{', '.join(out)} strayed beyond what is allowed, and {why}: not judged, so not rejected"
    return result


def _compiled_verdict(
    runner: CurveRunner, mode: str, reference: list[float], settings: AmpCheckSettings
) -> PrecisionVerdict:
    """fp32 trained through torch.compile(mode) against eager fp32, from the same weights on the same batches."""
    from autotune.knobs.compile_modes import check_label

    label = check_label(mode)
    try:
        losses = runner.curve("fp32", compile_mode=mode)
    except Exception as error:  # inductor failing on this model: every trial with the mode would fail the same way
        reason = f"{label} rejected by the AMP check: compiling raised {type(error).__name__}: {error}"
        return PrecisionVerdict(precision=label, accepted=False, reason=reason[:300])
    return judge(label, reference, losses, settings)


def main(argv: list[str]) -> int:
    """`python -m autotune.trial.amp_check SPEC.json`: write the AmpCheckResult to the spec's result_path.

    Started like a trial (trial/launch.py start_child): the lifeline, faulthandler and logging are set before this
    module is imported (trial/lifeline.py)."""
    started = time.perf_counter()
    spec = AmpCheckSpec.from_dict(yamlio.read_json(argv[0]))

    def save(partial: AmpCheckResult) -> None:
        partial.wall_s = time.perf_counter() - started
        yamlio.write_json(spec.trial.result_path, partial.to_dict())

    result = run_check(spec, save)
    result.wall_s = time.perf_counter() - started
    yamlio.write_json(spec.trial.result_path, result.to_dict())
    return 0


def run_amp_check(spec: AmpCheckSpec, workdir: Path) -> AmpCheckResult:
    """Run the check in a child process with a hard timeout (parent side): started, timed out and killed (its
    process group) by the trials' launcher; a crash or hang gives status "error" saying which, with the log's tail."""
    from autotune.trial.launch import child_environment, describe_exit, run_child

    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, log_path = workdir / "amp_check.json", workdir / "amp_check.log"
    result_path = Path(spec.trial.result_path)
    yamlio.write_json(spec_path, spec.to_dict())
    result_path.unlink(missing_ok=True)
    started = time.perf_counter()
    timeout_s = spec.settings.timeout_s
    env = child_environment(spec.trial)
    returncode = run_child(
        "autotune.trial.amp_check", [str(spec_path)], env=env, log_path=log_path, timeout_s=timeout_s
    )
    if returncode == 0 and result_path.exists():
        result = AmpCheckResult.from_dict(yamlio.read_json(result_path))
    elif returncode is None and result_path.exists():  # out of time, with the precisions judged: keep those
        result = AmpCheckResult.from_dict(yamlio.read_json(result_path))
        unjudged = [label for label in spec.labels() if label not in result.final]
        result.reason = (
            f"no full result within {timeout_s:.0f} s: judged {', '.join(result.final) or 'nothing'}; "
            f"{', '.join(unjudged)} not judged, so not rejected; see {log_path}"
        )
    else:
        why = f"no result within {timeout_s:.0f} s" if returncode is None else describe_exit(returncode)
        result = AmpCheckResult(status="error", reason=f"the AMP check process failed ({why}); see {log_path}")
        result.settings = spec.settings.to_dict()
    result.wall_s = time.perf_counter() - started
    if result.status != "ok":
        result.log_tail = result.log_tail or log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
