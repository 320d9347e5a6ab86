"""Synthetic noise clips and room impulse responses: the augmentation lists autotune uses when a run names none.

3D-Speaker's speaker recipes corrupt training crops in their DataLoader workers with MUSAN noise and RIRS_NOISES room
responses, listed in wav.scp files (``key path``) passed as ``--noise`` and ``--reverb``. Both are downloads; the
tuner must not need them, yet it must pay what their use costs (decode a noise file and a response, mix, convolve),
because that CPU work is part of what starves GPUs. So autotune generates a small stand-in set once into its cache:

- noise: clips of 4-40 s (MUSAN's free-sound noise, which 3D-Speaker's VoxCeleb recipe lists, averages about 20 s),
  each a coloured noise (spectral slope from white to brown) with a few resonances, a mains hum on some, and a
  slow amplitude modulation (traffic, machinery, crowds swell and fade);
- room responses: 0.3-1.5 s, a direct path after a short delay, sparse early reflections and an exponentially
  decaying, progressively low-passed diffuse tail (RT60 0.2-1.0 s), peak-normalised.

The folder holds ``noise.scp`` and ``rir.scp`` in 3D-Speaker's wav.scp format (paths relative to the folder), the
16-bit WAV files, a README and, written last, ``manifest.json``. The same seed gives the same bytes.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from autotune.data.cache import (
    MANIFEST_NAME,
    canonical_params,
    default_cache_dir,
    ensure_generated,
    params_digest,
    read_manifest,
)

__all__ = ["NOISE_LIST_NAME", "NOISE_SET_VERSION", "REVERB_LIST_NAME", "ensure_noise_set", "generate_noise_set"]

logger = logging.getLogger(__name__)

# Bump when the generator's output changes, so cached sets of the old version are not reused.
NOISE_SET_VERSION = 1
NOISE_LIST_NAME = "noise.scp"
REVERB_LIST_NAME = "rir.scp"


def _noise_clip(rng: np.random.Generator, n_samples: int, sample_rate: int) -> np.ndarray:
    """Coloured noise with resonances, an optional hum and a slow swell, peak-normalised to 0.3-0.9."""
    n_fft = 1 << int(np.ceil(np.log2(n_samples)))
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    slope = rng.uniform(0.0, 2.0)  # 0 white, 1 pink, 2 brown
    gain = 1.0 / np.maximum(freqs, 20.0) ** (slope / 2)
    for _ in range(int(rng.integers(0, 4))):  # a few broad resonances (a fan's housing, a room mode)
        centre, width = rng.uniform(100.0, 6000.0), rng.uniform(50.0, 800.0)
        gain = gain * (1.0 + rng.uniform(1.0, 8.0) * np.exp(-0.5 * ((freqs - centre) / width) ** 2))
    spectrum = (rng.standard_normal(freqs.size) + 1j * rng.standard_normal(freqs.size)) * gain
    clip = np.fft.irfft(spectrum, n_fft)[:n_samples]
    clip /= np.abs(clip).max() + 1e-12
    t = np.arange(n_samples) / sample_rate
    if rng.random() < 0.3:  # mains hum with a few harmonics
        mains = rng.choice([50.0, 60.0])
        hum = sum(
            rng.uniform(0.05, 0.3) / k * np.sin(2 * np.pi * k * mains * t + rng.uniform(0, 6.3)) for k in (1, 2, 3)
        )
        clip = clip + hum
    swell = 1.0 + rng.uniform(0.0, 0.8) * np.sin(2 * np.pi * rng.uniform(0.05, 2.0) * t + rng.uniform(0, 6.3))
    clip = clip * swell
    return clip * (rng.uniform(0.3, 0.9) / (np.abs(clip).max() + 1e-12))


def _room_response(rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Direct path, early reflections and a decaying, darkening diffuse tail; peak-normalised to 0.9."""
    rt60 = rng.uniform(0.2, 1.0)
    n_samples = int(np.clip(rng.uniform(1.0, 1.5) * rt60, 0.3, 1.5) * sample_rate)
    t = np.arange(n_samples) / sample_rate
    delay = int(rng.uniform(0.0, 0.005) * sample_rate)
    response = np.zeros(n_samples)
    early = delay + (rng.uniform(0.002, 0.05, size=int(rng.integers(6, 13))) * sample_rate).astype(int)
    early = early[early < n_samples]
    response[early] += rng.uniform(0.2, 0.7, size=early.size) * rng.choice([-1.0, 1.0], size=early.size)
    tail = rng.standard_normal(n_samples) * np.exp(-6.91 * t / rt60) * rng.uniform(0.05, 0.3)  # -60 dB at rt60
    tail[: delay + 1] = 0.0
    # High frequencies die first: crossfade from the raw tail to a low-passed copy (9-tap moving average) as it decays.
    darkening = np.minimum(0.9, t / rt60)
    tail = (1.0 - darkening) * tail + darkening * np.convolve(tail, np.ones(9) / 9, mode="same")
    response += tail
    response[delay] = max(1.0, 1.25 * float(np.abs(response[delay + 1 :]).max()))  # the direct path leads
    return response * (0.9 / np.abs(response).max())


def generate_noise_set(
    out_dir: str | os.PathLike[str],
    *,
    n_noise: int = 16,
    min_noise_s: float = 4.0,
    max_noise_s: float = 40.0,
    n_rirs: int = 24,
    sample_rate: int = 16000,
    seed: int = 0,
) -> Path:
    """Write synthetic noise clips and room responses with their wav.scp lists.

    Args:
        out_dir: folder to write into (created if missing).
        n_noise: noise clips, ``noise/noiseNN.wav``.
        min_noise_s: shortest clip.
        max_noise_s: longest clip; durations are uniform in between.
        n_rirs: room responses, ``rir/rirNN.wav``.
        sample_rate: of every file (3D-Speaker requires 16 kHz).
        seed: seed for everything random.

    Returns:
        The folder, with ``noise.scp``, ``rir.scp``, ``README.txt`` and, written last, ``manifest.json``.
    """
    if n_noise < 1 or n_rirs < 1 or not 1.0 <= min_noise_s <= max_noise_s:
        raise ValueError("need n_noise >= 1, n_rirs >= 1 and 1 <= min_noise_s <= max_noise_s")
    started = time.perf_counter()
    out = Path(out_dir)
    params = _params(
        n_noise=n_noise,
        min_noise_s=min_noise_s,
        max_noise_s=max_noise_s,
        n_rirs=n_rirs,
        sample_rate=sample_rate,
        seed=seed,
    )
    lists: dict[str, list[str]] = {NOISE_LIST_NAME: [], REVERB_LIST_NAME: []}
    for kind, count, list_name in (("noise", n_noise, NOISE_LIST_NAME), ("rir", n_rirs, REVERB_LIST_NAME)):
        (out / kind).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            rng = np.random.default_rng([seed, 0 if kind == "noise" else 1, index])
            if kind == "noise":
                audio = _noise_clip(rng, round(rng.uniform(min_noise_s, max_noise_s) * sample_rate), sample_rate)
            else:
                audio = _room_response(rng, sample_rate)
            rel = f"{kind}/{kind}{index:02d}.wav"
            sf.write(out / rel, np.round(audio * 32767.0).astype(np.int16), sample_rate, subtype="PCM_16")
            lists[list_name].append(f"{kind}{index:02d} {rel}\n")
    for list_name, lines in lists.items():
        (out / list_name).write_text("".join(lines))
    (out / "README.txt").write_text(
        "SYNTHETIC noise clips and room impulse responses generated by autotune (autotune/data/synth_noise.py, "
        f"version {NOISE_SET_VERSION}) as stand-ins for MUSAN and RIRS_NOISES.\nParameters: "
        f"{json.dumps(params, sort_keys=True)}\nLists: {NOISE_LIST_NAME}, {REVERB_LIST_NAME} (wav.scp: key path).\n"
    )
    manifest = {"noise_set_version": NOISE_SET_VERSION, "params": params}
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    logger.info(
        "generated %d noise clips and %d room responses in %.1f s", n_noise, n_rirs, time.perf_counter() - started
    )
    return out


_GENERATE_SIGNATURE = inspect.signature(generate_noise_set)


def _params(**kwargs: Any) -> dict[str, Any]:
    """The generation parameters in canonical, JSON-ready form: `generate_noise_set`'s defaults updated by kwargs."""
    return canonical_params(_GENERATE_SIGNATURE, **kwargs)


def _is_complete(folder: Path, params: dict[str, Any]) -> bool:
    manifest = read_manifest(folder)
    return (
        manifest is not None
        and manifest.get("noise_set_version") == NOISE_SET_VERSION
        and manifest.get("params") == params
    )


def ensure_noise_set(cache_dir: str | os.PathLike[str] | None = None, **generate_kwargs: Any) -> Path:
    """Return the cached synthetic noise set for these parameters, generating it on first use (about a second).

    Args:
        cache_dir: cache root; defaults to `autotune.data.cache.default_cache_dir()`.
        **generate_kwargs: keyword arguments of `generate_noise_set` (not out_dir).

    Returns:
        The folder ``<cache>/noise-v{NOISE_SET_VERSION}-<params hash>/``, holding ``noise.scp`` and ``rir.scp``.

    Raises:
        DataError: the cache cannot be written.
    """
    params = _params(**generate_kwargs)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    mean_s = params["n_noise"] * (params["min_noise_s"] + params["max_noise_s"]) / 2 + params["n_rirs"] * 1.5
    return ensure_generated(
        cache / f"noise-v{NOISE_SET_VERSION}-{params_digest(params)}",
        is_complete=lambda folder: _is_complete(folder, params),
        generate=lambda folder: generate_noise_set(folder, **params),
        size_mb=max(1, round(mean_s * params["sample_rate"] * 2 / 1e6)),
        what="the synthetic noise and room responses",
    )
