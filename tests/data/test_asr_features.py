"""The conformer's features in the training step (feature_device device): the batched fbank and SpecAugment give
the workers' features of the same audio and the same mask draws, and the masks are drawn as WeNet's own spec_aug
draws them (its output recorded at a named commit: tests/data/reference/wenet_spec_aug.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotune.data.asr import WENET_FBANK, AsrDataset, CharVocabulary, collate_asr_batch
from autotune.data.asr_features import (
    SpecAugmentConfig,
    apply_masks,
    collate_asr_waveforms,
    device_features,
    draw_masks,
    frame_lengths,
    wenet_fbank,
)
from tests.data.reference.wenet_spec_aug import mask_statistics
from tests.data.test_asr import tones  # noqa: F401 - the fixture: two kept utterances (16 and 8 kHz), two filtered

REFERENCE = Path(__file__).resolve().parent / "reference" / "wenet_spec_aug_0154699.json"
UNDITHERED = replace(WENET_FBANK, dither=0.0)
OURS = 2000  # draws per length here (the recording has 20000)


def _waveforms(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A zero-padded batch of noisy tones of the given sample lengths."""
    generator = torch.Generator().manual_seed(1)
    rows = []
    for index, length in enumerate(lengths):
        t = torch.arange(length) / 16000
        rows.append(
            0.3 * torch.sin(2 * torch.pi * (150 + 60 * index) * t) + 0.01 * torch.randn(length, generator=generator)
        )
    batch = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    return batch, torch.tensor(lengths)


def test_the_batched_features_are_the_workers_given_the_same_mask_draws() -> None:
    """Per utterance (the workers: Kaldi's fbank, then SpecAugment) and per batch (the step), with one draw of masks
    handed to both: equal features, equal lengths, and the padded frames left at WeNet's pad value 0."""
    waveforms, samples = _waveforms([16000, 9000, 4000, 12345])
    config = SpecAugmentConfig()
    feats, lengths = device_features(waveforms, samples, UNDITHERED, config, torch.Generator().manual_seed(5))
    assert lengths.tolist() == [UNDITHERED.num_frames(n) for n in samples.tolist()] == [98, 54, 23, 75]
    assert feats.shape == (4, 98, 80) and feats.dtype == torch.float32
    masks = draw_masks(lengths, 80, config, torch.Generator().manual_seed(5))  # the draws device_features made
    for row, length in enumerate(lengths.tolist()):
        alone = wenet_fbank(waveforms[row, : samples[row]], UNDITHERED)
        masked = apply_masks(alone.unsqueeze(0), lengths[row : row + 1], masks.row(row)).squeeze(0)
        assert bool((masked == 0).all(dim=1).any())  # a time band really masked
        torch.testing.assert_close(feats[row, :length], masked, rtol=0, atol=1e-4)  # measured: ~2e-6
        assert bool((feats[row, length:] == 0).all())


def test_the_dataset_gives_the_workers_features_from_the_step(tones: list) -> None:  # noqa: F811
    """The whole item path (decode, resample from 8 kHz, speed perturbation) with the same draws: AsrDataset with
    featurise False collates waveforms whose features in the step equal the collated worker features."""
    vocab = CharVocabulary.from_texts(u.text for u in tones)
    kwargs = {"fbank": UNDITHERED, "spec_aug": None, "min_input_frames": 7}
    workers = AsrDataset(tones, vocab, **kwargs)
    device = AsrDataset(tones, vocab, featurise=False, **kwargs)
    assert workers.max_frames == device.max_frames  # what the frame-budget batching reads: the same
    items = {}
    for label, dataset in (("workers", workers), ("device", device)):
        items[label] = []
        for index in (0, 1, 0, 1):
            torch.manual_seed(index + len(items[label]))  # the same speed draw in both
            items[label].append(dataset[index])
    worker_batch = collate_asr_batch(items["workers"])
    device_batch = collate_asr_waveforms(items["device"])
    assert device_batch["waveforms"].dim() == 2
    for key in ("tokens", "token_lengths", "durations_s"):
        assert torch.equal(worker_batch[key], device_batch[key])
    feats, lengths = device_features(device_batch["waveforms"], device_batch["sample_lengths"], UNDITHERED, None)
    assert torch.equal(lengths, worker_batch["feat_lengths"])
    assert torch.equal(frame_lengths(device_batch["sample_lengths"], UNDITHERED), worker_batch["feat_lengths"])
    assert all(n <= most for n, most in zip(lengths.tolist(), workers.max_frames * 2, strict=True))
    torch.testing.assert_close(feats, worker_batch["feats"], rtol=0, atol=1e-3)  # raw 16-bit-scale log-mels


def _matches(ours: dict[str, list[float]], theirs: dict[str, list[float]], n_theirs: int) -> bool:
    """Whether two mask_statistics agree within sampling noise: every per-frame and per-bin masking rate within
    5 standard errors (two samples), and the distributions of masked frames and bins per row within a
    Kolmogorov-Smirnov distance whose chance of being exceeded by noise is under 1e-5."""
    scale = 1 / OURS + 1 / n_theirs
    for key in ("frame_masked", "bin_masked"):
        for p_ours, p_theirs in zip(ours[key], theirs[key], strict=True):
            p = (p_ours + p_theirs) / 2
            if abs(p_ours - p_theirs) > 5 * (p * (1 - p) * scale) ** 0.5 + 1e-9:
                return False
    for key in ("zero_frames", "zero_bins"):
        cdf_ours = torch.tensor(ours[key]).cumsum(0)
        cdf_theirs = torch.tensor(theirs[key], dtype=torch.float64).cumsum(0)
        if float((cdf_ours - cdf_theirs).abs().max()) > 2.5 * scale**0.5:
            return False
    return True


def _batched_statistics(padded_bound: bool) -> dict[str, dict[str, list[float]]]:
    """Our masks on one padded batch mixing every recorded length (so each row is bounded by its own length), on
    ones with ones in the padding too: the padding must come back untouched. padded_bound: draw time masks over the
    padded length instead (the mistake the comparison must catch)."""
    recorded = json.loads(REFERENCE.read_text())
    sizes = [int(frames) for frames in recorded["lengths"]]
    lengths = torch.tensor(sizes).repeat(OURS)
    feats = torch.ones(lengths.shape[0], max(sizes), recorded["bins"], dtype=torch.uint8)  # 1/4 of float32's memory
    drawn_for = torch.full_like(lengths, max(sizes)) if padded_bound else lengths
    masks = draw_masks(drawn_for, recorded["bins"], SpecAugmentConfig(), torch.Generator().manual_seed(0))
    masked = apply_masks(feats, lengths, masks)
    padding = torch.arange(max(sizes)).unsqueeze(0) >= lengths.unsqueeze(1)
    assert bool((masked[padding] == 1).all())  # never written into padding
    return {str(size): mask_statistics(masked[lengths == size, :size], lengths[lengths == size]) for size in sizes}


def test_the_masks_are_drawn_as_wenets_spec_aug_draws_them() -> None:
    """Against WeNet's own spec_aug (wenet/dataset/processor.py at 0154699, run on 20000 matrices per length): the
    same masking rate at every frame and bin, and the same distribution of masked frames and bins per utterance,
    for an utterance shorter than one time mask (30 frames), 120 and 300, all in one padded batch."""
    recorded = json.loads(REFERENCE.read_text())
    assert recorded["commit"].startswith("0154699") and recorded["file"] == "wenet/dataset/processor.py"
    ours = _batched_statistics(padded_bound=False)
    for size, theirs in recorded["lengths"].items():
        assert _matches(ours[size], theirs, recorded["draws"]), size
    # The comparison has the power to see a mask bounded by the padded length rather than the utterance's own.
    wrong = _batched_statistics(padded_bound=True)
    assert not _matches(wrong["30"], recorded["lengths"]["30"], recorded["draws"])
    assert not _matches(wrong["120"], recorded["lengths"]["120"], recorded["draws"])


def test_the_workers_spec_augment_is_the_batched_masks_for_one_utterance() -> None:
    """autotune.data.asr.spec_augment (the workers' path) draws with draw_masks for a batch of one."""
    from autotune.data.asr import spec_augment

    feats = torch.ones(40, 80)
    torch.manual_seed(7)
    alone = spec_augment(feats, SpecAugmentConfig())
    torch.manual_seed(7)
    masks = draw_masks(torch.tensor([40]), 80, SpecAugmentConfig())
    assert torch.equal(alone, apply_masks(feats.unsqueeze(0), torch.tensor([40]), masks).squeeze(0))
    assert torch.equal(feats, torch.ones(40, 80))


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_the_step_computes_the_features_in_float32_under_autocast(dtype: torch.dtype) -> None:
    waveforms, samples = _waveforms([8000, 4000])
    with torch.autocast("cpu", dtype=dtype):
        feats, _ = device_features(waveforms, samples, WENET_FBANK, SpecAugmentConfig())
    assert feats.dtype == torch.float32 and bool(torch.isfinite(feats).all())


def test_the_steps_dither_is_the_workers_in_distribution() -> None:
    """WeNet's dither (0.1 on the 16-bit scale) draws other numbers in the batch than Kaldi's loop: on audio with a
    silent stretch, where dither moves the log-mels most, both change the undithered features by the same amount."""
    waveforms, samples = _waveforms([16000, 12000])
    waveforms[:, 2000:6000] = 0.0  # digital silence: log(eps) without dither
    torch.manual_seed(0)
    dithered, lengths = device_features(waveforms, samples, WENET_FBANK, None)
    plain, _ = device_features(waveforms, samples, UNDITHERED, None)
    batched = torch.cat([(dithered - plain)[row, :length] for row, length in enumerate(lengths.tolist())])
    each = torch.cat(
        [
            wenet_fbank(waveforms[row, :length], WENET_FBANK) - wenet_fbank(waveforms[row, :length], UNDITHERED)
            for row, length in enumerate(samples.tolist())
        ]
    )
    assert batched.abs().mean() > 1.0  # the silent frames really moved
    assert batched.abs().mean() / each.abs().mean() == pytest.approx(1.0, rel=0.02)  # measured: within 0.5%
