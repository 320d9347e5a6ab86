"""Reference state-dict lists (tests/reference/*.json, recorded from 3D-Speaker and SpeechBrain) and deterministic
weights, so a test can run our model with the reference's numbers without the reference's code."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "reference"


def load_reference(name: str) -> dict[str, Any]:
    """A recorded reference file: repository, commit, file, class, arguments, state_dict (key -> shape), heads."""
    return json.loads((REFERENCE_DIR / f"{name}.json").read_text())


def reference_shapes(name: str) -> dict[str, list[int]]:
    return load_reference(name)["state_dict"]


def deterministic_state(shapes: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """A state dict of exactly these keys and shapes whose values depend only on the key's position and shape.

    Weights are smooth sines scaled by 1/sqrt(fan-in) (activations stay O(1) through deep nets), BN running variances
    lie in [0.5, 1.5], running means are small and batch counters 0: the same numbers in any implementation.
    """
    state = {}
    for index, (key, shape) in enumerate(shapes.items()):
        numel = math.prod(shape)
        if key.endswith("num_batches_tracked"):
            state[key] = torch.zeros(shape, dtype=torch.int64)
            continue
        wave = torch.sin(0.731 * torch.arange(numel, dtype=torch.float64) + 0.37 * index)
        if key.endswith("running_var"):
            values = 1.0 + 0.5 * wave
        elif key.endswith(("running_mean", "bias")):
            values = 0.05 * wave
        elif key.endswith("weight") and len(shape) == 1:  # a norm's scale
            values = 1.0 + 0.2 * wave
        else:
            values = wave * math.sqrt(3.0 / max(1, numel // shape[0]))
        state[key] = values.to(torch.float32).reshape(shape)
    return state


def deterministic_features(batch: int = 2, frames: int = 64, bins: int = 80) -> torch.Tensor:
    """(batch, frames, bins) fbank-like input, the same numbers everywhere."""
    grid = torch.arange(batch * frames * bins, dtype=torch.float64)
    values = torch.sin(0.013 * grid) + 0.5 * torch.cos(0.0021 * grid + 1.0)
    return values.to(torch.float32).reshape(batch, frames, bins)
