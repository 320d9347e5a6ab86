"""Tests for autotune.data.features."""

from __future__ import annotations

import math

import pytest
import torch
from torchaudio.compliance import kaldi

from autotune.data import FbankConfig, compute_fbank


def _tone(seconds: float, sample_rate: int = 16000) -> torch.Tensor:
    t = torch.arange(round(seconds * sample_rate)) / sample_rate
    return 0.3 * torch.sin(2 * math.pi * 440.0 * t) + 0.01 * torch.randn(
        t.numel(), generator=torch.Generator().manual_seed(0)
    )


def test_three_seconds_give_298_frames_with_zero_mean() -> None:
    feats = compute_fbank(_tone(3.0))
    assert feats.shape == (298, 80) and feats.dtype == torch.float32
    assert feats.mean(dim=0).abs().max() < 1e-4
    assert feats.std(dim=0).min() > 0  # not a constant


def test_matches_kaldi_fbank_minus_its_mean() -> None:
    waveform = _tone(1.0)
    reference = kaldi.fbank(waveform.unsqueeze(0), num_mel_bins=80, sample_frequency=16000.0, dither=0.0)
    torch.testing.assert_close(compute_fbank(waveform), reference - reference.mean(dim=0, keepdim=True))


@pytest.mark.parametrize("num_samples", [400, 401, 560, 16000, 48000, 48159, 48160])
def test_num_frames_matches_output(num_samples: int) -> None:
    assert compute_fbank(_tone(4.0)[:num_samples]).shape[0] == FbankConfig().num_frames(num_samples)


def test_other_config() -> None:
    config = FbankConfig(num_mel_bins=40, sample_rate=8000, frame_shift_ms=20.0)
    feats = compute_fbank(_tone(2.0, sample_rate=8000), config)
    assert feats.shape == (config.num_frames(16000), 40) == (99, 40)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="1-D"):
        compute_fbank(torch.zeros(2, 16000))
    with pytest.raises(ValueError, match="shorter than one"):
        compute_fbank(torch.zeros(399))
