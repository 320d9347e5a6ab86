"""GPT-SoVITS's s1 stage (the autoregressive text-to-semantic model) trained as its recipe (RVC-Boss/GPT-SoVITS
48b1a01: GPT_SoVITS/s1_train.py, configs/s1longer-v2.yaml, AR/data, AR/models/t2s_lightning_module.py).

Data: the experiment folder the webui prepares, written once per run before the trials (`autotune.data.gpt_sovits`,
cached), read as ``Text2SemanticDataset`` reads it: ids in RAM, one BERT feature file loaded per item in the workers.
Batches: its ``DistributedBucketSampler`` (2-second buckets, groups of batch x ranks, already dealt by rank) cut by the
DataLoader into ``train.batch_size`` items per GPU (capped at a quarter of the dataset: data_module.py:46-52).
The optimizer: ScaledAdam (lr 0.01, betas (0.9, 0.95), clipping_scale 2.0; `autotune.workloads.scaled_adam`) with
``WarmupCosineLRSchedule``, which lr_schedulers.py:58 locks at 0.002 whatever its warm-up says: the first step runs
at ScaledAdam's 0.01 (the scheduler steps after the optimizer), every later one at 0.002. Steps every 4 batches
(t2s_lightning_module.py:54-57, hard-coded: the space's fixed grad_accum_steps 4; the recipe's first step comes after
5 batches, then every 4). Each step also reads its top-3 accuracy to the host (``.item()`` in forward_old).

Options:
- ``size``: ``full`` (s1longer-v2.yaml, 77.6M parameters, the default) or ``reduced`` (the same code at width 32,
  two layers, for CPU runs and tests). A workload option, not a knob: a different model is a different recipe.
- ``lightning_resharding``: ``false`` (the recipe since PR 756, commit 4f8e1660: ``use_distributed_sampler=False`` at
  s1_train.py:127, so each rank trains on the bucket sampler's own share) or ``true`` (the recipe before it, issues
  750 and 1318: Lightning wraps the sampler, already dealt by rank, and deals its items over the ranks again, so each
  rank trains on 1/N^2 of the data per epoch). With several devices every trial then fails the epoch accounting
  (trial/sampling.py), which is what the option is for: the check catches the bug.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import WorkloadError
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import load_transcribed_data, longest_batch
from autotune.workloads.registry import register

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.data.offline import Preparation
    from autotune.knobs.config import TrialConfig

__all__ = ["RECIPE_BATCH_SIZE", "recipe_batch_size", "recipe_lr"]

RECIPE_BATCH_SIZE = 8  # s1longer-v2.yaml train.batch_size, per GPU
RECIPE_LR = 0.01  # ScaledAdam(lr=0.01), t2s_lightning_module.py:126
LOCKED_LR = 0.002  # lr_schedulers.py:58
RECIPE_BETAS = (0.9, 0.95)
RECIPE_CLIPPING_SCALE = 2.0
RECIPE_CLIPPING_PERIOD = 1000
SIZES = ("full", "reduced")


def recipe_lr(step: int) -> float:
    """The learning rate of 1-based optimiser step ``step``: ScaledAdam's own at the first, then the schedule's lock."""
    return RECIPE_LR if step <= 1 else LOCKED_LR


def recipe_batch_size(batch_size: int, dataset_size: int) -> int:
    """The DataLoader's batch: train.batch_size capped at a quarter of the dataset, at least 1 (data_module.py:51)."""
    return max(min(batch_size, dataset_size // 4), 1)


def _model_config(options: dict[str, Any]) -> Any:
    from autotune.models.gpt_sovits_s1 import S1_REDUCED, S1_V2

    size = options.get("size", "full")
    if size not in SIZES:
        raise WorkloadError(f"option size={size!r} is not one of {', '.join(SIZES)}")
    # The reduced model keeps the recipe's vocabularies, so the prepared ids fit it.
    fitted = {"vocab_size": S1_V2.vocab_size, "phoneme_vocab_size": S1_V2.phoneme_vocab_size, "eos": S1_V2.eos}
    return S1_V2 if size == "full" else dataclasses.replace(S1_REDUCED, **fitted)


def _resharding(options: dict[str, Any]) -> bool:
    value = options.get("lightning_resharding", False)
    if not isinstance(value, bool):
        raise WorkloadError(f"option lightning_resharding={value!r} must be true or false")
    return value


def _check_options(options: dict[str, Any], data: DataSource) -> Sequence[str]:
    _model_config(options)
    if not _resharding(options):
        return []
    return [
        "lightning_resharding=true: Lightning deals the recipe's bucket sampler, already dealt by rank, over the "
        "ranks again (GPT-SoVITS before PR 756): with several devices each rank trains on 1/N^2 of the data and "
        "every trial fails the epoch accounting"
    ]


def _prepare(data: DataSource, options: dict[str, Any]) -> Preparation:
    from autotune.data.gpt_sovits import ensure_s1_data

    return ensure_s1_data(data.utterances)[1]


def _batch_sampler_factory(seconds: Sequence[float], resharding: bool) -> Any:
    from autotune.data.gpt_sovits import bucket_sampler_epoch, loader_batches, reshard

    def factory(config: TrialConfig, generator: torch.Generator, indices: Sequence[int]) -> list[list[int]]:
        """One epoch of this rank's batches from the recipe's own sampler, which deals the whole dataset by
        torch.distributed's rank itself (so autotune's share, ``indices``, is not used: the recipe since PR 756),
        then, with lightning_resharding, dealt over the ranks again as Lightning's wrapper does."""
        import torch

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        replicas = torch.distributed.get_world_size() if distributed else 1
        rank = torch.distributed.get_rank() if distributed else 0
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))  # the same on every rank
        batch_size = recipe_batch_size(config.per_device_batch_size, len(seconds))
        samples = bucket_sampler_epoch(seconds, batch_size=batch_size, replicas=replicas, rank=rank, seed=seed)
        if resharding:
            samples = reshard(samples, replicas=replicas, rank=rank, seed=seed, epoch=0)
        return loader_batches(samples, batch_size)

    return factory


def _worst_case_batches(dataset: Any) -> Any:
    """The costliest batch: the items with the most semantic tokens, holding the one with the most phones."""
    from autotune.data.gpt_sovits import collate_s1

    def worst(config: TrialConfig) -> list[Any]:
        count = recipe_batch_size(config.per_device_batch_size, len(dataset))
        return [longest_batch(dataset, collate_s1, count, dataset.semantic_counts, dataset.phone_counts)]

    return worst


def _lr_hook() -> Any:
    steps = 0

    def hook(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        nonlocal steps
        steps += 1
        for group in optimizer.param_groups:
            group["lr"] = recipe_lr(steps)

    return hook


def _build(context: WorkloadContext) -> TrainingSetup:
    from torch import nn

    from autotune.data.gpt_sovits import SEMANTIC_HZ, S1Dataset, collate_s1, ensure_s1_data
    from autotune.models.gpt_sovits_s1 import Text2SemanticDecoder
    from autotune.workloads.scaled_adam import ScaledAdam

    corpus, _ = ensure_s1_data(context.data.utterances)  # prepared before the trials: read from the cache
    dataset = S1Dataset(corpus)
    preload_s = dataset.preload() if context.config.preload_audio else 0.0
    model = Text2SemanticDecoder(_model_config(context.options))
    optimizer = ScaledAdam(
        model.parameters(),
        lr=RECIPE_LR,
        betas=RECIPE_BETAS,
        clipping_scale=RECIPE_CLIPPING_SCALE,
        clipping_update_period=RECIPE_CLIPPING_PERIOD,
    )
    optimizer.register_step_pre_hook(_lr_hook())

    def loss_fn(module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss, accuracy = module(
            batch["phoneme_ids"],
            batch["phoneme_ids_len"],
            batch["semantic_ids"],
            batch["semantic_ids_len"],
            batch["bert_feature"],
        )
        accuracy.item()  # forward_old returns the accuracy as a Python float: a host sync per step
        return loss

    return TrainingSetup(
        model=model,
        optimizer=optimizer,
        dataset=dataset,
        collate_fn=collate_s1,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch["phoneme_ids"].shape[0]),
        audio_seconds_in=lambda batch: float(batch["semantic_ids_len"].sum()) / SEMANTIC_HZ,
        batch_sampler_factory=_batch_sampler_factory(dataset.seconds, _resharding(context.options)),
        worst_case_batches=_worst_case_batches(dataset),
        preload_s=preload_s,
        item_audio_s=dataset.seconds,
    )


def _count_parameters() -> int:
    import torch

    from autotune.models.gpt_sovits_s1 import S1_V2, Text2SemanticDecoder

    with torch.device("meta"):
        model = Text2SemanticDecoder(S1_V2)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@register
def gpt_sovits_s1() -> Workload:
    return Workload(
        name="gpt-sovits-s1",
        task="tts",
        description="GPT-SoVITS s1 text-to-semantic transformer (s1longer-v2 recipe: 2 s bucket sampler), ScaledAdam",
        build=_build,
        load_data=lambda path: load_transcribed_data(path, task="TTS"),
        count_parameters=_count_parameters,
        published_parameters=77_606_402,  # GPT-SoVITS's own v2 model, trainable (tests/models/test_gpt_sovits_s1.py)
        space_file="gpt-sovits-s1.yaml",
        options={"size": "full", "lightning_resharding": False},
        check_options=_check_options,
        prepare_data=_prepare,
    )
