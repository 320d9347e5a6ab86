"""Decoding one utterance's audio with soundfile: only the samples needed, as mono float32."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import soundfile as sf
import torch

from autotune.data.pcm import sample_problem
from autotune.data.sources import Utterance
from autotune.errors import DataError

__all__ = ["AUDIO_READ_ERRORS", "AudioReader", "crop_window", "read_segment", "unreadable_audio"]

# What soundfile raises for a file it cannot open or decode, depending on the failure.
AUDIO_READ_ERRORS = (sf.LibsndfileError, RuntimeError, OSError)


class AudioReader(Protocol):
    """What datasets decode with: `read_segment`, or a `PreloadedAudio` answering from RAM with the same crops."""

    def __call__(self, utt: Utterance, *, crop_s: float | None = None) -> tuple[torch.Tensor, int]: ...


def crop_window(available: int, rate: int, crop_s: float | None) -> tuple[int, int]:
    """(offset into the segment, samples) of a random crop_s window of a segment of `available` samples.

    The whole segment when crop_s is None or longer than it; otherwise one draw from torch's RNG places it, which
    the DataLoader seeds per worker. Every reader draws the same way, so crops do not depend on where audio lives.
    """
    wanted = available if crop_s is None else min(math.ceil(crop_s * rate), available)
    offset = int(torch.randint(available - wanted + 1, (1,))) if available > wanted else 0
    return offset, wanted


def unreadable_audio(utt: Utterance, error: BaseException) -> DataError:
    """The DataError for a listed file that cannot be read now (it was when the data list was loaded)."""
    reason = str(getattr(error, "error_string", None) or error).replace("\n", " ")
    return DataError(
        f"cannot read audio file {utt.path} (utterance {utt.utt_id}): {reason}; it was readable when the "
        "data was loaded, so check that the file and its storage are intact"
    )


def read_segment(utt: Utterance, *, crop_s: float | None = None) -> tuple[torch.Tensor, int]:
    """Decode the utterance's segment (or a random crop_s window of it) as mono float32 in [-1, 1].

    Only the window is read from disk (seek + read), so long files cost what the crop costs. The crop position comes
    from torch's RNG, which the DataLoader seeds per worker.

    Returns:
        (waveform, sample rate of the file).

    Raises:
        DataError: the file cannot be read now (it was when the data list was loaded).
    """
    try:
        with sf.SoundFile(utt.path) as audio:
            rate = audio.samplerate
            start = utt.start_sample or 0
            stop = audio.frames if utt.stop_sample is None else min(utt.stop_sample, audio.frames)
            offset, wanted = crop_window(max(stop - start, 0), rate, crop_s)
            audio.seek(start + offset)
            data = audio.read(wanted, dtype="float32", always_2d=True)
    except AUDIO_READ_ERRORS as exc:
        raise unreadable_audio(utt, exc) from exc
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
    problem = sample_problem(mono)
    if problem is not None:  # a trial must not train on it: its loss would diverge for the file's sake
        raise DataError(f"audio file {utt.path} (utterance {utt.utt_id}) holds {problem}; fix or remove it")
    return torch.from_numpy(np.ascontiguousarray(mono)), rate
