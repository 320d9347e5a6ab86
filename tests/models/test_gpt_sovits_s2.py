"""Tests for GPT-SoVITS's s2 model: sizes, state dicts and one training step's losses against GPT-SoVITS's own code
(recorded test data, made by tests/models/reference/make_gpt_sovits_s2.py), and the gradients of both steps."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import pytest
import torch

from autotune.models.gpt_sovits_s2 import (
    S2_REDUCED,
    S2_REDUCED_STEP,
    S2_V2,
    S2_V2_STEP,
    MultiPeriodDiscriminator,
    SynthesizerConfig,
    SynthesizerTrn,
    discriminator_loss,
    generator_losses,
    slice_segments,
)
from tests.models.reference_state_dicts import REFERENCE_DIR, full_rank_pattern_state, pattern, pattern_state

RECORD = "gpt_sovits_s2_v2"
SEED = 1234  # s2.json's train.seed
# s2.json's optimizer settings; the learning rate of the first step, after s2_train.py's one scheduler step.
ADAMW = {"lr": 1e-4 * 0.999875, "betas": (0.8, 0.99), "eps": 1e-9}
CODEBOOK = {
    "pattern": "inited set to 1: the codebook is the pattern-filled embed buffer",
    "kmeans": "inited set to 0: the first forward initialises the codebook by k-means on its input",
}
# The reference's keyword arguments for S2_REDUCED (the rest is s2.json's model section).
REDUCED_MODEL = {
    "inter_channels": 16,
    "filter_channels": 64,
    "n_layers": 2,
    "resblock_kernel_sizes": [3, 5],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
    "upsample_rates": [8, 4, 4],
    "upsample_initial_channel": 32,
    "upsample_kernel_sizes": [16, 8, 8],
}
REDUCED_STEP = {
    "sampling_rate": 32000,
    "filter_length": 2048,
    "hop_length": 128,
    "win_length": 2048,
    "n_mel_channels": 20,
    "segment_size": 1024,
    "c_mel": 45,
    "c_kl": 1.0,
}
# The prior's and posterior's projections (enc_p.proj, enc_q.proj) are scaled by this after the pattern fill: at
# pattern amplitude their log-scales reach +-13, z reaches 1e6 and the KL 1e30, which no comparison can use.
PROJECTION_SCALE = 0.05
SPEC_LENGTHS = [11, 9]
TEXT = [[3, 7, 11, 19, 22, 5], [5, 9, 2, 40, 0, 0]]
TEXT_LENGTHS = [6, 4]


@functools.cache
def _record() -> dict[str, Any]:
    """The JSON record (two state dicts, net_g's and net_d's, so not load_reference's one-model layout)."""
    return json.loads((REFERENCE_DIR / f"{RECORD}.json").read_text())


def load_reference(name: str) -> dict[str, Any]:
    assert name == RECORD
    return _record()


def reduced_batch() -> tuple[torch.Tensor, ...]:
    """A collated batch for the reduced configuration: ssl, spec, spec lengths, phones, phone lengths, wav.

    Zero past each item's length, the spectrogram and SSL widths padded to the next even number above the longest
    (as TextAudioSpeakerCollate pads them), the spectrogram a magnitude (non-negative).
    """
    lengths = torch.tensor(SPEC_LENGTHS)
    width = 2 * (max(SPEC_LENGTHS) // 2 + 1)
    frames = (torch.arange(width) < lengths[:, None]).unsqueeze(1)
    hop = REDUCED_STEP["hop_length"]
    samples = (torch.arange(max(SPEC_LENGTHS) * hop) < lengths[:, None] * hop).unsqueeze(1)
    return (
        pattern((2, 768, width), 1.1, scale=1.0) * frames,
        pattern((2, 1025, width), 0.3, scale=1.0).abs() * frames,
        lengths,
        torch.tensor(TEXT),
        torch.tensor(TEXT_LENGTHS),
        pattern((2, 1, max(SPEC_LENGTHS) * hop), 2.3, scale=0.5) * samples,
    )


def _meta_pair(config: SynthesizerConfig = S2_V2) -> tuple[SynthesizerTrn, MultiPeriodDiscriminator]:
    with torch.device("meta"):
        return SynthesizerTrn(config), MultiPeriodDiscriminator(S2_V2_STEP.periods)


def _shapes(module: torch.nn.Module) -> list[list]:
    return [[key, list(value.shape)] for key, value in module.state_dict().items()]


def test_v2_totals_are_the_references() -> None:
    reference = load_reference(RECORD)
    net_g, net_d = _meta_pair()
    parts = {name: sum(p.numel() for p in child.parameters()) for name, child in net_g.named_children()}
    assert parts == reference["net_g"]["parts"]
    assert sum(p.numel() for p in net_g.parameters()) == reference["net_g"]["parameters"] == 51_310_080
    assert sum(b.numel() for b in net_g.buffers()) == reference["net_g"]["buffers"]  # the codebook
    assert sum(p.numel() for p in net_d.parameters()) == reference["net_d"]["parameters"] == 46_747_132
    assert all(p.requires_grad for p in [*net_g.parameters(), *net_d.parameters()])
    assert reference["net_g"]["trainable_parameters"] == reference["net_g"]["parameters"]


def test_config_defaults_are_s2_json() -> None:
    configuration = load_reference(RECORD)["configuration"]
    model, data, train = configuration["model"], configuration["data"], configuration["train"]
    assert S2_V2.spec_channels == data["filter_length"] // 2 + 1
    assert S2_V2.segment_frames == train["segment_size"] // data["hop_length"] == S2_V2_STEP.segment_size // 640
    assert S2_V2.hop_length == data["hop_length"] == S2_V2_STEP.hop_length
    for key in ("inter_channels", "hidden_channels", "filter_channels", "n_heads", "n_layers", "kernel_size"):
        assert getattr(S2_V2, key) == model[key], key
    assert list(S2_V2.upsample_rates) == model["upsample_rates"]
    assert list(S2_V2.upsample_kernel_sizes) == model["upsample_kernel_sizes"]
    assert [list(d) for d in S2_V2.resblock_dilation_sizes] == model["resblock_dilation_sizes"]
    assert (S2_V2.gin_channels, S2_V2.semantic_frame_rate) == (model["gin_channels"], model["semantic_frame_rate"])
    assert model["resblock"] == "1" and model["freeze_quantizer"] and not model["use_spectral_norm"]
    step = {key: getattr(S2_V2_STEP, key) for key in ("sampling_rate", "filter_length", "win_length")}
    assert step == {key: data[key] for key in step}
    assert (S2_V2_STEP.n_mel_channels, S2_V2_STEP.mel_fmax) == (data["n_mel_channels"], data["mel_fmax"])
    assert (S2_V2_STEP.c_mel, S2_V2_STEP.c_kl) == (train["c_mel"], train["c_kl"])


def test_state_dicts_are_the_references_and_load_strictly() -> None:
    """net_g and net_d as GPT-SoVITS's own code builds them from s2.json (v2): every key, in order, and shape."""
    reference = load_reference(RECORD)
    net_g, net_d = _meta_pair()
    for model, name in ((net_g, "net_g"), (net_d, "net_d")):
        assert _shapes(model) == reference[name]["state_dict"], name
        checkpoint = {key: torch.full(shape, 0.25) for key, shape in reference[name]["state_dict"]}
        model.load_state_dict(checkpoint, strict=True, assign=True)
    with torch.no_grad():
        assert (
            float(net_g.dec.ups[4].weight_g[3, 0, 0]) == 0.25 and float(net_d.discriminators[5].conv_post.bias) == 0.25
        )


def test_reduced_config_is_the_recorded_one() -> None:
    recorded = load_reference(RECORD)["reduced"]
    model = recorded["model"]
    assert {key: getattr(S2_REDUCED, key) for key in model} == {
        key: tuple(tuple(v) if isinstance(v, list) else v for v in value) if isinstance(value, list) else value
        for key, value in model.items()
    }
    step = recorded["step"]
    assert {key: getattr(S2_REDUCED_STEP, key) for key in step} == step
    assert S2_REDUCED.segment_frames == step["segment_size"] // step["hop_length"] and S2_REDUCED.hop_length == 128


def _reduced_pair(weights: str, codebook: str) -> tuple[SynthesizerTrn, MultiPeriodDiscriminator]:
    net_g, net_d = SynthesizerTrn(S2_REDUCED).eval(), MultiPeriodDiscriminator(S2_REDUCED_STEP.periods).eval()
    fill = pattern_state if weights == "pattern" else full_rank_pattern_state
    for net in (net_g, net_d):
        net.load_state_dict(fill(net.state_dict()), strict=True)
    with torch.no_grad():
        for projection in (net_g.enc_p.proj, net_g.enc_q.proj):
            projection.weight.mul_(PROJECTION_SCALE)
            projection.bias.mul_(PROJECTION_SCALE)
        net_g.quantizer.vq.layers[0]._codebook.inited.fill_(0.0 if codebook == "kmeans" else 1.0)
    return net_g, net_d


def _grad_norm(module: torch.nn.Module) -> float:
    return sum(float(p.grad.norm()) ** 2 for p in module.parameters() if p.grad is not None) ** 0.5


def _training_step(net_g: SynthesizerTrn, net_d: MultiPeriodDiscriminator) -> dict:
    """s2_train.py's step on the reduced batch: D loss, backward, AdamW; then the generator losses and backward."""
    ssl, spec, spec_lengths, text, text_lengths, wav = reduced_batch()
    optimizer = torch.optim.AdamW(net_d.parameters(), ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    torch.manual_seed(SEED)
    output = net_g(ssl, spec, spec_lengths, text, text_lengths)
    real = slice_segments(wav, output.ids_slice * S2_REDUCED_STEP.hop_length, S2_REDUCED_STEP.segment_size)
    real_scores, fake_scores, _, _ = net_d(real, output.audio.detach())
    loss_disc = discriminator_loss(real_scores, fake_scores)
    loss_disc.backward()
    grad_norm_d = _grad_norm(net_d)
    optimizer.step()
    _, fake_scores, real_maps, fake_maps = net_d(real, output.audio)
    losses = generator_losses(output, spec, fake_scores, real_maps, fake_maps, S2_REDUCED_STEP)
    losses.total.backward()
    return {
        "ids_slice": output.ids_slice.tolist(),
        "losses": {
            "disc": float(loss_disc.detach()),
            "gen": float(losses.adversarial.detach()),
            "fm": float(losses.feature_matching.detach()),
            "mel": float(losses.mel.detach()),
            "kl_ssl": float(losses.kl_ssl.detach()),
            "kl": float(losses.kl.detach()),
            "gen_all": float(losses.total.detach()),
        },
        "grad_norm_d": grad_norm_d,
        "grad_norm_g": _grad_norm(net_g),
        "no_gradient": [name for name, p in net_g.named_parameters() if p.grad is None],
        "codes": net_g.quantizer(net_g.ssl_proj(ssl))[1][0].tolist(),
        "codebook_sum": float(net_g.quantizer.vq.layers[0]._codebook.embed.double().sum()),
        "cluster_size_sum": float(net_g.quantizer.vq.layers[0]._codebook.cluster_size.sum()),
    }


@pytest.mark.slow  # 72M parameters (net_d's 46.7M are fixed) filled and stepped on CPU: about a minute each
@pytest.mark.parametrize(("weights", "codebook"), [("pattern", "pattern"), ("full_rank_pattern", "kmeans")])
def test_reduced_training_step_gives_the_references_losses(weights: str, codebook: str) -> None:
    """One D + G step of GPT-SoVITS (recorded) and ours: same configuration, weights, batch and seed."""
    expected = load_reference(RECORD)["reduced"]["weights"][weights]
    assert expected["codebook"] == CODEBOOK[codebook]
    got = _training_step(*_reduced_pair(weights, codebook))
    assert got["ids_slice"] == expected["ids_slice"] and got["codes"] == expected["codes"]
    assert got["no_gradient"] == expected["no_gradient"] == ["ssl_proj.weight", "ssl_proj.bias"]
    for term, value in expected["losses"].items():
        assert got["losses"][term] == pytest.approx(value, rel=1e-4, abs=1e-6), term
    # Sums over 72M gradients recorded on another CPU, whose fp32 kernels add in another order: the full-rank
    # pattern's gradient norm of 2.8e5 moved 4e-4 relative on an AMD EPYC (the losses above still agree to 1e-4).
    for key in ("grad_norm_d", "grad_norm_g", "codebook_sum", "cluster_size_sum"):
        assert got[key] == pytest.approx(expected[key], rel=1e-3, abs=1e-6), key


TINY = dataclasses.replace(
    S2_REDUCED,
    hidden_channels=16,
    ssl_dim=24,
    codebook_size=8,
    kmeans_iters=3,
    phone_vocab_size=48,
    spec_channels=33,
    ref_bins=12,
    upsample_rates=(4, 4),
    upsample_kernel_sizes=(8, 8),
    upsample_initial_channel=16,
    mrte_hidden=32,
    mrte_heads=2,
    gin_channels=32,
    posterior_layers=2,
    flow_layers=2,
    n_flows=2,
)


def test_backward_of_each_step_gives_finite_gradients() -> None:
    """A narrow configuration of the same code path: D step gradients on net_d, G step gradients on everything
    but ssl_proj (the frozen quantizer passes none to it), all finite."""
    torch.manual_seed(0)
    net_g, net_d = SynthesizerTrn(TINY).train(), MultiPeriodDiscriminator((2,))
    lengths = torch.tensor([11, 9])
    frames = (torch.arange(12) < lengths[:, None]).unsqueeze(1)
    ssl, spec = torch.randn(2, 24, 12) * frames, torch.rand(2, 33, 12) * frames
    text, text_lengths = torch.tensor([[3, 7, 11, 19], [5, 9, 2, 0]]), torch.tensor([4, 3])
    wav = torch.rand(2, 1, 11 * 16) - 0.5
    output = net_g(ssl, spec, lengths, text, text_lengths)
    assert output.audio.shape == (2, 1, 128) and bool(net_g.quantizer.vq.layers[0]._codebook.inited)
    real = slice_segments(wav, output.ids_slice * 16, 128)
    real_scores, fake_scores, _, _ = net_d(real, output.audio.detach())
    discriminator_loss(real_scores, fake_scores).backward()
    for name, parameter in net_d.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    net_d.zero_grad()
    step = dataclasses.replace(
        S2_REDUCED_STEP, filter_length=64, hop_length=16, win_length=64, n_mel_channels=6, segment_size=128
    )
    _, fake_scores, real_maps, fake_maps = net_d(real, output.audio)
    losses = generator_losses(output, spec, fake_scores, real_maps, fake_maps, step)
    losses.total.backward()
    assert torch.isfinite(losses.total) and float(losses.kl_ssl.detach()) == 0.0
    for name, parameter in net_g.named_parameters():
        if name.startswith("ssl_proj."):
            assert parameter.grad is None, name
        else:
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize(
    "settings",
    [{"semantic_frame_rate": "12hz"}, {"ref_bins": 2000}, {"gin_channels": 256}, {"n_heads": 5}],
    ids=["frame-rate", "ref-bins", "gin-not-mrte", "heads-do-not-divide"],
)
def test_config_rejects_what_the_reference_cannot_build(settings: dict) -> None:
    with pytest.raises(ValueError):
        SynthesizerConfig(**settings)
