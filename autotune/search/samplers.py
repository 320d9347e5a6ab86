"""Optuna samplers for the search, and the grid walked point by point."""

from __future__ import annotations

import random
import warnings
from typing import TYPE_CHECKING, Any

import optuna

if TYPE_CHECKING:
    from autotune.space.search_space import SearchSpace

__all__ = ["make_sampler", "grid_points"]


def make_sampler(name: str, space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """TPE suits tens of trials over a mixed, conditional space; random and grid serve comparisons."""
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # group=True is marked experimental
            # constant_liar: a trial still RUNNING (in flight beside this one with --parallel, or another controller's
            # on a shared study) counts as a bad one, so parallel asks do not all land on the same point; with none
            # running, the points are the same as without it.
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, n_startup_trials=4, constant_liar=True
            )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        # The grid is walked point by point; GridSampler's study.stop() only works
        # inside study.optimize, and our ask-and-tell loop lives outside it (grid_points below).
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


def grid_points(space: SearchSpace, seed: int) -> list[dict[str, Any]]:
    """Every configuration of a finite space, in a seeded random order (so a cut-short grid is still a fair
    sample)."""
    points = space.points()
    random.Random(seed).shuffle(points)
    return points
