"""Speaker-embedding workloads trained as their recipes train them: 3D-Speaker's (CAM++, ERes2Net) and SpeechBrain's
(ECAPA-TDNN), each with its own input pipeline, classifier size and margin loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

from autotune.errors import UserError
from autotune.knobs.checkpointing import enabled
from autotune.knobs.feature_device import DEVICE, WORKERS
from autotune.knobs.optimizer_kernels import DEFAULT as DEFAULT_OPTIMIZER
from autotune.knobs.optimizer_kernels import build as build_optimizer
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import preload_if_asked
from autotune.workloads.registry import register

if TYPE_CHECKING:
    from autotune.data import DataSource

__all__ = ["speaker_workload", "load_speaker_data", "speaker_optimizer"]

Pipeline = Literal["3d-speaker", "speechbrain"]
AUGMENT_KINDS = ("noise", "reverb")  # the options naming 3D-Speaker's wav.scp lists, as its recipe YAMLs name them

# 3D-Speaker's recipes (egs/voxceleb/sv-*/conf/*.yaml at 09e7806): SGD (momentum 0.9, Nesterov, weight decay 1e-4),
# ArcMarginLoss scale 32, and in the DataLoader workers speed perturbation (speed_pertub: True, which also triples
# the classes) plus noise/reverb corruption with probability aug_prob, from the wav.scp lists given as noise and
# reverb (None: autotune's synthetic set). The margin is the recipe's final one (MarginScheduler ramps to it); the
# learning rate is the peak of WarmupCosineScheduler (the minimum, CAM++ 1e-4 and ERes2Net 5e-5, lies epochs away
# from any trial). memory_efficient is DTDNN.CAMPPlus's default (True, not overridden in cam++.yaml).
THREED_SPEAKER_PIPELINE = {"optimizer": "sgd", "scale": 32.0, "speed_perturb": True, "noise": None, "reverb": None}
CAMPPLUS_RECIPE = {**THREED_SPEAKER_PIPELINE, "lr": 0.1, "margin": 0.2, "aug_prob": 0.2, "memory_efficient": True}
ERES2NET_RECIPE = {**THREED_SPEAKER_PIPELINE, "lr": 0.2, "margin": 0.3, "aug_prob": 0.8}
# SpeechBrain recipes/VoxCeleb/SpeakerRec/hparams/train_ecapa_tdnn.yaml (9c826ef): Adam (weight decay 2e-6), AAM
# margin 0.2 scale 30, and in compute_forward, on the device, the original batch plus 4 augmented copies
# (augment_copies; 0 = none) and Fbank, there with or without copies, as the recipe's compute_forward has it: see
# autotune/data/augment.py.
SPEECHBRAIN_RECIPE = {"optimizer": "adam", "lr": 0.001, "scale": 30.0, "margin": 0.2, "augment_copies": 4}
# Where each pipeline can compute its fbank (autotune/knobs/feature_device.py), the recipe's placement first:
# 3D-Speaker's WavSVDataset featurises in the workers, and the same Kaldi fbank can run batch-wise in the step;
# SpeechBrain's Fbank follows its on-device augmentation in compute_forward, so it has no choice to make.
FEATURE_DEVICES: dict[str, tuple[str, ...]] = {"3d-speaker": (WORKERS, DEVICE), "speechbrain": ()}
OPTIMIZERS = ("sgd", "adam")  # 3D-Speaker's SGD with Nesterov momentum, SpeechBrain's Adam


def speaker_optimizer(name: str, lr: float, parameters: Any, implementation: str = DEFAULT_OPTIMIZER) -> Any:
    """The recipe's optimizer (`name`: sgd or adam) stepping with `implementation` (knobs/optimizer_kernels.py)."""
    import torch

    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
    if name == "sgd":
        recipe: dict[str, Any] = {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}
        return build_optimizer(torch.optim.SGD, parameters, implementation, lr=lr, **recipe)
    return build_optimizer(torch.optim.Adam, parameters, implementation, lr=lr, weight_decay=2e-6)


def load_speaker_data(path: str | None) -> Any:
    """`--data PATH` as a speaker list or folder, or the embedded synthetic corpus when no path is given."""
    from autotune import data

    return data.default_source() if path is None else data.load_source(path)


def _option_errors(options: dict[str, Any]) -> list[str]:
    """What is wrong with the pipeline options a run was given (empty when nothing is)."""
    errors = []
    if options.get("optimizer", "sgd") not in OPTIMIZERS:
        errors.append(f"optimizer must be one of {', '.join(OPTIMIZERS)} (the recipes'), got {options['optimizer']!r}")
    copies = options.get("augment_copies", 0)
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
        errors.append(f"augment_copies must be a whole number >= 0 (SpeechBrain's recipe: 4), got {copies!r}")
    for name in ("speed_perturb", "memory_efficient"):
        if name in options and not isinstance(options[name], bool):
            errors.append(f"{name} must be true or false, got {options[name]!r}")
    aug_prob = options.get("aug_prob", 0.0)
    if isinstance(aug_prob, bool) or not isinstance(aug_prob, (int, float)) or not 0 <= aug_prob <= 1:
        errors.append(f"aug_prob must be in [0, 1] (CAM++'s recipe 0.2, ERes2Net's 0.8), got {aug_prob!r}")
    for name in AUGMENT_KINDS:
        if options.get(name) is not None and not isinstance(options[name], str):
            errors.append(f"{name} must be the path of a wav.scp ('key path' lines), got {options[name]!r}")
    return errors


def _validated(options: dict[str, Any]) -> dict[str, Any]:
    errors = _option_errors(options)
    if errors:
        raise ValueError(errors[0])
    return options


def _corruption(options: dict[str, Any]) -> Any:
    """3D-Speaker's SpkVeriAug over the run's noise and reverb lists (None when aug_prob is 0)."""
    from autotune.data.corruption import Corruption, augmentation_list, read_augmentation_files

    if not options["aug_prob"]:
        return None
    noise, reverb = (read_augmentation_files(augmentation_list(options[kind], kind)[0], kind) for kind in AUGMENT_KINDS)
    return Corruption(aug_prob=float(options["aug_prob"]), noise=noise, reverb=reverb)


def check_speaker_options(pipeline: Pipeline) -> Callable[[dict[str, Any], DataSource], list[str]]:
    """Workload.check_options for a pipeline: options typed, noise/reverb lists probed (or the synthetic set made)."""

    def check(options: dict[str, Any], data: DataSource) -> list[str]:
        from autotune.data.corruption import augmentation_list, read_augmentation_files

        errors = _option_errors(options)
        if errors:
            raise UserError(f"--option: {errors[0]}")
        if pipeline != "3d-speaker" or not options["aug_prob"]:
            return []
        synthetic = []
        for kind in AUGMENT_KINDS:
            list_path, generated = augmentation_list(options[kind], kind)
            count = len(read_augmentation_files(list_path, kind, probe=not generated))
            if generated:
                synthetic.append(f"{count} {'noise clips' if kind == 'noise' else 'room responses'}")
        if not synthetic:
            return []
        return [
            f"noise/reverb augmentation (aug_prob {options['aug_prob']:g}) was measured with autotune's synthetic "
            f"{' and '.join(synthetic)}, not the recipe's MUSAN / RIRS_NOISES: their decoding cost differs; give "
            "yours as --option noise=wav.scp --option reverb=wav.scp"
        ]

    return check


def _dataset(pipeline: Pipeline, context: WorkloadContext) -> Any:
    """The recipe's dataset: what its DataLoader workers do per item."""
    from autotune.data import SpeakerCropDataset, SpeakerlabDataset

    options, data = context.options, context.data
    crop_s = float(options["crop_s"])
    placement = context.config.feature_device
    if placement is not None and placement not in FEATURE_DEVICES[pipeline]:
        raise ValueError(f"feature_device {placement!r} is not a placement the {pipeline} pipeline runs")
    if pipeline == "3d-speaker":
        return SpeakerlabDataset(
            data.utterances,
            data.speakers,
            crop_s=crop_s,
            speed_perturb=options["speed_perturb"],
            corruption=_corruption(options),
            featurise=placement != DEVICE,
        )
    if pipeline == "speechbrain":  # SpeechBrain's shape: waveform crops from the workers, the rest on the device
        from autotune.data.augment import WaveformCropDataset

        return WaveformCropDataset(data.utterances, data.speakers, crop_s=crop_s)
    return SpeakerCropDataset(data.utterances, data.speakers, crop_s=crop_s)


def _build_speaker_setup(
    make_embedder: Callable[[dict[str, Any]], Any], pipeline: Pipeline, context: WorkloadContext
) -> TrainingSetup:
    import torch
    from torch import nn

    from autotune.data import collate_speaker_batch
    from autotune.models.margin import ArcMarginLoss, CosineClassifier

    options = _validated(context.options)
    if "memory_efficient" in options:  # CAM++: the knob, where a configuration sets it, over the recipe's option
        options = {
            **options,
            "memory_efficient": enabled(context.config.activation_checkpointing, recipe=options["memory_efficient"]),
        }
    dataset = _dataset(pipeline, context)
    preload_s = preload_if_asked(dataset, context)
    model = nn.ModuleDict(
        {
            "embedder": make_embedder(options),
            "classifier": CosineClassifier(options["embedding_size"], dataset.num_classes),
            "loss": ArcMarginLoss(scale=options["scale"], margin=options["margin"], convention=pipeline),
        }
    )
    copies = options["augment_copies"] if pipeline == "speechbrain" else 0
    crop_s, fbank = dataset.crop_s, dataset.fbank
    features_in_step = not dataset.featurise

    def loss_fn(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = batch
        if pipeline == "speechbrain":  # the model sees (1 + copies) x the loader batch; samples_in counts loader ones
            from autotune.data.augment import speechbrain_inputs

            features, labels = speechbrain_inputs(features, labels, copies)
        elif features_in_step:  # feature_device: device; part of the step, so inside the timed window
            features = _device_fbank(features, fbank)
        parts = cast(nn.ModuleDict, module)  # the trial passes setup.model: the ModuleDict built above
        return parts["loss"](parts["classifier"](parts["embedder"](features)), labels)

    return TrainingSetup(
        model=model,
        optimizer=speaker_optimizer(
            options["optimizer"], options["lr"], model.parameters(), context.config.optimizer_impl
        ),
        dataset=dataset,
        collate_fn=collate_speaker_batch,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch[1].shape[0]),
        audio_seconds_in=lambda batch: int(batch[1].shape[0]) * crop_s,
        preload_s=preload_s,
    )


def _device_fbank(waveforms: Any, fbank: Any) -> Any:
    """The workers' fbank of a batch of crops, computed on the batch's device in float32 whatever autocast is active
    (as the workers compute it; the model's autocast starts at its input)."""
    import torch

    from autotune.data.features import batched_fbank

    with torch.autocast(waveforms.device.type, enabled=False):
        return batched_fbank(waveforms, fbank)


def speaker_workload(
    *,
    name: str,
    description: str,
    make_embedder: Callable[[dict[str, Any]], Any],
    published_parameters: int,
    options: dict[str, Any],
    pipeline: Pipeline = "3d-speaker",
    checkpointing: str | None = None,
) -> Workload:
    """A speaker-embedding workload around one embedding network, trained through its recipe's pipeline."""
    return Workload(
        name=name,
        task="speaker-verification",
        description=description,
        build=lambda context: _build_speaker_setup(make_embedder, pipeline, context),
        load_data=load_speaker_data,
        count_parameters=lambda: sum(p.numel() for p in make_embedder(options).parameters()),
        published_parameters=published_parameters,
        space_file=f"{name}.yaml",
        options=options,
        check_options=check_speaker_options(pipeline),
        feature_devices=FEATURE_DEVICES[pipeline],
        checkpointing=checkpointing,
    )


def _campplus(options: dict[str, Any]) -> Any:
    from autotune.models.campplus import CAMPPlus

    return CAMPPlus(embedding_size=options["embedding_size"], memory_efficient=options["memory_efficient"])


@register
def campplus() -> Workload:
    return speaker_workload(
        name="cam++",
        description="CAM++ speaker embedding (3D-Speaker VoxCeleb recipe, 512-d), AAM-softmax, SGD",
        make_embedder=_campplus,
        published_parameters=7_176_224,
        options={"crop_s": 3.0, "embedding_size": 512, **CAMPPLUS_RECIPE},
        checkpointing="3D-Speaker's memory_efficient: each dense layer's BN-ReLU-1x1 bottleneck recomputed in backward",
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
        options={"crop_s": 3.0, "embedding_size": 192, "m_channels": 32, **ERES2NET_RECIPE},
    )


@register
def eres2net_large() -> Workload:
    return speaker_workload(
        name="eres2net-large",
        description="ERes2Net-large speaker embedding (3D-Speaker, m=64, 192-d), AAM-softmax, SGD",
        make_embedder=_eres2net,
        published_parameters=22_462_784,
        options={"crop_s": 3.0, "embedding_size": 192, "m_channels": 64, **ERES2NET_RECIPE},
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
        options={"crop_s": 3.0, "embedding_size": 192, "channels": 1024, **SPEECHBRAIN_RECIPE},
        pipeline="speechbrain",
    )


@register
def ecapa_tdnn_512() -> Workload:
    return speaker_workload(
        name="ecapa-tdnn-512",
        description="ECAPA-TDNN speaker embedding (C=512), AAM-softmax, Adam",
        make_embedder=_ecapa,
        published_parameters=6_194_048,  # 'about 6.19M' published; this exact total is the faithful C=512 build
        options={"crop_s": 3.0, "embedding_size": 192, "channels": 512, **SPEECHBRAIN_RECIPE},
        pipeline="speechbrain",
    )
