"""The synthetic noise clips and room responses that stand in for MUSAN and RIRS_NOISES."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from autotune.data import synth_noise
from autotune.data.synth_noise import ensure_noise_set, generate_noise_set

SMALL = {"n_noise": 3, "min_noise_s": 1.0, "max_noise_s": 3.0, "n_rirs": 4}


@pytest.fixture(scope="module")
def noise_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_noise_set(tmp_path_factory.mktemp("noise") / "set", **SMALL)


def _read_scp(path: Path) -> dict[str, Path]:
    return {key: path.parent / rel for key, rel in (line.split() for line in path.read_text().splitlines())}


def test_lists_and_files(noise_set: Path) -> None:
    noise, rirs = _read_scp(noise_set / "noise.scp"), _read_scp(noise_set / "rir.scp")
    assert list(noise) == ["noise00", "noise01", "noise02"] and len(rirs) == 4
    for path in noise.values():
        info = sf.info(path)
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16") and 1.0 <= info.duration <= 3.0
        audio, _ = sf.read(path)
        assert 0.3 <= np.abs(audio).max() <= 0.9 and abs(audio.mean()) < 0.1
    for path in rirs.values():
        response, _ = sf.read(path)
        assert 0.3 * 16000 <= response.size <= 1.5 * 16000
        peak = int(np.abs(response).argmax())
        assert peak < 0.006 * 16000 and np.abs(response).max() == pytest.approx(0.9, abs=1e-3)  # direct path leads
        tail = response[peak + 1600 :]  # 100 ms after the direct path: decaying
        assert np.abs(tail).max() < 0.9 * 0.8
    manifest = json.loads((noise_set / "manifest.json").read_text())
    assert manifest["noise_set_version"] == synth_noise.NOISE_SET_VERSION and manifest["params"]["n_noise"] == 3
    assert "SYNTHETIC" in (noise_set / "README.txt").read_text()


def test_same_seed_same_bytes(noise_set: Path, tmp_path: Path) -> None:
    again = generate_noise_set(tmp_path / "again", **SMALL)
    assert all(
        (again / rel).read_bytes() == (noise_set / rel).read_bytes() for rel in ("noise/noise01.wav", "rir/rir03.wav")
    )


def test_ensure_generates_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = ensure_noise_set(tmp_path, **SMALL)
    assert folder.name.startswith(f"noise-v{synth_noise.NOISE_SET_VERSION}-") and (folder / "manifest.json").is_file()
    monkeypatch.setattr(synth_noise, "generate_noise_set", lambda *a, **k: pytest.fail("regenerated"))
    assert ensure_noise_set(tmp_path, **SMALL) == folder
