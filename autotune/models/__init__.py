"""Built-in speech models whose training throughput autotune measures."""

from __future__ import annotations

from autotune.models.campplus import CAMPPlus
from autotune.models.conformer import ConformerASR
from autotune.models.ecapa_tdnn import ECAPATDNN
from autotune.models.eres2net import ERes2Net
from autotune.models.fastspeech2 import FastSpeech2

__all__ = ["ECAPATDNN", "CAMPPlus", "ConformerASR", "ERes2Net", "FastSpeech2"]
