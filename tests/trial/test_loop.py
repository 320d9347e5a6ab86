"""The timed loop in-process: adaptive warm-up, window accounting and the epoch-amortised objective."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from torch import nn

from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import PrecisionSettings
from autotune.trial.loader import build_loader
from autotune.trial.loop import BudgetStopped, RunningRates, measure
from autotune.trial.memory import PeakMemory
from autotune.trial.spec import TimingSettings
from autotune.trial.steady import planned_batches
from autotune.trial.window_record import WindowMeasurement
from autotune.workloads.base import TrainingSetup


class _Clock:
    """A stand-in for time.perf_counter that only moves when a training step says so: timings are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr("autotune.trial.loop.time", fake)
    return fake


def _setup(slow_steps: int, clock: _Clock | None = None, fast_s: float = 0.005) -> TrainingSetup:
    model = nn.Linear(4, 2)
    calls = {"n": 0}

    def loss_fn(module: nn.Module, batch):
        calls["n"] += 1
        # Start-up costs that shrink step after step (never two alike), then steady state.
        step_s = 0.2 * 0.5 ** (calls["n"] - 1) if calls["n"] <= slow_steps else fast_s
        if clock is not None:
            clock.now += step_s
        else:
            time.sleep(step_s)
        features, labels = batch
        return nn.functional.cross_entropy(module(features), labels)

    dataset = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    return TrainingSetup(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=dataset,
        collate_fn=None,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch[1].shape[0]),
        audio_seconds_in=lambda batch: 3.0 * 4,
    )


def _measure(
    setup: TrainingSetup,
    timing: TimingSettings,
    config: TrialConfig | None = None,
    spent_before_s: float = 0.0,
    total_batches: int = 200,
    memory: PeakMemory | None = None,
    stop_by: float | None = None,
) -> WindowMeasurement:
    config = config or TrialConfig(per_device_batch_size=4)
    loader = build_loader(setup, config, total_batches=total_batches, seed=0)
    memory = memory or PeakMemory(torch.device("cpu"))
    try:
        return measure(
            setup,
            iter(loader),
            config=config,
            timing=timing,
            precision=PrecisionSettings(precision="fp32", device_type="cpu"),
            device=torch.device("cpu"),
            memory=memory,
            spent_before_s=spent_before_s,
            stop_by=stop_by,
        )
    finally:
        memory.stop()


# The forward rule (CUDA, several ranks: warm-up until consecutive steps agree), pinned on a CPU: no hindsight, no
# warm-up time limits, one step per settle chunk, a window of window_s.
FORWARD = {
    "trim_transient": False,
    "min_warmup_fraction": 0.0,
    "max_warmup_factor": 1e6,  # no cap in seconds: max_warmup_steps only
    "settle_chunk_s": 0.0,
    "min_timed_share": 0.0,
}


def test_warm_up_goes_on_until_step_times_settle(clock):
    timing = TimingSettings(warmup_steps=2, max_warmup_steps=12, window_s=0.1, min_window_steps=3, **FORWARD)
    result = _measure(_setup(slow_steps=5, clock=clock), timing)
    assert result.warmup_steps == 7  # the five shrinking steps, then two that agree
    assert max(result.step_times_s) == pytest.approx(0.005)  # nothing of the start-up leaked into the window


@pytest.mark.parametrize(
    "rules", [FORWARD, {"min_timed_share": 0.0, "max_warmup_factor": 1e6}], ids=["forward", "hindsight"]
)
def test_warm_up_is_bounded(clock, rules):
    timing = TimingSettings(warmup_steps=2, max_warmup_steps=4, window_s=0.1, min_window_steps=3, **rules)
    assert _measure(_setup(slow_steps=50, clock=clock), timing).warmup_steps == 4


def test_window_counts_samples_steps_and_audio():
    timing = TimingSettings(warmup_steps=1, min_warmup_fraction=0.0, window_s=0.2, min_window_steps=5)
    result = _measure(_setup(slow_steps=0), timing)
    steps = len(result.step_times_s)
    assert steps >= 5 and result.samples == 4 * steps and result.audio_s == 12.0 * steps
    assert result.window_s >= 0.2 and 0.0 <= result.data_wait_s < result.window_s


def test_hindsight_moves_a_start_up_transient_out_of_the_window_after_a_one_step_warm_up(clock):
    """One CPU rank: warm-up is one step; the window's slow front is found afterwards and becomes warm-up."""
    timing = TimingSettings(window_s=0.2, min_window_steps=4, min_warmup_fraction=0.0, min_timed_share=0.0)
    result = _measure(_setup(slow_steps=5, clock=clock, fast_s=0.01), timing)
    assert result.trimmed_steps > 0 and result.warmup_steps == 1 + result.trimmed_steps
    assert max(result.step_times_s) == pytest.approx(0.01)  # nothing of the start-up is left in the window
    assert result.window_s == pytest.approx(sum(result.step_times_s)) and result.window_s >= 0.2
    assert result.samples == 4 * len(result.step_times_s)


def test_a_trimmed_front_ends_on_an_optimiser_step_under_gradient_accumulation(clock):
    timing = TimingSettings(window_s=0.2, min_window_steps=4, min_warmup_fraction=0.0, min_timed_share=0.0)
    config = TrialConfig(per_device_batch_size=4, grad_accum_steps=2)
    result = _measure(_setup(slow_steps=3, clock=clock, fast_s=0.01), timing, config)
    # Warm-up is one optimiser step (two micro-batches); the third, slow micro-batch takes its partner with it.
    assert (result.warmup_steps, result.trimmed_steps) == (4, 2)
    assert max(result.step_times_s) == pytest.approx(0.01) and len(result.step_times_s) % 2 == 0


def _stepping(times_s: list[float], clock: _Clock) -> TrainingSetup:
    """_setup's model on the exact clock, its steps taking times_s in turn (the last one from then on)."""
    setup, calls = _setup(slow_steps=0, clock=clock, fast_s=0.0), {"n": 0}

    def loss_fn(module: nn.Module, batch):
        clock.now += times_s[min(calls["n"], len(times_s) - 1)]
        calls["n"] += 1
        return setup.loss_fn(module, batch)

    return dataclasses.replace(setup, loss_fn=loss_fn)


def test_a_trimmed_front_stops_at_max_warmup_steps_and_the_loader_s_plan_holds(clock):
    """A fast step whose window's first quarter (15 steps) is slower: the front found is 15 steps, but warm-up stops at
    max_warmup_steps; then the window runs to max_window_steps. The trial's DataLoader holds planned_batches and no
    more: trimming the whole front ran it dry (StopIteration) in a SLURM test on a loaded machine."""
    timing = TimingSettings(
        window_s=0.3, min_window_steps=4, max_window_steps=130, max_warmup_steps=8, min_warmup_fraction=0.0,
        min_timed_share=0.0, max_warmup_factor=1e6,
    )  # fmt: skip
    config = TrialConfig(per_device_batch_size=4)
    setup = _stepping([0.5] + [0.005] * 15 + [0.002], clock)
    result = _measure(setup, timing, config, total_batches=planned_batches(timing, config.grad_accum_steps))
    assert result.warmup_steps == timing.max_warmup_steps and result.trimmed_steps == timing.max_warmup_steps - 1
    assert len(result.step_times_s) == timing.max_window_steps


def test_a_steady_window_is_kept_whole_after_a_single_warm_up_step(clock):
    timing = TimingSettings(window_s=0.2, min_window_steps=4, min_warmup_fraction=0.0, min_timed_share=0.0)
    result = _measure(_setup(slow_steps=1, clock=clock, fast_s=0.01), timing)
    assert (result.warmup_steps, result.trimmed_steps) == (1, 0)
    assert len(result.step_times_s) == 20 and result.window_s == pytest.approx(0.2)


def test_the_window_is_at_least_three_times_what_the_trial_spent_reaching_it(clock):
    """min_timed_share 0.75: 3 s of process start and setup and a 1-s warm-up step ask for a 12-s window."""
    timing = TimingSettings(window_s=2.0, min_window_steps=2, min_timed_share=0.75, max_window_factor=6.0)
    result = _measure(_setup(slow_steps=0, clock=clock, fast_s=1.0), timing, spent_before_s=3.0)
    assert result.warmup_steps == 1 and result.window_s == pytest.approx(12.0)
    assert result.window_s / (3.0 + result.warmup_s + result.window_s) == pytest.approx(0.75)


def test_objective_charges_worker_start_once_per_epoch_without_persistent_workers():
    window = WindowMeasurement(samples=100, audio_s=300.0, window_s=10.0, loader_start_s=5.0, step_times_s=[0.1] * 10)
    persistent = TrialConfig(per_device_batch_size=10, num_workers=2, persistent_workers=True)
    restarted = TrialConfig(per_device_batch_size=10, num_workers=2, persistent_workers=False)
    assert window.summary(1000, persistent)["samples_per_second"] == pytest.approx(10.0)
    # 1000 samples take 100 s at 10/s; a restart adds 5 s per epoch: 1000 / 105 s.
    assert window.summary(1000, restarted)["samples_per_second"] == pytest.approx(1000 / 105)
    assert window.summary(1000, restarted)["window_samples_per_second"] == pytest.approx(10.0)


def test_throughput_cv_sees_stalls_and_forgives_bursts_and_uneven_batches():
    from autotune.trial.window_record import throughput_cv

    # A data-bound loader delivering in bursts: one step waits 0.9 s, the next three find batches ready.
    bursty = [0.9, 0.1, 0.1, 0.1] * 4
    assert throughput_cv(bursty, [8] * 16) == pytest.approx(0.0)
    # Batches of different lengths: time follows samples, throughput does not move.
    uneven = [0.5, 1.0, 0.25, 0.75] * 4
    assert throughput_cv(uneven, [int(t * 40) for t in uneven]) == pytest.approx(0.0)
    # The last quarter stalls to a tenth of the speed: the kind of window the gate is for.
    stalled = [0.5] * 12 + [5.0] * 4
    assert throughput_cv(stalled, [8] * 16) == pytest.approx(0.5, abs=0.01)


def test_the_window_judges_stability_on_seconds_of_audio_where_utterances_differ_in_length():
    # Four utterances a batch, 2 to 8 s long, batched by length (WeNet sorts): step time follows the audio, not the
    # sample count, and a quarter of long utterances is no stall.
    times = [0.4] * 4 + [1.6] * 4 + [0.8] * 4 + [1.2] * 4
    window = WindowMeasurement(
        samples=64,
        audio_s=sum(t * 20 for t in times),
        window_s=sum(times),
        step_times_s=times,
        step_samples=[4] * 16,
        step_audio_s=[t * 20 for t in times],
    )
    summary = window.summary(1000, TrialConfig(per_device_batch_size=4))
    assert summary["throughput_cv"] == pytest.approx(0.0)
    assert summary["step_time_cv"] > 0.3  # what a per-step gate would have condemned
    without_audio = WindowMeasurement(samples=64, window_s=sum(times), step_times_s=times, step_samples=[4] * 16)
    assert without_audio.summary(1000, TrialConfig(per_device_batch_size=4))["throughput_cv"] > 0


@pytest.mark.parametrize(
    ("times", "why"),
    [([0.5, 0.5, 0.5], "fewer than four steps"), ([0.01] * 40, "the window is shorter than two parts of a second")],
)
def test_throughput_cv_is_not_judged_on_windows_too_short_to_tell(times, why):
    from autotune.trial.window_record import throughput_cv

    assert throughput_cv(times, [4] * len(times)) is None, why


def test_the_erratic_gate_rejects_a_stalling_window_and_can_be_switched_off():
    from autotune.trial import TrialResult, TrialSpec
    from autotune.trial.child import _gate

    def gate(cv: float | None, limit: float | None) -> TrialResult:
        spec = TrialSpec(
            workload="x",
            workload_options={},
            data_file="",
            config=TrialConfig(per_device_batch_size=4),
            timing=TimingSettings(max_throughput_cv=limit),
            device_type="cpu",
            result_path="",
        )
        return _gate(TrialResult(status="ok", throughput_cv=cv), spec)

    assert TimingSettings().max_throughput_cv is not None  # on by default
    stalled = gate(0.5, 0.25)
    assert stalled.status == "erratic" and "CV 0.50" in stalled.reason
    assert gate(0.1, 0.25).status == "ok"
    assert gate(None, 0.25).status == "ok"  # a window too short to judge is not condemned
    assert gate(0.5, None).status == "ok"


class _CountingMemory(PeakMemory):
    """PeakMemory on a CPU that counts the step-end readings the loop gives it (on CUDA: the peak's readings)."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.step_ends = 0

    def step_done(self) -> None:
        self.step_ends += 1


@pytest.mark.parametrize("accum", [1, 3])
def test_every_step_of_warm_up_and_window_ends_with_a_memory_reading(clock, accum):
    """On CUDA the peak is what the allocator holds at each step's end (trial/memory.py: a cuDNN search's workspace is
    gone by then): every micro-batch of warm-up and window gives one; the first warm-up steps' times are kept."""
    setup = _setup(slow_steps=3, clock=clock)
    timing = TimingSettings(warmup_steps=2, max_warmup_steps=12, window_s=0.1, min_window_steps=3, **FORWARD)
    config = TrialConfig(per_device_batch_size=4, grad_accum_steps=accum)
    memory = _CountingMemory()
    result = _measure(setup, timing, config, total_batches=planned_batches(timing, accum), memory=memory)
    assert memory.step_ends == result.warmup_steps + len(result.step_times_s)
    assert result.warmup_first_steps_s == pytest.approx([0.2, 0.1, 0.05, 0.005][: len(result.warmup_first_steps_s)])


BUDGET_CUT = TimingSettings(window_s=20.0, min_window_steps=2, min_warmup_fraction=0.0, min_timed_share=0.0)


def test_a_window_the_budget_ends_keeps_the_steps_it_timed_and_says_so(clock):
    """1-s steps, a 20-s window asked for, and the budget's end (less the result's writing) at 8.5 s: the window
    ends at the last step that fits (8 s) with 7 steps, enough for a spread over parts, and is marked cut."""
    result = _measure(_setup(slow_steps=0, clock=clock, fast_s=1.0), BUDGET_CUT, stop_by=8.5)
    assert result.cut_by_budget and result.planned_s == pytest.approx(20.0)
    assert len(result.step_times_s) == 7 and result.window_s == pytest.approx(7.0) and clock.now == 8.0
    summary = result.summary(32, TrialConfig(per_device_batch_size=4))
    assert summary["window_cut_by_budget"] and summary["window_planned_s"] == pytest.approx(20.0)
    assert summary["throughput_cv"] == pytest.approx(0.0)  # its spread, over three parts


def test_a_window_the_budget_ends_too_soon_to_measure_a_spread_is_stopped(clock):
    """Two timed steps are no spread (two parts of two steps and a second each): the trial says nothing."""
    with pytest.raises(BudgetStopped, match="2 window step") as stopped:
        _measure(_setup(slow_steps=0, clock=clock, fast_s=1.0), BUDGET_CUT, stop_by=3.5)
    assert stopped.value.step_s == pytest.approx(1.0)  # what its window's steps took: for the budget that would do


def test_a_window_the_budget_does_not_reach_runs_by_its_rules(clock):
    result = _measure(_setup(slow_steps=0, clock=clock, fast_s=1.0), BUDGET_CUT, stop_by=100.0)
    assert not result.cut_by_budget and result.planned_s is None and result.window_s == pytest.approx(20.0)


def test_the_pruner_is_told_rates_that_leave_the_start_up_steps_out():
    """Never the first step. In warm-up the second step alone until two steps after the first two ran, then those;
    in the window its own steps after the trial's first two (a CPU window may begin at the second step)."""
    told: list[tuple[str, float, int, int]] = []

    def report(phase: str, rate: float, elapsed_s: float, span) -> None:
        told.append((phase, rate, span.after_steps, span.steps))

    warming = RunningRates(report)
    for step_s in (10.0, 4.0, 1.0, 1.0):
        warming.step("warmup", step_s, 8, 0.0)
    assert told == [("warmup", 2.0, 1, 1), ("warmup", 8.0, 2, 1), ("warmup", 8.0, 2, 2)]
    told.clear()
    one_step_warm_up = RunningRates(report)  # a CPU's: the window's front is reported as warm-up, with hindsight
    one_step_warm_up.step("warmup", 10.0, 8, 10.0)
    one_step_warm_up.start_window(None)  # type: ignore[arg-type]
    for phase, step_s in (("warmup", 4.0), ("window", 1.0), ("window", 3.0)):
        one_step_warm_up.step(phase, step_s, 8, 0.0)
    assert told == [("warmup", 2.0, 1, 1), ("window", 8.0, 2, 1), ("window", 4.0, 2, 2)]
