"""GPT-SoVITS's s1 model: the autoregressive text-to-semantic transformer and the loss its training step computes.

Follows ``Text2SemanticDecoder`` of RVC-Boss/GPT-SoVITS at commit 48b1a0169a28582a8984402f82cf438d3bfa6aca
(``GPT_SoVITS/AR/models/t2s_model.py`` with ``AR/modules/embedding.py``, ``transformer.py``, ``activation.py`` and
``patched_mha_with_cache.py``), configured by the model section of ``GPT_SoVITS/configs/s1longer-v2.yaml``.
Submodule and parameter names, shapes and their order are the reference's, so its state dict loads with
``strict=True``; the recipe's ``.ckpt`` files hold the Lightning module's dict, whose keys carry a ``model.`` prefix.
tests/models/test_gpt_sovits_s1.py holds the reference's layout and outputs, recorded by running its code.

Phoneme ids (each with a 1024-dim BERT feature) and the semantic ids of one utterance form one sequence: the phones
see each other, each semantic token sees every phone and the tokens before it (post-norm layers, ReLU FFN). The
training forward is the reference's ``forward_old``: the one the Lightning ``training_step`` calls unless the
experimental ``train.if_dpo`` is set (off in the webui and absent from the yaml). Its loss is the cross entropy
*summed* over every target, padding included (targets are EOS there); its accuracy is top-3 over non-EOS targets.

Two quirks of the reference are kept, since they are what the recipe trains:

* the phones are masked as if left-padded (``make_pad_mask_left``) while the collate pads them on the right, so a
  shorter item's first phones are hidden from attention and its padding phones are seen;
* the dropout rates of the positions and of the layers are 0.1 whatever the config says; its ``dropout`` applies to
  the token embeddings only. The yaml's ``linear_units`` is never read: the FFN is 4 x ``hidden_dim``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as activation_checkpoint
from torch import nn

from autotune.models.attention import sinusoid_table

__all__ = [
    "S1_REDUCED",
    "S1_V2",
    "SinePositionalEmbedding",
    "T2SSelfAttention",
    "T2STransformer",
    "T2STransformerLayer",
    "Text2SemanticConfig",
    "Text2SemanticDecoder",
    "TokenEmbedding",
    "top_k_accuracy",
]

# Rows of the position table built up front, as the reference's extend_pe; longer inputs get theirs per call.
_POSITIONS = 4000


@dataclass(frozen=True, kw_only=True, slots=True)
class Text2SemanticConfig:
    """The s1 model's settings: the ``model`` section of s1longer-v2.yaml and the values the reference hard-codes.

    Args:
        vocab_size: Semantic tokens plus EOS (the SSL k-means codebook of 1024, then EOS).
        phoneme_vocab_size: Phone symbols (``len(symbols2)`` for v2; v1 uses 512).
        embedding_dim: Width of the embeddings; the reference needs it equal to ``hidden_dim``.
        hidden_dim: Transformer width; the FFN is 4x this.
        head: Attention heads.
        n_layer: Transformer layers.
        dropout: Dropout on the token embeddings (the yaml's ``dropout``).
        eos: End-of-sequence token, the last semantic id; it also fills semantic padding.
        bert_dim: Width of the BERT features per phone (hard-coded 1024 in the reference).
        position_dropout: Dropout after adding the positions (hard-coded 0.1).
        layer_dropout: Dropout in every layer: attention weights, after attention, in and after the FFN (0.1).
        accuracy_top_k: Top-k of the reported accuracy (3, set by the Lightning module).
    """

    vocab_size: int = 1025
    phoneme_vocab_size: int = 732
    embedding_dim: int = 512
    hidden_dim: int = 512
    head: int = 16
    n_layer: int = 24
    dropout: float = 0.0
    eos: int = 1024
    bert_dim: int = 1024
    position_dropout: float = 0.1
    layer_dropout: float = 0.1
    accuracy_top_k: int = 3

    def __post_init__(self) -> None:
        if self.eos != self.vocab_size - 1:
            raise ValueError(f"eos {self.eos} must be the last semantic id, vocab_size - 1 = {self.vocab_size - 1}")
        if self.embedding_dim != self.hidden_dim:
            raise ValueError(f"embedding_dim {self.embedding_dim} must equal hidden_dim {self.hidden_dim}")
        if self.hidden_dim % self.head:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not divisible by {self.head} heads")


S1_V2 = Text2SemanticConfig()
"""s1longer-v2.yaml: 77,606,402 trainable parameters."""

S1_REDUCED = Text2SemanticConfig(
    vocab_size=17, phoneme_vocab_size=23, embedding_dim=32, hidden_dim=32, head=2, n_layer=2, eos=16
)
"""The same code path, narrow and shallow, for CPU tests."""


class TokenEmbedding(nn.Module):
    """An embedding table under ``word_embeddings`` and dropout, as the reference nests it."""

    def __init__(self, embedding_dim: int, vocab_size: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Embed (B, T) ids as (B, T, embedding_dim)."""
        return self.dropout(self.word_embeddings(ids))


class SinePositionalEmbedding(nn.Module):
    """Add sinusoidal positions scaled by a learned scalar ``alpha`` (the input itself is not scaled), then dropout."""

    pe: torch.Tensor  # a registered buffer (nn.Module.__getattr__ is typed Tensor | Module)

    def __init__(self, embedding_dim: int, dropout: float) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.alpha = nn.Parameter(torch.ones(1))
        self.dropout = nn.Dropout(p=dropout)
        # Not persistent: the reference keeps its table outside the state dict.
        self.register_buffer("pe", sinusoid_table(_POSITIONS, embedding_dim).unsqueeze(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Encode (B, T, embedding_dim) embeddings."""
        length = x.shape[1]
        if length > self.pe.shape[1]:
            positions = sinusoid_table(length, self.embedding_dim).to(x.device).unsqueeze(0)
        else:
            positions = self.pe[:, :length]
        return self.dropout(x + self.alpha * positions.to(x.dtype))


class T2SSelfAttention(nn.Module):
    """Multi-head self-attention with one packed q/k/v projection (``in_proj_*``) and ``out_proj``.

    The layout of ``torch.nn.MultiheadAttention``, which the reference's own class keeps; the reference then runs
    ``scaled_dot_product_attention`` with dropout on the attention weights, as here.
    """

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Attend within (B, T, dim) under ``allowed`` (B, 1, T, T), True where a query may see a key."""
        batch, length, dim = x.shape
        q, k, v = (
            part.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)
            for part in F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        )
        dropout = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)
        return self.out_proj(context.transpose(1, 2).reshape(batch, length, dim))


class T2STransformerLayer(nn.Module):
    """A post-norm transformer layer: x = norm1(x + attn(x)); x = norm2(x + linear2(relu(linear1(x))))."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = T2SSelfAttention(dim, heads, dropout)
        self.linear1 = nn.Linear(dim, 4 * dim)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(4 * dim, dim)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Transform (B, T, dim) under the attention mask ``allowed`` (B, 1, T, T)."""
        x = self.norm1(x + self.dropout1(self.self_attn(x, allowed)))
        feed_forward = self.linear2(self.dropout(F.relu(self.linear1(x))))
        return self.norm2(x + self.dropout2(feed_forward))


class T2STransformer(nn.Module):
    """The layer stack under ``layers`` (no final norm: the reference's layers are post-norm)."""

    def __init__(self, config: Text2SemanticConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            T2STransformerLayer(config.hidden_dim, config.head, config.layer_dropout) for _ in range(config.n_layer)
        )

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, checkpointing: bool = False) -> torch.Tensor:
        """Run every layer; with ``checkpointing`` each one's activations are recomputed in backward."""
        for layer in self.layers:
            if checkpointing:
                x = activation_checkpoint.checkpoint(layer, x, allowed, use_reentrant=False)
            else:
                x = layer(x, allowed)
        return x


def top_k_accuracy(logits: torch.Tensor, targets: torch.Tensor, k: int, ignore_index: int) -> torch.Tensor:
    """The fraction of targets (not ``ignore_index``) among the top ``k`` logits, 0 when none count.

    torchmetrics' ``MulticlassAccuracy(top_k=k, average="micro", ignore_index=...)`` as the reference uses it.
    """
    counted = targets != ignore_index
    hits = (logits.topk(k, dim=-1).indices == targets.unsqueeze(-1)).any(dim=-1) & counted
    return hits.sum() / counted.sum().clamp(min=1)


class Text2SemanticDecoder(nn.Module):
    """GPT-SoVITS's s1 text-to-semantic model with the reference's training loss.

    Args:
        config: The architecture; ``S1_V2`` is s1longer-v2.yaml.
        gradient_checkpointing: Recompute each layer's activations in backward while training (not in the
            reference; a memory-for-compute trade).
    """

    def __init__(self, config: Text2SemanticConfig = S1_V2, gradient_checkpointing: bool = False) -> None:
        super().__init__()
        self.config = config
        self.gradient_checkpointing = gradient_checkpointing
        self.bert_proj = nn.Linear(config.bert_dim, config.embedding_dim)
        self.ar_text_embedding = TokenEmbedding(config.embedding_dim, config.phoneme_vocab_size, config.dropout)
        self.ar_text_position = SinePositionalEmbedding(config.embedding_dim, config.position_dropout)
        self.ar_audio_embedding = TokenEmbedding(config.embedding_dim, config.vocab_size, config.dropout)
        self.ar_audio_position = SinePositionalEmbedding(config.embedding_dim, config.position_dropout)
        self.h = T2STransformer(config)
        self.ar_predict_layer = nn.Linear(config.hidden_dim, config.vocab_size, bias=False)

    def logits(
        self,
        phoneme_ids: torch.Tensor,
        phoneme_lengths: torch.Tensor,
        semantic_ids: torch.Tensor,
        semantic_lengths: torch.Tensor,
        bert_features: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced logits (B, Ts + 1, vocab_size) and their targets (B, Ts + 1).

        Args:
            phoneme_ids: (B, Tp) phone ids, padded on the right to the longest item (``phoneme_lengths.max()``).
            phoneme_lengths: (B,) phones per item.
            semantic_ids: (B, Ts) semantic ids, padded to the longest item (``semantic_lengths.max()``).
            semantic_lengths: (B,) semantic tokens per item.
            bert_features: (B, bert_dim, Tp) BERT features per phone.

        Returns:
            The logits from the last phone position on, and the semantic ids followed by EOS, with EOS at padding:
            the last phone predicts the first token and the last token predicts EOS.
        """
        phone_width, semantic_width = phoneme_ids.shape[1], semantic_ids.shape[1]
        x = self.ar_text_embedding(phoneme_ids) + self.bert_proj(bert_features.transpose(1, 2))
        x = self.ar_text_position(x)
        semantic_padding = torch.arange(semantic_width, device=semantic_ids.device) >= semantic_lengths.unsqueeze(1)
        inputs = semantic_ids.long().masked_fill(semantic_padding, self.config.eos)
        targets = F.pad(inputs, (0, 1), value=self.config.eos)
        y = self.ar_audio_position(self.ar_audio_embedding(inputs))
        # Left padding of the phones, as the reference masks them (see the module docstring).
        phone_padding = torch.arange(phone_width, device=phoneme_ids.device) < (phone_width - phoneme_lengths)[:, None]
        allowed = self._allowed(phone_width, torch.cat([phone_padding, semantic_padding], dim=1))
        hidden = self.h(torch.cat([x, y], dim=1), allowed, self.gradient_checkpointing and self.training)
        return self.ar_predict_layer(hidden[:, phone_width - 1 :]), targets

    @staticmethod
    def _allowed(phone_width: int, key_padding: torch.Tensor) -> torch.Tensor:
        """(B, 1, T, T), True where a query may attend a key: every phone, and semantic keys up to the query's own
        position (none for phone queries), except padded keys."""
        total = key_padding.shape[1]
        position = torch.arange(total, device=key_padding.device)
        future_semantic = (position[None, :] >= phone_width) & (position[None, :] > position[:, None])
        return (~future_semantic & ~key_padding[:, None, :]).unsqueeze(1)

    def forward(
        self,
        phoneme_ids: torch.Tensor,
        phoneme_lengths: torch.Tensor,
        semantic_ids: torch.Tensor,
        semantic_lengths: torch.Tensor,
        bert_features: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training step's loss and accuracy (the reference's ``forward_old``); inputs as `logits`.

        Returns:
            The cross entropy summed over every target of the batch, and the detached top-``accuracy_top_k``
            accuracy over non-EOS targets as a 0-dim tensor (the reference returns ``.item()`` of it, a host sync
            per step that its caller may add).
        """
        logits, targets = self.logits(phoneme_ids, phoneme_lengths, semantic_ids, semantic_lengths, bert_features)
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="sum")
        accuracy = top_k_accuracy(logits.detach(), targets, self.config.accuracy_top_k, self.config.eos)
        return loss, accuracy
