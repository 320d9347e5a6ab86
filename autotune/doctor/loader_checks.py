"""Checks of what the training DataLoader needs from the host: /dev/shm for its batches in flight, and open-file
descriptors to carry them (autotune.doctor.loader measures both on the workload's own batch)."""

from __future__ import annotations

import math
import shutil

from autotune.doctor.context import DoctorContext
from autotune.doctor.findings import Finding
from autotune.doctor.loader import LoaderEstimate, estimate_loader
from autotune.doctor.registry import check, fail, info, ok, warn

__all__ = ["SHM_PATH"]

SHM_PATH = "/dev/shm"
GIB = 2**30
MIB = 2**20
DESCRIPTOR_MARGIN = 256  # the process's own files, sockets and libraries beside the tensors in flight
LOW_SOFT_LIMIT = 4096


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / MIB:.0f} MiB"


def _shm_size_flag(need: int) -> str:
    return f"{max(1, math.ceil(2 * need / GIB))}g"


@check("loader.shm")
def shm(context: DoctorContext) -> Finding:
    """/dev/shm against the batches the DataLoader's workers keep in flight (a container's default is 64 MiB: the
    workers then die with 'bus error' or 'No space left on device' minutes into training)."""
    try:
        usage = shutil.disk_usage(SHM_PATH)
    except OSError as error:
        return info(f"{SHM_PATH} unavailable ({error.strerror or error}): DataLoader workers share tensors elsewhere")
    have = f"{SHM_PATH} {_gib(usage.total)} ({_gib(usage.free)} free)"
    figures: dict[str, object] = {"shm_total_bytes": usage.total, "shm_free_bytes": usage.free}
    estimate = estimate_loader(context)
    if isinstance(estimate, str):
        return info(f"{have}; need unknown: {estimate}", "pass --model (and --batch-size, --workers) or --result")
    need = estimate.shm_bytes
    figures.update(_figures(estimate), shm_need_bytes=need)
    if need == 0:
        return ok(f"{have}; this loader has no worker processes and needs none", **figures)
    value = f"{have}; need {_gib(need)}: {estimate.describe()}"
    if need > usage.free:
        return fail(
            value,
            f"give it more (docker run --shm-size={_shm_size_flag(need)}, or --ipc=host; on a host: mount -o "
            "remount,size=... /dev/shm), or fewer workers or a smaller prefetch_factor",
            **figures,
        )
    if need > usage.free / 2:
        return warn(
            f"{value}: little room left for anything else",
            f"give it more (docker run --shm-size={_shm_size_flag(need)} or --ipc=host)",
            **figures,
        )
    return ok(value, **figures)


def _figures(estimate: LoaderEstimate) -> dict[str, object]:
    config = estimate.config
    return {
        "per_device_batch_size": config.per_device_batch_size,
        "num_workers": config.num_workers,
        "prefetch_factor": config.prefetch_factor,
        "ranks": estimate.ranks,
        "batch_bytes": estimate.batch_bytes,
        "tensors_per_batch": estimate.tensors_per_batch,
        "preload_bytes": estimate.preload_bytes,
        "config_from": estimate.config_from,
        "measured_on": estimate.measured_on,
    }


@check("loader.open_files")
def open_files(context: DoctorContext) -> Finding:
    """The open-file limit against the descriptors the loader's tensors in flight hold under torch's
    file_descriptor sharing strategy ('Too many open files' in a worker otherwise)."""
    import resource

    import torch.multiprocessing

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    strategy = torch.multiprocessing.get_sharing_strategy()
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    value = f"open files: soft {soft}, hard {hard_text}; sharing strategy {strategy}"
    figures: dict[str, object] = {"soft": soft, "hard": hard, "sharing_strategy": strategy}
    estimate = estimate_loader(context)
    need = DESCRIPTOR_MARGIN
    if not isinstance(estimate, str) and strategy == "file_descriptor":
        need += estimate.descriptors
        value += f"; the loader holds up to {estimate.descriptors} descriptors"
    figures["need"] = need
    raise_to = hard_text if hard == resource.RLIM_INFINITY or hard > need else str(need)
    if soft < need:
        return fail(
            f"{value}: below the {need} it needs",
            f"ulimit -n {raise_to} before training, or torch.multiprocessing.set_sharing_strategy('file_system')",
            **figures,
        )
    if soft < LOW_SOFT_LIMIT and (hard == resource.RLIM_INFINITY or hard > soft):
        return warn(f"{value}: a low soft limit", f"ulimit -n {raise_to} (the hard limit allows it)", **figures)
    return ok(value, **figures)
