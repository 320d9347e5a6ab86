"""Per-GPU checks through NVML: load, MIG, ECC, persistence mode, clocks and why they are held down, PCIe link,
power limit. Every NVML call may answer NotSupported or NoPermission (consumer GPUs, MIG, containers): such a
reading is reported as unknown with NVML's reason, never raised.
"""

from __future__ import annotations

from autotune.doctor.context import DoctorContext, GpuHandle, nvml_read
from autotune.doctor.findings import Finding
from autotune.doctor.registry import check, fail, info, ok, warn

__all__ = ["THROTTLE_REASONS"]

GIB = 2**30

# nvmlClocksEventReason* bits (nvml.h): name, whether it costs speed ("hw": a hardware problem, "sw": a cap).
THROTTLE_REASONS: dict[int, tuple[str, str | None]] = {
    0x1: ("idle", None),
    0x2: ("applications clocks setting", None),
    0x4: ("software power cap", "sw"),
    0x8: ("hardware slowdown", "hw"),
    0x10: ("sync boost", None),
    0x20: ("software thermal slowdown", "sw"),
    0x40: ("hardware thermal slowdown", "hw"),
    0x80: ("hardware power brake slowdown", "hw"),
    0x100: ("display clock setting", None),
}
BUSY_UTILIZATION_PERCENT = 10  # an idle GPU reads 0-2 %
BUSY_MEMORY_FRACTION = 0.05


def _unknown(what: str, reason: str | None) -> Finding:
    return info(f"{what} unknown ({reason})")


@check("load", per_gpu=True)
def load(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """Model and memory, and whether other work already runs on it (measurements would be shared with it)."""
    memory, reason = nvml_read(gpu, "nvmlDeviceGetMemoryInfo")
    if memory is None:
        return _unknown(f"{gpu.info.name}: memory", reason)
    major, minor = gpu.info.compute_capability
    used, total = int(memory.used), int(memory.total)
    utilization, _ = nvml_read(gpu, "nvmlDeviceGetUtilizationRates")
    percent = int(utilization.gpu) if utilization is not None else None
    processes, _ = nvml_read(gpu, "nvmlDeviceGetComputeRunningProcesses")
    figures = {
        "name": gpu.info.name,
        "uuid": gpu.info.uuid,
        "compute_capability": f"{major}.{minor}",
        "memory_total_bytes": total,
        "memory_used_bytes": used,
        "utilization_percent": percent,
        "compute_processes": len(processes) if processes is not None else None,
    }
    value = f"{gpu.info.name}, compute {major}.{minor}, {total / GIB:.1f} GiB, {used / GIB:.1f} GiB used"
    if percent is not None:
        value += f", {percent}% busy"
    if processes:
        value += f", {len(processes)} compute process(es)"
    if (percent or 0) > BUSY_UTILIZATION_PERCENT or used > BUSY_MEMORY_FRACTION * total:
        return warn(
            f"{value}: other work shares this GPU",
            "tune and train on an idle GPU (pick one with CUDA_VISIBLE_DEVICES), or throughput is shared and noisy",
            **figures,
        )
    return ok(value, **figures)


@check("mig", per_gpu=True)
def mig(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """MIG mode and the slices this process may use (CUDA gives a process one of them)."""
    if gpu.mig is None:
        return ok("MIG off or not supported: the whole GPU", mig=False)
    slices = [device.name.rsplit(" ", 1)[-1] if "MIG " in device.name else device.name for device in gpu.mig]
    figures = {"mig": True, "slices": [device.name for device in gpu.mig], "slice_uuids": [d.uuid for d in gpu.mig]}
    if not gpu.mig:
        return fail(
            "MIG on, with no MIG device this process may use",
            "create one (nvidia-smi mig -cgi <profile> -C), disable MIG mode, or hide this GPU",
            **figures,
        )
    return info(
        f"MIG on: {len(slices)} slice(s) ({', '.join(slices)}); a process trains on one slice",
        "name the slice to tune on with CUDA_VISIBLE_DEVICES=MIG-<uuid> (`nvidia-smi -L`)" if len(slices) > 1 else "",
        **figures,
    )


@check("ecc", per_gpu=True)
def ecc(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """ECC mode, uncorrectable errors since the driver loaded, and row remapping that waits for a reset."""
    mode, reason = nvml_read(gpu, "nvmlDeviceGetEccMode")
    if mode is None:
        return _unknown("ECC", reason)
    current, pending = (int(mode[0]), int(mode[1]))
    nvml = gpu.nvml
    uncorrected, _ = nvml_read(
        gpu,
        "nvmlDeviceGetTotalEccErrors",
        getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        getattr(nvml, "NVML_VOLATILE_ECC", 0),
    )
    rows, _ = nvml_read(gpu, "nvmlDeviceGetRemappedRows")
    figures = {"ecc_enabled": bool(current), "ecc_pending": bool(pending), "uncorrected_volatile": uncorrected}
    if rows is not None:
        figures.update(remap_pending=bool(rows[2]), remap_failure=bool(rows[3]))
    value = f"ECC {'on' if current else 'off'}" + (f", {uncorrected} uncorrectable error(s)" if uncorrected else "")
    if rows is not None and rows[3]:
        return fail(f"{value}; row remapping failed", "drain this GPU and have it serviced (RMA)", **figures)
    if uncorrected:
        return fail(value, "reset the GPU (nvidia-smi -r) or reboot; if errors return, drain it", **figures)
    if rows is not None and rows[2]:
        return warn(f"{value}; rows wait to be remapped", "reset the GPU (nvidia-smi -r) to remap them", **figures)
    if pending != current:
        return info(f"{value}, {'on' if pending else 'off'} after the next reboot", **figures)
    return ok(value, **figures)


@check("persistence", per_gpu=True)
def persistence(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """Persistence mode: without it the driver tears the GPU down whenever no process holds it, and every fresh
    trial process pays seconds to bring it up again."""
    mode, reason = nvml_read(gpu, "nvmlDeviceGetPersistenceMode")
    if mode is None:
        return _unknown("persistence mode", reason)
    if int(mode) == int(getattr(gpu.nvml, "NVML_FEATURE_ENABLED", 1)):
        return ok("persistence mode on", enabled=True)
    return warn(
        "persistence mode off: each trial process waits for the driver to bring the GPU up",
        "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)",
        enabled=False,
    )


def throttle_names(mask: int) -> list[str]:
    return [name for bit, (name, _) in THROTTLE_REASONS.items() if mask & bit]


@check("clocks", per_gpu=True)
def clocks(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """SM and memory clocks now and at most, and why the driver holds them down (NVML's clock event reasons)."""
    nvml = gpu.nvml
    sm_kind, memory_kind = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    sm, reason = nvml_read(gpu, "nvmlDeviceGetClockInfo", sm_kind)
    if sm is None:
        return _unknown("clocks", reason)
    sm_max, _ = nvml_read(gpu, "nvmlDeviceGetMaxClockInfo", sm_kind)
    memory, _ = nvml_read(gpu, "nvmlDeviceGetClockInfo", memory_kind)
    mask, mask_reason = nvml_read(gpu, "nvmlDeviceGetCurrentClocksEventReasons")
    if mask is None:  # nvidia-ml-py before 12.535 named it throttle reasons
        mask, mask_reason = nvml_read(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons")
    figures = {"sm_clock_mhz": sm, "sm_clock_max_mhz": sm_max, "memory_clock_mhz": memory, "reasons_mask": mask}
    value = f"SM {sm}/{sm_max or '?'} MHz" + (f", memory {memory} MHz" if memory is not None else "")
    if mask is None:
        return info(f"{value}; throttle reasons unknown ({mask_reason})", **figures)
    names = throttle_names(int(mask))
    figures["reasons"] = names
    value += f"; held by: {', '.join(names)}" if names else "; nothing holds them down"
    kinds = {THROTTLE_REASONS[bit][1] for bit in THROTTLE_REASONS if int(mask) & bit}
    if "hw" in kinds:
        return fail(
            value,
            "the GPU slows itself down (overheating, power supply): check cooling and power (nvidia-smi -q -d "
            "PERFORMANCE) before measuring anything",
            **figures,
        )
    if "sw" in kinds:
        return warn(value, "lower the load on the GPU's cooling or raise its power limit (nvidia-smi -pl)", **figures)
    return ok(value, **figures)


@check("pcie", per_gpu=True)
def pcie(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """The PCIe link the host feeds batches over: fewer lanes than the card has is a seating or slot problem."""
    generation, reason = nvml_read(gpu, "nvmlDeviceGetCurrPcieLinkGeneration")
    if generation is None:
        return _unknown("PCIe link", reason)
    max_generation, _ = nvml_read(gpu, "nvmlDeviceGetMaxPcieLinkGeneration")
    width, _ = nvml_read(gpu, "nvmlDeviceGetCurrPcieLinkWidth")
    max_width, _ = nvml_read(gpu, "nvmlDeviceGetMaxPcieLinkWidth")
    figures = {"generation": generation, "max_generation": max_generation, "width": width, "max_width": max_width}
    value = f"PCIe gen {generation}/{max_generation or '?'}, x{width or '?'}/x{max_width or '?'}"
    if width and max_width and width < max_width:
        return warn(
            f"{value}: the link runs on fewer lanes than the card has",
            "reseat the card or move it to a full-width slot (check the BIOS's lane settings)",
            **figures,
        )
    if max_generation and generation < max_generation:
        return info(
            f"{value}: below its top speed, as an idle GPU's link is",
            "check it under load (nvidia-smi -q -d PCIE); if it stays low, check the slot and BIOS",
            **figures,
        )
    return ok(value, **figures)


@check("power", per_gpu=True)
def power(context: DoctorContext, gpu: GpuHandle) -> Finding:
    """The enforced power limit against the board's default: a capped GPU trains slower than its datasheet."""
    limit, reason = nvml_read(gpu, "nvmlDeviceGetEnforcedPowerLimit")
    if limit is None:
        return _unknown("power limit", reason)
    default, _ = nvml_read(gpu, "nvmlDeviceGetPowerManagementDefaultLimit")
    figures = {"limit_watts": int(limit) / 1000, "default_watts": int(default) / 1000 if default else None}
    value = f"power limit {int(limit) / 1000:.0f} W" + (f" (default {int(default) / 1000:.0f} W)" if default else "")
    if default and int(limit) < 0.9 * int(default):
        return warn(
            f"{value}: capped below the default",
            f"sudo nvidia-smi -i {gpu.index} -pl {int(default) / 1000:.0f} (or ask whoever capped it why)",
            **figures,
        )
    return ok(value, **figures)
