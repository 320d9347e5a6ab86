"""FLOPs per sample through FlopCounterMode, and the table of known GPU peaks."""

from __future__ import annotations

import pytest
import torch

from autotune.knobs.precision import PrecisionSettings
from autotune.trial.flops import achieved_tflops, count_flops_per_sample, peak_tflops
from tests.trial.tiny_setups import linear_setup


def test_flops_of_forward_and_backward_per_sample():
    setup = linear_setup(features=8)
    model = setup.model
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))
    before = model.weight.detach().clone()
    flops = count_flops_per_sample(
        setup, batch, PrecisionSettings(precision="bf16", device_type="cpu"), torch.device("cpu")
    )
    # forward 2*4*8*2 and the weight gradient as much again (the input needs no gradient), over 4 samples
    assert flops == 64
    assert model.weight.grad is None and torch.equal(model.weight, before)
    assert achieved_tflops(64, 1e12) == 64 and achieved_tflops(None, 10.0) is None


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A10", "tf32", 62.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "fp32", 51.2),
        ("NVIDIA H100 NVL", "bf16", None),
        ("NVIDIA H200", "tf32", 494.7),
        ("NVIDIA L4", "fp16", 121.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("Tesla V100-SXM2-32GB", "fp16", 125.0),
        ("Tesla V100-PCIE-16GB", "fp32", 14.0),
        ("Tesla V100-SXM2-32GB", "bf16", None),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("NVIDIA GeForce RTX 3090 Ti", "bf16", None),
        ("NVIDIA GeForce RTX 3090", "fp32", 35.6),
        ("NVIDIA T4", "fp16", None),
        # torch's default fp32 may run convolutions in TF32: counted against the TF32 peak where the GPU has one
        ("NVIDIA A100-SXM4-80GB", "fp32-default", 156.0),
        ("Tesla V100-SXM2-32GB", "fp32-default", 15.7),
        ("NVIDIA H100 NVL", "fp32-default", None),
    ],
)
def test_known_peaks(name, precision, peak):
    assert peak_tflops(name, precision) == peak
