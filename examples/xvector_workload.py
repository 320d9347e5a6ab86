"""A complete bring-your-own-model workload: an x-vector TDNN speaker embedding trained with softmax.

Run it with the examples folder on the import path:

    PYTHONPATH=examples autotune run --model xvector_workload:workload --data path/to/train.csv

The factory returns an autotune.Workload. Its `build(context)` runs inside every trial process and returns an
autotune.TrainingSetup: the model (with its loss head), the optimizer, a map-style dataset whose items are decoded
and featurised for real in DataLoader workers, the collate function, the loss of a batch, and how many samples and
seconds of audio a batch holds. `load_data(path)` turns `--data` (or None) into an autotune DataSource.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import autotune
from autotune.data import SpeakerCropDataset, collate_speaker_batch, default_source, load_source

CROP_S = 2.0


class XVector(nn.Module):
    """Snyder et al. 2018 x-vector: five TDNN layers, statistics pooling, a 512-d embedding."""

    def __init__(self, feat_dim: int = 80, embedding_size: int = 512) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for in_dim, out_dim, kernel, dilation in [
            (feat_dim, 512, 5, 1),
            (512, 512, 3, 2),
            (512, 512, 3, 3),
            (512, 512, 1, 1),
            (512, 1500, 1, 1),
        ]:
            layers += [nn.Conv1d(in_dim, out_dim, kernel, dilation=dilation), nn.ReLU(), nn.BatchNorm1d(out_dim)]
        self.frames = nn.Sequential(*layers)
        self.embedding = nn.Linear(3000, embedding_size)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = self.frames(features.transpose(1, 2))  # (B, T, F) -> (B, 1500, T')
        return self.embedding(torch.cat([hidden.mean(dim=2), hidden.std(dim=2)], dim=1))


def _build(context: autotune.WorkloadContext) -> autotune.TrainingSetup:
    model = nn.ModuleDict({"embedder": XVector(), "classifier": nn.Linear(512, len(context.data.speakers))})

    def loss_fn(module: nn.Module, batch: Any) -> torch.Tensor:
        features, labels = batch
        return nn.functional.cross_entropy(module["classifier"](module["embedder"](features)), labels)

    crop_s = float(context.options["crop_s"])
    return autotune.TrainingSetup(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        dataset=SpeakerCropDataset(context.data.utterances, context.data.speakers, crop_s=crop_s),
        collate_fn=collate_speaker_batch,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch[1].shape[0]),
        audio_seconds_in=lambda batch: int(batch[1].shape[0]) * crop_s,
    )


def workload() -> autotune.Workload:
    """The factory that `--model xvector_workload:workload` calls."""
    return autotune.Workload(
        name="xvector",
        task="speaker-verification",
        description="x-vector TDNN (example plugin), softmax, Adam",
        build=_build,
        load_data=lambda path: default_source() if path is None else load_source(path),
        count_parameters=lambda: sum(p.numel() for p in XVector().parameters()),
        space_file="cam++.yaml",  # borrow a built-in space, or ship your own and pass --space
        options={"crop_s": CROP_S},
    )
