"""wav2vec2 CTC ASR trained as SpeechBrain's CommonVoice recipe trains it (``wav2vec2-ctc``).

``recipes/CommonVoice/ASR/CTC/train_with_wav2vec.py`` with ``hparams/train_fr_with_wav2vec.yaml`` (speechbrain/
speechbrain v1.0.0, a8b67d9): batch_size 12 per process, dataloader num_workers 6, precision fp32, no gradient
accumulation; ``sorting: ascending`` (duration-sorted batches, no shuffle), utterances over 10 s dropped; per item
the audio read and resampled to 16 kHz; on the device ``wav_augment`` (speed perturbation, frequency drop, chunk
drop) before the model; the pipeline is `autotune.data.speechbrain_asr`. The model is `autotune.models.wav2vec2_ctc`
(LeBenchmark wav2vec2-FR-7K-large, randomly initialised, the DNN head and a CTC layer) with its CTC loss.

Two optimizers, as the recipe's ``init_optimizers``: Adam (lr_wav2vec 1e-4) over the wav2vec2 encoder and Adadelta
(lr 1.0, rho 0.95, eps 1e-8) over the head, each clipped to its own gradient norm 5 (Brain.optimizers_step,
max_grad_norm) and stepped together (`autotune.workloads.optimizer_set`). The recipe leaves the encoder's Adam idle
for its first 500 steps (warmup_steps, ``freeze_optimizers``) while its gradients are still computed; trials time the
steady state after it, both optimizers stepping. The optimizer_impl knob selects Adam's kernel; torch has no fused
Adadelta, so the head's takes foreach where that is asked and torch's default otherwise.

Option ``size``: ``full`` (the recipe's 318.7M-parameter model, the default) or ``reduced``: the same code path with
the recipe's seven feature convolutions (so the same 20 ms frames, CTC lengths and head input as the full model) and
narrow layers, for machines where a step of the full model does not fit a trial (a CPU). It is an option rather than a
name of its own (as ``ecapa-tdnn-512`` is) because no one publishes or trains that size: it measures the recipe's
pipeline, not a model anyone would deploy, and every result says which size it measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from autotune.errors import DataError, UserError
from autotune.knobs.optimizer_kernels import build as build_optimizer
from autotune.workloads.base import TrainingSetup, Workload, WorkloadContext
from autotune.workloads.common import load_transcribed_data, longest_batch, preload_if_asked, unscale_for_clipping
from autotune.workloads.registry import register

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.knobs.config import TrialConfig
    from autotune.models.wav2vec2_ctc import Wav2Vec2CTC, Wav2Vec2CTCConfig

__all__ = ["RECIPE_OPTIONS", "SIZES", "model_config", "recipe_optimizers"]

SIZES = ("full", "reduced")
RECIPE_OUTPUT_NEURONS = 76  # output_neurons: the SentencePiece vocabulary the published total counts
RECIPE_GRAD_CLIP = 5.0  # Brain's max_grad_norm, per optimizer
RECIPE_ADADELTA_RHO, RECIPE_ADADELTA_EPS = 0.95, 1e-8  # model_opt_class
SLOWEST_SPEED_PERCENT = 95  # speed_perturb's slowest: the longest batches the model meets
# The yaml's values; sorting and wav_augment may be changed as the yaml can change them, max_duration_s is
# avoid_if_longer_than.
RECIPE_OPTIONS: dict[str, Any] = {
    "size": "full",
    "lr": 1.0,
    "lr_wav2vec": 0.0001,
    "sorting": "ascending",
    "wav_augment": True,
    "max_duration_s": 10.0,
}


def model_config(size: str, vocabulary_size: int) -> Wav2Vec2CTCConfig:
    """The model of a size, its CTC layer the recipe's 76 outputs or the vocabulary's size where that is larger."""
    from autotune.models.wav2vec2 import Wav2Vec2Config
    from autotune.models.wav2vec2_ctc import Wav2Vec2CTCConfig

    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {', '.join(SIZES)}")
    outputs = max(RECIPE_OUTPUT_NEURONS, vocabulary_size)
    if size == "full":
        return Wav2Vec2CTCConfig(output_neurons=outputs)
    narrow = Wav2Vec2Config(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        conv_dim=(64,) * 7,
        num_conv_pos_embedding_groups=16,
    )
    return replace(Wav2Vec2CTCConfig(), encoder=narrow, dnn_neurons=128, output_neurons=outputs)


def _clip_hook(optimizer: torch.optim.Optimizer) -> Any:
    """Brain.optimizers_step's clipping: this optimizer's first group's gradients to norm 5, after unscaling."""
    import torch

    def hook(_: torch.optim.Optimizer, *__: Any) -> None:
        unscale_for_clipping(optimizer)
        torch.nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], RECIPE_GRAD_CLIP)

    return hook


def recipe_optimizers(model: Wav2Vec2CTC, options: dict[str, Any], implementation: str) -> torch.optim.Optimizer:
    """The recipe's Adam over ``wav2vec2`` and Adadelta over ``enc`` and ``ctc_lin``, stepped as one optimizer."""
    import torch

    from autotune.workloads.optimizer_set import OptimizerSet

    encoder = build_optimizer(torch.optim.Adam, model.wav2vec2.parameters(), implementation, lr=options["lr_wav2vec"])
    head_params = [*model.enc.parameters(), *model.ctc_lin.parameters()]
    head = torch.optim.Adadelta(
        head_params,
        lr=options["lr"],
        rho=RECIPE_ADADELTA_RHO,
        eps=RECIPE_ADADELTA_EPS,
        foreach=True if implementation == "foreach" else None,  # None: torch's default
    )
    for member in (encoder, head):
        member.register_step_pre_hook(_clip_hook(member))
    return OptimizerSet(encoder, head)


def _option_errors(options: dict[str, Any]) -> list[str]:
    from autotune.data.speechbrain_asr import SORTINGS

    errors = []
    if options.get("size") not in SIZES:
        errors.append(f"size must be one of {', '.join(SIZES)}, got {options.get('size')!r}")
    if options.get("sorting") not in SORTINGS:
        errors.append(
            f"sorting must be one of {', '.join(SORTINGS)} (the recipe's choices), got {options['sorting']!r}"
        )
    if not isinstance(options.get("wav_augment"), bool):
        errors.append(f"wav_augment must be true or false, got {options.get('wav_augment')!r}")
    for name in ("lr", "lr_wav2vec", "max_duration_s"):
        value = options.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            errors.append(f"{name} must be a positive number (the recipe's {RECIPE_OPTIONS[name]}), got {value!r}")
    return errors


def _check_options(options: dict[str, Any], data: DataSource) -> list[str]:
    """Options typed; notes on what the measurement stands for."""
    from autotune.data.asr import CharVocabulary
    from autotune.data.speechbrain_asr import SAMPLE_RATE

    errors = _option_errors(options)
    if errors:
        raise UserError(f"--option: {errors[0]}")
    notes = []
    if options["size"] == "reduced":
        notes.append(
            "measured with the reduced wav2vec2 (option size=reduced: the recipe's pipeline, feature convolutions "
            "and head on narrow layers), not the recipe's 318.7M-parameter model: the batch and loader settings "
            "transfer, the speed does not"
        )
    if all(utterance.sample_rate == SAMPLE_RATE for utterance in data.utterances):
        notes.append(
            f"every file is already {SAMPLE_RATE} Hz, so the per-item resampling the recipe does for CommonVoice's "
            "48 kHz MP3 cost nothing here; give your own corpus with --data to measure its decoding"
        )
    vocabulary = len(CharVocabulary.from_texts(u.text or "" for u in data.utterances))
    if vocabulary > RECIPE_OUTPUT_NEURONS:
        notes.append(
            f"the transcripts hold {vocabulary} tokens (characters and CTC's specials), more than the recipe's "
            f"output_neurons {RECIPE_OUTPUT_NEURONS}: the CTC layer was sized to {vocabulary}; set output_neurons "
            "so in your yaml"
        )
    return notes


def _validated(options: dict[str, Any]) -> dict[str, Any]:
    errors = _option_errors(options)
    if errors:
        raise ValueError(errors[0])
    return options


def _batch_sampler_factory(durations_s: Sequence[float], sorting: str) -> Any:
    from autotune.data.speechbrain_asr import sorted_batches

    def factory(config: TrialConfig, generator: torch.Generator, indices: Sequence[int]) -> Any:
        """One epoch of this rank's share as the recipe's loader batches it: sorted by duration, in order."""
        return sorted_batches(durations_s, indices, config.per_device_batch_size, sorting)

    return factory


def _worst_case_batches(dataset: Any, collate_fn: Any, augment: bool) -> Any:
    """The costliest batch: the longest utterances (the most tokens among them), at the slowest speed perturbation."""
    samples = [round(duration * 16000) for duration in dataset.durations_s]
    tokens = [len(token) for token in dataset.tokens]

    def worst(config: TrialConfig) -> list[Any]:
        batch = longest_batch(dataset, collate_fn, config.per_device_batch_size, samples, tokens)
        return [{**batch, "speed_percent": SLOWEST_SPEED_PERCENT} if augment else batch]

    return worst


def _build(context: WorkloadContext) -> TrainingSetup:
    from torch import nn

    from autotune.data.asr import CharVocabulary
    from autotune.data.speechbrain_asr import SpeechBrainAsrDataset, collate_speechbrain_asr, wav_augment
    from autotune.models.wav2vec2_ctc import Wav2Vec2CTC

    options = _validated(context.options)
    utterances = context.data.utterances
    vocabulary = CharVocabulary.from_texts(u.text or "" for u in utterances)
    dataset = SpeechBrainAsrDataset(utterances, vocabulary, max_duration_s=float(options["max_duration_s"]))
    if len(dataset) == 0:
        raise DataError(
            f"none of the {len(utterances)} utterances is at most {options['max_duration_s']:g} s long (the "
            "recipe's avoid_if_longer_than); give shorter utterances or raise --option max_duration_s"
        )
    preload_s = preload_if_asked(dataset, context)  # before the worst-case batches, which read through the dataset
    model = Wav2Vec2CTC(model_config(options["size"], len(vocabulary)))
    augment = bool(options["wav_augment"])

    def loss_fn(module: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        recipe = cast("Wav2Vec2CTC", module)  # the trial passes setup.model: the Wav2Vec2CTC built above
        wavs = wav_augment(batch["wavs"], batch.get("speed_percent")) if augment else batch["wavs"]
        log_probs = recipe(wavs, batch["wav_lens"])
        return recipe.loss(log_probs, batch["tokens"], batch["wav_lens"], batch["token_lens"])

    return TrainingSetup(
        model=model,
        optimizer=recipe_optimizers(model, options, context.config.optimizer_impl),
        dataset=dataset,
        collate_fn=collate_speechbrain_asr,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch["tokens"].shape[0]),
        audio_seconds_in=lambda batch: float(batch["durations_s"].sum()),
        batch_sampler_factory=_batch_sampler_factory(dataset.durations_s, str(options["sorting"])),
        worst_case_batches=_worst_case_batches(dataset, collate_speechbrain_asr, augment),
        preload_s=preload_s,
        item_audio_s=dataset.durations_s,  # as durations_s counts them
    )


def _count_parameters() -> int:
    """The recipe's model with its 76 outputs, built on the meta device: counted without allocating 1.3 GB."""
    import torch

    from autotune.models.wav2vec2_ctc import Wav2Vec2CTC

    with torch.device("meta"):
        model = Wav2Vec2CTC(model_config("full", RECIPE_OUTPUT_NEURONS))
    return sum(p.numel() for p in model.parameters())


@register
def wav2vec2_ctc() -> Workload:
    return Workload(
        name="wav2vec2-ctc",
        task="asr",
        description="wav2vec2-large CTC ASR (SpeechBrain CommonVoice recipe: DNN head, 76 tokens), Adam + Adadelta",
        build=_build,
        load_data=lambda path: load_transcribed_data(path, task="ASR"),
        count_parameters=_count_parameters,
        published_parameters=318_671_564,  # every parameter of the recipe's modules (models/wav2vec2_ctc.py)
        space_file="wav2vec2-ctc.yaml",
        options=dict(RECIPE_OPTIONS),
        check_options=_check_options,
    )
