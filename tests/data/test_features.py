"""Tests for autotune.data.features."""

from __future__ import annotations

import math

import pytest
import torch
from torchaudio.compliance import kaldi

from autotune.data import FbankConfig, compute_fbank
from autotune.data.features import CPU_ROWS_AT_ONCE, _log_mel_rows, batched_fbank, batched_log_mel


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


# --- batched_fbank: the workers' features of a batch, computed at once in the training step (feature_device) --------


def _crops(count: int, seconds: float = 3.0) -> torch.Tensor:
    """Speech-like crops: tones of different pitch under noise, one at full scale, one with a silent tail."""
    generator = torch.Generator().manual_seed(1)
    t = torch.arange(round(seconds * 16000)) / 16000
    rows = [0.3 * torch.sin(2 * math.pi * (110.0 * (index + 1)) * t) for index in range(count)]
    crops = torch.stack(rows) + 0.02 * torch.randn(count, t.numel(), generator=generator)
    crops[0] = crops[0].clamp(-1, 1) / crops[0].abs().max()
    crops[-1, t.numel() // 2 :] = 0.0  # a crop zero-padded at its end, as short utterances are
    return crops


@pytest.mark.parametrize("config", [FbankConfig(), FbankConfig(num_mel_bins=40, sample_rate=8000)], ids=("3d", "8k"))
def test_batched_fbank_is_compute_fbank_of_every_crop(config: FbankConfig) -> None:
    crops = _crops(2 * CPU_ROWS_AT_ONCE + 1, seconds=1.0)  # chunks of rows and a short last chunk
    if config.sample_rate != 16000:
        crops = crops[:, ::2].contiguous()
    batched = batched_fbank(crops, config)
    assert batched.shape == (crops.shape[0], config.num_frames(crops.shape[1]), config.num_mel_bins)
    each = torch.stack([compute_fbank(crop, config) for crop in crops])
    torch.testing.assert_close(batched, each, rtol=0, atol=1e-4)  # measured: 1.5e-6 (|X|^2 without a square root)


def test_the_whole_batch_at_once_as_a_gpu_computes_it_is_the_same() -> None:
    """Off the CPU the batch is featurised in one go (_log_mel_rows of every row): the same numbers as the chunks."""
    crops = _crops(CPU_ROWS_AT_ONCE + 2, seconds=0.5)
    whole = _log_mel_rows(crops, FbankConfig(), 400, 160)
    torch.testing.assert_close(whole, batched_log_mel(crops), rtol=0, atol=1e-5)
    torch.testing.assert_close(whole - whole.mean(dim=1, keepdim=True), batched_fbank(crops), rtol=0, atol=1e-5)
    meta = batched_fbank(torch.empty(7, 8000, device="meta"))  # another device: the whole-batch branch, by shape
    assert meta.shape == (7, 48, 80) and meta.device.type == "meta"


def test_batched_dither_is_kaldis_noise_in_distribution() -> None:
    """Dither draws other numbers than Kaldi's loop, so dithered features are compared by their spread: the same
    scale of change from the undithered ones, in both."""
    crops = _crops(4, seconds=1.0) * (1 << 15)  # dither is relative to 16-bit samples
    dithered = FbankConfig(dither=1.0)
    torch.manual_seed(0)
    batched = batched_fbank(crops, dithered) - batched_fbank(crops)
    each = torch.stack([compute_fbank(crop, dithered) - compute_fbank(crop) for crop in crops])
    assert batched.abs().mean() > 0 and each.abs().mean() > 0
    assert batched.abs().mean() / each.abs().mean() == pytest.approx(1.0, rel=0.1)


def test_batched_fbank_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="batch, samples"):
        batched_fbank(torch.zeros(16000))
    with pytest.raises(ValueError, match="shorter than one"):
        batched_fbank(torch.zeros(2, 399))
