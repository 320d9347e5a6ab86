"""Host checks: cgroup quota, cpulists, governor, and the environment variables that cost speed or hide hangs."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.doctor import Verdict, host_checks
from autotune.doctor.host_checks import cgroup_cpu_quota, parse_cpulist
from tests.doctor.conftest import one


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
    ids=["v2-quota", "v2-none", "v1-quota", "v1-none", "no-cgroup"],
)
def test_cgroup_quota_is_read_from_v2_or_v1(tmp_path: Path, files, quota) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota


def test_cpulists_parse_as_the_kernel_writes_them() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []


def test_a_quota_below_the_affinity_warns(no_nvml, monkeypatch) -> None:
    monkeypatch.setattr(host_checks, "cgroup_cpu_quota", lambda: 0.5)
    found = one("cpu.cores")
    assert found.verdict is Verdict.WARN
    assert "OMP_NUM_THREADS=1" in found.fix


def test_this_machine_cores_are_reported(no_nvml) -> None:
    import os

    found = one("cpu.cores")
    assert found.data["logical"] == os.cpu_count()
    assert found.data["affinity"] == len(os.sched_getaffinity(0))


def _fake_sys(tmp_path: Path, driver: str, governors: list[str]) -> Path:
    for index, governor in enumerate(governors):
        folder = tmp_path / "devices" / "system" / "cpu" / f"cpu{index}" / "cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_governor").write_text(governor + "\n")
        (folder / "scaling_driver").write_text(driver + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("driver", "governors", "verdict"),
    [
        ("acpi-cpufreq", ["performance", "performance"], Verdict.OK),
        ("acpi-cpufreq", ["powersave", "performance"], Verdict.WARN),
        ("intel_pstate", ["powersave"], Verdict.INFO),
        ("acpi-cpufreq", ["schedutil"], Verdict.INFO),
    ],
    ids=["performance", "pinned-low", "pstate-dynamic", "schedutil"],
)
def test_the_governor_verdict_knows_the_driver(no_nvml, monkeypatch, tmp_path, driver, governors, verdict) -> None:
    monkeypatch.setattr(host_checks, "SYS", _fake_sys(tmp_path, driver, governors))
    assert one("cpu.governor").verdict is verdict


def test_no_cpufreq_is_unknown_not_an_error(no_nvml, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(host_checks, "SYS", tmp_path)
    found = one("cpu.governor")
    assert found.verdict is Verdict.INFO and "not exposed" in found.value
    assert one("cpu.numa").value == "NUMA topology not exposed (a VM or container)"


def test_numa_nodes_are_counted(no_nvml, monkeypatch, tmp_path) -> None:
    for node, cpus in enumerate(["0-1", "2-3"]):
        folder = tmp_path / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    monkeypatch.setattr(host_checks, "SYS", tmp_path)
    monkeypatch.setattr(host_checks.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    found = one("cpu.numa")
    assert found.data["affinity_cpus_per_node"] == {0: 2, 1: 1}


@pytest.fixture
def clean_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith(("NCCL_", "TORCH_", "GLOO_", "CUDA_LAUNCH", "PYTORCH_", "OMP_", "CUBLAS_")):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("variables", "check", "verdict", "fix_words"),
    [
        ({}, "env.distributed", Verdict.OK, ""),
        ({"NCCL_DEBUG": "INFO"}, "env.distributed", Verdict.INFO, "verbose NCCL logs"),
        ({"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"}, "env.distributed", Verdict.WARN, "peer-to-peer off"),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "env.distributed", Verdict.WARN, "never aborted"),
        ({"NCCL_SOCKET_IFNAME": "eth0"}, "env.distributed", Verdict.INFO, "overrides"),
        ({"CUDA_LAUNCH_BLOCKING": "1"}, "env.runtime", Verdict.WARN, "waits for the GPU"),
        ({"CUDA_LAUNCH_BLOCKING": "0"}, "env.runtime", Verdict.INFO, "set"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "env.runtime", Verdict.INFO, "allocator"),
    ],
    ids=["none", "debug", "p2p-off", "no-async-errors", "interface", "launch-blocking", "launch-not-blocking", "alloc"],
)
def test_environment_variables_get_their_verdict(no_nvml, clean_environment, variables, check, verdict, fix_words):
    for name, value in variables.items():
        clean_environment.setenv(name, value)
    found = one(check)
    assert found.verdict is verdict
    assert fix_words in found.fix
    assert found.data["variables"] == variables
