"""CAM++ speaker-embedding network (3D-Speaker's DTDNN with context-aware masking).

Module and attribute names follow 3D-Speaker's ``speakerlab/models/campplus`` so that its published state dicts
load without renaming.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as activation_checkpoint
from torch import nn

# Width of the segment average that feeds the CAM mask; fixed in the published model.
SEGMENT_FRAMES = 100


def batchnorm_relu(channels: int) -> nn.Sequential:
    """Return the BN-ReLU pre-activation used throughout the x-vector trunk."""
    # In-place ReLU is safe after BN (BN's backward does not need its output) and saves one activation per layer.
    return nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels), relu=nn.ReLU(inplace=True)))


def segment_average(x: torch.Tensor, segment_frames: int = SEGMENT_FRAMES) -> torch.Tensor:
    """Average ``x`` over consecutive time segments and broadcast each mean back over its frames.

    Args:
        x: Features shaped (B, C, T); any T >= 1.
        segment_frames: Segment length in frames; the last segment may be shorter.

    Returns:
        Tensor shaped like ``x`` where every frame holds the mean of its segment.
    """
    num_frames = x.shape[-1]
    # ceil_mode keeps the trailing partial segment and averages it over its real frames only (also when T < segment).
    segment_means = F.avg_pool1d(x, kernel_size=segment_frames, stride=segment_frames, ceil_mode=True)
    expanded = segment_means.unsqueeze(-1).expand(*segment_means.shape, segment_frames)
    return expanded.reshape(*segment_means.shape[:-1], -1)[..., :num_frames]


class BasicResBlock(nn.Module):
    """2-D residual block of the FCM head; strides only along frequency so time resolution is kept."""

    def __init__(self, in_planes: int, planes: int, frequency_stride: int = 1) -> None:
        super().__init__()
        stride = (frequency_stride, 1)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if frequency_stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply conv-BN-ReLU-conv-BN, add the shortcut, then ReLU."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class FCM(nn.Module):
    """Front-end convolution module: a small 2-D ResNet that shrinks frequency 8x and flattens it into channels."""

    def __init__(self, feat_dim: int = 80, m_channels: int = 32, blocks_per_stage: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, m_channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = self._make_stage(m_channels, blocks_per_stage)
        self.layer2 = self._make_stage(m_channels, blocks_per_stage)
        self.conv2 = nn.Conv2d(m_channels, m_channels, kernel_size=3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(m_channels)
        # Three stride-2, padding-1 convolutions along frequency each give ceil(F / 2).
        reduced_frequency = feat_dim
        for _ in range(3):
            reduced_frequency = (reduced_frequency + 1) // 2
        self.out_channels = m_channels * reduced_frequency

    @staticmethod
    def _make_stage(channels: int, num_blocks: int) -> nn.Sequential:
        strides = [2] + [1] * (num_blocks - 1)
        return nn.Sequential(*(BasicResBlock(channels, channels, stride) for stride in strides))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, F, T) features to (B, m_channels * F / 8, T)."""
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))
        batch, channels, frequency, frames = out.shape
        return out.reshape(batch, channels * frequency, frames)


class TDNNLayer(nn.Module):
    """Strided 1-D convolution followed by BN-ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> None:
        super().__init__()
        self.linear = nn.Conv1d(
            in_channels, out_channels, kernel_size, stride=stride, padding=(kernel_size - 1) // 2, bias=False
        )
        self.nonlinear = batchnorm_relu(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve then normalise and rectify."""
        return self.nonlinear(self.linear(x))


class CAMLayer(nn.Module):
    """Context-aware masking: a dilated local conv gated by a mask built from utterance and segment context."""

    def __init__(
        self, bn_channels: int, out_channels: int, kernel_size: int, dilation: int, reduction: int = 2
    ) -> None:
        super().__init__()
        padding = (kernel_size - 1) // 2 * dilation
        self.linear_local = nn.Conv1d(
            bn_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // reduction, 1)
        self.relu = nn.ReLU(inplace=True)
        self.linear2 = nn.Conv1d(bn_channels // reduction, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the local features scaled by a sigmoid mask of the same shape."""
        local = self.linear_local(x)
        context = x.mean(-1, keepdim=True) + segment_average(x)
        mask = torch.sigmoid(self.linear2(self.relu(self.linear1(context))))
        return local * mask


class CAMDenseTDNNLayer(nn.Module):
    """One dense layer: BN-ReLU-1x1 bottleneck, BN-ReLU, then a CAM layer producing ``growth_rate`` channels."""

    def __init__(
        self,
        in_channels: int,
        growth_rate: int,
        bn_channels: int,
        kernel_size: int,
        dilation: int,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__()
        self.memory_efficient = memory_efficient
        self.nonlinear1 = batchnorm_relu(in_channels)
        self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False)
        self.nonlinear2 = batchnorm_relu(bn_channels)
        self.cam_layer = CAMLayer(bn_channels, growth_rate, kernel_size, dilation)

    def _bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear1(self.nonlinear1(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the ``growth_rate`` new channels computed from all channels so far."""
        if self.training and self.memory_efficient:
            # The bottleneck input grows with every layer (the whole concatenation); recomputing its BN-ReLU in
            # backward instead of storing it is what makes the dense block affordable at large batch sizes.
            # As in the reference, the recomputation updates this BN's running statistics a second time per step.
            bottleneck = activation_checkpoint.checkpoint(self._bottleneck, x, use_reentrant=False)
        else:
            bottleneck = self._bottleneck(x)
        return self.cam_layer(self.nonlinear2(bottleneck))


class CAMDenseTDNNBlock(nn.ModuleList):
    """DenseNet-style block: each layer's output is concatenated onto its input."""

    def __init__(
        self,
        num_layers: int,
        in_channels: int,
        growth_rate: int,
        bn_channels: int,
        kernel_size: int,
        dilation: int,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__()
        for index in range(num_layers):
            layer = CAMDenseTDNNLayer(
                in_channels + index * growth_rate, growth_rate, bn_channels, kernel_size, dilation, memory_efficient
            )
            self.add_module(f"tdnnd{index + 1}", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Grow ``x`` by ``growth_rate`` channels per layer."""
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class TransitLayer(nn.Module):
    """BN-ReLU then a bias-free 1x1 conv that compresses the channels between dense blocks."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.nonlinear = batchnorm_relu(in_channels)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise, rectify and project."""
        return self.linear(self.nonlinear(x))


class StatsPool(nn.Module):
    """Concatenate the time mean and the unbiased time standard deviation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, T) to (B, 2C)."""
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class DenseLayer(nn.Module):
    """Embedding projection: bias-free 1x1 conv then BatchNorm without affine parameters."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.nonlinear = nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(out_channels, affine=False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map pooled statistics (B, C) to embeddings (B, out_channels)."""
        return self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))


# (layers, kernel size, dilation) of the three dense blocks in the published model.
DENSE_BLOCK_LAYOUT = ((12, 3, 1), (24, 3, 2), (16, 3, 2))


class CAMPPlus(nn.Module):
    """CAM++ speaker-embedding model (Wang et al., 2023), as trained by 3D-Speaker's VoxCeleb recipe.

    Args:
        feat_dim: Number of fbank bins per frame.
        embedding_size: Size of the output embedding (512 in the VoxCeleb recipe, 192 in others).
        growth_rate: Channels each dense layer adds.
        bn_size: Bottleneck width as a multiple of ``growth_rate``.
        init_channels: Channels out of the strided TDNN layer that starts the trunk.
        memory_efficient: Recompute each dense layer's BN-ReLU-1x1 bottleneck in backward (training only),
            trading compute for activation memory. True by default, as 3D-Speaker's CAMPPlus (DTDNN.py:58), which
            its recipes do not override: the recipe trains checkpointed.
    """

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 512,
        growth_rate: int = 32,
        bn_size: int = 4,
        init_channels: int = 128,
        memory_efficient: bool = True,
    ) -> None:
        super().__init__()
        self.head = FCM(feat_dim=feat_dim)
        self.xvector = nn.Sequential()
        self.xvector.add_module("tdnn", TDNNLayer(self.head.out_channels, init_channels, kernel_size=5, stride=2))
        channels = init_channels
        for index, (num_layers, kernel_size, dilation) in enumerate(DENSE_BLOCK_LAYOUT, start=1):
            block = CAMDenseTDNNBlock(
                num_layers, channels, growth_rate, bn_size * growth_rate, kernel_size, dilation, memory_efficient
            )
            self.xvector.add_module(f"block{index}", block)
            channels += num_layers * growth_rate
            self.xvector.add_module(f"transit{index}", TransitLayer(channels, channels // 2))
            channels //= 2
        self.xvector.add_module("out_nonlinear", batchnorm_relu(channels))
        self.xvector.add_module("stats", StatsPool())
        self.xvector.add_module("dense", DenseLayer(channels * 2, embedding_size))
        self._init_weights()

    def _init_weights(self) -> None:
        # Same scheme as the reference: He-normal 1-D convs, zero biases; 2-D convs keep PyTorch's default.
        for module in self.modules():
            if isinstance(module, (nn.Conv1d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Embed a batch of utterances.

        Args:
            features: Fbank features shaped (B, T, feat_dim); T >= 3 so the halved sequence has a defined std.

        Returns:
            Embeddings shaped (B, embedding_size).
        """
        return self.xvector(self.head(features.transpose(1, 2)))
