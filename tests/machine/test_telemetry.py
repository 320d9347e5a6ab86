"""NVML telemetry at its boundary, with a fake pynvml: real numbers when NVML answers, None when it cannot."""

from __future__ import annotations

import types

import pytest

from autotune.machine.telemetry import GpuTelemetry, nvml_uuid


class _NVMLError(Exception):
    pass


def _fake_nvml(*, init_fails=False, power_supported=True, known_uuid=b"GPU-1234"):
    calls = {"shutdown": 0}
    readings = iter(range(10, 10_000, 10))

    def handle_by_uuid(uuid):
        if uuid != known_uuid:
            raise _NVMLError("Not Found")
        return "handle"

    def init():
        if init_fails:
            raise _NVMLError("Driver Not Loaded")

    def power(handle):
        if not power_supported:
            raise _NVMLError("Not Supported")
        return 250_000  # milliwatts

    def shutdown():
        calls["shutdown"] += 1

    module = types.SimpleNamespace(
        NVMLError=_NVMLError,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetHandleByUUID=handle_by_uuid,
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=next(readings) % 100),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=2**30),
        nvmlDeviceGetPowerUsage=power,
    )
    return module, calls


def test_samples_utilisation_memory_and_power():
    nvml, calls = _fake_nvml()
    telemetry = GpuTelemetry("GPU-1234", interval_s=0.01, nvml=nvml)
    telemetry.start()
    telemetry.sample()
    summary = telemetry.stop()
    assert 0 < summary["gpu_utilization_percent"] < 100
    assert summary["gpu_memory_used_bytes"] == 2**30
    assert summary["gpu_power_watts"] == 250.0
    assert calls["shutdown"] == 1


def test_unsupported_metric_is_none_and_others_still_count():
    nvml, _ = _fake_nvml(power_supported=False)
    telemetry = GpuTelemetry("GPU-1234", interval_s=0.01, nvml=nvml)
    telemetry.start()
    summary = telemetry.stop()
    assert summary["gpu_power_watts"] is None and summary["gpu_memory_used_bytes"] == 2**30


@pytest.mark.parametrize(
    ("kwargs", "uuid", "reason"),
    [({"init_fails": True}, "GPU-1234", "Driver Not Loaded"), ({}, "GPU-other", "Not Found")],
    ids=["no-driver", "unknown-gpu"],
)
def test_nvml_failures_give_null_fields_never_a_crash(kwargs, uuid, reason):
    nvml, _ = _fake_nvml(**kwargs)
    telemetry = GpuTelemetry(uuid, nvml=nvml)
    telemetry.start()
    assert telemetry.stop() == {"gpu_utilization_percent": None, "gpu_memory_used_bytes": None, "gpu_power_watts": None}
    assert reason in telemetry.unavailable_reason


def test_open_does_nvmls_start_up_before_the_window_and_shuts_it_down_once():
    nvml, calls = _fake_nvml()
    opened = []
    nvml.nvmlInit = lambda: opened.append("init")
    telemetry = GpuTelemetry("GPU-1234", interval_s=0.01, nvml=nvml)
    telemetry.open()
    assert opened == ["init"] and telemetry._thread is None  # nothing samples before the window
    telemetry.start()
    assert opened == ["init"] and telemetry._thread is not None  # the window's edge only starts a thread
    first = telemetry.stop()
    assert telemetry.stop() == first and calls["shutdown"] == 1


def test_a_gpu_nvml_cannot_find_still_shuts_nvml_down():
    nvml, calls = _fake_nvml()
    telemetry = GpuTelemetry("GPU-other", nvml=nvml)
    telemetry.open()
    assert calls["shutdown"] == 1 and "Not Found" in telemetry.unavailable_reason
    telemetry.start()
    telemetry.stop()
    assert calls["shutdown"] == 1


def test_missing_pynvml_module(monkeypatch):
    monkeypatch.setattr("autotune.machine.telemetry._import_nvml", lambda: None)
    telemetry = GpuTelemetry("GPU-1234")
    telemetry.start()
    assert telemetry.stop()["gpu_utilization_percent"] is None
    assert "not installed" in telemetry.unavailable_reason


@pytest.mark.parametrize(
    ("given", "expected"),
    [("1234-abcd", "GPU-1234-abcd"), ("GPU-1234-abcd", "GPU-1234-abcd"), ("MIG-5678", "MIG-5678")],
)
def test_nvml_uuid_spelling(given, expected):
    assert nvml_uuid(given) == expected


def test_a_bare_uuid_of_a_mig_slice_is_found_by_its_mig_spelling():
    nvml, calls = _fake_nvml(known_uuid=b"MIG-5678")
    telemetry = GpuTelemetry(nvml_uuid("5678"), interval_s=0.01, nvml=nvml)  # torch prints no prefix
    telemetry.start()
    fields = telemetry.stop()
    assert telemetry.uuid == "MIG-5678" and telemetry.unavailable_reason is None
    assert fields["gpu_memory_used_bytes"] == 2**30 and calls["shutdown"] == 1
