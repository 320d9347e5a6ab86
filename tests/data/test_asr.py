"""Tests for the ASR data path: data.list and Kaldi text, tokeniser, features, SpecAugment, collate, batching."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF
from torchaudio.compliance import kaldi

from autotune.data import DataSource, load_source
from autotune.data.asr import (
    WENET_FBANK,
    AsrDataset,
    CharVocabulary,
    FilterConfig,
    collate_asr_batch,
    spec_augment,
    split_characters,
)
from autotune.data.asr_features import SpecAugmentConfig
from autotune.data.audio import read_segment
from autotune.data.batching import LengthSortedBatchSampler
from autotune.errors import DataError

SR = 16000


def write_tone(path: Path, seconds: float, *, sample_rate: int = SR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    noise = np.random.default_rng(0).standard_normal(t.size)
    sf.write(path, 0.3 * np.sin(2 * np.pi * 220.0 * t) + 0.01 * noise, sample_rate)
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def entry(**fields: object) -> str:
    return json.dumps(fields, ensure_ascii=False)


def test_data_list_paths_segments_speakers_and_text(tmp_path: Path) -> None:
    write_tone(tmp_path / "wav" / "a.wav", 3.0)
    absolute = write_tone(tmp_path / "elsewhere" / "b.flac", 1.5, sample_rate=8000)
    data_list = write_lines(
        tmp_path / "lists" / "data.list",
        [
            entry(key="a1", wav="../wav/a.wav", txt="甚至 出现", start=0.5, end=2.0),
            "",
            entry(key="b", wav=str(absolute), txt="ab", spk="alice"),
        ],
    )
    source = load_source(data_list)
    assert source.kind == "wenet-data-list"
    first, second = source.utterances
    assert first.path == str(tmp_path / "wav" / "a.wav") and first.text == "甚至 出现"
    assert (first.start_sample, first.stop_sample, first.duration_s) == (8000, 32000, 1.5)
    assert first.speaker == "a1"  # no spk: the key, as Kaldi does for unknown speakers
    assert (second.speaker, second.text, second.sample_rate) == ("alice", "ab", 8000)
    assert source.speakers == ("a1", "alice")
    # A folder holding a data.list (and no wav.scp) is read through it; so is a .jsonl file.
    assert load_source(data_list.parent).utterances == source.utterances
    jsonl = write_lines(tmp_path / "lists" / "train.jsonl", data_list.read_text().splitlines())
    assert load_source(jsonl).utterances == source.utterances
    assert DataSource.from_dict(json.loads(json.dumps(source.to_dict()))) == source


def test_kaldi_text_fills_transcripts_and_replaces_utt2spk(tmp_path: Path) -> None:
    for name in ("u1", "u2", "u3"):
        write_tone(tmp_path / "audio" / f"{name}.wav", 0.5)
    data = tmp_path / "data"
    write_lines(data / "wav.scp", [f"u{i} ../audio/u{i}.wav" for i in (1, 2, 3)])
    write_lines(data / "text", ["u1 甚至 出现 交易", "u2", "", "unused hello"])
    source = load_source(data)
    assert [(u.utt_id, u.speaker, u.text) for u in source.utterances] == [
        ("u1", "u1", "甚至 出现 交易"),
        ("u2", "u2", ""),
        ("u3", "u3", None),
    ]
    write_lines(data / "utt2spk", ["u1 s1", "u2 s1", "u3 s2"])
    assert [u.speaker for u in load_source(data).utterances] == ["s1", "s1", "s2"]


DATA_LIST_ERRORS = {
    "not-json": ("/data/shards/shards_000000000.tar", ["line 1", "not a JSON object", "shard"]),
    # json raises a bare ValueError (no .msg) for an integer past Python's 4300-digit limit
    "huge-integer": ('{"key": ' + "9" * 5000 + "}", ["line 1", "not a JSON object", "4300 digits"]),
    "not-an-object": ('["a", "b.wav", "x"]', ["line 1", "JSON object", "list"]),
    "missing-txt": (entry(key="a", wav="a.wav"), ["line 1", '"txt"']),
    "txt-not-string": (entry(key="a", wav="a.wav", txt=3), ["line 1", '"txt"', "string"]),
    "empty-wav": (entry(key="a", wav=" ", txt="x"), ["line 1", '"wav"']),
    "key-with-space": (entry(key="a b", wav="a.wav", txt="x"), ["line 1", "whitespace"]),
    "start-without-end": (entry(key="a", wav="a.wav", txt="x", start=0.0), ["line 1", '"start" and "end"']),
    "start-not-number": (entry(key="a", wav="a.wav", txt="x", start="0", end=1), ["line 1", '"start"', "seconds"]),
    "start-after-end": (entry(key="a", wav="a.wav", txt="x", start=2.0, end=1.0), ["line 1", "below end"]),
}


@pytest.mark.parametrize("case", DATA_LIST_ERRORS.values(), ids=DATA_LIST_ERRORS.keys())
def test_data_list_errors_are_one_line(tmp_path: Path, case: tuple[str, list[str]]) -> None:
    line, words = case
    with pytest.raises(DataError) as info:
        load_source(write_lines(tmp_path / "data.list", [line]))
    message = str(info.value)
    assert "\n" not in message and "data.list" in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_data_list_duplicate_key_and_missing_audio_name_their_lines(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav", 0.5)
    good = entry(key="a", wav="a.wav", txt="x")
    with pytest.raises(DataError, match="line 3: key 'a' is already used on line 1"):
        load_source(write_lines(tmp_path / "data.list", [good, "", good]))
    with pytest.raises(DataError, match="line 2: audio file .*gone.wav does not exist"):
        load_source(write_lines(tmp_path / "data.list", [good, entry(key="b", wav="gone.wav", txt="x")]))
    with pytest.raises(DataError, match="line 1: segment 0-9 s goes past the end"):
        load_source(write_lines(tmp_path / "data.list", [entry(key="a", wav="a.wav", txt="x", start=0, end=9)]))


def test_tokeniser_is_wenet_char_dictionary() -> None:
    assert split_characters(" ab c ") == ["a", "b", "▁", "c"]
    vocab = CharVocabulary.from_texts(["ab a", "ca", "甚"])
    # WeNet's aishell run.sh stage 2: <blank> 0, <unk> 1, <sos/eos> 2, then the sorted characters from 3.
    assert vocab.symbols == ("<blank>", "<unk>", "<sos/eos>", "a", "b", "c", "▁", "甚")
    assert len(vocab) == 8
    assert vocab.encode("ab z甚") == [3, 4, 6, 1, 7]
    assert vocab.encode("") == []


def test_spec_augment_really_masks() -> None:
    torch.manual_seed(0)
    feats = torch.ones(300, 80)
    masked = spec_augment(feats, SpecAugmentConfig())
    assert torch.equal(feats, torch.ones(300, 80))  # a new tensor, the input untouched
    zero_rows = int((masked == 0).all(dim=1).sum())
    zero_cols = int((masked == 0).all(dim=0).sum())
    assert 1 <= zero_rows <= 2 * 50 and 1 <= zero_cols <= 2 * 10
    # Everything else is left alone.
    assert bool((masked[~(masked == 0).all(dim=1)][:, ~(masked == 0).all(dim=0)] == 1).all())
    assert torch.equal(spec_augment(feats, SpecAugmentConfig(num_time_masks=0, num_freq_masks=0)), feats)


def test_filter_config_is_wenets() -> None:
    wenet = FilterConfig()
    assert wenet.keeps(2.0, 10)
    assert not wenet.keeps(2.0, 0)  # token_min_length 1
    assert not wenet.keeps(2.0, 201)  # token_max_length 200
    assert not wenet.keeps(409.7, 10)  # max_length 40960 frames
    assert not wenet.keeps(0.05, 6)  # more tokens than frames (max_output_input_ratio 1)


@pytest.fixture
def tones(tmp_path: Path) -> list:
    write_tone(tmp_path / "long.wav", 1.2)
    write_tone(tmp_path / "short.wav", 0.5, sample_rate=8000)
    write_tone(tmp_path / "tiny.wav", 0.06)
    lines = [
        entry(key="long", wav="long.wav", txt="aeiou"),
        entry(key="short", wav="short.wav", txt="ia"),
        entry(key="silent", wav="long.wav", txt=""),  # no tokens: filtered
        entry(key="tiny", wav="tiny.wav", txt="a"),  # under 7 frames: filtered
    ]
    return list(load_source(write_lines(tmp_path / "data.list", lines)).utterances)


def test_dataset_items_filter_and_frame_counts(tones: list) -> None:
    vocab = CharVocabulary.from_texts(u.text for u in tones)
    exact = AsrDataset(tones, vocab, speeds=(1.0,), spec_aug=None, min_input_frames=7)
    undithered = AsrDataset(tones, vocab, fbank=replace(WENET_FBANK, dither=0.0), speeds=(1.0,), spec_aug=None)
    assert [u.utt_id for u in exact.utterances] == ["long", "short"] and exact.n_filtered == 2
    assert exact.max_frames == (118, 48)
    for index in range(len(exact)):
        feats, tokens, duration_s = exact[index]
        assert feats.dtype == torch.float32 and feats.shape == (exact.max_frames[index], 80)
        assert bool(torch.isfinite(feats).all())
        # Raw fbank, as WeNet's pipeline yields it: the model's global CMVN normalises (no per-utterance CMVN).
        waveform, rate = read_segment(exact.utterances[index])
        if rate != SR:
            waveform = AF.resample(waveform, rate, SR)
        by_hand = kaldi.fbank(waveform.unsqueeze(0) * 32768, num_mel_bins=80, dither=0.0, energy_floor=0.0)
        torch.testing.assert_close(undithered[index][0], by_hand)
        assert tokens.tolist() == vocab.encode(exact.utterances[index].text)
        assert duration_s == exact.utterances[index].duration_s
    for speed in (0.9, 1.1):  # the predicted frame count is exact at every speed, resampling included
        one_speed = AsrDataset(tones, vocab, speeds=(speed,), spec_aug=None, min_input_frames=7)
        assert [one_speed[i][0].shape[0] for i in range(2)] == list(one_speed.max_frames)
    torch.manual_seed(0)
    perturbed = AsrDataset(tones, vocab, min_input_frames=7)  # speeds 0.9/1.0/1.1, SpecAugment
    assert perturbed.max_frames == (131, 54)  # at the slowest speed
    lengths = {perturbed[0][0].shape[0] for _ in range(12)}
    assert lengths <= {107, 118, 131} and len(lengths) > 1
    assert bool((perturbed[0][0] == 0).all(dim=1).any()) and bool((perturbed[0][0] == 0).all(dim=0).any())
    with pytest.raises(ValueError, match="no transcript"):
        AsrDataset([*tones[:1], _without_text(tones[1])], vocab)


def _without_text(utterance: object) -> object:
    return replace(utterance, text=None)  # type: ignore[type-var]


def test_collate_pads_features_with_zero_and_tokens_with_minus_one() -> None:
    items = [
        (torch.ones(5, 80), torch.tensor([2, 3]), 0.07),
        (torch.full((3, 80), 2.0), torch.tensor([4, 5, 6, 7]), 0.05),
    ]
    batch = collate_asr_batch(items)
    assert batch["feats"].shape == (2, 5, 80) and batch["feats"].dtype == torch.float32
    assert bool((batch["feats"][1, 3:] == 0).all()) and bool((batch["feats"][1, :3] == 2).all())
    assert batch["feat_lengths"].tolist() == [5, 3]
    assert batch["tokens"].tolist() == [[2, 3, -1, -1], [4, 5, 6, 7]]
    assert batch["token_lengths"].tolist() == [2, 4]
    assert batch["durations_s"].tolist() == pytest.approx([0.07, 0.05])


FRAMES = [int(f) for f in np.random.default_rng(3).integers(50, 800, size=97)]


@pytest.mark.parametrize("budget", [800, 2000, 12000])
def test_dynamic_batches_stay_within_the_frame_budget_and_cover_every_item(budget: int) -> None:
    sampler = LengthSortedBatchSampler(
        FRAMES, num_batches=400, generator=torch.Generator().manual_seed(0), max_frames_in_batch=budget, sort_size=20
    )
    batches = list(sampler)
    assert len(batches) == len(sampler) == 400
    assert all(max(FRAMES[i] for i in batch) * len(batch) <= budget for batch in batches)
    seen: set[int] = set()
    for batch in batches:  # the first epoch alone covers everything
        seen.update(batch)
        if len(seen) == len(FRAMES):
            break
    assert seen == set(range(len(FRAMES)))
    # Packing is greedy: the next item of the stream would have broken the budget of the batch before it.
    for batch, following in itertools.pairwise(batches):
        assert max(*(FRAMES[i] for i in batch), FRAMES[following[0]]) * (len(batch) + 1) > budget


def test_static_batches_are_sorted_windows_and_reproducible() -> None:
    def batches(seed: int) -> list[list[int]]:
        sampler = LengthSortedBatchSampler(
            FRAMES, num_batches=30, generator=torch.Generator().manual_seed(seed), batch_size=4, sort_size=20
        )
        return list(sampler)

    first = batches(0)
    assert all(len(batch) == 4 for batch in first)
    # Each window of 20 (5 batches) is sorted by length.
    for start in range(0, 15, 5):
        window = [FRAMES[i] for batch in first[start : start + 5] for i in batch]
        assert window == sorted(window)
    assert batches(0) == first and batches(1) != first


def test_an_item_over_the_budget_is_batched_alone() -> None:
    sampler = LengthSortedBatchSampler(
        [100, 5000, 100], num_batches=6, generator=torch.Generator().manual_seed(0), max_frames_in_batch=1000
    )
    for batch in sampler:
        assert batch == [1] or 1 not in batch
    with pytest.raises(ValueError, match="exactly one"):
        LengthSortedBatchSampler([1], num_batches=1, generator=torch.Generator())
