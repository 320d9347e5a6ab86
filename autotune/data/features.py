"""Kaldi-compatible log-mel filterbank features, computed as the 3D-Speaker speaker-verification recipe does: per
utterance in the DataLoader workers (`compute_fbank`, the recipe's placement), or batch-wise in the training step on
the device (`batched_fbank`, the feature_device knob), frame for frame the same features."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchaudio.compliance import kaldi

__all__ = ["FbankConfig", "batched_fbank", "batched_log_mel", "compute_fbank"]

PREEMPHASIS = 0.97  # kaldi.fbank's defaults, which 3D-Speaker's FBank keeps
LOW_FREQ_HZ = 20.0
CPU_ROWS_AT_ONCE = 4  # crops featurised together on a CPU (batched_fbank)


@dataclass(frozen=True, kw_only=True, slots=True)
class FbankConfig:
    """Filterbank settings; the defaults are 3D-Speaker's (80 bins, 16 kHz, 25/10 ms frames, no dither)."""

    num_mel_bins: int = 80
    sample_rate: int = 16000
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0

    @property
    def window_samples(self) -> int:
        return int(self.sample_rate * self.frame_length_ms / 1000)

    @property
    def shift_samples(self) -> int:
        return int(self.sample_rate * self.frame_shift_ms / 1000)

    def num_frames(self, num_samples: int) -> int:
        """Frames kaldi.fbank yields for num_samples samples (snip_edges: whole frames only)."""
        window = self.window_samples
        return 0 if num_samples < window else 1 + (num_samples - window) // self.shift_samples


def compute_fbank(waveform: torch.Tensor, config: FbankConfig = FbankConfig()) -> torch.Tensor:
    """Log-mel filterbank of one utterance, mean-normalised per utterance.

    Args:
        waveform: 1-D float tensor in [-1, 1] at ``config.sample_rate`` (3D-Speaker feeds it unscaled, so do we).
        config: filterbank settings.

    Returns:
        (frames, num_mel_bins) float32; 3.0 s at 16 kHz gives 298 frames.
    """
    if waveform.dim() != 1:
        raise ValueError(f"compute_fbank expects a 1-D waveform, got shape {tuple(waveform.shape)}")
    if config.num_frames(waveform.numel()) == 0:
        raise ValueError(
            f"waveform of {waveform.numel()} samples is shorter than one {config.frame_length_ms} ms frame"
        )
    feats = kaldi.fbank(
        waveform.to(torch.float32).unsqueeze(0),
        num_mel_bins=config.num_mel_bins,
        sample_frequency=float(config.sample_rate),
        frame_length=config.frame_length_ms,
        frame_shift=config.frame_shift_ms,
        dither=config.dither,
    )
    # Per-utterance cepstral-style mean normalisation, as 3D-Speaker's FBank(mean_nor=True).
    return feats - feats.mean(dim=0, keepdim=True)


def batched_fbank(waveforms: torch.Tensor, config: FbankConfig = FbankConfig()) -> torch.Tensor:
    """`compute_fbank` of every row of a batch of equal-length crops at once, on the batch's device.

    The same steps as torchaudio.compliance.kaldi.fbank with the arguments compute_fbank gives it (snip_edges
    framing, per-frame DC removal, pre-emphasis 0.97, Povey window, zero padding to a power of two, power spectrum,
    Kaldi's mel banks from 20 Hz to Nyquist, log floored at float epsilon), then the per-utterance mean removed.
    Every op acts on one frame or one utterance at a time, so no row sees another: each row equals compute_fbank of
    that crop (tests/data/test_features.py holds them within float rounding, on the CPU and against speakerlab's own
    FBank). Dither, where a config asks for it, adds Gaussian noise of that scale to each frame's samples as Kaldi
    does, drawn in another order: dithered features are equal in distribution, not sample for sample.

    Args:
        waveforms: (B, samples) float, every row one crop at ``config.sample_rate`` (3D-Speaker's crops are all
            crop_s long, so no row is padded).
        config: filterbank settings.

    Returns:
        (B, frames, num_mel_bins) float32.
    """
    if waveforms.dim() != 2:
        raise ValueError(f"batched_fbank expects (batch, samples), got shape {tuple(waveforms.shape)}")
    feats = batched_log_mel(waveforms, config)
    return feats - feats.mean(dim=1, keepdim=True)


def batched_log_mel(waveforms: torch.Tensor, config: FbankConfig = FbankConfig()) -> torch.Tensor:
    """kaldi.fbank of every row of a batch (no energy, no normalisation: `batched_fbank` before its mean removal).

    Args:
        waveforms: (B, samples) float at ``config.sample_rate``, on any device; rows padded at the end give the
            frames of their own length first (snip_edges framing reads no sample past a frame's end).

    Returns:
        (B, frames, num_mel_bins) float32.
    """
    if waveforms.dim() != 2:
        raise ValueError(f"batched_log_mel expects (batch, samples), got shape {tuple(waveforms.shape)}")
    window, shift = config.window_samples, config.shift_samples
    if config.num_frames(waveforms.shape[1]) == 0:
        raise ValueError(
            f"crops of {waveforms.shape[1]} samples are shorter than one {config.frame_length_ms} ms frame"
        )
    if waveforms.device.type != "cpu":
        return _log_mel_rows(waveforms, config, window, shift)
    # On a CPU a whole batch's spectra fall out of cache between the element-wise steps and make it slower than a loop
    # over crops; a few rows at a time is as fast as Kaldi's per-crop loop
    # (benchmarks/README.md#where-the-features-are-computed).
    rows = [_log_mel_rows(chunk, config, window, shift) for chunk in waveforms.split(CPU_ROWS_AT_ONCE)]
    return torch.cat(rows)


def _log_mel_rows(waveforms: torch.Tensor, config: FbankConfig, window: int, shift: int) -> torch.Tensor:
    frames = waveforms.to(torch.float32).unfold(1, window, shift)  # (B, frames, window): snip_edges
    if config.dither:
        frames = frames + torch.randn_like(frames) * config.dither
    frames = frames - frames.mean(dim=2, keepdim=True)
    previous = torch.cat([frames[..., :1], frames[..., :-1]], dim=2)  # Kaldi's replicate pad of the first sample
    frames = (frames - PREEMPHASIS * previous) * _povey_window(window, frames.device)
    padded = 1 << (window - 1).bit_length()
    # rfft zero-pads each frame to `padded`; re^2 + im^2 is Kaldi's |X|^2 without the square root (complex abs is
    # the slowest op of the batch on a CPU), equal within float rounding
    spectrum = torch.view_as_real(torch.fft.rfft(frames, n=padded)).square().sum(dim=-1)
    mel = spectrum @ _mel_banks(config, padded, frames.device).T
    return mel.clamp_min(torch.finfo(torch.float32).eps).log()


def _povey_window(size: int, device: torch.device) -> torch.Tensor:
    return torch.hann_window(size, periodic=False, device=device, dtype=torch.float32).pow(0.85)


def _mel_banks(config: FbankConfig, padded: int, device: torch.device) -> torch.Tensor:
    """Kaldi's triangular mel banks (kaldi.get_mel_banks itself), (num_mel_bins, padded // 2 + 1) with the Nyquist
    bin's zero column, as kaldi.fbank pads them."""
    banks, _ = kaldi.get_mel_banks(
        config.num_mel_bins, padded, float(config.sample_rate), LOW_FREQ_HZ, 0.0, 100.0, -500.0, 1.0
    )
    return torch.nn.functional.pad(banks, (0, 1)).to(device=device, dtype=torch.float32)
