"""Tests for Amphion's NaturalSpeech2: its size, state dict and training loss terms against Amphion's own code
(recorded test data, made by tests/models/reference/make_naturalspeech2.py), its masks and its gradients."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from autotune.models.naturalspeech2 import NS2_BASE, NS2_REDUCED, NaturalSpeech2, NaturalSpeech2Config
from tests.models.reference_state_dicts import load_reference, pattern, pattern_state, shapes_of

RECORD = "naturalspeech2"
_SCRAMBLE_STRIDE = 7919  # a prime: i -> i * stride mod n permutes the flat index of every tensor here
_KEPT = ("pe", "pitch_bins")  # computed from the configuration, left as each model builds them

# The reduced batch: two utterances before the dataset's prompt cut (clip_mode "start"), which takes the first
# PROMPT_PHONES phones and their frames as the prompt. Durations include a 0, as forced alignment gives.
PHONES = [[3, 7, 11, 19, 2, 5, 8, 13, 4], [6, 9, 12, 1, 15, 17]]
DURATIONS = [[2, 3, 1, 4, 2, 0, 3, 2, 1], [3, 1, 2, 2, 3, 1]]
PROMPT_PHONES = [3, 2]


def full_rank_pattern_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`pattern_state`, with every learned tensor of two or more dimensions at amplitude 1.0 and its values scrambled.

    pattern_state's matrices have rank 2 and scale 0.2, which leaves attention nearly uniform: a masking error then
    hardly moves the loss. Value i of the flat tensor taken from position i * 7919 mod n breaks the rank.
    """
    filled = pattern_state(state)
    for key, value in filled.items():
        if value.is_floating_point() and value.dim() >= 2 and key.rsplit(".", 1)[-1] not in _KEPT:
            count = value.numel()
            assert math.gcd(_SCRAMBLE_STRIDE, count) == 1, key
            order = torch.arange(count) * _SCRAMBLE_STRIDE % count
            filled[key] = 5.0 * value.flatten()[order].reshape(value.shape)
    return filled


def _codes(levels: int, frames: int, seed: int, codebook_size: int) -> torch.Tensor:
    flat = (pattern((levels * frames,), seed, scale=0.5) + 0.5) * (codebook_size - 1)
    return flat.round().long().reshape(levels, frames)


def _pad(items: list[torch.Tensor], value: float = 0.0) -> torch.Tensor:
    """Right-pad along the last axis, as NS2Collator's pad_sequence does."""
    width = max(item.shape[-1] for item in items)
    return torch.stack([torch.nn.functional.pad(item, (0, width - item.shape[-1]), value=value) for item in items])


def reduced_batch(levels: int = NS2_REDUCED.code_levels, codebook_size: int = 1024) -> dict[str, torch.Tensor]:
    """The collated batch NS2Dataset + NS2Collator make of PHONES/DURATIONS: pattern codes and pitch, prompt cut.

    Codes are int64, pitch float32 in Hz (padded with 50), durations and phone ids int64, masks float32.
    """
    fields: dict[str, list[torch.Tensor]] = {key: [] for key in ("code", "ref_code", "pitch", "duration", "phone_id")}
    for item, (phones, durations, cut) in enumerate(zip(PHONES, DURATIONS, PROMPT_PHONES, strict=True)):
        frames = sum(durations)
        code = _codes(levels, frames, 1.3 + item, codebook_size)
        pitch = 120.0 + 90.0 * pattern((frames,), 0.4 + item, scale=1.0)
        cut_frames = sum(durations[:cut])  # clip_mode "start": start_idx 0 (the first duration is not 0)
        fields["ref_code"].append(code[:, :cut_frames])
        fields["code"].append(code[:, cut_frames:])
        fields["pitch"].append(pitch[cut_frames:])
        fields["duration"].append(torch.tensor(durations[cut:]))
        fields["phone_id"].append(torch.tensor(phones[cut:]))
    return {
        "code": _pad(fields["code"]),
        "pitch": _pad(fields["pitch"], 50.0),
        "duration": _pad(fields["duration"]),
        "phone_id": _pad(fields["phone_id"]),
        "ref_code": _pad(fields["ref_code"]),
        "phone_mask": _pad([torch.ones(len(p)) for p in fields["phone_id"]]),
        "mask": _pad([torch.ones(c.shape[1]) for c in fields["code"]]),
        "ref_mask": _pad([torch.ones(c.shape[1]) for c in fields["ref_code"]]),
    }


def amphion_model_section(config: NaturalSpeech2Config) -> dict[str, Any]:
    """The ``model`` section of Amphion's configuration that ``config`` stands for (keys as exp_config_base.json)."""
    encoder = {
        "encoder_layer": config.encoder_layers,
        "encoder_hidden": config.hidden_size,
        "encoder_head": config.encoder_heads,
        "conv_filter_size": config.encoder_filter_size,
        "conv_kernel_size": config.encoder_kernel_size,
        "encoder_dropout": config.encoder_dropout,
    }
    predictor = {
        "input_size": config.hidden_size,
        "filter_size": config.hidden_size,
        "conv_layers": config.predictor_layers,
        "cross_attn_per_layer": config.predictor_cross_attention_every,
        "attn_head": config.predictor_heads,
        "drop_out": config.predictor_dropout,
    }
    return {
        "latent_dim": config.latent_dim,
        "prior_encoder": {
            "vocab_size": config.vocab_size,
            "pitch_min": config.pitch_min,
            "pitch_max": config.pitch_max,
            "pitch_bins_num": config.pitch_bins,
            "encoder": {**encoder, "use_cln": True},
            "duration_predictor": {**predictor, "kernel_size": config.duration_kernel_size},
            "pitch_predictor": {**predictor, "kernel_size": config.pitch_kernel_size},
        },
        "diffusion": {
            "wavenet": {
                "input_size": config.latent_dim,
                "hidden_size": config.hidden_size,
                "out_size": config.latent_dim,
                "num_layers": config.wavenet_layers,
                "cross_attn_per_layer": config.wavenet_cross_attention_every,
                "dilation_cycle": config.wavenet_dilation_cycle,
                "attn_head": config.wavenet_heads,
                "drop_out": 0.2,  # builds an nn.Dropout that the forward never calls
            },
            "beta_min": config.beta_min,
            "beta_max": config.beta_max,
            "sigma": config.sigma,
            "noise_factor": config.noise_factor,
            "ode_solver": "euler",  # inference only
            "diffusion_type": "diffusion",
        },
        "prompt_encoder": {
            **encoder,
            "encoder_layer": config.prompt_encoder_layers,
            "use_cln": False,
        },
        "query_emb": {
            "query_token_num": config.query_tokens,
            "hidden_size": config.hidden_size,
            "head_num": config.query_heads,
        },
        "inference_step": 500,  # inference only
    }


def trainable(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters() if parameter.requires_grad)


def test_config_defaults_are_the_recipes() -> None:
    configuration = load_reference(RECORD)["configuration"]
    assert amphion_model_section(NS2_BASE) == configuration["model"]
    assert configuration["train"]["diff_ce_loss_lambda"] == NS2_BASE.diff_ce_loss_lambda
    assert configuration["train"]["diff_noise_loss_lambda"] == NS2_BASE.diff_noise_loss_lambda


def test_base_has_the_references_trainable_total() -> None:
    with torch.device("meta"):
        model = NaturalSpeech2(NS2_BASE)
    parts = {name: trainable(child) for name, child in model.named_children()}
    assert parts["quantizer"] == 0  # the codebook is buffers
    assert trainable(model) == load_reference(RECORD)["trainable_parameters"] == 378_210_434


def test_state_dict_is_the_references_and_a_reference_checkpoint_loads_strictly() -> None:
    """NaturalSpeech2 as Amphion's code builds it from exp_config_base.json: every key in its order and shape, the
    shared phone embedding under both owners and EnCodec's 32 codebooks as buffers included."""
    reference = load_reference(RECORD)
    with torch.device("meta"):
        model = NaturalSpeech2(NS2_BASE)
    assert list(shapes_of(model.state_dict()).items()) == list(reference["state_dict"].items())
    checkpoint = {key: torch.full(shape, 0.25) for key, shape in reference["state_dict"].items()}
    model.load_state_dict(checkpoint, strict=True, assign=True)
    with torch.no_grad():
        assert float(model.diffusion.diff_estimator.layers[39].film.bias.bias[7]) == 0.25
        assert float(model.quantizer.embed(31)[1023, 127]) == 0.25


def _fill(model: torch.nn.Module, weights: str) -> None:
    fill = pattern_state if weights == "pattern" else full_rank_pattern_state
    model.load_state_dict(fill(model.state_dict()), strict=True)


@pytest.mark.parametrize("weights", ["pattern", "full_rank_pattern"])
def test_reduced_training_forward_gives_the_references_loss_terms(weights: str) -> None:
    """Amphion's forward and NS2Trainer's loss lines (recorded) and ours: same reduced configuration, weights,
    batch and seed, so the same diffusion time and noise; eval mode, so no dropout."""
    recorded = load_reference(RECORD)["reduced"]
    assert amphion_model_section(NS2_REDUCED) == recorded["model"]
    expected = recorded["weights"][weights]
    model = NaturalSpeech2(NS2_REDUCED).eval()
    _fill(model, weights)
    times: list[torch.Tensor] = []
    model.diffusion.diff_estimator.register_forward_pre_hook(lambda module, args: times.append(args[3]))
    torch.manual_seed(recorded["seed"])
    with torch.no_grad():
        losses = model(**reduced_batch())
    torch.testing.assert_close(times[0], torch.tensor(recorded["diffusion_time"]), rtol=0, atol=0)
    for name in ("pitch_loss", "dur_loss", "diff_loss_x0", "diff_loss_noise", "diff_loss_ce", "total"):
        assert float(getattr(losses, name)) == pytest.approx(expected[name], rel=1e-4), name


def test_backward_gives_finite_gradients_for_every_parameter() -> None:
    torch.manual_seed(0)
    model = NaturalSpeech2(NS2_REDUCED).train()
    losses = model(**reduced_batch())
    losses.total.backward()
    assert torch.isfinite(losses.total)
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    assert not any(buffer.requires_grad for buffer in model.quantizer.buffers())
