"""Kaldi-compatible log-mel filterbank features, computed as the 3D-Speaker speaker-verification recipe does."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchaudio.compliance import kaldi

__all__ = ["FbankConfig", "compute_fbank"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FbankConfig:
    """Filterbank settings; the defaults are 3D-Speaker's (80 bins, 16 kHz, 25/10 ms frames, no dither)."""

    num_mel_bins: int = 80
    sample_rate: int = 16000
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0

    def num_frames(self, num_samples: int) -> int:
        """Frames kaldi.fbank yields for num_samples samples (snip_edges: whole frames only)."""
        window = int(self.sample_rate * self.frame_length_ms / 1000)
        shift = int(self.sample_rate * self.frame_shift_ms / 1000)
        return 0 if num_samples < window else 1 + (num_samples - window) // shift


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
