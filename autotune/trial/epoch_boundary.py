"""What a new epoch costs the training loop: the wait for its first batch, measured at a real epoch's end.

A trial's batch sampler cycles epochs inside one iterator (sampling.py), so its window never sees an epoch end. Real
training does, every epoch: the sampler runs out, the workers finish the batches they hold and then sit idle, and
the next epoch's iterator starts them again (persistent workers) or starts new ones (otherwise: the old ones shut
down, new processes start). Its first batch then takes a whole batch's preparation by one worker, with nothing
prefetched, persistent workers or not. Where an epoch is a few fast steps, that wait is a large share of training,
and a trial that charged persistent workers nothing per epoch overstated what a plain loop reaches (the H200 case:
docs/how-it-measures.md, step 5).

So after its window a trial ends an epoch as training does (CycledEpochs.end_epoch, then the loader runs dry), starts
the next one, and times from the call that ran into the epoch's end to the new epoch's first batch (B). What that
costs a loop depends on where it was waiting: the workers all start the new epoch at once, so their first batches
arrive together after B, and in steady state the loop would have waited its mean wait per step (w) for each of them.
The extra is B - workers x w: the whole B for a loop that never waited (the usual case: prefetching hid the batches'
preparation), next to nothing for a data-bound one (its workers were the pace anyway; they only restart in step).
The run length charges it once per epoch (run_length.py). It is measured where it can matter: a cold start of the
loader of at least MEASURED_FRACTION of an epoch's time; below that the charge is the cold start without persistent
workers and nothing with them (either way within that fraction of the truth).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from autotune.trial.sampling import CycledEpochs

__all__ = ["MEASURED_FRACTION", "epoch_boundary_s", "worth_measuring"]

MEASURED_FRACTION = 0.01  # of an epoch's time: a loader start-up below it changes the objective by less


def worth_measuring(*, num_workers: int, loader_start_s: float, epoch_s: float) -> bool:
    """Whether a new epoch's cost could change the objective by MEASURED_FRACTION: only with worker processes (without
    them a step prepares its own batch, in the window like every other), and only where the loader's cold start (an
    upper bound: process start and the first batch) is that large a share of an epoch."""
    return num_workers > 0 and loader_start_s > MEASURED_FRACTION * epoch_s


def epoch_boundary_s(loader: Any, batches: Iterator[Any], *, steady_wait_s: float) -> float:
    """End the epoch `batches` is in, start the next one, and return what the new epoch costs the loop (module doc).

    Args:
        loader: the trial's DataLoader (its batch sampler a CycledEpochs); iterated again for the next epoch.
        batches: its current iterator, after the window; run dry here, as the epoch's end runs the loader dry.
        steady_wait_s: the window's mean wait per step: the first batch of each worker would have cost that much.
    """
    sampler = loader.batch_sampler
    if not isinstance(sampler, CycledEpochs):
        raise TypeError("the epoch boundary is measured on a trial's loader (a CycledEpochs batch sampler)")
    sampler.end_epoch()
    while True:  # the batches the workers hold; the last call meets the epoch's end (and, without persistence, joins)
        started = time.perf_counter()
        try:
            next(batches)
        except StopIteration:
            break
    following = iter(loader)  # the next epoch: persistent workers resume, others start anew
    next(following)
    ended = time.perf_counter()  # before `following` goes: new workers' shutdown is no part of the epoch's start
    workers = max(1, int(getattr(loader, "num_workers", 1) or 1))
    del following
    return max(0.0, ended - started - workers * steady_wait_s)
