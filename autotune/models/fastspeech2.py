"""FastSpeech 2 acoustic model (Ren et al., 2021) as ming024/FastSpeech2 builds it for LJSpeech.

Layout, parameter and buffer names and shapes follow ``model/fastspeech2.py``, ``model/modules.py`` and
``transformer/`` of ming024/FastSpeech2 with ``config/LJSpeech/model.yaml``, so a ming024 checkpoint loads with
``strict=True`` (tests/models/test_fastspeech2.py holds ming024's own state-dict layout and outputs, recorded at
ming024/FastSpeech2 d4e79eb): a 4-block FFT encoder and a 6-block FFT decoder (hidden 256,
2 heads, post-norm, a 1024-filter convolutional feed-forward with kernels [9, 1], dropout 0.2); a variance adaptor
with duration, pitch and energy predictors (two conv(k=3, 256) + ReLU + LayerNorm + dropout 0.5 layers and a linear
head each), phoneme-level pitch and energy quantised into 256 bins and embedded, and a length regulator; an 80-bin
mel linear and a 5-layer PostNet (512 channels, kernel 5, BatchNorm, tanh, dropout 0.5). The loss is
``model/loss.py``'s: L1 of the mel before and after the PostNet plus MSE of log(duration + 1), pitch and energy.

Parameter count. No total is published: the paper's "27M" (as espnet/espnet#2019 quotes it) is for its own
configuration, and ming024 prints its count at training time only. The total here is arithmetic over the LJSpeech
configuration, asserted in the tests and equal to the trainable parameters of ming024's own model:

- FFT block: attention 4 x (256*256 + 256) + LayerNorm 512 = 263,680; feed-forward conv 256->1024 k9 2,360,320
  + conv 1024->256 k1 262,400 + LayerNorm 512 = 2,623,232; block 2,886,912. Encoder 4 blocks 11,547,648, decoder
  6 blocks 17,321,472.
- Variance predictor: 2 x (conv 196,864 + LayerNorm 512) + linear 257 = 395,009; three of them 1,185,027. Pitch
  and energy embeddings 2 x 256 x 256 = 131,072.
- Mel linear 20,560. PostNet: conv 80->512 205,312 + BN 1,024; 3 x (conv 512->512 1,311,232 + BN 1,024);
  conv 512->80 204,880 + BN 160: 4,348,144.
- Symbol embedding: (symbols + 1) x 256, ming024's sizing (one spare row). ming024's table (text/symbols.py,
  `autotune.data.tts.SYMBOLS`) has 360 symbols, pinyin included even for LJSpeech: 361 x 256 = 92,416.
- Total 34,646,339 trainable parameters.

ming024 keeps the sinusoid tables (2 x 1 x 1001 x 256) and the pitch/energy bin boundaries (2 x 255) as frozen
``nn.Parameter``s, so its own printout (utils/model.py get_param_num, every parameter) says 35,159,361; here they are
persistent buffers: the same state-dict entries, and nothing trains them. The bin boundaries span the normalised
pitch and energy of the training set (ming024's stats.json, made by its preprocessing; `autotune.data.tts_features`).
The length regulator gathers frames in one indexing operation instead of ming024's per-token Python loop (same
result). As in ming024, the PostNet and the predictors' second convolution see padded positions; the loss masks
padding.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotune.models.attention import sinusoid_table

__all__ = ["FastSpeech2", "fastspeech2_loss", "length_regulate", "padding_mask"]


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, max_len) bool, True at padding (ming024's get_mask_from_lengths)."""
    return torch.arange(max_len, device=lengths.device).unsqueeze(0) >= lengths.unsqueeze(1)


def length_regulate(x: torch.Tensor, durations: torch.Tensor, max_len: int) -> torch.Tensor:
    """Repeat each token's vector (B, N, d) its duration (B, N) times, zero-padded to (B, max_len, d)."""
    ends = durations.long().cumsum(dim=1)  # frame t belongs to the first token whose end exceeds t
    frames = torch.arange(max_len, device=x.device).expand(x.shape[0], max_len)
    token = torch.searchsorted(ends, frames.contiguous(), right=True)
    valid = (frames < ends[:, -1:]).unsqueeze(-1)
    gathered = torch.gather(x, 1, token.clamp(max=x.shape[1] - 1).unsqueeze(-1).expand(-1, -1, x.shape[2]))
    return gathered * valid


class MultiHeadAttention(nn.Module):
    """Post-norm self-attention: LayerNorm(dropout(fc(attention)) + input); padding keys are masked."""

    def __init__(self, n_head: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.w_qs, self.w_ks, self.w_vs = (nn.Linear(d_model, d_model) for _ in range(3))
        self.layer_norm = nn.LayerNorm(d_model)  # before fc, as ming024 declares them (state-dict order)
        self.fc = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """Attend over (B, T, d) with ``pad`` (B, T) True at padding."""
        batch, length, width = x.shape

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(x).view(batch, length, self.n_head, -1).transpose(1, 2)

        attend = ~pad[:, None, None, :]
        context = F.scaled_dot_product_attention(heads(self.w_qs), heads(self.w_ks), heads(self.w_vs), attend)
        out = self.fc(context.transpose(1, 2).reshape(batch, length, width))
        return self.layer_norm(self.dropout(out) + x)


class PositionwiseFeedForward(nn.Module):
    """Conv1d(k1) -> ReLU -> Conv1d(k2), dropout, residual, LayerNorm."""

    def __init__(self, d_model: int, d_inner: int, kernel_size: tuple[int, int], dropout: float) -> None:
        super().__init__()
        self.w_1 = nn.Conv1d(d_model, d_inner, kernel_size[0], padding=(kernel_size[0] - 1) // 2)
        self.w_2 = nn.Conv1d(d_inner, d_model, kernel_size[1], padding=(kernel_size[1] - 1) // 2)
        self.layer_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.w_2(F.relu(self.w_1(x.transpose(1, 2)))).transpose(1, 2)
        return self.layer_norm(self.dropout(out) + x)


class FFTBlock(nn.Module):
    """Feed-forward Transformer block: self-attention and convolutional feed-forward, padding zeroed after each."""

    def __init__(self, d_model: int, n_head: int, d_inner: int, kernel_size: tuple[int, int], dropout: float) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, kernel_size, dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.slf_attn(x, pad).masked_fill(pad.unsqueeze(-1), 0.0)
        return self.pos_ffn(x).masked_fill(pad.unsqueeze(-1), 0.0)


class FFTStack(nn.Module):
    """Sinusoid positions (a fixed table of max_seq_len + 1 rows) plus a stack of FFT blocks; with ``n_symbols``, a
    symbol embedding (padding id 0) first: ming024's Encoder, else its Decoder."""

    position_enc: torch.Tensor  # a registered buffer (nn.Module.__getattr__ is typed Tensor | Module)

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_head: int,
        d_inner: int,
        kernel_size: tuple[int, int],
        dropout: float,
        max_seq_len: int,
        n_symbols: int | None = None,
    ) -> None:
        super().__init__()
        # (1, max_seq_len + 1, d_model) in float64 then float32, as ming024's numpy table: its checkpoints carry it.
        table = sinusoid_table(max_seq_len + 1, d_model, dtype=torch.float64)
        self.register_buffer("position_enc", table.unsqueeze(0))
        if n_symbols is not None:  # registered before the layers, as ming024 (state-dict order)
            self.src_word_emb = nn.Embedding(n_symbols, d_model, padding_idx=0)
        self.layer_stack = nn.ModuleList(
            FFTBlock(d_model, n_head, d_inner, kernel_size, dropout) for _ in range(n_layers)
        )

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > self.position_enc.shape[1]:
            raise ValueError(f"sequence of {x.shape[1]} exceeds max_seq_len {self.position_enc.shape[1] - 1}")
        x = x + self.position_enc[:, : x.shape[1]].to(x.dtype)
        for layer in self.layer_stack:
            x = layer(x, pad)
        return x


class Conv(nn.Module):
    """Conv1d with "same" padding under a ``conv`` attribute, as ming024's ``Conv``/``ConvNorm`` wrappers; over
    (B, T, C) sequences unless ``channels_first`` (the PostNet's layout)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, channels_first: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=(kernel_size - 1) // 2)
        self.channels_first = channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) if self.channels_first else self.conv(x.transpose(1, 2)).transpose(1, 2)


class VariancePredictor(nn.Module):
    """Duration, pitch or energy predictor: 2 x (conv k3 -> ReLU -> LayerNorm -> dropout), linear to a scalar."""

    def __init__(self, d_model: int, filter_size: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        layers: dict[str, nn.Module] = {}
        for index, width in enumerate((d_model, filter_size), start=1):
            layers[f"conv1d_{index}"] = Conv(width, filter_size, kernel_size)
            layers[f"relu_{index}"] = nn.ReLU()
            layers[f"layer_norm_{index}"] = nn.LayerNorm(filter_size)
            layers[f"dropout_{index}"] = nn.Dropout(dropout)
        self.conv_layer = nn.Sequential(OrderedDict(layers))
        self.linear_layer = nn.Linear(filter_size, 1)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """(B, N, d) -> (B, N), zero at padding."""
        return self.linear_layer(self.conv_layer(x)).squeeze(-1).masked_fill(pad, 0.0)


class Encoder(FFTStack):
    """Symbol embedding (padding id 0) followed by the FFT stack."""

    def __init__(self, n_symbols: int, n_layers: int, d_model: int, **fft: Any) -> None:
        super().__init__(n_layers, d_model, n_symbols=n_symbols, **fft)

    def forward(self, tokens: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return super().forward(self.src_word_emb(tokens), pad)


class VarianceAdaptor(nn.Module):
    """Predict duration, pitch and energy; add the embedded (quantised) targets; expand tokens to frames."""

    pitch_bins: torch.Tensor  # registered buffers (nn.Module.__getattr__ is typed Tensor | Module)
    energy_bins: torch.Tensor

    def __init__(
        self,
        d_model: int,
        filter_size: int,
        kernel_size: int,
        dropout: float,
        n_bins: int,
        pitch_range: tuple[float, float],
        energy_range: tuple[float, float],
    ) -> None:
        super().__init__()
        self.duration_predictor = VariancePredictor(d_model, filter_size, kernel_size, dropout)
        self.pitch_predictor = VariancePredictor(d_model, filter_size, kernel_size, dropout)
        self.energy_predictor = VariancePredictor(d_model, filter_size, kernel_size, dropout)
        # Persistent: ming024's checkpoints carry them (frozen parameters there), set from its stats.json.
        self.register_buffer("pitch_bins", torch.linspace(*pitch_range, n_bins - 1))
        self.register_buffer("energy_bins", torch.linspace(*energy_range, n_bins - 1))
        self.pitch_embedding = nn.Embedding(n_bins, d_model)
        self.energy_embedding = nn.Embedding(n_bins, d_model)

    def forward(
        self,
        x: torch.Tensor,
        pad: torch.Tensor,
        pitch: torch.Tensor,
        energy: torch.Tensor,
        durations: torch.Tensor,
        max_frames: int,
    ) -> dict[str, torch.Tensor]:
        """Teacher-forced (training) pass: targets are phoneme-level (B, N); returns frames and predictions."""
        log_duration = self.duration_predictor(x, pad)
        pitch_prediction = self.pitch_predictor(x, pad)
        x = x + self.pitch_embedding(torch.bucketize(pitch, self.pitch_bins))
        energy_prediction = self.energy_predictor(x, pad)
        x = x + self.energy_embedding(torch.bucketize(energy, self.energy_bins))
        return {
            "frames": length_regulate(x, durations, max_frames),
            "log_duration": log_duration,
            "pitch": pitch_prediction,
            "energy": energy_prediction,
        }


class PostNet(nn.Module):
    """Five Conv1d(k5) + BatchNorm layers, tanh on all but the last, dropout 0.5 after each."""

    def __init__(self, n_mels: int = 80, channels: int = 512, kernel_size: int = 5, n_layers: int = 5) -> None:
        super().__init__()
        widths = [n_mels, *([channels] * (n_layers - 1)), n_mels]
        self.convolutions = nn.ModuleList(
            nn.Sequential(Conv(i, o, kernel_size, channels_first=True), nn.BatchNorm1d(o))
            for i, o in zip(widths[:-1], widths[1:], strict=True)
        )

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """(B, T, n_mels) -> the residual to add to it."""
        x = mel.transpose(1, 2)
        for index, conv in enumerate(self.convolutions):
            x = conv(x)
            x = F.dropout(x if index == len(self.convolutions) - 1 else torch.tanh(x), 0.5, self.training)
        return x.transpose(1, 2)


class FastSpeech2(nn.Module):
    """FastSpeech 2 with ming024's LJSpeech defaults; ``forward`` is the teacher-forced training pass."""

    def __init__(
        self,
        *,
        n_symbols: int = 361,
        d_model: int = 256,
        encoder_layers: int = 4,
        decoder_layers: int = 6,
        n_head: int = 2,
        conv_filter_size: int = 1024,
        conv_kernel_size: tuple[int, int] = (9, 1),
        dropout: float = 0.2,
        variance_filter_size: int = 256,
        variance_kernel_size: int = 3,
        variance_dropout: float = 0.5,
        n_bins: int = 256,
        pitch_range: tuple[float, float] = (-4.0, 4.0),
        energy_range: tuple[float, float] = (-4.0, 4.0),
        n_mels: int = 80,
        postnet_channels: int = 512,
        max_seq_len: int = 1000,
    ) -> None:
        """Args mirror ming024's model.yaml; n_symbols is its embedding's rows (len(symbols) + 1); pitch/energy
        ranges bound the (normalised) values the bins cover: the minimum and maximum of ming024's stats.json."""
        super().__init__()
        fft: dict[str, Any] = {
            "d_model": d_model,
            "n_head": n_head,
            "d_inner": conv_filter_size,
            "max_seq_len": max_seq_len,
            "kernel_size": tuple(conv_kernel_size),
            "dropout": dropout,
        }
        self.encoder = Encoder(n_symbols, encoder_layers, **fft)
        self.variance_adaptor = VarianceAdaptor(
            d_model, variance_filter_size, variance_kernel_size, variance_dropout, n_bins, pitch_range, energy_range
        )
        self.decoder = FFTStack(decoder_layers, **fft)
        self.mel_linear = nn.Linear(d_model, n_mels)
        self.postnet = PostNet(n_mels, postnet_channels)

    def forward(
        self,
        tokens: torch.Tensor,
        token_lengths: torch.Tensor,
        mel_lengths: torch.Tensor,
        pitch: torch.Tensor,
        energy: torch.Tensor,
        durations: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """Predict mels from tokens (B, N) under phoneme-level targets; mel frames = durations summed."""
        src_pad = padding_mask(token_lengths, tokens.shape[1])
        max_frames = int(mel_lengths.max())
        mel_pad = padding_mask(mel_lengths, max_frames)
        x = self.encoder(tokens, src_pad)
        out = self.variance_adaptor(x, src_pad, pitch, energy, durations, max_frames)
        mel = self.mel_linear(self.decoder(out.pop("frames"), mel_pad))
        return {**out, "mel": mel, "postnet_mel": mel + self.postnet(mel), "src_pad": src_pad, "mel_pad": mel_pad}


def fastspeech2_loss(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """ming024's FastSpeech2Loss total: mel L1 + postnet mel L1 + MSE of log(d + 1), pitch and energy, unpadded."""
    src, frames = ~outputs["src_pad"], ~outputs["mel_pad"]
    target = batch["mels"][:, : frames.shape[1]].float()
    mel_l1 = F.l1_loss(outputs["mel"].float()[frames], target[frames])
    postnet_l1 = F.l1_loss(outputs["postnet_mel"].float()[frames], target[frames])
    duration = F.mse_loss(outputs["log_duration"].float()[src], torch.log(batch["durations"].float() + 1)[src])
    pitch = F.mse_loss(outputs["pitch"].float()[src], batch["pitch"][src])
    energy = F.mse_loss(outputs["energy"].float()[src], batch["energy"][src])
    return mel_l1 + postnet_l1 + duration + pitch + energy
