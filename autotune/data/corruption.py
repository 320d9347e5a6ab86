"""3D-Speaker's per-item augmentation, done in DataLoader workers: speed perturbation, noise and reverberation.

What ``speakerlab/process/processor.py`` and ``speakerlab/process/augmentation.py`` (3D-Speaker 09e7806) do to every
training item, in the same order and with the same arithmetic:

1. WavReader with ``speed_pertub`` (sic): speed index drawn uniformly from (1.0, 0.9, 1.1); for 0.9 and 1.1 the
   whole decoded file goes through sox ``speed S`` then ``rate 16000``: tempo and pitch change together, the length
   becomes n / S. torchaudio 2.11 has no sox_effects; `speed_perturb` calls libsoxr (the resampler inside sox's
   ``rate`` effect, through the ``soxr`` package) at sox's default "high" quality from ``S * rate`` to ``rate``,
   which is what ``speed`` followed by ``rate`` computes: sox's output, same length, at sox's CPU cost, where
   torchaudio's resample is less exact and slower (tests/data/test_corruption.py holds a recorded sox pair; the
   figures: docs/how-it-measures.md, step 5). The speaker's label becomes
   ``label + n_speakers * speed_index``: train.py triples the classifier's classes.
2. A random ``wav_len`` crop of the perturbed signal, or zero-padding at the end when it is shorter.
3. SpkVeriAug: with probability ``aug_prob`` one of additive noise, reverberation, or reverberation then noise,
   chosen uniformly. A noise or room-response file is drawn uniformly from its wav.scp and decoded WHOLE (as
   torchaudio.load does there), first channel only. Noise: a random window of the crop's length (a shorter file is
   stretched by repeating every sample, numpy ``repeat`` as the reference writes it), scaled to an SNR drawn from
   0-15 dB on mean powers (+1e-6), added, and the sum peak-normalised. Reverb: the response scaled to unit energy,
   full convolution cut to the crop's length, peak-normalised.

Random draws come from torch's RNG (which DataLoader seeds per worker) instead of Python's ``random``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from autotune.data.audio import AUDIO_READ_ERRORS
from autotune.data.lists import read_scp
from autotune.data.synth_noise import NOISE_LIST_NAME, REVERB_LIST_NAME, ensure_noise_set
from autotune.errors import DataError
from autotune.yamlio import special_file

__all__ = [
    "AUGMENTATION_LISTS",
    "SPEEDS",
    "Corruption",
    "augmentation_list",
    "read_augmentation_files",
    "add_noise",
    "add_reverb",
    "crop_or_pad",
    "speed_perturb",
]

SPEEDS = (1.0, 0.9, 1.1)  # WavReader's order: index 0 leaves the signal alone
SNR_RANGE_DB = (0.0, 15.0)
_POWER_FLOOR = 1e-6
_PEAK_FLOOR = 1e-6


def _draw(count: int) -> int:
    """A uniform index in [0, count) from torch's RNG."""
    return int(torch.randint(count, (1,)))


def speed_perturb(waveform: torch.Tensor, speed: float, sample_rate: int) -> torch.Tensor:
    """sox ``speed S`` + ``rate sample_rate``: play ``speed`` times faster (pitch up with it), n / S samples long."""
    if speed == 1.0:
        return waveform
    signal = waveform.detach().cpu().numpy().astype(np.float32, copy=False)
    return torch.from_numpy(soxr.resample(signal, round(sample_rate * speed), sample_rate, quality="HQ"))


def crop_or_pad(waveform: torch.Tensor, samples: int) -> torch.Tensor:
    """WavReader's crop: a random window of ``samples`` when long enough, else the signal zero-padded at the end."""
    if waveform.numel() >= samples:
        start = _draw(waveform.numel() - samples + 1)
        return waveform[start : start + samples]
    return F.pad(waveform, (0, samples - waveform.numel()))


def add_noise(waveform: torch.Tensor, noise: torch.Tensor, snr_db: float) -> torch.Tensor:
    """3D-Speaker's addnoise with a given SNR: fit the noise to the length, mix at snr_db on mean powers, normalise.

    Args:
        waveform: (samples,) float.
        noise: (noise samples,) float, any length.
        snr_db: wanted ratio of the waveform's power to the noise's, in dB.
    """
    samples = waveform.numel()
    if noise.numel() >= samples:
        start = _draw(noise.numel() - samples + 1)
        noise = noise[start : start + samples]
    else:  # numpy's repeat repeats each sample (it does not tile); the reference relies on it
        noise = noise.repeat_interleave(samples // noise.numel() + 1)[:samples]
    waveform_db = 10 * torch.log10(waveform.square().mean() + _POWER_FLOOR)
    noise_db = 10 * torch.log10(noise.square().mean() + _POWER_FLOOR)
    mixed = waveform + torch.sqrt(10 ** ((waveform_db - noise_db - snr_db) / 10)) * noise
    return mixed / (mixed.abs().max() + _PEAK_FLOOR)


def add_reverb(waveform: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """3D-Speaker's addreverb: convolve with the unit-energy response, keep the first samples, peak-normalise."""
    response = response / response.square().sum().sqrt()
    reverberant = AF.fftconvolve(waveform, response)[: waveform.numel()]
    return reverberant / (reverberant.abs().max() + _PEAK_FLOOR)


def read_first_channel(path: str) -> torch.Tensor:
    """Decode a whole noise or response file, first channel, float32.

    Raises:
        DataError: the file cannot be read now (it was when the run checked its lists).
    """
    try:
        data, _ = sf.read(path, dtype="float32", always_2d=True)
    except AUDIO_READ_ERRORS as exc:
        reason = str(getattr(exc, "error_string", None) or exc).replace("\n", " ")
        raise DataError(f"cannot read augmentation file {path}: {reason}; check the file and its storage") from exc
    return torch.from_numpy(np.ascontiguousarray(data[:, 0]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Corruption:
    """SpkVeriAug: with probability ``aug_prob``, noise, reverb, or reverb then noise, from these files.

    Attributes:
        aug_prob: probability that an item is corrupted at all (CAM++'s recipe 0.2, ERes2Net's 0.8).
        noise: noise files (MUSAN in the recipes).
        reverb: room-response files (RIRS_NOISES in the recipes).
    """

    aug_prob: float
    noise: Sequence[str]
    reverb: Sequence[str]

    def __post_init__(self) -> None:
        if not 0.0 <= self.aug_prob <= 1.0 or math.isnan(self.aug_prob):
            raise ValueError(f"aug_prob must be in [0, 1], got {self.aug_prob}")
        if self.aug_prob > 0 and not (self.noise and self.reverb):
            raise ValueError("augmentation needs at least one noise file and one room response")

    def __call__(self, waveform: torch.Tensor) -> torch.Tensor:
        """Corrupt one crop (or leave it alone, with probability 1 - aug_prob)."""
        if self.aug_prob <= float(torch.rand(())):
            return waveform
        choice = _draw(3)  # 0 noise, 1 reverb, 2 reverb then noise
        if choice >= 1:
            waveform = add_reverb(waveform, read_first_channel(self.reverb[_draw(len(self.reverb))]))
        if choice != 1:
            noise = read_first_channel(self.noise[_draw(len(self.noise))])
            snr_db = float(torch.empty(()).uniform_(*SNR_RANGE_DB))
            waveform = add_noise(waveform, noise, snr_db)
        return waveform.to(torch.float32)


# What each list holds, the option that names it, and the synthetic set's stand-in.
AUGMENTATION_LISTS = {"noise": NOISE_LIST_NAME, "reverb": REVERB_LIST_NAME}
REQUIRED_RATE = 16000  # 3D-Speaker asserts it for noise and responses alike


def augmentation_list(given: str | None, kind: str) -> tuple[Path, bool]:
    """The wav.scp to read for ``kind`` ("noise" or "reverb"), and whether it is autotune's synthetic stand-in.

    Args:
        given: the path the run's options name, or None for the synthetic set (generated into the cache on first
            use, about a second).
        kind: "noise" or "reverb".
    """
    if given is not None:
        return Path(os.path.abspath(os.path.expanduser(given))), False
    return ensure_noise_set() / AUGMENTATION_LISTS[kind], True


def _probe(path: str, where: str, kind: str) -> None:
    """A DataError unless ``path`` is a readable, non-empty audio file at 16 kHz."""
    special = special_file(path)
    if special is not None:  # opening a named pipe blocks until something writes to it: the input check would hang
        raise DataError(f"{where}: {kind} file {path} is not a regular file ({special}); list audio files only")
    try:
        info = sf.info(path)
    except AUDIO_READ_ERRORS as exc:
        missing = "does not exist" if not os.path.exists(path) else "cannot be read"
        raise DataError(f"{where}: {kind} file {path} {missing}; fix the path or remove the line") from exc
    if info.frames <= 0:
        raise DataError(f"{where}: {kind} file {path} holds no audio; remove the line")
    if info.samplerate != REQUIRED_RATE:
        raise DataError(
            f"{where}: {kind} file {path} is {info.samplerate} Hz; 3D-Speaker mixes {REQUIRED_RATE} Hz files only: "
            "resample it (sox in.wav -r 16000 out.wav) or remove the line"
        )


def read_augmentation_files(list_path: Path, kind: str, *, probe: bool = False) -> tuple[str, ...]:
    """The audio paths a noise or reverb wav.scp lists (``key path``, relative paths against its folder).

    Args:
        list_path: the wav.scp.
        kind: "noise" or "reverb", for messages.
        probe: also check every file (readable, not empty, 16 kHz), as a run does once before its trials.

    Raises:
        DataError: the list is missing, malformed or empty, or (with probe) a file cannot be used.
    """
    option = f"--option {kind}=PATH"
    special = special_file(list_path)
    if special is not None:
        raise DataError(f"{kind} list {list_path} is not a regular file ({special}); give a wav.scp with {option}")
    if not list_path.is_file():
        raise DataError(f"{kind} list {list_path} does not exist; give a wav.scp ('key path' lines) with {option}")
    entries = read_scp(list_path)
    if not entries:
        raise DataError(f"{kind} list {list_path} lists no files; add 'key path' lines or drop {option}")
    if probe:
        for _, path, where in entries:
            _probe(path, where, kind)
    return tuple(path for _, path, _ in entries)
