"""Tests for the WeNet-style conformer CTC/attention ASR model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotune.models.conformer import (
    IGNORE_ID,
    ConformerASR,
    ConformerEncoder,
    label_smoothing_loss,
    subsampled_lengths,
)

VOCAB = 23


def count_parameters(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


@pytest.fixture(scope="module")
def published_model() -> ConformerASR:
    return ConformerASR()


@pytest.mark.parametrize(
    ("component", "expected"),
    [("total", 46_197_266), ("encoder", 33_464_832), ("decoder", 11_644_553), ("ctc", 1_087_881)],
    ids=["total", "encoder", "decoder", "ctc"],
)
def test_published_parameter_totals(published_model: ConformerASR, component: str, expected: int) -> None:
    module = published_model if component == "total" else getattr(published_model, component)
    assert count_parameters(module) == expected


def test_published_size_handles_100_frames(published_model: ConformerASR) -> None:
    published_model.eval()
    tokens = torch.tensor([[5, 9, 4000, 7], [12, 3, -1, -1]])
    with torch.no_grad():
        losses = published_model(torch.randn(2, 100, 80), torch.tensor([100, 70]), tokens, torch.tensor([4, 2]))
    assert all(torch.isfinite(value) for value in losses.values())


def tiny_model(**overrides: float) -> ConformerASR:
    torch.manual_seed(0)
    config = {"vocab_size": VOCAB, "output_size": 32, "attention_heads": 2, "linear_units": 48, "num_blocks": 2}
    config |= {"decoder_blocks": 2, "cnn_module_kernel": 5}
    return ConformerASR(**(config | overrides))


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three utterances of different lengths; padding frames hold large noise so leaks would show."""
    torch.manual_seed(1)
    feat_lengths = torch.tensor([100, 73, 41])
    token_lengths = torch.tensor([6, 4, 1])
    feats = torch.randn(3, 100, 80)
    tokens = torch.randint(1, VOCAB - 1, (3, 6))
    for row in range(3):
        feats[row, feat_lengths[row] :] = 50.0 * torch.randn(100 - int(feat_lengths[row]), 80)
        tokens[row, token_lengths[row] :] = IGNORE_ID
    return feats, feat_lengths, tokens, token_lengths


def test_loss_and_gradients_are_finite() -> None:
    model = tiny_model().train()
    losses = model(*padded_batch())
    assert set(losses) == {"loss", "loss_ctc", "loss_att"}
    torch.testing.assert_close(losses["loss"], 0.3 * losses["loss_ctc"] + 0.7 * losses["loss_att"])
    losses["loss"].backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name


def test_padded_batch_loss_is_mean_of_utterance_losses() -> None:
    model = tiny_model().eval()
    feats, feat_lengths, tokens, token_lengths = padded_batch()
    with torch.no_grad():
        batch = model(feats, feat_lengths, tokens, token_lengths)
        alone = [
            model(
                feats[i : i + 1, : feat_lengths[i]],
                feat_lengths[i : i + 1],
                tokens[i : i + 1, : token_lengths[i]],
                token_lengths[i : i + 1],
            )
            for i in range(3)
        ]
    for key in batch:
        expected = torch.stack([losses[key] for losses in alone]).mean()
        torch.testing.assert_close(batch[key], expected, rtol=1e-4, atol=1e-4)


def test_encoder_output_length_matches_subsampling_formula() -> None:
    torch.manual_seed(0)
    encoder = ConformerEncoder(output_size=16, attention_heads=2, linear_units=16, num_blocks=1).eval()
    for num_frames in (7, 8, 9, 10, 11, 57, 100):
        out, mask = encoder(torch.randn(1, num_frames, 80), torch.tensor([num_frames]))
        assert out.shape[1] == int(subsampled_lengths(torch.tensor(num_frames)))
        assert bool(mask.all())


def test_too_short_input_is_rejected() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="at least 7 input frames"):
        model(torch.randn(1, 6, 80), torch.tensor([6]), torch.tensor([[3]]), torch.tensor([1]))


def test_add_sos_eos() -> None:
    model = tiny_model()
    tokens = torch.tensor([[4, 5, 6], [7, -1, -1]])
    ys_in, ys_out = model.add_sos_eos(tokens, torch.tensor([3, 1]))
    eos = VOCAB - 1
    assert ys_in.tolist() == [[eos, 4, 5, 6], [eos, 7, eos, eos]]
    assert ys_out.tolist() == [[4, 5, 6, eos], [7, eos, -1, -1]]


def test_label_smoothing_matches_explicit_kl_divergence() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, VOCAB)
    targets = torch.randint(0, VOCAB, (2, 5))
    targets[1, 3:] = IGNORE_ID
    smoothing = 0.1
    valid = targets != IGNORE_ID
    true_dist = torch.full_like(logits, smoothing / (VOCAB - 1))
    true_dist.scatter_(-1, targets.masked_fill(~valid, 0).unsqueeze(-1), 1.0 - smoothing)
    kl = F.kl_div(logits.log_softmax(-1), true_dist, reduction="none").sum(-1)
    torch.testing.assert_close(label_smoothing_loss(logits, targets, smoothing), kl[valid].sum())


@pytest.mark.parametrize(
    ("ctc_weight", "zero_key"), [(0.0, "loss_ctc"), (1.0, "loss_att")], ids=["att-only", "ctc-only"]
)
def test_zero_weight_branch_is_skipped(ctc_weight: float, zero_key: str) -> None:
    with torch.no_grad():
        losses = tiny_model(ctc_weight=ctc_weight).eval()(*padded_batch())
    assert float(losses[zero_key]) == 0.0
    assert float(losses["loss"]) > 0.0
