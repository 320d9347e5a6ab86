"""Decoded audio held as mono 16-bit PCM: its size, one definition for preloading and for the diagnosis's estimate.

Torch-free on purpose: `autotune.result.diagnosis` runs in the parent process, which never imports torch, while
`autotune.data.preload` stores the samples this way; both count bytes with the functions here.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_AMPLITUDE",
    "PCM_BYTES_PER_SAMPLE",
    "PCM_FULL_SCALE",
    "pcm_bytes",
    "pcm_bytes_of_seconds",
    "sample_problem",
]

PCM_BYTES_PER_SAMPLE = 2  # int16: half of float32, and lossless for the 16-bit files speech corpora mostly hold
PCM_FULL_SCALE = 32768.0  # int16 value / PCM_FULL_SCALE = the float in [-1, 1) soundfile decodes the sample to
# Decoded samples lie in [-1, 1] (a float file may overshoot a little); a thousand times that is no recording, and
# training on it (or on NaN or inf) diverges for a reason that is the data's, not the configuration's.
MAX_AMPLITUDE = 1000.0


def pcm_bytes(n_samples: int) -> int:
    """Bytes of n_samples mono samples stored as 16-bit PCM."""
    return n_samples * PCM_BYTES_PER_SAMPLE


def pcm_bytes_of_seconds(seconds: float, sample_rate: int) -> int:
    """Bytes of `seconds` of mono audio at `sample_rate` stored as 16-bit PCM (an estimate from durations)."""
    return pcm_bytes(int(seconds * sample_rate))


def sample_problem(samples: Any) -> str | None:
    """What is wrong with decoded samples (a NumPy array) that no recording holds: non-finite values, or an absurd
    amplitude; None when nothing is."""
    import numpy as np

    if samples.size == 0:
        return None
    if not np.isfinite(samples).all():
        return "non-finite samples (NaN or inf)"
    peak = float(np.abs(samples).max())
    if peak > MAX_AMPLITUDE:
        return f"samples of amplitude {peak:.3g} (decoded audio lies within [-1, 1])"
    return None
