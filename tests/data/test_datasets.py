"""Tests for autotune.data.datasets: per-item decode/crop/fbank and batching through a DataLoader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from autotune.data import (
    SpeakerCropDataset,
    SpeakerlabDataset,
    Utterance,
    collate_speaker_batch,
    generate_corpus,
    load_source,
)
from autotune.data.audio import read_segment
from autotune.errors import DataError

FRAMES, BINS = 298, 80


def _write(path: Path, audio: np.ndarray, sample_rate: int = 16000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, audio, sample_rate)
    return path


def _tone(seconds: float, freq_hz: float, sample_rate: int = 16000) -> np.ndarray:
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    return 0.3 * np.sin(2 * np.pi * freq_hz * t)


def _utt(path: Path, speaker: str = "s", **kwargs: object) -> Utterance:
    info = sf.info(path)
    return Utterance(utt_id=path.stem, path=str(path), speaker=speaker, duration_s=info.duration, **kwargs)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("datasets") / "corpus"
    return generate_corpus(folder, n_speakers=4, files_per_speaker=3, min_duration_s=1.0, max_duration_s=2.0)


def test_items_have_fixed_shape_and_right_labels(corpus: Path) -> None:
    source = load_source(corpus)
    dataset = SpeakerCropDataset(source.utterances, source.speakers)
    assert len(dataset) == 12 and dataset.num_frames == FRAMES
    for index, utt in enumerate(source.utterances):
        feats, label = dataset[index]
        assert feats.shape == (FRAMES, BINS) and feats.dtype == torch.float32
        assert label == source.speakers.index(utt.speaker) == int(utt.speaker[-1])


def test_short_clip_is_zero_padded_at_the_end(tmp_path: Path) -> None:
    dataset = SpeakerCropDataset([_utt(_write(tmp_path / "short.wav", _tone(1.0, 300.0)))], ["s"])
    feats, _ = dataset[0]
    assert feats.shape == (FRAMES, BINS)
    # Frames wholly inside the padding see only zeros: identical rows; frames of the tone are not silent.
    padded = feats[100:]
    assert torch.allclose(padded, padded[:1].expand_as(padded))
    assert (feats[:97].mean(dim=1) > padded[0].mean() + 1.0).all()


def test_long_clip_gets_random_crops(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    dataset = SpeakerCropDataset([_utt(_write(tmp_path / "long.wav", 0.1 * rng.standard_normal(16000 * 20)))], ["s"])
    torch.manual_seed(0)
    first, second = dataset[0][0], dataset[0][0]
    assert first.shape == second.shape == (FRAMES, BINS) and not torch.equal(first, second)
    torch.manual_seed(0)
    assert torch.equal(dataset[0][0], first)


def test_segment_bounds_are_honoured(tmp_path: Path) -> None:
    path = _write(tmp_path / "two.wav", np.concatenate([np.zeros(48000), _tone(3.0, 300.0)]))
    silent = SpeakerCropDataset([_utt(path, start_sample=0, stop_sample=16000)], ["s"])[0][0]
    assert silent.abs().max() < 1e-4  # only zeros were read: every frame equals the mean
    toned = SpeakerCropDataset([_utt(path, start_sample=48000, stop_sample=64000)], ["s"])[0][0]
    # 1 s of tone from the segment's start, then padding: the stop bound is honoured too.
    assert (toned[:97].mean(dim=1) > toned[100:].mean(dim=1).max() + 1.0).all()
    assert torch.allclose(toned[100:], toned[100:101].expand_as(toned[100:]))


def test_resampling_and_stereo(tmp_path: Path) -> None:
    mono_8k = _write(tmp_path / "8k.wav", _tone(4.0, 300.0, sample_rate=8000), sample_rate=8000)
    stereo = _write(tmp_path / "stereo.flac", np.stack([_tone(4.0, 300.0), _tone(4.0, 500.0)], axis=1))
    dataset = SpeakerCropDataset([_utt(mono_8k), _utt(stereo)], ["s"])
    for index in range(2):
        assert dataset[index][0].shape == (FRAMES, BINS)


def test_unreadable_audio_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "gone_bad.wav", _tone(1.0, 300.0))
    dataset = SpeakerCropDataset([_utt(path)], ["s"])
    path.write_bytes(b"no longer audio")
    with pytest.raises(DataError, match="gone_bad.wav") as info:
        dataset[0]
    assert "\n" not in str(info.value)


def test_unknown_speaker_is_a_bug() -> None:
    with pytest.raises(ValueError, match="not in the speakers"):
        SpeakerCropDataset([Utterance(utt_id="u", path="/x.wav", speaker="b", duration_s=1.0)], ["a"])


def test_collate() -> None:
    items = [(torch.full((FRAMES, BINS), float(i)), i) for i in range(3)]
    feats, labels = collate_speaker_batch(items)
    assert feats.shape == (3, FRAMES, BINS) and labels.dtype == torch.int64
    assert labels.tolist() == [0, 1, 2] and torch.equal(feats[2], items[2][0])


def test_dataloader_with_workers(corpus: Path) -> None:
    source = load_source(corpus)
    dataset = SpeakerCropDataset(source.utterances, source.speakers)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate_speaker_batch)
    labels_seen = []
    for feats, labels in loader:
        assert feats.shape == (4, FRAMES, BINS) and feats.dtype == torch.float32
        assert labels.dtype == torch.int64 and labels.shape == (4,)
        labels_seen += labels.tolist()
    assert labels_seen == [source.speakers.index(u.speaker) for u in source.utterances]


def test_speakerlab_items_perturb_the_whole_segment_then_crop(tmp_path: Path) -> None:
    """WavReader decodes the whole file, plays it at 0.9/1.0/1.1 speed (pitch moves with it), then crops 3 s."""
    pulses = _tone(5.0, 1000.0) * (np.arange(80000) // 4000 % 2)  # 1 kHz, on and off every 0.25 s
    path = _write(tmp_path / "tone.wav", pulses + 1e-3 * np.random.default_rng(0).standard_normal(80000))
    asked: list[float | None] = []

    def reader(utt: Utterance, *, crop_s: float | None = None) -> tuple[torch.Tensor, int]:
        asked.append(crop_s)
        return read_segment(utt, crop_s=crop_s)

    dataset = SpeakerlabDataset([_utt(path), _utt(path, speaker="t")], ["s", "t"], audio=reader)
    assert dataset.num_classes == 6
    peaks: dict[int, set[int]] = {}
    torch.manual_seed(0)
    for draw in range(30):
        feats, label = dataset[draw % 2]
        assert feats.shape == (FRAMES, BINS) and label % 2 == draw % 2
        peaks.setdefault(label // 2, set()).add(int(feats.std(dim=0).argmax()))  # the mel bin of the tone
    assert set(asked) == {None}  # always the whole segment
    assert sorted(peaks) == [0, 1, 2] and all(len(bins) == 1 for bins in peaks.values())
    (normal,), (slower,), (faster,) = (peaks[index] for index in range(3))
    assert slower < normal < faster  # speed 0.9 lowers the tone's pitch, 1.1 raises it
    plain = SpeakerlabDataset([_utt(path)], ["s"], speed_perturb=False)
    assert plain.num_classes == 1 and {plain[0][1] for _ in range(5)} == {0}
