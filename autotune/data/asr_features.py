"""The WeNet conformer's features in the training step (feature_device: device): the batched Kaldi fbank of the
waveforms the workers decoded, resampled and speed-perturbed, then SpecAugment with per-utterance masks.

WeNet PR 152 moved this work off the DataLoader workers (its figures:
benchmarks/README.md#where-the-features-are-computed). The recipe's own order is kept (wenet/dataset/processor.py:
compute_fbank, then spec_aug, both per utterance): waveform work stays in the workers, where the recipe has it, and only
what follows the waveform moves.

SpecAugment draws each utterance's masks as WeNet's spec_aug does (wenet/dataset/processor.py at 0154699): per time
mask a start uniform over that utterance's frames and a width uniform in 1..max_t, the band cut at its last frame;
per frequency mask the same over the bins with 1..max_f. On a padded batch every draw is bounded by the row's own
length, never the padded one, so a short utterance is masked as it would be alone. One `SpecAugmentMasks` is applied
per utterance in the workers (`autotune.data.asr.spec_augment`) or to the whole batch here, so both paths can be
handed the same draws (tests/data/test_asr_features.py). Padding is left at WeNet's pad value 0: the masks are cut
to each row's frames, and the padded frames of the fbank are set to 0 as WeNet's padding() leaves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence
from torchaudio.compliance import kaldi

from autotune.data.features import FbankConfig, batched_log_mel

__all__ = [
    "PCM_SCALE",
    "SpecAugmentConfig",
    "SpecAugmentMasks",
    "apply_masks",
    "collate_asr_waveforms",
    "device_features",
    "draw_masks",
    "frame_lengths",
    "wenet_fbank",
]

PCM_SCALE = float(1 << 15)  # WeNet's compute_fbank scales to the 16-bit range; dither 0.1 is relative to it
PAD_TOKEN = -1  # WeNet's IGNORE_ID (autotune.data.asr.PAD_TOKEN)


@dataclass(frozen=True, kw_only=True, slots=True)
class SpecAugmentConfig:
    """WeNet's spec_aug_conf (aishell: 2 time masks up to 50 frames, 2 frequency masks up to 10 bins)."""

    num_time_masks: int = 2
    max_time_mask_frames: int = 50
    num_freq_masks: int = 2
    max_freq_mask_bins: int = 10


@dataclass(frozen=True, slots=True)
class SpecAugmentMasks:
    """Drawn SpecAugment bands of a batch: [start, end) per row and mask, ends already cut to the row's length.

    time: (B, num_time_masks, 2) int64 frame bands; freq: (B, num_freq_masks, 2) int64 bin bands.
    """

    time: torch.Tensor
    freq: torch.Tensor

    def row(self, index: int) -> SpecAugmentMasks:
        """The masks of one utterance, as a batch of one."""
        return SpecAugmentMasks(self.time[index : index + 1], self.freq[index : index + 1])


def _bands(limits: torch.Tensor, count: int, max_width: int, generator: torch.Generator | None) -> torch.Tensor:
    """`count` bands per row: start uniform in [0, limit), width uniform in [1, max_width], end cut at limit."""
    shape = (limits.shape[0], count)
    uniform = torch.rand(shape, generator=generator, device=limits.device, dtype=torch.float64)
    starts = (uniform * limits.unsqueeze(1)).floor().long().minimum(limits.unsqueeze(1) - 1)
    widths = torch.randint(1, max_width + 1, shape, generator=generator, device=limits.device)
    ends = torch.minimum(starts + widths, limits.unsqueeze(1))
    return torch.stack([starts, ends], dim=-1)


def draw_masks(
    lengths: torch.Tensor, bins: int, config: SpecAugmentConfig, generator: torch.Generator | None = None
) -> SpecAugmentMasks:
    """Each row's SpecAugment bands, bounded by that row's own frame count, drawn on the lengths' device.

    Args:
        lengths: (B,) int64 frames per utterance (at least 1 each).
        bins: feature bins (80).
        config: how many masks and how wide.
        generator: None: torch's default generator of that device (seeded per DataLoader worker in the workers).
    """
    lengths = lengths.to(torch.int64)
    bin_limits = torch.full_like(lengths, bins)
    return SpecAugmentMasks(
        time=_bands(lengths, config.num_time_masks, config.max_time_mask_frames, generator),
        freq=_bands(bin_limits, config.num_freq_masks, config.max_freq_mask_bins, generator),
    )


def _covered(bands: torch.Tensor, size: int) -> torch.Tensor:
    """(B, size) bool: positions inside any of a row's [start, end) bands."""
    positions = torch.arange(size, device=bands.device).view(1, 1, size)
    inside = (positions >= bands[..., :1]) & (positions < bands[..., 1:])
    return inside.any(dim=1)


def apply_masks(feats: torch.Tensor, lengths: torch.Tensor, masks: SpecAugmentMasks) -> torch.Tensor:
    """Zero the drawn bands of a padded (B, frames, bins) batch within each row's frames; returns a new tensor.

    Padded frames are not written (they hold WeNet's pad value 0 and the model masks them by length).
    """
    _, frames, bins = feats.shape
    valid = torch.arange(frames, device=feats.device).unsqueeze(0) < lengths.to(feats.device).unsqueeze(1)
    masked = _covered(masks.time, frames).unsqueeze(2) | _covered(masks.freq, bins).unsqueeze(1)
    return feats.masked_fill(masked & valid.unsqueeze(2), 0.0)


def wenet_fbank(waveform: torch.Tensor, config: FbankConfig) -> torch.Tensor:
    """WeNet's compute_fbank of one utterance (the workers' path): raw Kaldi fbank of the 16-bit-scaled waveform.

    Returns:
        (frames, num_mel_bins) float32, not normalised: the model's global CMVN normalises them.
    """
    return kaldi.fbank(
        waveform.unsqueeze(0) * PCM_SCALE,
        num_mel_bins=config.num_mel_bins,
        frame_length=config.frame_length_ms,
        frame_shift=config.frame_shift_ms,
        dither=config.dither,
        energy_floor=0.0,
        sample_frequency=float(config.sample_rate),
    )


def frame_lengths(sample_lengths: torch.Tensor, config: FbankConfig) -> torch.Tensor:
    """Frames kaldi.fbank yields per row (snip_edges), as `FbankConfig.num_frames` of each length."""
    window, shift = config.window_samples, config.shift_samples
    return torch.where(sample_lengths < window, 0, 1 + (sample_lengths - window).div(shift, rounding_mode="floor"))


def device_features(
    waveforms: torch.Tensor,
    sample_lengths: torch.Tensor,
    config: FbankConfig,
    spec_aug: SpecAugmentConfig | None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the workers' fbank and SpecAugment make of each utterance, for a padded batch of waveforms at once.

    Computed in float32 whatever autocast is active, as the workers compute it (the model's autocast starts at its
    input). Dither draws its noise in another order than Kaldi's loop: dithered features are equal in distribution.

    Args:
        waveforms: (B, samples) float in [-1, 1] at ``config.sample_rate``, zero-padded at the end to the longest
            row (collate_asr_waveforms), so that the frames are the longest row's, as the workers' batch pads them.
        sample_lengths: (B,) int64 real samples per row.
        config: the workers' fbank settings (WENET_FBANK).
        spec_aug: SpecAugment settings, None: none.
        generator: for the mask draws (None: the default generator of the batch's device).

    Returns:
        feats (B, frames, bins) float32 with padded frames 0, and feat_lengths (B,) int64: the batch the workers'
        path collates.
    """
    with torch.autocast(waveforms.device.type, enabled=False):
        lengths = frame_lengths(sample_lengths.to(waveforms.device), config)
        feats = batched_log_mel(waveforms.to(torch.float32) * PCM_SCALE, config)  # padded to the longest row's frames
        valid = torch.arange(feats.shape[1], device=feats.device).unsqueeze(0) < lengths.unsqueeze(1)
        feats = feats.masked_fill(~valid.unsqueeze(2), 0.0)  # no host sync: the batch stays queued on the device
        if spec_aug is not None:
            feats = apply_masks(feats, lengths, draw_masks(lengths, feats.shape[2], spec_aug, generator))
    return feats, lengths


def collate_asr_waveforms(items: Sequence[tuple[torch.Tensor, torch.Tensor, float]]) -> dict[str, torch.Tensor]:
    """Pad waveform items (AsrDataset with featurise False) into a batch for `device_features`.

    Returns:
        waveforms (B, samples) float32 padded with 0, sample_lengths (B,) int64, tokens (B, L) int64 padded with -1,
        token_lengths (B,) int64, durations_s (B,) float64.
    """
    waveforms = [waveform for waveform, _, _ in items]
    tokens = [token for _, token, _ in items]
    return {
        "waveforms": pad_sequence(waveforms, batch_first=True, padding_value=0.0),
        "sample_lengths": torch.tensor([waveform.shape[0] for waveform in waveforms], dtype=torch.int64),
        "tokens": pad_sequence(tokens, batch_first=True, padding_value=PAD_TOKEN),
        "token_lengths": torch.tensor([token.shape[0] for token in tokens], dtype=torch.int64),
        "durations_s": torch.tensor([duration for _, _, duration in items], dtype=torch.float64),
    }
