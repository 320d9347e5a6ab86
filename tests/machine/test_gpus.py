"""Which GPUs the trials will see (autotune/machine/gpus.py) through a fake NVML: CUDA_VISIBLE_DEVICES as CUDA reads it,
MIG slices, and the torch build's architectures."""

from __future__ import annotations

import logging

import pytest
import torch

from autotune.machine import gpus, hardware
from autotune.machine.gpus import GpuInfo
from autotune.machine.hardware import Hardware
from tests.conftest import make_cuda
from tests.fixtures.fake_nvml import (
    A100,
    A100_UUID,
    H100,
    H100_UUID,
    NVML_ERROR_GPU_IS_LOST,
    SLICE_1G,
    SLICE_3G,
    FakeGpu,
    FakeNVMLError,
    in_mig_mode,
    probe_error,
)


def _probe_two_gpus_with(visible: str, install_nvml, monkeypatch, caplog) -> Hardware:
    """probe("auto") on an A100 and an H100 in PCI order, under this CUDA_VISIBLE_DEVICES, its warnings captured."""
    install_nvml([A100, H100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    with caplog.at_level(logging.WARNING, logger="autotune.machine.gpus"):
        return hardware.probe("auto")


@pytest.mark.parametrize(
    ("visible", "expected_uuids"),
    [
        ("1", [H100_UUID]),
        ("1,0", [H100_UUID, A100_UUID]),
        (" 1 , 0", [H100_UUID, A100_UUID]),
        ("0,1,", [A100_UUID, H100_UUID]),
        ("GPU-b7d3", [H100_UUID]),
        (f"{A100_UUID},GPU-b7", [A100_UUID, H100_UUID]),
        ("", []),
        ("-1", []),
        ("0,-1,1", [A100_UUID]),
    ],
    ids=[
        "index",
        "reordered",
        "spaces-around-indices",
        "trailing-comma",
        "uuid-prefix",
        "full-uuid-then-prefix",
        "empty-hides-all",
        "minus-one-hides-all",
        "negative-ends-the-list",
    ],
)
def test_cuda_visible_devices_filters_like_cuda(install_nvml, monkeypatch, caplog, visible, expected_uuids) -> None:
    probed = _probe_two_gpus_with(visible, install_nvml, monkeypatch, caplog)
    assert [gpu.uuid for gpu in probed.gpus] == expected_uuids
    assert probed.device_type == ("cuda" if expected_uuids else "cpu")
    assert not caplog.records  # nothing dropped that CUDA_VISIBLE_DEVICES named


@pytest.mark.parametrize(
    ("visible", "expected_uuids", "words"),
    [
        ("0,7,1", [A100_UUID], "CUDA stops at GPU 7, but NVML lists 2 GPU(s)"),
        ("0,GPU-b7d3,1", [A100_UUID], "CUDA stops at 'GPU-b7d3', which is not a GPU index"),
        ("GPU-8a9f,GPU-ffff,GPU-b7d3", [A100_UUID], "CUDA stops at GPU-ffff, which begins none of the UUIDs"),
        ("GPU-8a9f,1", [A100_UUID], "CUDA stops at '1', which lacks the GPU- prefix of the first entry"),
    ],
    ids=["index-out-of-range", "uuid-after-index", "unknown-uuid", "index-after-uuid"],
)
def test_cuda_stopping_early_keeps_what_cuda_sees_and_warns(
    install_nvml, monkeypatch, caplog, visible, expected_uuids, words
) -> None:
    probed = _probe_two_gpus_with(visible, install_nvml, monkeypatch, caplog)
    assert [gpu.uuid for gpu in probed.gpus] == expected_uuids
    assert any(words in record.getMessage() for record in caplog.records), caplog.text


AMBIGUOUS = [
    FakeGpu("NVIDIA L4", "GPU-aaaa1111-0000-0000-0000-000000000000", 22 * 2**30, (8, 9)),
    FakeGpu("NVIDIA L4", "GPU-aaaa2222-0000-0000-0000-000000000000", 22 * 2**30, (8, 9)),
]


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize(
    ("visible", "words"),
    [
        ("8a9f1c2e", "'8a9f1c2e' is not a GPU index, yet CUDA would read it as GPU 8"),
        ("1gpu2", "'1gpu2' is not a GPU index, yet CUDA would read it as GPU 1"),
        ("b7d3e4f5", "no GPU: CUDA stops at 'b7d3e4f5', which is neither a GPU index nor a GPU-/MIG- UUID"),
        ("0,0", "no GPU: GPU 0 is listed twice"),
        ("GPU-aaaa1,GPU-aaaa1", "no GPU: GPU-aaaa1 is listed twice"),
        ("GPU-aaaa1,GPU-aaaa11", "no GPU: GPU-aaaa11 names a device listed before it"),
        ("GPU-aaaa", "no GPU: CUDA stops at GPU-aaaa, which begins 2 of the UUIDs NVML lists"),
        ("5", "no GPU: CUDA stops at GPU 5, but NVML lists 2 GPU(s)"),
    ],
    ids=[
        "unprefixed-uuid",
        "index-with-junk",
        "unprefixed-uuid-letter",
        "repeated-index",
        "repeated-uuid",
        "two-prefixes-one-gpu",
        "ambiguous-prefix",
        "no-such-index",
    ],
)
def test_cuda_visible_devices_that_name_no_gpu_or_another_are_one_line_errors(
    install_nvml, monkeypatch, device, visible, words
) -> None:
    install_nvml(AMBIGUOUS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert words in probe_error(device)


def test_an_unambiguous_prefix_picks_its_gpu(install_nvml, monkeypatch) -> None:
    install_nvml(AMBIGUOUS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa2")
    assert [gpu.uuid for gpu in hardware.probe("cuda").gpus] == [AMBIGUOUS[1].uuid]


def test_device_cpu_ignores_cuda_visible_devices(install_nvml, monkeypatch) -> None:
    install_nvml([A100, H100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    assert hardware.probe("cpu").device_type == "cpu"


def test_without_gpus_a_bad_cuda_visible_devices_does_not_matter_to_auto(install_nvml, monkeypatch) -> None:
    install_nvml([A100], fail_init=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8a9f1c2e")
    assert hardware.probe("auto").device_type == "cpu"


@pytest.mark.parametrize(
    ("gpus", "visible", "order", "warned"),
    [
        ([A100, H100], None, None, True),
        ([A100, H100], "1", None, True),
        ([A100, H100], "1", "FASTEST_FIRST", True),
        ([A100, H100], "1", "PCI_BUS_ID", False),
        ([A100, H100], "GPU-b7d3", None, False),
        ([A100, A100], "1", None, False),
    ],
    ids=["mixed-all", "mixed-index", "mixed-fastest-first", "mixed-pci-order", "mixed-by-uuid", "same-model"],
)
def test_index_order_warning_on_mixed_models(install_nvml, monkeypatch, caplog, gpus, visible, order, warned) -> None:
    install_nvml(gpus)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if order is not None:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    with caplog.at_level(logging.WARNING, logger="autotune.machine.gpus"):
        hardware.probe("auto")
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in record.getMessage() for record in caplog.records) == warned


def test_mig_device_by_uuid_is_described_as_the_slice(install_nvml, monkeypatch) -> None:
    install_nvml([H100, in_mig_mode(SLICE_1G, None, SLICE_3G)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(SLICE_3G.uuid))
    probed = hardware.probe("auto")
    assert probed.device_type == "cuda"
    assert probed.gpus == (
        GpuInfo(name=SLICE_3G.name, uuid=SLICE_3G.uuid, memory_bytes=39 * 2**30, compute_capability=(8, 0)),
    )
    assert probed.device_count == 1
    assert probed.describe().startswith("1x NVIDIA A100-SXM4-80GB MIG 3g.40gb (39.0 GiB)")
    assert probed.fingerprint() != make_cuda().fingerprint()


def test_mig_uuid_prefix_and_parent_name_without_mig(install_nvml, monkeypatch) -> None:
    bare = FakeGpu("NVIDIA A100-SXM4-80GB", "MIG-0d15ea5e-0000-0000-0000-000000000000", 19 * 2**30, (0, 0))
    install_nvml([in_mig_mode(bare)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-0d15")
    (gpu,) = hardware.probe("cuda").gpus
    assert (gpu.name, gpu.memory_bytes) == ("NVIDIA A100-SXM4-80GB MIG", 19 * 2**30)


def test_the_only_mig_device_of_the_only_gpu_is_used_without_cuda_visible_devices(install_nvml) -> None:
    install_nvml([in_mig_mode(None, SLICE_1G, None)])  # a container given one slice: NVML shows its parent
    assert [gpu.uuid for gpu in hardware.probe("auto").gpus] == [SLICE_1G.uuid]


def test_a_gpu_without_mig_beside_one_in_mig_mode_can_be_chosen(install_nvml, monkeypatch) -> None:
    install_nvml([in_mig_mode(SLICE_1G, SLICE_3G), H100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [gpu.uuid for gpu in hardware.probe("cuda").gpus] == [H100_UUID]


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize(
    ("gpus", "visible", "words"),
    [
        ([in_mig_mode(SLICE_1G, SLICE_3G)], f"{SLICE_1G.uuid},{SLICE_3G.uuid}", "names 2 MIG devices"),
        ([in_mig_mode(SLICE_1G)], "MIG-deadbeef", "no GPU: CUDA stops at MIG-deadbeef, which begins none of the"),
        ([A100], "MIG-deadbeef", "no GPU: CUDA stops at MIG-deadbeef"),
        ([in_mig_mode(SLICE_1G)], f"MIG-{A100_UUID}/1/0", "MIG naming of drivers before R470"),
        ([in_mig_mode(SLICE_1G, SLICE_3G)], None, "is in MIG mode with 2 MIG device(s)"),
        ([in_mig_mode(SLICE_1G, SLICE_3G)], "0", "set CUDA_VISIBLE_DEVICES to one MIG-<uuid>"),
        ([in_mig_mode(SLICE_1G), H100], None, "with 1 MIG device(s) beside 1 other visible GPU(s)"),
        ([in_mig_mode(None, None)], None, "is in MIG mode but has no MIG device this process may use"),
    ],
    ids=[
        "two-mig-devices",
        "unknown-mig-uuid",
        "mig-uuid-but-no-mig",
        "legacy-mig-name",
        "mig-gpu-with-two-slices",
        "mig-gpu-by-index",
        "mig-gpu-beside-another",
        "mig-gpu-without-slices",
    ],
)
def test_mig_that_is_not_exactly_one_mig_device_is_a_one_line_error(
    install_nvml, monkeypatch, device, gpus, visible, words
) -> None:
    install_nvml(gpus)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert words in probe_error(device)


def test_a_gpu_with_mig_off_is_the_whole_gpu(install_nvml) -> None:
    off = FakeGpu(A100.name, A100_UUID, A100.memory_bytes, (8, 0), mig_mode=0, mig=(SLICE_1G,))
    install_nvml([off])
    assert [gpu.uuid for gpu in hardware.probe("auto").gpus] == [A100_UUID]


def test_a_failing_mig_query_is_an_nvml_failure(install_nvml, monkeypatch, caplog) -> None:
    nvml = install_nvml([in_mig_mode(SLICE_1G)])

    def lost(handle: int) -> list[int]:
        raise FakeNVMLError(NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(nvml, "nvmlDeviceGetMigMode", lost)
    with caplog.at_level(logging.WARNING, logger="autotune.machine.gpus"):
        assert hardware.probe("auto").device_type == "cpu"
    assert "NVML failed while listing GPUs: GPU is lost" in probe_error("cuda")


def test_nvml_without_mig_functions_means_no_mig(install_nvml, monkeypatch) -> None:
    nvml = install_nvml([A100])
    monkeypatch.delattr(nvml, "nvmlDeviceGetMigMode")  # an nvidia-ml-py from before MIG
    assert [gpu.uuid for gpu in hardware.probe("auto").gpus] == [A100_UUID]


@pytest.mark.parametrize(
    ("capability", "arch_flags", "runs"),
    [
        ((7, 0), "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", False),
        ((8, 9), "sm_80 sm_86", True),
        ((8, 0), "sm_86 sm_90", False),
        ((12, 1), "sm_120", True),
        ((10, 0), "sm_80 sm_90", False),
        ((10, 0), "sm_80 sm_90 compute_90", True),
        ((8, 6), "sm_75 compute_90", False),
        ((9, 0), "sm_90a", True),
        ((10, 0), "sm_90a compute_90a", False),
        ((10, 3), "sm_100f", True),
        ((8, 0), "something_else", True),
    ],
    ids=[
        "sm70-on-sm75-build",
        "sm89-on-sm86",
        "sm80-on-sm86",
        "sm121-on-sm120",
        "sm100-on-sm90",
        "sm100-on-compute90-ptx",
        "sm86-on-compute90-ptx",
        "sm90-on-sm90a",
        "sm100-on-arch-specific-90a",
        "sm103-on-family-100f",
        "unparsed-list",
    ],
)
def test_runs_on_follows_cubin_and_ptx_compatibility(capability, arch_flags, runs) -> None:
    assert gpus._runs_on(capability, arch_flags.split()) is runs


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_a_gpu_the_torch_build_has_no_kernels_for_is_a_one_line_error(install_nvml, monkeypatch, device) -> None:
    install_nvml([FakeGpu("Tesla V100-SXM2-32GB", "GPU-0123", 32 * 2**30, (7, 0))])
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    message = probe_error(device)
    for words in ("Tesla V100-SXM2-32GB", "compute capability 7.0", "sm_75 sm_80 sm_86", "torch build for sm_70"):
        assert words in message


@pytest.mark.parametrize(
    ("capability", "arch_flags"),
    [((8, 9), "sm_75 sm_86"), ((12, 1), "sm_120"), ((10, 0), "sm_80 compute_90"), ((7, 0), ""), ((7, 0), None)],
    ids=["sm89-on-sm86", "sm121-on-sm120", "sm100-on-ptx", "empty-flags", "no-flags"],
)
def test_a_supported_gpu_or_an_unknown_arch_list_passes(install_nvml, monkeypatch, capability, arch_flags) -> None:
    install_nvml([FakeGpu("Some GPU", "GPU-0123", 16 * 2**30, capability)])
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: arch_flags)
    assert hardware.probe("cuda").gpus[0].compute_capability == capability


def test_a_cpu_build_without_arch_flags_skips_the_check(install_nvml, monkeypatch) -> None:
    install_nvml([FakeGpu("Tesla V100-SXM2-32GB", "GPU-0123", 32 * 2**30, (7, 0))])
    monkeypatch.delattr(torch._C, "_cuda_getArchFlags")
    assert hardware.probe("auto").device_type == "cuda"


def test_a_mig_device_is_checked_with_its_parents_capability(install_nvml, monkeypatch) -> None:
    install_nvml([in_mig_mode(SLICE_1G)])
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: "sm_90 sm_100")
    assert "compute capability 8.0" in probe_error("auto")


def test_the_real_arch_flags_are_static() -> None:
    flags = gpus.arch_flags()
    assert all(flag.startswith(("sm_", "compute_")) for flag in flags)
    assert not torch.cuda.is_initialized()
