"""Checks of the torch build against this machine's GPUs: kernels, driver, CUDA_VISIBLE_DEVICES, TF32, bf16, NCCL.

None of them initialises CUDA: torch.version and the compiled arch list are static, the GPUs come from NVML, and
the TF32 flags are Python-side settings. So the doctor can run beside a training job without taking GPU memory.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from autotune.doctor.context import DoctorContext
from autotune.doctor.findings import Finding
from autotune.doctor.registry import check, fail, info, ok, warn
from autotune.errors import UserError
from autotune.machine import gpus

__all__ = ["cudnn_version_text", "split_message", "tf32_defaults"]

INSTALL_TORCH = "https://pytorch.org/get-started/locally/"


def split_message(message: str) -> tuple[str, str]:
    """A UserError's 'what is wrong; how to fix it' as (value, fix)."""
    what, _, how = message.rpartition("; ")
    return (what, how) if what else (message, "")


def cudnn_version_text(version: int | None) -> str | None:
    """torch.backends.cudnn.version() as cuDNN prints it: 92400 -> '9.24.0', 8902 -> '8.9.2'."""
    if not version:
        return None
    if version >= 90000:  # cuDNN 9 encodes major * 10000 + minor * 100 + patch
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def _cudnn() -> str | None:
    import torch

    try:
        return cudnn_version_text(torch.backends.cudnn.version())
    except (RuntimeError, OSError):  # a CUDA build whose cuDNN library cannot be loaded
        return None


@check("torch.build")
def torch_build(context: DoctorContext) -> Finding:
    """torch, its CUDA and cuDNN, and whether it has kernels for every GPU CUDA will see."""
    import torch

    cuda = torch.version.cuda
    arch = gpus.arch_flags()
    figures: dict[str, Any] = {"torch": str(torch.__version__), "cuda": cuda, "cudnn": _cudnn() if cuda else None}
    figures["arch_list"] = arch
    described = f"torch {torch.__version__}" + (
        f", CUDA {cuda}, cuDNN {figures['cudnn'] or 'missing'}, kernels {' '.join(arch) or 'unknown'}"
        if cuda
        else " (CPU-only build)"
    )
    seen = context.nvml.visible or [entry.gpu for entry in context.nvml.physical]
    if seen and not cuda:
        return fail(
            f"{described}, but NVML sees {len(seen)} GPU(s)",
            f"install a CUDA build of torch ({INSTALL_TORCH}); autotune would tune the CPU instead",
            **figures,
        )
    try:
        gpus.check_arch(list(seen), str(torch.__version__))
    except UserError as error:
        what, how = split_message(str(error))
        return fail(what, how, **figures)
    if cuda and not figures["cudnn"]:
        return warn(f"{described}: cuDNN cannot be loaded", f"reinstall torch ({INSTALL_TORCH})", **figures)
    where = f"; runs on {len(seen)} GPU(s)" if seen else "; no GPU to run on"
    return ok(described + where, **figures)


def _version_pair(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


@check("driver")
def driver(context: DoctorContext) -> Finding:
    """The NVIDIA driver, and whether its CUDA is as new as the CUDA torch was built with."""
    import torch

    view = context.nvml
    if not view.physical:
        return info(f"no NVIDIA GPU driver answers ({view.problem or 'NVML lists no GPU'}): CPU only")
    cuda_driver = None
    if view.module is not None and hasattr(view.module, "nvmlSystemGetCudaDriverVersion"):
        try:
            code = int(view.module.nvmlSystemGetCudaDriverVersion())
            cuda_driver = f"{code // 1000}.{code % 1000 // 10}"
        except view.module.NVMLError:
            pass
    value = f"driver {view.driver}" + (f", for CUDA up to {cuda_driver}" if cuda_driver else "")
    figures = {"driver": view.driver, "driver_cuda": cuda_driver, "torch_cuda": torch.version.cuda}
    have, need = _version_pair(cuda_driver), _version_pair(torch.version.cuda)
    if have and need and have[0] < need[0]:
        return fail(
            f"{value}, but torch needs CUDA {torch.version.cuda}: no kernel would launch",
            f"upgrade the NVIDIA driver to one for CUDA {torch.version.cuda}, or install torch for CUDA {cuda_driver}",
            **figures,
        )
    if have and need and have < need:
        return warn(
            f"{value}, older than torch's CUDA {torch.version.cuda} (minor-version compatibility: PTX JIT fails)",
            f"upgrade the NVIDIA driver to one for CUDA {torch.version.cuda}",
            **figures,
        )
    return ok(value, **figures)


def _listed(visible: list[gpus.GpuInfo]) -> str:
    return ", ".join(gpu.name for gpu in visible)


@check("cuda.visible_devices")
def cuda_visible_devices(context: DoctorContext) -> Finding:
    """CUDA_VISIBLE_DEVICES read as CUDA reads it: which GPUs the trials will really see."""
    view = context.nvml
    value = view.visible_value
    shown = "unset" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"
    figures: dict[str, Any] = {"cuda_visible_devices": value, "visible_uuids": [gpu.uuid for gpu in view.visible]}
    if not view.physical:
        return info(f"{shown}; no NVIDIA GPU on this machine", **figures)
    if view.visible_error is not None:
        what, how = split_message(view.visible_error)
        return fail(what, how, **figures)
    if not view.visible:
        reason = f": {view.visible_note}" if view.visible_note else ""
        return warn(
            f"{shown} hides all {len(view.physical)} GPU(s){reason}; autotune would tune the CPU",
            "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (`nvidia-smi -L` prints them)",
            **figures,
        )
    sees = f"CUDA sees {len(view.visible)} of {len(view.physical)} GPU(s): {_listed(view.visible)}"
    if view.visible_note:
        return warn(
            f"{shown}: {sees}; {view.visible_note}",
            "correct CUDA_VISIBLE_DEVICES (`nvidia-smi -L` prints the GPUs)",
            **figures,
        )
    order = gpus.device_order_problem(view.physical)
    if order and (value is None or not value.startswith(("GPU-", "MIG-"))):
        return warn(f"{shown}: {sees}; {order}", "set CUDA_DEVICE_ORDER=PCI_BUS_ID or select GPUs by UUID", **figures)
    return ok(f"{shown}: {sees}", **figures)


def tf32_defaults(torch_module: Any = None) -> dict[str, Any]:
    """The TF32 state of a torch nobody has set yet: the legacy allow_tf32 flags and, where this torch has them,
    the per-backend fp32_precision settings ("none" follows the generic setting, which "none" leaves at IEEE)."""
    if torch_module is None:
        import torch as torch_module
    from autotune.knobs.precision import uses_new_tf32_api

    backends = torch_module.backends
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the legacy getters' deprecation notice
        try:
            state["legacy_matmul_allow_tf32"] = bool(backends.cuda.matmul.allow_tf32)
            state["legacy_cudnn_allow_tf32"] = bool(backends.cudnn.allow_tf32)
        except RuntimeError as error:  # torch refuses legacy reads after new-API writes ("a mix of ... APIs")
            state["legacy_error"] = str(error)
    state["float32_matmul_precision"] = torch_module.get_float32_matmul_precision()
    if uses_new_tf32_api(torch_module):
        state["fp32_precision"] = {
            "generic": backends.fp32_precision,
            "cuda.matmul": backends.cuda.matmul.fp32_precision,
            "cudnn.conv": backends.cudnn.conv.fp32_precision,
            "cudnn.rnn": backends.cudnn.rnn.fp32_precision,
        }
    return state


def _tf32_words(state: dict[str, Any]) -> str:
    matmul = "TF32" if state.get("legacy_matmul_allow_tf32") else "IEEE fp32"
    conv = "TF32" if state.get("legacy_cudnn_allow_tf32") else "IEEE fp32"
    words = f"torch's default: matmuls in {matmul}, cuDNN convolutions in {conv} (legacy allow_tf32 flags"
    new = state.get("fp32_precision")
    if new:
        words += "; fp32_precision " + ", ".join(f"{key}={value}" for key, value in new.items())
    return words + ")"


@check("tf32")
def tf32(context: DoctorContext) -> Finding:
    """What a recipe that never sets TF32 gets from this torch, and environment variables that override it."""
    state = tf32_defaults()
    value = _tf32_words(state)
    override = os.environ.get("NVIDIA_TF32_OVERRIDE")
    if override == "0":
        return warn(
            f"NVIDIA_TF32_OVERRIDE=0 turns TF32 off in cuBLAS and cuDNN whatever torch asks; {value}",
            "unset NVIDIA_TF32_OVERRIDE, or autotune's tf32 precision measures plain fp32",
            **state,
        )
    if "legacy_error" in state:
        return warn(f"{value}: {state['legacy_error']}", "set TF32 through one of torch's APIs only", **state)
    if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1":
        return info(f"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 puts fp32 matmuls in TF32; {value}", **state)
    tensor_cores = [gpu for gpu in context.nvml.visible if gpu.supports_tf32]
    if not tensor_cores:
        return info(f"{value}; no GPU with TF32 here, so it changes nothing", **state)
    return info(
        value,
        "a recipe that leaves these alone trains matmuls in full fp32; `autotune run` measures tf32 as a precision "
        "of its own and writes the flags explicitly",
        **state,
    )


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@check("bf16")
def bf16(context: DoctorContext) -> Finding:
    """Whether bf16 autocast runs natively: compute capability 8.0 on a GPU, AVX512-BF16 or AMX on a CPU."""
    visible = context.nvml.visible
    if visible:
        without = [gpu for gpu in visible if not gpu.supports_bf16]
        if without:
            major, minor = without[0].compute_capability
            return info(
                f"no bf16 on {without[0].name} (compute capability {major}.{minor}): autotune searches fp16 with "
                "GradScaler there",
                supported=False,
            )
        return ok(f"bf16 on all {len(visible)} GPU(s)", supported=True)
    native = sorted(_cpu_flags() & {"avx512_bf16", "amx_bf16"})
    if native:
        return ok(f"CPU has {', '.join(native)}: bf16 autocast runs natively", supported=True, cpu_flags=native)
    return info(
        "CPU without AVX512-BF16 or AMX: bf16 autocast is emulated and may be slower than fp32; autotune measures both",
        supported=False,
        cpu_flags=[],
    )


@check("distributed")
def distributed(context: DoctorContext) -> Finding:
    """torch.distributed's backends: NCCL for multi-GPU trials, gloo for multi-process trials on a CPU."""
    import torch

    dist = torch.distributed
    if not dist.is_available():
        return warn("torch.distributed is not available in this build", "install a torch build with distributed")
    nccl = dist.is_nccl_available()
    gloo = dist.is_gloo_available()
    version = None
    if nccl:
        try:
            version = ".".join(str(part) for part in torch.cuda.nccl.version())  # a static library query
        except (RuntimeError, AttributeError, TypeError):
            version = None
    figures = {"nccl": nccl, "nccl_version": version, "gloo": gloo}
    value = f"NCCL {version or ('available' if nccl else 'missing')}, gloo {'available' if gloo else 'missing'}"
    gpu_count = len(context.nvml.visible)
    if gpu_count > 1 and not nccl:
        return fail(
            f"{value}: {gpu_count} GPUs but no NCCL for data-parallel trials",
            f"install a CUDA build of torch with NCCL ({INSTALL_TORCH}) or run with --devices 1",
            **figures,
        )
    if not gloo:
        return warn(f"{value}: multi-process trials on a CPU need gloo", "install torch from pytorch.org", **figures)
    return ok(value, **figures)
