"""Tests for GPT-SoVITS's s1 text-to-semantic model: its size, state dict and training loss against GPT-SoVITS's own
code (recorded test data, made by tests/models/reference/make_gpt_sovits_s1.py), its masks and its gradients."""

from __future__ import annotations

import pytest
import torch

from autotune.models.gpt_sovits_s1 import (
    S1_REDUCED,
    S1_V2,
    Text2SemanticConfig,
    Text2SemanticDecoder,
    top_k_accuracy,
)
from tests.models.reference_state_dicts import (
    full_rank_pattern_state,
    load_reference,
    pattern,
    pattern_state,
    shapes_of,
)

RECORD = "gpt_sovits_s1_v2"


def bert_features(phoneme_lengths: torch.Tensor) -> torch.Tensor:
    """(B, 1024, max length) pattern features, zero past each item's phones as the recipe's collate pads them."""
    width = int(phoneme_lengths.max())
    features = pattern((len(phoneme_lengths), 1024, width), 0.7, scale=1.0)
    return features * (torch.arange(width) < phoneme_lengths[:, None]).unsqueeze(1)


def recorded_batch(recorded: dict) -> tuple[torch.Tensor, ...]:
    phoneme_lengths = torch.tensor(recorded["phoneme_lengths"])
    return (
        torch.tensor(recorded["phoneme_ids"]),
        phoneme_lengths,
        torch.tensor(recorded["semantic_ids"]),
        torch.tensor(recorded["semantic_lengths"]),
        bert_features(phoneme_lengths),
    )


def trainable(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters() if parameter.requires_grad)


def test_s1longer_v2_has_the_references_trainable_total() -> None:
    with torch.device("meta"):
        model = Text2SemanticDecoder(S1_V2)
    layer = (3 * 512 * 513) + 512 * 513 + 2048 * 513 + 512 * 2049 + 4 * 512  # attention, FFN, two LayerNorms
    parts = {
        "bert_proj": 1024 * 512 + 512,
        "ar_text_embedding": 732 * 512,
        "ar_text_position": 1,
        "ar_audio_embedding": 1025 * 512,
        "ar_audio_position": 1,
        "h": 24 * layer,
        "ar_predict_layer": 1025 * 512,
    }
    assert {name: trainable(child) for name, child in model.named_children()} == parts
    assert trainable(model) == sum(parts.values()) == load_reference(RECORD)["trainable_parameters"] == 77_606_402


def test_config_defaults_are_the_yamls_model_section() -> None:
    yaml_model = load_reference(RECORD)["configuration"]
    assert yaml_model["linear_units"] == 4 * S1_V2.hidden_dim  # never read by the reference: the FFN is 4x hidden
    assert {
        "vocab_size": S1_V2.vocab_size,
        "phoneme_vocab_size": S1_V2.phoneme_vocab_size,
        "embedding_dim": S1_V2.embedding_dim,
        "hidden_dim": S1_V2.hidden_dim,
        "head": S1_V2.head,
        "n_layer": S1_V2.n_layer,
        "dropout": S1_V2.dropout,
        "EOS": S1_V2.eos,
    } == {key: value for key, value in yaml_model.items() if key not in ("linear_units", "random_bert")}


def test_state_dict_is_the_references_and_a_reference_checkpoint_loads_strictly() -> None:
    """Text2SemanticDecoder as GPT-SoVITS's own code builds it from s1longer-v2.yaml (RVC-Boss/GPT-SoVITS 48b1a01):
    every key in its order and shape; the position tables are not in the state dict there either."""
    reference = load_reference(RECORD)
    with torch.device("meta"):
        model = Text2SemanticDecoder(S1_V2)
    assert list(shapes_of(model.state_dict()).items()) == list(reference["state_dict"].items())
    checkpoint = {key: torch.full(shape, 0.25) for key, shape in reference["state_dict"].items()}
    model.load_state_dict(checkpoint, strict=True, assign=True)
    with torch.no_grad():
        assert float(model.h.layers[23].norm2.bias[7]) == 0.25 and float(model.ar_audio_position.alpha) == 0.25


@pytest.mark.parametrize("weights", ["pattern", "full_rank_pattern"])
def test_reduced_training_forward_gives_the_references_loss_and_accuracy(weights: str) -> None:
    """forward_old of GPT-SoVITS (recorded) and ours, same reduced configuration, weights and padded batch."""
    recorded = load_reference(RECORD)["reduced"]
    reference_model = {**recorded["model"]}
    assert reference_model.pop("EOS") == S1_REDUCED.eos
    assert {key: getattr(S1_REDUCED, key) for key in reference_model} == reference_model
    expected = recorded["weights"][weights]
    model = Text2SemanticDecoder(S1_REDUCED).eval()
    fill = pattern_state if weights == "pattern" else full_rank_pattern_state
    model.load_state_dict(fill(model.state_dict()), strict=True)
    batch = recorded_batch(recorded)
    with torch.no_grad():
        logits, targets = model.logits(*batch)
        loss, accuracy = model(*batch)
    # Recorded on another CPU: fp32 kernels sum in another order there, and the full-rank pattern's large
    # activations carry that to 4e-4 relative in a few logits (an AMD EPYC against the record's machine).
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=1e-3, atol=1e-4)
    assert float(loss) == pytest.approx(expected["loss"], rel=1e-4)
    assert float(accuracy) == pytest.approx(expected["accuracy"], rel=1e-4)
    assert targets.tolist() == [[1, 4, 9, 15, 0, 2, 7, 16], [11, 3, 6, 8, 16, 16, 16, 16]]  # EOS after, EOS at padding


def test_phones_are_masked_as_left_padded_as_in_the_reference() -> None:
    """The reference masks the first max - length phones of a shorter item, though the collate pads on the right:
    those real phones cannot change the output, the padding phones at the end can."""
    torch.manual_seed(0)
    model = Text2SemanticDecoder(S1_REDUCED).eval()
    lengths = torch.tensor([5, 3])
    phones = torch.tensor([[3, 7, 11, 19, 22], [5, 9, 2, 0, 0]])
    semantic, semantic_lengths = torch.tensor([[1, 4, 9], [11, 3, 6]]), torch.tensor([3, 2])
    bert = bert_features(lengths)

    def logits_with(new_phones: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model.logits(new_phones, lengths, semantic, semantic_lengths, bert)[0][1]

    base = logits_with(phones)
    hidden_first = phones.clone()
    hidden_first[1, :2] = torch.tensor([17, 18])
    seen_padding = phones.clone()
    seen_padding[1, 3:] = torch.tensor([17, 18])
    torch.testing.assert_close(logits_with(hidden_first), base)
    assert not torch.allclose(logits_with(seen_padding), base)


def test_semantic_tokens_see_only_earlier_tokens() -> None:
    torch.manual_seed(0)
    model = Text2SemanticDecoder(S1_REDUCED).eval()
    phones, lengths = torch.tensor([[3, 7, 11]]), torch.tensor([3])
    semantic, semantic_lengths = torch.tensor([[1, 4, 9, 15]]), torch.tensor([4])
    changed = semantic.clone()
    changed[0, 2] = 5
    with torch.no_grad():
        before = model.logits(phones, lengths, semantic, semantic_lengths, bert_features(lengths))[0]
        after = model.logits(phones, lengths, changed, semantic_lengths, bert_features(lengths))[0]
    # Logit row r (from the last phone on) has seen semantic tokens 0..r-1: rows 0-2 predate token 2.
    torch.testing.assert_close(after[:, :3], before[:, :3])
    assert not torch.allclose(after[:, 3:], before[:, 3:])


@pytest.mark.slow  # importing torchmetrics takes seconds
def test_top_k_accuracy_is_torchmetrics_multiclass_accuracy() -> None:
    classification = pytest.importorskip("torchmetrics.classification")
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, 17, generator=generator)
    targets = torch.randint(0, 17, (3, 9), generator=generator)
    targets[:, -2:] = 16
    metric = classification.MulticlassAccuracy(17, top_k=3, average="micro", multidim_average="global", ignore_index=16)
    expected = metric(logits.permute(0, 2, 1), targets)
    assert float(top_k_accuracy(logits, targets, 3, 16)) == pytest.approx(float(expected), abs=1e-6)


def _train_batch() -> tuple[torch.Tensor, ...]:
    lengths = torch.tensor([5, 3])
    return (
        torch.tensor([[3, 7, 11, 19, 22], [5, 9, 2, 0, 0]]),
        lengths,
        torch.tensor([[1, 4, 9, 15, 0, 2, 7], [11, 3, 6, 8, 16, 16, 16]]),
        torch.tensor([7, 4]),
        bert_features(lengths),
    )


def test_backward_gives_finite_gradients_for_every_parameter() -> None:
    torch.manual_seed(0)
    model = Text2SemanticDecoder(S1_REDUCED).train()
    loss, accuracy = model(*_train_batch())
    loss.backward()
    assert torch.isfinite(loss) and 0.0 <= float(accuracy) <= 1.0 and not accuracy.requires_grad
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    """Checkpointed layers recompute in backward with the RNG state restored: same dropout, same gradients."""
    gradients = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = Text2SemanticDecoder(S1_REDUCED, gradient_checkpointing=checkpointing).train()
        model(*_train_batch())[0].backward()
        gradients.append({name: parameter.grad for name, parameter in model.named_parameters()})
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


@pytest.mark.parametrize(
    "settings",
    [{"eos": 1023}, {"embedding_dim": 256}, {"head": 5}],
    ids=["eos-not-last", "embedding-not-hidden", "heads-do-not-divide"],
)
def test_config_rejects_what_the_reference_cannot_build(settings: dict) -> None:
    with pytest.raises(ValueError):
        Text2SemanticConfig(**settings)
