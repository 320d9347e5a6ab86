"""Tests for SpeechBrain's CommonVoice wav2vec2 CTC model: its size and state dict and outputs against SpeechBrain's
and transformers' own code (recorded test data, and live when transformers is installed), and training backward."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch

from autotune.models.wav2vec2 import Wav2Vec2Config
from autotune.models.wav2vec2_ctc import REDUCED_CONFIG, Wav2Vec2CTC, Wav2Vec2CTCConfig
from tests.models.reference_state_dicts import load_reference, pattern, pattern_state, shapes_of

RECORD = "wav2vec2_ctc"


def count(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters() if parameter.requires_grad)


def full_model_on_meta() -> Wav2Vec2CTC:
    with torch.device("meta"):
        return Wav2Vec2CTC()


def templates(keys: Any) -> list[str]:
    """Keys with layer indices replaced by N, duplicates dropped, in order."""
    return list(dict.fromkeys(re.sub(r"\.\d+\.", ".N.", key) for key in keys))


def reduced_batch(inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """The recorded batch: pattern waveforms, zero past each relative length, and padded targets."""
    shape = tuple(inputs["wav_shape"])
    wav_lens = torch.tensor(inputs["wav_lens"])
    valid = torch.arange(shape[1]) < torch.round(wav_lens * shape[1]).unsqueeze(1)
    wavs = pattern(shape, inputs["wav_seed"], scale=1.0) * valid
    return wavs, wav_lens, torch.tensor(inputs["tokens"]), torch.tensor(inputs["token_lens"])


def pattern_model(config: Wav2Vec2CTCConfig = REDUCED_CONFIG) -> Wav2Vec2CTC:
    model = Wav2Vec2CTC(config)
    model.load_state_dict(pattern_state(model.state_dict()), strict=True)
    return model


def assert_samples(tensor: torch.Tensor, recorded: dict[str, Any], name: str) -> None:
    flat = tensor.detach().double().flatten()
    assert list(tensor.shape) == recorded["shape"], name
    values = flat[:: recorded["stride"]][: len(recorded["values"])]
    torch.testing.assert_close(values, torch.tensor(recorded["values"], dtype=torch.float64), rtol=1e-4, atol=1e-5)
    assert float(flat.mean()) == pytest.approx(recorded["mean"], rel=1e-4, abs=1e-6), name
    assert float(flat.std()) == pytest.approx(recorded["std"], rel=1e-4), name


def test_full_configuration_has_the_reference_total() -> None:
    reference = load_reference(RECORD)
    model = full_model_on_meta()
    parts = {name: count(child) for name, child in model.named_children()}
    assert parts == reference["parts"] == {"wav2vec2": 315_438_720, "enc": 3_154_944, "ctc_lin": 77_900}
    assert count(model) == reference["trainable_parameters"] == 318_671_564


def test_state_dict_is_the_recipes_and_a_checkpoint_loads_strictly() -> None:
    reference = load_reference(RECORD)
    model = full_model_on_meta()
    assert list(shapes_of(model.state_dict()).items()) == list(reference["state_dict"].items())
    small = Wav2Vec2CTC(REDUCED_CONFIG)
    checkpoint = {
        key: torch.full(shape, 0.25) if not key.endswith("num_batches_tracked") else torch.tensor(3)
        for key, shape in shapes_of(small.state_dict()).items()
    }
    small.load_state_dict(checkpoint, strict=True)
    assert float(small.ctc_lin.w.weight.detach()[0, 0]) == 0.25
    assert int(small.enc.bn3.norm.num_batches_tracked) == 3
    # The reduced model is the same module tree, with fewer layers.
    assert templates(small.state_dict()) == templates(reference["state_dict"])


def test_recorded_configuration_is_ours() -> None:
    record = load_reference(RECORD)
    full, reduced = record["config"], record["reduced"]
    for config, encoder, head in (
        (Wav2Vec2CTCConfig(), full["encoder"], full["head"]),
        (REDUCED_CONFIG, reduced["encoder"], reduced["head"]),
    ):
        for field in dataclasses.fields(Wav2Vec2Config):
            value = getattr(config.encoder, field.name)
            assert (list(value) if isinstance(value, tuple) else value) == encoder[field.name], field.name
        assert (config.dnn_neurons, config.output_neurons, config.dropout, config.blank_index) == (
            head["dnn_neurons"],
            head["output_neurons"],
            head["dropout"],
            head["blank_index"],
        )
        assert config.normalize_wav is reduced["normalize_wav"]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_same_weights_and_input_give_the_references_outputs(mode: str) -> None:
    """The reduced configuration with pattern weights on the recorded padded batch, as SpeechBrain's wrapper, head and
    ctc_loss ran it: 'train' is training mode (dropout and layerdrop are 0 in this configuration; BatchNorm on batch
    statistics; then backward, every gradient's norm compared), 'eval' evaluation mode on the pattern running
    statistics."""
    recorded = load_reference(RECORD)["reduced"]
    expected = recorded[mode]
    model = pattern_model().train(mode == "train")
    wavs, wav_lens, tokens, token_lens = reduced_batch(recorded["inputs"])
    with torch.set_grad_enabled(mode == "train"):
        feats = model.wav2vec2(wavs, wav_lens)
        log_probs = torch.log_softmax(model.ctc_lin(model.enc(feats)), dim=-1)
        loss = model.loss(log_probs, tokens, wav_lens, token_lens)
    assert_samples(feats, expected["encoder_out"], "encoder_out")
    assert_samples(log_probs, expected["log_probs"], "log_probs")
    assert float(loss.detach()) == pytest.approx(expected["loss"], rel=1e-5)
    if mode == "train":
        loss.backward()
        norms = {name: float(p.grad.double().norm()) for name, p in model.named_parameters() if p.grad is not None}
        assert norms.keys() == expected["grad_norms"].keys()
        for name, norm in norms.items():
            # abs: gradients that vanish mathematically (the encoder's final LayerNorm bias, whose shift BatchNorm
            # removes; the key biases) are rounding noise of about 1e-3 in both.
            assert norm == pytest.approx(expected["grad_norms"][name], rel=1e-3, abs=2e-3), name
        assert [name for name, p in model.named_parameters() if p.grad is None] == expected["no_grad"]
        running_mean = model.enc.bn1.norm.running_mean[:8]
        torch.testing.assert_close(running_mean, torch.tensor(expected["running_mean_bn1"]), rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(model(wavs, wav_lens), log_probs.detach())  # forward() is the same computation


def test_training_backward_with_dropout_and_layerdrop_gives_finite_gradients() -> None:
    torch.manual_seed(0)
    encoder = dataclasses.replace(
        REDUCED_CONFIG.encoder,
        hidden_dropout=0.1,
        attention_dropout=0.1,
        feat_proj_dropout=0.1,
        layerdrop=0.1,
    )
    model = Wav2Vec2CTC(dataclasses.replace(REDUCED_CONFIG, encoder=encoder, dropout=0.15)).train()
    wavs, wav_lens = torch.randn(2, 2000), torch.tensor([1.0, 0.7])
    log_probs = model(wavs, wav_lens)
    assert log_probs.shape == (2, 99, 10)
    loss = model.loss(log_probs, torch.tensor([[1, 2, 3], [4, 5, 0]]), wav_lens, torch.tensor([1.0, 2 / 3]))
    loss.backward()
    assert torch.isfinite(loss)
    for name, parameter in model.named_parameters():
        if name == "wav2vec2.model.masked_spec_embed":  # SpecAugment is off in the recipe: no gradient there either
            assert parameter.grad is None
            continue
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


def test_freezing_follows_the_wrapper() -> None:
    features_frozen = Wav2Vec2CTC(dataclasses.replace(REDUCED_CONFIG, freeze_feature_extractor=True))
    frozen = {name for name, p in features_frozen.named_parameters() if not p.requires_grad}
    assert frozen == {
        name
        for name, _ in features_frozen.wav2vec2.model.feature_extractor.named_parameters(
            prefix="wav2vec2.model.feature_extractor"
        )
    }
    model = Wav2Vec2CTC(dataclasses.replace(REDUCED_CONFIG, freeze=True)).train()
    log_probs = model(torch.randn(2, 1000), torch.tensor([1.0, 0.5]))
    log_probs.sum().backward()
    assert all(p.grad is None for p in model.wav2vec2.parameters())
    assert model.ctc_lin.w.weight.grad is not None


def test_padding_does_not_change_the_encoder_output_of_real_frames() -> None:
    """Without wav normalisation (which spans the padded row, as in SpeechBrain) real frames ignore padding."""
    model = pattern_model(dataclasses.replace(REDUCED_CONFIG, normalize_wav=False)).eval()
    wavs = pattern((2, 1600), 0.3, scale=1.0)
    wav_lens = torch.tensor([1.0, 0.6])
    wavs[1, 960:] = 0.0
    with torch.no_grad():
        together = model.wav2vec2(wavs, wav_lens)
        alone = model.wav2vec2(wavs[1:, :960], torch.tensor([1.0]))
    frames = alone.shape[1]
    torch.testing.assert_close(together[1, :frames], alone[0], rtol=1e-4, atol=1e-5)


def test_encoder_matches_transformers_live() -> None:
    """Our encoder and transformers' Wav2Vec2Model, same pattern weights, padded batch, training mode with layerdrop
    0.5 and no dropout (both draw one torch.rand per layer, so a seeded run skips the same layers): outputs and every
    parameter's gradient agree; transformers' state dict loads into ours strictly, full size included."""
    transformers = pytest.importorskip("transformers")
    settings = load_reference(RECORD)["reduced"]["encoder"]
    hf_config = transformers.Wav2Vec2Config(**{**settings, "layerdrop": 0.5}, apply_spec_augment=False)
    hf_config._attn_implementation = "eager"
    reference = transformers.Wav2Vec2Model(hf_config)
    ours = Wav2Vec2CTC(
        dataclasses.replace(REDUCED_CONFIG, encoder=dataclasses.replace(REDUCED_CONFIG.encoder, layerdrop=0.5))
    ).wav2vec2.model
    reference.load_state_dict(pattern_state(reference.state_dict()), strict=True)
    ours.load_state_dict(reference.state_dict(), strict=True)
    wavs = pattern((3, 1600), 0.5, scale=1.0)
    mask = torch.arange(1600) < torch.tensor([[1600], [1100], [700]])
    outputs, gradients = [], []
    for model, call in (
        (reference, lambda: reference(wavs, attention_mask=mask).last_hidden_state),
        (ours, lambda: ours(wavs, mask)),
    ):
        model.train()
        torch.manual_seed(5)  # draws 0.83, then 0.13: layer 0 runs, layer 1 is skipped
        y = call()
        (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        outputs.append(y.detach())
        gradients.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
    assert gradients[1].keys() == gradients[0].keys()
    scale = max(float(g.abs().max()) for g in gradients[0].values())
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, rtol=1e-3, atol=1e-5 * scale, msg=name)
    with torch.device("meta"):
        full = transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(**load_reference(RECORD)["config"]["encoder"]))
    assert shapes_of(full.state_dict()) == shapes_of(full_model_on_meta().wav2vec2.model.state_dict())


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    model = pattern_model().train()
    wavs, wav_lens, tokens, token_lens = reduced_batch(load_reference(RECORD)["reduced"]["inputs"])
    gradients = []
    for enabled in (False, True):
        model.zero_grad()
        model.load_state_dict(pattern_state(model.state_dict()), strict=True)  # the same BatchNorm statistics
        model.wav2vec2.model.encoder.gradient_checkpointing = enabled
        model.loss(model(wavs, wav_lens), tokens, wav_lens, token_lens).backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)
