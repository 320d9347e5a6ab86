"""Tests for autotune.data.synth: layout, determinism, transcripts, speaker differences and the cached corpus."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from autotune.data import default_cache_dir, default_source, ensure_corpus, generate_corpus, load_source, synth
from autotune.errors import DataError

SMALL = {"n_speakers": 4, "files_per_speaker": 3, "min_duration_s": 1.0, "max_duration_s": 2.0}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_corpus(tmp_path_factory.mktemp("synth") / "corpus", **SMALL)


def _wav_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.wav"))}


def test_layout_and_format(corpus: Path) -> None:
    files = sorted(p.relative_to(corpus).as_posix() for p in corpus.rglob("*.wav"))
    assert files == [f"spk{s:03d}/spk{s:03d}_utt{u:03d}.wav" for s in range(4) for u in range(3)]
    for path in corpus.rglob("*.wav"):
        info = sf.info(path)
        assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "WAV")
        assert 1.0 <= info.duration <= 2.0
        audio, _ = sf.read(path)
        assert 0.1 < np.abs(audio).max() <= 1.0
    assert "SYNTHETIC" in (corpus / "README.txt").read_text()
    manifest = json.loads((corpus / "manifest.json").read_text())
    assert manifest["corpus_version"] == synth.CORPUS_VERSION and len(manifest["files"]) == 12


def test_folder_source_reads_it(corpus: Path) -> None:
    source = load_source(corpus)
    assert source.speakers == ("spk000", "spk001", "spk002", "spk003")
    assert [u.speaker for u in source.utterances] == [f"spk{s:03d}" for s in range(4) for _ in range(3)]


def test_same_seed_same_bytes(corpus: Path, tmp_path: Path) -> None:
    again = generate_corpus(tmp_path / "again", **SMALL)
    assert _wav_bytes(again) == _wav_bytes(corpus)
    for name in ("text", "data.list"):
        assert (again / name).read_bytes() == (corpus / name).read_bytes()
    other = _wav_bytes(generate_corpus(tmp_path / "other", **SMALL, seed=1))
    assert other.keys() == _wav_bytes(corpus).keys() and other != _wav_bytes(corpus)


def test_transcripts_agree_everywhere(corpus: Path) -> None:
    manifest = json.loads((corpus / "manifest.json").read_text())
    expected = {Path(f["path"]).stem: f["text"] for f in manifest["files"]}
    assert len(expected) == 12
    for key, text in expected.items():
        assert text and set(text) <= set(synth.VOWELS), (key, text)
    text_file = dict(line.split(" ", 1) for line in (corpus / "text").read_text().splitlines())
    assert text_file == expected
    entries = [json.loads(line) for line in (corpus / "data.list").read_text().splitlines()]
    assert [(e["key"], e["txt"]) for e in entries] == list(expected.items())
    assert all(e["wav"] == f"{e['spk']}/{e['key']}.wav" for e in entries)
    source = load_source(corpus)  # the corpus folder reads through its data.list
    assert source.kind == "wenet-data-list"
    assert {u.utt_id: u.text for u in source.utterances} == expected
    assert all(Path(u.path).is_file() for u in source.utterances)


def test_transcripts_follow_the_syllables(corpus: Path) -> None:
    # One character per syllable, at 3-6.5 syllables per second with short pauses: a few per second of audio.
    for u in load_source(corpus).utterances:
        assert 1.0 <= len(u.text or "") / u.duration_s <= 7.0, (u.utt_id, u.text, u.duration_s)


def _f0_hz(audio: np.ndarray, sample_rate: int) -> float:
    """Median autocorrelation pitch of the louder frames."""
    n = 1024
    frames = np.lib.stride_tricks.sliding_window_view(audio, n)[::512] * np.hanning(n)
    frames = frames[(frames**2).mean(axis=1) > 0.1 * (frames**2).mean()]
    autocorr = np.fft.irfft(np.abs(np.fft.rfft(frames, 2 * n, axis=1)) ** 2, axis=1)[:, :n]
    low, high = sample_rate // 400, sample_rate // 60
    return float(np.median(sample_rate / (low + np.argmax(autocorr[:, low:high], axis=1))))


def _centroid_hz(audio: np.ndarray, sample_rate: int) -> float:
    power = np.abs(np.fft.rfft(np.lib.stride_tricks.sliding_window_view(audio, 512)[::256], axis=1)) ** 2
    spectrum = power.mean(axis=0)
    return float((spectrum * np.fft.rfftfreq(512, 1 / sample_rate)).sum() / spectrum.sum())


def test_speakers_have_different_voices(corpus: Path) -> None:
    f0: dict[int, list[float]] = {}
    centroid: dict[int, list[float]] = {}
    for spk in range(4):
        for path in sorted((corpus / f"spk{spk:03d}").glob("*.wav")):
            audio, rate = sf.read(path)
            f0.setdefault(spk, []).append(_f0_hz(audio, rate))
            centroid.setdefault(spk, []).append(_centroid_hz(audio, rate))
    # Low and high voices alternate by speaker index.
    assert min(f0[1] + f0[3]) > 1.4 * max(f0[0] + f0[2])

    def apart(values: dict[int, list[float]], a: int, b: int) -> bool:
        return max(values[a]) < min(values[b]) or max(values[b]) < min(values[a])

    # Every pair of speakers is told apart by the pitch or the spectral centroid of every one of its files.
    for a in range(4):
        for b in range(a + 1, 4):
            assert apart(f0, a, b) or apart(centroid, a, b), (a, b, f0, centroid)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOTUNE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "autotune"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "autotune"
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_ensure_corpus_generates_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = {**SMALL, "n_speakers": 2, "files_per_speaker": 2}
    folder = ensure_corpus(tmp_path, **small)
    assert folder.parent == tmp_path and folder.name.startswith(f"corpus-v{synth.CORPUS_VERSION}-")
    assert (folder / "manifest.json").is_file() and len(list(folder.rglob("*.wav"))) == 4
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no temp folder left behind
    monkeypatch.setattr(synth, "generate_corpus", lambda *a, **k: pytest.fail("regenerated a finished corpus"))
    assert ensure_corpus(tmp_path, **small) == folder
    assert ensure_corpus(tmp_path, **{**small, "seed": 0}) == folder
    with pytest.raises(TypeError):
        ensure_corpus(tmp_path, n_speakerz=3)


def test_ensure_corpus_never_uses_half_built_folders(tmp_path: Path) -> None:
    small = {**SMALL, "n_speakers": 2, "files_per_speaker": 2}
    folder = ensure_corpus(tmp_path, **small)
    expected = _wav_bytes(folder)
    # A run killed before its manifest was written: the folder must be rebuilt, not used.
    (folder / "manifest.json").unlink()
    (folder / "spk000" / "spk000_utt000.wav").write_bytes(b"truncated")
    # A temp folder of a killed run on this host, and one of a live process (ours), both beside the final one.
    dead = tmp_path / f".{folder.name}.tmp-{socket.gethostname()}-{_dead_pid()}-deadbeef"
    live = tmp_path / f".{folder.name}.tmp-{socket.gethostname()}-{os.getppid()}-cafecafe"
    for temp in (dead, live):
        (temp / "spk000").mkdir(parents=True)
        (temp / "spk000" / "spk000_utt000.wav").write_bytes(b"half")
    assert ensure_corpus(tmp_path, **small) == folder
    assert _wav_bytes(folder) == expected and (folder / "manifest.json").is_file()
    assert not dead.exists() and live.exists()


def test_unwritable_cache_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    with pytest.raises(DataError, match="AUTOTUNE_CACHE_DIR") as info:
        ensure_corpus(tmp_path / "file" / "cache", n_speakers=1, files_per_speaker=1)
    assert "\n" not in str(info.value)


def test_default_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real default corpus takes ~20 s to generate; the same code path with a small corpus.
    small = {**SMALL, "n_speakers": 2, "files_per_speaker": 2}
    monkeypatch.setattr(synth, "ensure_corpus", functools.partial(synth.ensure_corpus, **small))
    source = default_source(tmp_path)
    assert source.kind == "synthetic" and source.synthetic
    assert source.speakers == ("spk000", "spk001") and len(source.utterances) == 4
    assert all(u.text for u in source.utterances)
    assert Path(source.path).parent == tmp_path
    assert source.describe()["synthetic"] is True
