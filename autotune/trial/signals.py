"""Names and hints for signals that kill trials."""

from __future__ import annotations

import signal

__all__ = ["describe_signal", "describe_signal_name"]

_HINTS = {
    "SIGBUS": "shared memory (/dev/shm) is probably exhausted: enlarge it (docker --shm-size, a bigger tmpfs) or "
    "use torch.multiprocessing.set_sharing_strategy('file_system'), or use fewer workers / a smaller prefetch",
    "SIGKILL": "likely the kernel's out-of-memory killer: lower the batch size, workers or prefetch depth",
    "SIGSEGV": "a crash in native code (a library or driver bug); the log tail may say where",
}


def describe_signal(number: int) -> str:
    """'SIGBUS (bus error): hint...' for a signal number."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    return describe_signal_name(name)


def describe_signal_name(name: str) -> str:
    """Name plus fix hint; accepts 'SIGBUS' or the description DataLoader prints ('Bus error')."""
    by_description = {"bus error": "SIGBUS", "killed": "SIGKILL", "segmentation fault": "SIGSEGV"}
    name = by_description.get(name.strip().lower(), name.strip())
    hint = _HINTS.get(name)
    return f"{name}: {hint}" if hint else name
