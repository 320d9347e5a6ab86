"""How a trial names the exception that ended it, and its stability gate."""

from __future__ import annotations

import pytest
import torch

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


def test_other_runtime_errors_stay_errors():
    status, reason = classify_exception(RuntimeError("CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."))
    assert status == "error" and reason.startswith("RuntimeError: CUDNN_STATUS_NOT_SUPPORTED")


@pytest.mark.parametrize(("others", "status", "disturbed"), [(0.02, "erratic", False), (0.45, "ok", True)])
def test_an_erratic_window_is_disturbed_not_erratic_when_other_processes_took_the_cpu(others, status, disturbed):
    """Someone else's job taking 45% of the CPU made the window vary: the configuration is kept, flagged; on a quiet
    machine the same variation condemns it."""
    from autotune.knobs.config import TrialConfig
    from autotune.trial import TimingSettings, TrialResult, TrialSpec
    from autotune.trial.child import _gate

    spec = TrialSpec(
        workload="x",
        workload_options={},
        data_file="",
        config=TrialConfig(per_device_batch_size=4),
        timing=TimingSettings(),
        device_type="cpu",
        result_path="",
    )
    result = _gate(TrialResult(status="ok", throughput_cv=0.47, others_cpu_fraction=others), spec)
    assert (result.status, result.disturbed) == (status, disturbed)
    assert ("other processes took 45%" in result.reason) is disturbed


def test_several_ranks_are_not_each_others_load():
    from autotune.trial.child import _others_across_ranks

    # Two ranks on two cores for 10 s: each used 9.5 CPU-seconds, the CPUs were busy 20 s: nobody else ran.
    ranks = [{"window_cpu_busy_s": 20.0, "window_cpu_own_s": 9.5, "window_cpu_capacity_s": 20.0}] * 2
    assert _others_across_ranks(ranks) == pytest.approx(0.05)
    assert _others_across_ranks([{"window_cpu_busy_s": None}] * 2) is None
