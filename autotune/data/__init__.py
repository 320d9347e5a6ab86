"""Training data for autotune's trials: sources (lists, folders, the synthetic corpus and noise set), features,
datasets and their recipes' augmentation, and audio preloaded into RAM."""

from __future__ import annotations

from autotune.data.cache import default_cache_dir
from autotune.data.datasets import SpeakerCropDataset, SpeakerlabDataset, collate_speaker_batch
from autotune.data.features import FbankConfig, compute_fbank
from autotune.data.preload import PreloadedAudio
from autotune.data.sources import DataSource, Utterance, default_source, load_source
from autotune.data.synth import CORPUS_VERSION, ensure_corpus, generate_corpus
from autotune.data.synth_noise import ensure_noise_set, generate_noise_set

__all__ = [
    "CORPUS_VERSION",
    "DataSource",
    "FbankConfig",
    "PreloadedAudio",
    "SpeakerCropDataset",
    "SpeakerlabDataset",
    "Utterance",
    "collate_speaker_batch",
    "compute_fbank",
    "default_cache_dir",
    "default_source",
    "ensure_corpus",
    "ensure_noise_set",
    "generate_corpus",
    "generate_noise_set",
    "load_source",
]
