"""Tests for autotune.data.preload: decoded audio in shared RAM, read back as read_segment reads it from disk."""

from __future__ import annotations

import math
import pickle
import shutil
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from autotune.data import SpeakerCropDataset, Utterance, collate_speaker_batch, load_source
from autotune.data.audio import read_segment
from autotune.data.pcm import PCM_FULL_SCALE, pcm_bytes
from autotune.data.preload import PreloadedAudio
from autotune.errors import DataError

ONE_LSB = 1 / PCM_FULL_SCALE


def _utt(path: Path, utt_id: str | None = None, **bounds: int | None) -> Utterance:
    duration_s = sf.info(path).duration
    return Utterance(utt_id=utt_id or path.stem, path=str(path), speaker="s", duration_s=duration_s, **bounds)


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 s of 16-bit noise at 16 kHz: every sample distinct enough to locate a crop."""
    path = tmp_path_factory.mktemp("preload") / "long.wav"
    sf.write(path, np.random.default_rng(0).uniform(-0.5, 0.5, 48000), 16000, subtype="PCM_16")
    return path


def test_full_segments_equal_read_segment_and_the_tensor_is_shared(tiny_corpus: Path) -> None:
    source = load_source(tiny_corpus)
    audio = PreloadedAudio.load(source.utterances, threads=3)
    assert len(audio) == len(source.utterances) and audio.load_s > 0
    assert audio.samples.is_shared() and audio.samples.dtype == torch.int16
    expected_samples = sum(read_segment(utt)[0].numel() for utt in source.utterances)
    assert audio.samples.numel() == expected_samples and audio.nbytes == pcm_bytes(expected_samples)
    for utt in source.utterances:
        (from_disk, disk_rate), (from_ram, ram_rate) = read_segment(utt), audio(utt)
        assert ram_rate == disk_rate == utt.sample_rate and from_ram.dtype == torch.float32
        assert torch.equal(from_ram, from_disk)  # 16-bit files: the stored samples themselves


def test_spawned_workers_get_a_handle_not_a_copy(tiny_corpus: Path) -> None:
    audio = PreloadedAudio.load(load_source(tiny_corpus).utterances)
    # How a DataLoader sends its dataset to a spawned worker: torch's reductions pass shared storage by handle.
    assert len(ForkingPickler.dumps(audio)) < audio.nbytes / 100 < len(pickle.dumps(audio)) / 100


def test_crops_are_read_segments_crops(long_file: Path) -> None:
    utt = _utt(long_file)
    audio = PreloadedAudio.load([utt])
    full = read_segment(utt)[0]
    for seed in range(5):
        torch.manual_seed(seed)
        crop, rate = audio(utt, crop_s=0.5)
        torch.manual_seed(seed)
        assert torch.equal(crop, read_segment(utt, crop_s=0.5)[0])  # same draw, same window
        assert crop.numel() == math.ceil(0.5 * rate) == 8000
        starts = torch.nonzero(full == crop[0]).flatten().tolist()  # 16-bit values repeat: try each candidate
        assert any(torch.equal(full[start : start + crop.numel()], crop) for start in starts)
    assert audio(utt, crop_s=10.0)[0].numel() == full.numel()  # a crop longer than the segment is all of it


def test_segments_of_a_long_file(long_file: Path) -> None:
    utts = [
        _utt(long_file, "middle", start_sample=8000, stop_sample=24000),
        _utt(long_file, "tail", start_sample=40000),  # no stop: the file's header says where it ends
        _utt(long_file, "past_the_end", start_sample=46000, stop_sample=48800),  # clamped, as read_segment does
    ]
    audio = PreloadedAudio.load(utts)
    for utt, samples in zip(utts, (16000, 8000, 2000), strict=True):
        waveform, _ = audio(utt)
        assert waveform.numel() == samples and torch.equal(waveform, read_segment(utt)[0])
        torch.manual_seed(1)
        crop = audio(utt, crop_s=0.1)[0]
        torch.manual_seed(1)
        assert torch.equal(crop, read_segment(utt, crop_s=0.1)[0])


def test_stereo_and_float_files_are_converted_within_one_step(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    sf.write(tmp_path / "stereo.wav", rng.uniform(-0.9, 0.9, (4000, 2)), 16000, subtype="PCM_16")
    sf.write(tmp_path / "float.wav", rng.uniform(-0.9, 0.9, 4000), 22050, subtype="FLOAT")
    utts = [_utt(tmp_path / "stereo.wav"), _utt(tmp_path / "float.wav")]
    audio = PreloadedAudio.load(utts)
    for utt in utts:
        (from_disk, disk_rate), (from_ram, ram_rate) = read_segment(utt), audio(utt)
        assert ram_rate == disk_rate and from_ram.shape == from_disk.shape
        assert (from_ram - from_disk).abs().max() <= ONE_LSB


def test_unreadable_file_raises_read_segments_error(tiny_corpus: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF not really a wave file")
    good = load_source(tiny_corpus).utterances[0]
    bad = Utterance(utt_id="broken", path=str(broken), speaker="s", duration_s=1.0, sample_rate=16000)
    with pytest.raises(DataError, match=r"cannot read audio file .*broken\.wav \(utterance broken\)"):
        PreloadedAudio.load([good, bad])
    with pytest.raises(DataError) as from_disk:
        read_segment(bad)
    with pytest.raises(DataError) as from_preload:
        PreloadedAudio.load([bad])
    assert str(from_preload.value) == str(from_disk.value)


def test_lookup_is_by_id_and_ids_must_be_unique(long_file: Path) -> None:
    utt = _utt(long_file, "a", start_sample=0, stop_sample=100)
    audio = PreloadedAudio.load([utt])
    with pytest.raises(KeyError, match="'b' was not preloaded"):
        audio(_utt(long_file, "b"))
    with pytest.raises(ValueError, match="unique"):
        PreloadedAudio.load([utt, utt])


def _batches(dataset: SpeakerCropDataset) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=2,
        collate_fn=collate_speaker_batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    return list(loader)


def test_dataloader_workers_read_the_same_crops_from_ram(tiny_corpus: Path, tmp_path: Path) -> None:
    source = load_source(shutil.copytree(tiny_corpus, tmp_path / "corpus"))
    from_disk = SpeakerCropDataset(source.utterances, source.speakers, crop_s=0.5)
    disk_batches = _batches(from_disk)
    audio = PreloadedAudio.load(source.utterances)
    for utt in source.utterances:  # what the workers read now can only come from RAM
        Path(utt.path).unlink()
    ram_batches = _batches(SpeakerCropDataset(source.utterances, source.speakers, crop_s=0.5, audio=audio))
    assert len(ram_batches) == len(disk_batches) == 3
    for (disk_feats, disk_labels), (ram_feats, ram_labels) in zip(disk_batches, ram_batches, strict=True):
        assert ram_feats.shape == disk_feats.shape == (4, 48, 80)
        assert torch.equal(ram_labels, disk_labels) and torch.allclose(ram_feats, disk_feats)
