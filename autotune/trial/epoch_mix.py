"""An epoch's rate from a window that saw only some of its batches, where batches differ in what they cost.

A speaker workload's batches are alike (fixed-length crops): any run of them costs what the epoch's average does.
An ASR or TTS epoch is not: WeNet's batching sorts each window of 500 shuffled utterances by length and batches the
sorted run, so consecutive batches go from short clips to long ones (autotune/data/batching.py; wenet-e2e/wenet
wenet/dataset/dataset.py at 6663c3e8 chains shuffle, processor.sort in buffers of sort_size 500, batch and padding, and
nothing reorders the batches after). A timed window covers a stretch of that run. On a GPU a 40-s window holds hundreds
of steps, many sort windows, and the stretch is close to the epoch's mix; where a step is slow (a CPU, a large model) it
holds tens, and its samples per second is the rate of whichever lengths it happened to reach. Because every trial
shuffles with the same seed, a repeat of the same configuration reaches the same stretch: the error does not average out
over repeats, and two configurations whose batches cut the epoch differently are compared on different mixes. How far a
window and the objective below read from whole epochs, on the development CPU (benchmarks/epoch_mix.py):
docs/how-it-measures.md, step 5, and benchmarks/README.md#short-budgets-and-what-a-trial-costs.

The correction: a step's time is modelled as what it costs per step, per second of audio and per sample,
``t = a + b * audio + c * samples`` with a, b, c >= 0, fitted over the window's steps (in blocks of consecutive
steps where there are many: CUDA steps run asynchronously, so a block's total is what is timed reliably). The same
coefficients price the epoch's own batches, audio and samples (counted once per trial from its batch sampler,
trial/sampling.py), and the window's rate is scaled by (epoch samples / predicted epoch time) over (window samples /
predicted window time). With non-negative coefficients that scale lies between the three one-proxy corrections
(per step, per audio second, per sample), so a poorly determined fit cannot push the estimate outside what some
plain cost model gives; where the window's mix is the epoch's, all three are 1 and so is the scale. Where DataLoader
workers prepare batches ahead (a data-bound step waits for a batch prepared a few dozen batches earlier), a block's
time follows batches near, not at, its own; the fit then explains less, and the bounds keep the estimate within
what the window's mix differs from the epoch's, at most about 1% on a GPU's window of hundreds of steps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["EpochMix", "MAX_BLOCKS", "epoch_mix_factor"]

MAX_BLOCKS = 32  # a window's steps are fitted in at most this many blocks of consecutive steps


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochMix:
    """What one rank's epoch holds: batches, samples and seconds of audio (per item, as audio_seconds_in counts)."""

    batches: int
    samples: int
    audio_s: float

    def usable(self) -> bool:
        return self.batches > 0 and self.samples > 0 and self.audio_s > 0


def _fit(rows: list[tuple[float, ...]], times: list[float]) -> tuple[float, ...] | None:
    """Non-negative least squares of times on rows (few columns): the best fit over every set of columns whose
    unconstrained solution is non-negative, which is the constrained optimum. None if nothing fits."""
    import numpy as np

    x, y = np.asarray(rows, dtype=float), np.asarray(times, dtype=float)
    columns = x.shape[1]
    best: tuple[float, tuple[float, ...]] | None = None
    for size in range(1, columns + 1):
        for chosen in itertools.combinations(range(columns), size):
            if size >= len(rows) and size > 1:  # no more unknowns than blocks, beyond a single scale
                continue
            coefficients, *_ = np.linalg.lstsq(x[:, chosen], y, rcond=None)
            if not np.all(np.isfinite(coefficients)) or np.any(coefficients < 0):
                continue
            full = [0.0] * columns
            for column, value in zip(chosen, coefficients, strict=True):
                full[column] = float(value)
            residual = float(np.sum((x @ np.asarray(full) - y) ** 2))
            if best is None or residual < best[0]:
                best = (residual, tuple(full))
    return best[1] if best is not None and any(value > 0 for value in best[1]) else None


def _updates(start: int, stop: int, accum: int) -> int:
    """Optimiser updates among a window's steps start..stop-1: the window starts on an update's boundary (warm-up and
    a trimmed front end on one, trial/loop.py), so the update lands on every accum-th step."""
    return (stop // accum) - (start // accum)


def epoch_mix_factor(
    step_times_s: Sequence[float],
    step_samples: Sequence[int],
    step_audio_s: Sequence[float],
    epoch: EpochMix | None,
    *,
    block_steps: int = 1,
    steps_timed_alone: bool = False,
) -> float:
    """(Epoch samples per second) / (window samples per second) under the fitted cost of a step; 1.0 where it cannot
    be judged (no epoch counted, no audio per step, fewer than two steps).

    block_steps: the fewest steps fitted together (a trial's gradient accumulation: the optimiser's step lands on
    every k-th batch).
    steps_timed_alone: each step's time is its own (one CPU rank: nothing runs asynchronously). The window's whole
    optimiser steps are then fitted step by step, and the optimiser's cost, paid on one batch in k, is a term of its
    own: a slow step's window holds few optimiser steps, and two blocks fit only one cost term, whichever explains
    the two best, so a window of short batches could read as the epoch's (per step) where a + b x audio is the cost.
    """
    steps = len(step_times_s)
    if epoch is None or not epoch.usable() or steps < 2 or len(step_samples) != steps or len(step_audio_s) != steps:
        return 1.0
    if min(step_audio_s) <= 0:
        return 1.0
    accum = max(1, block_steps)
    if steps_timed_alone:
        steps -= steps % accum  # whole optimiser steps: each pays its update once
        size = max(1, math.ceil(steps / MAX_BLOCKS))
    else:
        size = max(1, accum, math.ceil(steps / MAX_BLOCKS))
    # Fitted step by step under accumulation, the optimiser's update is a cost of its own: the k-th batch pays it.
    updates = steps_timed_alone and accum > 1 and size < accum
    rows: list[tuple[float, ...]] = []
    times: list[float] = []
    for start in range(0, steps - size + 1, size):  # whole blocks only: a short last block would weigh like a full one
        stop = start + size
        row = (float(size), float(sum(step_audio_s[start:stop])), float(sum(step_samples[start:stop])))
        rows.append((*row, float(_updates(start, stop, accum))) if updates else row)
        times.append(float(sum(step_times_s[start:stop])))
    if len(rows) < 2:
        return 1.0
    coefficients = _fit(rows, times)
    if coefficients is None:
        return 1.0
    per_step, per_audio_s, per_sample = coefficients[:3]
    per_update = coefficients[3] if updates else 0.0
    used = len(rows) * size
    window_samples = sum(step_samples[:used])
    window_cost = (
        per_step * used
        + per_audio_s * sum(step_audio_s[:used])
        + per_sample * window_samples
        + per_update * _updates(0, used, accum)
    )
    epoch_cost = (
        per_step * epoch.batches
        + per_audio_s * epoch.audio_s
        + per_sample * epoch.samples
        + per_update * epoch.batches / accum
    )
    if window_cost <= 0 or epoch_cost <= 0 or window_samples <= 0:
        return 1.0
    return (epoch.samples / epoch_cost) / (window_samples / window_cost)
