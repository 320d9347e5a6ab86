"""Decoding one utterance's audio with soundfile: only the samples needed, as mono float32."""

from __future__ import annotations

import math

import numpy as np
import soundfile as sf
import torch

from autotune.data.sources import Utterance
from autotune.errors import DataError

__all__ = ["read_segment"]


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
            available = max(stop - start, 0)
            wanted = available if crop_s is None else min(math.ceil(crop_s * rate), available)
            if available > wanted:
                start += int(torch.randint(available - wanted + 1, (1,)))
            audio.seek(start)
            data = audio.read(wanted, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        reason = str(getattr(exc, "error_string", None) or exc).replace("\n", " ")
        raise DataError(
            f"cannot read audio file {utt.path} (utterance {utt.utt_id}): {reason}; it was readable when the "
            "data was loaded, so check that the file and its storage are intact"
        ) from exc
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(mono)), rate
