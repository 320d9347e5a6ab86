"""SpeechBrain's CommonVoice wav2vec2 CTC ASR model, as its recipe trains it.

The recipe is ``recipes/CommonVoice/ASR/CTC/train_with_wav2vec.py`` with ``hparams/train_fr_with_wav2vec.yaml``
(speechbrain/speechbrain 9c826ef; the modules, the wrapper's forward and ``ctc_loss`` are the same at v1.0.0,
a8b67d9). Its ``modules`` are:

* ``wav2vec2``: ``speechbrain.integrations.huggingface.wav2vec2.Wav2Vec2`` around transformers' ``Wav2Vec2Model``
  from ``LeBenchmark/wav2vec2-FR-7K-large`` (here `autotune.models.wav2vec2`, randomly initialised from that model's
  configuration). With the yaml's ``freeze: False``, ``freeze_feature_extractor: False`` and ``output_norm: False``
  the wrapper layer-normalises each padded waveform over time when the model's ``preprocessor_config.json`` says
  ``do_normalize`` (``normalize_wav``; true in LeBenchmark's large models' files read, 3K-large's among them),
  turns transformers' SpecAugment off, and passes a padding mask made from SpeechBrain's relative lengths;
* ``enc``: three [Linear 1024, BatchNorm1d, LeakyReLU] blocks, dropout 0.15 after the first two only;
* ``ctc_lin``: a Linear to the 76 output tokens (``output_neurons``, blank 0),

then a float32 log-softmax and ``speechbrain.nnet.losses.ctc_loss``: lengths relative, ``reduction="mean"``
(each utterance's loss over its target length, averaged), ``zero_infinity``. State-dict keys are those of the
recipe's ``modules`` dict (``wav2vec2.model.<transformers key>``, ``enc.linear1.w.weight``, ``enc.bn1.norm.*``,
``ctc_lin.w.weight``); SpeechBrain's checkpointer saves ``wav2vec2.ckpt`` with keys ``model.<transformers key>``
(prefix ``wav2vec2.``) and ``model.ckpt`` as the ``[enc, ctc_lin]`` list (``0.`` -> ``enc.``, ``1.`` -> ``ctc_lin.``).
tests/models/reference/wav2vec2_ctc.json holds the reference's state-dict layout and outputs, recorded from
SpeechBrain's and transformers' own code, and tests/models/test_wav2vec2_ctc.py compares them. Full size:
318,671,564 trainable parameters (encoder 315,438,720, ``enc`` 3,154,944, ``ctc_lin`` 77,900).

Not part of the model: the recipe's waveform augmentation (speed perturbation, frequency and chunk drop, run on
the batch before ``wav2vec2``), and its optimisers (Adadelta for ``enc``/``ctc_lin``, Adam for ``wav2vec2``, which
is not stepped for the first 500 steps while its gradients are still computed).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from autotune.models.wav2vec2 import Wav2Vec2Config, Wav2Vec2Model


@dataclass(frozen=True, kw_only=True, slots=True)
class Wav2Vec2CTCConfig:
    """The encoder's configuration and the recipe's head and wrapper settings; the defaults are the recipe's."""

    encoder: Wav2Vec2Config = field(default_factory=Wav2Vec2Config)
    dnn_neurons: int = 1024
    output_neurons: int = 76
    dropout: float = 0.15
    blank_index: int = 0
    normalize_wav: bool = True
    freeze: bool = False
    freeze_feature_extractor: bool = False


# The same code path at a size a CPU test runs in a second: two narrow layers, three feature convolutions (20x
# downsampling), an even positional kernel; no dropout or layerdrop, so a training-mode forward is deterministic.
REDUCED_CONFIG = Wav2Vec2CTCConfig(
    encoder=Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        conv_kernel=(10, 3, 3),
        conv_stride=(5, 2, 2),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        layerdrop=0.0,
    ),
    dnn_neurons=24,
    output_neurons=10,
    dropout=0.0,
)


def sample_mask(wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
    """(B, samples) True at real samples, from SpeechBrain's relative lengths (rounded, as its padding mask)."""
    lengths = torch.round(wav_lens * wavs.shape[1])
    return torch.arange(wavs.shape[1], device=wavs.device) < lengths.unsqueeze(1)


class SpeechBrainWav2Vec2(nn.Module):
    """What SpeechBrain's HuggingFace wrapper adds around the encoder: normalisation, padding mask, freezing."""

    def __init__(self, config: Wav2Vec2CTCConfig) -> None:
        super().__init__()
        self.normalize_wav = config.normalize_wav
        self.freeze = config.freeze
        self.model = Wav2Vec2Model(config.encoder)
        if config.freeze:
            self.model.requires_grad_(False)
        elif config.freeze_feature_extractor:
            self.model.feature_extractor.requires_grad_(False)

    def forward(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze):
            mask = sample_mask(wavs, wav_lens)
            if self.normalize_wav:
                # Over each whole padded row, padding included, as the wrapper does.
                wavs = F.layer_norm(wavs, wavs.shape[1:])
            return self.model(wavs, mask)


class Linear(nn.Module):
    """``speechbrain.nnet.linear.Linear``: an ``nn.Linear`` kept as ``w``."""

    def __init__(self, input_size: int, n_neurons: int) -> None:
        super().__init__()
        self.w = nn.Linear(input_size, n_neurons)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x)


class BatchNorm1d(nn.Module):
    """``speechbrain.nnet.normalization.BatchNorm1d`` on (B, T, C): statistics over batch and time, padding included."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, -1)).transpose(1, -1)


def dnn_head(input_size: int, neurons: int, dropout: float) -> nn.Sequential:
    """The yaml's ``enc``: its entries' names, so its keys are SpeechBrain's (``linear1.w.weight``, ``bn1.norm.*``)."""
    blocks: list[tuple[str, nn.Module]] = []
    for index, suffix in enumerate(("", "2", "3"), start=1):
        blocks += [
            (f"linear{index}", Linear(input_size if index == 1 else neurons, neurons)),
            (f"bn{index}", BatchNorm1d(neurons)),
            (f"activation{suffix}", nn.LeakyReLU()),
        ]
        if index < 3:
            blocks.append((f"drop{suffix}", nn.Dropout(dropout)))
    return nn.Sequential(OrderedDict(blocks))


def ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lens: torch.Tensor,
    target_lens: torch.Tensor,
    blank_index: int = 0,
) -> torch.Tensor:
    """``speechbrain.nnet.losses.ctc_loss`` with its default ``reduction="mean"``.

    Args:
        log_probs: (B, T, vocabulary) log-probabilities.
        targets: (B, L) padded token ids, no blanks.
        input_lens: Relative lengths of the inputs (1.0 for the longest), as SpeechBrain batches carry them.
        target_lens: Relative lengths of the targets.
        blank_index: The blank token.

    Returns:
        The mean over the batch of each utterance's loss divided by its target length; impossible alignments add 0.
    """
    frames = torch.round(input_lens * log_probs.shape[1]).int()
    tokens = torch.round(target_lens * targets.shape[1]).int()
    return F.ctc_loss(
        log_probs.transpose(0, 1), targets, frames, tokens, blank=blank_index, reduction="mean", zero_infinity=True
    )


class Wav2Vec2CTC(nn.Module):
    """The recipe's modules: ``wav2vec2``, ``enc``, ``ctc_lin``.

    Args:
        config: The sizes; the default is the recipe's (LeBenchmark wav2vec2-FR-7K-large, 76 tokens).
    """

    def __init__(self, config: Wav2Vec2CTCConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or Wav2Vec2CTCConfig()
        self.wav2vec2 = SpeechBrainWav2Vec2(config)
        self.enc = dnn_head(config.encoder.hidden_size, config.dnn_neurons, config.dropout)
        self.ctc_lin = Linear(config.dnn_neurons, config.output_neurons)

    def forward(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        """The recipe's compute_forward after augmentation: (B, samples) waveforms to (B, frames, tokens) float32
        log-probabilities. ``wav_lens`` are relative lengths; the frames' relative lengths are the same."""
        logits = self.ctc_lin(self.enc(self.wav2vec2(wavs, wav_lens)))
        return F.log_softmax(logits, dim=-1, dtype=torch.float32)

    def loss(
        self, log_probs: torch.Tensor, tokens: torch.Tensor, wav_lens: torch.Tensor, token_lens: torch.Tensor
    ) -> torch.Tensor:
        """The recipe's compute_objectives in training: the CTC loss with relative lengths."""
        return ctc_loss(log_probs, tokens, wav_lens, token_lens, self.config.blank_index)
