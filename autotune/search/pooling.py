"""Pooled estimates: each leader's throughput from its own windows and its neighbours', to choose among leaders.

Why: on a data-bound landscape many configurations lie within a few per cent of the best, and with 5% window noise a
leader's own few windows cannot separate them (benchmarks/README.md#search-at-gpu-scale-simulated). Configurations that
differ in one or two knobs mostly run at similar speeds, so every measured window also says something about its
neighbours. This module fits that once per decision, as a Gaussian process over the configurations (empirical Bayes,
in the log of samples per second):

    log window = f(configuration) + noise,  noise ~ N(0, sigma^2 / w) per window of weight w,
    f ~ GP(mean, lambda^2 * rho^(knobs that differ) + tau^2 * [same configuration])

- sigma^2 is the pooled variance of repeated windows of one configuration (so it needs repeats: before confirmation
  has measured any leader twice there is no estimate, and the caller keeps medians); a window weighs by its length
  (candidates.weighted_logs: a long run's confirmation measures longer windows than its search);
- lambda^2 (how far configurations spread), rho (how alike neighbours are) and tau^2 (what no neighbour predicts)
  maximise the marginal likelihood over a small grid (each knob counts equally; a knob that barely matters on this
  landscape shows as neighbours alike, a large rho);
- the estimate of a configuration is the posterior mean of f at it: its own mean log window, pulled towards what its
  neighbours predict by how few windows it has. With many windows of its own, the estimate is its own mean.

The estimate only chooses (which leaders stay in the race, which wins). What the user sees stays measured: the winner's
reported throughput is the median of its own windows (candidates.Candidate.median).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.search.candidates import Candidate, config_key, pooled_noise, weighted_logs

__all__ = ["MIN_REPEAT_DF", "knob_values", "pooled_estimates"]

MIN_REPEAT_DF = 4  # degrees of freedom of repeated windows before sigma^2 is trusted (four re-measurements)
_RHO = (0.05, 0.3, 0.6, 0.8, 0.95, 0.999)  # how alike configurations one knob apart are, a priori
_SPREAD = (0.3, 1.0, 3.0, 10.0)  # lambda^2, in units of the candidates' spread (variance of their mean log windows)
_OWN = (0.001, 0.01, 0.1, 0.3, 1.0)
_SWEEPS = 2  # tau^2, in the same units


def knob_values(candidate: Candidate) -> tuple[tuple[str, str], ...]:
    """The configuration as (knob, value) pairs: the workload's knobs as knobs of their own."""
    data = candidate.config.to_dict()
    workload = data.pop("workload_knobs", None) or {}
    data.pop("world_size", None)  # the same for every candidate of a run
    pairs = {**data, **{f"workload.{key}": value for key, value in workload.items()}}
    return tuple(sorted((key, repr(value)) for key, value in pairs.items()))


def _differences(candidates: Sequence[Candidate]) -> list[np.ndarray]:
    """For each knob that varies among the candidates: which pairs of configurations differ in it (1) or not (0)."""
    rows = [dict(knob_values(candidate)) for candidate in candidates]
    knobs = sorted({knob for row in rows for knob in row})
    differ = []
    for knob in knobs:
        values = np.array([row.get(knob, "") for row in rows], dtype=object)
        pairs = (values[:, None] != values[None, :]).astype(float)
        if pairs.any():
            differ.append(pairs)
    return differ


@dataclass(slots=True)
class _Prior:
    """The hyperparameters: a per-knob rho (how alike two configurations that differ in that knob only are), the
    spread lambda^2 and the configuration's own part tau^2 (both in units of the candidates' spread)."""

    rho: list[float]
    spread: float = 1.0
    own: float = 0.1

    def covariance(self, differ: list[np.ndarray], scale: float, count: int) -> np.ndarray:
        log_shared = sum((math.log(rho) * pairs for rho, pairs in zip(self.rho, differ, strict=True)), np.zeros(1))
        return scale * (self.spread * np.exp(log_shared) * np.ones((count, count)) + self.own * np.eye(count))


def _likelihood(prior: np.ndarray, means: np.ndarray, noise: np.ndarray) -> tuple[float, np.ndarray]:
    """The log marginal likelihood of the mean log windows (a constant mean fitted by least squares), and the
    posterior means of f at the candidates."""
    try:
        chol = np.linalg.cholesky(prior + np.diag(noise))
    except np.linalg.LinAlgError:
        return -math.inf, means
    whitened = np.linalg.solve(chol, np.column_stack([np.ones(len(means)), means]))
    mean = float(whitened[:, 0] @ whitened[:, 1] / (whitened[:, 0] @ whitened[:, 0]))
    residual = whitened[:, 1] - mean * whitened[:, 0]
    likelihood = -0.5 * float(residual @ residual) - float(np.log(np.diag(chol)).sum())
    return likelihood, mean + prior @ np.linalg.solve(chol.T, residual)


def _fit(differ: list[np.ndarray], means: np.ndarray, noise: np.ndarray, scale: float) -> np.ndarray:
    """The posterior means of f at the candidates, under the hyperparameters of largest marginal likelihood, found
    one at a time (coordinate ascent over small grids, _SWEEPS times): a few hundred factorisations of a matrix the
    size of the candidates, well under a second for a hundred."""
    prior = _Prior(rho=[0.8] * len(differ))
    best, estimates = _likelihood(prior.covariance(differ, scale, len(means)), means, noise)
    for _ in range(_SWEEPS):
        for field_name, index, grid in [("rho", k, _RHO) for k in range(len(differ))] + [
            ("spread", None, _SPREAD),
            ("own", None, _OWN),
        ]:
            for value in grid:
                trial = _Prior(rho=list(prior.rho), spread=prior.spread, own=prior.own)
                if index is None:
                    setattr(trial, field_name, value)
                else:
                    trial.rho[index] = value
                likelihood, fitted = _likelihood(trial.covariance(differ, scale, len(means)), means, noise)
                if likelihood > best:
                    best, estimates, prior = likelihood, fitted, trial
    return estimates


def pooled_estimates(candidates: Sequence[Candidate]) -> dict[str, float] | None:
    """Samples per second of each feasible candidate (by config_key), pooled with its neighbours'; None while
    repeated windows are too few to know the noise (MIN_REPEAT_DF)."""
    measured = [candidate for candidate in candidates if candidate.feasible and any(v > 0 for v in candidate.values)]
    logs = weighted_logs(measured)
    sigma2, df = pooled_noise(logs)
    if df < MIN_REPEAT_DF or len(measured) < 2:
        return None
    sigma2 = max(sigma2, 1e-8)
    means = np.array([sum(x * w for x, w in windows) / sum(w for _, w in windows) for windows in logs])
    noise = np.array([sigma2 / sum(w for _, w in windows) for windows in logs])
    scale = max(float(np.var(means)), sigma2)
    estimates = _fit(_differences(measured), means, noise, scale)
    return {config_key(candidate.config): math.exp(value) for candidate, value in zip(measured, estimates, strict=True)}
