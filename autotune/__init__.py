"""autotune: measure, don't guess, the fastest stable training configuration for speech models."""

from __future__ import annotations

__version__ = "0.1.0"

from autotune.errors import UserError  # noqa: E402
from autotune.exports import export  # noqa: E402
from autotune.result.measurements import Measurements  # noqa: E402
from autotune.result.tuned_config import TunedConfig, load_config  # noqa: E402
from autotune.workloads import TrainingSetup, Workload, WorkloadContext  # noqa: E402

# What users may import (docs/api.md; tests/test_public_api.py holds the two together). Everything else is internal:
# its modules may move or change between versions, as optuna keeps its own behind optuna.samplers and friends.
__all__ = [
    "Measurements",
    "TrainingSetup",
    "TunedConfig",
    "UserError",
    "Workload",
    "WorkloadContext",
    "__version__",
    "export",
    "load_config",
]
