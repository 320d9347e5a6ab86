"""Speaker-embedding workloads trained as the 3D-Speaker recipe: AAM-softmax over speakers, SGD with Nesterov."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import preload_if_asked
from autotune.workloads.registry import register

__all__ = ["speaker_workload", "load_speaker_data"]

# 3D-Speaker egs/voxceleb/sv-cam++/conf/cam++.yaml (ERes2Net's recipe uses the same optimiser and loss head)
THREED_SPEAKER_RECIPE = {"optimizer": "sgd", "lr": 0.1, "scale": 32.0, "margin": 0.2}
# SpeechBrain recipes/VoxCeleb/SpeakerRec/hparams/train_ecapa_tdnn.yaml. ECAPA's option augment_copies (0 = off)
# takes SpeechBrain's input shape: waveform crops in the workers, then on the device the original batch plus that many
# augmented copies (the recipe: 4, a model batch 5x the loader batch) and Fbank; see autotune/data/augment.py.
SPEECHBRAIN_RECIPE = {"optimizer": "adam", "lr": 0.001, "scale": 30.0, "margin": 0.2}


def _optimizer(name: str, lr: float, parameters: Any) -> Any:
    import torch

    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return torch.optim.Adam(parameters, lr=lr, weight_decay=2e-6)


def load_speaker_data(path: str | None) -> Any:
    """`--data PATH` as a speaker list or folder, or the embedded synthetic corpus when no path is given."""
    from autotune import data

    return data.default_source() if path is None else data.load_source(path)


def _build_speaker_setup(make_embedder: Callable[[dict[str, Any]], Any], context: WorkloadContext) -> TrainingSetup:
    import torch
    from torch import nn

    from autotune.data import SpeakerCropDataset, collate_speaker_batch
    from autotune.models.margin import ArcMarginLoss, CosineClassifier

    options = context.options
    embedder = make_embedder(options)
    model = nn.ModuleDict(
        {
            "embedder": embedder,
            "classifier": CosineClassifier(options["embedding_size"], len(context.data.speakers)),
            "loss": ArcMarginLoss(scale=options["scale"], margin=options["margin"]),
        }
    )
    crop_s = float(options["crop_s"])
    copies = options.get("augment_copies", 0)
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
        raise ValueError(f"augment_copies must be a whole number >= 0 (SpeechBrain's recipe: 4), got {copies!r}")
    dataset_class = SpeakerCropDataset
    if copies:  # SpeechBrain's shape: waveform crops from the workers, augmentation and Fbank on the device
        from autotune.data.augment import WaveformCropDataset, speechbrain_inputs

        dataset_class = WaveformCropDataset
    dataset = dataset_class(context.data.utterances, context.data.speakers, crop_s=crop_s)
    preload_s = preload_if_asked(dataset, context)

    def loss_fn(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = batch
        if copies:  # the model sees (1 + copies) x the loader batch; samples_in still counts loader samples
            features, labels = speechbrain_inputs(features, labels, copies)
        return module["loss"](module["classifier"](module["embedder"](features)), labels)

    return TrainingSetup(
        model=model,
        optimizer=_optimizer(options["optimizer"], options["lr"], model.parameters()),
        dataset=dataset,
        collate_fn=collate_speaker_batch,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch[1].shape[0]),
        audio_seconds_in=lambda batch: int(batch[1].shape[0]) * crop_s,
        preload_s=preload_s,
    )


def speaker_workload(
    *,
    name: str,
    description: str,
    make_embedder: Callable[[dict[str, Any]], Any],
    published_parameters: int,
    options: dict[str, Any],
) -> Workload:
    """A speaker-embedding workload around one embedding network."""
    return Workload(
        name=name,
        task="speaker-verification",
        description=description,
        build=lambda context: _build_speaker_setup(make_embedder, context),
        load_data=load_speaker_data,
        count_parameters=lambda: sum(p.numel() for p in make_embedder(options).parameters()),
        published_parameters=published_parameters,
        space_file=f"{name}.yaml",
        options=options,
    )


def _campplus(options: dict[str, Any]) -> Any:
    from autotune.models.campplus import CAMPPlus

    return CAMPPlus(embedding_size=options["embedding_size"], memory_efficient=options.get("memory_efficient", False))


@register
def campplus() -> Workload:
    return speaker_workload(
        name="cam++",
        description="CAM++ speaker embedding (3D-Speaker VoxCeleb recipe, 512-d), AAM-softmax, SGD",
        make_embedder=_campplus,
        published_parameters=7_176_224,
        options={"crop_s": 3.0, "embedding_size": 512, "memory_efficient": False, **THREED_SPEAKER_RECIPE},
    )


def _eres2net(options: dict[str, Any]) -> Any:
    from autotune.models.eres2net import ERes2Net

    return ERes2Net(m_channels=options["m_channels"], embedding_size=options["embedding_size"])


@register
def eres2net() -> Workload:
    return speaker_workload(
        name="eres2net",
        description="ERes2Net-base speaker embedding (3D-Speaker, m=32, 192-d), AAM-softmax, SGD",
        make_embedder=_eres2net,
        published_parameters=6_610_688,
        options={"crop_s": 3.0, "embedding_size": 192, "m_channels": 32, **THREED_SPEAKER_RECIPE},
    )


@register
def eres2net_large() -> Workload:
    return speaker_workload(
        name="eres2net-large",
        description="ERes2Net-large speaker embedding (3D-Speaker, m=64, 192-d), AAM-softmax, SGD",
        make_embedder=_eres2net,
        published_parameters=22_462_784,
        options={"crop_s": 3.0, "embedding_size": 192, "m_channels": 64, **THREED_SPEAKER_RECIPE},
    )


def _ecapa(options: dict[str, Any]) -> Any:
    from autotune.models.ecapa_tdnn import ECAPATDNN

    return ECAPATDNN(channels=options["channels"], embedding_size=options["embedding_size"])


@register
def ecapa_tdnn() -> Workload:
    return speaker_workload(
        name="ecapa-tdnn",
        description="ECAPA-TDNN speaker embedding (SpeechBrain VoxCeleb recipe, C=1024), AAM-softmax, Adam",
        make_embedder=_ecapa,
        published_parameters=20_767_552,
        options={"crop_s": 3.0, "embedding_size": 192, "channels": 1024, "augment_copies": 0, **SPEECHBRAIN_RECIPE},
    )


@register
def ecapa_tdnn_512() -> Workload:
    return speaker_workload(
        name="ecapa-tdnn-512",
        description="ECAPA-TDNN speaker embedding (C=512), AAM-softmax, Adam",
        make_embedder=_ecapa,
        published_parameters=6_194_048,  # 'about 6.19M' published; this exact total is the faithful C=512 build
        options={"crop_s": 3.0, "embedding_size": 192, "channels": 512, "augment_copies": 0, **SPEECHBRAIN_RECIPE},
    )
