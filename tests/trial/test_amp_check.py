"""The AMP check: loss curves compared from identical weights on identical batches; a precision that strays is out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from autotune import space
from autotune.trial.amp_check import AmpCheckResult, AmpCheckSpec, amp_precisions, run_amp_check
from autotune.trial.amp_curves import AmpCheckSettings, PrecisionVerdict, calibrate_scaler, compare_curves, judge
from tests.conftest import make_cpu, make_cuda
from tests.fixtures.inductor import NEEDS_INDUCTOR
from tests.fixtures.runs import command_lines
from tests.trial.tiny_setups import faulty_spec


def test_curves_are_compared_after_smoothing():
    assert compare_curves([10.0] * 6, [10.0] * 6, 3) == (0.0, 0.0)
    assert compare_curves([10.0] * 6, [11.0] * 6, 3) == pytest.approx((0.1, 0.1))
    # One noisy step moves a 4-step trailing mean by a quarter of its size.
    worst, final = compare_curves([10.0] * 8, [10.0, 10.0, 10.0, 14.0, 10.0, 10.0, 10.0, 10.0], 4)
    assert worst == pytest.approx(0.1) and final == 0.0
    with pytest.raises(ValueError, match="cannot be compared"):
        compare_curves([1.0], [1.0, 2.0], 2)


def test_verdicts():
    settings = AmpCheckSettings(tolerance_fraction=0.05, smoothing_steps=2)
    accepted = judge("bf16", [4.0, 3.0, 2.0], [4.04, 3.05, 2.02], settings)
    assert accepted.accepted and accepted.max_deviation_fraction == pytest.approx(0.014)
    strayed = judge("fp16", [4.0, 3.0, 2.0], [4.0, 3.5, 3.0], settings)
    assert not strayed.accepted and "strays up to 30.0% from fp32's over 3 steps" in strayed.reason
    broken = judge("fp16", [4.0, 3.0, 2.0], [4.0, math.inf, 2.0], settings)
    assert not broken.accepted and "non-finite at step 2" in broken.reason
    # Where fp32 itself strays 25% from rounding-sized weight noise (chaotic training), 30% is within 2 x 25%.
    chaotic = judge("bf16", [4.0, 3.0, 2.0], [4.0, 3.5, 3.0], settings, floor=0.25)
    assert chaotic.accepted and chaotic.allowed_deviation_fraction == pytest.approx(0.5)
    assert "fp32 itself strays 10.0%" in judge("bf16", [4.0, 3.0, 2.0], [4.0, 3.5, 3.0], settings, floor=0.1).reason
    several = judge("bf16", [4.0, 3.0, 2.0], [4.0, 3.5, 3.0], settings, floor=0.1, floor_runs=3)
    assert "fp32 itself strays 10.0% from rounding-sized weight noise, the most of 3 perturbed runs" in several.reason


class _ScriptedRunner:
    """CurveRunner's interface with curves set in advance: a perturbed fp32 draw k strays floors[k] (at every step)."""

    def __init__(self, curves: dict[str, list[float]], floors: list[float]) -> None:
        self.curves, self.floors, self.drawn = curves, floors, []
        self.learning_rates: list[float] = []  # CurveRunner's: none recorded by a scripted curve

    def curve(self, precision: str, perturbation: float = 0.0, compile_mode: str = "off", draw: int = 0, on_step=None):
        if not perturbation:
            return list(self.curves[precision])
        self.drawn.append(draw)
        return [loss * (1 + self.floors[draw]) for loss in self.curves["fp32"]]


@pytest.mark.parametrize(
    ("floors", "drawn", "accepted", "allowed"),
    [
        ([0.2], [0], True, 0.4),  # the first draw leaves bf16's 30% within 2 x 20%: no second run
        ([0.1, 0.05, 0.16], [0, 1, 2], True, 0.32),  # the worst of three allows it
        ([0.1, 0.05, 0.12], [0, 1, 2], False, 0.24),  # three runs at most: rejected on the worst of them
        ([math.inf, 0.1, 0.1], [0, 1, 2], False, 0.2),  # a perturbed run that blew up allows nothing
    ],
)
def test_the_floor_is_the_worst_of_up_to_three_perturbed_runs(monkeypatch, floors, drawn, accepted, allowed):
    """How far chaotic fp32 strays is a matter of chance: one perturbed run rejected bf16 on CAM++ in about a quarter
    of draws; perturbed runs go on, one at a time, while a precision is still out, up to floor_runs, each a new
    noise, and the precision is judged against the most any of them strayed (benchmarks/amp_floor.py)."""
    from autotune.trial import amp_check

    reference = [10.0] * 8
    runner = _ScriptedRunner({"fp32": reference, "bf16": [13.0] * 8}, floors)
    monkeypatch.setattr(amp_check, "CurveRunner", lambda trial, settings: runner)
    settings = AmpCheckSettings(steps=8, smoothing_steps=1)
    result = amp_check.run_check(AmpCheckSpec(trial=None, precisions=("bf16",), settings=settings))
    (verdict,) = result.verdicts
    assert runner.drawn == drawn and result.floor_deviations == pytest.approx(floors[: len(drawn)])
    assert verdict.accepted is accepted and verdict.max_deviation_fraction == pytest.approx(0.3)
    assert verdict.allowed_deviation_fraction == pytest.approx(allowed)
    finite = [floor for floor in floors[: len(drawn)] if math.isfinite(floor)]
    assert result.floor_deviation_fraction == pytest.approx(max(finite))
    reported = [floor if math.isfinite(floor) else None for floor in floors[: len(drawn)]]  # YAML has no infinity
    assert result.report()["fp32_perturbed_deviations"] == pytest.approx(reported)


def test_precisions_are_judged_to_the_end_before_compiling_and_saved_as_they_become_final(monkeypatch):
    """Compiling is slow on a GPU (an H200's 60-s check ended with nothing: gpu_proof-h200.md): the precisions are
    judged first, floor included, and saved; only then the compile modes."""
    from autotune.trial import amp_check

    reference = [10.0] * 8
    curves = {"fp32": reference, "bf16": [13.0] * 8, "fp16": [10.1] * 8}
    runner = _ScriptedRunner(curves, [0.05, 0.05, 0.05])
    monkeypatch.setattr(amp_check, "CurveRunner", lambda trial, settings: runner)
    saved: list[AmpCheckResult] = []
    settings = AmpCheckSettings(steps=8, smoothing_steps=1)
    spec = AmpCheckSpec(trial=None, precisions=("bf16", "fp16"), settings=settings, compile_modes=("default",))
    result = amp_check.run_check(spec, saved.append)
    reference_only, partial = saved  # the reference trained (nothing judged), then the precisions judged
    assert reference_only.status == "partial" and reference_only.final == [] and not reference_only.verdicts
    assert partial.status == "partial" and partial.final == ["bf16", "fp16"] and len(partial.verdicts) == 2
    assert list(partial.rejected()) == ["bf16"]  # 30% against 2 x 5%, after three perturbed runs: final
    assert runner.drawn == [0, 1, 2]  # the floor ran before anything compiled
    assert result.status == "ok" and result.final == ["bf16", "fp16", "compile=default"]
    assert list(result.rejected()) == ["bf16"]


def test_a_check_with_no_time_for_the_noise_floor_rejects_nothing_it_could_not_judge(monkeypatch):
    """bf16 strays beyond the tolerance, and another fp32 curve (a perturbed run) cannot end within the limit: the
    check stops before it (a check killed in the middle of it would keep nothing), fp16's verdict stands, and bf16 is
    not judged (CAM++ beside a busy process: 60 s held the reference and bf16, not the floor's first run)."""
    from autotune.trial import amp_check

    runner = _ScriptedRunner({"fp32": [10.0] * 8, "bf16": [13.0] * 8, "fp16": [10.1] * 8}, [0.05, 0.05, 0.05])
    monkeypatch.setattr(amp_check, "CurveRunner", lambda trial, settings: runner)
    settings = AmpCheckSettings(steps=8, smoothing_steps=1, timeout_s=0.0)
    result = amp_check.run_check(AmpCheckSpec(trial=None, precisions=("bf16", "fp16"), settings=settings))
    assert runner.drawn == []  # no perturbed run started
    assert result.status == "partial" and result.final == ["fp16"] and result.rejected() == {}
    assert result.reason.startswith("bf16 strayed beyond what is allowed, and how far fp32 itself strays")
    assert result.reason.endswith("limit: not judged, so not rejected")
    shown = result.report()["precisions"]
    assert shown["bf16"]["accepted"] is None and shown["fp16"]["accepted"] is True  # bf16 neither accepted nor not


def test_a_partial_result_rejects_only_what_is_final():
    out = PrecisionVerdict(precision="bf16", accepted=False, reason="bf16 strays", max_deviation_fraction=0.3)
    fine = PrecisionVerdict(precision="fp16", accepted=True)
    assert AmpCheckResult(status="partial", verdicts=[out, fine], final=[]).rejected() == {}
    assert AmpCheckResult(status="partial", verdicts=[out, fine], final=["bf16", "fp16"]).rejected() == {
        "bf16": "bf16 strays"
    }
    assert AmpCheckResult(status="error", verdicts=[out], final=["bf16"]).rejected() == {}


def test_a_check_out_of_time_keeps_what_it_judged(monkeypatch, tmp_path: Path, tiny_corpus: Path):
    """The child saved its precisions' verdicts, then ran out of time compiling: the parent keeps them and says what
    was not judged (and so not rejected)."""
    import importlib

    from autotune import yamlio

    launch = importlib.import_module("autotune.trial.launch")  # the package's `launch` is a function of that name

    trial = faulty_spec(tmp_path, tiny_corpus, 1)
    out = PrecisionVerdict(precision="bf16", accepted=False, reason="bf16 strays", max_deviation_fraction=0.3)
    partial = AmpCheckResult(status="partial", verdicts=[out], final=["bf16"], reference_losses=[1.0])

    def times_out(module, args, *, env, log_path, timeout_s):
        yamlio.write_json(trial.result_path, partial.to_dict())
        Path(log_path).write_text("AMP check: bf16 trained at 20.0 s\n")
        return None

    monkeypatch.setattr(launch, "run_child", times_out)
    settings = AmpCheckSettings(timeout_s=60)
    spec = AmpCheckSpec(trial=trial, precisions=("bf16",), settings=settings, compile_modes=("default",))
    result = run_amp_check(spec, tmp_path / "c")
    assert result.status == "partial" and result.rejected() == {"bf16": "bf16 strays"}
    assert "no full result within 60 s: judged bf16; compile=default not judged, so not rejected" in result.reason
    assert "bf16 trained at 20.0 s" in result.log_tail


def test_the_pace_of_the_first_steps_stops_a_check_that_cannot_finish_in_time():
    """Three steps of the fp32 reference (the first left out: start-up) set the pace; the reference's rest and each
    other curve at half that pace must end within the limit, or the check stops at once."""
    from autotune.trial import amp_check

    settings = AmpCheckSettings(steps=20, timeout_s=60)
    started = amp_check.time.perf_counter()
    fits = amp_check._pace(started, 1, settings)  # 17 + 10 steps of 2 s: 54 s
    for step, seconds in enumerate([9.0, 2.0, 2.0, 2.0]):
        fits(step, seconds)
    too_slow = amp_check._pace(started, 2, settings)  # 17 + 2 x 10 steps of 2 s: 74 s
    too_slow(0, 9.0)
    too_slow(1, 2.0)
    with pytest.raises(amp_check._TooSlow, match=r"would end at about 74 s, past its 60 s limit"):
        too_slow(2, 2.0)


def test_a_check_too_slow_for_its_limit_stops_after_its_first_steps(tmp_path: Path, tiny_corpus: Path):
    """Batch 7 of the fixture sleeps 0.3 s a step: 40 steps of fp32 and 20 at bf16's pace need 18 s, the limit is
    15. The check says so after three steps instead of being killed at its limit with nothing judged."""
    trial = faulty_spec(tmp_path, tiny_corpus, 1)
    settings = AmpCheckSettings(steps=40, batch_size=7, batches=2, smoothing_steps=2, timeout_s=15)
    result = run_amp_check(AmpCheckSpec(trial=trial, precisions=("bf16",), settings=settings), tmp_path / "c")
    assert result.status == "error" and result.rejected() == {}
    assert "would end at about" in result.reason and "past its 15 s limit" in result.reason, result.reason
    assert "an fp32 step of its batch of 7 takes 0.3 s here" in result.reason
    assert "stopped: too slow to finish in time" in result.log_tail


def test_the_space_decides_which_precisions_are_checked():
    cam = space.space_path("cam++")
    assert amp_precisions(space.load(cam, make_cpu())) == ("bf16",)
    assert amp_precisions(space.load(cam, make_cuda())) == ("bf16", "fp16")


class _HalvingScaler:
    """GradScaler's scale search: gradients overflow while the scale is above 2**10."""

    def __init__(self) -> None:
        self.value, self.overflow = 2.0**16, False

    def get_scale(self) -> float:
        return self.value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self.overflow = self.value > 2.0**10
        return loss * self.value

    def unscale_(self, optimizer) -> None:
        return None

    def update(self) -> None:
        self.value = self.value / 2 if self.overflow else self.value


def test_fp16_calibrates_its_loss_scale_without_touching_the_weights():
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    scaler = _HalvingScaler()
    rounds = calibrate_scaler(scaler, lambda: model(torch.ones(3, 4)).sum(), optimizer)
    assert rounds == 7 and scaler.value == 2.0**10  # six halvings, then a round that fits
    assert torch.equal(model.weight, before) and model.weight.grad is None


def test_a_precision_that_does_not_train_like_fp32_is_rejected(tmp_path: Path, tiny_corpus: Path):
    trial = faulty_spec(tmp_path, tiny_corpus, 1)
    # batch 12: the fixture's loss is 1.5x under bf16 autocast; fp16 (CPU autocast, no scaler) is honest
    settings = AmpCheckSettings(steps=6, batch_size=12, batches=2, smoothing_steps=2, timeout_s=120)
    result = run_amp_check(AmpCheckSpec(trial=trial, precisions=("bf16", "fp16"), settings=settings), tmp_path / "c")
    assert result.status == "ok", result.log_tail
    assert len(result.reference_losses) == 6
    # the reference's median step after its first (start-up), for the budget's check before the first trial
    assert result.fp32_step_s is not None and 0.0 < result.fp32_step_s < 1.0
    bf16, fp16 = result.verdicts
    assert fp16.accepted and fp16.max_deviation_fraction < 0.05
    assert not bf16.accepted and bf16.max_deviation_fraction == pytest.approx(0.5, abs=0.05)
    assert list(result.rejected()) == ["bf16"]
    # bf16 strayed, so fp32's own divergence was measured: tiny for this model, no excuse for bf16
    assert result.floor_deviation_fraction is not None and result.floor_deviation_fraction < 0.05
    report = result.report()
    assert report["precisions"]["bf16"]["accepted"] is False and len(report["fp32_losses"]) == 6
    assert report["tolerance_fraction"] == 0.05 and report["steps"] == 6


def test_the_check_says_it_trained_under_the_recipes_warm_up_where_it_did(tmp_path: Path):
    """The conformer trains under WeNet's WarmupLR (25000 steps), so a 4-step check trains at 8e-8 to 3.2e-7 of the
    recipe's 0.002: its curves compare rounding more than training at speed, and the summary says so instead of
    letting "strays up to 0.0%" read as a verdict on bf16 training. The speaker fixture's constant rate reads as one."""
    from autotune import workloads, yamlio
    from autotune.cli.display import _amp_learning_rate
    from autotune.data import generate_corpus
    from autotune.knobs.config import TrialConfig
    from autotune.trial import TimingSettings, TrialSpec
    from autotune.workloads.asr import warmup_lr

    corpus = generate_corpus(
        tmp_path / "corpus", n_speakers=2, files_per_speaker=4, min_duration_s=1.0, max_duration_s=2.0, seed=4
    )
    data = workloads.get("conformer").load_data(str(corpus))
    small = {"output_size": 32, "attention_heads": 2, "linear_units": 64, "num_blocks": 1, "decoder_blocks": 1}
    trial = TrialSpec(
        workload="conformer",
        workload_options={"model": small},
        data_file=str(yamlio.write_json(tmp_path / "data.json", data.to_dict())),
        config=TrialConfig(per_device_batch_size=2, num_workers=0),
        timing=TimingSettings(warmup_steps=1, window_s=0.1),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
    settings = AmpCheckSettings(steps=4, batch_size=2, batches=2, smoothing_steps=2, timeout_s=120)
    result = run_amp_check(AmpCheckSpec(trial=trial, precisions=("bf16",), settings=settings), tmp_path / "c")
    assert result.status == "ok", result.log_tail
    assert result.learning_rates == pytest.approx([warmup_lr(1), warmup_lr(4)])
    shown = _amp_learning_rate(result.report()["learning_rates"])
    assert shown == " under the recipe's warm-up, learning rate 8e-08 to 3.2e-07"
    assert _amp_learning_rate([0.1, 0.1]) == " at learning rate 0.1" and _amp_learning_rate(None) == ""


@pytest.mark.slow
def test_an_amp_check_that_crashes_is_handled_like_a_trial(tmp_path: Path, tiny_corpus: Path):
    trial = faulty_spec(tmp_path, tiny_corpus, 1)
    settings = AmpCheckSettings(steps=4, batch_size=4, batches=1, smoothing_steps=1, timeout_s=120)  # 4: SIGBUS
    result = run_amp_check(AmpCheckSpec(trial=trial, precisions=("bf16",), settings=settings), tmp_path / "c")
    assert result.status == "error" and not result.rejected()  # it could not judge: nothing is rejected
    assert "killed by SIGBUS: shared memory" in result.reason and "\n" not in result.reason
    # faulthandler, set under the lifeline as for a trial: the native crash left the Python stack in the log
    assert "Fatal Python error: Bus error" in result.log_tail and "loss_fn" in result.log_tail


@pytest.mark.slow
def test_an_amp_check_that_hangs_is_killed_with_its_process_group(tmp_path: Path, tiny_corpus: Path):
    trial = faulty_spec(tmp_path, tiny_corpus, 1)
    settings = AmpCheckSettings(steps=4, batch_size=3, batches=1, smoothing_steps=1, timeout_s=5)  # 3: hangs
    result = run_amp_check(AmpCheckSpec(trial=trial, precisions=("bf16",), settings=settings), tmp_path / "c")
    assert result.status == "error" and "no result within 5 s" in result.reason
    assert result.wall_s is not None and result.wall_s < 30
    assert not [pid for pid, argv in command_lines() if any(str(tmp_path).encode() in arg for arg in argv)]


@pytest.mark.slow
@NEEDS_INDUCTOR
def test_compiled_training_is_checked_against_eager_like_a_precision(tmp_path: Path, tiny_corpus: Path):
    """Each compile mode trains fp32 through torch.compile (inductor, on this CPU) from the eager reference's weights
    on its batches: an honest compile matches eager to rounding; a compile that changes the model's maths (the
    fixture's network triples its logits when traced) is rejected, and the tuner then never launches it."""
    settings = AmpCheckSettings(steps=6, batch_size=5, batches=2, smoothing_steps=2, timeout_s=300)
    honest = faulty_spec(tmp_path / "honest", tiny_corpus, 1)
    result = run_amp_check(
        AmpCheckSpec(trial=honest, precisions=(), settings=settings, compile_modes=("default",)), tmp_path / "h"
    )
    assert result.status == "ok", result.log_tail
    (verdict,) = result.verdicts
    assert verdict.precision == "compile=default" and verdict.accepted, verdict
    assert verdict.max_deviation_fraction is not None and verdict.max_deviation_fraction < 1e-4
    assert result.rejected() == {}

    miscompiled = faulty_spec(tmp_path / "bad", tiny_corpus, 1)
    settings = AmpCheckSettings(steps=6, batch_size=14, batches=2, smoothing_steps=2, timeout_s=300)
    result = run_amp_check(
        AmpCheckSpec(trial=miscompiled, precisions=(), settings=settings, compile_modes=("dynamic",)), tmp_path / "b"
    )
    assert result.status == "ok", result.log_tail
    (verdict,) = result.verdicts
    assert not verdict.accepted and verdict.max_deviation_fraction is not None and verdict.max_deviation_fraction > 0.2
    assert list(result.rejected()) == ["compile=dynamic"]
    assert "compile=dynamic rejected by the AMP check" in result.rejected()["compile=dynamic"]
    assert result.report()["precisions"]["compile=dynamic"]["accepted"] is False


@NEEDS_INDUCTOR  # where this torch compiles at all: elsewhere the space offers no mode to check
def test_the_space_decides_which_compile_modes_are_checked():
    from autotune.trial.amp_check import space_compile_modes

    params = {"per_device_batch_size": {"type": "categorical", "choices": [4]}}
    searched = {**params, "compile": {"type": "categorical", "choices": ["off", "default", "dynamic"]}}
    assert space_compile_modes(space.from_dict({"params": searched}, make_cpu())) == ("default", "dynamic")
    assert space_compile_modes(space.from_dict({"params": params}, make_cpu())) == ()
    fixed = space.from_dict({"params": params, "fixed": {"compile": "dynamic"}}, make_cpu())
    assert space_compile_modes(fixed) == ("dynamic",)
