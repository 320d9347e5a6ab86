"""`autotune doctor`: what on this machine will cost a long tuning or training run speed or stability.

Each check is one small function returning a Finding (value, verdict, one-line fix), filed in `CHECKS` by the
`check` decorator; the report lists them in the order registered: the torch build against the GPUs, each GPU
through NVML, the host, the DataLoader's needs, the audio stack and the data's storage.
"""

from __future__ import annotations

import importlib

from autotune.doctor.context import DoctorContext, DoctorRequest
from autotune.doctor.findings import EXIT_FAILED, EXIT_OK, DoctorReport, Finding, Verdict
from autotune.doctor.registry import CHECKS, Check, check, diagnose, examine

# The built-in checks' modules, imported (so registered) in the order the report lists them.
CHECK_MODULES = ("torch_checks", "gpu_checks", "host_checks", "loader_checks", "data_checks")
for _module in CHECK_MODULES:
    importlib.import_module(f"autotune.doctor.{_module}")

__all__ = [
    "CHECKS",
    "EXIT_FAILED",
    "EXIT_OK",
    "Check",
    "DoctorContext",
    "DoctorReport",
    "DoctorRequest",
    "Finding",
    "Verdict",
    "check",
    "diagnose",
    "examine",
]
