"""WeNet's left-to-right transformer attention decoder (pre-norm) and the position-wise feed-forward it shares.

Attribute names, shapes and their order follow ``wenet/models/transformer/decoder.py`` and ``decoder_layer.py``.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint as activation_checkpoint
from torch import nn

from autotune.models.attention import MultiHeadedAttention, PositionalEncoding


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Return a (B, max_len) bool mask, True at the first ``lengths[b]`` positions of each row."""
    return torch.arange(max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def checkpointed(layer: nn.Module, enabled: bool, *inputs: torch.Tensor) -> torch.Tensor:
    """layer(*inputs), its activations recomputed in backward when enabled, as WeNet's forward_layers_checkpointed
    (torch.utils.checkpoint, use_reentrant=False; the RNG state is preserved, so dropout draws the same masks)."""
    if not enabled:
        return layer(*inputs)
    return activation_checkpoint.checkpoint(layer, *inputs, use_reentrant=False)


class PositionwiseFeedForward(nn.Module):
    """Linear, activation, dropout, linear: the transformer feed-forward block.

    Args:
        idim: Model width.
        hidden_units: Inner width.
        dropout_rate: Dropout after the activation.
        activation: ReLU in the decoder, swish in the conformer encoder.
    """

    def __init__(self, idim: int, hidden_units: int, dropout_rate: float, activation: nn.Module) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.activation = activation
        self.dropout = nn.Dropout(dropout_rate)
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, T, idim) to (B, T, idim)."""
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class DecoderLayer(nn.Module):
    """Pre-norm decoder block: causal self-attention, attention over the encoder output, feed-forward."""

    def __init__(self, size: int, attention_heads: int, linear_units: int, dropout_rate: float) -> None:
        super().__init__()
        # WeNet's aishell recipe sets both attention dropouts to 0.0; only residual and FFN dropout remain.
        self.self_attn = MultiHeadedAttention(attention_heads, size, 0.0)
        self.src_attn = MultiHeadedAttention(attention_heads, size, 0.0)
        self.feed_forward = PositionwiseFeedForward(size, linear_units, dropout_rate, nn.ReLU())
        self.norm1 = nn.LayerNorm(size, eps=1e-5)
        self.norm2 = nn.LayerNorm(size, eps=1e-5)
        self.norm3 = nn.LayerNorm(size, eps=1e-5)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(
        self, tgt: torch.Tensor, tgt_mask: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor
    ) -> torch.Tensor:
        """Update ``tgt`` (B, L, size) given ``memory`` (B, T, size); masks are (B, L, L) and (B, 1, T)."""
        x = self.norm1(tgt)
        x = tgt + self.dropout(self.self_attn(x, x, x, tgt_mask))
        x = x + self.dropout(self.src_attn(self.norm2(x), memory, memory, memory_mask))
        return x + self.dropout(self.feed_forward(self.norm3(x)))


class TransformerDecoder(nn.Module):
    """Token embedding with absolute positions, ``num_blocks`` decoder layers, final norm and output projection.

    Args:
        vocab_size: Output vocabulary size (also the embedding's).
        encoder_output_size: Model width, equal to the encoder's.
        attention_heads: Heads per attention.
        linear_units: Feed-forward inner width.
        num_blocks: Number of decoder layers.
        dropout_rate: Residual, feed-forward and positional dropout.
        gradient_checkpointing: Recompute each layer in backward (training only), as WeNet's decoder does.
    """

    def __init__(
        self,
        vocab_size: int,
        encoder_output_size: int,
        attention_heads: int = 4,
        linear_units: int = 2048,
        num_blocks: int = 6,
        dropout_rate: float = 0.1,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.gradient_checkpointing = gradient_checkpointing  # WeNet's decoder_conf key of the same name
        size = encoder_output_size
        self.embed = nn.Sequential(nn.Embedding(vocab_size, size), PositionalEncoding(size, dropout_rate))
        self.after_norm = nn.LayerNorm(size, eps=1e-5)  # declared before the layers, as WeNet (state order)
        self.output_layer = nn.Linear(size, vocab_size)
        self.decoders = nn.ModuleList(
            DecoderLayer(size, attention_heads, linear_units, dropout_rate) for _ in range(num_blocks)
        )

    def forward(
        self, memory: torch.Tensor, memory_mask: torch.Tensor, ys_in: torch.Tensor, ys_in_lens: torch.Tensor
    ) -> torch.Tensor:
        """Score every next token with teacher forcing.

        Args:
            memory: Encoder output (B, T, size).
            memory_mask: (B, T) bool, True at real encoder frames.
            ys_in: Decoder input tokens (B, L), starting with <sos>.
            ys_in_lens: Real lengths of ``ys_in`` (B,).

        Returns:
            Logits shaped (B, L, vocab_size).
        """
        num_tokens = ys_in.shape[1]
        causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=ys_in.device).tril()
        tgt_mask = padding_mask(ys_in_lens, num_tokens).unsqueeze(1) & causal.unsqueeze(0)
        x = self.embed(ys_in)
        for layer in self.decoders:
            x = checkpointed(
                layer, self.gradient_checkpointing and self.training, x, tgt_mask, memory, memory_mask.unsqueeze(1)
            )
        return self.output_layer(self.after_norm(x))
