"""Checks of the audio stack and of the data's storage: the decoders, and how fast a short sample of the data list
reads through the same decoder the trials use (soundfile), against what the tuned training consumes."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any

from autotune.doctor.context import DoctorContext
from autotune.doctor.findings import Finding
from autotune.doctor.registry import check, fail, info, ok, warn
from autotune.doctor.torch_checks import split_message
from autotune.errors import UserError

__all__ = ["ReadSample", "read_sample"]

# Share of a DataLoader worker's time that reading alone may take before the storage, not decoding and features,
# sets the pace: past it the workers wait on storage.
READ_SHARE_WARN = 0.5
COMMON_FORMATS = ("WAV", "FLAC", "OGG", "MP3")  # speech corpora's (OGG holds Opus and Vorbis)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@check("audio.decoders")
def audio_decoders(context: DoctorContext) -> Finding:
    """soundfile (libsndfile) decodes every trial's audio; torchaudio computes fbank. Which formats decode."""
    try:
        import soundfile
    except (ImportError, OSError) as error:  # OSError: the wheel's libsndfile cannot be loaded
        return fail(f"soundfile cannot be imported: {error}", "pip install soundfile (it bundles libsndfile)")
    formats = sorted(soundfile.available_formats())
    figures: dict[str, Any] = {
        "soundfile": soundfile.__version__,
        "libsndfile": soundfile.__libsndfile_version__,
        "formats": formats,
        "torchaudio": _version("torchaudio"),
    }
    common = [name for name in COMMON_FORMATS if name in formats]
    value = (
        f"soundfile {soundfile.__version__} (libsndfile {soundfile.__libsndfile_version__}: {', '.join(common)} "
        f"among {len(formats)} formats)"
    )
    if figures["torchaudio"] is None:
        return fail(f"{value}; torchaudio missing (fbank features)", "pip install torchaudio matching torch", **figures)
    try:
        import torchaudio
    except (ImportError, OSError) as error:
        return fail(f"{value}; torchaudio cannot be imported: {error}", "reinstall torchaudio for this torch")
    backends = getattr(torchaudio, "list_audio_backends", None)
    if backends is not None:
        figures["torchaudio_backends"] = list(backends())
        value += f"; torchaudio {figures['torchaudio']}, backends {', '.join(figures['torchaudio_backends']) or 'none'}"
    else:  # torchaudio 2.9 moved torchaudio.load to torchcodec
        figures["torchcodec"] = importlib.util.find_spec("torchcodec") is not None
        value += f"; torchaudio {figures['torchaudio']} (its load() needs torchcodec: "
        value += "installed)" if figures["torchcodec"] else "not installed; autotune does not use it)"
    if "MP3" not in formats:
        return info(value, "libsndfile before 1.1 cannot read MP3: convert to FLAC or WAV, or upgrade soundfile")
    return ok(value, **figures)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadSample:
    """What a short read of the data list measured, on one thread (one DataLoader worker's view)."""

    files: int
    seconds: float
    audio_seconds: float
    bytes_read: int
    cache_dropped: bool  # the files' page-cache pages were dropped first: storage speed, not RAM's

    @property
    def files_per_second(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else 0.0

    @property
    def audio_seconds_per_second(self) -> float:
        return self.audio_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds > 0 else 0.0


def _drop_cache(path: str) -> bool:
    """Ask the kernel to forget the file's cached pages (clean pages of a local file; a no-op elsewhere)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)


def read_sample(utterances: list[Any], *, crop_s: float | None, budget_s: float) -> ReadSample:
    """Decode utterances one after another through the trials' reader until the list or the time budget ends.

    Args:
        utterances: autotune.data Utterances, e.g. a seeded sample of the list.
        crop_s: read a random crop of this many seconds, as speaker trials do; None reads the whole segment.
        budget_s: stop starting new files after this many seconds.
    """
    from autotune.data.audio import read_segment

    dropped = all([_drop_cache(path) for path in {u.path for u in utterances}])
    files, audio_seconds, bytes_read = 0, 0.0, 0
    started = time.perf_counter()
    for utt in utterances:
        waveform, rate = read_segment(utt, crop_s=crop_s)
        files += 1
        audio_seconds += waveform.numel() / rate
        bytes_read += waveform.numel() * 2  # as 16-bit PCM, the common training format, whatever the file holds
        if time.perf_counter() - started > budget_s:
            break
    return ReadSample(
        files=files,
        seconds=time.perf_counter() - started,
        audio_seconds=audio_seconds,
        bytes_read=bytes_read,
        cache_dropped=dropped,
    )


def _needed(context: DoctorContext) -> tuple[float, int] | None:
    """(samples/s the tuned training consumes, the DataLoader workers reading them), from --result."""
    tuned = context.tuned
    if tuned is None:
        return None
    rate = tuned.winner.samples_per_second
    if not rate:
        return None
    return float(rate), max(1, tuned.config.num_workers) * tuned.config.world_size


@check("data.read")
def data_read(context: DoctorContext) -> Finding:
    """Files/s and audio-seconds/s a short sample of --data reads from its storage, on one worker's thread."""
    request = context.request
    if request.data is None:
        return info("not measured", "pass --data LIST to time reading a sample of it from its storage")
    from autotune.data import load_source

    try:
        source = load_source(request.data, max_utterances=request.read_files, seed=1)
    except UserError as error:
        what, how = split_message(str(error))
        return fail(what, how)
    options = context.tuned.workload.get("options") or {} if context.tuned else {}
    crop_s = options.get("crop_s") or (context.workload.options.get("crop_s") if context.workload else None)
    try:
        sample = read_sample(list(source.utterances), crop_s=crop_s, budget_s=request.read_budget_s)
    except UserError as error:
        what, how = split_message(str(error))
        return fail(what, how)
    figures = {
        "files": sample.files,
        "seconds": round(sample.seconds, 3),
        "files_per_second": round(sample.files_per_second, 1),
        "audio_seconds_per_second": round(sample.audio_seconds_per_second, 1),
        "pcm_megabytes_per_second": round(sample.megabytes_per_second, 1),
        "crop_s": crop_s,
        "cache_dropped": sample.cache_dropped,
    }
    what = f"{crop_s:g} s crops" if crop_s else "whole utterances"
    value = (
        f"{sample.files_per_second:.0f} files/s, {sample.audio_seconds_per_second:.0f} audio-s/s on one thread "
        f"({sample.files} files of {what} in {sample.seconds:.2f} s"
        + (", page cache dropped first)" if sample.cache_dropped else ", possibly from the page cache)")
    )
    needed = _needed(context)
    if needed is None:
        return info(value, "pass --result to compare with what the tuned training consumes", **figures)
    rate, readers = needed
    share = rate / readers / sample.files_per_second if sample.files_per_second else float("inf")
    figures.update(needed_samples_per_second=rate, readers=readers, read_share_of_worker_time=round(share, 3))
    value += f"; training takes {rate:.0f} samples/s over {readers} worker(s): reading is {share:.0%} of their time"
    if share > READ_SHARE_WARN:
        slower = "cannot keep up: the storage sets the pace" if share >= 1 else "leaves the workers little time"
        return warn(
            f"{value}; reading {slower}",
            "copy the data to local NVMe, preload it (autotune's preload_audio), or add workers",
            **figures,
        )
    return ok(value, **figures)
