"""Batches formed by the items' lengths instead of a sample count: the vocabulary of WeNet's batch_conf, as the
conformer's workload knobs carry it (Workload.knobs) and a result file records it.

Generic code (the DataLoader's arguments, the result, the exports, the space, the assessment) reads these names and
values from here and nowhere else: a result is read by load_config without its workload, so the words it holds are
the format, and the workload (workloads/asr.py) builds its batches from the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BATCH_TYPES",
    "BUCKET",
    "DYNAMIC",
    "FRAMES_KNOB",
    "KNOBS",
    "STATIC",
    "TYPE_KNOB",
    "batch_type",
    "by_length",
    "frame_budget",
]

TYPE_KNOB = "batch_type"  # static | dynamic | bucket
FRAMES_KNOB = "max_frames_in_batch"  # padded fbank frames per device batch (dynamic), or the bucket sizes' budget
STATIC, DYNAMIC, BUCKET = "static", "dynamic", "bucket"
BATCH_TYPES = (STATIC, DYNAMIC, BUCKET)
# Every knob of length batching: a space naming one for a workload whose items have one length is refused in words
# that say why (space/params.py check_name).
KNOBS = (TYPE_KNOB, FRAMES_KNOB, "num_buckets", "bucket_scaling")


def batch_type(workload_knobs: Mapping[str, Any]) -> str:
    """The configuration's batching: static (a sample count, also where the workload has no such knob)."""
    return str(workload_knobs.get(TYPE_KNOB, STATIC))


def by_length(workload_knobs: Mapping[str, Any]) -> bool:
    """Batches formed by a padded-frame budget (dynamic) or per length bucket, not by one sample count: the
    dataset pipeline forms them, and DataLoader gets batch_size None."""
    return workload_knobs.get(TYPE_KNOB) in (DYNAMIC, BUCKET)


def frame_budget(workload_knobs: Mapping[str, Any]) -> int | None:
    """The frames per device batch the configuration sets, if it sets one."""
    frames = workload_knobs.get(FRAMES_KNOB)
    return int(frames) if frames else None
