"""TTS training items as ming024/FastSpeech2 (LJSpeech) uses them: symbol ids, log-mel, pitch, energy, durations.

ming024 computes its targets offline (``preprocessor/preprocessor.py``) and its DataLoader only loads ``.npy`` files:
`autotune.data.tts_features` does the same (the workload's default), computing each utterance with `TtsFeaturizer`
once per corpus; `TtsDataset` computes them in ``__getitem__`` instead, in DataLoader workers, for pipelines that do.
The targets, after ming024's preprocess.yaml for LJSpeech:

- audio resampled to 22,050 Hz when the file has another rate (LJSpeech is 22.05 kHz; the embedded corpus is 16 kHz).
  The recipe's rate and hop set the frame rate, 86.1 mel frames per second, and so the decoder's sequence length:
  computing at 16 kHz with the same hop would feed the model 27 % fewer frames and understate its cost per step.
- STFT as ming024's TacotronSTFT: Hann window 1024, hop 256, reflect-centred; magnitude -> 80 Slaney mel bands
  (0-8000 Hz) -> natural log clamped at 1e-5. Energy: the L2 norm of each magnitude frame, as ming024.
- Pitch: ming024 runs WORLD (pyworld dio + stonemask), too slow and not installed here. The stand-in is the classic
  cepstral estimator (Noll 1967) on the same STFT frames, one inverse FFT of the log magnitude: the highest local
  cepstral peak between the periods of 800 and 71 Hz (WORLD's default range) gives F0; frames whose peak is below
  0.1 are unvoiced and, as in ming024, interpolated linearly; a 5-frame median removes isolated octave jumps. (An
  autocorrelation estimator locks onto the first formant of the synthetic voices; the cepstrum separates the two.)
- Durations: ming024 reads Montreal Forced Aligner alignments; none exist here. Frames are spread evenly over the
  tokens (their counts differ by at most one and sum to the mel length). This is a throughput stand-in: what the
  tuner measures is the cost of a step, and a real alignment changes which frames a token gets, not that cost.
- Pitch and energy averaged per token ("phoneme_level", the LJSpeech config), then normalised: over the corpus
  when precomputed (as ming024), per utterance on the fly.

Text becomes ids with ming024's symbol table (``text/symbols.py``: keithito's characters, ARPAbet, pinyin, silences;
360 symbols, the model's embedding one row more): ``{HH AH0 L OW1}`` spans are phonemes, as ming024's own
transcripts; other text is lower-cased characters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torchaudio.functional as AF
from torch.nn.utils.rnn import pad_sequence

from autotune.data.audio import AudioReader, read_segment
from autotune.data.sources import Utterance

__all__ = [
    "SYMBOLS",
    "MelConfig",
    "TtsDataset",
    "TtsFeaturizer",
    "collate_tts_batch",
    "even_durations",
    "mel_frames",
    "text_to_ids",
    "usable_for_tts",
]

_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
_ARPABET = sorted([v + stress for v in _VOWELS for stress in ("", "0", "1", "2")] + _CONSONANTS)  # cmudict's 84
# ming024's text/pinyin.py: 23 initials, 37 finals in five tones each, and the erhua "rr": 209 phones. Its LJSpeech
# model never reads them, but they are part of its symbol table, so of its embedding (and of its checkpoints).
_PINYIN_INITIALS = "b c ch d f g h j k l m n p q r s sh t w x y z zh".split()
_PINYIN_FINALS = (
    "a ai an ang ao e ei en eng er i ia ian iang iao ie ii iii in ing iong iou o ong ou u ua uai uan uang uei uen uo "
    "v van ve vn"
).split()
_PINYIN = [*_PINYIN_INITIALS, *(final + tone for final in _PINYIN_FINALS for tone in "12345"), "rr"]
SYMBOLS = (
    "_",  # padding, id 0
    "-",
    *"!'(),.:;? ",
    *"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    *("@" + phone for phone in _ARPABET),
    *("@" + phone for phone in _PINYIN),
    "@sp",
    "@spn",
    "@sil",
)
_ID = {symbol: index for index, symbol in enumerate(SYMBOLS)}
_BRACES = re.compile(r"\{([^}]*)\}")
_WHITESPACE = re.compile(r"\s+")


def text_to_ids(text: str) -> list[int]:
    """Symbol ids of a transcript: ``{...}`` spans as ARPAbet phones, the rest as lower-cased known characters."""
    ids: list[int] = []
    for index, part in enumerate(_BRACES.split(text)):
        if index % 2:  # inside braces
            ids += [_ID[f"@{phone}"] for phone in part.split() if f"@{phone}" in _ID]
        else:
            ids += [_ID[ch] for ch in _WHITESPACE.sub(" ", part.lower()) if ch in _ID]
    return ids


def even_durations(num_frames: int, num_tokens: int) -> torch.Tensor:
    """Frames per token, spread evenly: counts differ by at most one and sum to num_frames."""
    edges = torch.arange(num_tokens + 1, dtype=torch.int64) * num_frames // num_tokens
    return edges[1:] - edges[:-1]


@dataclass(frozen=True, kw_only=True, slots=True)
class MelConfig:
    """ming024's LJSpeech preprocess.yaml audio settings, plus the pitch estimator's search range."""

    sample_rate: int = 22050
    n_fft: int = 1024
    hop_length: int = 256
    n_mels: int = 80
    f_min_hz: float = 0.0
    f_max_hz: float = 8000.0
    f0_min_hz: float = 71.0
    f0_max_hz: float = 800.0
    voicing_threshold: float = 0.1  # cepstral peak height (natural-log magnitude units)

    def num_frames(self, num_samples: int) -> int:
        """STFT frames of a reflect-centred transform."""
        return 1 + num_samples // self.hop_length


class TtsFeaturizer:
    """One utterance's FastSpeech 2 targets from its waveform: log-mel, durations, and phoneme-level pitch and energy
    (not yet normalised), as the module docstring describes. Called in DataLoader workers (on the fly) or once per
    corpus (`autotune.data.tts_features`, ming024's preprocessing)."""

    def __init__(self, config: MelConfig = MelConfig()) -> None:  # noqa: B008 - frozen, so a shared default is safe
        self.config = config
        self._window = torch.hann_window(config.n_fft)
        self._mel_basis = AF.melscale_fbanks(  # (frequencies, n_mels), as librosa's Slaney mel
            config.n_fft // 2 + 1,
            config.f_min_hz,
            config.f_max_hz,
            config.n_mels,
            config.sample_rate,
            "slaney",
            "slaney",
        )
        self._quefrencies = (
            math.ceil(config.sample_rate / config.f0_max_hz),
            math.floor(config.sample_rate / config.f0_min_hz),
        )

    def __call__(self, waveform: torch.Tensor, rate: int, num_tokens: int) -> dict[str, torch.Tensor]:
        """mel (T, 80), durations (N,) int64 summing to T, pitch (Hz) and energy (N,) float32 averaged per token."""
        if rate != self.config.sample_rate:
            waveform = AF.resample(waveform, rate, self.config.sample_rate)
        spectrum = torch.stft(
            waveform,
            self.config.n_fft,
            self.config.hop_length,
            window=self._window,
            center=True,
            pad_mode="reflect",
            return_complex=True,
        ).T
        magnitude = spectrum.abs()
        durations = even_durations(magnitude.shape[0], num_tokens)
        return {
            "mel": torch.log(torch.clamp(magnitude @ self._mel_basis, min=1e-5)),
            "pitch": _token_average(self.pitch(magnitude), durations),
            "energy": _token_average(torch.linalg.vector_norm(magnitude, dim=1), durations),
            "durations": durations,
        }

    def pitch(self, magnitude: torch.Tensor) -> torch.Tensor:
        """Per-frame F0 in Hz: the cepstral peak; unvoiced frames interpolated, then a 5-frame median."""
        cepstrum = torch.fft.irfft(torch.log(magnitude.clamp_min(1e-5)), n=self.config.n_fft)
        low, high = self._quefrencies
        window = cepstrum[:, low - 1 : high + 2]
        middle = window[:, 1:-1]
        is_peak = (middle >= window[:, :-2]) & (middle >= window[:, 2:])  # a rising envelope tail is no peak
        height, lag = torch.where(is_peak, middle, torch.tensor(-1.0)).max(dim=1)
        voiced = (height > self.config.voicing_threshold).numpy()
        if not voiced.any():
            return torch.zeros(magnitude.shape[0])
        f0 = self.config.sample_rate / (lag + low).numpy()
        frames = np.arange(len(f0))
        contour = torch.from_numpy(np.interp(frames, frames[voiced], f0[voiced]).astype(np.float32))
        padded = torch.nn.functional.pad(contour[None, None], (2, 2), mode="replicate")[0, 0]
        return padded.unfold(0, 5, 1).median(dim=1).values


def mel_frames(utt: Utterance, config: MelConfig) -> int:
    """Mel frames of an utterance once resampled to the recipe's rate: the decoder's sequence length."""
    rate = utt.sample_rate or config.sample_rate
    return config.num_frames(math.ceil(round(utt.duration_s * rate) * config.sample_rate / rate))


def usable_for_tts(
    utterances: Sequence[Utterance], config: MelConfig, max_frames: int
) -> tuple[tuple[Utterance, ...], tuple[torch.Tensor, ...]]:
    """The utterances FastSpeech 2 can train on (a known symbol, 1 to max_frames mel frames), with their symbol ids."""
    kept: list[tuple[Utterance, torch.Tensor]] = []
    for utt in utterances:
        ids = text_to_ids(utt.text or "")
        if ids and 0 < mel_frames(utt, config) <= max_frames:
            kept.append((utt, torch.tensor(ids, dtype=torch.int64)))
    return tuple(utt for utt, _ in kept), tuple(ids for _, ids in kept)


class TtsDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """FastSpeech 2 items computed on the fly in DataLoader workers (see the module docstring for each target).

    ming024 reads them precomputed instead (`autotune.data.tts_features`, the workload's default); this dataset is
    for pipelines that compute them per item. Pitch and energy are z-normalised per utterance here, a stand-in for
    ming024's corpus-wide statistics (one affine map per value either way), which need a pass over the corpus.
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        *,
        config: MelConfig = MelConfig(),  # noqa: B008 - frozen, so a shared default is safe
        max_frames: int = 1000,
        audio: AudioReader | None = None,
    ) -> None:
        """Keep utterances with at least one known symbol and at most ``max_frames`` mel frames.

        Args:
            utterances: items with ``text`` set.
            config: audio settings.
            max_frames: ming024's max_seq_len (its decoder truncates longer inputs; LJSpeech has none).
            audio: what decodes an utterance: None = `read_segment` (from disk, per item); a `PreloadedAudio`
                holding the kept utterances reads them from RAM.
        """
        self.config = config
        self.audio: AudioReader = read_segment if audio is None else audio
        self.utterances, self.tokens = usable_for_tts(utterances, config, max_frames)
        self.n_filtered = len(utterances) - len(self.utterances)
        self.frames = tuple(mel_frames(utt, config) for utt in self.utterances)  # mel frames: the decoder's length
        self.token_counts = tuple(len(ids) for ids in self.tokens)  # ming024 sorts its batch groups by text length
        self.featurizer = TtsFeaturizer(config)

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """tokens (N,), mel (T, 80), pitch and energy (N,) float32, durations (N,) int64, duration_s."""
        utt, tokens = self.utterances[index], self.tokens[index]
        waveform, rate = self.audio(utt)
        targets = self.featurizer(waveform, rate, len(tokens))
        return {
            "tokens": tokens,
            "mel": targets["mel"],
            "pitch": _standardise(targets["pitch"]),
            "energy": _standardise(targets["energy"]),
            "durations": targets["durations"],
            "duration_s": utt.duration_s,
        }


def _token_average(values: torch.Tensor, durations: torch.Tensor) -> torch.Tensor:
    """Mean of per-frame values over each token's frames; 0 for a token of no frames (as ming024)."""
    owner = torch.repeat_interleave(torch.arange(len(durations)), durations)
    sums = torch.zeros(len(durations)).index_add_(0, owner, values[: len(owner)].float())
    return sums / durations.clamp_min(1)


def _standardise(values: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit variance; all zeros for a flat contour (whose spread is rounding noise)."""
    mean, spread = values.mean(), values.std(correction=0)
    if spread <= 1e-4 * (mean.abs() + 1e-8):
        return torch.zeros_like(values)
    return (values - mean) / spread


def collate_tts_batch(items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad items into a batch (ids, mels, targets with 0) with their lengths and seconds of source audio."""

    def padded(key: str) -> torch.Tensor:
        return pad_sequence([item[key] for item in items], batch_first=True, padding_value=0)

    return {
        "tokens": padded("tokens"),
        "token_lengths": torch.tensor([len(item["tokens"]) for item in items], dtype=torch.int64),
        "mels": padded("mel"),
        "mel_lengths": torch.tensor([item["mel"].shape[0] for item in items], dtype=torch.int64),
        "pitch": padded("pitch"),
        "energy": padded("energy"),
        "durations": padded("durations"),
        "durations_s": torch.tensor([item["duration_s"] for item in items], dtype=torch.float64),
    }
