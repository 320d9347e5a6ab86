"""hardware.probe through a fake NVML (nvidia-ml-py's `pynvml`), and the Hardware record itself."""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from autotune import hardware
from autotune.errors import UserError
from autotune.hardware import GpuInfo, Hardware
from tests.conftest import make_cpu, make_cuda

# NVML return codes, as nvidia-ml-py names them.
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15

A100_UUID = "GPU-8a9f1c2e-0000-1111-2222-333344445555"
H100_UUID = "GPU-b7d3e4f5-6666-7777-8888-9999aaaabbbb"


@dataclass
class FakeGpu:
    name: str | bytes
    uuid: str | bytes
    memory_bytes: int
    capability: tuple[int, int]


A100 = FakeGpu("NVIDIA A100-SXM4-80GB", A100_UUID, 80 * 2**30, (8, 0))
H100 = FakeGpu("NVIDIA H100 80GB HBM3", H100_UUID, 79 * 2**30, (9, 0))


class FakeNVMLError(Exception):
    """nvidia-ml-py's NVMLError: built from an NVML return code, kept as `.value`."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_pynvml(gpus: list[FakeGpu], *, fail_init: bool = False, lost_index: int | None = None) -> types.ModuleType:
    """A stand-in for the `pynvml` module of nvidia-ml-py; handles are device indices."""
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    module.calls = []  # type: ignore[attr-defined]

    def nvmlInit() -> None:
        module.calls.append("init")
        if fail_init:
            raise FakeNVMLError(NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown() -> None:
        module.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(index: int) -> int:
        if index == lost_index:
            raise FakeNVMLError(NVML_ERROR_GPU_IS_LOST)
        return index

    module.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    module.nvmlShutdown = nvmlShutdown  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: "560.35.03"  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda handle: gpus[handle].name  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda handle: gpus[handle].uuid  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=gpus[handle].memory_bytes, free=gpus[handle].memory_bytes, used=0
    )
    module.nvmlDeviceGetCudaComputeCapability = lambda handle: gpus[handle].capability  # type: ignore[attr-defined]
    return module


@pytest.fixture
def install_nvml(monkeypatch: pytest.MonkeyPatch):
    """Put a fake pynvml in sys.modules, with a CUDA build of torch and no CUDA_VISIBLE_DEVICES."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")

    def install(gpus: list[FakeGpu], **kwargs: object) -> types.ModuleType:
        module = fake_pynvml(gpus, **kwargs)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


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


def test_probe_decodes_bytes_from_older_nvml(install_nvml) -> None:
    install_nvml([FakeGpu(b"Tesla V100-SXM2-32GB", b"GPU-0123", 32 * 2**30, (7, 0))])
    gpu = hardware.probe("auto").gpus[0]
    assert (gpu.name, gpu.uuid) == ("Tesla V100-SXM2-32GB", "GPU-0123")


@pytest.mark.parametrize(
    ("visible", "expected_uuids"),
    [
        ("1", [H100_UUID]),
        ("1,0", [H100_UUID, A100_UUID]),
        ("GPU-b7d3", [H100_UUID]),
        ("8a9f1c2e", [A100_UUID]),
        ("0,7,1", [A100_UUID]),
        ("0,GPU-ffff,1", [A100_UUID]),
        ("", []),
    ],
    ids=[
        "index",
        "reordered",
        "uuid-prefix",
        "uuid-prefix-without-GPU-",
        "invalid-index-truncates",
        "invalid-uuid-truncates",
        "empty-hides-all",
    ],
)
def test_cuda_visible_devices_filters_like_cuda(install_nvml, monkeypatch, visible, expected_uuids) -> None:
    install_nvml([A100, H100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    probed = hardware.probe("auto")
    assert [gpu.uuid for gpu in probed.gpus] == expected_uuids
    assert probed.device_type == ("cuda" if expected_uuids else "cpu")


def test_nvml_error_at_init_means_cpu(install_nvml) -> None:
    nvml = install_nvml([A100], fail_init=True)
    probed = hardware.probe("auto")
    assert probed.device_type == "cpu"
    assert probed.gpus == ()
    assert probed.driver_version is None
    assert "shutdown" not in nvml.calls  # nothing to shut down after a failed init


def test_nvml_error_while_listing_means_cpu_with_warning(install_nvml, caplog) -> None:
    nvml = install_nvml([A100, H100], lost_index=1)
    with caplog.at_level(logging.WARNING, logger="autotune.hardware"):
        probed = hardware.probe("auto")
    assert probed.device_type == "cpu"
    assert probed.gpus == ()
    assert any("NVML failed" in record.getMessage() for record in caplog.records)
    assert nvml.calls == ["init", "shutdown"]


def test_missing_nvml_module_means_cpu(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert hardware.probe("auto").device_type == "cpu"


@pytest.mark.parametrize(
    ("gpus", "torch_cuda", "message"),
    [([], "12.4", "no usable NVIDIA GPU"), ([A100], None, "CPU-only build")],
    ids=["no-gpu", "cpu-torch"],
)
def test_probe_cuda_without_usable_gpu_is_a_user_error(install_nvml, monkeypatch, gpus, torch_cuda, message) -> None:
    install_nvml(gpus)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    with pytest.raises(UserError, match=message) as raised:
        hardware.probe("cuda")
    assert "\n" not in str(raised.value)


def test_auto_with_cpu_only_torch_is_cpu(install_nvml, monkeypatch) -> None:
    install_nvml([A100])
    monkeypatch.setattr(torch.version, "cuda", None)
    assert hardware.probe("auto").device_type == "cpu"


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
        (make_cuda(capability=(8, 0)), ("fp32", "tf32", "fp16", "bf16")),
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
