"""Global CMVN statistics of a training list, as WeNet's aishell recipe computes them before it trains.

run.sh stage 1 runs ``tools/compute_cmvn_stats.py`` over the training set's wav.scp: every utterance resampled to
the recipe's 16 kHz, scaled to the 16-bit range, 80-bin Kaldi fbank (25/10 ms) WITHOUT dither and with energy_floor
0, then per-bin sums of the features and of their squares and the frame count, written as JSON (mean_stat,
var_stat, frame_num). ``wenet/utils/cmvn.py`` turns that into mean and inverse standard deviation (the variance
floored at 1e-20), which ``GlobalCMVN`` inside the model applies to every batch. No speed perturbation, no
SpecAugment: the statistics describe the raw training features.

Computed once per corpus and fbank setting into the cache, as WeNet's file is (``cmvn/<key>.json``, the same JSON);
see `autotune.data.offline`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torchaudio.functional as AF
from torchaudio.compliance import kaldi

from autotune.data.audio import AudioReader, read_segment
from autotune.data.features import FbankConfig
from autotune.data.offline import Preparation, cache_root, corpus_key, map_utterances, write_text_atomically
from autotune.data.sources import Utterance

__all__ = ["CMVN_VERSION", "CmvnStats", "compute_cmvn_stats", "global_cmvn"]

CMVN_VERSION = 1  # bump when the statistics change for the same inputs
WHAT = "global CMVN statistics (WeNet tools/compute_cmvn_stats.py)"


@dataclass(frozen=True, kw_only=True, slots=True)
class CmvnStats:
    """WeNet's global_cmvn file: per-bin sums of the features and of their squares, and the frame count."""

    mean_stat: tuple[float, ...]
    var_stat: tuple[float, ...]
    frame_num: int

    def to_json(self) -> str:
        """WeNet's JSON (``is_json_cmvn: true``)."""
        return json.dumps({**asdict(self), "mean_stat": list(self.mean_stat), "var_stat": list(self.var_stat)})

    @classmethod
    def from_json(cls, text: str) -> CmvnStats:
        data = json.loads(text)
        return cls(mean_stat=tuple(data["mean_stat"]), var_stat=tuple(data["var_stat"]), frame_num=data["frame_num"])

    def mean_istd(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, 1 / std) per bin as float32, as wenet/utils/cmvn.py's _load_json_cmvn (variance floor 1e-20)."""
        if self.frame_num < 1:
            raise ValueError("CMVN statistics of no frames")
        mean = [total / self.frame_num for total in self.mean_stat]
        variance = [
            max(square / self.frame_num - m * m, 1.0e-20) for square, m in zip(self.var_stat, mean, strict=True)
        ]
        return torch.tensor(mean, dtype=torch.float32), torch.tensor([1.0 / math.sqrt(v) for v in variance])


def _utterance_sums(utt: Utterance, fbank: FbankConfig, audio: AudioReader) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(sum of frames, sum of squared frames, frames) of one utterance's fbank, as compute_cmvn_stats.py."""
    waveform, rate = audio(utt)
    if rate != fbank.sample_rate:
        waveform = AF.resample(waveform, rate, fbank.sample_rate)
    if fbank.num_frames(waveform.numel()) == 0:
        zeros = torch.zeros(fbank.num_mel_bins, dtype=torch.float64)
        return zeros, zeros, 0
    feats = kaldi.fbank(
        waveform.unsqueeze(0) * (1 << 15),
        num_mel_bins=fbank.num_mel_bins,
        frame_length=fbank.frame_length_ms,
        frame_shift=fbank.frame_shift_ms,
        dither=0.0,
        energy_floor=0.0,
        sample_frequency=float(fbank.sample_rate),
    ).double()
    return feats.sum(dim=0), feats.square().sum(dim=0), feats.shape[0]


def compute_cmvn_stats(
    utterances: Sequence[Utterance],
    fbank: FbankConfig,
    *,
    audio: AudioReader = read_segment,
    threads: int | None = None,
) -> CmvnStats:
    """Sum the fbank features of every utterance (decoded by `audio`), in float64, over a pool of threads.

    Raises:
        DataError: an audio file cannot be read now.
    """
    total = torch.zeros(fbank.num_mel_bins, dtype=torch.float64)
    squares = torch.zeros(fbank.num_mel_bins, dtype=torch.float64)
    frames = 0
    for utt_total, utt_squares, utt_frames in map_utterances(
        lambda utt: _utterance_sums(utt, fbank, audio), utterances, "CMVN statistics", threads
    ):
        total += utt_total
        squares += utt_squares
        frames += utt_frames
    return CmvnStats(mean_stat=tuple(total.tolist()), var_stat=tuple(squares.tolist()), frame_num=frames)


def global_cmvn(
    utterances: Sequence[Utterance], fbank: FbankConfig, *, cache_dir: str | Path | None = None
) -> tuple[CmvnStats, Preparation]:
    """The training list's CMVN statistics: read from the cache, or computed once and cached.

    Args:
        utterances: the whole training list (WeNet reads every line of wav.scp).
        fbank: the recipe's fbank settings (its dither does not apply here).
        cache_dir: cache root; default `autotune.data.offline.cache_root`.

    Raises:
        DataError: an audio file cannot be read, or the cache cannot be written.
    """
    settings: dict[str, Any] = {"version": CMVN_VERSION, "fbank": {**asdict(fbank), "dither": 0.0}}
    path = cache_root(cache_dir) / "cmvn" / f"{corpus_key('cmvn', settings, utterances, with_text=False)}.json"
    try:
        stats = CmvnStats.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        started = time.perf_counter()
        stats = compute_cmvn_stats(utterances, fbank)
        write_text_atomically(path, stats.to_json())
        seconds = time.perf_counter() - started
        return stats, Preparation(what=WHAT, path=str(path), items=len(utterances), seconds=seconds, reused=False)
    return stats, Preparation(what=WHAT, path=str(path), items=len(utterances), seconds=0.0, reused=True)
