"""Global CMVN statistics: WeNet's own tools/compute_cmvn_stats.py (recorded), the JSON it writes, and the cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune.data import load_source
from autotune.data.asr import WENET_FBANK
from autotune.data.cmvn import CmvnStats, compute_cmvn_stats, global_cmvn

REFERENCE = Path(__file__).resolve().parent / "reference" / "wenet_compute_cmvn_stats.json"


def write_cmvn_corpus(folder: Path) -> Path:
    """Three deterministic files (16 kHz, 8 kHz and 22.05 kHz: two are resampled) and a WeNet data.list of them."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for index, (rate, seconds, f0) in enumerate([(16000, 1.2, 220.0), (8000, 0.5, 330.0), (22050, 0.8, 150.0)]):
        t = np.arange(round(seconds * rate)) / rate
        noise = np.random.default_rng(index).standard_normal(t.size)
        audio = 0.3 * np.sin(2 * np.pi * f0 * t) + 0.1 * np.sin(2 * np.pi * 3.1 * f0 * t) + 0.01 * noise
        sf.write(folder / f"u{index}.wav", audio, rate, subtype="PCM_16")
        lines.append(json.dumps({"key": f"u{index}", "wav": f"u{index}.wav", "txt": "a"}))
    (folder / "data.list").write_text("\n".join(lines) + "\n")
    return folder / "data.list"


def test_statistics_are_wenets(tmp_path: Path) -> None:
    """The same files through WeNet's compute_cmvn_stats.py (recorded) and ours: the same sums and frame count, and
    mean / inverse std as wenet/utils/cmvn.py derives them."""
    recorded = json.loads(REFERENCE.read_text())
    utterances = load_source(write_cmvn_corpus(tmp_path / "corpus")).utterances
    stats = compute_cmvn_stats(utterances, WENET_FBANK, threads=2)
    assert stats.frame_num == recorded["frame_num"]
    np.testing.assert_allclose(stats.mean_stat, recorded["mean_stat"], rtol=1e-5)
    np.testing.assert_allclose(stats.var_stat, recorded["var_stat"], rtol=1e-5)
    mean, istd = stats.mean_istd()
    np.testing.assert_allclose(mean.numpy(), recorded["mean"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(istd.numpy(), recorded["istd"], rtol=1e-4)


def test_json_is_wenets_and_round_trips() -> None:
    stats = CmvnStats(mean_stat=(2.0, 4.0), var_stat=(10.0, 8.0), frame_num=2)
    assert set(json.loads(stats.to_json())) == {"mean_stat", "var_stat", "frame_num"}
    assert CmvnStats.from_json(stats.to_json()) == stats
    mean, istd = stats.mean_istd()
    assert mean.tolist() == [1.0, 2.0]
    assert istd[0] == pytest.approx(0.5) and istd[1] == pytest.approx(1e10)  # variance 0 floored at 1e-20


def test_computed_once_then_read_from_the_cache(tmp_path: Path) -> None:
    utterances = load_source(write_cmvn_corpus(tmp_path / "corpus")).utterances
    first, made = global_cmvn(utterances, WENET_FBANK, cache_dir=tmp_path / "cache")
    again, reused = global_cmvn(utterances, WENET_FBANK, cache_dir=tmp_path / "cache")
    assert not made.reused and made.seconds > 0 and made.items == 3
    assert reused.reused and reused.seconds == 0.0 and reused.path == made.path and again == first
    assert "computed once" in made.note() and "reused from the cache" in reused.note()
    assert CmvnStats.from_json(Path(made.path).read_text()) == first
    # Another file content (its size or mtime) is another corpus: computed again, into another entry.
    path = Path(utterances[0].path)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    _, changed = global_cmvn(utterances, WENET_FBANK, cache_dir=tmp_path / "cache")
    assert not changed.reused and changed.path != made.path
    assert torch.equal(
        global_cmvn(utterances[:2], WENET_FBANK, cache_dir=tmp_path / "cache")[0].mean_istd()[0],
        compute_cmvn_stats(utterances[:2], WENET_FBANK).mean_istd()[0],
    )
