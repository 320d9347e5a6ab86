"""Each GPU's health through the fake NVML: every reading's verdict, and NVML's refusals reported, never raised."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.doctor import DoctorRequest, Verdict
from tests.doctor.conftest import finding, run_checks
from tests.fixtures.fake_nvml import (
    A100,
    H100,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    SLICE_1G,
    SLICE_3G,
    in_mig_mode,
    nvmlClocksEventReasonHwSlowdown,
    nvmlClocksEventReasonSwPowerCap,
    nvmlClocksEventReasonSwThermalSlowdown,
)

GIB = 2**30


def _gpu_findings(install_nvml, gpu, name: str):
    install_nvml([gpu])
    return finding(run_checks(DoctorRequest(), [name]), f"gpu0.{name}")


def test_a_healthy_idle_gpu_passes_every_check(install_nvml) -> None:
    install_nvml([H100])
    report = run_checks(DoctorRequest(), ["load", "mig", "ecc", "persistence", "clocks", "pcie", "power"])
    assert {f.name: f.verdict for f in report.findings} == {
        f"gpu0.{name}": Verdict.OK for name in ("load", "mig", "ecc", "persistence", "clocks", "pcie", "power")
    }
    load = finding(report, "gpu0.load")
    assert load.value.startswith("NVIDIA H100 80GB HBM3, compute 9.0, 79.0 GiB")
    assert finding(report, "gpu0.clocks").data["reasons"] == ["idle"]
    assert finding(report, "gpu0.power").data == {"limit_watts": 700.0, "default_watts": 700.0}


@pytest.mark.parametrize(
    ("changes", "check", "verdict", "words"),
    [
        ({"utilization_percent": 97, "processes": ((4242, 30 * GIB),)}, "load", Verdict.WARN, "other work shares"),
        ({"memory_used_bytes": 20 * GIB}, "load", Verdict.WARN, "20.0 GiB used"),
        ({"ecc_uncorrected_volatile": 3}, "ecc", Verdict.FAIL, "3 uncorrectable error(s)"),
        ({"remapped_rows": (0, 1, 1, 0)}, "ecc", Verdict.WARN, "rows wait to be remapped"),
        ({"remapped_rows": (0, 1, 0, 1)}, "ecc", Verdict.FAIL, "row remapping failed"),
        ({"ecc": (1, 0)}, "ecc", Verdict.INFO, "off after the next reboot"),
        ({"persistence": 0}, "persistence", Verdict.WARN, "persistence mode off"),
        ({"clock_reasons": nvmlClocksEventReasonHwSlowdown}, "clocks", Verdict.FAIL, "hardware slowdown"),
        ({"clock_reasons": nvmlClocksEventReasonSwPowerCap}, "clocks", Verdict.WARN, "software power cap"),
        (
            {"clock_reasons": nvmlClocksEventReasonSwThermalSlowdown | nvmlClocksEventReasonSwPowerCap},
            "clocks",
            Verdict.WARN,
            "software power cap, software thermal slowdown",
        ),
        ({"pcie": (4, 5, 8, 16)}, "pcie", Verdict.WARN, "fewer lanes"),
        ({"pcie": (1, 5, 16, 16)}, "pcie", Verdict.INFO, "below its top speed"),
        ({"power_limit_mw": (400_000, 700_000)}, "power", Verdict.WARN, "capped below the default"),
    ],
    ids=[
        "busy",
        "memory-taken",
        "uncorrectable-ecc",
        "remap-pending",
        "remap-failed",
        "ecc-change-pending",
        "no-persistence",
        "hw-slowdown",
        "power-cap",
        "two-reasons",
        "narrow-link",
        "idle-link",
        "power-capped",
    ],
)
def test_each_problem_gets_its_verdict_and_a_fix(install_nvml, changes, check, verdict, words) -> None:
    found = _gpu_findings(install_nvml, replace(H100, **changes), check)
    assert found.verdict is verdict
    assert words in found.value
    if verdict in (Verdict.WARN, Verdict.FAIL):
        assert found.fix and "\n" not in found.fix


@pytest.mark.parametrize("check", ["ecc", "persistence", "clocks", "pcie", "power"])
def test_a_reading_nvml_does_not_support_is_unknown_with_the_reason(install_nvml, check) -> None:
    consumer = replace(
        H100, ecc=None, persistence=None, sm_clock_mhz=None, pcie=None, power_limit_mw=None, name="NVIDIA RTX"
    )
    found = _gpu_findings(install_nvml, consumer, check)
    assert found.verdict is Verdict.INFO
    assert found.value.endswith("unknown (NVML: Not Supported)")


def test_a_reading_nvml_refuses_is_unknown_with_the_reason(install_nvml) -> None:
    found = _gpu_findings(
        install_nvml, replace(H100, failures={"nvmlDeviceGetEccMode": NVML_ERROR_NO_PERMISSION}), "ecc"
    )
    assert (found.verdict, found.value) == (Verdict.INFO, "ECC unknown (NVML: Insufficient Permissions)")


def test_throttle_reasons_under_their_old_name_are_read(install_nvml, monkeypatch) -> None:
    nvml = install_nvml([replace(H100, clock_reasons=nvmlClocksEventReasonHwSlowdown)])
    old_name = nvml.nvmlDeviceGetCurrentClocksEventReasons
    monkeypatch.setattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", old_name, raising=False)
    monkeypatch.delattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")  # nvidia-ml-py before 12.535
    assert finding(run_checks(DoctorRequest(), ["clocks"]), "gpu0.clocks").verdict is Verdict.FAIL


def test_a_gpu_lost_mid_check_is_a_reading_not_a_crash(install_nvml) -> None:
    lost = replace(H100, failures={"nvmlDeviceGetClockInfo": NVML_ERROR_GPU_IS_LOST})
    found = _gpu_findings(install_nvml, lost, "clocks")
    assert (found.verdict, found.value) == (Verdict.INFO, "clocks unknown (NVML: GPU is lost)")


def test_only_the_gpus_cuda_will_see_are_examined(install_nvml, monkeypatch) -> None:
    install_nvml([A100, H100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    report = run_checks(DoctorRequest(), ["load"])
    assert [(f.name, f.data["name"]) for f in report.findings] == [("gpu1.load", H100.name)]


def test_mig_slices_are_listed(install_nvml, monkeypatch) -> None:
    install_nvml([in_mig_mode(SLICE_1G, None, SLICE_3G)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", SLICE_3G.uuid)
    found = finding(run_checks(DoctorRequest(), ["mig"]), "gpu0.mig")
    assert found.verdict is Verdict.INFO
    assert "2 slice(s) (1g.10gb, 3g.40gb)" in found.value
    assert "MIG-<uuid>" in found.fix


def test_mig_without_a_usable_slice_fails(install_nvml) -> None:
    install_nvml([in_mig_mode(None, None)])
    found = finding(run_checks(DoctorRequest(), ["mig"]), "gpu0.mig")
    assert found.verdict is Verdict.FAIL
    assert "nvidia-smi mig" in found.fix


def test_the_report_closes_the_nvml_session_it_opened(install_nvml) -> None:
    nvml = install_nvml([H100])
    run_checks(DoctorRequest(), ["load"])
    assert nvml.calls.count("init") == nvml.calls.count("shutdown") > 0


def test_throttle_reason_bits_are_nvidia_ml_pys() -> None:
    """The bits named in THROTTLE_REASONS are nvidia-ml-py's nvmlClocksEventReason* constants (nvml.h)."""
    import re

    real = pytest.importorskip("pynvml")
    from autotune.doctor.gpu_checks import THROTTLE_REASONS

    by_value = {
        getattr(real, name): name
        for name in dir(real)
        if name.startswith("nvmlClocksEventReason") and not name.endswith(("All", "None", "UserDefinedClocks"))
    }
    for bit, (words, _) in THROTTLE_REASONS.items():
        spelled = re.sub(r"(?<!^)(?=[A-Z])", " ", by_value[bit].removeprefix("nvmlClocksEventReason")).lower()
        assert spelled.replace("hw", "hardware").replace("sw", "software").replace("gpu ", "") == words, bit


def test_every_nvml_function_the_doctor_and_the_fake_use_is_nvidia_ml_pys() -> None:
    """A misspelt NVML call would read as 'not supported' forever: the names must be the real library's."""
    import inspect
    import re

    real = pytest.importorskip("pynvml")
    from autotune.doctor import context, gpu_checks, host_checks, torch_checks
    from tests.fixtures import fake_nvml

    used = set()
    for module in (context, gpu_checks, host_checks, torch_checks, fake_nvml):
        used |= set(re.findall(r"\bnvml[A-Z]\w+", inspect.getsource(module)))
    used = {name for name in used if not name.startswith("nvmlClocksEventReason")}
    assert used and not {name for name in used if not hasattr(real, name)}
