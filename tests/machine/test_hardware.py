"""hardware.probe through a fake NVML (nvidia-ml-py's `pynvml`), and the Hardware record itself."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from autotune.machine import hardware
from autotune.machine.gpus import GpuInfo
from autotune.machine.hardware import Hardware
from tests.conftest import make_cpu, make_cuda
from tests.fixtures.fake_nvml import A100, A100_UUID, H100, H100_UUID, FakeGpu, probe_error


def test_probe_lists_gpus_with_name_memory_capability_and_driver(install_nvml) -> None:
    nvml = install_nvml([A100, H100])
    probed = hardware.probe("auto")
    assert probed.device_type == "cuda"
    assert probed.gpus == (
        GpuInfo(name=A100.name, uuid=A100_UUID, memory_bytes=80 * 2**30, compute_capability=(8, 0)),
        GpuInfo(name=H100.name, uuid=H100_UUID, memory_bytes=79 * 2**30, compute_capability=(9, 0)),
    )
    assert probed.driver_version == "560.35.03"
    assert probed.cuda_version == "12.4"
    assert probed.device_count == 2
    assert nvml.calls == ["init", "shutdown"]
    assert not torch.cuda.is_initialized()


def test_probe_decodes_bytes_from_older_nvml(install_nvml) -> None:
    install_nvml([FakeGpu(b"Tesla V100-SXM2-32GB", b"GPU-0123", 32 * 2**30, (7, 0))])
    gpu = hardware.probe("auto").gpus[0]
    assert (gpu.name, gpu.uuid) == ("Tesla V100-SXM2-32GB", "GPU-0123")


def test_nvml_error_at_init_means_cpu(install_nvml) -> None:
    nvml = install_nvml([A100], fail_init=True)
    probed = hardware.probe("auto")
    assert probed.device_type == "cpu"
    assert probed.gpus == ()
    assert probed.driver_version is None
    assert "shutdown" not in nvml.calls  # nothing to shut down after a failed init


def test_nvml_error_while_listing_means_cpu_with_warning(install_nvml, caplog) -> None:
    nvml = install_nvml([A100, H100], lost_index=1)
    with caplog.at_level(logging.WARNING, logger="autotune.machine.gpus"):
        probed = hardware.probe("auto")
    assert probed.device_type == "cpu"
    assert probed.gpus == ()
    assert any("NVML failed" in record.getMessage() for record in caplog.records)
    assert nvml.calls == ["init", "shutdown"]


def test_missing_nvml_module_means_cpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert hardware.probe("auto").device_type == "cpu"


@pytest.mark.parametrize(
    ("gpus", "torch_cuda", "kwargs", "words"),
    [
        ([], "12.4", {}, "no usable NVIDIA GPU is visible (NVML lists none)"),
        (
            [A100],
            "12.4",
            {"fail_init": True},
            "no usable NVIDIA GPU is visible (NVML could not start: Driver Not Loaded",
        ),
        (
            [A100],
            "12.4",
            {"lost_index": 0},
            "no usable NVIDIA GPU is visible (NVML failed while listing GPUs: GPU is lost",
        ),
        ([A100], None, {}, "CPU-only build"),
    ],
    ids=["no-gpu", "no-driver", "gpu-lost", "cpu-torch"],
)
def test_probe_cuda_without_usable_gpu_is_a_user_error(install_nvml, monkeypatch, gpus, torch_cuda, kwargs, words):
    install_nvml(gpus, **kwargs)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    assert words in probe_error("cuda")


@pytest.mark.parametrize("visible", ["", "-1"])
def test_probe_cuda_with_every_gpu_hidden_says_so(install_nvml, monkeypatch, visible) -> None:
    install_nvml([A100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert f"CUDA_VISIBLE_DEVICES={visible!r} hides them all" in probe_error("cuda")


def test_auto_with_cpu_only_torch_is_cpu_with_a_warning(install_nvml, monkeypatch, caplog) -> None:
    install_nvml([A100])
    monkeypatch.setattr(torch.version, "cuda", None)
    with caplog.at_level(logging.WARNING, logger="autotune.machine.hardware"):
        assert hardware.probe("auto").device_type == "cpu"
    assert any("CPU-only build" in record.getMessage() for record in caplog.records)


def test_probe_cpu_ignores_gpus(install_nvml) -> None:
    install_nvml([A100])
    probed = hardware.probe("cpu")
    assert (probed.device_type, probed.gpus, probed.device_count) == ("cpu", (), 1)


def test_probe_auto_on_this_machine_is_cpu(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probed = hardware.probe("auto")
    assert probed.device_type == "cpu"
    assert probed.cpu_cores >= 1
    assert probed.memory_bytes > 0
    assert probed.torch_version == str(torch.__version__)


@pytest.mark.parametrize(
    ("record", "precisions"),
    [
        (make_cpu(), ("fp32", "bf16")),
        (make_cuda(name="Tesla V100-SXM2-32GB", capability=(7, 0)), ("fp32", "fp16")),
        (make_cuda(capability=(8, 0)), ("fp32", "fp32-default", "tf32", "fp16", "bf16")),
    ],
    ids=["cpu", "cc7.0-v100", "cc8.0-a100"],
)
def test_supported_precisions(record: Hardware, precisions: tuple[str, ...]) -> None:
    assert record.supported_precisions() == precisions


def test_fingerprint_is_stable() -> None:
    first, again = make_cuda(), make_cuda()
    assert first.fingerprint() == again.fingerprint() == first.fingerprint()
    assert first.fingerprint().startswith("a100-sxm4-80gb-x1-")


@pytest.mark.parametrize(
    "other",
    [make_cuda(name="NVIDIA H100 80GB HBM3"), make_cuda(count=2), make_cpu()],
    ids=["other-gpu-model", "more-gpus", "cpu"],
)
def test_fingerprint_differs_across_hardware(other: Hardware) -> None:
    assert other.fingerprint() != make_cuda().fingerprint()


@pytest.mark.parametrize("record", [make_cpu(), make_cuda(count=2)], ids=["cpu", "two-gpus"])
def test_to_dict_from_dict_round_trip(record: Hardware) -> None:
    data = record.to_dict()
    assert data["fingerprint"] == record.fingerprint()
    assert Hardware.from_dict(data) == record
