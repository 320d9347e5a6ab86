"""NaturalSpeech2 training items and batches as Amphion's recipe makes them (models/tts/naturalspeech2/ns2_dataset.py).

`Ns2Dataset` does per item what NS2Dataset.__getitem__ does in the DataLoader workers: open the utterance's pickle
(`autotune.data.ns2_prep`), align the lengths of codes, pitch and durations (``align_length``), cut the prompt
(``get_target_and_reference``, clip_mode ``start``: the first 10-50 % of the phones and their frames become the
reference), and expand the phone ids to frames with Python loops (``phone_id_frame``, which the model does not read
but the workers pay for). `collate_ns2_batch` pads as NS2Collator (pitch with 50, the rest with 0, masks of ones).
`batch_by_size` is the recipe's dynamic batch sampler: items sorted by frames, packed while the padded batch
(count x longest) stays within max_tokens and the count within max_sentences.

Slow storage: ``read_latency_s`` sleeps in every pickle read, as a read from a network or cloud mount waits, so that
the cost the seed issue describes (Amphion#120: "IO is the main bottleneck ... preload all data into memory") can be
measured and the search can show what more workers or `preload` buy against it. `preload` reads every pickle once
before the DataLoader starts (threads overlap the waits), and the workers then read memory.
"""

from __future__ import annotations

import pickle
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from autotune.data.ns2_prep import CODEC_FRAMES_PER_S, Ns2Metadata
from autotune.data.preload import default_preload_threads

__all__ = ["Ns2Dataset", "batch_by_size", "collate_ns2_batch", "cut_prompt"]

PITCH_PAD = 50.0  # NS2Collator's padding_value for pitch


def cut_prompt(duration: np.ndarray, rng: random.Random) -> tuple[int, int]:
    """(first, last) phone index of the prompt, clip_mode ``start``: 10-50 % of the phones from the first (from the
    second where the first has no frames and the prompt is one phone), as get_target_and_reference draws it."""
    phones = len(duration)
    clip = max(rng.randint(int(phones * 0.1), int(phones * 0.5)), 1)
    if not 1 <= clip < phones:
        raise ValueError(f"a prompt of {clip} of {phones} phones leaves no target; NS2 needs at least 3 phones")
    start = 1 if duration[0] == 0 and clip == 1 else 0
    return start, start + clip


def align_length(item: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NS2Dataset.align_length: codes and pitch cut (pitch edge-padded) to min(code frames, sum of durations), the
    last duration shortened by any excess."""
    code, pitch, duration = item["code"], item["pitch"], item["duration"].copy()
    frames = min(code.shape[1], int(duration.sum()))
    code = code[:, :frames]
    pitch = pitch[:frames] if len(pitch) >= frames else np.pad(pitch, (0, frames - len(pitch)), mode="edge")
    excess = int(duration.sum()) - frames
    if excess > 0:
        duration[-1] -= excess
        if duration[-1] < 0:
            raise ValueError("the durations exceed the codes by more than the last phone")
    return code, pitch, duration


def _frames_of(phone_id: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """phone_id_frame: each phone id repeated for its frames, in Python loops as the recipe's workers do."""
    expanded: list[int] = []
    for index in range(len(phone_id)):
        expanded.extend([int(phone_id[index]) for _ in range(int(duration[index]))])
    return np.array(expanded, dtype=np.int64)


class Ns2Dataset(torch.utils.data.Dataset[dict[str, Any]]):
    """NS2Dataset's items from prepared pickles (see the module docstring).

    Args:
        metadata: the prepared corpus (`autotune.data.ns2_prep.ensure_ns2_metadata`).
        read_latency_s: seconds each pickle read waits, as a read from slow storage (0: a local disk).
    """

    def __init__(self, metadata: Ns2Metadata, *, read_latency_s: float = 0.0) -> None:
        self.metadata = metadata
        self.read_latency_s = read_latency_s
        self.frames = metadata.num_frames  # what the batch sampler sorts and packs by (train.json num_frames)
        self.duration_s = tuple(frames / CODEC_FRAMES_PER_S for frames in self.frames)
        self.rng = random.Random()  # reseeded per worker by the DataLoader (it seeds `random`)
        self._in_memory: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self.frames)

    def _read(self, index: int) -> bytes:
        if self._in_memory is not None:
            return self._in_memory[index]
        if self.read_latency_s > 0:
            time.sleep(self.read_latency_s)
        return self.metadata.path(index).read_bytes()

    def preload(self, threads: int | None = None) -> float:
        """Read every pickle into RAM once (the preload knob), the reads overlapping in threads; returns the wall
        seconds it took. Items are still unpickled per item in the workers, as the recipe's."""
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads or default_preload_threads()) as pool:
            self._in_memory = list(pool.map(self._read, range(len(self))))
        return time.perf_counter() - started

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = pickle.loads(self._read(index))  # noqa: S301 - autotune's own cache, written by ns2_prep
        code, pitch, duration = align_length(item)
        phone_id = np.array(self.metadata.phones[index], dtype=np.int64)
        first, last = cut_prompt(duration, self.rng)
        start, end = int(duration[:first].sum()), int(duration[:last].sum())
        target_duration = np.append(duration[:first], duration[last:])
        target_phones = np.append(phone_id[:first], phone_id[last:])
        return {
            "code": np.concatenate((code[:, :start], code[:, end:]), axis=1),
            "ref_code": code[:, start:end],
            "pitch": np.append(pitch[:start], pitch[end:]).astype(np.float32),
            "duration": target_duration,
            "phone_id": target_phones,
            "phone_id_frame": _frames_of(target_phones, target_duration),
            "ref_phone_id_frame": _frames_of(phone_id[first:last], duration[first:last]),
            "duration_s": self.duration_s[index],
        }


def collate_ns2_batch(items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """NS2Collator: codes (B, 16, T) and ref_code (B, 16, T') 0-padded, pitch padded with 50, durations and phone ids
    with 0, masks (float) of ones over the real phones and frames; plus the seconds of audio of each item."""

    def padded(arrays: list[np.ndarray], value: float = 0.0) -> torch.Tensor:
        return pad_sequence([torch.from_numpy(a) for a in arrays], batch_first=True, padding_value=value)

    def mask(lengths: list[int]) -> torch.Tensor:
        return padded([np.ones(max(length, 1), dtype=np.float32) for length in lengths])

    return {
        "code": padded([item["code"].T for item in items]).transpose(1, 2),
        "ref_code": padded([item["ref_code"].T for item in items]).transpose(1, 2),
        "pitch": padded([item["pitch"] for item in items], PITCH_PAD),
        "duration": padded([item["duration"] for item in items]),
        "phone_id": padded([item["phone_id"] for item in items]),
        "phone_id_frame": padded([item["phone_id_frame"] for item in items]),
        "phone_mask": mask([len(item["phone_id"]) for item in items]),
        "mask": mask([item["code"].shape[1] for item in items]),
        "ref_mask": mask([item["ref_code"].shape[1] for item in items]),
        "durations_s": torch.tensor([item["duration_s"] for item in items], dtype=torch.float64),
    }


def batch_by_size(
    frames: Sequence[int], indices: Sequence[int], *, max_tokens: int, max_sentences: int
) -> list[list[int]]:
    """The recipe's batch_by_size over `indices` sorted by frames: a batch is closed when it holds max_sentences items
    or when one more item would make count x longest frames exceed max_tokens.

    Raises:
        ValueError: an item alone is longer than max_tokens (the recipe asserts the same).
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for index in sorted(indices, key=lambda position: frames[position]):
        length = frames[index]
        if length > max_tokens:
            raise ValueError(f"an utterance of {length} frames exceeds max_tokens {max_tokens}")
        if batch and (len(batch) == max_sentences or (len(batch) + 1) * max(longest, length) > max_tokens):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    return batches
