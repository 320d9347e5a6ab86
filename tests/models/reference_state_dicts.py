"""Reference implementations' state-dict layouts and recorded outputs, kept as JSON test data under ``reference/``.

Each file was made by running the reference repository's own model code at a named commit (its header says which
files, which configuration and how). A test builds autotune's model, compares the key -> shape list exactly and loads
a state dict of exactly those keys with ``strict=True``: a checkpoint of the reference then loads into ours.

`pattern_state` fills a state dict with values that depend only on each key's name and shape, so that the same
weights can be written into the reference model and into ours without storing them; the recorded outputs of the
reference for such weights and a `pattern` input are then compared with ours.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import torch

__all__ = ["REFERENCE_DIR", "full_rank_pattern_state", "load_reference", "pattern", "pattern_state", "shapes_of"]

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
# Buffers the reference computes from its configuration rather than learns: left as each model builds them.
_SCRAMBLE_STRIDE = 7919  # a prime: i -> i * stride mod n permutes the flat index of every tensor here
_COMPUTED_BUFFERS = ("pe", "position_enc", "pitch_bins", "energy_bins")


def load_reference(name: str) -> dict[str, Any]:
    """The JSON record ``reference/<name>.json``; ``state_dict`` becomes an ordered {key: shape tuple}."""
    record = json.loads((REFERENCE_DIR / f"{name}.json").read_text())
    record["state_dict"] = {key: tuple(shape) for key, shape in record["state_dict"]}
    return record


def shapes_of(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """{key: shape} of a state dict, in its order."""
    return {key: tuple(value.shape) for key, value in state.items()}


def pattern(shape: tuple[int, ...] | list[int], seed: float, scale: float = 0.2) -> torch.Tensor:
    """A deterministic float32 tensor: scale * sin(0.91 * i + seed) over its flat index i."""
    count = math.prod(shape)
    return (scale * torch.sin(0.91 * torch.arange(count, dtype=torch.float64) + seed)).float().reshape(shape)


def pattern_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``state`` with every learned tensor replaced by a `pattern` seeded by its key's CRC-32.

    Running variances and inverse deviations stay positive; integer counters become 0; the buffers a model computes
    from its configuration (position tables, pitch/energy bins) are kept as they are.
    """
    filled: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        leaf = key.rsplit(".", 1)[-1]
        seed = zlib.crc32(key.encode()) % 1000 / 100.0
        if leaf in _COMPUTED_BUFFERS:
            filled[key] = value.clone()
        elif not value.is_floating_point():
            filled[key] = torch.zeros_like(value)
        elif leaf in ("running_var", "istd"):
            filled[key] = 1.0 + pattern(value.shape, seed, scale=0.5) ** 2
        else:
            filled[key] = pattern(value.shape, seed)
    return filled


def full_rank_pattern_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`pattern_state`, with every tensor of two or more dimensions at amplitude 1.0 and its values scrambled.

    pattern_state's matrices, scale * sin(0.91 * (row * columns + column) + seed), have rank 2 and scale 0.2: the
    attention is then nearly uniform and a wrong mask moves the loss by under 1e-5. Value i of the flat tensor taken
    from position i * 7919 mod n breaks the rank; at amplitude 1.0 the same mistakes move the loss by about 1%.
    """
    filled = pattern_state(state)
    for key, value in filled.items():
        if value.is_floating_point() and value.dim() >= 2:
            count = value.numel()
            assert math.gcd(_SCRAMBLE_STRIDE, count) == 1, key
            order = torch.arange(count) * _SCRAMBLE_STRIDE % count
            filled[key] = 5.0 * value.flatten()[order].reshape(value.shape)
    return filled
