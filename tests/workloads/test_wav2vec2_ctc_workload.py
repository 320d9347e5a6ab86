"""The wav2vec2 CTC workload: SpeechBrain's CommonVoice pipeline (decode, resample, sort, pad, augment), its two
optimizers, its options, and real trial steps at the reduced size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune import space, workloads
from autotune.data import generate_corpus
from autotune.data.speechbrain_asr import sorted_batches, speed_perturb, wav_augment
from autotune.errors import DataError, UserError
from autotune.knobs.config import TrialConfig
from autotune.trial.loader import build_loader
from autotune.workloads.base import WorkloadContext
from autotune.workloads.optimizer_set import OptimizerSet
from autotune.workloads.wav2vec2 import RECIPE_OPTIONS
from tests.conftest import make_cpu, make_cuda
from tests.workloads.short_trial import run_two_steps

REDUCED = {**RECIPE_OPTIONS, "size": "reduced"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_corpus(
        tmp_path_factory.mktemp("w2v") / "corpus",
        n_speakers=2,
        files_per_speaker=3,
        min_duration_s=1.0,
        max_duration_s=1.5,
        seed=4,
    )


@pytest.fixture(scope="module")
def workload() -> workloads.Workload:
    return workloads.get("wav2vec2-ctc")


def _setup(workload: workloads.Workload, data_path: Path, config: TrialConfig, **options: object):
    context = WorkloadContext(
        data=workload.load_data(str(data_path)),
        config=config,
        options={**REDUCED, **options},
        device=torch.device("cpu"),
    )
    return workload.build(context)


def test_registered_with_the_recipes_size_options_and_space(workload: workloads.Workload) -> None:
    assert workload.task == "asr" and workload.knobs == () and workload.feature_devices == ()
    assert workload.published_parameters == 318_671_564 and workload.count_parameters is not None
    assert workload.count_parameters() == 318_671_564  # on the meta device: no 1.3 GB allocated
    assert workload.options == {
        "size": "full",
        "lr": 1.0,
        "lr_wav2vec": 0.0001,
        "sorting": "ascending",
        "wav_augment": True,
        "max_duration_s": 10.0,
    }
    path = space.space_path(workload.space_file or "wav2vec2-ctc")
    cuda = space.load(path, make_cuda(), workload_knobs=())
    assert {key: cuda.baseline[key] for key in ("per_device_batch_size", "num_workers", "precision")} == {
        "per_device_batch_size": 12,
        "num_workers": 6,
        "precision": "tf32",  # SpeechBrain's fp32 with its allow_tf32 quirk
    }
    precisions = next(p for p in cuda.params if p.name == "precision").distribution.choices  # type: ignore[attr-defined]
    assert set(precisions) == {"fp32", "fp32-default", "tf32", "bf16", "fp16"}
    assert cuda.fixed.get("grad_accum_steps", 1) == 1  # the recipe's grad_accumulation_factor
    cpu = space.load(path, make_cpu(), workload_knobs=())
    assert cpu.baseline["per_device_batch_size"] == 12 and cpu.baseline["precision"] == "fp32"


def test_items_are_decoded_resampled_to_16k_and_long_ones_dropped(workload: workloads.Workload, tmp_path: Path) -> None:
    rates_and_seconds = {"a": (48000, 1.0), "b": (8000, 0.5), "c": (16000, 0.75), "long": (8000, 10.5)}
    lines = []
    for key, (rate, seconds) in rates_and_seconds.items():
        sf.write(tmp_path / f"{key}.wav", np.random.default_rng(0).uniform(-0.5, 0.5, int(rate * seconds)), rate)
        lines.append(json.dumps({"key": key, "wav": f"{key}.wav", "txt": "ab ba"}))
    (tmp_path / "data.list").write_text("\n".join(lines) + "\n")
    setup = _setup(workload, tmp_path / "data.list", TrialConfig(per_device_batch_size=2))
    dataset = setup.dataset
    assert [u.utt_id for u in dataset.utterances] == ["a", "b", "c"]  # type: ignore[attr-defined]
    for index, (rate, seconds) in enumerate(list(rates_and_seconds.values())[:3]):
        wav, tokens, duration = dataset[index]
        assert wav.dtype == torch.float32 and abs(wav.shape[0] - 16000 * seconds) <= 1, rate
        assert duration == pytest.approx(seconds) and len(tokens) == 5  # a, b, ▁, b, a
        assert 0 not in tokens.tolist()  # 0 is CTC's blank
    with pytest.raises(DataError, match="avoid_if_longer_than"):
        _setup(workload, tmp_path / "data.list", TrialConfig(per_device_batch_size=2), max_duration_s=0.1)


def test_batches_sorted_by_duration_padded_with_relative_lengths(workload: workloads.Workload, corpus: Path) -> None:
    config = TrialConfig(per_device_batch_size=4)
    setup = _setup(workload, corpus, config)
    durations = setup.dataset.durations_s  # type: ignore[attr-defined]
    factory = setup.batch_sampler_factory
    assert factory is not None
    batches = list(factory(config, torch.Generator().manual_seed(0), [5, 0, 3, 1, 4, 2]))
    flat = [index for batch in batches for index in batch]
    assert [len(batch) for batch in batches] == [4, 2]  # the last short batch kept, as SpeechBrain's loader
    assert flat == sorted(range(6), key=lambda index: (durations[index], index))  # ascending, whatever the order given
    assert list(sorted_batches(durations, [0, 1, 2], 2, "descending")) == [
        sorted([0, 1, 2], key=lambda index: (durations[index], index), reverse=True)[:2],
        sorted([0, 1, 2], key=lambda index: (durations[index], index), reverse=True)[2:],
    ]
    assert list(sorted_batches(durations, [2, 0, 1], 2, "random")) == [[2, 0], [1]]
    with pytest.raises(ValueError, match="sorting"):
        list(sorted_batches(durations, [0], 1, "shuffled"))
    batch = next(iter(build_loader(setup, config, total_batches=1, seed=0)))
    assert batch["wavs"].shape[0] == batch["tokens"].shape[0] == setup.samples_in(batch) == 4
    assert batch["wav_lens"].max() == 1.0 and batch["token_lens"].max() == 1.0
    lengths = (batch["wav_lens"] * batch["wavs"].shape[1]).round().long()
    assert all(float(batch["wavs"][row, length:].abs().sum()) == 0.0 for row, length in enumerate(lengths.tolist()))
    assert batch["durations_s"].tolist() == sorted(batch["durations_s"].tolist())  # the shortest items first
    assert setup.audio_seconds_in(batch) == pytest.approx(float(batch["durations_s"].sum()))


def test_wav_augment_perturbs_speed_per_batch_and_drops(workload: workloads.Workload) -> None:
    torch.manual_seed(0)
    wavs = torch.randn(2, 16000)
    assert speed_perturb(wavs, 95).shape == (2, 16000 * 95 // 100)  # resampled to 15.2 kHz: played 5% slower
    assert speed_perturb(wavs, 105).shape == (2, 16000 * 105 // 100)
    assert speed_perturb(wavs, 100) is wavs
    augmented = wav_augment(wavs)
    assert augmented.shape[0] == 2 and augmented.shape[1] in {16000 * s // 100 for s in (95, 100, 105)}
    assert int((augmented == 0).sum()) >= 2 * 1000  # DropChunk: at least one chunk of 1000 samples per utterance


def test_worst_case_is_the_longest_batch_at_the_slowest_speed(workload: workloads.Workload, corpus: Path) -> None:
    config = TrialConfig(per_device_batch_size=2)
    setup = _setup(workload, corpus, config)
    assert setup.worst_case_batches is not None
    (worst,) = setup.worst_case_batches(config)
    longest = max(setup.dataset.durations_s)  # type: ignore[attr-defined]
    assert worst["speed_percent"] == 95 and len(worst["durations_s"]) == 2 and max(worst["durations_s"]) == longest
    assert torch.isfinite(setup.loss_fn(setup.model, worst))
    (plain,) = _setup(workload, corpus, config, wav_augment=False).worst_case_batches(config)  # type: ignore[misc]
    assert "speed_percent" not in plain


def test_two_optimizers_as_the_recipe_each_clipped_to_five(workload: workloads.Workload, corpus: Path) -> None:
    setup = _setup(workload, corpus, TrialConfig(per_device_batch_size=2))
    optimizer = setup.optimizer
    assert isinstance(optimizer, OptimizerSet)
    adam, adadelta = optimizer.optimizers
    model = setup.model
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["lr"] == 0.0001
    assert isinstance(adadelta, torch.optim.Adadelta)
    assert (adadelta.defaults["lr"], adadelta.defaults["rho"], adadelta.defaults["eps"]) == (1.0, 0.95, 1e-8)
    assert {id(p) for g in adam.param_groups for p in g["params"]} == {id(p) for p in model.wav2vec2.parameters()}
    head = [*model.enc.parameters(), *model.ctc_lin.parameters()]
    assert {id(p) for g in adadelta.param_groups for p in g["params"]} == {id(p) for p in head}
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 10.0)
    optimizer.step()
    for member in (adam, adadelta):  # each optimizer's gradients clipped on their own, as Brain.optimizers_step
        grads = [p.grad for p in member.param_groups[0]["params"]]
        assert float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) == (
            pytest.approx(5.0, rel=1e-4)
        )
    assert len(optimizer.state) == sum(1 for _ in model.parameters())  # both members' state, seen through the set
    optimizer.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())


def test_a_grad_scaler_steps_the_set(workload: workloads.Workload, corpus: Path) -> None:
    """The trial's fp16 path: GradScaler unscales every member's gradients through the set, then steps it."""
    setup = _setup(workload, corpus, TrialConfig(per_device_batch_size=2))
    batch = next(iter(build_loader(setup, TrialConfig(per_device_batch_size=2), total_batches=1, seed=0)))
    before = [p.detach().clone() for p in setup.model.parameters()]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale(setup.loss_fn(setup.model, batch)).backward()
    scaler.step(setup.optimizer)
    scaler.update()
    moved = [not torch.equal(a, b) for a, b in zip(before, setup.model.parameters(), strict=True)]
    assert sum(moved) > len(moved) // 2  # both optimizers stepped (frozen ones: masked_spec_embed, no gradient)


def test_options_are_checked_and_say_what_was_measured(workload: workloads.Workload, corpus: Path) -> None:
    assert workload.check_options is not None
    data = workload.load_data(str(corpus))
    notes = " ".join(workload.check_options(dict(REDUCED), data))
    assert "reduced wav2vec2" in notes and "already 16000 Hz" in notes
    assert "reduced" not in " ".join(workload.check_options(dict(RECIPE_OPTIONS), data))
    for bad, words in (({"size": "large"}, "size must be one of full, reduced"), ({"sorting": "none"}, "sorting")):
        with pytest.raises(UserError, match=words):
            workload.check_options({**RECIPE_OPTIONS, **bad}, data)


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "precision"), [(0, "fp32"), (1, "bf16")], ids=["in-process-fp32", "worker-bf16"])
def test_trains_in_a_trial_subprocess(corpus: Path, tmp_path: Path, workers: int, precision: str) -> None:
    data = workloads.get("wav2vec2-ctc").load_data(str(corpus))
    config = TrialConfig(per_device_batch_size=2, num_workers=workers, precision=precision)
    result = run_two_steps("wav2vec2-ctc", data, {"size": "reduced"}, config, tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.audio_seconds_per_second and result.audio_seconds_per_second > result.samples_per_second
    assert result.worst_case_batches == 1
