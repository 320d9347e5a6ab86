"""Training data for autotune's trials: sources (lists, folders, the synthetic corpus), features, datasets, and
audio preloaded into RAM."""

from __future__ import annotations

from autotune.data.datasets import SpeakerCropDataset, collate_speaker_batch
from autotune.data.features import FbankConfig, compute_fbank
from autotune.data.preload import PreloadedAudio
from autotune.data.sources import DataSource, Utterance, default_source, load_source
from autotune.data.synth import CORPUS_VERSION, default_cache_dir, ensure_corpus, generate_corpus

__all__ = [
    "CORPUS_VERSION",
    "DataSource",
    "FbankConfig",
    "PreloadedAudio",
    "SpeakerCropDataset",
    "Utterance",
    "collate_speaker_batch",
    "compute_fbank",
    "default_cache_dir",
    "default_source",
    "ensure_corpus",
    "generate_corpus",
    "load_source",
]
