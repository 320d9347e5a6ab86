"""The simulated trial: a launcher that answers the real Tuner from a landscape (benchmarks/landscapes.py), on its own
clock. A window is drawn around the configuration's modelled throughput with the landscape's noise (per trial, or
falling with the window's length where the noise is white), at its modelled wall time; an out-of-memory trial ends
in its first steps; the pruner is asked as a live trial asks it. Used by simulate.py."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.search.candidates import config_key  # noqa: E402
from autotune.trial import TrialResult, TrialSpec
from autotune.trial.steady import STARTUP_STEPS
from benchmarks.landscapes import GIB, Landscape  # noqa: E402

__all__ = ["Simulator"]


class Simulator:
    """A trial launcher over a landscape, on its own clock."""

    def __init__(self, landscape: Landscape, seed: int, reference: Landscape | None = None) -> None:
        """reference: where the window's noise is white (as an H200's was, benchmarks/results/budget-lab/
        window_noise-h200.md), the landscape as shipped, at whose window lengths its noise is calibrated: a window of
        another length draws noise * sqrt(shipped window / this window)."""
        self.landscape, self.rng, self.now = landscape, random.Random(seed), 0.0
        self.reference = reference
        self.expected: dict[tuple[str, float], Any] = {}
        self.shipped_window_s: dict[str, float] = {}

    def _noise(self, key: str, config: TrialConfig, window_s: float) -> float:
        if self.reference is None or window_s <= 0:
            return self.landscape.noise
        if key not in self.shipped_window_s:
            self.shipped_window_s[key] = self.reference.evaluate(config).window_s
        shipped = self.shipped_window_s[key]
        return self.landscape.noise * math.sqrt(shipped / window_s) if shipped > 0 else self.landscape.noise

    def clock(self) -> float:
        return self.now

    def __call__(self, spec: TrialSpec, *, should_prune: Any = None, **_: object) -> TrialResult:
        key = config_key(spec.config)
        expected = self._expected(key, spec)
        memory = {
            "peak_memory_bytes": int(expected.peak_memory_gib * GIB),
            "memory_capacity_bytes": int(self.landscape.machine.gpu_memory_gib * GIB),
        }
        if expected.status == "oom":
            return self._end(expected.wall_s, TrialResult(status="oom", reason="simulated"))
        if should_prune is not None and (pruned := self._pruned(expected, should_prune)) is not None:
            return pruned
        if expected.status != "ok":
            return self._end(expected.wall_s, TrialResult(status=expected.status, reason="simulated", **memory))
        noise = self._noise(key, spec.config, expected.window_s)
        window = expected.samples_per_second * math.exp(self.rng.gauss(0.0, noise))
        result = TrialResult(
            status="ok",
            samples_per_second=window,
            window_samples_per_second=window,
            data_wait_fraction=expected.data_wait_fraction,
            step_time_median_s=expected.step_s,
            window_s=expected.window_s,
            **memory,
        )
        return self._end(expected.wall_s, result)

    def _expected(self, key: str, spec: TrialSpec) -> Any:
        """The landscape's figures for the trial, at the trial's own timing where it asks for a longer window (a long
        run's confirmation: TimingSettings.window_at_least_s)."""
        landscape, at_least = self.landscape, spec.timing.window_at_least_s
        if at_least > self.landscape.timing.window_at_least_s:
            landscape = dataclasses.replace(
                landscape, timing=dataclasses.replace(landscape.timing, window_at_least_s=at_least)
            )
        cached = (key, at_least)
        return self.expected.get(cached) or self.expected.setdefault(cached, landscape.evaluate(spec.config))

    def _pruned(self, expected: Any, should_prune: Any) -> TrialResult | None:
        """Ask the pruner as a live trial does: on a warm-up step (slower than steady state), then a quarter into
        the window (a short stretch: twice the window's noise)."""
        rate = expected.samples_per_second
        warmup = rate * self.rng.uniform(0.7, 1.0)
        # Each reading names the steps it covers, as trial/child.py's does (search/pruning.py holds a warm-up reading
        # to its bar by them): the settled warm-up steps after the first STARTUP_STEPS where the landscape's warm-up
        # has two of them, else the second step alone; the window's steps after the whole warm-up.
        settled = self.landscape.warmup_steps - STARTUP_STEPS
        span = (STARTUP_STEPS, settled) if settled >= 2 else (1, 1)
        reading = {"phase": "warmup", "samples_per_second": warmup, "elapsed_s": 0.0}
        reading |= {"after_steps": span[0], "steps": span[1], "seconds": span[1] * expected.warmup_step_s}
        reason = should_prune(reading)
        if reason:
            return self._end(
                expected.until_window_s - (self.landscape.warmup_steps - 2) * expected.warmup_step_s,
                TrialResult(status="pruned", reason=reason),
            )
        quarter = 0.25 * self.landscape.timing.window_s
        early = rate * math.exp(self.rng.gauss(0.0, 2 * self.landscape.noise))
        steps = max(2, int(quarter / expected.step_s)) if expected.step_s > 0 else 2
        reading = {"phase": "window", "samples_per_second": early, "elapsed_s": quarter}
        reading |= {"after_steps": self.landscape.warmup_steps, "steps": steps, "seconds": quarter}
        reason = should_prune(reading)
        if reason:
            return self._end(expected.until_window_s + quarter, TrialResult(status="pruned", reason=reason))
        return None

    def _end(self, wall_s: float, result: TrialResult) -> TrialResult:
        self.now += wall_s
        result.wall_s = wall_s
        return result
