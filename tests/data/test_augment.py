"""SpeechBrain-shaped augmentation and Fbank on the device: each augmentation does what it says, batches grow 5x."""

from __future__ import annotations

import math

import pytest
import torch

from autotune.data.augment import (
    add_noise,
    add_reverb,
    augment_batch,
    drop_chunk,
    notch_kernel,
    speechbrain_fbank,
    speechbrain_inputs,
)


@pytest.fixture
def speech_like() -> torch.Tensor:
    """Four 0.5 s signals at 16 kHz: a harmonic tone plus a little noise, no exact zeros."""
    generator = torch.Generator().manual_seed(0)
    t = torch.arange(8000) / 16000
    tone = sum(torch.sin(2 * math.pi * 150 * k * t) / k for k in range(1, 8))
    return 0.3 * tone.repeat(4, 1) + 0.01 * torch.randn(4, 8000, generator=generator) + 0.001


def _average_amplitude(x: torch.Tensor) -> torch.Tensor:
    return x.abs().mean(dim=1)


def test_augment_batch_is_original_then_copies_with_labels_repeated(speech_like: torch.Tensor) -> None:
    torch.manual_seed(0)
    waveforms, labels = augment_batch(speech_like, torch.tensor([3, 1, 4, 1]), copies=4)
    assert waveforms.shape == (20, 8000) and labels.tolist() == [3, 1, 4, 1] * 5
    torch.testing.assert_close(waveforms[:4], speech_like)
    for copy in range(1, 5):
        assert not torch.allclose(waveforms[4 * copy : 4 * copy + 4], speech_like)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.square().mean(dim=1).sqrt()


def test_add_noise_mixes_at_the_drawn_snr(speech_like: torch.Tensor) -> None:
    torch.manual_seed(0)
    noisy = add_noise(speech_like, snr_low_db=10.0, snr_high_db=10.0)
    factor = 1 / (10 ** (10 / 20) + 1)  # SpeechBrain's AddNoise: the clean part scaled by 1 - factor
    noise = noisy - speech_like * (1 - factor)
    ratio = _rms(noise) / _rms(speech_like)  # AddNoise's amp_type="rms" (speechbrain 1.x)
    torch.testing.assert_close(ratio, torch.full((4,), factor), rtol=1e-4, atol=1e-6)


def test_add_noise_is_speechbrains_add_noise(speech_like: torch.Tensor) -> None:
    """Without a noise csv SpeechBrain's AddNoise draws the SNRs then white noise, as add_noise does: same output."""
    time_domain = pytest.importorskip("speechbrain.augment.time_domain")
    torch.manual_seed(3)
    theirs = time_domain.AddNoise(snr_low=0, snr_high=15)(speech_like, torch.ones(4))
    torch.manual_seed(3)
    torch.testing.assert_close(add_noise(speech_like), theirs, rtol=0, atol=1e-7)


def test_add_reverb_keeps_amplitude_and_alignment(speech_like: torch.Tensor) -> None:
    torch.manual_seed(0)
    reverberant = add_reverb(speech_like)
    torch.testing.assert_close(_average_amplitude(reverberant), _average_amplitude(speech_like), rtol=1e-4, atol=0)
    assert not torch.allclose(reverberant, speech_like, atol=1e-3)
    # The direct path leads (as AddReverb realigns to it): an impulse comes out loudest where it went in, then decays.
    impulse = torch.zeros(2, 8000)
    impulse[:, 1000] = 1.0
    response = add_reverb(impulse)
    assert response.abs().argmax(dim=1).tolist() == [1000, 1000] and float(response[:, :1000].abs().max()) < 1e-6
    assert float(response[:, 1001:2000].abs().mean()) > float(response[:, 5000:].abs().mean())


@pytest.mark.parametrize("centre", [0.2, 0.55])
def test_notch_kernel_rejects_its_band_and_passes_the_rest(centre: float) -> None:
    response = torch.fft.rfft(notch_kernel(torch.tensor([centre])), n=4096).abs()
    frequency = torch.linspace(0, 1, response.numel())  # fractions of Nyquist
    assert float(response[(frequency - centre).abs().argmin()]) < 0.05
    far = ((frequency - centre).abs() > 0.15) & (frequency > 0.02) & (frequency < 0.98)
    assert float((response[far] - 1).abs().max()) < 0.05


def test_drop_chunk_zeroes_one_to_five_chunks(speech_like: torch.Tensor) -> None:
    torch.manual_seed(0)
    zeroed = (drop_chunk(speech_like) == 0).sum(dim=1)
    assert ((zeroed >= 1000) & (zeroed <= 5 * 2000)).all()


def test_fbank_is_speechbrains_shape_and_float32_under_autocast(speech_like: torch.Tensor) -> None:
    feats = speechbrain_fbank(torch.zeros(2, 48000).normal_())
    assert feats.shape == (2, 301, 80)  # 3 s at 16 kHz, 10 ms hop, centred frames
    torch.testing.assert_close(feats.mean(dim=1), torch.zeros(2, 80), atol=1e-4, rtol=0)  # sentence mean removed
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inputs, labels = speechbrain_inputs(speech_like, torch.arange(4), copies=4)
    assert inputs.dtype == torch.float32 and inputs.shape == (20, 51, 80) and labels.shape == (20,)
    assert torch.isfinite(inputs).all()


def test_fbank_is_speechbrains_own_fbank_and_sentence_normalisation(speech_like: torch.Tensor) -> None:
    """The recipe's compute_features (speechbrain.lobes.features.Fbank, n_mels 80) and mean_var_norm
    (InputNormalization, sentence, std_norm False), run from SpeechBrain's own code on the same batch."""
    features = pytest.importorskip("speechbrain.lobes.features")
    normalisation = pytest.importorskip("speechbrain.processing.features")
    quiet = 0.001 * torch.randn(2, 48000, generator=torch.Generator().manual_seed(1))  # the 80 dB floor matters here
    for waveforms in (speech_like, quiet):
        theirs = features.Fbank(n_mels=80)(waveforms)
        theirs = normalisation.InputNormalization(norm_type="sentence", std_norm=False)(
            theirs, torch.ones(waveforms.shape[0])
        )
        torch.testing.assert_close(speechbrain_fbank(waveforms), theirs, atol=2e-3, rtol=0)
