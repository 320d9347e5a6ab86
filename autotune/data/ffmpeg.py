"""Decoding audio through the ffmpeg command-line program, one subprocess per file, as GPT-SoVITS reads its audio.

GPT-SoVITS's ``tools/my_utils.load_audio`` (RVC-Boss/GPT-SoVITS 48b1a01) runs ``ffmpeg -nostdin -threads 0
-i FILE`` through ffmpeg-python with the output ``-`` in ``f32le`` (``pcm_f32le``, one channel, resampled to the
asked rate) captured from its stdout, and reads the bytes as float32. Its s2 dataset calls it for every item in the
DataLoader workers (module/data_utils.py get_audio), so a process start, a decode and a resample are part of what
each item costs; `load_audio` runs the same command line. ffmpeg is found on PATH as the recipe finds it, else the
binary the ``imageio-ffmpeg`` package ships.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np

from autotune.errors import DataError

__all__ = ["FFMPEG_INSTALL", "find_ffmpeg", "load_audio"]

FFMPEG_INSTALL = "install ffmpeg on PATH, or its binary with `pip install imageio-ffmpeg`"


def find_ffmpeg() -> str | None:
    """The ffmpeg program: ``ffmpeg`` on PATH, else imageio-ffmpeg's binary; None when there is neither."""
    on_path = shutil.which("ffmpeg")
    if on_path is not None:
        return on_path
    try:
        import imageio_ffmpeg
    except ImportError:
        return None
    try:
        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except RuntimeError:  # the package is there but its binary is not (a platform it ships none for)
        return None


def load_audio(path: str, sample_rate: int, ffmpeg: str) -> np.ndarray:
    """The file's audio as mono float32 at ``sample_rate``, decoded by an ffmpeg subprocess (my_utils.load_audio).

    Args:
        path: the audio file.
        sample_rate: the rate ffmpeg resamples to.
        ffmpeg: the program (`find_ffmpeg`).

    Raises:
        DataError: ffmpeg could not decode the file (its last line of stderr says why).
    """
    command = [ffmpeg, "-nostdin", "-threads", "0", "-i", path]
    command += ["-ac", "1", "-acodec", "pcm_f32le", "-ar", str(sample_rate), "-f", "f32le", "-"]
    completed = subprocess.run(command, capture_output=True, check=False)
    if completed.returncode != 0:
        lines = completed.stderr.decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit status {completed.returncode}"
        raise DataError(f"ffmpeg could not decode {path}: {reason}")
    return np.frombuffer(completed.stdout, np.float32)
