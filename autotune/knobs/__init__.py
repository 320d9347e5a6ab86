"""The tuning knobs, shared by the parent and every child at the bottom of the package: each knob's declaration
(declarations.py), the TrialConfig that holds a value for each (config.py), what a value means to torch (precision,
compile modes, optimizer kernels, feature placement, activation checkpointing), the one set of DataLoader arguments
(dataloader.py) and the one process setup (process.py) that trials and a user's load_config both apply.

Nothing here imports another autotune package but errors and yamlio; everything else derives from these.
"""

from __future__ import annotations

from autotune.knobs.config import TrialConfig
from autotune.knobs.declarations import KNOBS, NAMES, Knob
from autotune.knobs.precision import PRECISIONS, PrecisionSettings

__all__ = ["KNOBS", "NAMES", "PRECISIONS", "Knob", "PrecisionSettings", "TrialConfig"]
