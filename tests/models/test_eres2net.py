"""Tests for the ERes2Net model: exact size, shapes for short and long crops, gradients, pooling choice."""

from __future__ import annotations

import pytest
import torch

from autotune.models import ERes2Net

FEAT_DIM = 80


def count_parameters(module: torch.nn.Module) -> int:
    """Return the number of scalar parameters in ``module``."""
    return sum(parameter.numel() for parameter in module.parameters())


@pytest.fixture(scope="module")
def model() -> ERes2Net:
    torch.manual_seed(0)
    return ERes2Net()


@pytest.mark.parametrize(("m_channels", "expected_total"), [(32, 6_610_688), (64, 22_462_784)], ids=["base", "large"])
def test_parameter_total_matches_published_model(m_channels: int, expected_total: int) -> None:
    assert count_parameters(ERes2Net(m_channels=m_channels)) == expected_total


def test_state_dict_uses_reference_key_names(model: ERes2Net) -> None:
    keys = set(model.state_dict())
    assert {
        "layer1.0.convs.1.weight",
        "layer3.0.fuse_models.0.local_att.0.weight",
        "layer4.0.shortcut.1.running_mean",
        "layer3_downsample.weight",
        "fuse_mode1234.local_att.4.weight",
        "seg_1.bias",
    } <= keys


@pytest.mark.parametrize("num_frames", [48, 301])
def test_output_shape_for_short_and_long_crops(model: ERes2Net, num_frames: int) -> None:
    model.eval()
    with torch.no_grad():
        embeddings = model(torch.randn(2, num_frames, FEAT_DIM))
    assert embeddings.shape == (2, 192)
    assert torch.isfinite(embeddings).all()


def test_backward_gives_finite_gradients_for_every_parameter(model: ERes2Net) -> None:
    model.train()
    model.zero_grad()
    model(torch.randn(2, 48, FEAT_DIM)).pow(2).mean().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name


def test_mean_only_pooling_halves_the_embedding_input() -> None:
    mean_only = ERes2Net(pooling="TAP").eval()
    assert mean_only.seg_1.in_features == 5120
    with torch.no_grad():
        assert mean_only(torch.randn(1, 48, FEAT_DIM)).shape == (1, 192)


def test_unknown_pooling_lists_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="TSTP"):
        ERes2Net(pooling="ASTP")
