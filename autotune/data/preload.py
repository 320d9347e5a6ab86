"""Decoded audio in RAM: every utterance's segment decoded once, before the DataLoader starts.

When a trial waits for data because storage is slow (a remote mount) or decoding is costly, reading each item from
disk in the workers is the bottleneck; preloading moves that cost to set-up, once per trial, and the workers only
slice memory. The corpus is held as mono 16-bit PCM (`autotune.data.pcm`, half of float32; lossless for 16-bit files),
the size the diagnosis estimates, in ONE flat tensor in shared memory: forked DataLoader workers map the same pages,
and spawned ones receive a handle through torch's pickler instead of a copy. Small numpy arrays hold each
utterance's offset, length and rate (no per-item Python objects for workers to touch and copy).

Decoding runs in a thread pool: soundfile calls libsndfile through cffi, which releases the GIL during the call, so
reads of different files overlap (and waiting on slow storage overlaps entirely).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import soundfile as sf
import torch

from autotune.data.audio import AUDIO_READ_ERRORS, crop_window, unreadable_audio
from autotune.data.pcm import PCM_FULL_SCALE, pcm_bytes
from autotune.data.sources import Utterance

__all__ = ["PreloadedAudio", "default_preload_threads"]

logger = logging.getLogger(__name__)


def default_preload_threads() -> int:
    """Threads decoding at once: twice the CPU cores (reads wait on storage as much as they decode), at most 32."""
    return min(32, 2 * (os.cpu_count() or 1))


class PreloadedAudio:
    """Every utterance's segment decoded into RAM; called like `read_segment`, with the same crops.

    Utterances are looked up by ``utt_id`` (unique in every list autotune reads), so a dataset that filters or
    reorders its utterances reads the right audio. Attributes: ``samples`` (the flat int16 tensor, shared),
    ``load_s`` (wall seconds spent preloading) and ``nbytes`` (bytes of decoded audio held).
    """

    def __init__(
        self,
        *,
        utt_ids: Sequence[str],
        samples: torch.Tensor,
        offsets: np.ndarray,
        lengths: np.ndarray,
        rates: np.ndarray,
        load_s: float = 0.0,
    ) -> None:
        """Wrap already decoded audio; `load` is how trials make one.

        Args:
            utt_ids: the utterances' ids, in the order of offsets, lengths and rates.
            samples: mono int16 PCM of every utterance, one after the other.
            offsets: where each utterance starts in samples.
            lengths: its number of samples.
            rates: its sample rate in Hz.
            load_s: wall seconds spent decoding.
        """
        self.samples, self.offsets, self.lengths, self.rates = samples, offsets, lengths, rates
        self.load_s = load_s
        self._index = {utt_id: index for index, utt_id in enumerate(utt_ids)}
        if len(self._index) != len(utt_ids):
            raise ValueError("utterance ids must be unique to preload their audio")

    @classmethod
    def load(cls, utterances: Iterable[Utterance], *, threads: int | None = None) -> PreloadedAudio:
        """Decode every utterance's segment into one shared int16 tensor, files read in parallel.

        Args:
            utterances: what the dataset reads (ids unique).
            threads: files decoded at once; None = `default_preload_threads()`.

        Raises:
            DataError: a file cannot be read now (the one read_segment raises).
            ValueError: two utterances share an id.
        """
        started = time.perf_counter()
        utts = tuple(utterances)
        threads = threads or default_preload_threads()
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="preload") as pool:
            planned = np.array(_map_all(pool, _planned_samples, utts), dtype=np.int64).reshape(-1)
            offsets = np.cumsum(planned) - planned
            # Shared before it is filled: sharing later would copy the whole corpus once more.
            samples = torch.empty(int(planned.sum()), dtype=torch.int16).share_memory_()
            pcm = samples.numpy()
            spans = [pcm[start : start + count] for start, count in zip(offsets, planned, strict=True)]
            decoded = _map_all(pool, lambda pair: _decode_into(*pair), list(zip(utts, spans, strict=True)))
        audio = cls(
            utt_ids=[utt.utt_id for utt in utts],
            samples=samples,
            offsets=offsets,
            lengths=np.array([count for count, _ in decoded], dtype=np.int64).reshape(-1),
            rates=np.array([rate for _, rate in decoded], dtype=np.int64).reshape(-1),
            load_s=time.perf_counter() - started,
        )
        logger.info(
            "preloaded %d utterances (%.1f MiB as 16-bit PCM) in %.2f s with %d threads",
            len(utts),
            audio.nbytes / 2**20,
            audio.load_s,
            threads,
        )
        return audio

    @property
    def nbytes(self) -> int:
        """Bytes of decoded audio held (16-bit PCM)."""
        return pcm_bytes(self.samples.numel())

    def __len__(self) -> int:
        """Number of utterances held."""
        return len(self._index)

    def __call__(self, utt: Utterance, *, crop_s: float | None = None) -> tuple[torch.Tensor, int]:
        """The utterance's segment (or a random crop_s window of it) as mono float32 in [-1, 1], as read_segment.

        Returns:
            (waveform, sample rate of the file).

        Raises:
            KeyError: the utterance was not preloaded.
        """
        index = self._index.get(utt.utt_id)
        if index is None:
            raise KeyError(f"utterance {utt.utt_id!r} was not preloaded; preload what the dataset reads")
        rate = int(self.rates[index])
        offset, wanted = crop_window(int(self.lengths[index]), rate, crop_s)
        start = int(self.offsets[index]) + offset
        return self.samples[start : start + wanted].to(torch.float32).div_(PCM_FULL_SCALE), rate


def _map_all(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """fn over items in the pool, in order; the first error cancels what has not started and is raised."""
    try:
        return list(pool.map(fn, items))
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise


def _planned_samples(utt: Utterance) -> int:
    """Samples of the utterance's segment: from the list's bounds and rate, or the file's header when missing."""
    start = utt.start_sample or 0
    if utt.stop_sample is not None:
        return max(utt.stop_sample - start, 0)
    if utt.start_sample is None and utt.sample_rate:
        return round(utt.duration_s * utt.sample_rate)  # load_source wrote frames / rate
    try:
        return max(sf.info(utt.path).frames - start, 0)
    except AUDIO_READ_ERRORS as exc:
        raise unreadable_audio(utt, exc) from exc


def _decode_into(utt: Utterance, out: np.ndarray) -> tuple[int, int]:
    """Decode the utterance's segment into out (int16, mono); returns (samples written, sample rate)."""
    try:
        with sf.SoundFile(utt.path) as audio:
            start = utt.start_sample or 0
            stop = audio.frames if utt.stop_sample is None else min(utt.stop_sample, audio.frames)
            count = min(max(stop - start, 0), len(out))
            audio.seek(start)
            if audio.channels == 1 and audio.subtype == "PCM_16":  # the stored samples themselves: no conversion
                return len(audio.read(count, out=out[:count])), audio.samplerate
            data = audio.read(count, dtype="float32", always_2d=True)
            mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
            out[: len(mono)] = np.clip(np.rint(mono * PCM_FULL_SCALE), -PCM_FULL_SCALE, PCM_FULL_SCALE - 1)
            return len(mono), audio.samplerate
    except AUDIO_READ_ERRORS as exc:
        raise unreadable_audio(utt, exc) from exc
