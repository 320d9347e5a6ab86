"""GPU telemetry through NVML during a trial's timed window: utilisation, memory and power.

Optional by design: without the `pynvml` module (nvidia-ml-py), without a driver, or for a metric the GPU does not
support, the fields are None — never a crash. NVML ignores CUDA_VISIBLE_DEVICES, so the trial's GPU is found by the
UUID that torch reports for it, not by index.
"""

from __future__ import annotations

import logging
import statistics
import threading
from types import ModuleType
from typing import Any

__all__ = ["GpuTelemetry", "nvml_uuid"]

logger = logging.getLogger(__name__)


def nvml_uuid(torch_uuid: Any) -> str:
    """NVML's spelling of a GPU UUID ("GPU-xxxxxxxx-..."), from torch's device properties uuid.

    torch prints CUDA's 16 bytes without a prefix, which cannot tell a whole GPU from a MIG slice: GpuTelemetry tries
    the "MIG-" spelling when NVML knows no "GPU-" one.
    """
    text = str(torch_uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _spellings(uuid: str) -> list[str]:
    return [uuid, "MIG-" + uuid.removeprefix("GPU-")] if uuid.startswith("GPU-") else [uuid]


def _import_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuTelemetry:
    """Samples one GPU in a background thread between start() and stop().

    open() does the slow part (NVML's initialisation and the device lookup) before the timed window, so that start(),
    called when every rank has met at the window's edge, only starts a thread: NVML's start-up must not land inside
    the peers' windows.

    Args:
        uuid: the GPU's UUID as NVML spells it.
        interval_s: time between samples.
        nvml: the pynvml module, or a stand-in for tests; None imports nvidia-ml-py's pynvml if present.
    """

    def __init__(self, uuid: str, *, interval_s: float = 0.2, nvml: ModuleType | None = None) -> None:
        self.uuid, self.interval_s = uuid, interval_s
        self.nvml = nvml if nvml is not None else _import_nvml()
        self._handle: Any = None
        self._samples: dict[str, list[float]] = {"utilization": [], "memory": [], "power": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = self._initialised = False
        self.unavailable_reason: str | None = None

    def open(self) -> None:
        """Initialise NVML and find the GPU (once); any NVML problem only disables telemetry."""
        if self._opened:
            return
        self._opened = True
        nvml = self.nvml
        if nvml is None:
            self.unavailable_reason = "pynvml (nvidia-ml-py) is not installed"
            return
        try:
            nvml.nvmlInit()
            self._initialised = True
            self._handle = self._find(nvml)
        except nvml.NVMLError as error:
            self.unavailable_reason = f"NVML unavailable: {error}"
            logger.info("GPU telemetry off: %s", self.unavailable_reason)
            self._handle = None
            self._shutdown()

    def _find(self, nvml: ModuleType) -> Any:
        """The device's handle by UUID, trying a MIG slice's spelling of a bare UUID second (the first error stands)."""
        first_error: Exception | None = None
        for uuid in _spellings(self.uuid):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            except nvml.NVMLError as error:
                first_error = first_error or error
                continue
            self.uuid = uuid
            return handle
        assert first_error is not None  # _spellings() names at least one UUID, and each failed lookup set it
        raise first_error

    def start(self) -> None:
        """Start sampling (opening NVML first if open() was not called)."""
        self.open()
        if self._handle is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="autotune-nvml", daemon=True)
            self._thread.start()

    def _shutdown(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        nvml = self.nvml
        assert nvml is not None  # _initialised is set only after nvml.nvmlInit() ran
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass

    def _read(self, nvml: ModuleType, name: str, call: Any) -> None:
        if name not in self._samples:
            return
        try:
            self._samples[name].append(float(call()))
        except nvml.NVMLError as error:  # NotSupported, NoPermission...: this metric stays None
            logger.debug("NVML metric %s unavailable: %s", name, error)
            del self._samples[name]

    def sample(self) -> None:
        """Take one reading of every metric that still answers."""
        nvml, handle = self.nvml, self._handle
        assert nvml is not None  # sampled only once open() found the GPU, which it cannot do without the module
        self._read(nvml, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        self._read(nvml, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used)
        self._read(nvml, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # milliwatts

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> dict[str, float | int | None]:
        """Stop sampling, close NVML and summarise: mean utilisation %, peak memory used (bytes), mean power (W).

        Calling it again returns the same summary.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._shutdown()
        utilization, memory, power = (self._samples.get(name) or None for name in ("utilization", "memory", "power"))
        return {
            "gpu_utilization_percent": round(statistics.fmean(utilization), 1) if utilization else None,
            "gpu_memory_used_bytes": int(max(memory)) if memory else None,
            "gpu_power_watts": round(statistics.fmean(power), 1) if power else None,
        }
