"""The wav2vec 2.0 encoder as transformers' ``Wav2Vec2Model`` builds it for a "stable layer norm" (large) model.

Module, parameter and buffer names follow ``transformers/models/wav2vec2/modeling_wav2vec2.py`` (transformers 5.24:
``feature_extractor.conv_layers.N.conv``, ``feature_projection.projection``, ``encoder.pos_conv_embed.conv``,
``encoder.layers.N.attention.q_proj``, ``encoder.layers.N.feed_forward.intermediate_dense``...), so a state dict of
``Wav2Vec2Model`` loads here with ``strict=True``. The positional convolution is weight-normalised with torch's
parametrisation, as transformers does when torch has it: its keys are ``parametrizations.weight.original0`` (the
norm g, shape (1, 1, kernel)) and ``original1`` (the direction v). Hub checkpoints saved before that (LeBenchmark's
2021 ``pytorch_model.bin`` among them) name the same tensors ``weight_g`` and ``weight_v``; rename them on loading.

Only the path a large model takes is built: layer-normalised feature convolutions (``feat_extract_norm: layer``),
pre-norm transformer layers (``do_stable_layer_norm: true``), GELU, no adapter. SpecAugment masking is not
implemented (SpeechBrain's wrapper switches it off); ``masked_spec_embed`` exists, as in transformers, whenever
``mask_time_prob`` or ``mask_feature_prob`` is positive, so that checkpoints load, and gets no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from autotune.models.transformer_decoder import checkpointed


@dataclass(frozen=True, kw_only=True, slots=True)
class Wav2Vec2Config:
    """The values of transformers' ``Wav2Vec2Config`` that shape the model or its training forward.

    The defaults are LeBenchmark/wav2vec2-FR-7K-large's ``config.json`` (hub commit 9b2c1bc), the encoder of
    SpeechBrain's CommonVoice French CTC recipe: wav2vec 2.0 large with biased feature convolutions.
    """

    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    conv_dim: tuple[int, ...] = (512,) * 7
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_stride: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    conv_bias: bool = True
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    layer_norm_eps: float = 1e-5
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    activation_dropout: float = 0.0
    feat_proj_dropout: float = 0.1
    layerdrop: float = 0.1
    mask_time_prob: float = 0.075
    mask_feature_prob: float = 0.0


def feature_lengths(config: Wav2Vec2Config, sample_lengths: torch.Tensor) -> torch.Tensor:
    """Frames the feature convolutions make of each waveform's unpadded length (no padding, floor division)."""
    lengths = sample_lengths.long()
    for kernel, stride in zip(config.conv_kernel, config.conv_stride, strict=True):
        lengths = torch.div(lengths - kernel, stride, rounding_mode="floor") + 1
    return lengths


class LayerNormConvLayer(nn.Module):
    """Convolution, layer norm over channels, GELU: one layer of the feature encoder."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size=kernel, stride=stride, bias=bias)
        self.layer_norm = nn.LayerNorm(out_channels)  # transformers leaves this one at the default eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(self.conv(x).transpose(1, 2)).transpose(1, 2)
        return F.gelu(x)


class FeatureEncoder(nn.Module):
    """The convolutional feature encoder: (B, samples) -> (B, conv_dim[-1], frames)."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        channels = (1, *config.conv_dim)
        self.conv_layers = nn.ModuleList(
            LayerNormConvLayer(channels[i], channels[i + 1], kernel, stride, config.conv_bias)
            for i, (kernel, stride) in enumerate(zip(config.conv_kernel, config.conv_stride, strict=True))
        )

    def forward(self, wavs: torch.Tensor) -> torch.Tensor:
        x = wavs.unsqueeze(1)
        for layer in self.conv_layers:
            x = layer(x)
        return x


class FeatureProjection(nn.Module):
    """Layer norm, projection to the model width, dropout."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.conv_dim[-1], eps=config.layer_norm_eps)
        self.projection = nn.Linear(config.conv_dim[-1], config.hidden_size)
        self.dropout = nn.Dropout(config.feat_proj_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.projection(self.layer_norm(x)))


class PositionalConvEmbedding(nn.Module):
    """Grouped, weight-normalised convolution over time, trimmed to the input length, then GELU."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        kernel = config.num_conv_pos_embeddings
        conv = nn.Conv1d(
            config.hidden_size,
            config.hidden_size,
            kernel_size=kernel,
            padding=kernel // 2,
            groups=config.num_conv_pos_embedding_groups,
        )
        self.conv = weight_norm(conv, name="weight", dim=2)
        self.trim = 1 if kernel % 2 == 0 else 0  # an even kernel with padding k/2 gives one frame too many

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.transpose(1, 2))
        if self.trim:
            y = y[:, :, : -self.trim]
        return F.gelu(y).transpose(1, 2)


class SelfAttention(nn.Module):
    """Multi-head self-attention with biased projections; attention dropout in training."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        width = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.dropout = config.attention_dropout
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, attend: torch.Tensor | None) -> torch.Tensor:
        """Attend over (B, T, width); ``attend`` is (B, 1, 1, T), True at keys that may be attended to."""
        batch, length, width = x.shape

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(x).view(batch, length, self.num_heads, -1).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q_proj),
            heads(self.k_proj),
            heads(self.v_proj),
            attn_mask=attend,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out_proj(y.transpose(1, 2).reshape(batch, length, width))


class FeedForward(nn.Module):
    """Dense, GELU, dropout, dense, dropout."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        self.intermediate_dropout = nn.Dropout(config.activation_dropout)
        self.intermediate_dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output_dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.intermediate_dropout(F.gelu(self.intermediate_dense(x)))
        return self.output_dropout(self.output_dense(x))


class EncoderLayer(nn.Module):
    """A pre-norm transformer layer: x + dropout(attention(norm(x))), then + feed_forward(norm(x))."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = FeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, attend: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.layer_norm(x), attend))
        return x + self.feed_forward(self.final_layer_norm(x))


class Encoder(nn.Module):
    """Positional convolution, dropout, the layers (each skipped with probability ``layerdrop`` in training), norm."""

    def __init__(self, config: Wav2Vec2Config) -> None:
        super().__init__()
        self.layerdrop = config.layerdrop
        self.pos_conv_embed = PositionalConvEmbedding(config)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
        """Encode (B, T, width); ``frame_mask`` (B, T) is True at real frames. Padded frames are zeroed first."""
        attend = None
        if frame_mask is not None:
            x = x.masked_fill(~frame_mask.unsqueeze(-1), 0.0)
            attend = frame_mask[:, None, None, :]
        x = self.dropout(x + self.pos_conv_embed(x))
        masks = () if attend is None else (attend,)
        for layer in self.layers:
            # One draw per layer, as transformers does, so a seeded run skips the same layers there and here.
            if self.training and self.layerdrop > 0.0 and bool(torch.rand([]) < self.layerdrop):
                continue
            x = checkpointed(layer, self.gradient_checkpointing and self.training, x, *masks)
        return self.layer_norm(x)


class Wav2Vec2Model(nn.Module):
    """Waveforms to contextual frames, 20 ms apiece at 16 kHz with the default convolutions.

    Args:
        config: The sizes; the default is wav2vec 2.0 large (315,438,720 parameters).
    """

    def __init__(self, config: Wav2Vec2Config | None = None) -> None:
        super().__init__()
        self.config = config = config or Wav2Vec2Config()
        self.feature_extractor = FeatureEncoder(config)
        self.feature_projection = FeatureProjection(config)
        if config.mask_time_prob > 0.0 or config.mask_feature_prob > 0.0:
            self.masked_spec_embed = nn.Parameter(torch.empty(config.hidden_size).uniform_())
        self.encoder = Encoder(config)

    def forward(self, wavs: torch.Tensor, sample_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encode (B, samples) waveforms; ``sample_mask`` (B, samples) is True at real samples.

        Returns:
            (B, frames, hidden_size). Frames past each waveform's length are computed but attend to nothing beyond
            it and are not attended to.
        """
        features = self.feature_extractor(wavs).transpose(1, 2)
        frame_mask = None
        if sample_mask is not None:
            lengths = feature_lengths(self.config, sample_mask.sum(dim=-1))
            frame_mask = torch.arange(features.shape[1], device=features.device) < lengths.unsqueeze(1)
        return self.encoder(self.feature_projection(features), frame_mask)
