"""ASR training items as the WeNet aishell recipe makes them: decode, resample, speed perturb, fbank, SpecAugment.

WeNet's ``dataset_conf`` (examples/aishell/s0/conf/train_conformer.yaml) and ``wenet/dataset/processor.py``:
filter (filter_conf) -> resample to 16 kHz -> speed perturb (0.9/1.0/1.1) -> fbank (80 bins, 25/10 ms, dither 0.1,
on the waveform scaled to 16-bit range, energy_floor 0) -> SpecAugment (2 time masks up to 50 frames, 2 frequency
masks up to 10 bins) -> sort -> batch -> pad (features with 0, tokens with -1). Two stand-ins, both cheap and both
documented: speed perturbation resamples with ``torchaudio.functional.resample`` in one step with the rate change
(WeNet calls sox ``speed`` + ``rate``, which newer torchaudio no longer ships). Features leave the pipeline raw, as
WeNet's: the recipe's global CMVN is applied inside the model (`autotune.models.conformer.GlobalCMVN`), with
statistics computed once over the training list (`autotune.data.cmvn`).

The work happens in ``__getitem__``, so in DataLoader workers, where the tuner must see its cost. With the
feature_device knob at ``device`` the workers stop after the speed perturbation and the training step computes the
fbank and SpecAugment of the batch (`autotune.data.asr_features`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torchaudio.functional as AF
from torch.nn.utils.rnn import pad_sequence

from autotune.data.asr_features import PAD_TOKEN, SpecAugmentConfig, apply_masks, draw_masks, wenet_fbank
from autotune.data.audio import AudioReader, read_segment
from autotune.data.features import FbankConfig
from autotune.data.sources import Utterance

__all__ = ["WENET_FBANK", "AsrDataset", "CharVocabulary", "FilterConfig", "collate_asr_batch", "split_characters"]

WENET_FBANK = FbankConfig(num_mel_bins=80, sample_rate=16000, frame_length_ms=25.0, frame_shift_ms=10.0, dither=0.1)
WENET_SPEEDS = (0.9, 1.0, 1.1)


def split_characters(text: str) -> list[str]:
    """Character tokens as WeNet's CharTokenizer makes them: every character, a space becoming "▁"."""
    return ["▁" if ch == " " else ch for ch in text.strip()]


class CharVocabulary:
    """A character vocabulary as the aishell recipe's dict (run.sh stage 2): 0 = <blank>, 1 = <unk>, 2 = <sos/eos>,
    then the characters sorted."""

    BLANK, UNK, SOS_EOS = "<blank>", "<unk>", "<sos/eos>"
    SOS_EOS_ID = 2

    def __init__(self, characters: Iterable[str]) -> None:
        """Args: characters: the token characters; duplicates are ignored."""
        self.symbols = (self.BLANK, self.UNK, self.SOS_EOS, *sorted(set(characters)))
        self._ids = {symbol: index for index, symbol in enumerate(self.symbols)}

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharVocabulary:
        """The vocabulary of every character of the transcripts (WeNet builds it from the training text)."""
        characters: set[str] = set()
        for text in texts:
            characters.update(split_characters(text))
        return cls(characters)

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> list[int]:
        """Token ids of a transcript; a character outside the vocabulary is <unk> (1)."""
        return [self._ids.get(token, 1) for token in split_characters(text)]


@dataclass(frozen=True, kw_only=True, slots=True)
class FilterConfig:
    """WeNet's filter_conf: lengths in 10 ms frames of the nominal audio, and in tokens (aishell values)."""

    max_length: int = 40960
    min_length: int = 0
    token_max_length: int = 200
    token_min_length: int = 1
    min_output_input_ratio: float = 0.0005  # WeNet's code defaults (the recipe does not set them)
    max_output_input_ratio: float = 1.0

    def keeps(self, duration_s: float, n_tokens: int) -> bool:
        """Whether WeNet's filter keeps an utterance of this duration and transcript length."""
        frames = duration_s * 100
        if not self.min_length <= frames <= self.max_length:
            return False
        if not self.token_min_length <= n_tokens <= self.token_max_length:
            return False
        return frames == 0 or self.min_output_input_ratio <= n_tokens / frames <= self.max_output_input_ratio


def spec_augment(feats: torch.Tensor, config: SpecAugmentConfig) -> torch.Tensor:
    """Zero random time and frequency bands of a (frames, bins) matrix, as WeNet's spec_aug; returns a new tensor.

    The draws and the masking are the batched path's (`autotune.data.asr_features`) for a batch of one."""
    lengths = torch.tensor([feats.shape[0]])
    return apply_masks(feats.unsqueeze(0), lengths, draw_masks(lengths, feats.shape[1], config)).squeeze(0)


class AsrDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor, float]]):
    """Utterances with transcripts as (fbank, token ids, duration_s) items, filtered as WeNet's filter_conf.

    Speed perturbation and SpecAugment draw from torch's RNG, which DataLoader seeds per worker.
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        vocabulary: CharVocabulary,
        *,
        fbank: FbankConfig = WENET_FBANK,
        speeds: Sequence[float] = WENET_SPEEDS,
        spec_aug: SpecAugmentConfig | None = SpecAugmentConfig(),  # noqa: B008 - frozen, so a shared default is safe
        filter_config: FilterConfig = FilterConfig(),  # noqa: B008
        min_input_frames: int = 1,
        audio: AudioReader | None = None,
        featurise: bool = True,
    ) -> None:
        """Tokenise and filter the utterances.

        Args:
            utterances: items with ``text`` set (``DataSource.utterances``).
            vocabulary: the character vocabulary.
            fbank: feature settings; ``fbank.sample_rate`` is the rate audio is resampled to.
            speeds: speed-perturbation factors drawn uniformly per item; (1.0,) disables it.
            spec_aug: SpecAugment settings; None disables it.
            filter_config: WeNet's filter_conf.
            min_input_frames: drop items that could yield fewer frames (the conformer's x4 subsampling needs 7).
            audio: what decodes an utterance: None = `read_segment` (from disk, per item); a `PreloadedAudio`
                holding the kept utterances reads them from RAM.
            featurise: False: an item is the speed-perturbed waveform at ``fbank.sample_rate`` and the training step
                computes fbank and SpecAugment (`autotune.data.asr_features.device_features`; the feature_device
                knob). The frame counts the batching reads (max_frames) are the same either way.
        """
        if not speeds or min(speeds) <= 0:
            raise ValueError(f"speeds must be positive factors, got {tuple(speeds)}")
        missing = [u.utt_id for u in utterances if u.text is None]
        if missing:
            raise ValueError(f"{len(missing)} utterances have no transcript (first: {missing[0]})")
        self.vocabulary, self.fbank, self.speeds, self.spec_aug = vocabulary, fbank, tuple(speeds), spec_aug
        self.audio: AudioReader = read_segment if audio is None else audio
        self.featurise = featurise
        kept: list[Utterance] = []
        tokens: list[torch.Tensor] = []
        for utt in utterances:
            ids = vocabulary.encode(utt.text or "")
            if filter_config.keeps(utt.duration_s, len(ids)) and self._frame_range(utt)[0] >= min_input_frames:
                kept.append(utt)
                tokens.append(torch.tensor(ids, dtype=torch.int64))
        self.utterances, self.tokens = tuple(kept), tuple(tokens)
        self.n_filtered = len(utterances) - len(kept)
        # The most frames an item can have (at the slowest speed): what the dynamic batch budget counts.
        self.max_frames = tuple(self._frame_range(utt)[1] for utt in self.utterances)

    def __len__(self) -> int:
        """Number of utterances kept by the filter."""
        return len(self.utterances)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One item: (fbank (frames, num_mel_bins) float32, token ids int64, duration of the source audio in s); with
        featurise False the waveform (samples,) float32 in place of the fbank."""
        utt = self.utterances[index]
        waveform, rate = self.audio(utt)
        speed = self.speeds[int(torch.randint(len(self.speeds), (1,)))] if len(self.speeds) > 1 else self.speeds[0]
        source_rate = round(rate * speed)  # playing rate-r audio as if it were r*speed Hz makes it 1/speed as long
        if source_rate != self.fbank.sample_rate:
            waveform = AF.resample(waveform, source_rate, self.fbank.sample_rate)
        if not self.featurise:
            return waveform.to(torch.float32), self.tokens[index], utt.duration_s
        feats = wenet_fbank(waveform, self.fbank)  # raw, as WeNet's: the model's global CMVN normalises them
        if self.spec_aug is not None:
            feats = spec_augment(feats, self.spec_aug)
        return feats, self.tokens[index], utt.duration_s

    def _frame_range(self, utt: Utterance) -> tuple[int, int]:
        """(fewest, most) fbank frames over the speeds, as resample's output length makes them."""
        rate = utt.sample_rate or self.fbank.sample_rate
        samples = round(utt.duration_s * rate)
        lengths = [math.ceil(samples * self.fbank.sample_rate / round(rate * speed)) for speed in self.speeds]
        return self.fbank.num_frames(min(lengths)), self.fbank.num_frames(max(lengths))


def collate_asr_batch(items: Sequence[tuple[torch.Tensor, torch.Tensor, float]]) -> dict[str, torch.Tensor]:
    """Pad dataset items into a batch as WeNet's padding().

    Returns:
        feats (B, T, bins) float32 padded with 0, feat_lengths (B,) int64, tokens (B, L) int64 padded with -1,
        token_lengths (B,) int64, and durations_s (B,) float64: seconds of source audio per item.
    """
    feats = [feat for feat, _, _ in items]
    tokens = [token for _, token, _ in items]
    return {
        "feats": pad_sequence(feats, batch_first=True, padding_value=0.0),
        "feat_lengths": torch.tensor([feat.shape[0] for feat in feats], dtype=torch.int64),
        "tokens": pad_sequence(tokens, batch_first=True, padding_value=PAD_TOKEN),
        "token_lengths": torch.tensor([token.shape[0] for token in tokens], dtype=torch.int64),
        "durations_s": torch.tensor([duration for _, _, duration in items], dtype=torch.float64),
    }
