"""Multi-head attention and sinusoidal position encodings in WeNet's formulation.

Attribute names follow ``wenet/transformer/attention.py`` and ``embedding.py`` so WeNet checkpoints load as is.
Masks are boolean and True where attention is allowed.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoid_table(num_positions: int, d_model: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return the (num_positions, d_model) float32 table PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...).

    ``dtype`` is the precision it is computed in: WeNet computes in float32, ming024 in float64 (numpy) before
    storing float32; computing as the reference does gives its table to the last bit.
    """
    position = torch.arange(num_positions, dtype=dtype).unsqueeze(1)
    inverse_frequency = torch.exp(torch.arange(0, d_model, 2, dtype=dtype) * -(math.log(10000.0) / d_model))
    table = torch.zeros(num_positions, d_model, dtype=dtype)
    table[:, 0::2] = torch.sin(position * inverse_frequency)
    table[:, 1::2] = torch.cos(position * inverse_frequency)
    return table.float()


class PositionalEncoding(nn.Module):
    """Scale the input by sqrt(d_model) and add absolute sinusoidal positions (the decoder's embedding)."""

    pe: torch.Tensor  # a registered buffer (nn.Module.__getattr__ is typed Tensor | Module)

    def __init__(self, d_model: int, dropout_rate: float, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.dropout = nn.Dropout(p=dropout_rate)
        # Persistent, shaped (1, max_len, d_model): WeNet saves it in its checkpoints, which must load strictly.
        self.register_buffer("pe", sinusoid_table(max_len, d_model).unsqueeze(0))

    def positions(self, length: int, like: torch.Tensor) -> torch.Tensor:
        """Return the first ``length`` positions as (1, length, d_model).

        Past the table (WeNet asserts there: 5000 positions, 200 s of audio after subsampling) the positions are
        computed for this call, not stored, so that the saved table keeps its checkpoint shape.
        """
        if length > self.pe.shape[1]:
            return sinusoid_table(length, self.d_model).to(like.device, like.dtype).unsqueeze(0)
        return self.pe[:, :length].to(like.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Encode (B, T, d_model) embeddings."""
        return self.dropout(x * self.xscale + self.positions(x.shape[1], x))


class RelPositionalEncoding(PositionalEncoding):
    """Scale the input and return the position table separately, for relative-position attention.

    WeNet feeds the table for positions 0..T-1 and drops Transformer-XL's relative shift (its authors found the
    shift useless for speech recognition and awkward for streaming); this keeps that formulation.
    """

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """Return the scaled input (B, T, d) and the position embeddings (1, T, d), both after dropout."""
        pos_emb = self.positions(x.shape[1], x)
        return self.dropout(x * self.xscale), self.dropout(pos_emb)


class MultiHeadedAttention(nn.Module):
    """Scaled dot-product attention over ``n_head`` heads with biased q/k/v/out projections.

    Args:
        n_head: Number of heads.
        n_feat: Model width; must be divisible by ``n_head``.
        dropout_rate: Dropout on the attention weights.
    """

    def __init__(self, n_head: int, n_feat: int, dropout_rate: float) -> None:
        super().__init__()
        if n_feat % n_head:
            raise ValueError(f"model width {n_feat} is not divisible by {n_head} heads")
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.dropout = nn.Dropout(p=dropout_rate)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape (B, T, n_feat) into (B, head, T, d_k)."""
        return x.view(x.shape[0], -1, self.h, self.d_k).transpose(1, 2)

    def forward_qkv(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and split into heads: each result is (B, head, T, d_k)."""
        return (
            self._split_heads(self.linear_q(query)),
            self._split_heads(self.linear_k(key)),
            self._split_heads(self.linear_v(value)),
        )

    def forward_attention(self, value: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Softmax ``scores`` (B, head, T1, T2) under ``mask`` (B, 1 or T1, T2), weight ``value``, project out."""
        blocked = ~mask.unsqueeze(1)
        # The dtype's minimum rather than -inf: a fully masked row then yields zeros instead of NaN.
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).masked_fill(blocked, 0.0)
        context = torch.matmul(self.dropout(weights), value)
        batch_size = value.shape[0]
        return self.linear_out(context.transpose(1, 2).reshape(batch_size, -1, self.h * self.d_k))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attend from ``query`` (B, T1, n_feat) to ``key``/``value`` (B, T2, n_feat); returns (B, T1, n_feat)."""
        q, k, v = self.forward_qkv(query, key, value)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        return self.forward_attention(v, scores, mask)


class RelPositionMultiHeadedAttention(MultiHeadedAttention):
    """Self-attention with Transformer-XL style position terms and learned biases ``pos_bias_u``/``pos_bias_v``.

    Scores are (q + u) k^T + (q + v) p^T over sqrt(d_k), p being the projected position embeddings.
    """

    def __init__(self, n_head: int, n_feat: int, dropout_rate: float) -> None:
        super().__init__(n_head, n_feat, dropout_rate)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(self.h, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def forward(  # type: ignore[override]
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor
    ) -> torch.Tensor:
        """Attend as the base class, adding position terms from ``pos_emb`` (1, T, n_feat)."""
        q, k, v = self.forward_qkv(query, key, value)
        p = self._split_heads(self.linear_pos(pos_emb))
        # Biases are per head, so add them with time and head axes swapped back: (B, T, head, d_k).
        q = q.transpose(1, 2)
        q_with_bias_u = (q + self.pos_bias_u).transpose(1, 2)
        q_with_bias_v = (q + self.pos_bias_v).transpose(1, 2)
        matrix_ac = torch.matmul(q_with_bias_u, k.transpose(-2, -1))
        matrix_bd = torch.matmul(q_with_bias_v, p.transpose(-2, -1))
        return self.forward_attention(v, (matrix_ac + matrix_bd) / math.sqrt(self.d_k), mask)
