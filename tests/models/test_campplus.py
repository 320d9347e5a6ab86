"""Tests for the CAM++ model: exact size, shapes for any crop length, gradients and activation checkpointing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.models import CAMPPlus
from autotune.models.campplus import FCM, segment_average

FEAT_DIM = 80


def count_parameters(module: torch.nn.Module) -> int:
    """Return the number of scalar parameters in ``module``."""
    return sum(parameter.numel() for parameter in module.parameters())


@pytest.fixture(scope="module")
def model() -> CAMPPlus:
    torch.manual_seed(0)
    return CAMPPlus(embedding_size=192)


@pytest.mark.parametrize(
    ("embedding_size", "expected_total"), [(512, 7_176_224), (192, 6_848_544)], ids=["voxceleb-512", "emb-192"]
)
def test_parameter_total_matches_published_model(embedding_size: int, expected_total: int) -> None:
    assert count_parameters(CAMPPlus(embedding_size=embedding_size)) == expected_total


def test_trains_checkpointed_by_default_as_the_reference() -> None:
    # 3D-Speaker's CAMPPlus defaults to memory_efficient=True (DTDNN.py:58) and cam++.yaml does not override it.
    facts = json.loads((Path(__file__).resolve().parents[1] / "reference" / "speaker_recipes.json").read_text())
    assert facts["3d-speaker"]["campplus_memory_efficient_default"] is True
    assert "memory_efficient" not in facts["3d-speaker"]["recipes"]["cam++"]["embedding_model_args"]
    layers = [m for m in CAMPPlus().modules() if hasattr(m, "memory_efficient")]
    assert len(layers) == 12 + 24 + 16 and all(layer.memory_efficient for layer in layers)


def test_fcm_head_parameter_total() -> None:
    assert count_parameters(FCM(feat_dim=FEAT_DIM)) == 86_048


def test_state_dict_uses_reference_key_names(model: CAMPPlus) -> None:
    keys = set(model.state_dict())
    assert {
        "head.layer1.0.shortcut.0.weight",
        "xvector.tdnn.linear.weight",
        "xvector.block2.tdnnd24.cam_layer.linear_local.weight",
        "xvector.transit3.nonlinear.batchnorm.running_var",
        "xvector.dense.nonlinear.batchnorm.running_mean",
    } <= keys


@pytest.mark.parametrize("num_frames", [48, 100, 150, 301])
def test_output_shape_for_any_crop_length(model: CAMPPlus, num_frames: int) -> None:
    model.eval()
    with torch.no_grad():
        embeddings = model(torch.randn(2, num_frames, FEAT_DIM))
    assert embeddings.shape == (2, 192)
    assert torch.isfinite(embeddings).all()


@pytest.mark.parametrize("num_frames", [1, 48, 100, 250])
def test_segment_average_matches_per_segment_means(num_frames: int) -> None:
    x = torch.randn(2, 3, num_frames)
    expected = torch.cat([chunk.mean(-1, keepdim=True).expand_as(chunk) for chunk in x.split(100, dim=-1)], dim=-1)
    torch.testing.assert_close(segment_average(x), expected)


def test_backward_gives_finite_gradients_for_every_parameter(model: CAMPPlus) -> None:
    model.train()
    model.zero_grad()
    model(torch.randn(2, 48, FEAT_DIM)).pow(2).mean().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name


def _twin_models() -> tuple[CAMPPlus, CAMPPlus]:
    torch.manual_seed(0)
    plain = CAMPPlus(embedding_size=192, memory_efficient=False)
    checkpointed = CAMPPlus(embedding_size=192, memory_efficient=True)
    checkpointed.load_state_dict(plain.state_dict())
    return plain, checkpointed


def _saved_activation_bytes(model: CAMPPlus, features: torch.Tensor) -> tuple[torch.Tensor, int]:
    saved_bytes = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved_bytes
        saved_bytes += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(features)
    return output, saved_bytes


def test_memory_efficient_matches_plain_forward_in_eval() -> None:
    plain, checkpointed = _twin_models()
    features = torch.randn(2, 48, FEAT_DIM)
    plain.eval()
    checkpointed.eval()
    with torch.no_grad():
        torch.testing.assert_close(checkpointed(features), plain(features))


def test_memory_efficient_trains_with_same_gradients_and_fewer_saved_activations() -> None:
    plain, checkpointed = _twin_models()
    features = torch.randn(2, 48, FEAT_DIM)
    plain_output, plain_bytes = _saved_activation_bytes(plain.train(), features)
    checkpointed_output, checkpointed_bytes = _saved_activation_bytes(checkpointed.train(), features)
    torch.testing.assert_close(checkpointed_output, plain_output)
    assert checkpointed_bytes < plain_bytes
    plain_output.pow(2).mean().backward()
    checkpointed_output.pow(2).mean().backward()
    plain_grads = dict(plain.named_parameters())
    for name, parameter in checkpointed.named_parameters():
        assert parameter.grad is not None, name
        torch.testing.assert_close(parameter.grad, plain_grads[name].grad, rtol=1e-4, atol=1e-6)
