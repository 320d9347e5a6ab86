"""Tests for the FastSpeech 2 acoustic model: its size and state dict and outputs against ming024's own code (recorded
test data), the length regulator, masking and the loss."""

from __future__ import annotations

import pytest
import torch

from autotune.data.tts import SYMBOLS
from autotune.models.fastspeech2 import FastSpeech2, fastspeech2_loss, length_regulate
from tests.models.reference_state_dicts import load_reference, pattern, pattern_state, shapes_of

SMALL = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "conv_filter_size": 64,
    "variance_filter_size": 16,
    "n_bins": 16,
    "postnet_channels": 16,
    "n_mels": 8,
    "max_seq_len": 64,
}


def count(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def test_ljspeech_configuration_has_the_documented_total() -> None:
    model = FastSpeech2(n_symbols=len(SYMBOLS) + 1)
    assert len(SYMBOLS) == 360  # ming024's text/symbols.py, pinyin included
    # The per-component arithmetic of the module docstring, summed: embedding, encoder, adaptor, decoder, mel, postnet.
    parts = {
        "encoder": 361 * 256 + 4 * 2_886_912,
        "variance_adaptor": 3 * 395_009 + 2 * 256 * 256,
        "decoder": 6 * 2_886_912,
        "mel_linear": 20_560,
        "postnet": 4_348_144,
    }
    assert {name: count(child) for name, child in model.named_children()} == parts
    assert count(model) == sum(parts.values()) == 34_646_339
    # ming024 also counts its frozen sinusoid tables and bin boundaries; here they are buffers, not parameters.
    assert {name for name, _ in model.named_buffers()} >= {"encoder.position_enc", "variance_adaptor.pitch_bins"}


def test_state_dict_is_ming024s_and_a_ming024_checkpoint_loads_strictly() -> None:
    """ming024's LJSpeech FastSpeech2 as its own code saves it (ming024/FastSpeech2 d4e79eb): the position tables and
    the pitch/energy bins included (frozen parameters there, buffers here), every key in its order and shape."""
    reference = load_reference("ming024_fastspeech2_ljspeech")
    assert tuple(reference["symbols"]) == SYMBOLS
    model = FastSpeech2()
    assert list(shapes_of(model.state_dict()).items()) == list(reference["state_dict"].items())
    assert count(model) == reference["trainable_parameters"] == 34_646_339
    checkpoint = {key: torch.full(shape, 0.25) for key, shape in reference["state_dict"].items()}
    checkpoint = {
        key: value.long() if key.endswith("num_batches_tracked") else value for key, value in checkpoint.items()
    }
    model.load_state_dict(checkpoint, strict=True)
    assert float(model.variance_adaptor.pitch_bins[7]) == 0.25 and float(model.decoder.position_enc[0, 9, 3]) == 0.25


def test_same_weights_and_input_give_ming024s_outputs() -> None:
    """A small configuration, the same weights and a padded batch through ming024's model and loss (recorded) and
    ours: teacher-forced outputs and the loss agree."""
    recorded = load_reference("ming024_fastspeech2_ljspeech")["tiny"]
    settings = recorded["model"]
    ranges = {key: tuple(settings[key]) for key in ("pitch_range", "energy_range")}
    model = FastSpeech2(**{**settings, **ranges}).eval()
    model.load_state_dict(pattern_state(model.state_dict()), strict=True)
    durations = torch.tensor(recorded["durations"])
    batch = {
        "tokens": torch.tensor(recorded["tokens"]),
        "token_lengths": (durations > 0).sum(dim=1),
        "mels": pattern((2, 12, 80), 0.3, scale=2.0),
        "mel_lengths": durations.sum(dim=1),
        "pitch": pattern((2, 5), 1.1, scale=3.0),
        "energy": pattern((2, 5), 2.2, scale=3.0),
        "durations": durations,
    }
    with torch.no_grad():
        outputs = _forward(model, batch)
        loss = fastspeech2_loss(outputs, batch)
    for key in ("mel", "postnet_mel", "pitch", "energy", "log_duration"):
        torch.testing.assert_close(outputs[key], torch.tensor(recorded[key]), rtol=1e-4, atol=1e-5, msg=key)
    assert float(loss) == pytest.approx(recorded["loss"], rel=1e-5)


def test_state_dict_keys_follow_ming024() -> None:
    keys = set(FastSpeech2(**SMALL).state_dict())
    assert {
        "encoder.src_word_emb.weight",
        "encoder.layer_stack.0.slf_attn.w_qs.weight",
        "encoder.layer_stack.0.pos_ffn.w_1.weight",
        "variance_adaptor.duration_predictor.conv_layer.conv1d_1.conv.weight",
        "variance_adaptor.energy_predictor.conv_layer.layer_norm_2.bias",
        "variance_adaptor.pitch_embedding.weight",
        "decoder.layer_stack.0.slf_attn.layer_norm.weight",
        "mel_linear.weight",
        "postnet.convolutions.4.0.conv.weight",
        "postnet.convolutions.4.1.running_var",
    } <= keys


def test_length_regulator_repeats_tokens_and_pads() -> None:
    x = torch.arange(1.0, 4.0).view(1, 3, 1).repeat(2, 1, 1)
    durations = torch.tensor([[2, 0, 3], [1, 1, 0]])
    out = length_regulate(x, durations, max_len=6).squeeze(-1)
    assert out.tolist() == [[1, 1, 3, 3, 3, 0], [1, 2, 0, 0, 0, 0]]


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    token_lengths = torch.tensor([5, 3])
    durations = torch.tensor([[3, 2, 4, 1, 2], [2, 5, 3, 0, 0]])
    mel_lengths = durations.sum(dim=1)
    return {
        "tokens": torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]]),
        "token_lengths": token_lengths,
        "mels": torch.randn(2, int(mel_lengths.max()), 8, generator=generator),
        "mel_lengths": mel_lengths,
        "pitch": torch.randn(2, 5, generator=generator),
        "energy": torch.randn(2, 5, generator=generator),
        "durations": durations,
    }


def _forward(model: FastSpeech2, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    keys = ("tokens", "token_lengths", "mel_lengths", "pitch", "energy", "durations")
    return model(*(batch[key] for key in keys))


def test_forward_shapes_and_finite_gradients() -> None:
    torch.manual_seed(0)
    model = FastSpeech2(**SMALL)
    batch = _batch()
    outputs = _forward(model, batch)
    assert outputs["mel"].shape == outputs["postnet_mel"].shape == (2, 12, 8)
    assert outputs["log_duration"].shape == outputs["pitch"].shape == (2, 5)
    assert float(outputs["pitch"].detach()[1, 3:].abs().sum()) == 0.0  # predictions are zero at padding
    loss = fastspeech2_loss(outputs, batch)
    loss.backward()
    assert torch.isfinite(loss)
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


def test_padding_does_not_change_the_real_items_up_to_the_postnet() -> None:
    """Encoder and decoder ignore padding. As in ming024, the PostNet and the variance predictors' second convolution
    see padded positions next to the last real frame or token (the loss masks padding, not that), so not compared."""
    torch.manual_seed(0)
    model = FastSpeech2(**SMALL).eval()
    batch = _batch()
    alone = {key: value[1:] for key, value in batch.items()}
    alone = {
        **alone,
        "tokens": alone["tokens"][:, :3],
        "pitch": alone["pitch"][:, :3],
        "energy": alone["energy"][:, :3],
        "durations": alone["durations"][:, :3],
        "mels": alone["mels"][:, :10],
    }
    with torch.no_grad():
        together, single = _forward(model, batch), _forward(model, alone)
    for key, length in (("mel", 10), ("log_duration", 2), ("pitch", 2), ("energy", 1)):
        torch.testing.assert_close(together[key][1:, :length], single[key][:, :length], rtol=1e-4, atol=1e-4)


def test_loss_is_the_sum_of_the_five_recipe_terms() -> None:
    batch = _batch()
    zero_mel = torch.zeros_like(batch["mels"])
    outputs = {
        "mel": zero_mel,
        "postnet_mel": zero_mel,
        "log_duration": torch.log(batch["durations"].float() + 1),
        "pitch": batch["pitch"] + 1.0,  # MSE 1 on real tokens
        "energy": batch["energy"],
        "src_pad": batch["tokens"] == 0,
        "mel_pad": torch.arange(12).unsqueeze(0) >= batch["mel_lengths"].unsqueeze(1),
    }
    real = ~outputs["mel_pad"]
    expected_mel = batch["mels"][real].abs().mean()
    assert float(fastspeech2_loss(outputs, batch)) == pytest.approx(float(2 * expected_mel + 1.0), rel=1e-5)
