"""Workloads: the model families autotune can train, and the plugin loader for users' own."""

from __future__ import annotations

from autotune.workloads import asr as _asr  # noqa: F401  (registers the built-ins)
from autotune.workloads import gpt_sovits as _gpt_sovits  # noqa: F401
from autotune.workloads import gpt_sovits_s2 as _gpt_sovits_s2  # noqa: F401
from autotune.workloads import naturalspeech2 as _naturalspeech2  # noqa: F401
from autotune.workloads import speaker as _speaker  # noqa: F401
from autotune.workloads import tts as _tts  # noqa: F401
from autotune.workloads import wav2vec2 as _wav2vec2  # noqa: F401
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext, move_to_device
from autotune.workloads.registry import WORKLOADS, get, is_plugin, names, register

__all__ = [
    "WORKLOADS",
    "TrainingSetup",
    "Workload",
    "WorkloadContext",
    "get",
    "is_plugin",
    "move_to_device",
    "names",
    "register",
]
