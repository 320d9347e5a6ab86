"""The embedded default corpus: synthetic multi-speaker speech-like audio, generated once into a cache folder.

Throughput tuning needs audio that costs what real audio costs to decode, crop and featurise, and speakers a
classifier can tell apart (so the loss behaves), but no download. Each speaker is a small source-filter voice: a
jittered, vibrato-modulated glottal pulse train plus aspiration noise, shaped by the speaker's own formants,
bandwidths and spectral tilt, spoken as syllables at the speaker's own rate.

Every file also has a transcript for ASR: the vowels of its syllables as characters, one character per syllable and
no spaces (``"aeio"``), as an AISHELL transcript has one character per Mandarin syllable. A syllable is transcribed
when its midpoint lies inside the file (the last one may be cut short). The corpus folder holds them three ways: in
``manifest.json``, as a Kaldi ``text`` file and as a WeNet raw ``data.list`` (JSON lines key/wav/txt, plus the
speaker as ``spk``, which WeNet ignores). Keys are the file stems (``spk000_utt000``); audio paths in data.list are
relative to the corpus folder (autotune resolves them there; WeNet resolves paths against its working directory).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from dataclasses import dataclass
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

__all__ = ["CORPUS_VERSION", "VOWELS", "ensure_corpus", "generate_corpus"]

logger = logging.getLogger(__name__)

# Bump when the generator's output changes, so cached corpora of the old version are not reused.
# 2: transcripts (text, data.list, manifest "text"); the audio is the same bytes as version 1.
CORPUS_VERSION = 2
README_NAME = "README.txt"
TEXT_NAME = "text"
DATA_LIST_NAME = "data.list"
VOWELS = "aeiou"  # the characters of transcripts, in the row order of _VOWEL_FORMANTS_HZ

# Average adult-male formants F1-F4 (Hz) of five vowels (Peterson & Barney style values); speakers scale them.
_VOWEL_FORMANTS_HZ = np.array(
    [
        [730.0, 1090.0, 2440.0, 3400.0],  # a
        [530.0, 1840.0, 2480.0, 3500.0],  # e
        [270.0, 2290.0, 3010.0, 3700.0],  # i
        [570.0, 840.0, 2410.0, 3400.0],  # o
        [300.0, 870.0, 2240.0, 3400.0],  # u
    ]
)
# Room after each syllable for the formant resonances to ring out (bandwidth >= 40 Hz decays within ~25 ms).
_TAIL_S = 0.04


@dataclass(frozen=True, kw_only=True, slots=True)
class _Voice:
    """One synthetic speaker's fixed characteristics."""

    f0_low_hz: float
    f0_high_hz: float
    formant_scale: float  # vocal-tract length: shorter tracts raise every formant
    formant_jitter: np.ndarray  # per-formant multiplicative offsets, the speaker's "accent"
    bandwidths_hz: np.ndarray
    colour_hz: float  # an extra fixed resonance (think nasal or "singer's formant"), a strong speaker cue
    colour_bandwidth_hz: float
    tilt_hz: float  # corner of the glottal source's -6 dB/octave roll-off
    breathiness: float  # aspiration noise power relative to the pulse train
    syllables_per_s: float
    vibrato_hz: float
    vibrato_depth: float
    jitter: float  # period jitter as a fraction of the period


def _make_voice(rng: np.random.Generator, speaker_index: int) -> _Voice:
    """Draw a speaker; alternating low and high voices keeps neighbouring speakers clearly apart."""
    high = speaker_index % 2 == 1
    f0_centre = rng.uniform(170.0, 250.0) if high else rng.uniform(90.0, 150.0)
    f0_spread = rng.uniform(0.12, 0.3)
    scale = rng.uniform(1.08, 1.22) if high else rng.uniform(0.88, 1.02)
    return _Voice(
        f0_low_hz=f0_centre * (1.0 - f0_spread),
        f0_high_hz=f0_centre * (1.0 + f0_spread),
        formant_scale=scale,
        formant_jitter=rng.uniform(0.88, 1.12, size=4),
        bandwidths_hz=rng.uniform(40.0, 110.0) * np.array([1.0, 1.3, 1.8, 2.4]) * rng.uniform(0.8, 1.2, size=4),
        colour_hz=rng.uniform(1500.0, 5000.0),
        colour_bandwidth_hz=rng.uniform(150.0, 600.0),
        tilt_hz=rng.uniform(150.0, 600.0),
        breathiness=rng.uniform(0.02, 0.5),
        syllables_per_s=rng.uniform(3.0, 6.5),
        vibrato_hz=rng.uniform(4.0, 7.0),
        vibrato_depth=rng.uniform(0.003, 0.02),
        jitter=rng.uniform(0.005, 0.025),
    )


def _excitation(voice: _Voice, rng: np.random.Generator, n_samples: int, sample_rate: int) -> np.ndarray:
    """Pulse train with glide, vibrato, jitter and shimmer, plus aspiration noise, under a syllable envelope."""
    t = np.arange(n_samples) / sample_rate
    f0_start = rng.uniform(voice.f0_low_hz, voice.f0_high_hz)
    glide = rng.uniform(-0.2, 0.1) * t / max(t[-1], 1e-3)
    vibrato = voice.vibrato_depth * np.sin(2 * np.pi * voice.vibrato_hz * t + rng.uniform(0, 2 * np.pi))
    f0 = f0_start * (1.0 + glide + vibrato)
    periods = np.floor(np.cumsum(f0) / sample_rate)
    pulses = np.flatnonzero(np.diff(periods, prepend=0.0) > 0)
    pulses = pulses + np.round(rng.normal(0.0, voice.jitter * sample_rate / f0_start, pulses.size)).astype(np.int64)
    pulses = np.clip(pulses, 0, n_samples - 1)
    source = np.zeros(n_samples)
    source[pulses] = 1.0 + 0.1 * rng.standard_normal(pulses.size)
    # Noise power matched to the pulse train's (f0 / rate per sample) so breathiness is a ratio.
    noise_std = np.sqrt(voice.breathiness * f0_start / sample_rate)
    source += noise_std * rng.standard_normal(n_samples)
    ramp = max(1, int(0.2 * n_samples))
    envelope = np.ones(n_samples)
    envelope[:ramp] = np.sin(0.5 * np.pi * np.arange(ramp) / ramp) ** 2
    envelope[n_samples - ramp :] = envelope[:ramp][::-1]
    return source * envelope


def _vocal_tract(voice: _Voice, rng: np.random.Generator, freqs_hz: np.ndarray) -> tuple[np.ndarray, int]:
    """Complex response of a cascade of formant resonators for a random vowel, times the glottal tilt; and the vowel."""
    vowel_index = int(rng.integers(len(_VOWEL_FORMANTS_HZ)))
    vowel = _VOWEL_FORMANTS_HZ[vowel_index]
    formants = vowel * voice.formant_scale * voice.formant_jitter * rng.uniform(0.95, 1.05, size=4)
    response = 1.0 / (1.0 + 1j * freqs_hz / voice.tilt_hz)
    centres = np.append(formants, voice.colour_hz)
    bandwidths = np.append(voice.bandwidths_hz, voice.colour_bandwidth_hz)
    for centre, bandwidth in zip(centres, bandwidths, strict=True):
        response = response * (centre**2 / (centre**2 - freqs_hz**2 + 1j * freqs_hz * bandwidth))
    return response, vowel_index


def _syllable(voice: _Voice, rng: np.random.Generator, n_samples: int, sample_rate: int) -> tuple[np.ndarray, int]:
    """One voiced syllable, filtered in the frequency domain: n_samples plus a ringing tail, and its vowel index."""
    n_fft = 1 << int(np.ceil(np.log2(n_samples + int(_TAIL_S * sample_rate))))
    spectrum = np.fft.rfft(_excitation(voice, rng, n_samples, sample_rate), n_fft)
    response, vowel_index = _vocal_tract(voice, rng, np.fft.rfftfreq(n_fft, 1.0 / sample_rate))
    spectrum *= response
    audio = np.fft.irfft(spectrum, n_fft)[: n_samples + int(_TAIL_S * sample_rate)] * rng.uniform(0.4, 1.0)
    return audio, vowel_index


def _utterance(voice: _Voice, rng: np.random.Generator, n_samples: int, sample_rate: int) -> tuple[np.ndarray, str]:
    """Syllables separated by short pauses, plus a low noise floor, peak-normalised to [-1, 1]; and the transcript."""
    out = np.zeros(n_samples + int(_TAIL_S * sample_rate))
    vowels: list[str] = []
    pos = int(rng.uniform(0.02, 0.2) * sample_rate)
    while pos < n_samples:
        length = int(sample_rate * rng.uniform(0.5, 0.9) / voice.syllables_per_s)
        syllable, vowel_index = _syllable(voice, rng, max(length, 64), sample_rate)
        if pos + max(length, 64) // 2 < n_samples:  # its midpoint is heard: transcribe it
            vowels.append(VOWELS[vowel_index])
        end = min(pos + syllable.size, out.size)
        out[pos:end] += syllable[: end - pos]
        # Mostly short gaps between syllables, now and then a phrase break.
        pause_s = rng.uniform(0.3, 0.8) if rng.random() < 0.1 else rng.uniform(0.02, 0.35) / voice.syllables_per_s
        pos += length + int(pause_s * sample_rate)
    out = out[:n_samples]
    out *= rng.uniform(0.3, 0.8) / max(float(np.abs(out).max()), 1e-9)
    out += rng.uniform(1e-4, 1e-3) * rng.standard_normal(n_samples)
    return np.clip(out, -1.0, 1.0), "".join(vowels)


def _readme_text(params: dict[str, Any], n_files: int, total_s: float) -> str:
    """The README.txt written into every generated corpus."""
    return (
        "This folder is a SYNTHETIC speech-like corpus generated by autotune (autotune/data/synth.py, corpus version "
        f"{CORPUS_VERSION}).\nIt contains no recorded speech. It exists so that autotune can measure training "
        "throughput without downloading data.\n\n"
        f"Parameters: {json.dumps(params, sort_keys=True)}\n"
        f"Files: {n_files} ({total_s / 3600:.2f} h of 16-bit PCM WAV at {params['sample_rate']} Hz), layout "
        "spkNNN/spkNNN_uttMMM.wav; the speaker of a file is its folder.\n"
        f"Transcripts: {TEXT_NAME} (Kaldi '<key> <text>') and {DATA_LIST_NAME} (WeNet JSON lines key/wav/txt/spk, "
        "wav relative to this folder); a transcript is the vowels of the file's syllables, one character each.\n\n"
        "How it was made: every speaker is a source-filter voice with its own fundamental-frequency range, formant\n"
        "frequencies (vocal-tract scale plus a per-formant offset) and bandwidths, one extra fixed resonance,\n"
        "spectral tilt, breathiness, speaking rate, vibrato and jitter. Each file is a sequence of voiced syllables\n"
        "(a jittered pulse train with vibrato and aspiration noise, filtered in the frequency domain by the formants\n"
        "of a random vowel, a/e/i/o/u) separated by short pauses, plus a low noise floor. The same seed gives the "
        "same bytes.\n"
    )


def generate_corpus(
    out_dir: str | os.PathLike[str],
    *,
    n_speakers: int = 100,
    files_per_speaker: int = 20,
    min_duration_s: float = 2.0,
    max_duration_s: float = 8.0,
    sample_rate: int = 16000,
    seed: int = 0,
) -> Path:
    """Write a synthetic multi-speaker corpus of 16-bit PCM WAV files.

    Every file draws from its own generator seeded by (seed, speaker, file), so the output is the same bytes for
    the same arguments whatever the order of generation.

    Args:
        out_dir: folder to write into (created if missing).
        n_speakers: number of speakers, each in its own ``spkNNN`` folder.
        files_per_speaker: files per speaker.
        min_duration_s: shortest file.
        max_duration_s: longest file; durations are uniform in [min_duration_s, max_duration_s].
        sample_rate: sample rate of the files.
        seed: seed for everything random.

    Returns:
        The output folder, with ``README.txt``, the transcripts (``text``, ``data.list``) and, written last,
        ``manifest.json``.
    """
    if n_speakers < 1 or files_per_speaker < 1 or not 0.1 <= min_duration_s <= max_duration_s:
        raise ValueError("need n_speakers >= 1, files_per_speaker >= 1 and 0.1 <= min_duration_s <= max_duration_s")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = _params(
        n_speakers=n_speakers,
        files_per_speaker=files_per_speaker,
        min_duration_s=min_duration_s,
        max_duration_s=max_duration_s,
        sample_rate=sample_rate,
        seed=seed,
    )
    width = max(3, len(str(n_speakers - 1)), len(str(files_per_speaker - 1)))
    started = time.perf_counter()
    files: list[dict[str, Any]] = []
    for spk in range(n_speakers):
        voice = _make_voice(np.random.default_rng([seed, spk]), spk)
        name = f"spk{spk:0{width}d}"
        (out / name).mkdir(exist_ok=True)
        for utt in range(files_per_speaker):
            rng = np.random.default_rng([seed, spk, utt + 1])
            n_samples = round(rng.uniform(min_duration_s, max_duration_s) * sample_rate)
            waveform, text = _utterance(voice, rng, n_samples, sample_rate)
            rel = f"{name}/{name}_utt{utt:0{width}d}.wav"
            audio = np.round(waveform * 32767.0).astype(np.int16)
            sf.write(out / rel, audio, sample_rate, subtype="PCM_16", format="WAV")
            files.append({"path": rel, "speaker": name, "n_samples": n_samples, "text": text})
    total_s = sum(f["n_samples"] for f in files) / sample_rate
    (out / README_NAME).write_text(_readme_text(params, len(files), total_s))
    _write_transcripts(out, files)
    manifest = {"corpus_version": CORPUS_VERSION, "params": params, "total_audio_s": total_s, "files": files}
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    logger.info("generated %d files (%.2f h) in %.1f s", len(files), total_s / 3600, time.perf_counter() - started)
    return out


def _write_transcripts(out: Path, files: list[dict[str, Any]]) -> None:
    """The Kaldi ``text`` file and the WeNet ``data.list``, keyed by file stem, in generation order."""
    keys = [Path(f["path"]).stem for f in files]
    (out / TEXT_NAME).write_text("".join(f"{key} {f['text']}\n" for key, f in zip(keys, files, strict=True)))
    lines = [
        json.dumps({"key": key, "wav": f["path"], "txt": f["text"], "spk": f["speaker"]}, ensure_ascii=False)
        for key, f in zip(keys, files, strict=True)
    ]
    (out / DATA_LIST_NAME).write_text("".join(line + "\n" for line in lines))


# Captured once so the canonical parameters never depend on what generate_corpus is patched to in tests.
_GENERATE_SIGNATURE = inspect.signature(generate_corpus)


def _params(**kwargs: Any) -> dict[str, Any]:
    """The generation parameters in canonical, JSON-ready form: `generate_corpus`'s defaults updated by kwargs."""
    return canonical_params(_GENERATE_SIGNATURE, **kwargs)


def _is_complete(folder: Path, params: dict[str, Any]) -> bool:
    """Whether folder holds a finished corpus of this version and these parameters."""
    manifest = read_manifest(folder)
    return (
        manifest is not None and manifest.get("corpus_version") == CORPUS_VERSION and manifest.get("params") == params
    )


def ensure_corpus(cache_dir: str | os.PathLike[str] | None = None, **generate_kwargs: Any) -> Path:
    """Return the cached synthetic corpus for these parameters, generating it on first use.

    Generated as `autotune.data.cache.ensure_generated` does it: a run killed half-way never leaves a folder that
    looks finished, and two processes racing to generate it both end up using one complete folder.

    Args:
        cache_dir: cache root; defaults to `default_cache_dir()`.
        **generate_kwargs: keyword arguments of `generate_corpus` (not out_dir).

    Returns:
        The folder ``<cache>/corpus-v{CORPUS_VERSION}-<params hash>/``.

    Raises:
        DataError: the cache cannot be written.
    """
    params = _params(**generate_kwargs)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return ensure_generated(
        cache / f"corpus-v{CORPUS_VERSION}-{params_digest(params)}",
        is_complete=lambda folder: _is_complete(folder, params),
        generate=lambda folder: generate_corpus(folder, **params),  # looked up at call time: tests patch it
        size_mb=_estimated_mb(params),
        what="the synthetic default corpus",
    )


def _estimated_mb(params: dict[str, Any]) -> int:
    """Disk the corpus takes: 16-bit samples at the mean duration."""
    mean_s = (params["min_duration_s"] + params["max_duration_s"]) / 2
    return round(params["n_speakers"] * params["files_per_speaker"] * mean_s * params["sample_rate"] * 2 / 1e6)
