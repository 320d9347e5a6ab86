"""SpeechBrain's speaker-recognition input pipeline: waveform crops in workers; augmentation and Fbank on the device.

SpeechBrain ``recipes/VoxCeleb/SpeakerRec`` (``train_ecapa_tdnn.yaml``, ``train_speaker_embeddings.py``) decodes a
random 3 s chunk in its DataLoader workers and does the rest in ``compute_forward``, on the training device: its
``Augmenter`` (parallel_augment, concat_original, min = max = 4 augmentations: AddNoise at 0-15 dB SNR, AddReverb,
DropFreq, DropChunk) returns the original batch followed by one copy per augmentation, so the model sees 5x the
loader batch and the labels are repeated to match; then ``Fbank`` (80 mels, 25/10 ms, computed in float32 even under
autocast) and ``InputNormalization`` (per-sentence mean, no variance). This module does the same, batched:

- noise: SpeechBrain mixes noise files (its noise corpus is a download); here Gaussian noise generated on the
  device, mixed exactly as AddNoise mixes (RMS amplitudes, SNR drawn per utterance from 0-15 dB);
- reverberation: SpeechBrain convolves with recorded or simulated room impulse responses (also a download); here a
  synthetic response per utterance (exponentially decaying noise after a direct path, RT60 0.2-0.8 s, 0.5 s long),
  convolved by FFT and rescaled to the clean average amplitude, as AddReverb;
- DropFreq: 1-3 notches (101-tap windowed-sinc band-reject filters, width 0.05 of Nyquist) at random frequencies;
- DropChunk: 1-5 chunks of 1000-2000 samples zeroed per utterance.

With fewer than 4 copies the first ones of that list are used (SpeechBrain draws which); more cycle through it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from autotune.data.datasets import SpeakerCropDataset

__all__ = [
    "AUGMENTATIONS",
    "WaveformCropDataset",
    "add_noise",
    "add_reverb",
    "augment_batch",
    "drop_chunk",
    "drop_freq",
    "notch_kernel",
    "speechbrain_fbank",
    "speechbrain_filters",
    "speechbrain_inputs",
]

SAMPLE_RATE = 16000


class WaveformCropDataset(SpeakerCropDataset):
    """Random fixed-length crops as waveforms (features are computed on the device), labelled with the speaker."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """(crop of crop_samples float32 samples at the fbank rate, speaker label)."""
        return self._read_crop(self.utterances[index]), self.labels[index]


def _uniform(low: float, high: float, count: int, like: torch.Tensor) -> torch.Tensor:
    return torch.rand(count, device=like.device) * (high - low) + low


def _rms(waveforms: torch.Tensor) -> torch.Tensor:
    return waveforms.square().mean(dim=1, keepdim=True).sqrt()


def _average_amplitude(waveforms: torch.Tensor) -> torch.Tensor:
    return waveforms.abs().mean(dim=1, keepdim=True).clamp_min(1e-14)


def add_noise(waveforms: torch.Tensor, snr_low_db: float = 0.0, snr_high_db: float = 15.0) -> torch.Tensor:
    """Mix in white noise at a random SNR per utterance, scaled on RMS amplitudes as SpeechBrain's AddNoise (with no
    noise csv: the same draws, in the same order, give the same output; tests/data/test_augment.py runs both)."""
    snr = _uniform(snr_low_db, snr_high_db, waveforms.shape[0], waveforms).unsqueeze(1)
    noise_factor = 1.0 / (10 ** (snr / 20) + 1)
    noise = torch.randn_like(waveforms)
    noise = noise * (noise_factor * _rms(waveforms) / (_rms(noise) + 1e-14))
    return waveforms * (1 - noise_factor) + noise


def add_reverb(waveforms: torch.Tensor, rir_s: float = 0.5, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Convolve with a synthetic room response per utterance; the result keeps the clean average amplitude."""
    batch, taps = waveforms.shape[0], int(rir_s * sample_rate)
    rt60 = _uniform(0.2, 0.8, batch, waveforms).unsqueeze(1)
    t = torch.arange(taps, device=waveforms.device) / sample_rate
    rir = torch.randn(batch, taps, device=waveforms.device) * torch.exp(-6.91 * t / rt60)  # -60 dB at rt60
    rir[:, 0] = rir.abs().amax(dim=1) * 2  # the direct path leads, so the output stays aligned with the input
    reverberant = AF.fftconvolve(waveforms, rir)[:, : waveforms.shape[1]]
    return reverberant * (_average_amplitude(waveforms) / _average_amplitude(reverberant))


def _lowpass(cutoff: torch.Tensor, taps: int) -> torch.Tensor:
    """Blackman-windowed sinc low-pass kernels (K, taps), unit DC gain; cutoff as a fraction of Nyquist."""
    n = torch.arange(taps, device=cutoff.device) - taps // 2
    kernel = torch.sinc(cutoff.unsqueeze(1) * n) * torch.blackman_window(taps, periodic=False, device=cutoff.device)
    return kernel / kernel.sum(dim=1, keepdim=True)


def notch_kernel(centres: torch.Tensor, width: float = 0.05, taps: int = 101) -> torch.Tensor:
    """One FIR kernel (taps,) rejecting a band of +-width around each centre (fractions of Nyquist), in series."""
    identity = F.one_hot(torch.tensor(taps // 2, device=centres.device), taps).float()
    band_reject = _lowpass(centres - width, taps) + identity - _lowpass(centres + width, taps)
    kernel = identity
    for notch in band_reject:  # filters in series: convolve their impulse responses
        kernel = F.conv1d(kernel.view(1, 1, -1), notch.flip(0).view(1, 1, -1), padding=taps // 2).view(-1)
    return kernel


def drop_freq(waveforms: torch.Tensor, count_low: int = 1, count_high: int = 3, width: float = 0.05) -> torch.Tensor:
    """Notch out 1-3 random frequency bands (the same for the whole batch, as SpeechBrain's DropFreq)."""
    count = int(torch.randint(count_low, count_high + 1, (1,)))
    centres = _uniform(0.0, 1.0, count, waveforms) * (1 - 2 * width) + width  # keep the notch inside (0, Nyquist)
    kernel = notch_kernel(centres, width)
    return F.conv1d(waveforms.unsqueeze(1), kernel.flip(0).view(1, 1, -1), padding=len(kernel) // 2).squeeze(1)


def drop_chunk(
    waveforms: torch.Tensor, length_low: int = 1000, length_high: int = 2000, count_low: int = 1, count_high: int = 5
) -> torch.Tensor:
    """Zero 1-5 random chunks of 1000-2000 samples in each utterance, as SpeechBrain's DropChunk."""
    batch, samples = waveforms.shape
    device = waveforms.device
    counts = torch.randint(count_low, count_high + 1, (batch, 1), device=device)
    lengths = torch.randint(length_low, length_high + 1, (batch, count_high), device=device)
    starts = (torch.rand(batch, count_high, device=device) * (samples - lengths).clamp_min(1)).long()
    active = torch.arange(count_high, device=device).unsqueeze(0) < counts
    t = torch.arange(samples, device=device).view(1, 1, -1)
    hit = (t >= starts.unsqueeze(2)) & (t < (starts + lengths).unsqueeze(2)) & active.unsqueeze(2)
    return waveforms.masked_fill(hit.any(dim=1), 0.0)


AUGMENTATIONS: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = (add_noise, add_reverb, drop_freq, drop_chunk)


def augment_batch(waveforms: torch.Tensor, labels: torch.Tensor, copies: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The original batch followed by ``copies`` augmented copies of it, and the labels repeated to match."""
    augmented = [AUGMENTATIONS[index % len(AUGMENTATIONS)](waveforms) for index in range(copies)]
    return torch.cat([waveforms, *augmented]), labels.repeat(copies + 1)


def speechbrain_filters(n_mels: int, n_fft: int, sample_rate: int, device: torch.device) -> torch.Tensor:
    """SpeechBrain's Filterbank matrix (n_fft // 2 + 1, n_mels): triangles on n_mels + 2 points equally spaced in mel
    up to Nyquist, each symmetric in Hz about its centre with the half-width of the gap to the point below (not
    torchaudio's melscale_fbanks, whose triangles reach from neighbour to neighbour), peak 1, unnormalised."""
    top_mel = 2595 * torch.log10(torch.tensor(1 + (sample_rate / 2) / 700))
    points = 700 * (10 ** (torch.linspace(0.0, float(top_mel), n_mels + 2) / 2595) - 1)
    centres, bands = points[1:-1].unsqueeze(1), (points[1:-1] - points[:-2]).unsqueeze(1)
    slope = (torch.linspace(0, sample_rate // 2, n_fft // 2 + 1) - centres) / bands
    return torch.minimum(slope + 1.0, 1.0 - slope).clamp_min(0.0).transpose(0, 1).to(device)


def speechbrain_fbank(waveforms: torch.Tensor, n_mels: int = 80, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """SpeechBrain's Fbank + sentence mean normalisation of (B, samples): (B, frames, n_mels), 301 frames for 3 s.

    STFT with a 25 ms Hamming window every 10 ms (400-point FFT, zero-padded centred frames), power spectrum,
    SpeechBrain's triangular mel filters up to Nyquist (`speechbrain_filters`), 10 log10 clamped at 1e-10 and to 80 dB
    below each utterance's peak.
    """
    n_fft, hop = int(0.025 * sample_rate), int(0.010 * sample_rate)
    window = torch.hamming_window(n_fft, device=waveforms.device)
    spectrum = torch.stft(waveforms, n_fft, hop, window=window, center=True, pad_mode="constant", return_complex=True)
    mel = spectrum.abs().square().transpose(1, 2) @ speechbrain_filters(n_mels, n_fft, sample_rate, waveforms.device)
    decibels = 10 * torch.log10(mel.clamp_min(1e-10))
    decibels = torch.maximum(decibels, decibels.amax(dim=(1, 2), keepdim=True) - 80.0)
    return decibels - decibels.mean(dim=1, keepdim=True)


def speechbrain_inputs(waveforms: torch.Tensor, labels: torch.Tensor, copies: int) -> tuple[torch.Tensor, torch.Tensor]:
    """compute_forward's input side: augment (copies > 0) and featurise in float32, whatever autocast is active."""
    with torch.autocast(waveforms.device.type, enabled=False):
        waveforms = waveforms.float()
        if copies:
            waveforms, labels = augment_batch(waveforms, labels, copies)
        return speechbrain_fbank(waveforms), labels
