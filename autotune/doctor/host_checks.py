"""Host checks: CPU cores the process may use (affinity, cgroup quota), NUMA nodes, the frequency governor, and
environment variables that change how CUDA, NCCL and gloo behave.

Everything is read from /proc, /sys and the environment; a file that a VM or container does not expose is reported
as unknown, never an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from autotune.doctor.context import DoctorContext, nvml_read
from autotune.doctor.findings import Finding, Verdict
from autotune.doctor.registry import check, info, ok, warn
from autotune.machine.hardware import available_cores, cpu_model

__all__ = ["cgroup_cpu_quota", "parse_cpulist", "ENV_RULES"]

SYS = Path("/sys")


def cgroup_cpu_quota(root: Path = SYS / "fs" / "cgroup") -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 cpu.max, v1 cfs quota), or None without a quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 else None
    except (OSError, ValueError):
        return None


@check("cpu.cores")
def cpu_cores(context: DoctorContext) -> Finding:
    """Cores the machine has, the ones this process may run on, and the cgroup's quota (which os.cpu_count and
    torch ignore: a container allowed 4 CPUs on a 64-core host otherwise sizes its threads and workers for 64)."""
    logical, usable, quota = os.cpu_count() or 1, available_cores(), cgroup_cpu_quota()
    figures = {"model": cpu_model(), "logical": logical, "affinity": usable, "cgroup_quota_cpus": quota}
    value = f"{figures['model']}: {logical} logical CPUs, {usable} in this process's affinity"
    if quota is not None:
        value += f", cgroup quota {quota:g} CPUs"
    if quota is not None and quota < usable:
        return warn(
            f"{value}: threads and DataLoader workers sized for {usable} CPUs would share {quota:g}",
            f"set OMP_NUM_THREADS={max(1, int(quota))} and keep num_workers within {max(1, int(quota))}, or give "
            "the container a cpuset instead of a quota",
            **figures,
        )
    return ok(value, **figures)


def parse_cpulist(text: str) -> list[int]:
    """A kernel cpulist ('0-3,8,10-11') as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus += list(range(int(low), int(high or low) + 1))
    return cpus


@check("cpu.numa")
def cpu_numa(context: DoctorContext) -> Finding:
    """NUMA nodes, the CPUs of this process in each, and the node each GPU hangs off."""
    nodes: dict[int, list[int]] = {}
    for folder in sorted((SYS / "devices" / "system" / "node").glob("node[0-9]*")):
        try:
            nodes[int(folder.name[4:])] = parse_cpulist((folder / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    if not nodes:
        return info("NUMA topology not exposed (a VM or container)")
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    spread = {node: len(mine & set(cpus)) for node, cpus in nodes.items()}
    gpu_nodes = {}
    for gpu in context.nvml.devices:
        node, _ = nvml_read(gpu, "nvmlDeviceGetNumaNodeId")
        if node is not None:
            gpu_nodes[f"gpu{gpu.index}"] = int(node)
    figures = {"nodes": len(nodes), "affinity_cpus_per_node": spread, "gpu_nodes": gpu_nodes}
    value = f"{len(nodes)} NUMA node(s); this process's CPUs per node: " + ", ".join(
        f"node{node}: {count}" for node, count in spread.items()
    )
    if gpu_nodes:
        value += "; " + ", ".join(f"{gpu} on node{node}" for gpu, node in gpu_nodes.items())
    if len(nodes) > 1 and context.nvml.devices:
        return info(value, "pin each training rank to its GPU's node (numactl --cpunodebind=N --membind=N)", **figures)
    return ok(value, **figures)


@check("cpu.governor")
def cpu_governor(context: DoctorContext) -> Finding:
    """The CPU frequency governor: a fixed-low one starves DataLoader workers; a dynamic one adds noise."""
    cpufreq = SYS / "devices" / "system" / "cpu" / "cpu0" / "cpufreq"
    try:
        driver = (cpufreq / "scaling_driver").read_text().strip()
        governors = {
            path.read_text().strip()
            for path in (SYS / "devices" / "system" / "cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")
        }
    except OSError:
        return info("CPU frequency scaling not exposed (a VM or container): the host decides")
    figures = {"driver": driver, "governors": sorted(governors)}
    value = f"governor {', '.join(sorted(governors))} ({driver})"
    # intel_pstate and amd-pstate in active mode run "powersave" as their dynamic governor; acpi-cpufreq pins it low.
    dynamic_powersave = driver in ("intel_pstate", "amd-pstate-epp", "amd-pstate")
    if "powersave" in governors and not dynamic_powersave:
        return warn(
            f"{value}: CPUs held at their lowest frequency",
            "sudo cpupower frequency-set -g performance",
            **figures,
        )
    if governors - {"performance"}:
        return info(
            f"{value}: frequency follows load, which adds noise to measurements",
            "sudo cpupower frequency-set -g performance for steadier timings",
            **figures,
        )
    return ok(value, **figures)


# Environment variables that change speed or stability: (name pattern, value pattern, verdict, what it does / fix).
ENV_RULES: tuple[tuple[str, str, Verdict, str], ...] = (
    ("CUDA_LAUNCH_BLOCKING", r"1|true|yes", Verdict.WARN, "every kernel launch waits for the GPU: unset it"),
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", r"1", Verdict.WARN, "the caching allocator is off: unset it"),
    ("TORCH_USE_CUDA_DSA", r".+", Verdict.INFO, "device-side assertions (a debugging build setting)"),
    ("CUBLAS_WORKSPACE_CONFIG", r".+", Verdict.INFO, "deterministic cuBLAS workspaces (a little slower)"),
    ("PYTORCH_CUDA_ALLOC_CONF", r".+", Verdict.INFO, "caching allocator settings"),
    ("OMP_NUM_THREADS", r".+", Verdict.INFO, "sizes OpenMP's pool before torch starts"),
    (
        "NCCL_P2P_DISABLE",
        r"1",
        Verdict.WARN,
        "GPU peer-to-peer off, all-reduce goes through host memory: unset it unless P2P hangs here",
    ),
    ("NCCL_SHM_DISABLE", r"1", Verdict.WARN, "NCCL's shared-memory transport off: unset it"),
    ("NCCL_IB_DISABLE", r"1", Verdict.INFO, "InfiniBand off: multi-node all-reduce over TCP"),
    ("NCCL_DEBUG", r"(?i)info|trace", Verdict.INFO, "verbose NCCL logs"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", r"0", Verdict.WARN, "a hung collective is never aborted: unset it"),
    ("TORCH_NCCL_BLOCKING_WAIT|NCCL_BLOCKING_WAIT", r"1", Verdict.INFO, "blocking waits on collectives"),
    ("TORCH_DISTRIBUTED_DEBUG", r"(?i)detail", Verdict.WARN, "checks every collective: unset it outside debugging"),
    ("NCCL_.*|TORCH_NCCL_.*|GLOO_.*|TORCH_DISTRIBUTED_.*", r".*", Verdict.INFO, "overrides torch's or NCCL's choice"),
)
_DISTRIBUTED = re.compile(r"NCCL_.*|TORCH_NCCL_.*|GLOO_.*|TORCH_DISTRIBUTED_.*")
_ORDER = [Verdict.OK, Verdict.INFO, Verdict.WARN, Verdict.FAIL]


def _rule(name: str, value: str) -> tuple[Verdict, str] | None:
    for names, values, verdict, why in ENV_RULES:
        if re.fullmatch(names, name):
            return (verdict, why) if re.fullmatch(values, value) else (Verdict.INFO, "set")
    return None


def _environment_finding(distributed: bool) -> Finding:
    matched = {
        name: rule
        for name, value in sorted(os.environ.items())
        if bool(_DISTRIBUTED.fullmatch(name)) == distributed and (rule := _rule(name, value)) is not None
    }
    figures = {name: os.environ[name] for name in matched}
    if not matched:
        return ok("none set", variables={})
    worst = max((verdict for verdict, _ in matched.values()), key=_ORDER.index)
    value = ", ".join(f"{name}={os.environ[name]}" for name in matched)
    fixes = "; ".join(f"{name}: {why}" for name, (verdict, why) in matched.items() if verdict is worst)
    return Finding(name="", value=value, verdict=worst, fix=fixes, data={"variables": figures})


@check("env.distributed")
def env_distributed(context: DoctorContext) -> Finding:
    """NCCL, gloo and torch.distributed variables: what each changes, and which cost speed or hide hangs."""
    return _environment_finding(distributed=True)


@check("env.runtime")
def env_runtime(context: DoctorContext) -> Finding:
    """CUDA, allocator and thread variables that slow every step (debugging switches left on)."""
    return _environment_finding(distributed=False)
