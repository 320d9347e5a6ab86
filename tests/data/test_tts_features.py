"""TTS targets precomputed once, as ming024's preprocess.py: files, corpus-wide normalisation, stats, cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune.data import load_source
from autotune.data.tts import MelConfig, TtsFeaturizer, collate_tts_batch, usable_for_tts
from autotune.data.tts_features import (
    FeatureStore,
    PrecomputedTtsDataset,
    _without_outliers,
    ensure_tts_features,
)
from tests.data.test_tts import _harmonic_vowel


@pytest.fixture
def voices(tmp_path: Path) -> tuple[tuple, tuple]:
    """Three vowels at different pitches (one at 22.05 kHz, two resampled from 16 kHz) with their symbol ids."""
    for name, f0, rate, seconds in [("a", 110.0, 16000, 1.0), ("b", 190.0, 22050, 0.7), ("c", 150.0, 16000, 0.5)]:
        sf.write(tmp_path / f"{name}.wav", _harmonic_vowel(f0, rate, seconds), rate)
    lines = [
        '{"key": "a", "wav": "a.wav", "txt": "{AA1 sp} ah"}',
        '{"key": "b", "wav": "b.wav", "txt": "oh no"}',
        '{"key": "c", "wav": "c.wav", "txt": "{IY1}"}',
        '{"key": "d", "wav": "c.wav", "txt": "###"}',  # no known symbol: not prepared
    ]
    (tmp_path / "data.list").write_text("\n".join(lines) + "\n")
    return usable_for_tts(load_source(tmp_path / "data.list").utterances, MelConfig(), 1000)


def test_targets_are_normalised_over_the_corpus_as_ming024(voices: tuple, tmp_path: Path) -> None:
    utterances, tokens = voices
    assert [u.utt_id for u in utterances] == ["a", "b", "c"]
    store, prepared = ensure_tts_features(utterances, tokens, cache_dir=tmp_path / "cache")
    assert not prepared.reused and prepared.items == 3 and Path(prepared.path) == store.root
    featurizer = TtsFeaturizer()
    raw = [featurizer(*_read(u), len(t)) for u, t in zip(utterances, tokens, strict=True)]
    dataset = PrecomputedTtsDataset(store, utterances, tokens)
    for kind, stats in (("pitch", store.pitch), ("energy", store.energy)):
        values = [item[kind].double().numpy() for item in raw]
        fitted = np.concatenate([_without_outliers(v) for v in values])
        assert stats.mean == pytest.approx(fitted.mean()) and stats.std == pytest.approx(fitted.std())  # population
        normalised = [(v - stats.mean) / stats.std for v in values]
        assert stats.minimum == pytest.approx(min(v.min() for v in normalised), abs=1e-5)
        assert stats.maximum == pytest.approx(max(v.max() for v in normalised), abs=1e-5)
        for index, expected in enumerate(normalised):
            np.testing.assert_allclose(dataset[index][kind].numpy(), expected, rtol=1e-5, atol=1e-5)
    # ming024's stats.json: [min, max, mean, std] per variance.
    written = json.loads((store.root / "stats.json").read_text())
    assert written["pitch"] == pytest.approx(
        [store.pitch.minimum, store.pitch.maximum, store.pitch.mean, store.pitch.std]
    )
    for index, item in enumerate(raw):
        got = dataset[index]
        assert torch.equal(got["mel"], item["mel"]) and torch.equal(got["durations"], item["durations"])
        assert torch.equal(got["tokens"], tokens[index]) and store.frames[index] == item["mel"].shape[0]
        assert sorted(p.name for p in store.root.iterdir() if p.is_dir()) == ["duration", "energy", "mel", "pitch"]
    batch = collate_tts_batch([dataset[0], dataset[1]])
    assert batch["mels"].shape == (2, max(store.frames[:2]), 80)


def _read(utt: object) -> tuple[torch.Tensor, int]:
    from autotune.data.audio import read_segment

    return read_segment(utt)  # type: ignore[arg-type]


def test_outliers_are_left_out_of_the_fit_as_ming024() -> None:
    values = np.array([1.0, 2.0, 2.0, 3.0, 50.0])  # quartiles 2 and 3: the fence is (0.5, 4.5)
    assert _without_outliers(values).tolist() == [1.0, 2.0, 2.0, 3.0]


def test_prepared_once_and_a_half_built_folder_is_never_used(voices: tuple, tmp_path: Path) -> None:
    utterances, tokens = voices
    store, first = ensure_tts_features(utterances, tokens, cache_dir=tmp_path / "cache")
    again, second = ensure_tts_features(utterances, tokens, cache_dir=tmp_path / "cache")
    assert second.reused and second.seconds == 0.0 and again == store
    (store.root / "manifest.json").unlink()  # as if the run had been killed before finishing
    rebuilt, third = ensure_tts_features(utterances, tokens, cache_dir=tmp_path / "cache")
    assert not third.reused and FeatureStore.load(rebuilt.root) == rebuilt and rebuilt.frames == store.frames
    # Other transcripts are other durations: another entry.
    _, other = ensure_tts_features(utterances[:2], tokens[:2], cache_dir=tmp_path / "cache")
    assert other.path != first.path and not other.reused
