"""GPT-SoVITS's s2 model: the SoVITS generator (``SynthesizerTrn``), the multi-period/scale discriminator, and the
losses of s2 training's discriminator and generator steps.

Follows RVC-Boss/GPT-SoVITS at commit 48b1a0169a28582a8984402f82cf438d3bfa6aca: ``GPT_SoVITS/module/models.py``
(SynthesizerTrn, TextEncoder, MultiPeriodDiscriminator), ``losses.py``, ``mel_processing.py``, ``commons.py`` and the
step of ``GPT_SoVITS/s2_train.py``, configured by ``GPT_SoVITS/configs/s2.json`` as v2. The building blocks are in
`autotune.models.gpt_sovits_s2_modules`. Submodule and parameter names, shapes and their order are the reference's,
so its ``net_g`` and ``net_d`` state dicts load with ``strict=True``. tests/models/test_gpt_sovits_s2.py holds the
reference's layouts and one recorded training step.

What the training forward does, as the reference's: the speaker embedding ``ge`` comes from the first 704 bins of
the linear spectrogram (no waveform); the SSL features pass ``ssl_proj`` (stride 2: 25 Hz) and the frozen codebook,
and are repeated back to 50 Hz; the text encoder runs the SSL and phone encoders, MRTE and a last encoder to the
prior (m_p, logs_p); the posterior encoder samples z from the spectrogram (torch's RNG); the flow maps z to z_p;
a random ``segment_frames`` window of z per item (torch's RNG) is decoded to audio.

Quirks of the reference kept here, since they are what the recipe trains:

* ``freeze_quantizer`` puts ``ssl_proj`` and the quantizer in eval mode but runs them with gradients on; in eval mode
  the quantizer returns the codebook entries themselves, so ``ssl_proj`` never gets a gradient (its 1,180,416
  parameters count as trainable and sit in the optimizer) and the commitment loss (``kl_ssl``) is exactly 0;
* a fresh codebook (``inited`` 0) is initialised by 50 k-means iterations on the first batch, even in eval mode:
  a one-off cost that draws from torch's RNG (a checkpoint with an initialised codebook carries ``inited`` 1);
* the reference encoder reads the spectrogram's first 704 bins, not a mel or the waveform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
import torchaudio
from torch import nn

from autotune.models.gpt_sovits_s2_discriminator import MultiPeriodDiscriminator
from autotune.models.gpt_sovits_s2_modules import (
    MRTE,
    AttentionEncoder,
    HifiGanGenerator,
    MelStyleEncoder,
    PosteriorEncoder,
    ResidualCouplingBlock,
)
from autotune.models.gpt_sovits_s2_quantizer import FrozenResidualQuantizer

__all__ = [
    "S2_REDUCED",
    "S2_REDUCED_STEP",
    "S2_V2",
    "S2_V2_STEP",
    "GeneratorLosses",
    "GeneratorOutput",
    "MultiPeriodDiscriminator",
    "S2StepConfig",
    "SynthesizerConfig",
    "SynthesizerTrn",
    "TextEncoder",
    "discriminator_loss",
    "feature_loss",
    "generator_adversarial_loss",
    "generator_losses",
    "kl_loss",
    "linear_spectrogram",
    "mel_from_linear",
    "mel_spectrogram",
    "slice_segments",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SynthesizerConfig:
    """net_g's settings: s2.json's ``model`` section, the spectrogram size, and the sizes the reference hard-codes.

    Args:
        spec_channels: Linear spectrogram bins, ``filter_length // 2 + 1``.
        segment_frames: Frames of z decoded per item, ``segment_size // hop_length``.
        inter_channels: Latent (z) channels.
        hidden_channels: Width of the encoders and the flow; MRTE's content width (hard-coded 192 there).
        filter_channels: FFN width of the transformer encoders.
        n_heads: Heads of the transformer encoders.
        n_layers: Layers of the phone encoder; the SSL encoder and the last encoder have half as many.
        kernel_size: FFN kernel of the transformer encoders.
        p_dropout: Dropout of the transformer encoders.
        resblock_kernel_sizes: HiFi-GAN ResBlock1 kernels (``resblock`` "1" is the only one the recipe uses).
        resblock_dilation_sizes: Their dilations, three per block.
        upsample_rates: HiFi-GAN upsampling factors; their product is the hop length.
        upsample_initial_channel: Width after ``conv_pre``, halved at each upsampling.
        upsample_kernel_sizes: Kernels of the transposed convolutions.
        gin_channels: Width of the speaker embedding ``ge``; MRTE adds it to its 512-wide hidden state.
        semantic_frame_rate: "25hz" (``ssl_proj`` of stride 2, codes repeated to 50 Hz) or "50hz".
        ssl_dim: SSL (cnhubert) feature width.
        codebook_size: Codes of the single RVQ codebook.
        kmeans_iters: k-means iterations of the codebook's first-batch initialisation.
        phone_vocab_size: Phone symbols (``len(symbols2)``; v1 has 322).
        ref_bins: Spectrogram bins the reference encoder reads (704 for v2).
        mrte_hidden: MRTE's attention width.
        mrte_heads: MRTE's attention heads.
        posterior_layers: WaveNet layers of enc_q.
        posterior_kernel_size: Their kernel.
        flow_layers: WaveNet layers in each coupling layer.
        flow_kernel_size: Their kernel.
        n_flows: Coupling layers of the flow.
    """

    spec_channels: int = 1025
    segment_frames: int = 32
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    p_dropout: float = 0.1
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (10, 8, 2, 2, 2)
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8, 2, 2)
    gin_channels: int = 512
    semantic_frame_rate: str = "25hz"
    ssl_dim: int = 768
    codebook_size: int = 1024
    kmeans_iters: int = 50
    phone_vocab_size: int = 732
    ref_bins: int = 704
    mrte_hidden: int = 512
    mrte_heads: int = 4
    posterior_layers: int = 16
    posterior_kernel_size: int = 5
    flow_layers: int = 4
    flow_kernel_size: int = 5
    n_flows: int = 4

    def __post_init__(self) -> None:
        if self.semantic_frame_rate not in ("25hz", "50hz"):
            raise ValueError(f"semantic_frame_rate {self.semantic_frame_rate!r} is not '25hz' or '50hz'")
        if self.ref_bins > self.spec_channels:
            raise ValueError(f"ref_bins {self.ref_bins} exceeds the {self.spec_channels} spectrogram bins")
        if self.gin_channels != self.mrte_hidden:
            raise ValueError(f"gin_channels {self.gin_channels} must equal mrte_hidden {self.mrte_hidden}")
        if self.hidden_channels % self.n_heads or self.mrte_hidden % self.mrte_heads:
            raise ValueError("the attention widths must be divisible by their heads")
        if any(len(dilations) != 3 for dilations in self.resblock_dilation_sizes):
            raise ValueError("ResBlock1 takes three dilations per block")

    @property
    def hop_length(self) -> int:
        """Samples per spectrogram frame: the product of the upsampling rates."""
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop


@dataclass(frozen=True, kw_only=True, slots=True)
class S2StepConfig:
    """What the training step reads besides the models: s2.json's ``data`` STFT/mel settings and ``train`` loss
    weights. ``mel_fmax`` None is half the sampling rate, as librosa takes it."""

    sampling_rate: int = 32000
    filter_length: int = 2048
    hop_length: int = 640
    win_length: int = 2048
    n_mel_channels: int = 128
    mel_fmin: float = 0.0
    mel_fmax: float | None = None
    segment_size: int = 20480
    c_mel: float = 45.0
    c_kl: float = 1.0
    periods: tuple[int, ...] = (2, 3, 5, 7, 11)


S2_V2 = SynthesizerConfig()
"""s2.json for v2: 51,310,080 parameters in net_g (1,180,416 of them, ``ssl_proj``, never get a gradient)."""

S2_V2_STEP = S2StepConfig()
"""s2.json's data and loss settings; net_d with these periods has 46,747,132 parameters."""

S2_REDUCED = SynthesizerConfig(
    segment_frames=8,
    inter_channels=16,
    filter_channels=64,
    n_layers=2,
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
    upsample_rates=(8, 4, 4),
    upsample_initial_channel=32,
    upsample_kernel_sizes=(16, 8, 8),
    kmeans_iters=50,
)
"""The same code path, shorter and narrower where the reference lets its config choose (the widths it hard-codes,
hidden 192, SSL 768, codebook 1024, MRTE 512, the 704 reference bins, stay), for CPU tests: hop 128."""

S2_REDUCED_STEP = S2StepConfig(hop_length=128, n_mel_channels=20, segment_size=1024)
"""The reduced step: 2048-point STFT at hop 128, 20 mels, 8-frame (1024-sample) segments."""


class TextEncoder(nn.Module):
    """enc_p: SSL codes and phones to the prior's mean and log-scale, conditioned on ``ge`` through MRTE."""

    def __init__(self, config: SynthesizerConfig) -> None:
        super().__init__()
        hidden = config.hidden_channels
        self.out_channels = config.inter_channels

        def encoder(layers: int) -> AttentionEncoder:
            return AttentionEncoder(
                hidden, config.filter_channels, config.n_heads, layers, config.kernel_size, config.p_dropout
            )

        self.ssl_proj = nn.Conv1d(config.ssl_dim, hidden, 1)
        self.encoder_ssl = encoder(config.n_layers // 2)
        self.encoder_text = encoder(config.n_layers)
        self.text_embedding = nn.Embedding(config.phone_vocab_size, hidden)
        self.mrte = MRTE(hidden, config.mrte_hidden, config.mrte_heads)
        self.encoder2 = encoder(config.n_layers // 2)
        self.proj = nn.Conv1d(hidden, config.inter_channels * 2, 1)

    def forward(
        self,
        ssl: torch.Tensor,
        ssl_mask: torch.Tensor,
        text: torch.Tensor,
        text_lengths: torch.Tensor,
        ge: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, ssl_dim, T) quantized SSL features under (B, 1, T) ``ssl_mask``, (B, Tp) phone ids -> m_p, logs_p."""
        y = self.encoder_ssl(self.ssl_proj(ssl * ssl_mask) * ssl_mask, ssl_mask)
        text_mask = _sequence_mask(text_lengths, text.shape[1]).to(y.dtype)
        text_hidden = self.encoder_text(self.text_embedding(text).transpose(1, 2) * text_mask, text_mask)
        y = self.encoder2(self.mrte(y, ssl_mask, text_hidden, text_mask, ge) * ssl_mask, ssl_mask)
        stats = self.proj(y) * ssl_mask
        m_p, logs_p = stats.split(self.out_channels, dim=1)
        return m_p, logs_p


class GeneratorOutput(NamedTuple):
    """What s2_train.py takes from net_g's forward (the reference returns them as a tuple in this order)."""

    audio: torch.Tensor  # (B, 1, segment_frames * hop) decoded from the z window
    kl_ssl: torch.Tensor  # the quantizer's commitment loss: 0 with the frozen quantizer
    ids_slice: torch.Tensor  # (B,) first frame of each item's window
    y_mask: torch.Tensor  # (B, 1, T) spectrogram frame mask (the reference returns it twice: x_mask and z_mask)
    z: torch.Tensor
    z_p: torch.Tensor
    m_p: torch.Tensor
    logs_p: torch.Tensor
    m_q: torch.Tensor
    logs_q: torch.Tensor
    quantized: torch.Tensor  # stats_ssl, the codes' features at 50 Hz


class SynthesizerTrn(nn.Module):
    """net_g, GPT-SoVITS v2's SoVITS generator, with its training forward.

    Args:
        config: The architecture; ``S2_V2`` is s2.json.
    """

    def __init__(self, config: SynthesizerConfig = S2_V2) -> None:
        super().__init__()
        self.config = config
        c = config
        self.enc_p = TextEncoder(config)
        self.dec = HifiGanGenerator(
            c.inter_channels,
            c.resblock_kernel_sizes,
            c.resblock_dilation_sizes,
            c.upsample_rates,
            c.upsample_initial_channel,
            c.upsample_kernel_sizes,
            c.gin_channels,
        )
        self.enc_q = PosteriorEncoder(
            c.spec_channels, c.inter_channels, c.hidden_channels, c.posterior_kernel_size, c.posterior_layers,
            c.gin_channels,
        )  # fmt: skip
        self.flow = ResidualCouplingBlock(
            c.inter_channels, c.hidden_channels, c.flow_kernel_size, c.flow_layers, c.n_flows, c.gin_channels
        )
        self.ref_enc = MelStyleEncoder(c.ref_bins, c.gin_channels)
        stride = 2 if c.semantic_frame_rate == "25hz" else 1
        self.ssl_proj = nn.Conv1d(c.ssl_dim, c.ssl_dim, stride, stride=stride)
        self.quantizer = FrozenResidualQuantizer(c.ssl_dim, c.codebook_size, c.kmeans_iters)

    def forward(
        self,
        ssl: torch.Tensor,
        spec: torch.Tensor,
        spec_lengths: torch.Tensor,
        text: torch.Tensor,
        text_lengths: torch.Tensor,
    ) -> GeneratorOutput:
        """The training forward on a collated batch, as s2_train.py calls it.

        Args:
            ssl: (B, ssl_dim, T) cnhubert features at 50 Hz, zero-padded to the spectrogram's width T (even).
            spec: (B, spec_channels, T) linear magnitude spectrograms, zero-padded.
            spec_lengths: (B,) frames per item, each at least ``segment_frames``.
            text: (B, Tp) phone ids, zero-padded.
            text_lengths: (B,) phones per item.

        Draws from torch's RNG in the reference's order: the codebook's k-means initialisation (first call only),
        the posterior's noise, then the windows' starts (and dropout, in training mode, in between).
        """
        y_mask = _sequence_mask(spec_lengths, spec.shape[2]).to(spec.dtype)
        ge = self.ref_enc(spec[:, : self.config.ref_bins] * y_mask, y_mask)
        with torch.autocast(device_type=ssl.device.type, enabled=False):
            quantized, _, kl_ssl = self.quantizer(self.ssl_proj(ssl))
        if self.config.semantic_frame_rate == "25hz":
            quantized = F.interpolate(quantized, size=quantized.shape[-1] * 2, mode="nearest")
        ssl_mask = _sequence_mask(spec_lengths, quantized.shape[2]).to(quantized.dtype)
        m_p, logs_p = self.enc_p(quantized, ssl_mask, text, text_lengths, ge)
        z, m_q, logs_q = self.enc_q(spec, y_mask, ge)
        z_p = self.flow(z, y_mask, ge)
        starts = (torch.rand(z.shape[0]).to(z.device) * (spec_lengths - self.config.segment_frames + 1)).long()
        audio = self.dec(slice_segments(z, starts, self.config.segment_frames), ge)
        return GeneratorOutput(audio, kl_ssl, starts, y_mask, z, z_p, m_p, logs_p, m_q, logs_q, quantized)


def _sequence_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, 1, width), True on the first ``lengths`` positions."""
    return (torch.arange(width, device=lengths.device) < lengths.unsqueeze(1)).unsqueeze(1)


def slice_segments(x: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """x[i, :, starts[i] : starts[i] + length] for each item i of (B, C, T)."""
    return torch.stack([x[i, :, int(start) : int(start) + length] for i, start in enumerate(starts)])


def linear_spectrogram(wav: torch.Tensor, step: S2StepConfig) -> torch.Tensor:
    """mel_processing's magnitude STFT of (B, samples): reflect-padded by (n_fft - hop) / 2 each side, no centering,
    Hann window, sqrt(re^2 + im^2 + 1e-8). (B, n_fft // 2 + 1, frames)."""
    pad = (step.filter_length - step.hop_length) // 2
    wav = F.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(step.win_length, dtype=wav.dtype, device=wav.device)
    spectrum = torch.stft(
        wav, step.filter_length, step.hop_length, step.win_length, window, center=False, return_complex=True
    )
    return torch.sqrt(torch.view_as_real(spectrum).pow(2).sum(-1) + 1e-8)


def mel_from_linear(spec: torch.Tensor, step: S2StepConfig) -> torch.Tensor:
    """log(max(mel filterbank @ spec, 1e-5)) with librosa's default (Slaney) mel filters, as ``spec_to_mel_torch``."""
    filters = torchaudio.functional.melscale_fbanks(
        step.filter_length // 2 + 1,
        step.mel_fmin,
        step.mel_fmax if step.mel_fmax is not None else step.sampling_rate / 2,
        step.n_mel_channels,
        step.sampling_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.log(torch.clamp(filters.t().to(spec) @ spec, min=1e-5))


def mel_spectrogram(wav: torch.Tensor, step: S2StepConfig) -> torch.Tensor:
    """``mel_spectrogram_torch`` of (B, samples): `mel_from_linear` of `linear_spectrogram`."""
    return mel_from_linear(linear_spectrogram(wav, step), step)


def discriminator_loss(real_scores: list[torch.Tensor], fake_scores: list[torch.Tensor]) -> torch.Tensor:
    """LSGAN discriminator loss: sum over discriminators of mean((1 - real)^2) + mean(fake^2), in float32."""
    total = torch.zeros((), device=real_scores[0].device)
    for real, fake in zip(real_scores, fake_scores, strict=True):
        total = total + torch.mean((1 - real.float()) ** 2) + torch.mean(fake.float() ** 2)
    return total


def generator_adversarial_loss(fake_scores: list[torch.Tensor]) -> torch.Tensor:
    """LSGAN generator loss: sum over discriminators of mean((1 - fake)^2)."""
    return sum(
        (torch.mean((1 - fake.float()) ** 2) for fake in fake_scores), torch.zeros((), device=fake_scores[0].device)
    )


def feature_loss(real_maps: list[list[torch.Tensor]], fake_maps: list[list[torch.Tensor]]) -> torch.Tensor:
    """Feature matching: 2 x the sum of mean |real - fake| over every feature map, the real ones detached."""
    total = torch.zeros((), device=real_maps[0][0].device)
    for real_layers, fake_layers in zip(real_maps, fake_maps, strict=True):
        for real, fake in zip(real_layers, fake_layers, strict=True):
            total = total + torch.mean(torch.abs(real.float().detach() - fake.float()))
    return total * 2


def kl_loss(
    z_p: torch.Tensor, logs_q: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """VITS's KL term: sum over real frames of logs_p - logs_q - 1/2 + (z_p - m_p)^2 exp(-2 logs_p) / 2, per frame
    and channel."""
    z_p, logs_q, m_p, logs_p, mask = (t.float() for t in (z_p, logs_q, m_p, logs_p, mask))
    kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p) ** 2 * torch.exp(-2.0 * logs_p)
    return torch.sum(kl * mask) / torch.sum(mask)


class GeneratorLosses(NamedTuple):
    """The generator step's terms as s2_train.py sums them into ``loss_gen_all`` (mel and KL already weighted)."""

    total: torch.Tensor
    adversarial: torch.Tensor  # loss_gen
    feature_matching: torch.Tensor  # loss_fm
    mel: torch.Tensor  # loss_mel, L1 x c_mel
    kl_ssl: torch.Tensor  # the commitment loss, weight 1
    kl: torch.Tensor  # loss_kl, x c_kl


def generator_losses(
    output: GeneratorOutput,
    spec: torch.Tensor,
    fake_scores: list[torch.Tensor],
    real_maps: list[list[torch.Tensor]],
    fake_maps: list[list[torch.Tensor]],
    step: S2StepConfig,
) -> GeneratorLosses:
    """The generator step's loss from net_g's output and net_d's second pass on (real, generated) audio.

    The target mel is the input spectrogram's (``spec_to_mel_torch``) sliced at the same windows; the generated
    mel is computed from the generated audio (``mel_spectrogram_torch``).
    """
    segment_frames = step.segment_size // step.hop_length
    target_mel = slice_segments(mel_from_linear(spec, step), output.ids_slice, segment_frames)
    generated_mel = mel_spectrogram(output.audio.squeeze(1), step)
    mel = F.l1_loss(target_mel.float(), generated_mel.float()) * step.c_mel
    kl = kl_loss(output.z_p, output.logs_q, output.m_p, output.logs_p, output.y_mask) * step.c_kl
    feature_matching = feature_loss(real_maps, fake_maps)
    adversarial = generator_adversarial_loss(fake_scores)
    total = adversarial + feature_matching + mel + output.kl_ssl * 1 + kl
    return GeneratorLosses(total, adversarial, feature_matching, mel, output.kl_ssl, kl)
