"""TTS items: symbol ids, even durations, the cepstral pitch estimator and what the dataset computes per item."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune.data import load_source
from autotune.data.tts import (
    SYMBOLS,
    MelConfig,
    TtsDataset,
    TtsFeaturizer,
    collate_tts_batch,
    even_durations,
    mel_frames,
    text_to_ids,
)


def test_text_to_ids_reads_characters_and_arpabet() -> None:
    assert SYMBOLS[0] == "_" and len(set(SYMBOLS)) == len(SYMBOLS) == 360  # ming024's table, pinyin included
    ids = text_to_ids("Hi,  {HH AH0 sp} x#")
    assert [SYMBOLS[i] for i in ids] == ["h", "i", ",", " ", "@HH", "@AH0", "@sp", " ", "x"]
    assert [SYMBOLS[i] for i in text_to_ids("{n i3 h ao3 rr}")] == ["@n", "@i3", "@h", "@ao3", "@rr"]


@pytest.mark.parametrize(("frames", "tokens"), [(10, 3), (7, 7), (100, 9), (2, 5)])
def test_even_durations_cover_every_frame(frames: int, tokens: int) -> None:
    durations = even_durations(frames, tokens)
    assert len(durations) == tokens and int(durations.sum()) == frames
    assert int(durations.max() - durations.min()) <= 1


def _harmonic_vowel(f0_hz: float, rate: int, seconds: float) -> np.ndarray:
    """A glottal-pulse-like harmonic series through two formant peaks, with 30 ms of silence at each end."""
    t = np.arange(int(rate * seconds)) / rate
    harmonics = np.arange(1, int(4000 / f0_hz))
    weights = 1.0 / harmonics * (1 + 4 * np.exp(-(((harmonics * f0_hz - 700) / 150) ** 2)))
    voiced = (weights[:, None] * np.sin(2 * np.pi * f0_hz * harmonics[:, None] * t)).sum(axis=0)
    silence = np.zeros(int(0.03 * rate))
    return np.concatenate([silence, 0.5 * voiced / np.abs(voiced).max(), silence])


@pytest.mark.parametrize("f0_hz", [95.0, 140.0, 230.0])
def test_cepstral_pitch_finds_the_fundamental_despite_a_strong_formant(f0_hz: float) -> None:
    config = MelConfig()
    audio = torch.from_numpy(_harmonic_vowel(f0_hz, config.sample_rate, 0.5).astype(np.float32))
    spectrum = torch.stft(
        audio, config.n_fft, config.hop_length, window=torch.hann_window(config.n_fft), return_complex=True
    ).T
    f0 = TtsFeaturizer(config).pitch(spectrum.abs())
    assert float(f0[5:-5].median()) == pytest.approx(f0_hz, rel=0.03)


def test_items_hold_aligned_targets(tmp_path: Path) -> None:
    rate = 16000
    sf.write(tmp_path / "a.wav", _harmonic_vowel(120.0, rate, 1.2), rate)
    sf.write(tmp_path / "b.wav", _harmonic_vowel(180.0, rate, 0.6), rate)
    (tmp_path / "data.list").write_text(
        '{"key": "a", "wav": "a.wav", "txt": "{AA1 sp} ah"}\n{"key": "b", "wav": "b.wav", "txt": "oh"}\n'
        '{"key": "c", "wav": "b.wav", "txt": "###"}\n'
    )
    dataset = TtsDataset(load_source(tmp_path / "data.list").utterances)
    assert len(dataset) == 2 and dataset.n_filtered == 1  # no known symbol in "###"
    items = [dataset[index] for index in range(len(dataset))]
    for item, utt in zip(items, dataset.utterances, strict=True):
        frames = item["mel"].shape[0]
        assert item["mel"].shape[1] == 80 and frames == mel_frames(utt, dataset.config)  # 22.05 kHz, hop 256
        assert int(item["durations"].sum()) == frames and len(item["durations"]) == len(item["tokens"])
        for key in ("pitch", "energy"):
            assert item[key].shape == item["tokens"].shape and torch.isfinite(item[key]).all()
            assert float(item[key].mean()) == pytest.approx(0.0, abs=1e-5)  # normalised per utterance
    batch = collate_tts_batch(items)
    assert batch["tokens"].shape == (2, 5) and batch["token_lengths"].tolist() == [5, 2]
    assert batch["mels"].shape[0] == 2 and batch["mel_lengths"].tolist() == [item["mel"].shape[0] for item in items]
    assert float(batch["durations_s"].sum()) == pytest.approx(1.26 + 0.66, abs=1e-3)
