"""GPT-SoVITS's s2 stage (SoVITS: the VITS-style generator over cnhubert codes, and its discriminator) trained as its
recipe (RVC-Boss/GPT-SoVITS 48b1a01: GPT_SoVITS/s2_train.py, configs/s2.json, module/data_utils.py,
tools/my_utils.py).

Data: the experiment folder the webui prepares (32 kHz audio, cnhubert features, phones), written once per run before
the trials (`autotune.data.gpt_sovits_s2`, cached), read as ``TextAudioSpeakerLoader`` reads it: per item an ffmpeg
subprocess decodes the audio and the worker computes its 1025-bin spectrogram and loads its features
(`autotune.data.gpt_sovits_s2_loader`). Batches: its ``DistributedBucketSampler`` (spectrogram-frame buckets
[32, 300, ..., 1900], items outside dropped, buckets padded to whole global batches, already dealt by rank) with
``train.batch_size`` items per rank; the trial's epoch accounting counts against what that sampler deals.

The step is s2_train.py's train_and_evaluate: a discriminator step, then a generator step, every batch.
- net_g's forward under autocast (``train.fp16_run``); net_d on the real segment and the generated audio detached;
  the discriminator loss in float32; ``optim_d.zero_grad()``, the scaled backward, ``scaler.unscale_(optim_d)``,
  the gradient norm as ``commons.clip_grad_value_(params, None)`` reads it (one ``p.grad.norm().item()`` per
  parameter: a host sync each on CUDA), the step.
- net_d again on (real, generated); the generator loss: adversarial + feature matching + mel L1 x 45 (the input
  spectrogram's mel sliced at the segment against the generated segment's) + KL + the commitment loss
  (`autotune.models.gpt_sovits_s2.generator_losses`); its scaled backward, unscale, the norm of net_g's gradients
  likewise, the step, ``scaler.update()``.
The trial loop steps one optimiser over one loss, so the discriminator step runs inside the loss function: it
backs its loss up and steps optim_d there, and returns the generator's loss, which the loop scales, backs up and
steps optim_g with (net_g's norm read in optim_g's step pre-hook, after GradScaler has unscaled). Under fp16 the
discriminator has a GradScaler of its own: the recipe's one scaler is moved by an overflow in either step, each
here by its own step's. Under DDP both models have ``find_unused_parameters=True``, as s2_train.py wraps them (net_g's
``ssl_proj`` never gets a gradient): the loop's wrapper for net_g, this module's for net_d. The recipe has no
gradient accumulation; a configuration with it is refused.

Optimisers: AdamW (s2.json: lr 1e-4, betas (0.8, 0.99), eps 1e-9), the learning rate times 0.999875 (the
ExponentialLR that s2_train.py steps once before the first epoch), net_g's text embedding, text encoder and MRTE at
0.4 x (``text_low_lr_rate``), as s2_train.py groups them. The rate decays per epoch; a trial stays in the first.

Options:
- ``size``: ``full`` (s2.json v2: net_g 51.3M parameters, net_d 46.7M, the default) or ``reduced`` (the same code
  narrower, `autotune.models.gpt_sovits_s2.S2_REDUCED`, upsampled by 640 as the recipe so that the data, hop-640
  spectrograms and 50 Hz features, is the recipe's, and its 8-frame segments; net_d has no size to choose), for CPU
  runs and tests. A workload option, not a knob: a different model is a different recipe.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import DataError, WorkloadError
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import load_transcribed_data, unscale_for_clipping
from autotune.workloads.registry import register

if TYPE_CHECKING:
    import torch
    from torch import nn

    from autotune.data import DataSource
    from autotune.data.gpt_sovits_s2 import S2Corpus
    from autotune.data.gpt_sovits_s2_loader import S2Dataset
    from autotune.data.offline import Preparation
    from autotune.knobs.config import TrialConfig
    from autotune.models.gpt_sovits_s2 import S2StepConfig, SynthesizerConfig

__all__ = ["RECIPE_BATCH_SIZE", "gradient_norm", "model_configs"]

RECIPE_BATCH_SIZE = 32  # s2.json train.batch_size, per rank
RECIPE_LR = 1e-4 * 0.999875  # train.learning_rate after the one ExponentialLR step (lr_decay) before epoch 1
TEXT_LR_RATE = 0.4  # train.text_low_lr_rate
RECIPE_BETAS = (0.8, 0.99)
RECIPE_EPS = 1e-9
TEXT_MODULES = ("text_embedding", "encoder_text", "mrte")  # of net_g.enc_p, the low-rate groups in this order
SIZES = ("full", "reduced")


def model_configs(options: dict[str, Any]) -> tuple[SynthesizerConfig, S2StepConfig]:
    """net_g's architecture and the step's settings for the option ``size``.

    Raises:
        WorkloadError: a size that is not full or reduced.
    """
    from autotune.models.gpt_sovits_s2 import S2_REDUCED, S2_REDUCED_STEP, S2_V2, S2_V2_STEP

    size = options.get("size", "full")
    if size not in SIZES:
        raise WorkloadError(f"option size={size!r} is not one of {', '.join(SIZES)}")
    if size == "full":
        return S2_V2, S2_V2_STEP
    model = dataclasses.replace(S2_REDUCED, upsample_rates=(10, 8, 8), upsample_kernel_sizes=(20, 16, 16))
    step = dataclasses.replace(S2_REDUCED_STEP, hop_length=640, segment_size=model.segment_frames * 640)
    return model, step


def _ffmpeg() -> str:
    from autotune.data.ffmpeg import FFMPEG_INSTALL, find_ffmpeg

    found = find_ffmpeg()
    if found is None:
        raise WorkloadError(
            f"gpt-sovits-s2 decodes its audio with the ffmpeg program, which is missing; {FFMPEG_INSTALL}"
        )
    return found


def _check_options(options: dict[str, Any], data: DataSource) -> Sequence[str]:
    model_configs(options)
    _ffmpeg()
    return []


def _dataset(corpus: S2Corpus, step: S2StepConfig, ffmpeg: str) -> S2Dataset:
    """The recipe's dataset; a corpus none of whose items its sampler would batch is refused."""
    from autotune.data.gpt_sovits_s2_loader import BOUNDARIES, S2Dataset, bucket_items
    from autotune.models.gpt_sovits_s2 import linear_spectrogram

    dataset = S2Dataset(corpus, spectrogram=functools.partial(linear_spectrogram, step=step), ffmpeg=ffmpeg)
    if not bucket_items(dataset.lengths):
        raise DataError(
            f"none of the {len(dataset)} items has {BOUNDARIES[0] + 1} to {BOUNDARIES[-1]} spectrogram frames (0.64 s "
            "to 38 s), the lengths GPT-SoVITS's s2 bucket sampler batches; give longer or shorter utterances"
        )
    return dataset


def _prepare(data: DataSource, options: dict[str, Any]) -> Preparation:
    from autotune.data.gpt_sovits_s2 import ensure_s2_data

    corpus, done = ensure_s2_data(data.utterances)
    _dataset(corpus, model_configs(options)[1], _ffmpeg())  # what the sampler keeps, checked before any trial
    return done


def _batch_sampler_factory(lengths: Sequence[int]) -> Any:
    from autotune.data.gpt_sovits_s2_loader import bucket_sampler_epoch

    def factory(config: TrialConfig, generator: torch.Generator, indices: Sequence[int]) -> list[list[int]]:
        """One epoch of this rank's batches from the recipe's own sampler, which deals the data by torch.distributed's
        rank itself (autotune's share, ``indices``, is not used), seeded per epoch as set_epoch seeds it."""
        import torch

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        replicas = torch.distributed.get_world_size() if distributed else 1
        rank = torch.distributed.get_rank() if distributed else 0
        epoch = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))  # the same on every rank
        batch_size = config.per_device_batch_size
        return bucket_sampler_epoch(lengths, batch_size=batch_size, replicas=replicas, rank=rank, epoch=epoch)

    return factory


def gradient_norm(parameters: Iterable[torch.nn.Parameter]) -> float:
    """The 2-norm of the gradients, summed as ``commons.clip_grad_value_(parameters, None)`` sums it: one
    ``.item()`` per parameter with a gradient."""
    total = 0.0
    for parameter in parameters:
        if parameter.grad is not None:
            total += float(parameter.grad.norm(2).item()) ** 2
    return float(total**0.5)


def _generator_groups(net_g: nn.Module) -> list[dict[str, Any]]:
    """s2_train.py's parameter groups: everything else at the learning rate, then each text module at 0.4 x."""
    text = [getattr(net_g.enc_p, name) for name in TEXT_MODULES]
    low = {id(parameter) for module in text for parameter in module.parameters()}
    base = [parameter for parameter in net_g.parameters() if id(parameter) not in low and parameter.requires_grad]
    groups: list[dict[str, Any]] = [{"params": base, "lr": RECIPE_LR}]
    groups += [{"params": list(module.parameters()), "lr": RECIPE_LR * TEXT_LR_RATE} for module in text]
    return groups


class _DiscriminatorStep:
    """s2_train.py's discriminator step on a batch's real and generated segments (see the module docstring)."""

    def __init__(self, net_d: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, device_type: str) -> None:
        self.net_d, self.optimizer, self.scaler, self.device_type = net_d, optimizer, scaler, device_type

    def __call__(self, real: torch.Tensor, generated: torch.Tensor) -> None:
        import torch

        from autotune.models.gpt_sovits_s2 import discriminator_loss

        real_scores, fake_scores, _, _ = self.net_d(real, generated.detach())  # under the loop's autocast
        with torch.autocast(self.device_type, enabled=False):
            loss = discriminator_loss(real_scores, fake_scores)
            self.optimizer.zero_grad()
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            gradient_norm(self.net_d.parameters())
            self.scaler.step(self.optimizer)
            self.scaler.update()


class _GanLoss:
    """The trial loop's loss function: net_g's forward, the discriminator's whole step, then the generator's loss."""

    def __init__(self, discriminator: _DiscriminatorStep, step: S2StepConfig) -> None:
        self.discriminator, self.step = discriminator, step

    def __call__(self, net_g: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        from autotune.models.gpt_sovits_s2 import generator_losses, slice_segments

        step = self.step
        output = net_g(batch["ssl"], batch["spec"], batch["spec_lengths"], batch["text"], batch["text_lengths"])
        real = slice_segments(batch["wav"], output.ids_slice * step.hop_length, step.segment_size)
        self.discriminator(real, output.audio)
        _, fake_scores, real_maps, fake_maps = self.discriminator.net_d(real, output.audio)
        return generator_losses(output, batch["spec"], fake_scores, real_maps, fake_maps, step).total


def _discriminator(context: WorkloadContext, step: S2StepConfig) -> _DiscriminatorStep:
    """net_d on the device (under DDP when the trial has several ranks), its AdamW and its loss scaler."""
    import torch

    from autotune.knobs.optimizer_kernels import build as build_optimizer
    from autotune.knobs.precision import PrecisionSettings
    from autotune.models.gpt_sovits_s2 import MultiPeriodDiscriminator

    device = context.device
    net_d: nn.Module = MultiPeriodDiscriminator(step.periods).to(device).train()
    optimizer = build_optimizer(
        torch.optim.AdamW,
        net_d.parameters(),
        context.config.optimizer_impl,
        lr=RECIPE_LR,
        betas=RECIPE_BETAS,
        eps=RECIPE_EPS,
    )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        net_d = DistributedDataParallel(net_d, device_ids=ids, find_unused_parameters=True)
    scaler = PrecisionSettings(precision=context.config.precision, device_type=device.type).grad_scaler()
    return _DiscriminatorStep(net_d, optimizer, scaler, device.type)


def _build(context: WorkloadContext) -> TrainingSetup:
    import torch

    from autotune.data.gpt_sovits_s2 import SAMPLE_RATE, ensure_s2_data
    from autotune.data.gpt_sovits_s2_loader import collate_s2, samples_per_epoch, worst_bucket_batch
    from autotune.knobs.optimizer_kernels import build as build_optimizer
    from autotune.models.gpt_sovits_s2 import SynthesizerTrn

    if context.config.grad_accum_steps != 1:
        raise WorkloadError(
            f"grad_accum_steps={context.config.grad_accum_steps}: s2_train.py steps both models every batch, with no "
            "accumulation; use 1"
        )
    model_config, step = model_configs(context.options)
    corpus, _ = ensure_s2_data(context.data.utterances)  # prepared before the trials: read from the cache
    dataset = _dataset(corpus, step, _ffmpeg())
    preload_s = dataset.preload() if context.config.preload_audio else 0.0
    net_g = SynthesizerTrn(model_config)
    discriminator_step = _discriminator(context, step)
    optim_g = build_optimizer(
        torch.optim.AdamW,
        _generator_groups(net_g),
        context.config.optimizer_impl,
        lr=RECIPE_LR,
        betas=RECIPE_BETAS,
        eps=RECIPE_EPS,
    )

    def generator_norm(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        unscale_for_clipping(optimizer)  # a fused AdamW under GradScaler still holds scaled gradients here
        gradient_norm(net_g.parameters())

    optim_g.register_step_pre_hook(generator_norm)

    def worst(config: TrialConfig) -> list[Any]:
        indices = worst_bucket_batch(dataset.lengths, dataset.phone_counts, config.per_device_batch_size)
        return [collate_s2([dataset[index] for index in indices])]

    return TrainingSetup(
        model=net_g,
        optimizer=optim_g,
        dataset=dataset,
        collate_fn=collate_s2,
        loss_fn=_GanLoss(discriminator_step, step),
        samples_in=lambda batch: int(batch["wav"].shape[0]),
        audio_seconds_in=lambda batch: float(batch["wav_lengths"].sum()) / SAMPLE_RATE,
        batch_sampler_factory=_batch_sampler_factory(dataset.lengths),
        worst_case_batches=worst,
        preload_s=preload_s,
        item_audio_s=dataset.seconds,
        find_unused_parameters=True,
        samples_per_epoch=lambda config, world_size: samples_per_epoch(
            dataset.lengths, batch_size=config.per_device_batch_size, replicas=world_size
        ),
    )


def _count_parameters() -> int:
    import torch

    from autotune.models.gpt_sovits_s2 import S2_V2, SynthesizerTrn

    with torch.device("meta"):
        model = SynthesizerTrn(S2_V2)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@register
def gpt_sovits_s2() -> Workload:
    return Workload(
        name="gpt-sovits-s2",
        task="tts",
        description="GPT-SoVITS s2 SoVITS generator and discriminator (s2.json v2: ffmpeg-decoded audio, spectrogram "
        "buckets), AdamW GAN step",
        build=_build,
        load_data=lambda path: load_transcribed_data(path, task="TTS"),
        count_parameters=_count_parameters,
        published_parameters=51_310_080,  # GPT-SoVITS's own v2 net_g (tests/models/test_gpt_sovits_s2.py)
        space_file="gpt-sovits-s2.yaml",
        options={"size": "full"},
        check_options=_check_options,
        prepare_data=_prepare,
    )
