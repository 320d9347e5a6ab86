"""The torch build against the GPUs NVML reports: kernels, driver, CUDA_VISIBLE_DEVICES, TF32 defaults, bf16, NCCL."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autotune.doctor import Verdict
from autotune.doctor.torch_checks import cudnn_version_text, split_message, tf32_defaults
from tests.doctor.conftest import one
from tests.fixtures.fake_nvml import A100, H100, SLICE_1G, SLICE_3G, FakeGpu, in_mig_mode

V100 = FakeGpu("Tesla V100-SXM2-32GB", "GPU-00000000-0000-0000-0000-000000000070", 32 * 2**30, (7, 0))


@pytest.mark.parametrize(("code", "text"), [(92400, "9.24.0"), (90100, "9.1.0"), (8902, "8.9.2"), (None, None)])
def test_cudnn_versions_read_as_cudnn_prints_them(code, text) -> None:
    assert cudnn_version_text(code) == text


def test_a_user_error_splits_into_what_and_how() -> None:
    assert split_message("x is wrong; a; do y") == ("x is wrong; a", "do y")
    assert split_message("nothing to split") == ("nothing to split", "")


def test_this_machine_torch_build_is_described_without_initialising_cuda(no_nvml) -> None:
    found = one("torch.build")
    assert found.verdict is Verdict.OK
    assert found.value.startswith(f"torch {torch.__version__}")
    assert found.data["cuda"] == torch.version.cuda
    assert not torch.cuda.is_initialized()


def test_gpus_without_kernels_in_this_build_fail(install_nvml, monkeypatch) -> None:
    install_nvml([V100])
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: "sm_80 sm_90", raising=False)
    found = one("torch.build")
    assert found.verdict is Verdict.FAIL
    assert "compute capability 7.0" in found.value and "sm_70" in found.fix


def test_a_cpu_only_torch_beside_gpus_fails(install_nvml, monkeypatch) -> None:
    install_nvml([A100])
    monkeypatch.setattr(torch.version, "cuda", None)
    found = one("torch.build")
    assert found.verdict is Verdict.FAIL
    assert "(CPU-only build), but NVML sees 1 GPU(s)" in found.value


@pytest.mark.parametrize(
    ("driver_cuda", "verdict", "words"),
    [
        (13000, Verdict.OK, "for CUDA up to 13.0"),
        (12020, Verdict.WARN, "older than"),
        (11080, Verdict.FAIL, "no kernel"),
    ],
    ids=["newer", "older-minor", "older-major"],
)
def test_the_driver_must_be_as_new_as_torchs_cuda(install_nvml, driver_cuda, verdict, words) -> None:
    install_nvml([A100], cuda_driver_version=driver_cuda)  # torch.version.cuda is 12.4 here
    found = one("driver")
    assert (found.verdict, found.data["driver"]) == (verdict, "560.35.03")
    assert words in found.value


def test_no_driver_is_a_cpu_machine(no_nvml) -> None:
    found = one("driver")
    assert found.verdict is Verdict.INFO
    assert "Driver Not Loaded" in found.value


@pytest.mark.parametrize(
    ("gpus", "visible", "order", "verdict", "words"),
    [
        ([A100, H100], None, "PCI_BUS_ID", Verdict.OK, "unset: CUDA sees 2 of 2 GPU(s)"),
        ([A100, H100], "1", "PCI_BUS_ID", Verdict.OK, f"CUDA sees 1 of 2 GPU(s): {H100.name}"),
        ([A100, H100], "-1", None, Verdict.WARN, "hides all 2 GPU(s)"),
        ([A100, H100], "0,7", "PCI_BUS_ID", Verdict.WARN, "CUDA stops at GPU 7"),
        ([A100, H100], "1,0", None, Verdict.WARN, "CUDA_DEVICE_ORDER is not PCI_BUS_ID"),
        ([A100], "1gpu", None, Verdict.FAIL, "is not a GPU index"),
        ([in_mig_mode(SLICE_1G, SLICE_3G)], None, None, Verdict.FAIL, "is in MIG mode with 2 MIG device(s)"),
        ([in_mig_mode(SLICE_1G, SLICE_3G)], SLICE_1G.uuid, None, Verdict.OK, "MIG 1g.10gb"),
    ],
    ids=["unset", "one-of-two", "hidden", "stops-early", "mixed-order", "misread", "mig-ambiguous", "mig-slice"],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(install_nvml, monkeypatch, gpus, visible, order, verdict, words):
    install_nvml(gpus)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if order is not None:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    found = one("cuda.visible_devices")
    assert found.verdict is verdict, found
    assert words in found.value
    if verdict is not Verdict.OK:
        assert found.fix


def test_tf32_defaults_are_this_torchs_own() -> None:
    state = tf32_defaults()
    assert state["legacy_matmul_allow_tf32"] is False  # torch's default since 1.12
    assert state["legacy_cudnn_allow_tf32"] is True
    assert state["float32_matmul_precision"] == "highest"
    if "fp32_precision" in state:  # torch >= 2.9's per-backend settings
        assert state["fp32_precision"]["cuda.matmul"] == "none"
        assert state["fp32_precision"]["cudnn.conv"] == "tf32"


def test_tf32_on_an_ampere_gpu_says_what_recipes_get(install_nvml) -> None:
    install_nvml([A100])
    found = one("tf32")
    assert found.verdict is Verdict.INFO
    assert "matmuls in IEEE fp32, cuDNN convolutions in TF32" in found.value
    assert "autotune run" in found.fix


def test_nvidia_tf32_override_is_a_warning(install_nvml, monkeypatch) -> None:
    install_nvml([A100])
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    found = one("tf32")
    assert found.verdict is Verdict.WARN
    assert "NVIDIA_TF32_OVERRIDE" in found.fix


def test_bf16_on_gpus_follows_compute_capability(install_nvml) -> None:
    install_nvml([V100])
    assert one("bf16").verdict is Verdict.INFO
    install_nvml([H100])
    assert one("bf16").verdict is Verdict.OK


def test_bf16_on_a_cpu_reads_its_flags(no_nvml, monkeypatch) -> None:
    from autotune.doctor import torch_checks

    monkeypatch.setattr(torch_checks, "_cpu_flags", lambda: {"avx2", "amx_bf16"})
    assert one("bf16").data == {"supported": True, "cpu_flags": ["amx_bf16"]}
    monkeypatch.setattr(torch_checks, "_cpu_flags", lambda: {"avx2"})
    assert one("bf16").verdict is Verdict.INFO


def test_several_gpus_without_nccl_fail(install_nvml, monkeypatch) -> None:
    install_nvml([H100, replace(H100, uuid="GPU-2")])
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    found = one("distributed")
    assert found.verdict is Verdict.FAIL
    assert "--devices 1" in found.fix


def test_cudnn_version_text_matches_the_installed_cudnn_wheel() -> None:
    import importlib.metadata

    wheels = [name for name in ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12") if _installed(name)]
    if not wheels or not torch.backends.cudnn.version():
        pytest.skip("no cuDNN wheel beside this torch")
    wheel_version = importlib.metadata.version(wheels[0])
    assert wheel_version.startswith(cudnn_version_text(torch.backends.cudnn.version()) + ".")


def _installed(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
