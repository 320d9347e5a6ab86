"""Tests for the ECAPA-TDNN speaker-embedding network."""

from __future__ import annotations

import pytest
import torch

from autotune.models.ecapa_tdnn import ECAPATDNN, AttentiveStatisticsPooling, SEBlock, frame_mask


def count_parameters(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


@pytest.mark.parametrize(
    ("channels", "expected"),
    [(1024, 20_767_552), (512, 6_194_048)],
    ids=["C1024-published", "C512-small"],
)
def test_parameter_total(channels: int, expected: int) -> None:
    assert count_parameters(ECAPATDNN(channels=channels)) == expected


@pytest.fixture
def small_model() -> ECAPATDNN:
    torch.manual_seed(0)
    return ECAPATDNN(channels=64, embedding_size=16, se_channels=8, attention_channels=8)


@pytest.mark.parametrize("num_frames", [5, 48, 200])
def test_output_shape_for_short_and_long_inputs(small_model: ECAPATDNN, num_frames: int) -> None:
    feats = torch.randn(3, num_frames, 80)
    assert small_model(feats).shape == (3, 16)
    small_model.eval()
    assert small_model(feats, torch.tensor([num_frames, num_frames - 1, 3])).shape == (3, 16)


def test_published_size_runs_on_48_frames() -> None:
    model = ECAPATDNN().eval()
    with torch.no_grad():
        embeddings = model(torch.randn(2, 48, 80))
    assert embeddings.shape == (2, 192)
    assert torch.isfinite(embeddings).all()


def test_gradients_are_finite_with_variable_lengths(small_model: ECAPATDNN) -> None:
    feats = torch.randn(4, 48, 80)
    small_model(feats, torch.tensor([48, 40, 20, 9])).pow(2).mean().backward()
    for name, parameter in small_model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name


def test_full_lengths_match_no_lengths(small_model: ECAPATDNN) -> None:
    small_model.eval()
    feats = torch.randn(2, 48, 80)
    torch.testing.assert_close(small_model(feats), small_model(feats, torch.tensor([48, 48])))


def test_attentive_pooling_ignores_padding() -> None:
    torch.manual_seed(0)
    pooling = AttentiveStatisticsPooling(channels=12, attention_channels=4).eval()
    lengths = [30, 17]
    x = torch.randn(2, 12, 30) * 5.0  # garbage beyond each length
    pooled = pooling(x, frame_mask(torch.tensor(lengths), 30, 2, x.device))
    for row, length in enumerate(lengths):
        alone = pooling(x[row : row + 1, :, :length], frame_mask(None, length, 1, x.device))
        torch.testing.assert_close(pooled[row : row + 1], alone)


def test_squeeze_excitation_ignores_padding() -> None:
    torch.manual_seed(0)
    block = SEBlock(channels=12, se_channels=4)
    x = torch.randn(2, 12, 25)
    out = block(x, frame_mask(torch.tensor([25, 11]), 25, 2, x.device))
    alone = block(x[1:, :, :11], frame_mask(None, 11, 1, x.device))
    torch.testing.assert_close(out[1:, :, :11], alone)


def test_state_dict_keys_follow_3d_speaker() -> None:
    keys = set(ECAPATDNN(channels=64, se_channels=8, attention_channels=8).state_dict())
    expected = {
        "blocks.0.conv.conv.weight",
        "blocks.1.res2net_block.blocks.0.norm.norm.running_mean",
        "blocks.3.se_block.conv2.conv.bias",
        "mfa.conv.conv.weight",
        "asp.tdnn.conv.conv.weight",
        "asp.conv.conv.weight",
        "asp_bn.norm.weight",
        "fc.conv.weight",
    }
    assert expected <= keys


# The ops that move whole (B, C, T) activations: a count that differs is work one side does and the other does not.
ACTIVATION_OPS = (
    "aten.convolution",
    "aten.convolution_backward",
    "aten.reflection_pad1d",
    "aten.reflection_pad1d_backward",
    "aten.native_batch_norm",
    "aten.native_batch_norm_backward",
    "aten.cat",
)


def _activation_ops(model: torch.nn.Module, features: torch.Tensor) -> dict[str, int]:
    """How many times one forward and backward dispatches each of ACTIVATION_OPS."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    with Count() as counted:
        model(features).sum().backward()
    return {name: counted.ops[name] for name in ACTIVATION_OPS}


def test_a_step_runs_speechbrains_activation_ops_one_for_one() -> None:
    """SpeechBrain's own ECAPA_TDNN and the built-in, at one small width, dispatch the same convolutions, pads (its
    Conv1d pads before every convolution, kernel 1 included: a copy forward and backward), batch norms and
    concatenations, so that the built-in costs what SpeechBrain's network costs, not only holds its parameters."""
    ecapa = pytest.importorskip("speechbrain.lobes.models.ECAPA_TDNN")
    torch.manual_seed(0)
    features = torch.randn(2, 50, 80)
    reference = ecapa.ECAPA_TDNN(80, channels=[64, 64, 64, 64, 192], attention_channels=16, lin_neurons=32)
    ours = ECAPATDNN(channels=64, embedding_size=32, attention_channels=16, se_channels=16)
    theirs = _activation_ops(reference, features)
    assert theirs["aten.reflection_pad1d"] == theirs["aten.convolution"] == 38
    assert _activation_ops(ours, features) == theirs
