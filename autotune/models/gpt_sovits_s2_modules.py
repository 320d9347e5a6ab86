"""GPT-SoVITS s2's generator building blocks: weight-normed convolutions, the relative-position transformer encoder,
MRTE, the mel style encoder, the WaveNet stack, the coupling flow and the HiFi-GAN generator (the frozen k-means
codebook: gpt_sovits_s2_quantizer; the multi-period/scale discriminator: gpt_sovits_s2_discriminator).

Follows RVC-Boss/GPT-SoVITS at commit 48b1a0169a28582a8984402f82cf438d3bfa6aca: ``GPT_SoVITS/module/models.py``,
``modules.py``, ``attentions.py``, ``mrte_model.py``, ``quantize.py`` and ``core_vq.py``. Attribute names are the
reference's so its state dicts load with ``strict=True``; the weight norm keeps the reference's ``weight_g`` and
``weight_v`` parameters (``torch.nn.utils.weight_norm``, dim 0). Masks are float (B, 1, T) tensors, 1 on real frames.
The model assembled from these is in `autotune.models.gpt_sovits_s2`.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LRELU_SLOPE",
    "AttentionEncoder",
    "HifiGanGenerator",
    "MRTE",
    "MelStyleEncoder",
    "PosteriorEncoder",
    "ResidualCouplingBlock",
    "WNConv1d",
    "WNConv2d",
    "WaveNet",
    "same_padding",
]

LRELU_SLOPE = 0.1


def _weight_from(weight_g: torch.Tensor, weight_v: torch.Tensor) -> torch.Tensor:
    """g * v / ||v||, the norm taken over every dimension but the first (weight_norm with dim=0)."""
    norm = torch.linalg.vector_norm(weight_v, dim=tuple(range(1, weight_v.dim())), keepdim=True)
    return weight_v * (weight_g / norm)


class _WeightNormed(nn.Module):
    """A convolution whose ``weight`` is replaced by ``weight_g`` (its norm over every dimension but the first) and
    ``weight_v`` (its direction), registered after ``bias`` as the reference's weight_norm(dim=0) does."""

    weight_g: nn.Parameter
    weight_v: nn.Parameter

    def _normalise_weight(self) -> None:
        weight = cast(torch.Tensor, self.weight).detach()
        norm = torch.linalg.vector_norm(weight, dim=tuple(range(1, weight.dim())), keepdim=True)
        del self.weight
        self.weight_g, self.weight_v = nn.Parameter(norm), nn.Parameter(weight)

    def normed_weight(self) -> torch.Tensor:
        return _weight_from(self.weight_g, self.weight_v)


class WNConv1d(_WeightNormed, nn.Conv1d):
    """A weight-normed Conv1d."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._normalise_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.normed_weight(), self.bias)


class WNConv2d(_WeightNormed, nn.Conv2d):
    """A weight-normed Conv2d."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._normalise_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.normed_weight(), self.bias)


class WNConvTranspose1d(_WeightNormed, nn.ConvTranspose1d):
    """A weight-normed ConvTranspose1d (the norm over each input channel's filters, as dim=0 gives)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._normalise_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        padding = cast(tuple[int, ...], self.padding)
        return F.conv_transpose1d(
            x, self.normed_weight(), self.bias, self.stride, padding, 0, self.groups, self.dilation
        )


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channels of (B, C, T), with the reference's ``gamma`` and ``beta``."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x.transpose(1, -1), (x.shape[1],), self.gamma, self.beta, self.eps)
        return normed.transpose(1, -1)


class RelativeAttention(nn.Module):
    """VITS multi-head attention over (B, C, T) with 1x1 convolutions, and relative positions when ``window`` is set
    (one table of 2 * window + 1 keys and values shared by the heads). Masked scores are -1e4, as the reference's."""

    def __init__(self, channels: int, out_channels: int, heads: int, dropout: float = 0.0, window: int | None = None):
        super().__init__()
        self.heads, self.window = heads, window
        self.head_channels = channels // heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        self.drop = nn.Dropout(dropout)
        if window is not None:
            scale = self.head_channels**-0.5
            self.emb_rel_k = nn.Parameter(torch.randn(1, 2 * window + 1, self.head_channels) * scale)
            self.emb_rel_v = nn.Parameter(torch.randn(1, 2 * window + 1, self.head_channels) * scale)
        for conv in (self.conv_q, self.conv_k, self.conv_v):
            nn.init.xavier_uniform_(conv.weight)

    def _relative_table(self, table: torch.Tensor, length: int) -> torch.Tensor:
        """The (1, 2 * length - 1, C) rows of offsets -(length - 1) .. length - 1, zero beyond the window."""
        assert self.window is not None
        pad = max(length - (self.window + 1), 0)
        start = max(self.window + 1 - length, 0)
        return F.pad(table, (0, 0, pad, pad))[:, start : start + 2 * length - 1]

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attend from x (B, C, Tq) to context (B, C, Tk); ``mask`` (B, 1, Tq, Tk) is 0 where a key is hidden."""
        batch, channels, query_length = x.shape
        key_length = context.shape[2]

        def heads(t: torch.Tensor, length: int) -> torch.Tensor:
            return t.view(batch, self.heads, self.head_channels, length).transpose(2, 3)

        query = heads(self.conv_q(x), query_length) / math.sqrt(self.head_channels)
        key, value = heads(self.conv_k(context), key_length), heads(self.conv_v(context), key_length)
        scores = query @ key.transpose(-2, -1)
        if self.window is not None:
            relative = query @ self._relative_table(self.emb_rel_k, key_length).unsqueeze(0).transpose(-2, -1)
            scores = scores + _relative_to_absolute(relative)
        weights = self.drop(F.softmax(scores.masked_fill(mask == 0, -1e4), dim=-1))
        output = weights @ value
        if self.window is not None:
            table = self._relative_table(self.emb_rel_v, key_length).unsqueeze(0)
            output = output + _absolute_to_relative(weights) @ table
        return self.conv_o(output.transpose(2, 3).reshape(batch, channels, query_length))


def _relative_to_absolute(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, 2L - 1) scores by relative offset -> (B, H, L, L) by key position."""
    batch, heads, length, _ = x.shape
    flat = F.pad(F.pad(x, (0, 1)).view(batch, heads, 2 * length * length), (0, length - 1))
    return flat.view(batch, heads, length + 1, 2 * length - 1)[:, :, :length, length - 1 :]


def _absolute_to_relative(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, L) weights by key position -> (B, H, L, 2L - 1) by relative offset."""
    batch, heads, length, _ = x.shape
    flat = F.pad(F.pad(x, (0, length - 1)).view(batch, heads, length * (2 * length - 1)), (length, 0))
    return flat.view(batch, heads, length, 2 * length)[:, :, :, 1:]


class FFN(nn.Module):
    """Two same-padded convolutions with a ReLU, masked before each."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.padding = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.drop(torch.relu(self.conv_1(F.pad(x * mask, self.padding))))
        return self.conv_2(F.pad(x * mask, self.padding)) * mask


class AttentionEncoder(nn.Module):
    """VITS's post-norm transformer encoder (``attentions.Encoder``) with relative attention of window 4."""

    def __init__(
        self, channels: int, filter_channels: int, heads: int, layers: int, kernel_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.attn_layers = nn.ModuleList(
            RelativeAttention(channels, channels, heads, dropout, window=4) for _ in range(layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(layers))
        self.ffn_layers = nn.ModuleList(FFN(channels, filter_channels, kernel_size, dropout) for _ in range(layers))
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attention_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)
        x = x * mask
        for attention, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2, strict=True
        ):
            x = norm_1(x + self.drop(attention(x, x, attention_mask)))
            x = norm_2(x + self.drop(ffn(x, mask)))
        return x * mask


class MRTE(nn.Module):
    """The multi-reference timbre encoder: SSL frames attend to the phones, plus the speaker embedding."""

    def __init__(self, content_channels: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.cross_attention = RelativeAttention(hidden, hidden, heads)
        self.c_pre = nn.Conv1d(content_channels, hidden, 1)
        self.text_pre = nn.Conv1d(content_channels, hidden, 1)
        self.c_post = nn.Conv1d(hidden, content_channels, 1)

    def forward(
        self, ssl: torch.Tensor, ssl_mask: torch.Tensor, text: torch.Tensor, text_mask: torch.Tensor, ge: torch.Tensor
    ) -> torch.Tensor:
        attention_mask = text_mask.unsqueeze(2) * ssl_mask.unsqueeze(-1)
        ssl = self.c_pre(ssl * ssl_mask)
        text = self.text_pre(text * text_mask)
        x = self.cross_attention(ssl * ssl_mask, text * text_mask, attention_mask) + ssl + ge
        return self.c_post(x * ssl_mask)


class _Linear(nn.Module):
    """``LinearNorm``/``ConvNorm`` of the reference: a plain layer nested under ``fc`` or ``conv``."""

    def __init__(self, layer: nn.Module, name: str) -> None:
        super().__init__()
        self.add_module(name, layer)
        self.layer = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.layer)(x)


class _Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(F.softplus(x))


class _Conv1dGLU(nn.Module):
    """A gated convolution with a residual connection."""

    def __init__(self, channels: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = _Linear(nn.Conv1d(channels, 2 * channels, kernel_size, padding=(kernel_size - 1) // 2), "conv")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.conv1(x).chunk(2, dim=1)
        return x + self.dropout(value * torch.sigmoid(gate))


class _StyleAttention(nn.Module):
    """The style encoder's self-attention: linear q/k/v, scores over sqrt(model width), -inf at padded keys, and a
    residual connection inside."""

    def __init__(self, heads: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.w_qs = nn.Linear(dim, dim)
        self.w_ks = nn.Linear(dim, dim)
        self.w_vs = nn.Linear(dim, dim)
        self.attention_dropout = nn.Dropout(dropout)  # the reference's parameterless ``attention`` submodule
        self.fc = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.temperature = dim**0.5

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)

        scores = heads(self.w_qs(x)) @ heads(self.w_ks(x)).transpose(-2, -1) / self.temperature
        weights = F.softmax(scores.masked_fill(padding[:, None, None, :], -math.inf), dim=-1)
        output = (self.attention_dropout(weights) @ heads(self.w_vs(x))).transpose(1, 2).reshape(batch, length, dim)
        return self.dropout(self.fc(output)) + x


class MelStyleEncoder(nn.Module):
    """The reference encoder: per-frame MLP, two gated convolutions, self-attention, projection, masked mean."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 128, kernel: int = 5, heads: int = 2) -> None:
        super().__init__()
        dropout = 0.1
        self.spectral = nn.Sequential(
            _Linear(nn.Linear(in_dim, hidden), "fc"),
            _Mish(),
            nn.Dropout(dropout),
            _Linear(nn.Linear(hidden, hidden), "fc"),
            _Mish(),
            nn.Dropout(dropout),
        )
        self.temporal = nn.Sequential(_Conv1dGLU(hidden, kernel, dropout), _Conv1dGLU(hidden, kernel, dropout))
        self.slf_attn = _StyleAttention(heads, hidden, dropout)
        self.fc = _Linear(nn.Linear(hidden, out_dim), "fc")

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, in_dim, T) features and their (B, 1, T) mask -> (B, out_dim, 1)."""
        padding = (mask.int() == 0).squeeze(1)
        x = self.spectral(x.transpose(1, 2))
        x = self.temporal(x.transpose(1, 2)).transpose(1, 2)
        x = self.fc(self.slf_attn(x.masked_fill(padding.unsqueeze(-1), 0), padding))
        frames = (~padding).sum(dim=1)[:, None, None]
        pooled = (x.masked_fill(padding.unsqueeze(-1), 0).float() / frames).sum(dim=1).to(x.dtype)
        return pooled.unsqueeze(-1)


class WaveNet(nn.Module):
    """VITS's WN: gated dilated convolutions with a global condition, residual and skip outputs (``modules.WN``)."""

    def __init__(self, channels: int, kernel_size: int, dilation_rate: int, layers: int, gin_channels: int) -> None:
        super().__init__()
        self.channels = channels
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        self.drop = nn.Dropout(0.0)
        self.cond_layer = WNConv1d(gin_channels, 2 * channels * layers, 1)
        for i in range(layers):
            dilation = dilation_rate**i
            padding = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(WNConv1d(channels, 2 * channels, kernel_size, dilation=dilation, padding=padding))
            self.res_skip_layers.append(WNConv1d(channels, 2 * channels if i < layers - 1 else channels, 1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(x)
        condition = self.cond_layer(g)
        last = len(self.in_layers) - 1
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers, strict=True)):
            gated = in_layer(x) + condition[:, 2 * i * self.channels : 2 * (i + 1) * self.channels]
            acts = self.drop(torch.tanh(gated[:, : self.channels]) * torch.sigmoid(gated[:, self.channels :]))
            res_skip_acts = res_skip(acts)
            if i < last:
                x = (x + res_skip_acts[:, : self.channels]) * mask
                output = output + res_skip_acts[:, self.channels :]
            else:
                output = output + res_skip_acts
        return output * mask


class PosteriorEncoder(nn.Module):
    """enc_q: the linear spectrogram to the posterior's mean and log-scale, and a sample z (torch's RNG)."""

    def __init__(self, in_channels: int, out_channels: int, hidden: int, kernel: int, layers: int, gin: int) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.pre = nn.Conv1d(in_channels, hidden, 1)
        self.enc = WaveNet(hidden, kernel, 1, layers, gin)
        self.proj = nn.Conv1d(hidden, out_channels * 2, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Returns z, m, logs; the condition is detached, as in the reference."""
        x = self.enc(self.pre(x) * mask, mask, g.detach())
        m, logs = (self.proj(x) * mask).split(self.out_channels, dim=1)
        z = (m + torch.randn_like(m) * torch.exp(logs)) * mask
        return z, m, logs


class _CouplingLayer(nn.Module):
    """A mean-only residual coupling layer; ``post`` starts at zero so that each starts as the identity."""

    def __init__(self, channels: int, hidden: int, kernel: int, layers: int, gin: int) -> None:
        super().__init__()
        self.half_channels = channels // 2
        self.pre = nn.Conv1d(self.half_channels, hidden, 1)
        self.enc = WaveNet(hidden, kernel, 1, layers, gin)
        self.post = nn.Conv1d(hidden, self.half_channels, 1)
        with torch.no_grad():  # each coupling layer starts as the identity
            self.post.weight.zero_()
            self.post.bias.zero_()  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x0, x1 = x.split(self.half_channels, dim=1)
        m = self.post(self.enc(self.pre(x0) * mask, mask, g)) * mask
        return torch.cat([x0, m + x1 * mask], dim=1)


class _Flip(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, [1])


class ResidualCouplingBlock(nn.Module):
    """The flow: coupling layers each followed by a channel flip (``flows.0``, ``flows.2``, ... hold weights)."""

    def __init__(self, channels: int, hidden: int, kernel: int, layers: int, flows: int, gin: int) -> None:
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(flows):
            self.flows.append(_CouplingLayer(channels, hidden, kernel, layers, gin))
            self.flows.append(_Flip())

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The forward direction (posterior z to z_p), as training runs it."""
        for flow in self.flows:
            x = flow(x, mask, g)
        return x


def same_padding(kernel: int, dilation: int = 1) -> int:
    return (kernel * dilation - dilation) // 2


class _ResBlock1(nn.Module):
    """HiFi-GAN's ResBlock1: three dilated/undilated convolution pairs with leaky ReLUs and residuals."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            WNConv1d(channels, channels, kernel, dilation=d, padding=same_padding(kernel, d)) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            WNConv1d(channels, channels, kernel, padding=same_padding(kernel)) for _ in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2 in zip(self.convs1, self.convs2, strict=True):
            x = x + conv2(F.leaky_relu(conv1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class HifiGanGenerator(nn.Module):
    """dec: the HiFi-GAN generator with a global condition added after ``conv_pre``; tanh output (B, 1, samples)."""

    def __init__(
        self,
        in_channels: int,
        kernel_sizes: tuple[int, ...],
        dilation_sizes: tuple[tuple[int, ...], ...],
        upsample_rates: tuple[int, ...],
        initial_channel: int,
        upsample_kernel_sizes: tuple[int, ...],
        gin_channels: int,
    ) -> None:
        super().__init__()
        self.kernels = len(kernel_sizes)
        self.conv_pre = nn.Conv1d(in_channels, initial_channel, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            WNConvTranspose1d(initial_channel // 2**i, initial_channel // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes, strict=True))
        )
        self.resblocks = nn.ModuleList(
            _ResBlock1(initial_channel // 2 ** (i + 1), k, d)
            for i in range(len(upsample_rates))
            for k, d in zip(kernel_sizes, dilation_sizes, strict=True)
        )
        self.conv_post = nn.Conv1d(initial_channel // 2 ** len(upsample_rates), 1, 7, 1, padding=3, bias=False)
        self.cond = nn.Conv1d(gin_channels, initial_channel, 1)
        # The reference's init_weights runs after weight_norm, on the computed weight the next forward replaces:
        # it changes nothing, so the default initialisation stands here too.

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(x) + self.cond(g)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.kernels : (i + 1) * self.kernels]
            x = sum((block(x) for block in blocks[1:]), blocks[0](x)) / self.kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))
