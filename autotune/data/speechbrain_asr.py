"""ASR training items as SpeechBrain's CommonVoice CTC recipe makes them: decode and resample per item, sort by
duration, pad with relative lengths; its waveform augmentation on the batch, in the training step.

``recipes/CommonVoice/ASR/CTC/train_with_wav2vec.py`` (speechbrain/speechbrain v1.0.0, a8b67d9): ``dataio_prepare``
drops utterances longer than ``avoid_if_longer_than`` (10 s) and, with ``sorting: ascending``, sorts the rest by
duration and turns the DataLoader's shuffle off, so every epoch runs from the shortest batch to the longest; its
``audio_pipeline`` reads each file and resamples it to 16 kHz with a ``Resample`` made for that item (CommonVoice is
48 kHz MP3), in the DataLoader workers. ``PaddedBatch`` pads waveforms and tokens with zeros and gives each their
length relative to the batch's longest. ``compute_forward`` then runs ``wav_augment`` on the device batch:
``Augmenter`` (min = max = 3 augmentations, augment_prob 1, sequential, no original concatenated, so the batch keeps
its size) applies SpeedPerturb (one of 95/100/105 % per batch, relative lengths unchanged), DropFreq (1-3 notches,
width 0.05) and DropChunk (1-5 chunks of 1000-2000 samples), under the step's autocast as SpeechBrain's are.

Tokens: the recipe trains a SentencePiece ``char`` model of ``output_neurons`` (76) pieces on the training text; here
the character vocabulary of the transcripts (`autotune.data.asr.CharVocabulary`, spaces as "▁" as SentencePiece
writes them, ids from 3 on), which the CTC head covers: its width stays the recipe's 76 unless the data has more
characters. DropChunk drops within the padded batch rather than each utterance's own length (SpeechBrain's), a
difference of where the zeros land, not of their cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torchaudio.functional as AF
from torch.nn.utils.rnn import pad_sequence

from autotune.data.asr import CharVocabulary
from autotune.data.audio import AudioReader, read_segment
from autotune.data.augment import drop_chunk, drop_freq
from autotune.data.sources import Utterance

__all__ = [
    "SAMPLE_RATE",
    "SORTINGS",
    "SPEEDS_PERCENT",
    "SpeechBrainAsrDataset",
    "collate_speechbrain_asr",
    "sorted_batches",
    "wav_augment",
]

SAMPLE_RATE = 16000  # the yaml's sample_rate: what every item is resampled to
MAX_DURATION_S = 10.0  # avoid_if_longer_than
SPEEDS_PERCENT = (95, 100, 105)  # speed_perturb's speeds
SORTINGS = ("ascending", "descending", "random")  # dataio_prepare's choices for `sorting`


class SpeechBrainAsrDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor, float]]):
    """Utterances with transcripts as (16 kHz waveform, token ids, duration_s) items, those over max_duration_s
    dropped as the recipe's ``avoid_if_longer_than``.

    Args:
        utterances: items with ``text`` set (``DataSource.utterances``).
        vocabulary: the character vocabulary of the transcripts.
        max_duration_s: longer utterances are left out.
        audio: what decodes an utterance: None = `read_segment` (from disk, per item); a `PreloadedAudio` holding
            the kept utterances reads them from RAM.
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        vocabulary: CharVocabulary,
        *,
        max_duration_s: float = MAX_DURATION_S,
        audio: AudioReader | None = None,
    ) -> None:
        missing = [u.utt_id for u in utterances if u.text is None]
        if missing:
            raise ValueError(f"{len(missing)} utterances have no transcript (first: {missing[0]})")
        self.vocabulary = vocabulary
        self.audio: AudioReader = read_segment if audio is None else audio
        self.utterances = tuple(u for u in utterances if u.duration_s <= max_duration_s)
        self.tokens = tuple(torch.tensor(vocabulary.encode(u.text or ""), dtype=torch.int64) for u in self.utterances)
        self.n_filtered = len(utterances) - len(self.utterances)
        self.durations_s = tuple(u.duration_s for u in self.utterances)

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(waveform (samples,) float32 at 16 kHz, token ids int64, duration of the source audio in s)."""
        utt = self.utterances[index]
        waveform, rate = self.audio(utt)
        if rate != SAMPLE_RATE:  # a resampling kernel per item, as the recipe's per-item Resample
            waveform = AF.resample(waveform, rate, SAMPLE_RATE)
        return waveform.to(torch.float32), self.tokens[index], utt.duration_s


def _padded_with_relative_lengths(items: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """SpeechBrain's PaddedBatch of one key: zero-padded (B, longest) and each length over the longest."""
    padded = pad_sequence(list(items), batch_first=True, padding_value=0)
    lengths = torch.tensor([item.shape[0] for item in items], dtype=torch.float32)
    return padded, lengths / max(padded.shape[1], 1)


def collate_speechbrain_asr(items: Sequence[tuple[torch.Tensor, torch.Tensor, float]]) -> dict[str, torch.Tensor]:
    """Pad dataset items into a batch as SpeechBrain's PaddedBatch.

    Returns:
        wavs (B, samples) float32, wav_lens (B,) relative, tokens (B, L) int64 padded with 0, token_lens (B,)
        relative, and durations_s (B,) float64: seconds of source audio per item.
    """
    wavs, wav_lens = _padded_with_relative_lengths([wav for wav, _, _ in items])
    tokens, token_lens = _padded_with_relative_lengths([token for _, token, _ in items])
    return {
        "wavs": wavs,
        "wav_lens": wav_lens,
        "tokens": tokens,
        "token_lens": token_lens,
        "durations_s": torch.tensor([duration for _, _, duration in items], dtype=torch.float64),
    }


def sorted_batches(
    durations_s: Sequence[float], indices: Sequence[int], batch_size: int, sorting: str
) -> Iterator[list[int]]:
    """One epoch of batches of `indices` as the recipe's loader yields them: sorted by duration (ascending or
    descending, ties by index) or in the order given (random: the caller's permutation), batch_size consecutive
    items each, the last short batch kept (SpeechBrain's DataLoader default drop_last=False)."""
    if sorting not in SORTINGS:
        raise ValueError(f"sorting {sorting!r} is not one of {', '.join(SORTINGS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = list(indices)
    if sorting != "random":
        order.sort(key=lambda index: (durations_s[index], index), reverse=sorting == "descending")
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def speed_perturb(wavs: torch.Tensor, speed_percent: int | None = None) -> torch.Tensor:
    """SpeechBrain's SpeedPerturb: the whole batch resampled from 16 kHz to 16 kHz x speed / 100, one speed drawn
    per batch (or the one given); relative lengths are unchanged."""
    if speed_percent is None:
        speed_percent = SPEEDS_PERCENT[int(torch.randint(len(SPEEDS_PERCENT), (1,)))]
    if speed_percent == 100:
        return wavs
    return AF.resample(wavs, SAMPLE_RATE, SAMPLE_RATE * speed_percent // 100)


def wav_augment(wavs: torch.Tensor, speed_percent: int | None = None) -> torch.Tensor:
    """The recipe's ``wav_augment``: speed perturbation, frequency drop and chunk drop, in sequence, on (B, samples)."""
    return drop_chunk(drop_freq(speed_perturb(wavs, speed_percent)))
