"""Tests for the WeNet conformer CTC/attention ASR model, checked against WeNet's own code (recorded test data)."""

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
from tests.models.reference_state_dicts import load_reference, pattern, pattern_state, shapes_of

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


def test_state_dict_is_wenets_and_a_wenet_checkpoint_loads_strictly(published_model: ConformerASR) -> None:
    """WeNet's aishell conformer as its own code saves it (wenet-e2e/wenet 0154699): global CMVN statistics and
    position tables included, every key in WeNet's order with WeNet's shape."""
    reference = load_reference("wenet_conformer_aishell")
    assert list(shapes_of(published_model.state_dict()).items()) == list(reference["state_dict"].items())
    checkpoint = {key: torch.full(shape, 0.5) for key, shape in reference["state_dict"].items()}
    checkpoint = {
        key: value.long() if key.endswith("num_batches_tracked") else value for key, value in checkpoint.items()
    }
    model = ConformerASR()
    model.load_state_dict(checkpoint, strict=True)
    assert float(model.encoder.global_cmvn.istd[0]) == 0.5 and float(model.decoder.embed[1].pe[0, 3, 7]) == 0.5
    trainable = sum(p.numel() for p in published_model.parameters() if p.requires_grad)
    assert trainable == reference["trainable_parameters"] == 46_197_266
    assert published_model.sos == published_model.eos == reference["sos"] == reference["eos"] == 2


def test_same_weights_and_input_give_wenets_outputs() -> None:
    """A small configuration of the same classes, the same weights and features through WeNet (recorded) and ours."""
    recorded = load_reference("wenet_conformer_aishell")["tiny"]
    encoder, decoder = recorded["encoder"], recorded["decoder"]
    assert (
        decoder["attention_heads"] == encoder["attention_heads"] and decoder["linear_units"] == encoder["linear_units"]
    )
    model = ConformerASR(vocab_size=recorded["vocab_size"], **encoder, decoder_blocks=decoder["num_blocks"]).eval()
    model.load_state_dict(pattern_state(model.state_dict()), strict=True)
    feats, lengths = 8.0 + pattern((2, 24, 80), 0.5, scale=3.0), torch.tensor([24, 24])
    tokens = torch.tensor(recorded["tokens"])
    with torch.no_grad():
        encoder_out, _ = model.encoder(feats, lengths)
        losses = model(feats, lengths, tokens, torch.tensor([tokens.shape[1]] * 2))
    torch.testing.assert_close(encoder_out, torch.tensor(recorded["encoder_out"]), rtol=1e-4, atol=1e-5)
    for key in ("loss_ctc", "loss_att", "loss"):
        assert float(losses[key]) == pytest.approx(recorded[key], rel=1e-5), key


def test_global_cmvn_normalises_inside_the_model() -> None:
    model = tiny_model().eval()
    feats, feat_lengths, tokens, token_lengths = padded_batch()
    mean, istd = torch.linspace(-2.0, 2.0, 80), torch.linspace(0.5, 1.5, 80)
    with torch.no_grad():
        raw = model.encoder(feats, feat_lengths)[0]
        model.encoder.global_cmvn.set_stats(mean, istd)
        normalised = model.encoder(feats * 1.0, feat_lengths)[0]
        model.encoder.global_cmvn.set_stats(torch.zeros(80), torch.ones(80))
        by_hand = model.encoder((feats - mean) * istd, feat_lengths)[0]
    torch.testing.assert_close(normalised, by_hand)
    assert not torch.allclose(raw, normalised)
    with pytest.raises(ValueError, match="do not fit 80 bins"):
        model.encoder.global_cmvn.set_stats(torch.zeros(40), torch.ones(40))


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
    tokens = torch.randint(3, VOCAB, (3, 6))  # ids 0-2 are <blank>, <unk>, <sos/eos>
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
    eos = 2  # the aishell recipe's dictionary: <blank> 0, <unk> 1, <sos/eos> 2
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
