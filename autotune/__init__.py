"""autotune: measure, don't guess, the fastest stable training configuration for speech models."""

from __future__ import annotations

__version__ = "0.1.0"

from autotune.errors import UserError  # noqa: E402
from autotune.results import TunedConfig, load_config  # noqa: E402
from autotune.workloads import TrainingSetup, Workload, WorkloadContext  # noqa: E402

__all__ = ["TrainingSetup", "TunedConfig", "UserError", "Workload", "WorkloadContext", "__version__", "load_config"]
