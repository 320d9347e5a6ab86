"""WeNet's conformer encoder and hybrid CTC/attention ASR model (aishell ``train_conformer.yaml``).

Parameter and buffer names and shapes follow ``wenet/models/transformer`` (``encoder.global_cmvn.mean``,
``encoder.embed.conv``, ``encoder.embed.pos_enc.pe``, ``encoder.encoders.N.self_attn``, ``decoder.decoders.N``,
``ctc.ctc_lo``...), so a WeNet checkpoint loads with ``strict=True``: tests/models/test_conformer.py holds WeNet's
own state-dict layout and outputs, recorded at wenet-e2e/wenet 0154699. As in the aishell recipe, global CMVN lives
in the model (its statistics computed from the training list: `autotune.data.cmvn`), <sos/eos> is id 2 (the
recipe's dictionary: <blank> 0, <unk> 1, <sos/eos> 2) and the position tables are saved. With the defaults
(4233-token vocabulary) the model has 46,197,266 trainable parameters: encoder 33,464,832, decoder 11,644,553, CTC
1,087,881.

Two deliberate departures, both invisible on well-formed, unpadded input: the convolution module zeroes padding
right before its depthwise convolution (so padding cannot leak into real frames), and the CTC loss uses
``zero_infinity`` (an impossible alignment adds 0, not inf).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autotune.models.attention import RelPositionalEncoding, RelPositionMultiHeadedAttention
from autotune.models.transformer_decoder import (
    PositionwiseFeedForward,
    TransformerDecoder,
    checkpointed,
    padding_mask,
)

# Conv2dSubsampling4 needs this many frames to produce one output frame (two 3x3 stride-2 convolutions).
MIN_INPUT_FRAMES = 7
IGNORE_ID = -1


def subsampled_lengths(feat_lengths: torch.Tensor) -> torch.Tensor:
    """Return the number of encoder frames each utterance keeps after 4x subsampling."""
    return ((feat_lengths - 1) // 2 - 1) // 2


class GlobalCMVN(nn.Module):
    """Global mean and variance normalisation of the input features: (x - mean) * istd, per bin.

    WeNet keeps the statistics of the training list in the model (``cmvn: global_cmvn``), so they travel with its
    checkpoints; until `set_stats` they are the identity.
    """

    mean: torch.Tensor  # registered buffers (nn.Module.__getattr__ is typed Tensor | Module)
    istd: torch.Tensor

    def __init__(self, feat_dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(feat_dim))
        self.register_buffer("istd", torch.ones(feat_dim))

    def set_stats(self, mean: torch.Tensor, istd: torch.Tensor) -> None:
        """Use these statistics (each (feat_dim,)), as WeNet's init_model does from its global_cmvn file."""
        if mean.shape != self.mean.shape or istd.shape != self.istd.shape:
            raise ValueError(f"CMVN statistics of shape {tuple(mean.shape)} do not fit {self.mean.numel()} bins")
        self.mean.copy_(mean)
        self.istd.copy_(istd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise (B, T, feat_dim) features."""
        return (x - self.mean) * self.istd


class Conv2dSubsampling4(nn.Module):
    """Two 3x3 stride-2 convolutions (x4 in time and frequency), a linear projection and position encoding."""

    def __init__(self, idim: int, odim: int, dropout_rate: float) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, odim, 3, 2), nn.ReLU(), nn.Conv2d(odim, odim, 3, 2), nn.ReLU())
        self.out = nn.Sequential(nn.Linear(odim * (((idim - 1) // 2 - 1) // 2), odim))
        self.pos_enc = RelPositionalEncoding(odim, dropout_rate)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Map (B, T, idim) features to (B, T', odim) and position embeddings (1, T', odim)."""
        if x.shape[1] < MIN_INPUT_FRAMES:
            raise ValueError(f"the conformer needs at least {MIN_INPUT_FRAMES} input frames, got {x.shape[1]}")
        x = self.conv(x.unsqueeze(1))
        batch_size, channels, frames, freqs = x.shape
        x = self.out(x.transpose(1, 2).reshape(batch_size, frames, channels * freqs))
        return self.pos_enc(x)


class ConvolutionModule(nn.Module):
    """Conformer convolution: pointwise conv + GLU, depthwise conv, BatchNorm, swish, pointwise conv."""

    def __init__(self, channels: int, kernel_size: int = 15) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"cnn_module_kernel must be odd for symmetric padding, got {kernel_size}")
        self.pointwise_conv1 = nn.Conv1d(channels, 2 * channels, kernel_size=1)
        self.depthwise_conv = nn.Conv1d(
            channels, channels, kernel_size, padding=(kernel_size - 1) // 2, groups=channels
        )
        self.norm = nn.BatchNorm1d(channels)
        self.pointwise_conv2 = nn.Conv1d(channels, channels, kernel_size=1)
        self.activation = nn.SiLU()

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """Map (B, T, C) to (B, T, C); ``pad_mask`` (B, T) is True at real frames."""
        keep = pad_mask.unsqueeze(1)
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)
        # Zero the depthwise conv's input so the last real frames see what they would see unpadded. WeNet zeroes
        # the module input instead, which lets GLU(bias) of padded frames leak into the last kernel/2 real frames.
        x = x.masked_fill(~keep, 0.0)
        x = self.pointwise_conv2(self.activation(self.norm(self.depthwise_conv(x))))
        return x.masked_fill(~keep, 0.0).transpose(1, 2)


class ConformerEncoderLayer(nn.Module):
    """Macaron conformer block: half FFN, relative-position self-attention, convolution, half FFN, final norm."""

    def __init__(self, size: int, attention_heads: int, linear_units: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        # WeNet's aishell recipe uses attention_dropout_rate 0.0.
        self.self_attn = RelPositionMultiHeadedAttention(attention_heads, size, 0.0)
        self.feed_forward = PositionwiseFeedForward(size, linear_units, dropout, nn.SiLU())
        self.feed_forward_macaron = PositionwiseFeedForward(size, linear_units, dropout, nn.SiLU())
        self.conv_module = ConvolutionModule(size, kernel_size)
        self.norm_ff = nn.LayerNorm(size, eps=1e-5)
        self.norm_mha = nn.LayerNorm(size, eps=1e-5)
        self.norm_ff_macaron = nn.LayerNorm(size, eps=1e-5)
        self.norm_conv = nn.LayerNorm(size, eps=1e-5)
        self.norm_final = nn.LayerNorm(size, eps=1e-5)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        """Update ``x`` (B, T, size); ``pad_mask`` (B, T) is True at real frames."""
        x = x + 0.5 * self.dropout(self.feed_forward_macaron(self.norm_ff_macaron(x)))
        normed = self.norm_mha(x)
        x = x + self.dropout(self.self_attn(normed, normed, normed, pad_mask.unsqueeze(1), pos_emb))
        x = x + self.dropout(self.conv_module(self.norm_conv(x), pad_mask))
        x = x + 0.5 * self.dropout(self.feed_forward(self.norm_ff(x)))
        return self.norm_final(x)


class ConformerEncoder(nn.Module):
    """Global CMVN, Conv2d x4 subsampling, ``num_blocks`` conformer layers and a final LayerNorm (pre-norm)."""

    def __init__(
        self,
        feat_dim: int = 80,
        output_size: int = 256,
        attention_heads: int = 4,
        linear_units: int = 2048,
        num_blocks: int = 12,
        cnn_module_kernel: int = 15,
        dropout: float = 0.1,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.gradient_checkpointing = gradient_checkpointing  # WeNet's encoder_conf key of the same name
        self.global_cmvn = GlobalCMVN(feat_dim)
        self.embed = Conv2dSubsampling4(feat_dim, output_size, dropout)
        self.after_norm = nn.LayerNorm(output_size, eps=1e-5)  # declared before the layers, as WeNet (state order)
        self.encoders = nn.ModuleList(
            ConformerEncoderLayer(output_size, attention_heads, linear_units, cnn_module_kernel, dropout)
            for _ in range(num_blocks)
        )

    def forward(self, feats: torch.Tensor, feat_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode (B, T, feat_dim) features; returns (B, T', size) and a (B, T') mask, True at real frames."""
        x, pos_emb = self.embed(self.global_cmvn(feats))
        pad_mask = padding_mask(subsampled_lengths(feat_lengths), x.shape[1])
        for layer in self.encoders:
            x = checkpointed(layer, self.gradient_checkpointing and self.training, x, pad_mask, pos_emb)
        return self.after_norm(x), pad_mask


class CTC(nn.Module):
    """CTC projection and loss, summed over the batch then divided by the batch size (WeNet's reduction)."""

    def __init__(self, vocab_size: int, encoder_output_size: int, blank_id: int = 0) -> None:
        super().__init__()
        self.ctc_lo = nn.Linear(encoder_output_size, vocab_size)
        # zero_infinity departs from WeNet: an utterance with more tokens than frames contributes 0 instead of
        # an infinite loss whose NaN gradients would poison the whole step.
        self.ctc_loss = nn.CTCLoss(blank=blank_id, reduction="sum", zero_infinity=True)

    def forward(
        self, hs_pad: torch.Tensor, hlens: torch.Tensor, ys_pad: torch.Tensor, ys_lens: torch.Tensor
    ) -> torch.Tensor:
        """Return the CTC loss of ``hs_pad`` (B, T, D) with ``hlens`` frames against ``ys_pad`` (B, L)."""
        # The forward-backward recursion needs fp32 range even when the encoder runs in half precision.
        log_probs = self.ctc_lo(hs_pad).float().log_softmax(dim=-1).transpose(0, 1)
        targets = ys_pad.masked_fill(ys_pad < 0, 0)
        return self.ctc_loss(log_probs, targets, hlens, ys_lens) / hs_pad.shape[0]


def label_smoothing_loss(logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Return the summed KL divergence between label-smoothed targets and the model, over non-ignored tokens.

    Equal to WeNet's ``LabelSmoothingLoss`` before normalisation, computed in closed form instead of
    materialising a (B, L, V) target distribution: target gets 1 - smoothing, every other class smoothing / (V - 1).

    Args:
        logits: Decoder output (B, L, V).
        targets: Token ids (B, L), ``IGNORE_ID`` where there is no token.
        smoothing: Probability mass spread over the non-target classes.

    Returns:
        Scalar sum over all real tokens.
    """
    vocab_size = logits.shape[-1]
    log_probs = logits.float().log_softmax(dim=-1)
    valid = targets != IGNORE_ID
    confidence, spread = 1.0 - smoothing, smoothing / (vocab_size - 1)
    target_log_prob = log_probs.gather(-1, targets.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1)
    other_log_prob = log_probs.sum(dim=-1) - target_log_prob
    # Entropy of the smoothed target distribution, the constant part of the KL divergence (0 * log 0 = 0).
    entropy_term = _xlogx(confidence) + (vocab_size - 1) * _xlogx(spread)
    per_token = entropy_term - confidence * target_log_prob - spread * other_log_prob
    return per_token.masked_fill(~valid, 0.0).sum()


def _xlogx(p: float) -> float:
    return p * math.log(p) if p > 0 else 0.0


class ConformerASR(nn.Module):
    """Conformer encoder + transformer decoder trained with the hybrid CTC/attention loss, as WeNet.

    Args:
        vocab_size: Token vocabulary, including <blank> (id 0), <unk> (1) and <sos/eos>.
        feat_dim: Input fbank size.
        output_size: Model width of encoder and decoder.
        attention_heads: Heads per attention layer (encoder and decoder).
        linear_units: Feed-forward inner width (encoder and decoder).
        num_blocks: Conformer encoder layers.
        decoder_blocks: Transformer decoder layers.
        cnn_module_kernel: Depthwise kernel of the conformer convolution module.
        dropout: Residual, feed-forward and positional dropout (attention dropout is 0, as in the recipe).
        ctc_weight: Weight of the CTC loss; the attention loss gets 1 - ctc_weight.
        lsm_weight: Label smoothing of the attention loss.
        sos_eos: The id of <sos/eos>: 2 in the recipe's dictionary (WeNet's own default without special_tokens,
            the last id, is not what the aishell recipe trains with).
        gradient_checkpointing: Recompute every encoder and decoder layer in backward (training only), as WeNet's
            encoder_conf / decoder_conf gradient_checkpointing (off in the aishell recipe).
    """

    def __init__(
        self,
        vocab_size: int = 4233,
        feat_dim: int = 80,
        output_size: int = 256,
        attention_heads: int = 4,
        linear_units: int = 2048,
        num_blocks: int = 12,
        decoder_blocks: int = 6,
        cnn_module_kernel: int = 15,
        dropout: float = 0.1,
        ctc_weight: float = 0.3,
        lsm_weight: float = 0.1,
        sos_eos: int = 2,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight must lie in [0, 1], got {ctc_weight}")
        if not 0 < sos_eos < vocab_size:
            raise ValueError(f"sos_eos {sos_eos} is not a token id of a {vocab_size}-token vocabulary (0 is <blank>)")
        self.sos = self.eos = sos_eos
        self.ctc_weight = ctc_weight
        self.lsm_weight = lsm_weight
        self.encoder = ConformerEncoder(
            feat_dim,
            output_size,
            attention_heads,
            linear_units,
            num_blocks,
            cnn_module_kernel,
            dropout,
            gradient_checkpointing,
        )
        self.decoder = TransformerDecoder(
            vocab_size, output_size, attention_heads, linear_units, decoder_blocks, dropout, gradient_checkpointing
        )
        self.ctc = CTC(vocab_size, output_size)

    def forward(
        self, feats: torch.Tensor, feat_lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Compute the training loss of a padded batch.

        Args:
            feats: Fbank features (B, T, feat_dim), T >= 7.
            feat_lengths: Real frame counts (B,).
            tokens: Token ids (B, L), padded with -1.
            token_lengths: Real token counts (B,).

        Returns:
            ``loss`` = ctc_weight * ``loss_ctc`` + (1 - ctc_weight) * ``loss_att``, each a per-utterance mean.
            A branch whose weight is 0 is skipped and reported as 0.
        """
        encoder_out, encoder_mask = self.encoder(feats, feat_lengths)
        zero = encoder_out.new_zeros((), dtype=torch.float32)
        loss_ctc = zero
        if self.ctc_weight > 0.0:
            loss_ctc = self.ctc(encoder_out, encoder_mask.sum(dim=1), tokens, token_lengths)
        loss_att = zero
        if self.ctc_weight < 1.0:
            loss_att = self._attention_loss(encoder_out, encoder_mask, tokens, token_lengths)
        loss = self.ctc_weight * loss_ctc + (1.0 - self.ctc_weight) * loss_att
        return {"loss": loss, "loss_ctc": loss_ctc, "loss_att": loss_att}

    def _attention_loss(
        self, encoder_out: torch.Tensor, encoder_mask: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor
    ) -> torch.Tensor:
        """Teacher-forced, label-smoothed decoder loss, summed over tokens and divided by the batch size."""
        ys_in, ys_out = self.add_sos_eos(tokens, token_lengths)
        logits = self.decoder(encoder_out, encoder_mask, ys_in, token_lengths + 1)
        return label_smoothing_loss(logits, ys_out, self.lsm_weight) / tokens.shape[0]

    def add_sos_eos(self, tokens: torch.Tensor, token_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return decoder inputs ``<sos> y`` (padded with <eos>) and targets ``y <eos>`` (padded with -1), (B, L+1)."""
        batch_size = tokens.shape[0]
        valid = padding_mask(token_lengths, tokens.shape[1])
        ys_in = torch.cat([tokens.new_full((batch_size, 1), self.sos), tokens.masked_fill(~valid, self.eos)], dim=1)
        ys_out = torch.cat([tokens.masked_fill(~valid, IGNORE_ID), tokens.new_full((batch_size, 1), IGNORE_ID)], dim=1)
        ys_out[torch.arange(batch_size, device=tokens.device), token_lengths] = self.eos
        return ys_in, ys_out
