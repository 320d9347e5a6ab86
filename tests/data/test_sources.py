"""Tests for autotune.data.sources: list formats, validation errors, subsets and serialisation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from autotune.data import DataSource, Utterance, load_source
from autotune.errors import DataError

SR = 16000


def write_tone(path: Path, seconds: float, *, sample_rate: int = SR, freq_hz: float = 220.0) -> Path:
    """Write a short sine; the format follows the file extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    sf.write(path, 0.3 * np.sin(2 * np.pi * freq_hz * t), sample_rate)
    return path


def write_csv(path: Path, rows: list[str], header: str = "ID,dur,path,start,stop,spk") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_csv_relative_paths_and_segments(tmp_path: Path) -> None:
    write_tone(tmp_path / "wav" / "bob" / "a.wav", 7.0)
    absolute = write_tone(tmp_path / "elsewhere" / "c.wav", 2.5)
    csv_path = write_csv(
        tmp_path / "lists" / "train.csv",
        [
            "a_0.0_3.0,7.0,../wav/bob/a.wav,0.0,3.0,bob",
            "a_3.0_6.0,7.0,../wav/bob/a.wav,3.0,6.0,bob",
            "a_6.0_7.0,7.0,../wav/bob/a.wav,6.0,7.0,bob",
            f"c,2.5,{absolute},0,2.5,alice",
        ],
    )
    source = load_source(csv_path)
    assert source.kind == "3d-speaker-csv" and not source.synthetic
    assert source.path == str(csv_path)
    assert source.speakers == ("alice", "bob")
    first, second, last, c = source.utterances
    assert first.path == str(tmp_path / "wav" / "bob" / "a.wav")
    assert (first.start_sample, first.stop_sample, first.duration_s) == (0, 48000, 3.0)
    assert (second.start_sample, second.stop_sample) == (48000, 96000)
    assert (last.start_sample, last.stop_sample, last.duration_s) == (96000, 112000, 1.0)
    assert c.path == str(absolute) and c.speaker == "alice" and c.sample_rate == SR
    assert source.speakers.index(c.speaker) == 0
    assert source.total_audio_s() == pytest.approx(9.5)


def test_csv_stop_slightly_past_end_is_clamped(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav", 2.0)
    source = load_source(write_csv(tmp_path / "train.csv", ["a,2.0,a.wav,0.0,2.01,s"]))
    assert source.utterances[0].stop_sample == 32000


def test_kaldi_folder(tmp_path: Path) -> None:
    write_tone(tmp_path / "audio" / "u1.wav", 1.0)
    write_tone(tmp_path / "audio" / "u2.flac", 1.5)
    write_tone(tmp_path / "audio" / "u3.wav", 0.5, sample_rate=8000)
    data = tmp_path / "data" / "train"
    data.mkdir(parents=True)
    (data / "wav.scp").write_text(f"u1 {tmp_path}/audio/u1.wav\nu2 ../../audio/u2.flac\n\nu3 {tmp_path}/audio/u3.wav\n")
    (data / "utt2spk").write_text("u1 spkB\nu2 spkA\nu3 spkB\nunused spkC\n")
    source = load_source(data)
    assert source.kind == "kaldi"
    assert [u.utt_id for u in source.utterances] == ["u1", "u2", "u3"]
    assert [u.speaker for u in source.utterances] == ["spkB", "spkA", "spkB"]
    assert source.speakers == ("spkA", "spkB")
    assert source.utterances[1].path == str(tmp_path / "audio" / "u2.flac")
    assert source.utterances[1].duration_s == pytest.approx(1.5)
    assert source.utterances[2].sample_rate == 8000
    assert source.describe()["sample_rates"] == [8000, 16000]
    assert load_source(data / "wav.scp").utterances == source.utterances


def test_audio_folder_speaker_is_parent_folder(tmp_path: Path) -> None:
    write_tone(tmp_path / "corpus" / "zed" / "s1" / "x.wav", 1.0)
    write_tone(tmp_path / "corpus" / "amy" / "y.flac", 1.0)
    write_tone(tmp_path / "corpus" / "amy" / "z.ogg", 1.0)
    (tmp_path / "corpus" / "amy" / "notes.txt").write_text("not audio")
    write_tone(tmp_path / "corpus" / ".hidden" / "h.wav", 1.0)
    source = load_source(tmp_path / "corpus")
    assert source.kind == "folder"
    assert [(u.utt_id, u.speaker) for u in source.utterances] == [
        ("amy/y", "amy"),
        ("amy/z", "amy"),
        ("zed/s1/x", "s1"),
    ]
    assert source.speakers == ("amy", "s1")
    assert all(Path(u.path).is_absolute() for u in source.utterances)


def test_single_speaker_is_fine(tmp_path: Path) -> None:
    write_tone(tmp_path / "only" / "a.wav", 1.0)
    assert load_source(tmp_path / "only").speakers == ("only",)


def _missing(tmp: Path) -> Path:
    return tmp / "nope.csv"


def _empty_csv(tmp: Path) -> Path:
    (tmp / "train.csv").write_text("")
    return tmp / "train.csv"


def _header_only(tmp: Path) -> Path:
    return write_csv(tmp / "train.csv", [])


def _bad_header(tmp: Path) -> Path:
    return write_csv(tmp / "train.csv", ["a,1,a.wav,0,1,s"], header="ID,duration,wav,start,stop,spk_id")


def _short_row(tmp: Path) -> Path:
    write_tone(tmp / "a.wav", 1.0)
    return write_csv(tmp / "train.csv", ["a,1.0,a.wav,0,1,s", "b,1.0,a.wav,0,1"])


def _bad_number(tmp: Path) -> Path:
    return write_csv(tmp / "train.csv", ["a,1.0,a.wav,zero,1,s"])


def _start_after_stop(tmp: Path) -> Path:
    return write_csv(tmp / "train.csv", ["a,1.0,a.wav,2.0,1.0,s"])


def _duplicate_id(tmp: Path) -> Path:
    write_tone(tmp / "a.wav", 1.0)
    return write_csv(tmp / "train.csv", ["a,1.0,a.wav,0,1,s", "a,1.0,a.wav,0,1,s"])


def _missing_audio(tmp: Path) -> Path:
    return write_csv(tmp / "train.csv", ["a,1.0,gone.wav,0,1,s"])


def _unreadable_audio(tmp: Path) -> Path:
    (tmp / "a.wav").write_text("this is not a wav file")
    return write_csv(tmp / "train.csv", ["a,1.0,a.wav,0,1,s"])


def _segment_in_samples(tmp: Path) -> Path:
    write_tone(tmp / "a.wav", 4.0)
    return write_csv(tmp / "train.csv", ["a,4.0,a.wav,0,48000,s"])


def _empty_folder(tmp: Path) -> Path:
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "readme.txt").write_text("no audio here")
    return tmp / "corpus"


def _unsupported_file(tmp: Path) -> Path:
    (tmp / "list.txt").write_text("a.wav\n")
    return tmp / "list.txt"


def _kaldi(tmp: Path, scp: str, utt2spk: str | None) -> Path:
    (tmp / "wav.scp").write_text(scp)
    if utt2spk is not None:
        (tmp / "utt2spk").write_text(utt2spk)
    return tmp


def _kaldi_no_utt2spk(tmp: Path) -> Path:
    return _kaldi(tmp, "u1 a.wav\n", None)


def _kaldi_missing_speaker(tmp: Path) -> Path:
    write_tone(tmp / "a.wav", 1.0)
    return _kaldi(tmp, "u1 a.wav\nu2 a.wav\n", "u1 s\n")


def _kaldi_piped(tmp: Path) -> Path:
    return _kaldi(tmp, "u1 sox /data/u1.flac -t wav - |\n", "u1 s\n")


def _kaldi_malformed(tmp: Path) -> Path:
    return _kaldi(tmp, "u1\n", "u1 s\n")


def _kaldi_segments(tmp: Path) -> Path:
    (tmp / "segments").write_text("u1-0 u1 0.0 1.0\n")
    return _kaldi(tmp, "u1 a.wav\n", "u1-0 s\n")


def _kaldi_empty(tmp: Path) -> Path:
    return _kaldi(tmp, "\n", "")


ERROR_CASES = {
    "missing-path": (_missing, ["does not exist", "nope.csv"]),
    "empty-csv": (_empty_csv, ["empty", "ID,dur,path,start,stop,spk"]),
    "header-only": (_header_only, ["no entries"]),
    "bad-header": (_bad_header, ["line 1", "header", "ID,dur,path,start,stop,spk"]),
    "short-row": (_short_row, ["line 3", "6 comma-separated fields", "found 5"]),
    "bad-number": (_bad_number, ["line 2", "start", "not a number"]),
    "start-after-stop": (_start_after_stop, ["line 2", "below stop"]),
    "duplicate-id": (_duplicate_id, ["line 3", "already used on line 2"]),
    "missing-audio": (_missing_audio, ["line 2", "gone.wav", "does not exist", "fix the path"]),
    "unreadable-audio": (_unreadable_audio, ["line 2", "a.wav", "cannot be read"]),
    "segment-in-samples": (_segment_in_samples, ["line 2", "past the end", "seconds"]),
    "empty-folder": (_empty_folder, ["no .wav, .flac or .ogg files"]),
    "unsupported-file": (_unsupported_file, ["not a supported list", "train.csv", "wav.scp"]),
    "kaldi-no-utt2spk": (_kaldi_no_utt2spk, ["no utt2spk"]),
    "kaldi-missing-speaker": (_kaldi_missing_speaker, ["line 2", "'u2'", "missing from", "utt2spk"]),
    "kaldi-piped": (_kaldi_piped, ["line 1", "piped command", "not supported"]),
    "kaldi-malformed": (_kaldi_malformed, ["wav.scp line 1", "'<key> <value>'"]),
    "kaldi-segments": (_kaldi_segments, ["segments file", "train.csv"]),
    "kaldi-empty": (_kaldi_empty, ["no entries"]),
}


@pytest.mark.parametrize("case", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_user_errors_are_one_line_data_errors(tmp_path: Path, case: tuple) -> None:
    make, words = case
    with pytest.raises(DataError) as info:
        load_source(make(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_invalid_max_utterances(tmp_path: Path) -> None:
    write_tone(tmp_path / "s" / "a.wav", 0.5)
    with pytest.raises(DataError, match="max_utterances"):
        load_source(tmp_path / "s", max_utterances=0)


def _csv_of(tmp: Path, n_rows: int, broken_row: int | None = None) -> Path:
    write_tone(tmp / "a.wav", 1.0)
    rows = [f"u{i:02d},1.0,{'gone' if i == broken_row else 'a'}.wav,0,1,spk{i % 3}" for i in range(n_rows)]
    return write_csv(tmp / "train.csv", rows)


def test_subset_is_seeded_and_deterministic(tmp_path: Path) -> None:
    path = _csv_of(tmp_path, 30)
    a, b = load_source(path, max_utterances=10, seed=1), load_source(path, max_utterances=10, seed=1)
    assert a == b and len(a.utterances) == 10
    ids = [u.utt_id for u in a.utterances]
    assert ids == sorted(ids)  # list order is kept
    assert [u.utt_id for u in load_source(path, max_utterances=10, seed=2).utterances] != ids
    described = a.describe()
    assert described["n_utterances"] == 10 and described["n_utterances_total"] == 30 and described["subset"]
    assert a.speakers == ("spk0", "spk1", "spk2")
    whole = load_source(path, max_utterances=None).describe()
    assert whole["n_utterances_total"] == 30 and not whole["subset"]


def test_subset_validates_only_kept_entries(tmp_path: Path) -> None:
    path = _csv_of(tmp_path, 10, broken_row=4)
    outcomes = set()
    for seed in range(20):
        try:
            source = load_source(path, max_utterances=5, seed=seed)
        except DataError as exc:
            assert "gone.wav" in str(exc)
            outcomes.add("error")
        else:
            assert "u04" not in {u.utt_id for u in source.utterances}
            outcomes.add("ok")
    assert outcomes == {"error", "ok"}


def test_round_trip_and_fingerprint(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav", 7.0)
    source = load_source(write_csv(tmp_path / "train.csv", ["x,7.0,a.wav,0,3,s", "y,7.0,a.wav,3,6.5,t"]))
    assert DataSource.from_dict(source.to_dict()) == source
    assert DataSource.from_dict(json.loads(json.dumps(source.to_dict()))) == source
    utt = source.utterances[1]
    assert Utterance.from_dict(json.loads(json.dumps(utt.to_dict()))) == utt
    fingerprint = source.fingerprint()
    assert len(fingerprint) == 12 and int(fingerprint, 16) >= 0
    assert load_source(tmp_path / "train.csv").fingerprint() == fingerprint
    fewer = DataSource.from_dict({**source.to_dict(), "utterances": [utt.to_dict()]})
    assert fewer.fingerprint() != fingerprint


def test_describe(tmp_path: Path) -> None:
    write_tone(tmp_path / "c" / "s1" / "a.wav", 1.8)
    write_tone(tmp_path / "c" / "s2" / "b.wav", 1.8)
    assert load_source(tmp_path / "c").describe() == {
        "kind": "folder",
        "path": str(tmp_path / "c"),
        "synthetic": False,
        "n_utterances": 2,
        "n_utterances_total": 2,
        "subset": False,
        "n_speakers": 2,
        "total_audio_hours": 0.001,
        "sample_rates": [16000],
    }


def test_two_thousand_files_load_fast(tmp_path: Path) -> None:
    wav_bytes = write_tone(tmp_path / "one.wav", 0.1).read_bytes()
    for i in range(2000):
        folder = tmp_path / "c" / f"spk{i % 50:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"u{i:04d}.wav").write_bytes(wav_bytes)
    started = time.perf_counter()
    source = load_source(tmp_path / "c")
    elapsed = time.perf_counter() - started
    assert len(source.utterances) == 2000 and len(source.speakers) == 50
    assert elapsed < 2.0, f"loading 2,000 files took {elapsed:.2f} s"
