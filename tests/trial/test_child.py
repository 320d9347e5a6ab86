"""How a trial names the exception that ended it, and its stability gate."""

from __future__ import annotations

import pytest
import torch

from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.child import classify_exception


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    ],
    ids=["torch", "cublas", "cudnn", "runtime"],
)
def test_out_of_memory_is_oom_however_the_cuda_library_reports_it(error):
    status, reason = classify_exception(error)
    assert status == "oom" and reason.startswith("out of memory: ") and "\n" not in reason


def _bare_spec() -> TrialSpec:
    """A CPU trial's spec with nothing behind it, for what a trial does with its result."""
    return TrialSpec(
        workload="x",
        workload_options={},
        data_file="",
        config=TrialConfig(per_device_batch_size=4),
        timing=TimingSettings(),
        device_type="cpu",
        result_path="",
    )


def test_a_window_the_budget_stopped_too_soon_is_stopped_not_failed():
    from autotune.trial.loop import BudgetStopped

    status, reason = classify_exception(BudgetStopped("stopped when --budget ran out, 2 window step(s) (2.0 s) in"))
    assert status == "stopped" and reason.startswith("stopped when --budget ran out")


def test_a_trial_the_budget_stopped_says_what_its_steps_took(monkeypatch):
    """What the run's error needs to name the budget that would measure the configuration (run/runner.py)."""
    from autotune.trial import child
    from autotune.trial.loop import BudgetStopped

    def stopped(spec, started, rank):
        raise BudgetStopped("stopped when --budget ran out, 2 window step(s) (29.6 s) into the window", step_s=14.8)

    monkeypatch.setattr(child, "_measure", stopped)
    result = child.run_trial(_bare_spec())
    assert result.status == "stopped" and result.step_time_median_s == 14.8 and not result.feasible


def test_the_progress_file_says_which_steps_a_rate_covers_and_who_else_used_the_cpu(tmp_path):
    """What the parent's pruner reads (search/pruning.py): the rate, and with the span it covers (trial/loop.py
    RunningRates) its steps and other processes' share of the CPUs meanwhile; own training's probe writes the rate
    alone."""
    from autotune import yamlio
    from autotune.machine.cpu_load import cpu_sample
    from autotune.trial.child import ProgressWriter
    from autotune.trial.loop import RateSpan

    path = tmp_path / "result.json.progress"
    span = RateSpan(after_steps=2, since=cpu_sample(), steps=3, seconds=1.5, samples=24)
    ProgressWriter(str(path), interval_s=0.0)("warmup", span.samples_per_second, 4.0, span)
    reading = yamlio.read_json(path)
    assert reading["samples_per_second"] == 16.0 and (reading["after_steps"], reading["steps"]) == (2, 3)
    assert reading["seconds"] == 1.5 and 0.0 <= reading["others_cpu_fraction"] <= 1.0
    ProgressWriter(str(path), interval_s=0.0, scale=2)("warmup", 16.0, 4.0, span)  # rank 0 of two: not its tree
    assert yamlio.read_json(path)["others_cpu_fraction"] is None
    ProgressWriter(str(path), interval_s=0.0)("window", 16.0, 4.0)
    assert yamlio.read_json(path) == {"phase": "window", "samples_per_second": 16.0, "elapsed_s": 4.0}


def test_other_runtime_errors_stay_errors():
    status, reason = classify_exception(RuntimeError("CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."))
    assert status == "error" and reason.startswith("RuntimeError: CUDNN_STATUS_NOT_SUPPORTED")


@pytest.mark.parametrize(("others", "status", "disturbed"), [(0.02, "erratic", False), (0.45, "ok", True)])
def test_an_erratic_window_is_disturbed_not_erratic_when_other_processes_took_the_cpu(others, status, disturbed):
    """Someone else's job taking 45% of the CPU made the window vary: the configuration is kept, flagged; on a quiet
    machine the same variation condemns it."""
    from autotune.trial import TrialResult
    from autotune.trial.child import _gate

    result = _gate(TrialResult(status="ok", throughput_cv=0.47, others_cpu_fraction=others), _bare_spec())
    assert (result.status, result.disturbed) == (status, disturbed)
    assert ("other processes took 45%" in result.reason) is disturbed


def test_several_ranks_are_not_each_others_load():
    from autotune.trial.child import _others_across_ranks

    # Two ranks on two cores for 10 s: each used 9.5 CPU-seconds, the CPUs were busy 20 s: nobody else ran.
    ranks = [{"window_cpu_busy_s": 20.0, "window_cpu_own_s": 9.5, "window_cpu_capacity_s": 20.0}] * 2
    assert _others_across_ranks(ranks) == pytest.approx(0.05)
    assert _others_across_ranks([{"window_cpu_busy_s": None}] * 2) is None
