"""What the doctor's checks read: the user's request, checked before anything runs, and the facts several checks
share (NVML's GPUs and which of them CUDA will see, the tuned result, the workload), gathered once."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError, UserError
from autotune.knobs import declarations as knobs
from autotune.machine import gpus

if TYPE_CHECKING:
    from autotune.result.tuned_config import TunedConfig
    from autotune.workloads import Workload

__all__ = ["DoctorContext", "DoctorRequest", "GpuHandle", "NvmlView", "nvml_read", "open_nvml", "prepare"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorRequest:
    """What the user asked the doctor to look at.

    Attributes:
        model: the workload whose DataLoader needs /dev/shm and file descriptors (default: the --result's).
        per_device_batch_size, num_workers, prefetch_factor: the loader to size for; default: the --result's winner,
            else the recipe's baseline as `autotune run` would measure it first on this machine.
        data: a data list or folder to sample the read throughput of (and to size batches from).
        result: a result YAML of `autotune run`: the loader to size and the throughput the data must keep up with.
        read_budget_s, read_files: the bounds of the read sample.
    """

    model: str | None = None
    per_device_batch_size: int | None = None
    num_workers: int | None = None
    prefetch_factor: int | None = None
    data: str | None = None
    result: str | None = None
    read_budget_s: float = 5.0
    read_files: int = 48


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuHandle:
    """A physical GPU NVML lists and CUDA will see (or the parent of the MIG device it will see)."""

    index: int  # NVML's index (PCI bus order)
    handle: Any
    info: gpus.GpuInfo
    mig: tuple[gpus.GpuInfo, ...] | None  # None: MIG mode off or not supported
    nvml: ModuleType


@dataclass(kw_only=True, slots=True)
class NvmlView:
    """NVML's answer for this machine, with a session open for the per-GPU checks until close()."""

    module: ModuleType | None = None
    problem: str | None = None  # why NVML gave no GPUs
    driver: str | None = None
    physical: list[Any] = field(default_factory=list)  # gpus._NvmlGpu, NVML's order
    visible_value: str | None = None  # CUDA_VISIBLE_DEVICES as set (None: unset)
    visible: list[gpus.GpuInfo] = field(default_factory=list)  # what CUDA will see
    visible_note: str | None = None  # where CUDA stops short of the variable
    visible_error: str | None = None  # a UserError autotune run would raise
    devices: list[GpuHandle] = field(default_factory=list)

    def close(self) -> None:
        if self.module is not None:
            try:
                self.module.nvmlShutdown()
            except self.module.NVMLError:
                pass
            self.module = None


def open_nvml() -> NvmlView:
    """NVML's GPUs, CUDA_VISIBLE_DEVICES applied as CUDA applies it, and handles of the GPUs to check; never raises.

    Where CUDA_VISIBLE_DEVICES cannot be resolved, every GPU NVML lists is checked (the variable's own finding
    fails): their health is still worth knowing.
    """
    physical, driver, problem = gpus.nvml_gpus()
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    view = NvmlView(problem=problem, driver=driver, physical=physical, visible_value=value)
    if not physical:
        return view
    try:
        view.visible, view.visible_note = gpus.visible_gpus(physical, value)
    except UserError as error:
        view.visible_error = str(error)
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:  # it answered a moment ago; a driver going away now is reported, not raised
        view.problem = f"NVML could not start: {error}"
        return view
    view.module = pynvml
    wanted = {gpu.uuid for gpu in view.visible}
    for index, entry in enumerate(physical):
        uuids = {entry.gpu.uuid, *(mig.uuid for mig in entry.mig or ())}
        if view.visible_error is None and not uuids & wanted:
            continue
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as error:
            logger.warning("NVML lost GPU %d (%s) while the doctor looked: %s", index, entry.gpu.name, error)
            continue
        view.devices.append(GpuHandle(index=index, handle=handle, info=entry.gpu, mig=entry.mig, nvml=pynvml))
    return view


def nvml_read(gpu: GpuHandle, function: str, *args: Any) -> tuple[Any, str | None]:
    """(NVML's answer, None), or (None, why not): NotSupported, NoPermission, a GPU lost, an older nvidia-ml-py."""
    call = getattr(gpu.nvml, function, None)
    if call is None:
        return None, f"this nvidia-ml-py has no {function}"
    try:
        return call(gpu.handle, *args), None
    except gpu.nvml.NVMLError as error:
        return None, f"NVML: {error}"


@dataclass(kw_only=True, slots=True)
class DoctorContext:
    """The checked request and what the checks share; close() ends the NVML session."""

    request: DoctorRequest
    tuned: TunedConfig | None
    workload: Workload | None
    nvml: NvmlView
    cache: dict[str, Any] = field(default_factory=dict)  # facts one check computes and another reuses

    def close(self) -> None:
        self.nvml.close()


def _check_request(request: DoctorRequest) -> None:
    options = {
        "per_device_batch_size": "--batch-size",
        "num_workers": "--workers",
        "prefetch_factor": "--prefetch-factor",
    }
    for name, option in options.items():
        value = getattr(request, name)
        knob = knobs.get(name)
        if value is not None and knob.minimum is not None and value < knob.minimum:
            raise UserError(f"{option} must be at least {knob.minimum}, got {value}")
        if value is not None and knob.maximum is not None and value > knob.maximum:
            raise UserError(f"{option} must be at most {knob.maximum:,}, got {value}")
    if request.read_budget_s <= 0 or request.read_files < 1:
        raise UserError("the read sample needs a positive time budget and at least one file")
    if request.data is not None and not Path(request.data).expanduser().exists():
        raise DataError(f"--data {request.data} does not exist; give a data list or folder that `autotune run` reads")


def prepare(request: DoctorRequest) -> DoctorContext:
    """Check the request (a UserError, exit 2, for bad input) and gather what the checks share.

    Raises:
        UserError: a bad number, a --data path that does not exist, a --result that is no autotune result, an
            unknown --model.
    """
    _check_request(request)
    tuned = None
    if request.result is not None:
        from autotune.result.tuned_config import load_config

        tuned = load_config(request.result)
    workload = None
    name = request.model or (tuned.workload.get("model") or tuned.workload.get("name") if tuned is not None else None)
    if name:
        from autotune import workloads

        workload = workloads.get(name)
    return DoctorContext(request=request, tuned=tuned, workload=workload, nvml=open_nvml())
