"""3D-Speaker's per-item augmentation: sox's speed perturbation, addnoise and addreverb as its code computes them
(recorded from sox 14.4.2 and from 3D-Speaker 09e7806 in tests/reference), and SpkVeriAug's choices."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune.data.corruption import (
    Corruption,
    add_noise,
    add_reverb,
    augmentation_list,
    crop_or_pad,
    read_augmentation_files,
    speed_perturb,
)
from autotune.errors import DataError
from tests.models.reference_models import load_reference


@pytest.mark.parametrize("speed", [0.9, 1.1])
def test_speed_perturbation_is_sox_speed_then_rate(speed: float) -> None:
    recorded = load_reference("sox_speed_rate")
    expected = torch.tensor(recorded["outputs"][str(speed)])
    ours = speed_perturb(torch.tensor(recorded["input"]), speed, recorded["sample_rate"])
    assert ours.shape == expected.shape  # n / S samples, rounded as sox rounds
    torch.testing.assert_close(ours, expected, rtol=0, atol=3e-4)  # the 0.1 s clip's edges; 113 dB SNR on speech


@pytest.mark.skipif(shutil.which("sox") is None, reason="the sox command is not installed")
def test_speed_perturbation_matches_the_installed_sox(tmp_path: Path) -> None:
    t = np.arange(32000) / 16000
    signal = (
        0.3 * np.sin(2 * np.pi * 330 * t) * np.sin(2 * np.pi * 2 * t) + 0.1 * np.sin(2 * np.pi * 5000 * t)
    ).astype(np.float32)
    sf.write(tmp_path / "in.wav", signal, 16000, subtype="FLOAT")
    out = tmp_path / "out.wav"
    subprocess.run(
        ["sox", str(tmp_path / "in.wav"), "-e", "floating-point", str(out), "speed", "1.1", "rate", "16000"],
        check=True,
        capture_output=True,
    )
    theirs = torch.from_numpy(sf.read(out, dtype="float32")[0])
    ours = speed_perturb(torch.from_numpy(signal), 1.1, 16000)
    assert ours.shape == theirs.shape
    error = (ours - theirs).square().sum() / theirs.square().sum()
    assert 10 * torch.log10(1 / error) > 90  # dB


def test_unit_speed_is_left_alone() -> None:
    waveform = torch.randn(100)
    assert speed_perturb(waveform, 1.0, 16000) is waveform


def test_crop_or_pad_as_wavreader() -> None:
    torch.manual_seed(0)
    long = torch.arange(100, dtype=torch.float32)
    crop = crop_or_pad(long, 30)
    assert crop.shape == (30,) and torch.equal(crop, torch.arange(crop[0], crop[0] + 30))
    padded = crop_or_pad(torch.ones(10), 30)
    assert torch.equal(padded, torch.cat([torch.ones(10), torch.zeros(20)]))  # zeros at the end, as F.pad there


@pytest.mark.parametrize("case", ["noise_same_length", "noise_shorter"])
def test_add_noise_is_3d_speakers_addnoise(case: str) -> None:
    recorded = load_reference("3d_speaker_augment_and_margin")["augmentation"][case]
    noisy = add_noise(torch.tensor(recorded["waveform"]), torch.tensor(recorded["noise"]), recorded["snr_db"])
    torch.testing.assert_close(noisy, torch.tensor(recorded["output"]), rtol=1e-5, atol=1e-6)


def test_add_reverb_is_3d_speakers_addreverb() -> None:
    recorded = load_reference("3d_speaker_augment_and_margin")["augmentation"]["reverb"]
    reverberant = add_reverb(torch.tensor(recorded["waveform"]), torch.tensor(recorded["response"]))
    torch.testing.assert_close(reverberant, torch.tensor(recorded["output"]), rtol=1e-5, atol=1e-6)


def _write(path: Path, samples: np.ndarray, rate: int = 16000) -> str:
    sf.write(path, samples, rate, subtype="PCM_16")
    return str(path)


def test_corruption_draws_noise_reverb_or_both(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    noise = _write(tmp_path / "noise.wav", 0.3 * rng.standard_normal(16000))
    response = np.zeros(800)
    response[0], response[400] = 1.0, 0.5  # a direct path and one echo
    reverb = _write(tmp_path / "rir.wav", response)
    corrupt = Corruption(aug_prob=1.0, noise=(noise,), reverb=(reverb,))
    clean = 0.5 * torch.sin(torch.arange(8000) * 0.05)
    torch.manual_seed(0)
    outputs = [corrupt(clean) for _ in range(30)]
    assert all(out.dtype == torch.float32 and out.shape == clean.shape for out in outputs)
    assert all(out.abs().max() == pytest.approx(1.0, abs=1e-4) for out in outputs)  # every path peak-normalises
    echoed = [torch.corrcoef(torch.stack([out[1000:], clean[1000:]]))[0, 1] for out in outputs]
    assert min(echoed) < 0.9 < max(echoed)  # some noisy (decorrelated), some only reverberant (still close)
    never = Corruption(aug_prob=0.0, noise=(), reverb=())
    assert never(clean) is clean


def test_aug_prob_is_how_often_items_are_touched(tmp_path: Path) -> None:
    noise = _write(tmp_path / "noise.wav", 0.3 * np.random.default_rng(1).standard_normal(4000))
    corrupt = Corruption(aug_prob=0.2, noise=(noise,), reverb=(noise,))
    clean = 0.5 * torch.sin(torch.arange(4000) * 0.05)
    torch.manual_seed(0)
    touched = sum(not torch.equal(corrupt(clean), clean) for _ in range(400))
    assert 50 <= touched <= 110  # 80 expected


@pytest.mark.parametrize("aug_prob", [-0.1, 1.5, float("nan")])
def test_bad_probability_is_refused(aug_prob: float) -> None:
    with pytest.raises(ValueError, match="aug_prob"):
        Corruption(aug_prob=aug_prob, noise=("n",), reverb=("r",))


def test_lists_resolve_relative_paths_and_report_bad_lines(tmp_path: Path) -> None:
    _write(tmp_path / "a.wav", np.zeros(1600))
    (tmp_path / "list.scp").write_text("a a.wav\n")
    assert read_augmentation_files(tmp_path / "list.scp", "noise", probe=True) == (str(tmp_path / "a.wav"),)
    (tmp_path / "bad.scp").write_text("only-a-key\n")
    with pytest.raises(DataError, match="line 1"):
        read_augmentation_files(tmp_path / "bad.scp", "reverb")


def test_no_list_means_the_synthetic_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    noise, synthetic = augmentation_list(None, "noise")
    assert synthetic and noise.name == "noise.scp" and noise.parent.parent == tmp_path
    assert len(read_augmentation_files(noise, "noise", probe=True)) == 16
    given, synthetic = augmentation_list(str(tmp_path / "mine.scp"), "reverb")
    assert not synthetic and given == tmp_path / "mine.scp"
