"""FastSpeech 2 targets precomputed once per corpus, as ming024's preprocess.py does, and a dataset that reads them.

ming024's recipe preprocesses its corpus before training: per utterance it saves the mel spectrogram, phoneme-level
pitch and energy and the durations as four .npy files (``mel/``, ``pitch/``, ``energy/``, ``duration/``); it fits a
StandardScaler to the pitch and to the energy values of the whole corpus (each utterance's outliers beyond 1.5
inter-quartile ranges left out of the fit), rewrites every file normalised, and writes ``stats.json`` with the
normalised minimum and maximum (which set the model's pitch/energy bins) and the mean and standard deviation. Its
Dataset then only loads the four files per item. `ensure_tts_features` does the same with `TtsFeaturizer`'s targets
into autotune's cache (keyed by the corpus and the feature settings, shared by every trial of a run and by later
runs), and `PrecomputedTtsDataset` reads them in the DataLoader workers, so a trial pays what ming024's loader pays.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.data.audio import read_segment
from autotune.data.offline import Preparation, cache_root, complete_check, corpus_key, map_utterances, prepare_once
from autotune.data.sources import Utterance
from autotune.data.tts import MelConfig, TtsFeaturizer
from autotune.errors import DataError

__all__ = ["FEATURES_VERSION", "FeatureStore", "PrecomputedTtsDataset", "VarianceStats", "ensure_tts_features"]

FEATURES_VERSION = 1  # bump when the targets change for the same inputs
WHAT = "mel, pitch, energy and duration targets (ming024 preprocess.py)"
KINDS = ("mel", "pitch", "energy", "duration")
MANIFEST = "manifest.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class VarianceStats:
    """One entry of ming024's stats.json: the normalised range (the bins' span) and the scaler's mean and std."""

    minimum: float
    maximum: float
    mean: float
    std: float

    @property
    def bin_range(self) -> tuple[float, float]:
        return self.minimum, self.maximum


@dataclass(frozen=True, kw_only=True, slots=True)
class FeatureStore:
    """A corpus's precomputed targets: the folder, each utterance's id and mel frames (file i.npy is utterance i),
    and the pitch and energy statistics."""

    root: Path
    utt_ids: tuple[str, ...]
    frames: tuple[int, ...]
    pitch: VarianceStats
    energy: VarianceStats

    def path(self, kind: str, index: int) -> Path:
        return self.root / kind / f"{index:07d}.npy"

    @classmethod
    def load(cls, root: Path) -> FeatureStore:
        manifest = json.loads((root / MANIFEST).read_text())
        return cls(
            root=root,
            utt_ids=tuple(utt_id for utt_id, _ in manifest["utterances"]),
            frames=tuple(frames for _, frames in manifest["utterances"]),
            pitch=VarianceStats(**manifest["pitch"]),
            energy=VarianceStats(**manifest["energy"]),
        )


_is_complete = complete_check(MANIFEST, FEATURES_VERSION)


def ensure_tts_features(
    utterances: Sequence[Utterance],
    tokens: Sequence[torch.Tensor],
    *,
    config: MelConfig = MelConfig(),  # noqa: B008 - frozen, so a shared default is safe
    cache_dir: str | Path | None = None,
) -> tuple[FeatureStore, Preparation]:
    """The corpus's targets from the cache, precomputed once when missing.

    Args:
        utterances: the utterances to train on (`autotune.data.tts.usable_for_tts`).
        tokens: their symbol ids (the durations spread each mel over them).
        config: audio settings.
        cache_dir: cache root; default `autotune.data.offline.cache_root`.

    Raises:
        DataError: an audio file cannot be read, or the cache cannot be written.
    """
    settings = {"version": FEATURES_VERSION, "mel": asdict(config)}
    root = cache_root(cache_dir) / f"tts-features-{corpus_key('tts-features', settings, utterances, with_text=True)}"
    reused, seconds = prepare_once(root, lambda folder: _precompute(folder, utterances, tokens, config), _is_complete)
    store = FeatureStore.load(root)
    if store.utt_ids != tuple(utt.utt_id for utt in utterances):  # a key collision, or a folder edited by hand
        raise DataError(f"the prepared features in {root} do not match the data; delete that folder and rerun")
    return store, Preparation(what=WHAT, path=str(root), items=len(utterances), seconds=seconds, reused=reused)


def _precompute(
    folder: Path, utterances: Sequence[Utterance], tokens: Sequence[torch.Tensor], config: MelConfig
) -> None:
    """ming024's build_from_path: every utterance's targets saved, pitch and energy normalised over the corpus."""
    featurizer = TtsFeaturizer(config)
    counts = {utt.utt_id: len(ids) for utt, ids in zip(utterances, tokens, strict=True)}
    for kind in KINDS:
        (folder / kind).mkdir()

    def targets(utt: Utterance) -> dict[str, torch.Tensor]:
        return featurizer(*read_segment(utt), counts[utt.utt_id])

    frames: list[int] = []
    raw: dict[str, list[np.ndarray]] = {"pitch": [], "energy": []}
    for index, item in enumerate(map_utterances(targets, utterances, "TTS targets")):
        np.save(folder / "mel" / f"{index:07d}.npy", item["mel"].numpy())
        np.save(folder / "duration" / f"{index:07d}.npy", item["durations"].numpy())
        frames.append(int(item["mel"].shape[0]))
        for kind in raw:
            raw[kind].append(item[kind].numpy().astype(np.float64))
    stats = {kind: _normalise_and_save(folder / kind, values) for kind, values in raw.items()}
    (folder / "stats.json").write_text(json.dumps({kind: list(asdict(s).values()) for kind, s in stats.items()}))
    manifest = {
        "version": FEATURES_VERSION,
        "mel": asdict(config),
        "utterances": [[utt.utt_id, count] for utt, count in zip(utterances, frames, strict=True)],
        **{kind: asdict(s) for kind, s in stats.items()},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))  # last: its presence marks the folder complete


def _without_outliers(values: np.ndarray) -> np.ndarray:
    """ming024's remove_outlier: values strictly within 1.5 inter-quartile ranges of the quartiles."""
    p25, p75 = np.percentile(values, 25), np.percentile(values, 75)
    spread = 1.5 * (p75 - p25)
    return values[(values > p25 - spread) & (values < p75 + spread)]


def _normalise_and_save(folder: Path, per_utterance: list[np.ndarray]) -> VarianceStats:
    """Fit mean and std on every utterance's values without its outliers (StandardScaler.partial_fit: population
    std), save each utterance normalised (float32), and return the normalised range with the fit."""
    fitted = np.concatenate([_without_outliers(values) for values in per_utterance if len(values)])
    mean = float(fitted.mean()) if fitted.size else 0.0
    std = float(fitted.std()) if fitted.size else 0.0
    std = std if std > 0 else 1.0  # a flat contour (one voice, one note): StandardScaler's scale_ is 1 there too
    low, high = np.inf, -np.inf
    for index, values in enumerate(per_utterance):
        normalised = (values - mean) / std
        np.save(folder / f"{index:07d}.npy", normalised.astype(np.float32))
        low, high = min(low, float(normalised.min())), max(high, float(normalised.max()))
    return VarianceStats(minimum=low, maximum=high, mean=mean, std=std)


class PrecomputedTtsDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """FastSpeech 2 items read from a `FeatureStore`: four .npy loads per item, as ming024's Dataset.

    Attributes mirror `autotune.data.tts.TtsDataset` (utterances, tokens, frames, token_counts), so batching and the
    worst-case batch treat both alike.
    """

    def __init__(self, store: FeatureStore, utterances: Sequence[Utterance], tokens: Sequence[torch.Tensor]) -> None:
        self.store, self.utterances, self.tokens = store, tuple(utterances), tuple(tokens)
        self.frames = store.frames
        self.token_counts = tuple(len(ids) for ids in self.tokens)
        self._in_memory: list[tuple[np.ndarray, ...]] | None = None

    def __len__(self) -> int:
        return len(self.utterances)

    def _arrays(self, index: int) -> tuple[np.ndarray, ...]:
        if self._in_memory is not None:
            return self._in_memory[index]
        return tuple(np.load(self.store.path(kind, index)) for kind in KINDS)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """tokens (N,), mel (T, 80), pitch and energy (N,) float32 normalised over the corpus, durations (N,) int64."""
        mel, pitch, energy, durations = (torch.from_numpy(array) for array in self._arrays(index))
        return {
            "tokens": self.tokens[index],
            "mel": mel,
            "pitch": pitch,
            "energy": energy,
            "durations": durations,
            "duration_s": self.utterances[index].duration_s,
        }

    def preload(self) -> float:
        """Read every item's arrays into RAM (a trial's preload_audio: here what the workers read is the targets,
        not audio); returns the wall seconds it took."""
        started = time.perf_counter()
        self._in_memory = [tuple(np.load(self.store.path(kind, i)) for kind in KINDS) for i in range(len(self))]
        return time.perf_counter() - started
