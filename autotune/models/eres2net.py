"""ERes2Net speaker-embedding network (3D-Speaker): Res2Net blocks with local and global attentional fusion.

Module and attribute names follow 3D-Speaker's ``speakerlab/models/eres2net`` so that its published state dicts
load without renaming.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# Res2Net block geometry of the published model: two splits, each half the block's planes wide.
EXPANSION = 2
BASE_WIDTH = 32
SCALE = 2


class BoundedReLU(nn.Hardtanh):
    """ReLU clipped at 20, the block activation of the reference (which names it ``ReLU``)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(min_val=0.0, max_val=20.0, inplace=inplace)


class AFF(nn.Module):
    """Attentional feature fusion: a learned per-element blend of two same-shaped feature maps.

    Args:
        channels: Channels of each input.
        reduction: Bottleneck ratio of the attention branch.
    """

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        inter_channels = channels // reduction
        self.local_att = nn.Sequential(
            nn.Conv2d(channels * 2, inter_channels, kernel_size=1),
            nn.BatchNorm2d(inter_channels),
            nn.SiLU(inplace=True),
            nn.Conv2d(inter_channels, channels, kernel_size=1),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return ``x * w + y * (2 - w)`` with ``w = 1 + tanh(attention(x, y))`` in (0, 2)."""
        weight = 1.0 + torch.tanh(self.local_att(torch.cat((x, y), dim=1)))
        return x * weight + y * (2.0 - weight)


class BasicBlockERes2Net(nn.Module):
    """Res2Net basic block whose splits are fused by addition (or by AFF when ``fuse_with_aff``).

    Args:
        in_planes: Input channels.
        planes: Block planes; the output has ``EXPANSION * planes`` channels.
        stride: Stride of the entry 1x1 conv and the shortcut (time and frequency alike).
        fuse_with_aff: Fuse each split with the previous split's output by AFF instead of by addition.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1, fuse_with_aff: bool = False) -> None:
        super().__init__()
        width = planes * BASE_WIDTH // 64
        self.width = width
        self.conv1 = nn.Conv2d(in_planes, width * SCALE, kernel_size=1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width * SCALE)
        self.convs = nn.ModuleList(nn.Conv2d(width, width, kernel_size=3, padding=1, bias=False) for _ in range(SCALE))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(SCALE))
        if fuse_with_aff:
            self.fuse_models = nn.ModuleList(AFF(width) for _ in range(SCALE - 1))
        self.fuse_with_aff = fuse_with_aff
        self.relu = BoundedReLU(inplace=True)
        self.conv3 = nn.Conv2d(width * SCALE, planes * EXPANSION, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * EXPANSION)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes * EXPANSION:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes * EXPANSION, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * EXPANSION),
            )

    def _fuse(self, index: int, previous: torch.Tensor, split: torch.Tensor) -> torch.Tensor:
        if self.fuse_with_aff:
            return self.fuse_models[index - 1](previous, split)
        return previous + split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the hierarchical split convolutions and add the shortcut."""
        splits = torch.split(self.relu(self.bn1(self.conv1(x))), self.width, dim=1)
        outputs: list[torch.Tensor] = []
        for index, (conv, bn) in enumerate(zip(self.convs, self.bns, strict=True)):
            # Each split also sees the previous split's output: the receptive field grows within the block.
            split = splits[index] if index == 0 else self._fuse(index, outputs[-1], splits[index])
            outputs.append(self.relu(bn(conv(split))))
        out = self.bn3(self.conv3(torch.cat(outputs, dim=1)))
        return self.relu(out + self.shortcut(x))


def temporal_statistics(x: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool (B, C, F, T) over time into (B, C*F) means, stds (sqrt(unbiased var + 1e-8)) or both concatenated."""
    statistics = []
    if pooling in ("TSTP", "TAP"):
        statistics.append(x.mean(dim=-1).flatten(start_dim=1))
    if pooling in ("TSTP", "TSDP"):
        statistics.append(torch.sqrt(torch.var(x, dim=-1) + 1e-8).flatten(start_dim=1))
    return torch.cat(statistics, dim=1)


POOLING_STATISTICS = {"TAP": 1, "TSDP": 1, "TSTP": 2}


class ERes2Net(nn.Module):
    """ERes2Net speaker-embedding model (Chen et al., 2023) with a single embedding layer.

    Args:
        feat_dim: Number of fbank bins per frame.
        m_channels: Stem width; stages use m, 2m, 4m and 8m planes (32 for base, 64 for large).
        num_blocks: Blocks in each of the four stages.
        embedding_size: Size of the output embedding.
        pooling: Temporal pooling, one of ``POOLING_STATISTICS`` (mean, std, or both).
    """

    def __init__(
        self,
        feat_dim: int = 80,
        m_channels: int = 32,
        num_blocks: Sequence[int] = (3, 4, 6, 3),
        embedding_size: int = 192,
        pooling: str = "TSTP",
    ) -> None:
        super().__init__()
        if pooling not in POOLING_STATISTICS:
            raise ValueError(f"unknown pooling {pooling!r}; expected one of {sorted(POOLING_STATISTICS)}")
        self.pooling = pooling
        self.in_planes = m_channels
        self.conv1 = nn.Conv2d(1, m_channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = self._make_stage(m_channels, num_blocks[0], stride=1, fuse_with_aff=False)
        self.layer2 = self._make_stage(m_channels * 2, num_blocks[1], stride=2, fuse_with_aff=False)
        self.layer3 = self._make_stage(m_channels * 4, num_blocks[2], stride=2, fuse_with_aff=True)
        self.layer4 = self._make_stage(m_channels * 8, num_blocks[3], stride=2, fuse_with_aff=True)
        # Global fusion: each stage's (fused) output is downsampled to the next stage's shape and blended in.
        self.layer1_downsample = self._downsample(m_channels * 2)
        self.layer2_downsample = self._downsample(m_channels * 4)
        self.layer3_downsample = self._downsample(m_channels * 8)
        self.fuse_mode12 = AFF(m_channels * 4)
        self.fuse_mode123 = AFF(m_channels * 8)
        self.fuse_mode1234 = AFF(m_channels * 16)
        # Three stride-2, padding-1 stages each give ceil(F / 2); the reference writes feat_dim // 8 (same for 80).
        reduced_frequency = feat_dim
        for _ in range(3):
            reduced_frequency = (reduced_frequency + 1) // 2
        stats_dim = reduced_frequency * m_channels * 8 * EXPANSION
        self.seg_1 = nn.Linear(stats_dim * POOLING_STATISTICS[pooling], embedding_size)

    def _make_stage(self, planes: int, num_blocks: int, stride: int, fuse_with_aff: bool) -> nn.Sequential:
        blocks = []
        for block_stride in [stride] + [1] * (num_blocks - 1):
            blocks.append(BasicBlockERes2Net(self.in_planes, planes, block_stride, fuse_with_aff))
            self.in_planes = planes * EXPANSION
        return nn.Sequential(*blocks)

    @staticmethod
    def _downsample(channels: int) -> nn.Conv2d:
        return nn.Conv2d(channels, channels * 2, kernel_size=3, stride=2, padding=1, bias=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Embed a batch of utterances.

        Args:
            features: Fbank features shaped (B, T, feat_dim); T >= 9 so the 8x-downsampled time axis has a std.

        Returns:
            Embeddings shaped (B, embedding_size).
        """
        x = features.transpose(1, 2).unsqueeze(1)  # (B, 1, F, T): frequency and time are the image axes
        out1 = self.layer1(F.relu(self.bn1(self.conv1(x))))
        out2 = self.layer2(out1)
        fused12 = self.fuse_mode12(out2, self.layer1_downsample(out1))
        out3 = self.layer3(out2)
        fused123 = self.fuse_mode123(out3, self.layer2_downsample(fused12))
        out4 = self.layer4(out3)
        fused1234 = self.fuse_mode1234(out4, self.layer3_downsample(fused123))
        return self.seg_1(temporal_statistics(fused1234, self.pooling))
