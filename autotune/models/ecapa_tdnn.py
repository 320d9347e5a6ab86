"""ECAPA-TDNN speaker-embedding network (Desplanques et al., 2020), as in 3D-Speaker and SpeechBrain.

Module and attribute names follow 3D-Speaker's ``speakerlab/models/ecapa_tdnn`` (itself SpeechBrain's layout), so
its published state dicts load without renaming.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# Floor on the pooled variance: the square root's gradient is unbounded at zero.
STD_EPS = 1e-12


def frame_mask(
    feat_lengths: torch.Tensor | None, num_frames: int, batch_size: int, device: torch.device
) -> torch.Tensor:
    """Return a (B, 1, T) float mask, 1 at real frames and 0 at padding (all ones when lengths are unknown)."""
    if feat_lengths is None:
        return torch.ones(batch_size, 1, num_frames, device=device)
    frames = torch.arange(num_frames, device=device)
    return (frames.unsqueeze(0) < feat_lengths.to(device).unsqueeze(1)).unsqueeze(1).float()


def weighted_statistics(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the mean and standard deviation of ``x`` (B, C, T) over time under ``weights`` summing to 1."""
    mean = (weights * x).sum(dim=2)
    variance = (weights * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, variance.clamp(min=STD_EPS).sqrt()


class Conv1d(nn.Module):
    """Stride-1 1-D convolution with "same" output length obtained by reflect padding, as SpeechBrain does.

    Reflection needs the padding (``dilation * (kernel_size - 1) / 2``, at most 4 frames here) to be shorter than
    the input, so inputs must have at least 5 frames. The pad runs before every convolution, kernel size 1 included
    (padding 0), as SpeechBrain's Conv1d(padding="same") runs it: there it copies the input, forward and backward, a
    cost of SpeechBrain's network that the built-in must pay to cost what it costs (benchmarks/README.md, "The
    built-in beside the framework").
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.padding = dilation * (kernel_size - 1) // 2
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve (B, C_in, T) into (B, C_out, T)."""
        return self.conv(F.pad(x, (self.padding, self.padding), mode="reflect"))


class BatchNorm1d(nn.Module):
    """BatchNorm1d under a ``norm`` attribute, the nesting 3D-Speaker's checkpoints use."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise (B, C) or (B, C, T)."""
        return self.norm(x)


class TDNNBlock(nn.Module):
    """Dilated 1-D convolution, then ReLU, then BatchNorm (ECAPA's order: the norm comes after the activation)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = Conv1d(in_channels, out_channels, kernel_size, dilation)
        self.activation = nn.ReLU()
        self.norm = BatchNorm1d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C_in, T) to (B, C_out, T)."""
        return self.norm(self.activation(self.conv(x)))


class Res2NetBlock(nn.Module):
    """Res2Net hierarchy: channel groups 2..scale each see the previous group's output, widening the context."""

    def __init__(self, channels: int, scale: int = 8, kernel_size: int = 3, dilation: int = 1) -> None:
        super().__init__()
        if channels % scale:
            raise ValueError(f"channels ({channels}) must be divisible by the Res2Net scale ({scale})")
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNNBlock(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, C, T) to (B, C, T); the first group passes through untouched."""
        chunks = torch.chunk(x, self.scale, dim=1)
        outputs = [chunks[0]]
        previous: torch.Tensor | None = None
        for block, chunk in zip(self.blocks, chunks[1:], strict=True):
            previous = block(chunk if previous is None else chunk + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SEBlock(nn.Module):
    """Squeeze-and-excitation over channels, squeezing with the mean over real frames only."""

    def __init__(self, channels: int, se_channels: int = 128) -> None:
        super().__init__()
        self.conv1 = Conv1d(channels, se_channels, kernel_size=1)
        self.relu = nn.ReLU()
        self.conv2 = Conv1d(se_channels, channels, kernel_size=1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Rescale the channels of ``x`` (B, C, T); ``mask`` (B, 1, T) marks real frames."""
        squeezed = (x * mask).sum(dim=2, keepdim=True) / mask.sum(dim=2, keepdim=True)
        gate = self.sigmoid(self.conv2(self.relu(self.conv1(squeezed))))
        return x * gate


class SERes2NetBlock(nn.Module):
    """ECAPA's frame-level block: 1x1 TDNN, Res2Net, 1x1 TDNN, SE, with a residual connection."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        dilation: int,
        res2net_scale: int = 8,
        se_channels: int = 128,
    ) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(in_channels, out_channels, kernel_size=1)
        self.res2net_block = Res2NetBlock(out_channels, res2net_scale, kernel_size, dilation)
        self.tdnn2 = TDNNBlock(out_channels, out_channels, kernel_size=1)
        self.se_block = SEBlock(out_channels, se_channels)
        self.shortcut = Conv1d(in_channels, out_channels, kernel_size=1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Map (B, C_in, T) to (B, C_out, T); ``mask`` (B, 1, T) marks real frames."""
        residual = x if self.shortcut is None else self.shortcut(x)
        out = self.tdnn2(self.res2net_block(self.tdnn1(x)))
        return self.se_block(out, mask) + residual


class AttentiveStatisticsPooling(nn.Module):
    """Channel-wise attentive mean and standard deviation over time.

    With global context the attention also sees the utterance-level mean and std, so each frame is weighted
    relative to the whole utterance rather than in isolation.
    """

    def __init__(self, channels: int, attention_channels: int = 128, global_context: bool = True) -> None:
        super().__init__()
        self.global_context = global_context
        self.tdnn = TDNNBlock(channels * 3 if global_context else channels, attention_channels, kernel_size=1)
        self.tanh = nn.Tanh()
        self.conv = Conv1d(attention_channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pool (B, C, T) into (B, 2C): attentive mean then std; ``mask`` (B, 1, T) marks real frames."""
        num_frames = x.shape[-1]
        attention_input = x
        if self.global_context:
            mean, std = weighted_statistics(x, mask / mask.sum(dim=2, keepdim=True))
            context = [stat.unsqueeze(2).expand(-1, -1, num_frames) for stat in (mean, std)]
            attention_input = torch.cat([x, *context], dim=1)
        scores = self.conv(self.tanh(self.tdnn(attention_input)))
        scores = scores.masked_fill(mask == 0, float("-inf"))
        mean, std = weighted_statistics(x, F.softmax(scores, dim=2))
        return torch.cat([mean, std], dim=1)


class ECAPATDNN(nn.Module):
    """ECAPA-TDNN: SE-Res2Net TDNN blocks, multi-layer feature aggregation and attentive statistics pooling.

    20,767,552 parameters with ``channels=1024`` (the 3D-Speaker / SpeechBrain VoxCeleb model) and 6,194,048 with
    ``channels=512`` (the paper's small variant).

    Args:
        feat_dim: Input feature size (80-dimensional fbank).
        channels: Width C of the frame-level blocks; the aggregation layer is 3C wide.
        embedding_size: Size of the output speaker embedding.
        kernel_sizes: Kernel sizes of the first TDNN, the three SE-Res2Net blocks and the aggregation layer.
        dilations: Dilations of the same five layers.
        res2net_scale: Number of Res2Net channel groups.
        se_channels: Bottleneck width of the squeeze-and-excitation blocks.
        attention_channels: Bottleneck width of the attentive pooling.
        global_context: Whether the pooling attention sees utterance-level statistics.
    """

    def __init__(
        self,
        feat_dim: int = 80,
        channels: int = 1024,
        embedding_size: int = 192,
        kernel_sizes: Sequence[int] = (5, 3, 3, 3, 1),
        dilations: Sequence[int] = (1, 2, 3, 4, 1),
        res2net_scale: int = 8,
        se_channels: int = 128,
        attention_channels: int = 128,
        global_context: bool = True,
    ) -> None:
        super().__init__()
        if len(kernel_sizes) != 5 or len(dilations) != 5:
            raise ValueError("kernel_sizes and dilations need 5 entries: first TDNN, 3 SE-Res2Net blocks, MFA")
        self.blocks = nn.ModuleList([TDNNBlock(feat_dim, channels, kernel_sizes[0], dilations[0])])
        for kernel_size, dilation in zip(kernel_sizes[1:4], dilations[1:4], strict=True):
            self.blocks.append(SERes2NetBlock(channels, channels, kernel_size, dilation, res2net_scale, se_channels))
        aggregated = 3 * channels
        self.mfa = TDNNBlock(aggregated, aggregated, kernel_sizes[4], dilations[4])
        self.asp = AttentiveStatisticsPooling(aggregated, attention_channels, global_context)
        self.asp_bn = BatchNorm1d(aggregated * 2)
        self.fc = Conv1d(aggregated * 2, embedding_size, kernel_size=1)

    def forward(self, feats: torch.Tensor, feat_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Embed a batch of utterances.

        Args:
            feats: Fbank features shaped (B, T, feat_dim), T >= 5.
            feat_lengths: Real frame counts (B,) when the batch is padded; None means every frame is real.
                Padding is excluded from the squeeze-excitation means and the pooling, although the
                convolutions near an utterance's end still see it (as in SpeechBrain).

        Returns:
            Speaker embeddings shaped (B, embedding_size).
        """
        x = feats.transpose(1, 2)
        mask = frame_mask(feat_lengths, x.shape[-1], x.shape[0], x.device).to(x.dtype)
        x = self.blocks[0](x)
        block_outputs = []
        for block in self.blocks[1:]:
            x = block(x, mask)
            block_outputs.append(x)
        x = self.mfa(torch.cat(block_outputs, dim=1))
        pooled = self.asp_bn(self.asp(x, mask).unsqueeze(2))
        return self.fc(pooled).squeeze(2)
