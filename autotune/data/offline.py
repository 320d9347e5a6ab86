"""Offline data preparation a recipe does once before it trains, cached so that every trial (and later run) reuses it.

WeNet computes global CMVN statistics over its training list before training (tools/compute_cmvn_stats.py);
ming024/FastSpeech2 extracts mel, pitch, energy and durations into .npy files once (preprocess.py), and its
DataLoader only reads them. Charging that work to every trial would measure a pipeline the recipe never runs; doing
it in every trial would multiply a one-off cost by the number of trials. So a workload prepares its data once per
run, in the parent process before any trial (`Workload.prepare_data`), into the cache folder; trials find it there.
The cost is reported beside the result (`Preparation`), never counted in the throughput.

Cached results are keyed by what they depend on: the preparation's settings and, for every utterance, its id,
audio file, segment, transcript and the file's size and modification time, so an edited corpus is prepared again.
Writes are atomic (a temp file or folder renamed into place), so a run killed half-way never leaves a result that
looks finished, and two runs racing to prepare the same data both end up with one complete copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from autotune.data.cache import build_folder_atomically, default_cache_dir, temp_sibling
from autotune.data.sources import Utterance
from autotune.errors import DataError

__all__ = [
    "Preparation",
    "complete_check",
    "cache_error",
    "cache_root",
    "corpus_key",
    "map_utterances",
    "write_text_atomically",
    "prepare_once",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_LOG_EVERY_S = 30.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Preparation:
    """What a workload's one-off preparation did, for the run's result.

    Attributes:
        what: what was prepared and after which recipe step, e.g. "global CMVN statistics (WeNet
            tools/compute_cmvn_stats.py)".
        path: where it is cached.
        items: utterances it covers.
        seconds: wall seconds this run spent on it (0.0 when reused).
        reused: True when a previous run's result was found in the cache.
    """

    what: str
    path: str
    items: int
    seconds: float
    reused: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def note(self) -> str:
        """One line for the result's notes."""
        done = "reused from the cache" if self.reused else f"computed once in {self.seconds:.1f} s"
        return (
            f"{self.what} for {self.items} utterances: {done} ({self.path}), before the trials and outside "
            "their throughput, as the recipe prepares them once before training"
        )


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache folder: `cache_dir`, else autotune's default (``$AUTOTUNE_CACHE_DIR``, ...)."""
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def corpus_key(kind: str, settings: dict[str, Any], utterances: Sequence[Utterance], *, with_text: bool) -> str:
    """A 16-hex-digit key of a preparation's kind, settings and every utterance it reads: id, audio file (its size
    and mtime too), segment and, `with_text`, transcript.

    Raises:
        DataError: an audio file can no longer be found.
    """
    stats: dict[str, list[int]] = {}
    items = []
    for utt in utterances:
        if utt.path not in stats:
            try:
                info = os.stat(utt.path)
            except OSError as error:
                raise DataError(
                    f"cannot read audio file {utt.path} (utterance {utt.utt_id}): {error.strerror or error}; it was "
                    "readable when the data was loaded, so check that the file and its storage are intact"
                ) from None
            stats[utt.path] = [info.st_size, info.st_mtime_ns]
        text = utt.text if with_text else None
        items.append([utt.utt_id, utt.path, utt.start_sample, utt.stop_sample, text, *stats[utt.path]])
    payload = json.dumps([kind, settings, items], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cache_error(where: Path, error: OSError) -> DataError:
    """The one-line error for prepared data that cannot be written into the cache folder `where`."""
    return DataError(
        f"cannot write prepared data into {where} ({error.strerror or error}); free disk space or set "
        "AUTOTUNE_CACHE_DIR to a writable folder"
    )


def write_text_atomically(path: Path, text: str) -> None:
    """Write a file through a temp sibling and a rename.

    Raises:
        DataError: the folder is not writable (or the disk is full).
    """
    temp = temp_sibling(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(text)
        os.replace(temp, path)
    except OSError as error:
        temp.unlink(missing_ok=True)
        raise cache_error(path.parent, error) from None


def map_utterances(
    function: Callable[[Utterance], T], utterances: Sequence[Utterance], what: str, threads: int | None = None
) -> Iterator[T]:
    """``function`` of every utterance, in order, computed by a pool of threads (one per core by default).

    The work is decoding and torch operators, which release the GIL; torch's own intra-op threads are set to 1
    meanwhile (and restored), as small per-utterance operators gain nothing from them and the pool already fills
    the cores. Progress is logged every 30 s.
    """
    import torch

    threads = threads or os.cpu_count() or 1
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = last_log = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for done, result in enumerate(pool.map(function, utterances), start=1):
                if time.perf_counter() - last_log > _LOG_EVERY_S:
                    last_log = time.perf_counter()
                    logger.info("%s: %d of %d utterances in %.0f s", what, done, len(utterances), last_log - started)
                yield result
    finally:
        torch.set_num_threads(torch_threads)


def complete_check(manifest: str, version: int | str) -> Callable[[Path], bool]:
    """Whether a prepared folder is complete and current: its manifest, written last, names this version."""

    def is_complete(root: Path) -> bool:
        try:
            return json.loads((root / manifest).read_text()).get("version") == version
        except (OSError, ValueError, AttributeError):
            return False

    return is_complete


def prepare_once(root: Path, build: Callable[[Path], None], is_complete: Callable[[Path], bool]) -> tuple[bool, float]:
    """A preparation's folder in the cache, built once: (reused, seconds it took to build, 0 when reused). A build
    that fails leaves no half folder (build_folder_atomically) and is one DataError naming the cache."""
    if is_complete(root):
        return True, 0.0
    started = time.perf_counter()
    build_folder_atomically(
        root, build=build, is_complete=is_complete, failure=lambda error: cache_error(root.parent, error)
    )
    return False, time.perf_counter() - started
