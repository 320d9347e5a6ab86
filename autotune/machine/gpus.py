"""Which NVIDIA GPUs the trials will see, read without initialising CUDA in this process.

NVML (the `pynvml` module of nvidia-ml-py) lists the GPUs and never creates a CUDA context; it ignores
CUDA_VISIBLE_DEVICES, so that variable is applied here as CUDA applies it. The GPU architectures torch was compiled
for come from `torch._C._cuda_getArchFlags()`, a compile-time string.

MIG is supported rather than refused, because NVML describes a MIG device as well as a GPU: a MIG device is recorded
as a GPU of its own (the slice's name and memory, the parent's compute capability). What cannot be resolved to
exactly one MIG device through NVML is a one-line UserError saying what to set, never a guess.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from autotune.errors import UserError

__all__ = ["GpuInfo", "arch_flags", "check_arch", "choose_gpus", "device_order_problem", "nvml_gpus", "visible_gpus"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    """One visible NVIDIA GPU as NVML reports it."""

    name: str
    uuid: str
    memory_bytes: int
    compute_capability: tuple[int, int]

    @property
    def supports_tf32(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= (8, 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class _NvmlGpu:
    """A physical GPU in NVML's list; `mig` is None when MIG mode is off, else the MIG devices this process may use."""

    gpu: GpuInfo
    mig: tuple[GpuInfo, ...] | None = None


def nvml_gpus() -> tuple[list[_NvmlGpu], str | None, str | None]:
    """NVML's GPUs, the driver version, and why NVML gave no GPUs when it failed; never a crash."""
    try:
        import pynvml
    except ImportError:
        return [], None, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:  # no driver, no library: a CPU machine
        logger.debug("NVML unavailable: %s", error)
        return [], None, f"NVML could not start: {error}"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        count = pynvml.nvmlDeviceGetCount()
        return [_nvml_gpu(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)) for index in range(count)], driver, None
    except pynvml.NVMLError as error:
        logger.warning("NVML failed while listing GPUs (%s); no GPU can be used", error)
        return [], None, f"NVML failed while listing GPUs: {error}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _nvml_gpu(pynvml: Any, handle: Any) -> _NvmlGpu:
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    capability = (int(major), int(minor))
    return _NvmlGpu(gpu=_gpu_info(pynvml, handle, capability), mig=_mig_devices(pynvml, handle, capability))


def _gpu_info(pynvml: Any, handle: Any, capability: tuple[int, int]) -> GpuInfo:
    return GpuInfo(
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        compute_capability=capability,
    )


def _mig_devices(pynvml: Any, handle: Any, capability: tuple[int, int]) -> tuple[GpuInfo, ...] | None:
    """The MIG devices of a GPU in MIG mode (name and memory of the slice, the parent's capability), else None."""
    get_mig_mode = getattr(pynvml, "nvmlDeviceGetMigMode", None)  # an nvidia-ml-py from before MIG (R450)
    if get_mig_mode is None:
        return None
    try:
        current_mode, _pending_mode = get_mig_mode(handle)
    except pynvml.NVMLError as error:
        if _nvml_error_is(pynvml, error, "NOT_SUPPORTED", "FUNCTION_NOT_FOUND"):
            return None  # a GPU (pre-Ampere, consumer) or a driver without MIG
        raise
    if current_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
        return None
    devices = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError as error:
            if _nvml_error_is(pynvml, error, "NOT_FOUND", "NO_PERMISSION"):
                continue  # an empty slot, or a slice this container was not given
            raise
        info = _gpu_info(pynvml, mig_handle, capability)  # memory from the MIG handle: the slice's own
        devices.append(info if "MIG" in info.name else replace(info, name=f"{info.name} MIG"))
    return tuple(devices)


def _nvml_error_is(pynvml: Any, error: Exception, *names: str) -> bool:
    """Whether an NVMLError carries one of these return codes (named without their NVML_ERROR_ prefix)."""
    return getattr(error, "value", None) in {getattr(pynvml, f"NVML_ERROR_{name}", None) for name in names}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _strtoul(entry: str) -> tuple[int | None, bool]:
    """An entry's leading integer as CUDA reads it (None: no number), and whether that number is the whole entry."""
    match = re.match(r"[+-]?\d+", entry)
    return (int(match.group()), match.end() == len(entry)) if match else (None, False)


def _visible(nvml: list[_NvmlGpu], value: str | None) -> tuple[list[GpuInfo], str | None]:
    """Apply CUDA_VISIBLE_DEVICES to NVML's list (which ignores it) as CUDA does.

    Follows torch.cuda._parse_visible_devices and _transform_uuid_to_ordinals, torch's model of CUDA's parser:
    entries are indices, or UUIDs with the `GPU-` or `MIG-` prefix of the first entry (an unprefixed UUID is no
    UUID to CUDA); a UUID prefix must match exactly one device; the first entry CUDA cannot use ends the list; a
    repeated device leaves CUDA none. Stricter than CUDA, so as never to describe a GPU the user did not mean: an
    entry CUDA reads only in part ('1gpu2' is GPU 1 to CUDA, an unprefixed '8a9f...' GPU 8) is a UserError, and so
    is MIG wherever it does not come down to one MIG device (see _visible_mig, _without_mig).

    Returns:
        The GPUs the trials will see, in CUDA's order, and why CUDA stops short of the whole variable (or None).
    """
    if value is None or not value.startswith(("GPU-", "MIG-")):
        _warn_device_order(nvml)
    if value is None:
        return _without_mig(nvml), None
    if value.startswith("MIG-"):
        return _visible_mig(nvml, value)
    if value.startswith("GPU-"):
        entries, note = _prefixed(value, "GPU-")
        chosen, resolve_note = _by_uuid(entries, [entry.gpu.uuid for entry in nvml])
        note = resolve_note or note  # resolving stops at or before where parsing stopped
    else:
        chosen, note = _by_index(value, len(nvml))
    return _without_mig([nvml[index] for index in chosen]), note


def _prefixed(value: str, prefix: str) -> tuple[list[str], str | None]:
    """torch's parse_list_with_prefix: the entries up to the first without the prefix; none if one is repeated."""
    entries: list[str] = []
    parts = value.split(",")
    for position, entry in enumerate(parts):
        if entry in entries:
            return [], f"{entry} is listed twice (CUDA then sees none)"
        if not entry.startswith(prefix):
            if not any(parts[position:]):  # a trailing comma drops nothing
                return entries, None
            return entries, f"CUDA stops at {entry!r}, which lacks the {prefix} prefix of the first entry"
        entries.append(entry)
    return entries, None


def _by_uuid(entries: list[str], uuids: list[str]) -> tuple[list[int], str | None]:
    """torch's _transform_uuid_to_ordinals: positions in `uuids` of the devices whose UUIDs the entries begin."""
    chosen: list[int] = []
    for entry in entries:
        matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(entry)]
        if len(matches) != 1:  # an ambiguous prefix counts as no match
            return chosen, f"CUDA stops at {entry}, which begins {len(matches) or 'none'} of the UUIDs NVML lists"
        if matches[0] in chosen:
            return [], f"{entry} names a device listed before it (CUDA then sees none)"
        chosen.append(matches[0])
    return chosen, None


def _by_index(value: str, count: int) -> tuple[list[int], str | None]:
    """torch's index parsing (a negative or non-numeric entry ends the list), then the first index past `count`."""
    entries = [part.strip() for part in value.split(",")]
    indices: list[int] = []
    note = None
    for position, entry in enumerate(entries):
        number, whole = _strtoul(entry)
        if number is not None and not whole:
            raise UserError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is not a GPU index, yet CUDA would read it as GPU {number}; "
                "write indices (0,1) or UUIDs with the GPU- or MIG- prefix that `nvidia-smi -L` prints"
            )
        if number in indices:
            return [], f"GPU {number} is listed twice (CUDA then sees none)"
        if number is None or number < 0:  # '-1' and '' are the usual ways to hide every GPU: no note
            if number is None and any(entries[position:]):
                what = "not a GPU index" if position else "neither a GPU index nor a GPU-/MIG- UUID"
                note = f"CUDA stops at {entry!r}, which is {what}"
            break
        indices.append(number)
    for position, index in enumerate(indices):
        if index >= count:
            return indices[:position], f"CUDA stops at GPU {index}, but NVML lists {count} GPU(s), from 0"
    return indices, note


def _visible_mig(nvml: list[_NvmlGpu], value: str) -> tuple[list[GpuInfo], str | None]:
    """MIG devices by UUID (torch leaves them to CUDA: _device_count_nvml 'Skip MIG parsing'); one at most."""
    entries, note = _prefixed(value, "MIG-")
    legacy = next((entry for entry in entries if entry.startswith("MIG-GPU-") or "/" in entry), None)
    if legacy is not None:
        raise UserError(
            f"CUDA_VISIBLE_DEVICES entry {legacy!r} is the MIG naming of drivers before R470, which autotune does "
            "not read; use the MIG-<uuid> that `nvidia-smi -L` prints"
        )
    devices = [mig for entry in nvml for mig in entry.mig or ()]
    chosen, resolve_note = _by_uuid(entries, [mig.uuid for mig in devices])
    if len(chosen) > 1:
        raise UserError(
            f"CUDA_VISIBLE_DEVICES names {len(chosen)} MIG devices, but CUDA gives a process only one, so trials "
            "cannot span them; keep one MIG-<uuid>"
        )
    return [devices[index] for index in chosen], resolve_note or note


def _without_mig(selected: list[_NvmlGpu]) -> list[GpuInfo]:
    """Physical GPUs as CUDA sees them: a GPU in MIG mode is one of its MIG devices, so it must have exactly one."""
    in_mig = [entry for entry in selected if entry.mig is not None]
    if not in_mig:
        return [entry.gpu for entry in selected]
    parent, devices = in_mig[0].gpu, in_mig[0].mig or ()
    if len(selected) == 1 and len(devices) == 1:
        return list(devices)  # e.g. a container given one MIG slice: NVML shows its parent GPU
    where = f"{parent.name} ({parent.uuid})"
    if not devices:
        raise UserError(
            f"{where} is in MIG mode but has no MIG device this process may use; create one "
            "(nvidia-smi mig -cgi <profile> -C), disable MIG mode, or hide this GPU with CUDA_VISIBLE_DEVICES"
        )
    others = f" beside {len(selected) - 1} other visible GPU(s)" if len(selected) > 1 else ""
    raise UserError(
        f"{where} is in MIG mode with {len(devices)} MIG device(s){others}, and CUDA would use just one of them; "
        "set CUDA_VISIBLE_DEVICES to one MIG-<uuid> that `nvidia-smi -L` prints"
    )


def device_order_problem(nvml: list[_NvmlGpu]) -> str | None:
    """Why GPU indices may not mean NVML's (PCI bus) order, or None: CUDA numbers GPUs fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, which matters only where the GPUs differ."""
    models = sorted({entry.gpu.name for entry in nvml})
    if len(models) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return (
            f"GPUs of different models ({', '.join(models)}) and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
            "GPUs fastest first, NVML and this record by PCI bus, so the trials' GPU N may not be the GPU N recorded"
        )
    return None


def _warn_device_order(nvml: list[_NvmlGpu]) -> None:
    problem = device_order_problem(nvml)
    if problem:
        logger.warning("%s; set CUDA_DEVICE_ORDER=PCI_BUS_ID or select GPUs by UUID", problem)


def visible_gpus(nvml: list[_NvmlGpu], value: str | None) -> tuple[list[GpuInfo], str | None]:
    """The GPUs CUDA will see under CUDA_VISIBLE_DEVICES=`value` (None: unset), and why CUDA stops short of the whole
    variable (or None); the same reading as choose_gpus, for callers that report rather than refuse.

    Raises:
        UserError: an entry CUDA would misread, or MIG that does not come down to one MIG device (see _visible).
    """
    return _visible(nvml, value)


def arch_flags() -> list[str]:
    """The CUDA architectures torch was compiled for, e.g. ['sm_80', 'sm_90', 'compute_90']; [] when unknown.

    Read from torch._C._cuda_getArchFlags(), a compile-time string: torch.cuda.get_arch_list() wraps it, but older
    torch releases first ask is_available() there, which initialises the CUDA driver in this process.
    """
    import torch

    try:
        flags = torch._C._cuda_getArchFlags()
    except (AttributeError, RuntimeError):  # a CPU build has no such function
        return []
    return flags.split() if flags else []


_ARCH = re.compile(r"(sm|compute)_(\d+)([af]?)")


def _runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a build for `arch_list` has code that runs on a GPU of this compute capability.

    A cubin sm_XY runs on X.Y and the later minors of major X, as torch.cuda._check_capability's DEVICE_REQUIREMENT
    says (sm_86 on 8.9, sm_120 on 12.1); an arch-specific `a` one only on X.Y. PTX compute_XY is compiled by the
    driver for any later GPU (CUDA's forward compatibility, which torch's check leaves out). Jetson-only exceptions
    in DEVICE_REQUIREMENT (8.7, 7.2, ...) are not modelled. An arch list none of which parses counts as runs.
    """
    device = 10 * capability[0] + capability[1]
    parsed = [match for match in map(_ARCH.fullmatch, arch_list) if match]
    for match in parsed:
        kind, code, suffix = match.group(1), int(match.group(2)), match.group(3)
        if suffix == "a":
            runs = device == code
        elif kind == "compute" and not suffix:
            runs = device >= code
        else:  # a cubin, or family-specific (`f`) code: the same major, a minor at least as high
            runs = device // 10 == code // 10 and device >= code
        if runs:
            return True
    return not parsed


def check_arch(gpus: list[GpuInfo], torch_version: str) -> None:
    arch_list = arch_flags()
    for gpu in gpus:
        if arch_list and not _runs_on(gpu.compute_capability, arch_list):
            major, minor = gpu.compute_capability
            raise UserError(
                f"{gpu.name} has compute capability {major}.{minor}, but torch {torch_version} has kernels only for "
                f"{' '.join(arch_list)}, so every trial would fail with 'no kernel image is available'; install a "
                f"torch build for sm_{major}{minor} (https://pytorch.org/get-started/locally/) or use --device cpu"
            )


def choose_gpus(device: str, nvml: list[_NvmlGpu], nvml_problem: str | None) -> list[GpuInfo]:
    """The GPUs a study on `device` uses; a UserError where CUDA would see none, or maybe others than meant."""
    if device == "cuda" and not nvml:
        reason = nvml_problem or "NVML lists none"
        raise UserError(
            f"--device cuda was asked for, but no usable NVIDIA GPU is visible ({reason}); use --device cpu"
        )
    if device == "cpu" or not nvml:
        return []
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus, note = _visible(nvml, value)
    if note and not gpus:
        raise UserError(
            f"CUDA_VISIBLE_DEVICES={value!r} leaves CUDA no GPU: {note}; correct or unset it (`nvidia-smi -L` lists "
            "the GPUs), or use --device cpu"
        )
    if note:
        logger.warning("CUDA_VISIBLE_DEVICES=%r: %s; the trials see %d GPU(s)", value, note, len(gpus))
    if device == "cuda" and not gpus:
        raise UserError(
            f"--device cuda was asked for, but no usable NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES={value!r} "
            "hides them all); unset it or use --device cpu"
        )
    return gpus
