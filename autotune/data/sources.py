"""Training data sources: 3D-Speaker train.csv, WeNet data.list, Kaldi folder, audio folder, or the synthetic corpus.

Every source becomes a `DataSource`: validated utterances (each audio file checked with ``soundfile.info``) plus the
sorted speaker names whose index is the class label.

3D-Speaker train.csv units: ``egs/*/sv-*/local/prepare_data_csv.py`` in 3D-Speaker writes ``start`` and ``stop`` in
SECONDS (chunk ``i`` of ``seg_dur`` seconds, 3.0 in egs/voxceleb and 4.0 in egs/3dspeaker, spans ``i*seg_dur`` to
``min((i+1)*seg_dur, duration)``; with ``--random_seg`` one row spans 0 to the file duration), and ``dur`` is the
duration of the whole file in seconds, not of the chunk. speakerlab's ``WavSVDataset`` ignores start/stop and crops at
random from the whole file; autotune honours them. (SpeechBrain's csv, header ``ID,duration,wav,start,stop,spk_id``,
stores samples instead; it is not accepted here.) WeNet data.list and Kaldi ``text`` formats: `asr_lists`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import soundfile as sf

from autotune.data.lists import ACCEPTED, Row, read_rows
from autotune.data.lists import one_line_error as _error
from autotune.data.pcm import sample_problem
from autotune.yamlio import special_file

__all__ = ["DataSource", "Utterance", "default_source", "load_source"]

logger = logging.getLogger(__name__)

# A segment may end a little past the decoded length (float seconds written by another decoder); clamp, don't fail.
_SEGMENT_SLACK_S = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class Utterance:
    """One training item: a whole audio file or a segment of one."""

    utt_id: str
    path: str  # absolute path of the audio file
    speaker: str
    start_sample: int | None = None  # segment bounds at the file's own sample rate; None = whole file
    stop_sample: int | None = None
    duration_s: float  # of the segment, or of the whole file
    sample_rate: int | None = None  # of the file, as soundfile reported it
    text: str | None = None  # transcript, where the list has one (data.list txt, Kaldi text)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of all fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Utterance:
        """Inverse of `to_dict`."""
        return cls(**d)


@dataclass(frozen=True, kw_only=True, slots=True)
class DataSource:
    """Validated utterances of one data list, folder or corpus."""

    kind: str  # "3d-speaker-csv" | "wenet-data-list" | "kaldi" | "folder" | "synthetic"
    path: str  # absolute path of what the user gave (or the corpus folder)
    utterances: tuple[Utterance, ...]
    speakers: tuple[str, ...]  # sorted unique speaker names of the whole list; label = index in this tuple
    synthetic: bool = False
    n_utterances_total: int | None = None  # entries in the list when a subset was kept; None = all kept

    def total_audio_s(self) -> float:
        """Seconds of audio over all kept utterances."""
        return sum(u.duration_s for u in self.utterances)

    def describe(self) -> dict[str, Any]:
        """Summary for logs and result files.

        Returns:
            kind, path, synthetic, n_utterances, n_utterances_total, subset (whether only part of the list was kept),
            n_speakers, total_audio_hours and the sample_rates seen.
        """
        return {
            "kind": self.kind,
            "path": self.path,
            "synthetic": self.synthetic,
            "n_utterances": len(self.utterances),
            "n_utterances_total": self.n_utterances_total or len(self.utterances),
            "subset": self.n_utterances_total is not None,
            "n_speakers": len(self.speakers),
            "total_audio_hours": round(self.total_audio_s() / 3600.0, 3),
            "sample_rates": sorted({u.sample_rate for u in self.utterances if u.sample_rate is not None}),
        }

    def fingerprint(self) -> str:
        """Short stable hash (12 hex digits) of the kind, path and every utterance's id, path, bounds and duration."""
        items = [[u.utt_id, u.path, u.start_sample, u.stop_sample, u.duration_s] for u in self.utterances]
        payload = json.dumps([self.kind, self.path, items], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; `from_dict` restores an equal DataSource."""
        return {
            "kind": self.kind,
            "path": self.path,
            "synthetic": self.synthetic,
            "n_utterances_total": self.n_utterances_total,
            "speakers": list(self.speakers),
            "utterances": [u.to_dict() for u in self.utterances],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataSource:
        """Inverse of `to_dict`."""
        return cls(
            kind=d["kind"],
            path=d["path"],
            synthetic=d.get("synthetic", False),
            n_utterances_total=d.get("n_utterances_total"),
            speakers=tuple(d["speakers"]),
            utterances=tuple(Utterance.from_dict(u) for u in d["utterances"]),
        )


def _probe(path: str, where: str) -> tuple[int, int]:
    """(sample_rate, frames) of an audio file, or a DataError saying why it cannot be used."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a file name in another encoding: no decoder's fault, and no format to convert
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")  # the bytes as `ls -b` shows them
        raise _error(f"{where}: audio file name {shown} is not valid UTF-8; rename the file") from None
    kind = special_file(path)
    if kind is not None:  # opening a named pipe blocks until something writes to it: the input check would hang
        raise _error(f"{where}: audio file {path} is not a regular file ({kind}); list audio files only")
    try:
        info = sf.info(path)
    except Exception as exc:  # soundfile raises LibsndfileError, RuntimeError or OSError depending on the failure
        if not os.path.exists(path):
            raise _error(f"{where}: audio file {path} does not exist; fix the path or remove the entry") from exc
        reason = getattr(exc, "error_string", None) or str(exc)
        raise _error(
            f"{where}: audio file {path} cannot be read ({reason}); convert it to WAV or FLAC or remove the entry"
        ) from exc
    if info.frames <= 0 or info.samplerate <= 0:
        raise _error(f"{where}: audio file {path} holds no audio; remove the entry")
    return info.samplerate, info.frames


# The input check decodes the first SAMPLED_SECONDS of SAMPLED_FILES files; a bad file beyond them is named by the
# trial that reads it.
SAMPLED_FILES = 16
SAMPLED_SECONDS = 30


def _check_samples(rows: list[Row], seed: int) -> None:
    """Decode the start of a seeded sample of the listed files and refuse samples no recording holds (non-finite, absurd
    amplitude): a header says nothing of them. Every read in a trial checks its crop the same way (data/audio.py)."""
    paths = sorted({row.path: row.where for row in rows}.items())
    chosen = random.Random(seed).sample(paths, min(SAMPLED_FILES, len(paths)))
    for path, where in chosen:
        try:
            with sf.SoundFile(path) as audio:  # the first SAMPLED_SECONDS: a long recording costs no more
                samples = audio.read(SAMPLED_SECONDS * audio.samplerate, dtype="float32", always_2d=True)
        except Exception:  # readable a moment ago (_probe): a decoding failure is the trial's to report
            continue
        problem = sample_problem(samples)
        if problem is not None:
            raise _error(f"{where}: audio file {path} holds {problem}; fix or remove the entry")


def _to_utterance(row: Row, sample_rate: int, frames: int) -> Utterance:
    """An Utterance from a parsed row and its file's header, converting a segment's seconds into samples."""
    start = stop = None
    n_samples = frames
    if row.start_s is not None and row.stop_s is not None:
        start, stop = round(row.start_s * sample_rate), round(row.stop_s * sample_rate)
        if start >= frames or stop > frames + _SEGMENT_SLACK_S * sample_rate:
            raise _error(
                f"{row.where}: segment {row.start_s:g}-{row.stop_s:g} s goes past the end of {row.path} "
                f"({frames / sample_rate:.3f} s); start and stop are seconds (as 3D-Speaker and WeNet write them)"
            )
        stop = min(stop, frames)
        n_samples = stop - start
    return Utterance(
        utt_id=row.utt_id,
        path=row.path,
        speaker=row.speaker,
        start_sample=start,
        stop_sample=stop,
        duration_s=n_samples / sample_rate,
        sample_rate=sample_rate,
        text=row.text,
    )


def load_source(path: str | os.PathLike[str], *, max_utterances: int | None = 20000, seed: int = 0) -> DataSource:
    """Read and validate a data list or folder.

    Args:
        path: a 3D-Speaker train.csv, a WeNet data.list (or a folder holding one), a Kaldi folder (or its wav.scp)
            with utt2spk and/or text, or a folder of audio files. Relative audio paths resolve against the list's
            folder. Transcripts (data.list txt, Kaldi text) fill Utterance.text.
        max_utterances: keep at most this many entries, a seeded random subset in list order; None keeps all.
            Only kept entries are validated. Speakers are counted over the whole list.
        seed: seed of the subset.

    Returns:
        The validated DataSource.

    Raises:
        DataError: the path, the list or one of the kept audio files cannot be used; the message says how to fix it.
    """
    started = time.perf_counter()
    given = Path(os.path.abspath(os.path.expanduser(path)))
    if max_utterances is not None and max_utterances < 1:
        raise _error(f"max_utterances is {max_utterances}; use at least 1, or no limit")
    if not given.exists():
        raise _error(f"data path {given} does not exist; {ACCEPTED}")
    kind, rows = read_rows(given)
    if not rows:
        raise _error(f"{given} lists no utterances (no entries); add at least one")
    total = len(rows)
    speakers = tuple(sorted({r.speaker for r in rows}))
    if max_utterances is not None and total > max_utterances:
        keep = sorted(random.Random(seed).sample(range(total), max_utterances))
        rows = [rows[i] for i in keep]
        logger.info("keeping a seeded random %d of the %d entries of %s", max_utterances, total, given)
    probed: dict[str, tuple[int, int]] = {}  # a csv lists each file once per chunk: probe it once
    utterances = []
    for row in rows:
        if row.path not in probed:
            probed[row.path] = _probe(row.path, row.where)
        utterances.append(_to_utterance(row, *probed[row.path]))
    _check_samples(rows, seed)
    source = DataSource(
        kind=kind,
        path=str(given),
        utterances=tuple(utterances),
        speakers=speakers,
        n_utterances_total=total if total > len(rows) else None,
    )
    logger.info("loaded %s in %.2f s: %s", given, time.perf_counter() - started, source.describe())
    return source


def default_source(cache_dir: str | os.PathLike[str] | None = None) -> DataSource:
    """The embedded synthetic corpus, generated into the cache on first use.

    Args:
        cache_dir: cache root; defaults to `autotune.data.cache.default_cache_dir()`.

    Returns:
        A DataSource of kind "synthetic" with synthetic=True, whose path is the corpus folder.
    """
    from autotune.data.synth import ensure_corpus

    return replace(load_source(ensure_corpus(cache_dir), max_utterances=None), kind="synthetic", synthetic=True)
