"""What GPT-SoVITS s2's DataLoader runs: its dataset, its collate and its bucket sampler.

Re-implemented from reading RVC-Boss/GPT-SoVITS 48b1a01 ``GPT_SoVITS/module/data_utils.py``:

``TextAudioSpeakerLoader`` repeats a set of fewer than 100 items (``max(2, 100 // n)`` copies), shuffles
the list with ``random.seed(1234)``, and keeps the items whose duration, read from the file size as 16-bit samples
(``size / 32000 / 2``), is over 0.6 s and under 54 s; its ``lengths`` are ``size // (2 * hop)`` spectrogram frames.
Per item (lines 109-145), in the DataLoader's workers, it decodes the wav through an ffmpeg subprocess
(`autotune.data.ffmpeg`), takes the magnitude STFT of the whole file (1025 bins, hop 640: the ``spectrogram`` it is
given, mel_processing's ``spectrogram_torch``), ``torch.load``s the cnhubert features and pads them by one frame
(replicated) where they are one short of the spectrogram, and turns the phone ids into a float tensor. Where the
recipe catches an unreadable item and trains on zeros instead, this dataset raises: a trial must not measure a batch
of zeros.

``TextAudioSpeakerCollate`` sorts the items by spectrogram length, longest first, and zero-pads: the
features and spectrograms to the even number above the longest, the audio to the longest, the phones (as integers).

``DistributedBucketSampler`` (lines 976-1071) puts each item in the bucket of ``boundaries[i] < length <=
boundaries[i + 1]`` spectrogram frames and drops those outside every bucket; each bucket is padded (by repeating its
shuffled items) to a multiple of ``batch_size x replicas``; each epoch, from a torch generator seeded by the epoch,
every bucket is permuted and padded, every replicas-th item kept for this rank and cut into batches of ``batch_size``,
and the batches of all buckets shuffled. It yields batches, already this rank's: s2_train.py passes it as the
DataLoader's ``batch_sampler`` with s2.json's ``train.batch_size`` per rank.
"""

from __future__ import annotations

import bisect
import os
import random
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from autotune.data.ffmpeg import load_audio
from autotune.data.gpt_sovits_s2 import SAMPLE_RATE, WAV_HEADER_BYTES, S2Corpus
from autotune.errors import DataError

__all__ = [
    "BOUNDARIES",
    "HOP_LENGTH",
    "S2Dataset",
    "bucket_items",
    "bucket_sampler_epoch",
    "collate_s2",
    "samples_per_epoch",
    "worst_bucket_batch",
]

HOP_LENGTH = 640  # s2.json data.hop_length
MIN_ITEMS = 100  # TextAudioSpeakerLoader's min_num
SHUFFLE_SEED = 1234  # its random.seed before the shuffle
MIN_S, MAX_S = 0.6, 54.0  # its filter: 54 > duration > 0.6
# s2_train.py:91-117, in spectrogram frames (0.64 s to 38 s at hop 640)
BOUNDARIES = (32, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200, 1300, 1400, 1500, 1600, 1700, 1800, 1900)

Spectrogram = Callable[[torch.Tensor], torch.Tensor]


class S2Dataset(torch.utils.data.Dataset[tuple[torch.Tensor, ...]]):
    """``TextAudioSpeakerLoader``: items as (ssl, spec, wav, phones), decoded and featurised per item.

    Args:
        corpus: the prepared experiment folder.
        spectrogram: (1, samples) audio -> (1, 1025, frames) magnitudes: mel_processing's spectrogram_torch.
        ffmpeg: the program that decodes the audio (`autotune.data.ffmpeg.find_ffmpeg`).
    """

    def __init__(self, corpus: S2Corpus, *, spectrogram: Spectrogram, ffmpeg: str) -> None:
        self.corpus, self.spectrogram, self.ffmpeg = corpus, spectrogram, ffmpeg
        order = list(range(len(corpus.names)))
        if len(order) < MIN_ITEMS:
            order = order * max(2, MIN_ITEMS // max(len(order), 1))
        random.Random(SHUFFLE_SEED).shuffle(order)
        self.items: list[int] = []
        self.lengths: list[int] = []  # spectrogram frames, as the sampler buckets them
        self.seconds: list[float] = []  # of decoded audio
        for item in order:
            size = os.path.getsize(corpus.wav_path(corpus.names[item]))
            if MAX_S > size / SAMPLE_RATE / 2 > MIN_S:
                self.items.append(item)
                self.lengths.append(size // (2 * HOP_LENGTH))
                self.seconds.append((size - WAV_HEADER_BYTES) / 2 / SAMPLE_RATE)
        if len(self.items) < 2:  # the recipe asserts more than one
            raise DataError(
                f"{len(self.items)} of the {len(corpus.names)} utterances last over {MIN_S} s and under {MAX_S} s, as "
                "GPT-SoVITS's s2 dataset keeps them; it needs at least 2"
            )
        self.phone_counts = tuple(len(corpus.phones[item]) for item in self.items)
        self.preloaded: dict[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.items)

    def preload(self) -> float:
        """Every kept file decoded into RAM once, before the DataLoader starts (the preload knob): the workers then
        compute spectrograms from it instead of starting ffmpeg per item. Returns the wall seconds it took."""
        started = time.perf_counter()
        self.preloaded = {item: self._decode(item) for item in sorted(set(self.items))}
        return time.perf_counter() - started

    def _decode(self, item: int) -> torch.Tensor:
        audio = load_audio(self.corpus.wav_path(self.corpus.names[item]), SAMPLE_RATE, self.ffmpeg)
        return torch.tensor(audio).unsqueeze(0)  # a copy: ffmpeg's buffer is read-only

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        item = self.items[index]
        name = self.corpus.names[item]
        wav = self.preloaded[item] if self.preloaded is not None else self._decode(item)
        with torch.no_grad():
            spec = self.spectrogram(wav).squeeze(0)
            ssl = torch.load(self.corpus.hubert_path(name), map_location="cpu")
            if ssl.shape[-1] != spec.shape[-1]:
                ssl = F.pad(ssl.float(), (0, 1), mode="replicate").to(ssl.dtype)
        if ssl.shape[-1] != spec.shape[-1]:
            raise DataError(f"{self.corpus.hubert_path(name)}: {ssl.shape[-1]} frames for {spec.shape[-1]} of audio")
        return ssl, spec, wav, torch.tensor(self.corpus.phones[item], dtype=torch.float32)


def _even_above(length: int) -> int:
    return 2 * (length // 2 + 1)


def collate_s2(batch: list[tuple[torch.Tensor, ...]]) -> dict[str, torch.Tensor]:
    """``TextAudioSpeakerCollate``: longest spectrogram first, everything zero-padded, phones as integers."""
    order = torch.argsort(torch.tensor([spec.shape[1] for _, spec, _, _ in batch]), descending=True, stable=True)
    rows = [batch[int(index)] for index in order]
    ssl_width = _even_above(max(ssl.shape[2] for ssl, _, _, _ in rows))
    spec_width = _even_above(max(spec.shape[1] for _, spec, _, _ in rows))
    ssl = torch.zeros(len(rows), rows[0][0].shape[1], ssl_width)
    spec = torch.zeros(len(rows), rows[0][1].shape[0], spec_width)
    wav = torch.zeros(len(rows), 1, max(audio.shape[1] for _, _, audio, _ in rows))
    text = torch.zeros(len(rows), max(phones.shape[0] for _, _, _, phones in rows), dtype=torch.long)
    for row, (item_ssl, item_spec, item_wav, item_text) in enumerate(rows):
        ssl[row, :, : item_ssl.shape[2]] = item_ssl[0]
        spec[row, :, : item_spec.shape[1]] = item_spec
        wav[row, :, : item_wav.shape[1]] = item_wav
        text[row, : item_text.shape[0]] = item_text
    return {
        "ssl": ssl,
        "ssl_lengths": torch.tensor([item[0].shape[2] for item in rows]),
        "spec": spec,
        "spec_lengths": torch.tensor([item[1].shape[1] for item in rows]),
        "wav": wav,
        "wav_lengths": torch.tensor([item[2].shape[1] for item in rows]),
        "text": text,
        "text_lengths": torch.tensor([item[3].shape[0] for item in rows]),
    }


def bucket_items(lengths: Sequence[int], boundaries: Sequence[int] = BOUNDARIES) -> list[list[int]]:
    """Item indices per non-empty bucket, in item order; items at or under the first boundary or over the last are
    in none (dropped)."""
    buckets: list[list[int]] = [[] for _ in range(len(boundaries) - 1)]
    for index, length in enumerate(lengths):
        position = bisect.bisect_left(boundaries, length)  # boundaries[position - 1] < length <= boundaries[position]
        if 1 <= position < len(boundaries):
            buckets[position - 1].append(index)
    return [bucket for bucket in buckets if bucket]


def _padded_size(bucket: Sequence[int], batch_size: int, replicas: int) -> int:
    group = batch_size * replicas
    return len(bucket) + (group - len(bucket) % group) % group


def samples_per_epoch(lengths: Sequence[int], *, batch_size: int, replicas: int) -> int:
    """Samples one epoch deals over all ranks: the bucketed items, each bucket padded to whole global batches."""
    return sum(_padded_size(bucket, batch_size, replicas) for bucket in bucket_items(lengths))


def bucket_sampler_epoch(
    lengths: Sequence[int], *, batch_size: int, replicas: int, rank: int, epoch: int
) -> list[list[int]]:
    """This rank's batches of one epoch of the recipe's sampler (shuffle on), the generator seeded by ``epoch``."""
    generator = torch.Generator()
    generator.manual_seed(epoch)
    buckets = bucket_items(lengths)
    permutations = [torch.randperm(len(bucket), generator=generator).tolist() for bucket in buckets]
    batches: list[list[int]] = []
    for bucket, ids in zip(buckets, permutations, strict=True):
        missing = _padded_size(bucket, batch_size, replicas) - len(bucket)
        ids = ids + ids * (missing // len(bucket)) + ids[: missing % len(bucket)]
        own = ids[rank::replicas]
        batches += [[bucket[i] for i in own[start : start + batch_size]] for start in range(0, len(own), batch_size)]
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[index] for index in order]


def worst_bucket_batch(lengths: Sequence[int], phone_counts: Sequence[int], batch_size: int) -> list[int]:
    """The costliest batch the sampler can deal: ``batch_size`` items of the longest bucket, longest first (repeated
    where the bucket holds fewer, as its padding repeats them)."""
    longest = sorted(bucket_items(lengths)[-1], key=lambda index: (-lengths[index], -phone_counts[index]))
    return [longest[position % len(longest)] for position in range(batch_size)]
