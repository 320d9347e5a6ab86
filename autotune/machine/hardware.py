"""Probe the machine a study runs on, without initialising CUDA in this process.

The parent process plans and records; only trial children touch CUDA. So GPUs are described through NVML, with
CUDA_VISIBLE_DEVICES applied as CUDA applies it (machine/gpus.py), and the torch / CUDA / torchaudio versions are read
from package metadata and `torch.version`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import platform
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.errors import UserError
from autotune.knobs.precision import TORCH_DEFAULT_FP32
from autotune.machine.gpus import GpuInfo, check_arch, choose_gpus, nvml_gpus

__all__ = ["Hardware", "available_cores", "cpu_model", "probe"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    """What a study runs on: device kind, models, memory and software versions."""

    device_type: str  # "cuda" | "cpu"
    gpus: tuple[GpuInfo, ...] = ()
    cpu_model: str = ""
    cpu_cores: int = 1
    memory_bytes: int = 0
    shm_bytes: int | None = None
    driver_version: str | None = None
    torch_version: str = ""
    cuda_version: str | None = None
    torchaudio_version: str | None = None
    python_version: str = field(default_factory=platform.python_version)

    @property
    def device_count(self) -> int:
        return len(self.gpus) if self.device_type == "cuda" else 1

    def supported_precisions(self) -> tuple[str, ...]:
        """Precisions this hardware can train in: tf32 needs compute capability 8.0, bf16 needs CUDA bf16 or a CPU.

        fp32-default (TF32 flags as torch leaves them) is offered only where TF32 exists: elsewhere it is strict fp32
        and measuring it again would spend a trial on the same maths (space/fit.py maps it to fp32 there).
        """
        if self.device_type == "cpu":
            return ("fp32", "bf16")  # CPU autocast takes fp16 too, but it is slower and has no GradScaler
        precisions = ["fp32", "fp16"]
        if all(gpu.supports_tf32 for gpu in self.gpus):
            precisions[1:1] = [TORCH_DEFAULT_FP32, "tf32"]
        if all(gpu.supports_bf16 for gpu in self.gpus):
            precisions.append("bf16")
        return tuple(precisions)

    def fingerprint(self) -> str:
        """A short stable id of the hardware identity (not the software stack, so upgrades keep the study)."""
        identity = [self.device_type, self.cpu_model, str(self.cpu_cores)]
        identity += [f"{gpu.name}:{gpu.memory_bytes}" for gpu in self.gpus]
        digest = hashlib.sha256("|".join(identity).encode()).hexdigest()[:10]
        kind = _slug(self.gpus[0].name) if self.gpus else "cpu"
        count = len(self.gpus) if self.gpus else self.cpu_cores
        return f"{kind}-x{count}-{digest}"

    def describe(self) -> str:
        """One human line, e.g. '1x NVIDIA H100 80GB HBM3 (79.6 GiB), driver 560.35' or 'CPU: Intel Xeon (2 cores)'."""
        if self.gpus:
            gpu = self.gpus[0]
            return f"{len(self.gpus)}x {gpu.name} ({gpu.memory_bytes / 2**30:.1f} GiB), driver {self.driver_version}"
        return f"CPU: {self.cpu_model or 'unknown'} ({self.cpu_cores} cores, {self.memory_bytes / 2**30:.1f} GiB RAM)"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [dict(gpu, compute_capability=list(gpu["compute_capability"])) for gpu in data["gpus"]]
        data["fingerprint"] = self.fingerprint()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hardware:
        fields = {key: value for key, value in data.items() if key != "fingerprint"}
        fields["gpus"] = tuple(
            GpuInfo(**dict(gpu, compute_capability=tuple(gpu["compute_capability"]))) for gpu in fields.get("gpus", ())
        )
        return cls(**fields)


def _slug(text: str) -> str:
    keep = "".join(ch.lower() if ch.isalnum() else "-" for ch in text.replace("NVIDIA", ""))
    return "-".join(part for part in keep.split("-") if part)[:24] or "gpu"


def available_cores() -> int:
    """CPU cores this process may use (affinity and cgroup aware where the OS says so)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _shm_bytes() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").total
    except OSError:
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe(device: str = "auto") -> Hardware:
    """Describe this machine.

    A visible GPU in MIG mode, or one named by CUDA_VISIBLE_DEVICES=MIG-<uuid>, is recorded as its MIG device: the
    slice's name and memory and the parent's compute capability. CUDA_VISIBLE_DEVICES that CUDA would read as no
    GPU, or as GPUs other than meant, a GPU this torch build has no kernels for, and MIG that does not come down
    to one MIG device are UserErrors under "auto" too: tuning on the CPU instead would silently tune another machine.

    Args:
        device: "auto" (CUDA when NVML sees a GPU and torch is a CUDA build), "cuda" or "cpu".

    Returns:
        The Hardware record; on a CPU, gpus is empty.
    """
    import torch  # torch.version is static metadata: importing torch does not initialise CUDA

    nvml, driver, nvml_problem = nvml_gpus()
    if device == "auto" and nvml and not torch.version.cuda:
        logger.warning(
            "NVML sees %d GPU(s), but torch %s is a CPU-only build; tuning on the CPU", len(nvml), torch.__version__
        )
        gpus: list[GpuInfo] = []
    else:
        gpus = choose_gpus(device, nvml, nvml_problem)
    if gpus and not torch.version.cuda:
        raise UserError(
            f"--device cuda was asked for, but torch {torch.__version__} is a CPU-only build; "
            "install a CUDA build of torch or use --device cpu"
        )
    if gpus:
        check_arch(gpus, str(torch.__version__))
    return Hardware(
        device_type="cuda" if gpus else "cpu",
        gpus=tuple(gpus),
        cpu_model=cpu_model(),
        cpu_cores=available_cores(),
        memory_bytes=_memory_bytes(),
        shm_bytes=_shm_bytes(),
        driver_version=driver,
        torch_version=str(torch.__version__),
        cuda_version=str(torch.version.cuda) if torch.version.cuda else None,
        torchaudio_version=_version("torchaudio"),
    )
