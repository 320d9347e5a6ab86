"""Tests for the FastSpeech 2 acoustic model: its size, the length regulator, masking and the loss."""

from __future__ import annotations

import pytest
import torch

from autotune.data.tts import SYMBOLS
from autotune.models.fastspeech2 import FastSpeech2, fastspeech2_loss, length_regulate

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
    assert len(SYMBOLS) == 151
    # The per-component arithmetic of the module docstring, summed: embedding, encoder, adaptor, decoder, mel, postnet.
    parts = {
        "encoder": 38_912 + 4 * 2_886_912,
        "variance_adaptor": 3 * 395_009 + 2 * 256 * 256,
        "decoder": 6 * 2_886_912,
        "mel_linear": 20_560,
        "postnet": 4_348_144,
    }
    assert {name: count(child) for name, child in model.named_children()} == parts
    assert count(model) == sum(parts.values()) == 34_592_835
    # ming024 also counts its frozen sinusoid tables and bin boundaries; here they are buffers, not parameters.
    assert {name for name, _ in model.named_buffers()} >= {"encoder.position_enc", "variance_adaptor.pitch_bins"}


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
