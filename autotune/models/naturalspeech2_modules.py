"""NaturalSpeech2's building blocks: the transformer encoders, the duration/pitch predictors, the length regulator,
the diffusion WaveNet and the codec's frozen residual codebook, as Amphion writes them.

Follows open-mmlab/Amphion at commit d3de90f02e7f1c7dbc24b04d52fe1b8ef438effe: ``modules/naturalpseech2/
transformers.py`` (encoders, predictors, length regulator), ``models/tts/naturalspeech2/wavenet.py`` and, for the
codebook, EnCodec 0.1.1's ``quantization/core_vq.py`` as ``ns2.py`` reads it. Attribute
names are the reference's so its state dict loads with ``strict=True``; the model built from them is in
`autotune.models.naturalspeech2`. Masks are float or bool tensors that are 1 on real frames and 0 on padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autotune.models.attention import sinusoid_table

__all__ = [
    "ConvPredictor",
    "LengthRegulator",
    "NS2PositionalEncoding",
    "NS2TransformerEncoder",
    "ResidualCodebook",
    "StyleAdaptiveLayerNorm",
    "WaveNet",
]

# Dropout rates the reference hard-codes: after each predictor cross-attention, inside the WaveNet's attention.
_PREDICTOR_ATTENTION_DROPOUT = 0.2
_WAVENET_ATTENTION_DROPOUT = 0.1


class StyleAdaptiveLayerNorm(nn.Module):
    """LayerNorm whose gain and bias come from a linear map of the condition averaged over its time axis."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.style = nn.Linear(dim, 2 * dim)
        with torch.no_grad():
            self.style.bias[:dim] = 1.0
            self.style.bias[dim:] = 0.0

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        # The mean runs over every condition frame, its padding included, as in the reference.
        gamma, beta = self.style(condition.mean(dim=1, keepdim=True)).chunk(2, dim=-1)
        return gamma * self.norm(x) + beta


class NS2PositionalEncoding(nn.Module):
    """The reference's sinusoid table (max_len, 1, d), indexed by the *first* axis of a batch-first input.

    The reference adds ``pe[:x.size(0)]`` to (B, T, d) inputs: item b gets position b's vector at every frame, not a
    position per frame. Kept, since it is what the recipe trains.
    """

    pe: torch.Tensor

    def __init__(self, dim: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = dropout
        self.register_buffer("pe", sinusoid_table(max_len, dim).unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x + self.pe[: x.size(0)], self.dropout, training=self.training)


class _ConvFeedForward(nn.Module):
    def __init__(self, dim: int, filter_size: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.ffn_1 = nn.Conv1d(dim, filter_size, kernel_size, padding=kernel_size // 2)
        self.ffn_2 = nn.Linear(filter_size, dim)
        nn.init.normal_(self.ffn_1.weight, 0.0, 0.02)
        nn.init.normal_(self.ffn_2.weight, 0.0, 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.ffn_1(x.transpose(1, 2)).transpose(1, 2))
        return self.ffn_2(F.dropout(x, self.dropout, training=self.training))


class _EncoderLayer(nn.Module):
    """Pre-norm self-attention and conv FFN; the norms are style-adaptive when ``use_cln``."""

    def __init__(self, dim: int, heads: int, filter_size: int, kernel_size: int, dropout: float, use_cln: bool):
        super().__init__()
        self.dropout = dropout
        self.use_cln = use_cln
        self.ln_1: nn.Module = StyleAdaptiveLayerNorm(dim) if use_cln else nn.LayerNorm(dim)
        self.ln_2: nn.Module = StyleAdaptiveLayerNorm(dim) if use_cln else nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ffn = _ConvFeedForward(dim, filter_size, kernel_size, dropout)

    def _norm(self, norm: nn.Module, x: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        return norm(x, condition) if self.use_cln else norm(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, condition: torch.Tensor | None) -> torch.Tensor:
        y = self._norm(self.ln_1, x, condition)
        padding = None if mask is None else ~mask.bool()
        y, _ = self.self_attn(query=y, key=y, value=y, key_padding_mask=padding)
        x = x + F.dropout(y, self.dropout, training=self.training)
        return x + self.ffn(self._norm(self.ln_2, x, condition))


class NS2TransformerEncoder(nn.Module):
    """The text encoder (token embedding, style-adaptive norms) and the prompt encoder (plain LayerNorm).

    Args:
        layers, dim, heads, filter_size, kernel_size, dropout: the reference's ``encoder_*`` and ``conv_*`` keys.
        use_cln: Style-adaptive LayerNorm conditioned on the prompt (text encoder) or plain LayerNorm.
        enc_emb_tokens: The phone embedding, shared with the prior encoder (it then appears twice in the state
            dict, under both owners, as in the reference).
        max_positions: Rows of the sinusoid table.
    """

    def __init__(
        self,
        *,
        layers: int,
        dim: int,
        heads: int,
        filter_size: int,
        kernel_size: int,
        dropout: float,
        use_cln: bool,
        enc_emb_tokens: nn.Embedding | None = None,
        max_positions: int = 5000,
    ) -> None:
        super().__init__()
        self.use_cln = use_cln
        if enc_emb_tokens is not None:
            self.enc_emb_tokens = enc_emb_tokens
        self.position_emb = NS2PositionalEncoding(dim, dropout, max_positions)
        self.layers = nn.ModuleList(
            _EncoderLayer(dim, heads, filter_size, kernel_size, dropout, use_cln) for _ in range(layers)
        )
        self.last_ln: nn.Module = StyleAdaptiveLayerNorm(dim) if use_cln else nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, condition: torch.Tensor | None) -> torch.Tensor:
        """Encode (B, N) ids (when it owns the embedding) or (B, T, dim) features; ``mask`` is 1 on real steps."""
        if x.dim() == 2 and hasattr(self, "enc_emb_tokens"):
            x = self.enc_emb_tokens(x)
        x = self.position_emb(x)
        for layer in self.layers:
            x = layer(x, mask, condition)
        return self.last_ln(x, condition) if self.use_cln else self.last_ln(x)


class ConvPredictor(nn.Module):
    """The duration and pitch predictors: residual conv layers, each ``cross_attn_per_layer``-th preceded by
    cross-attention to the prompt, then a linear map to one value per step.

    Args:
        input_size, filter_size, kernel_size, conv_layers, cross_attn_per_layer, attn_head, drop_out: the
            reference's predictor keys.
        mask_each_layer: Zero the padding after every layer (the duration predictor does, the pitch one does not).
    """

    def __init__(
        self,
        *,
        input_size: int,
        filter_size: int,
        kernel_size: int,
        conv_layers: int,
        cross_attn_per_layer: int,
        attn_head: int,
        drop_out: float,
        mask_each_layer: bool,
    ) -> None:
        super().__init__()
        self.cross_attn_per_layer = cross_attn_per_layer
        self.mask_each_layer = mask_each_layer
        self.conv = nn.ModuleList()
        self.cattn = nn.ModuleList()
        for index in range(conv_layers):
            self.conv.append(
                nn.Sequential(
                    nn.Conv1d(
                        input_size if index == 0 else filter_size, filter_size, kernel_size, padding=kernel_size // 2
                    ),
                    nn.ReLU(),
                    nn.LayerNorm(filter_size),
                    nn.Dropout(drop_out),
                )
            )
            if index % cross_attn_per_layer == 0:
                self.cattn.append(
                    nn.Sequential(
                        nn.MultiheadAttention(filter_size, attn_head, batch_first=True),
                        nn.LayerNorm(filter_size),
                        nn.Dropout(_PREDICTOR_ATTENTION_DROPOUT),
                    )
                )
        self.linear = nn.Linear(filter_size, 1)
        nn.init.normal_(self.linear.weight, 0.0, 0.02)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, ref_emb: torch.Tensor, ref_mask: torch.Tensor
    ) -> torch.Tensor:
        """(B, N, d) steps, (B, T', d) prompt -> (B, N) predictions (log durations or log pitch)."""
        ref_padding = ~ref_mask.bool()
        x = x.transpose(1, 2)
        for index, block in enumerate(self.conv):
            conv, act, ln, dropout = block.children()
            residual = x
            if index % self.cross_attn_per_layer == 0:
                attn, attn_ln, attn_drop = self.cattn[index // self.cross_attn_per_layer].children()
                attn_residual = x.transpose(1, 2)
                y, _ = attn(attn_ln(attn_residual), ref_emb, ref_emb, key_padding_mask=ref_padding)
                x = ((attn_drop(y) + attn_residual) / math.sqrt(2.0)).transpose(1, 2)
            x = dropout(ln(act(conv(x)).transpose(1, 2)).transpose(1, 2))
            if index != 0:
                x = x + residual  # the residual skips the cross-attention too
            if self.mask_each_layer and mask is not None:
                x = x * mask.to(x.dtype)[:, None, :]
        return self.linear(x.transpose(1, 2)).squeeze(-1)


class LengthRegulator(nn.Module):
    """Repeat each phone's vector by its duration and pad every item to ``max_len`` frames.

    It loops in Python with one ``.item()`` per phone, as the reference does: on a GPU that is one host sync per
    phone of the batch, part of the step cost being measured.
    """

    def forward(self, x: torch.Tensor, duration: torch.Tensor, max_len: int) -> torch.Tensor:
        items = []
        for phones, counts in zip(x, duration, strict=True):
            parts = [vector.expand(max(int(counts[i].item()), 0), -1) for i, vector in enumerate(phones)]
            expanded = torch.cat(parts, 0)
            # F.pad crops when an item is longer than max_len, as the reference's pad does.
            items.append(F.pad(expanded, (0, 0, 0, max_len - expanded.shape[0])))
        return torch.stack(items)


def _kaiming_conv(in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> nn.Conv1d:
    layer = nn.Conv1d(in_channels, out_channels, kernel_size, padding=dilation * (kernel_size // 2), dilation=dilation)
    nn.init.kaiming_normal_(layer.weight)
    return layer


def _linear(in_features: int, out_features: int) -> nn.Linear:
    layer = nn.Linear(in_features, out_features)
    nn.init.normal_(layer.weight, 0.0, 0.02)
    return layer


class _FiLM(nn.Module):
    def __init__(self, dim: int, condition_dim: int) -> None:
        super().__init__()
        self.gain = nn.Linear(condition_dim, dim)
        self.bias = nn.Linear(condition_dim, dim)
        nn.init.xavier_uniform_(self.gain.weight)
        nn.init.constant_(self.gain.bias, 1.0)
        nn.init.xavier_uniform_(self.bias.weight)
        nn.init.constant_(self.bias.bias, 0.0)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return x * self.gain(condition) + self.bias(condition)


class _ResidualBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dilation: int, has_cattn: bool) -> None:
        super().__init__()
        self.has_cattn = has_cattn
        self.dilated_conv = _kaiming_conv(dim, 2 * dim, 3, dilation=dilation)
        self.diffusion_proj = _linear(dim, dim)
        self.cond_proj = _kaiming_conv(dim, 2 * dim, 1)
        self.out_proj = _kaiming_conv(dim, 2 * dim, 1)
        if has_cattn:
            self.attn = nn.MultiheadAttention(dim, heads, _WAVENET_ATTENTION_DROPOUT, batch_first=True)
            self.film = _FiLM(2 * dim, dim)
            self.ln = nn.LayerNorm(dim)
        # The reference's block also holds an nn.Dropout(drop_out) that its forward never calls; it has no state.

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, cond: torch.Tensor, step: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + self.diffusion_proj(step).unsqueeze(-1)
        if mask is not None:
            y = y * mask.to(y.dtype)[:, None, :]
        attended = None
        if self.has_cattn:
            attended, _ = self.attn(self.ln(y.transpose(1, 2)), query, query)
        y = self.dilated_conv(y) + self.cond_proj(cond)
        if attended is not None:
            y = self.film(y.transpose(1, 2), attended).transpose(1, 2)
        gate, filter_ = y.chunk(2, dim=1)
        residual, skip = self.out_proj(torch.sigmoid(gate) * torch.tanh(filter_)).chunk(2, dim=1)
        if mask is not None:
            residual = residual * mask.to(y.dtype)[:, None, :]
            skip = skip * mask.to(y.dtype)[:, None, :]
        return (x + residual) / math.sqrt(2.0), skip


class WaveNet(nn.Module):
    """The diffusion's x0 estimator: dilated gated residual blocks conditioned on the prior, the diffusion time and,
    every ``cross_attn_per_layer``-th block, on the prompt's query tokens through attention and FiLM."""

    def __init__(
        self,
        *,
        input_size: int,
        hidden_size: int,
        out_size: int,
        num_layers: int,
        cross_attn_per_layer: int,
        dilation_cycle: int,
        attn_head: int,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.in_proj = _kaiming_conv(input_size, hidden_size, 1)
        self.mlp = nn.Sequential(
            _linear(hidden_size, 4 * hidden_size), nn.Mish(), _linear(4 * hidden_size, hidden_size)
        )
        self.cond_ln = nn.LayerNorm(hidden_size)
        self.layers = nn.ModuleList(
            _ResidualBlock(hidden_size, attn_head, 2 ** (i % dilation_cycle), i % cross_attn_per_layer == 0)
            for i in range(num_layers)
        )
        self.skip_proj = _kaiming_conv(hidden_size, hidden_size, 1)
        self.out_proj = _kaiming_conv(hidden_size, out_size, 1)
        nn.init.zeros_(self.out_proj.weight)

    def time_embedding(self, time: torch.Tensor) -> torch.Tensor:
        """Sinusoids of the diffusion time in [0, 1], unscaled, as the reference's SinusoidalPosEmb."""
        half = self.hidden_size // 2
        frequencies = torch.exp(torch.arange(half, device=time.device) * -(math.log(10000) / (half - 1)))
        angles = time[:, None] * frequencies[None, :]
        return torch.cat((angles.sin(), angles.cos()), dim=-1)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, cond: torch.Tensor, time: torch.Tensor, query: torch.Tensor
    ) -> torch.Tensor:
        """(B, latent, T) noisy latent, (B, T, d) prior, (B,) time, (B, Q, d) query tokens -> (B, out, T)."""
        cond = self.cond_ln(cond).transpose(1, 2)
        x = F.relu(self.in_proj(x))
        step = self.mlp(self.time_embedding(time).to(x.dtype))
        skips = []
        for layer in self.layers:
            x, skip = layer(x, mask, cond, step, query)
            skips.append(skip)
        x = torch.sum(torch.stack(skips), dim=0) / math.sqrt(self.num_layers)
        return self.out_proj(F.relu(self.skip_proj(x)))


class _Codebook(nn.Module):
    """EnCodec's EuclideanCodebook state: four buffers, in its order (only ``embed`` is read here)."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        embed = torch.empty(size, dim)
        nn.init.kaiming_uniform_(embed)
        self.register_buffer("inited", torch.ones(1))
        self.register_buffer("cluster_size", torch.zeros(size))
        self.register_buffer("embed", embed)
        self.register_buffer("embed_avg", embed.clone())


class _Level(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _LevelList(nn.Module):
    def __init__(self, levels: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Level(size, dim) for _ in range(levels))


class ResidualCodebook(nn.Module):
    """EnCodec's frozen residual vector quantizer (``quantizer.vq.layers.i._codebook``), codes <-> latents."""

    def __init__(self, levels: int, size: int, dim: int) -> None:
        super().__init__()
        self.vq = _LevelList(levels, size, dim)

    def embed(self, level: int) -> torch.Tensor:
        return self.get_buffer(f"vq.layers.{level}._codebook.embed")

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, levels, T) codes -> (B, dim, T): the sum of each level's entries (``code_to_latent``)."""
        latent = torch.zeros((), device=codes.device)
        for level, indices in enumerate(codes.transpose(0, 1)):
            latent = latent + F.embedding(indices, self.embed(level)).transpose(1, 2)
        return latent

    def distances(self, latent: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy residual search (``latent_to_code``): (levels, B, T) codes and (levels, B, T, size) negated squared
        distances, which the CE term uses as logits; differentiable in the distances."""
        batch, _, frames = latent.shape
        residual = latent
        all_indices, all_distances = [], []
        for level in range(levels):
            x = residual.transpose(1, 2).reshape(batch * frames, -1)
            embed = self.embed(level).t()
            distance = -(x.pow(2).sum(1, keepdim=True) - 2 * x @ embed + embed.pow(2).sum(0, keepdim=True))
            indices = distance.max(dim=-1).indices.view(batch, frames)
            residual = residual - F.embedding(indices, self.embed(level)).transpose(1, 2)
            all_indices.append(indices)
            all_distances.append(distance.view(batch, frames, -1))
        return torch.stack(all_indices), torch.stack(all_distances)
