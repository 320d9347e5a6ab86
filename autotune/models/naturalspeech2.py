"""Amphion's NaturalSpeech2: a latent diffusion TTS model over EnCodec's residual codebook, and its training loss.

Follows open-mmlab/Amphion at commit d3de90f02e7f1c7dbc24b04d52fe1b8ef438effe: ``models/tts/naturalspeech2/ns2.py``
(the model), ``prior_encoder.py``, ``diffusion.py`` (``diffusion_type: diffusion``), ``ns2_loss.py`` and the loss
lines of ``NS2Trainer._train_step`` in ``ns2_trainer.py``, configured by ``config/ns2.json`` as
``egs/tts/NaturalSpeech2/exp_config_base.json`` overrides it. The blocks are in
`autotune.models.naturalspeech2_modules`. Names, shapes and order of the state dict are the reference's, so its
checkpoints load with ``strict=True``; tests/models/test_naturalspeech2.py holds the reference's layout and the loss
terms of its own code, recorded by tests/models/reference/make_naturalspeech2.py.

One training step, as the recipe runs it, on a batch whose prompt was already cut by the dataset (``clip_mode:
start``: the first 10-50 % of the phones and their frames become ``ref_code``, the rest the target):

* the codec codes (B, 16, T) and the prompt's (B, 16, T') are turned into 128-dim latents by the frozen codebook;
* the prompt encoder (on the linearly mapped prompt latent) gives the speaker frames, which 32 learned query tokens
  attend to; the text encoder (style-adaptive norms conditioned on the prompt) encodes the phones, the duration
  predictor predicts their log durations, the length regulator expands them by the true durations, the pitch
  predictor predicts the frames' log pitch, and the embedding of the true pitch's bucket is added: the prior;
* the diffusion draws t ~ U(0, 1) per item and noise, forms x_t of the VP SDE (beta 0.05-20) and the WaveNet
  predicts x0 from x_t, the prior, t and the query tokens; the noise follows from it;
* the loss is pitch L1 + duration L1 + x0 L1 + noise L1 x ``diff_noise_loss_lambda`` + the cross entropy of the
  codebook distances of the predicted latent against the codes of the true one x ``diff_ce_loss_lambda``.

The codebook is EnCodec 24 kHz's quantizer (32 levels, of which the recipe's 12 kbps uses 16) kept as buffers, as the
reference keeps it; here it starts random (step cost depends on its shapes only) and a checkpoint fills it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autotune.models.naturalspeech2_modules import (
    ConvPredictor,
    LengthRegulator,
    NS2TransformerEncoder,
    ResidualCodebook,
    WaveNet,
)

__all__ = [
    "NS2_BASE",
    "NS2_REDUCED",
    "NaturalSpeech2",
    "NaturalSpeech2Config",
    "NaturalSpeech2Losses",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class NaturalSpeech2Config:
    """NaturalSpeech2's settings: the model section of exp_config_base.json and the recipe's loss weights.

    One width, ``hidden_size``, serves the text and prompt encoders, the predictors, the WaveNet and the query tokens:
    the reference's modules only fit together when those keys agree (the recipe sets them all to 512).

    Args:
        latent_dim: Codec latent width (EnCodec's 128, which the reference's quantizer fixes); it must differ from
            hidden_size (the reference then maps the prompt latent by ``prompt_lin``, which its forward always calls).
        vocab_size: Phone symbols of the embedding (index 0 is padding).
        hidden_size: Width of every encoder, predictor, the WaveNet and the query tokens.
        encoder_layers: Text encoder layers. prompt_encoder_layers: Prompt encoder layers.
        encoder_heads, encoder_filter_size, encoder_kernel_size, encoder_dropout: Both encoders' attention heads,
            conv-FFN width and kernel and dropout (``encoder_head``, ``conv_filter_size``, ``conv_kernel_size``).
        predictor_layers, predictor_cross_attention_every, predictor_heads, predictor_dropout: Both predictors'
            ``conv_layers``, ``cross_attn_per_layer``, ``attn_head`` and ``drop_out``.
        duration_kernel_size, pitch_kernel_size: The predictors' conv kernels.
        pitch_min, pitch_max, pitch_bins: Pitch buckets, log-spaced (Hz).
        wavenet_layers, wavenet_cross_attention_every, wavenet_dilation_cycle, wavenet_heads: The diffusion WaveNet.
        beta_min, beta_max, sigma, noise_factor: The VP SDE of the diffusion.
        query_tokens, query_heads: The learned speaker queries and their attention.
        codec_levels: Codebooks the codec quantizer holds (EnCodec 24 kHz: 32, for 24 kbps; fixed by the reference).
        code_levels: Codebooks per frame of the recipe's codes (12 kbps: 16). The model reads as many levels as the
            batch's codes have, and the CE term searches as many; this is for whoever makes the data.
        codebook_size: Entries per codebook (EnCodec's 1024; fixed by the reference).
        max_positions: Rows of the encoders' sinusoid tables (hard-coded 5000 in the reference).
        diff_noise_loss_lambda, diff_ce_loss_lambda: Weights of the noise and CE terms (the ``train`` section).
    """

    latent_dim: int = 128
    vocab_size: int = 100
    hidden_size: int = 512
    encoder_layers: int = 6
    prompt_encoder_layers: int = 6
    encoder_heads: int = 8
    encoder_filter_size: int = 2048
    encoder_kernel_size: int = 9
    encoder_dropout: float = 0.2
    predictor_layers: int = 30
    predictor_cross_attention_every: int = 3
    predictor_heads: int = 8
    predictor_dropout: float = 0.5
    duration_kernel_size: int = 3
    pitch_kernel_size: int = 5
    pitch_min: float = 50.0
    pitch_max: float = 1100.0
    pitch_bins: int = 512
    wavenet_layers: int = 40
    wavenet_cross_attention_every: int = 3
    wavenet_dilation_cycle: int = 2
    wavenet_heads: int = 8
    beta_min: float = 0.05
    beta_max: float = 20.0
    sigma: float = 1.0
    noise_factor: float = 1.0
    query_tokens: int = 32
    query_heads: int = 8
    codec_levels: int = 32
    code_levels: int = 16
    codebook_size: int = 1024
    max_positions: int = 5000
    diff_noise_loss_lambda: float = 1.0
    diff_ce_loss_lambda: float = 0.5


NS2_BASE = NaturalSpeech2Config()
# The same code path, small enough for CPU tests: every kind of layer once or twice, two cross-attention layers in
# each predictor and the WaveNet, dilations 1 and 2, 4 code levels. The codebook stays EnCodec's 32 x 1024 x 128,
# which the reference builds whatever its configuration says.
NS2_REDUCED = NaturalSpeech2Config(
    vocab_size=20,
    hidden_size=32,
    encoder_layers=2,
    prompt_encoder_layers=2,
    encoder_heads=2,
    encoder_filter_size=64,
    encoder_kernel_size=5,
    predictor_layers=4,
    predictor_heads=2,
    pitch_bins=16,
    wavenet_layers=4,
    wavenet_heads=2,
    query_tokens=4,
    query_heads=2,
    code_levels=4,
)


@dataclass(frozen=True, slots=True)
class NaturalSpeech2Losses:
    """The terms ``NS2Trainer._train_step`` logs (under these names) and ``total``, the sum it back-propagates."""

    pitch_loss: torch.Tensor
    dur_loss: torch.Tensor
    diff_loss_x0: torch.Tensor
    diff_loss_noise: torch.Tensor
    diff_loss_ce: torch.Tensor
    total: torch.Tensor


def _predictor(config: NaturalSpeech2Config, kernel_size: int, mask_each_layer: bool) -> ConvPredictor:
    return ConvPredictor(
        input_size=config.hidden_size,
        filter_size=config.hidden_size,
        kernel_size=kernel_size,
        conv_layers=config.predictor_layers,
        cross_attn_per_layer=config.predictor_cross_attention_every,
        attn_head=config.predictor_heads,
        drop_out=config.predictor_dropout,
        mask_each_layer=mask_each_layer,
    )


class PriorEncoder(nn.Module):
    """Phones -> the frame-level prior: text encoder, duration and pitch predictors, length regulator, pitch
    embedding. Returns (prior (B, T, d), log durations (B, N), log pitch (B, T))."""

    pitch_bins: torch.Tensor

    def __init__(self, config: NaturalSpeech2Config) -> None:
        super().__init__()
        c = config
        self.enc_emb_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=0)
        nn.init.normal_(self.enc_emb_tokens.weight, 0.0, 1e-5)
        self.encoder = NS2TransformerEncoder(
            layers=c.encoder_layers,
            dim=c.hidden_size,
            heads=c.encoder_heads,
            filter_size=c.encoder_filter_size,
            kernel_size=c.encoder_kernel_size,
            dropout=c.encoder_dropout,
            use_cln=True,
            enc_emb_tokens=self.enc_emb_tokens,
            max_positions=c.max_positions,
        )
        self.duration_predictor = _predictor(c, c.duration_kernel_size, mask_each_layer=True)
        self.pitch_predictor = _predictor(c, c.pitch_kernel_size, mask_each_layer=False)
        self.length_regulator = LengthRegulator()
        bins = torch.linspace(math.log(c.pitch_min), math.log(c.pitch_max), c.pitch_bins - 1).exp()
        self.register_buffer("pitch_bins", bins)
        self.pitch_embedding = nn.Embedding(c.pitch_bins, c.hidden_size)

    def forward(
        self,
        phone_id: torch.Tensor,
        duration: torch.Tensor,
        pitch: torch.Tensor,
        phone_mask: torch.Tensor,
        mask: torch.Tensor,
        ref_emb: torch.Tensor,
        ref_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.encoder(phone_id, phone_mask, ref_emb)
        duration_log = self.duration_predictor(x, phone_mask, ref_emb, ref_mask)
        x = self.length_regulator(x, duration, max_len=pitch.shape[1])
        pitch_log = self.pitch_predictor(x, mask, ref_emb, ref_mask)
        x = x + self.pitch_embedding(torch.bucketize(pitch, self.pitch_bins))
        return x * mask.to(x.dtype)[:, :, None], duration_log, pitch_log


class Diffusion(nn.Module):
    """The VP-SDE diffusion around the WaveNet x0 estimator (``diff_estimator``)."""

    def __init__(self, config: NaturalSpeech2Config) -> None:
        super().__init__()
        self.beta_min, self.beta_max = config.beta_min, config.beta_max
        self.sigma, self.noise_factor = config.sigma, config.noise_factor
        self.diff_estimator = WaveNet(
            input_size=config.latent_dim,
            hidden_size=config.hidden_size,
            out_size=config.latent_dim,
            num_layers=config.wavenet_layers,
            cross_attn_per_layer=config.wavenet_cross_attention_every,
            dilation_cycle=config.wavenet_dilation_cycle,
            attn_head=config.wavenet_heads,
        )

    def cumulative_beta(self, time: torch.Tensor) -> torch.Tensor:
        return self.beta_min * time + 0.5 * (self.beta_max - self.beta_min) * time**2

    def forward(
        self, x0: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor, query: torch.Tensor, offset: float = 1e-5
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (x0 prediction, noise prediction, noise), each (B, latent, T).

        t is drawn by ``torch.rand(B)``, then the noise by ``torch.randn`` of x0's shape, in the reference's order, so
        that the same seed gives the same draws.
        """
        time = torch.rand(x0.shape[0], dtype=x0.dtype, device=x0.device).clamp(offset, 1.0 - offset)
        with torch.no_grad():
            cum_beta = self.cumulative_beta(time[:, None, None])
            mean = x0 * torch.exp(-0.5 * cum_beta / self.sigma**2)
            variance = self.sigma**2 * (1 - torch.exp(-cum_beta / self.sigma**2))
            noise = torch.randn(x0.shape, dtype=x0.dtype, device=x0.device)
            xt = mean + noise * torch.sqrt(variance) * self.noise_factor
        x0_pred = self.diff_estimator(xt, mask, cond, time, query)
        mean_pred = x0_pred * torch.exp(-0.5 * cum_beta / self.sigma**2)
        noise_pred = (xt - mean_pred) / (torch.sqrt(variance) * self.noise_factor)
        return x0_pred, noise_pred, noise


def _masked_l1(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    mask = mask.to(pred.dtype)
    return (F.l1_loss(pred, target, reduction="none").float() * mask).sum() / (mask.sum() + epsilon)


def _latent_l1(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``diff_loss``: L1 averaged over the latent channels, summed over real frames, divided by their count."""
    mask = mask.to(pred.dtype)
    loss = F.l1_loss(pred, target, reduction="none").float() * mask.unsqueeze(1)
    return loss.mean(dim=1).sum() / mask.sum()


def _codebook_ce(distances: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``diff_ce_loss``: CE of (levels, B, T, size) logits against (levels, B, T) codes, meaned over levels."""
    loss = F.cross_entropy(distances.permute(1, 3, 0, 2), codes.permute(1, 0, 2).long(), reduction="none").float()
    mask = mask.to(loss.dtype)
    return (loss * mask.unsqueeze(1)).mean(dim=1).sum() / mask.sum()


class NaturalSpeech2(nn.Module):
    """Amphion's NaturalSpeech2; ``forward`` is a training step's forward and loss (see the module docstring)."""

    def __init__(self, config: NaturalSpeech2Config = NS2_BASE) -> None:
        super().__init__()
        if config.latent_dim == config.hidden_size:
            raise ValueError("latent_dim must differ from hidden_size: the reference always applies prompt_lin")
        self.config = config
        self.prior_encoder = PriorEncoder(config)
        self.diffusion = Diffusion(config)
        self.prompt_encoder = NS2TransformerEncoder(
            layers=config.prompt_encoder_layers,
            dim=config.hidden_size,
            heads=config.encoder_heads,
            filter_size=config.encoder_filter_size,
            kernel_size=config.encoder_kernel_size,
            dropout=config.encoder_dropout,
            use_cln=False,
            max_positions=config.max_positions,
        )
        self.prompt_lin = nn.Linear(config.latent_dim, config.hidden_size)
        nn.init.normal_(self.prompt_lin.weight, 0.0, 0.02)
        self.query_emb = nn.Embedding(config.query_tokens, config.hidden_size)
        self.query_attn = nn.MultiheadAttention(config.hidden_size, config.query_heads, batch_first=True)
        self.quantizer = ResidualCodebook(config.codec_levels, config.codebook_size, config.latent_dim)
        self.quantizer.requires_grad_(False)

    def code_to_latent(self, code: torch.Tensor) -> torch.Tensor:
        """(B, levels, T) codec codes -> (B, latent_dim, T), without gradient."""
        return self.quantizer.decode(code)

    def speaker(self, ref_code: torch.Tensor, ref_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's encoded frames (B, T', d) and the query tokens that attended to them (B, Q, d)."""
        prompt = self.prompt_lin(self.code_to_latent(ref_code).transpose(1, 2))
        frames = self.prompt_encoder(prompt, ref_mask, None)
        queries = self.query_emb(torch.arange(self.config.query_tokens, device=frames.device)).repeat(
            frames.shape[0], 1, 1
        )
        queries, _ = self.query_attn(queries, frames, frames, key_padding_mask=~ref_mask.bool())
        return frames, queries

    def forward(
        self,
        code: torch.Tensor,
        pitch: torch.Tensor,
        duration: torch.Tensor,
        phone_id: torch.Tensor,
        ref_code: torch.Tensor,
        phone_mask: torch.Tensor,
        mask: torch.Tensor,
        ref_mask: torch.Tensor,
    ) -> NaturalSpeech2Losses:
        """The training step's loss on a collated batch (``NS2Collator``'s keys).

        Args:
            code: (B, code_levels, T) codec codes of the target, 0-padded.
            pitch: (B, T) pitch in Hz, padded with 50.
            duration: (B, N) integer frames per phone, 0-padded; each item's sum is its frame count.
            phone_id: (B, N) phone ids, 0-padded.
            ref_code: (B, code_levels, T') codes of the prompt, 0-padded.
            phone_mask, mask, ref_mask: (B, N), (B, T), (B, T'): 1 on real phones/frames, 0 on padding.
        """
        frames, queries = self.speaker(ref_code, ref_mask)
        prior, duration_log, pitch_log = self.prior_encoder(
            phone_id, duration, pitch, phone_mask, mask, frames, ref_mask
        )
        x0 = self.code_to_latent(code)
        x0_pred, noise_pred, noise = self.diffusion(x0, mask, prior, queries)

        pitch_loss = _masked_l1(pitch_log, torch.log(pitch), mask, epsilon=1e-8)
        dur_loss = _masked_l1(duration_log, torch.log(1 + duration), phone_mask)
        diff_loss_x0 = _latent_l1(x0_pred, x0, mask)
        diff_loss_noise = _latent_l1(noise_pred, noise, mask)
        diff_loss_ce = torch.zeros((), device=x0.device)
        if self.config.diff_ce_loss_lambda > 0:  # the trainer skips the two codebook searches otherwise
            _, distances = self.quantizer.distances(x0_pred, code.shape[1])
            true_codes, _ = self.quantizer.distances(x0, code.shape[1])
            diff_loss_ce = _codebook_ce(distances, true_codes, mask)
        total = (
            pitch_loss
            + dur_loss
            + diff_loss_x0
            + diff_loss_noise * self.config.diff_noise_loss_lambda
            + diff_loss_ce * self.config.diff_ce_loss_lambda
        )
        return NaturalSpeech2Losses(
            pitch_loss=pitch_loss,
            dur_loss=dur_loss,
            diff_loss_x0=diff_loss_x0,
            diff_loss_noise=diff_loss_noise,
            diff_loss_ce=diff_loss_ce,
            total=total,
        )
