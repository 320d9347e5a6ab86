"""How a trial names the exception that ended it."""

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
