"""The one process setup of a configuration: intra-op threads and the precision's backend flags.

A trial child, the AMP check's curves and a user's load_config(...).apply_backend_flags() all run this, so the
threads and flags a trial measured with are the ones handed over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.knobs.precision import PrecisionSettings

__all__ = ["apply_process_settings"]


def apply_process_settings(config: TrialConfig, precision: PrecisionSettings) -> str:
    """Set this process's intra-op threads (where the configuration fixes them) and the precision's backend flags
    (TF32 through both of torch's APIs where it has two, cudnn.benchmark); returns the TF32 API used
    (knobs/precision.py apply_backend_flags)."""
    if config.intra_op_threads is not None:
        import torch

        torch.set_num_threads(config.intra_op_threads)
    return precision.apply_backend_flags()
