"""GPT-SoVITS s2's discriminator: the multi-period discriminator with its scale discriminator.

Follows RVC-Boss/GPT-SoVITS at commit 48b1a0169a28582a8984402f82cf438d3bfa6aca: ``GPT_SoVITS/module/models.py``.
Attribute names are the reference's so its state dicts load with ``strict=True``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.models.gpt_sovits_s2_modules import LRELU_SLOPE, WNConv1d, WNConv2d, same_padding

__all__ = ["MultiPeriodDiscriminator"]


class _PeriodDiscriminator(nn.Module):
    """DiscriminatorP: the waveform folded into (T / period, period) and 2-D convolutions along time."""

    def __init__(self, period: int, kernel: int = 5, stride: int = 3) -> None:
        super().__init__()
        self.period = period
        channels = [1, 32, 128, 512, 1024, 1024]
        self.convs = nn.ModuleList(
            WNConv2d(c_in, c_out, (kernel, 1), (stride if i < 4 else 1, 1), padding=(same_padding(kernel), 0))
            for i, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:], strict=True))
        )
        self.conv_post = WNConv2d(1024, 1, (3, 1), 1, padding=(1, 0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, channels, length = x.shape
        if length % self.period:
            x = F.pad(x, (0, self.period - length % self.period), "reflect")
        x = x.view(batch, channels, -1, self.period)
        feature_maps = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), LRELU_SLOPE)
            feature_maps.append(x)
        x = self.conv_post(x)
        feature_maps.append(x)
        return torch.flatten(x, 1, -1), feature_maps


class _ScaleDiscriminator(nn.Module):
    """DiscriminatorS: grouped strided 1-D convolutions over the raw waveform."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            [
                WNConv1d(1, 16, 15, 1, padding=7),
                WNConv1d(16, 64, 41, 4, groups=4, padding=20),
                WNConv1d(64, 256, 41, 4, groups=16, padding=20),
                WNConv1d(256, 1024, 41, 4, groups=64, padding=20),
                WNConv1d(1024, 1024, 41, 4, groups=256, padding=20),
                WNConv1d(1024, 1024, 5, 1, padding=2),
            ]
        )
        self.conv_post = WNConv1d(1024, 1, 3, 1, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        feature_maps = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), LRELU_SLOPE)
            feature_maps.append(x)
        x = self.conv_post(x)
        feature_maps.append(x)
        return torch.flatten(x, 1, -1), feature_maps


class MultiPeriodDiscriminator(nn.Module):
    """net_d: the scale discriminator then one period discriminator per period (2, 3, 5, 7, 11 for v2; v2Pro adds
    17 and 23), weight-normed (the recipe's ``use_spectral_norm`` is false)."""

    def __init__(self, periods: tuple[int, ...] = (2, 3, 5, 7, 11)) -> None:
        super().__init__()
        self.discriminators = nn.ModuleList([_ScaleDiscriminator(), *(_PeriodDiscriminator(p) for p in periods)])

    def forward(
        self, real: torch.Tensor, fake: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        """Scores and feature maps of each discriminator for the real and the generated (B, 1, samples) audio."""
        real_scores, fake_scores, real_maps, fake_maps = [], [], [], []
        for discriminator in self.discriminators:
            real_score, real_map = discriminator(real)
            fake_score, fake_map = discriminator(fake)
            real_scores.append(real_score)
            fake_scores.append(fake_score)
            real_maps.append(real_map)
            fake_maps.append(fake_map)
        return real_scores, fake_scores, real_maps, fake_maps
