"""The NaturalSpeech2 workload: the one-off pickles, NS2Dataset's prompt cut and phone expansion, the recipe's batches
by size, the slow-storage option, the recipe's schedule, and real trial steps at the reduced size."""

from __future__ import annotations

import json
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune import workloads
from autotune.data.ns2 import Ns2Dataset, align_length, batch_by_size, collate_ns2_batch, cut_prompt
from autotune.data.ns2_prep import NS2_PHONES, codec_frames, ensure_ns2_metadata, transcript_phones, usable_for_ns2
from autotune.errors import WorkloadError
from autotune.knobs.config import TrialConfig
from autotune.workloads.base import WorkloadContext
from autotune.workloads.naturalspeech2 import cosine_warmup_lr
from tests.workloads.short_trial import run_two_steps

REDUCED = {"size": "reduced", "read_latency_ms": 0}


@pytest.fixture(scope="module")
def ns2() -> workloads.Workload:
    return workloads.get("naturalspeech2")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _setup(workload: workloads.Workload, corpus: Path, config: TrialConfig, **options: object):
    context = WorkloadContext(
        data=workload.load_data(str(corpus)),
        config=config,
        options={**workload.options, **REDUCED, **options},
        device=torch.device("cpu"),
    )
    return workload.build(context)


def test_registered_as_tts_with_its_knobs_and_space(ns2: workloads.Workload) -> None:
    assert ns2.task == "tts" and ns2.space_file == "naturalspeech2.yaml"
    assert ns2.options == {"size": "full", "read_latency_ms": 0}  # the recipe's model by default
    assert set(ns2.knobs) == {"batch_type", "max_frames_in_batch", "max_sentences"}


def test_phones_come_from_the_transcript() -> None:
    assert transcript_phones("ae") == ["sil", "M", "AA1", "D", "EH1", "sil"]
    assert transcript_phones("x {HH AH0 L OW1} y") == ["sil", "HH", "AH0", "L", "OW1", "sil"]
    assert transcript_phones("xyz") == []
    assert len(NS2_PHONES) == 89 and NS2_PHONES[-5:] == ("sp", "spn", "sil", "<s>", "</s>")  # Amphion's phone map


def test_preparation_writes_one_pickle_per_utterance_once(tiny_corpus: Path, cache: Path, ns2) -> None:
    utterances = usable_for_ns2(ns2.load_data(str(tiny_corpus)).utterances)
    metadata, done = ensure_ns2_metadata(utterances)
    assert not done.reused and done.items == len(utterances) == 12
    for index, utt in enumerate(utterances):
        with open(metadata.path(index), "rb") as file:
            item = pickle.load(file)
        frames = codec_frames(utt)
        assert item["code"].shape == (16, frames) and 0 <= item["code"].min() and item["code"].max() < 1024
        assert item["pitch"].shape == (frames,) and item["pitch"].min() >= 50.0
        assert item["duration"].sum() == frames == metadata.num_frames[index]
        assert len(item["duration"]) == len(metadata.phones[index]) == len(transcript_phones(utt.text or ""))
    assert abs(metadata.num_frames[0] - 75 * utterances[0].duration_s) <= 1  # EnCodec 24 kHz: 75 frames/s
    again, reused = ensure_ns2_metadata(utterances)
    assert reused.reused and again == metadata


def test_preparation_is_a_processed_dir_that_amphions_ns2dataset_reads(tiny_corpus: Path, cache: Path, ns2) -> None:
    utterances = usable_for_ns2(ns2.load_data(str(tiny_corpus)).utterances)
    root = ensure_ns2_metadata(utterances)[0].root
    for split in ("train.json", "test.json"):  # NS2Trainer builds a train and a validation NS2Dataset
        rows = json.loads((root / "autotune" / split).read_text())  # processed_dir/<dataset>/<file>: a bare list
        assert [row["Uid"] for row in rows] == [utt.utt_id for utt in utterances]
        assert {key for row in rows for key in row} == {"Dataset", "Uid", "speaker", "phones", "num_frames"}
    for row in rows:  # ns2_dataset.py __getitem__: join(processed_dir, metadata_dir, Dataset, Uid + ".pkl")
        assert os.path.isfile(os.path.join(root, "metadata", row["Dataset"], row["Uid"] + ".pkl"))
        assert all(phone in NS2_PHONES for phone in row["phones"].split())  # get_phone_map maps every one


def test_align_length_trims_to_the_shorter_of_codes_and_durations() -> None:
    item = {"code": np.zeros((16, 10), np.int64), "pitch": np.ones(8, np.float32), "duration": np.array([4, 4, 4])}
    code, pitch, duration = align_length(item)
    assert code.shape == (16, 10) and len(pitch) == 10 and pitch[-1] == 1.0 and list(duration) == [4, 4, 2]


def test_prompt_cut_takes_10_to_50_percent_of_the_phones_from_the_start() -> None:
    rng = random.Random(0)
    cuts = [cut_prompt(np.ones(20, np.int64), rng) for _ in range(200)]
    assert {first for first, _ in cuts} == {0} and {last for _, last in cuts} == set(range(2, 11))
    assert cut_prompt(np.array([0, 3, 3]), random.Random(0)) == (1, 2)  # a silent first phone is skipped
    with pytest.raises(ValueError, match="at least 3 phones"):
        cut_prompt(np.array([3]), rng)


def test_items_cut_the_prompt_and_expand_phones_per_frame(tiny_corpus: Path, cache: Path, ns2) -> None:
    setup = _setup(ns2, tiny_corpus, TrialConfig(per_device_batch_size=2))
    dataset = setup.dataset
    item = dataset[0]  # type: ignore[index]
    frames = dataset.frames[0]  # type: ignore[attr-defined]
    assert item["code"].shape[1] + item["ref_code"].shape[1] == frames and item["ref_code"].shape[1] > 0
    assert item["duration"].sum() == item["code"].shape[1] == len(item["pitch"]) == len(item["phone_id_frame"])
    assert list(item["phone_id_frame"]) == list(np.repeat(item["phone_id"], item["duration"]))
    batch = collate_ns2_batch([dataset[0], dataset[1]])  # type: ignore[index]
    assert batch["code"].shape[:2] == (2, 16) and batch["mask"].shape == batch["pitch"].shape
    assert (
        batch["phone_mask"].shape == batch["phone_id"].shape
        and batch["ref_mask"].shape[1] == batch["ref_code"].shape[2]
    )
    shorter = int(batch["mask"].sum(1).argmin())
    assert batch["pitch"][shorter, -1] == 50.0  # NS2Collator pads pitch with 50
    assert setup.samples_in(batch) == 2 and setup.audio_seconds_in(batch) > 1.0


def test_batches_respect_max_tokens_and_max_sentences() -> None:
    frames = [100, 80, 150, 120, 90, 60, 140, 110]
    batches = batch_by_size(frames, range(8), max_tokens=300, max_sentences=3)
    assert sorted(i for batch in batches for i in batch) == list(range(8))
    assert all(len(batch) <= 3 and len(batch) * max(frames[i] for i in batch) <= 300 for batch in batches)
    assert [frames[i] for batch in batches for i in batch] == sorted(frames)  # packed in frame order, as the recipe
    assert [len(b) for b in batch_by_size(frames, range(8), max_tokens=10_000, max_sentences=3)] == [3, 3, 2]
    with pytest.raises(ValueError, match="exceeds max_tokens"):
        batch_by_size(frames, range(8), max_tokens=140, max_sentences=3)


def test_the_workload_batches_by_its_knobs(tiny_corpus: Path, cache: Path, ns2) -> None:
    knobs = {"batch_type": "dynamic", "max_frames_in_batch": 400, "max_sentences": 3}
    config = TrialConfig(per_device_batch_size=32, workload_knobs=knobs)
    setup = _setup(ns2, tiny_corpus, config)
    frames = setup.dataset.frames  # type: ignore[attr-defined]
    assert setup.batch_sampler_factory is not None and setup.worst_case_batches is not None
    batches = list(setup.batch_sampler_factory(config, torch.Generator().manual_seed(0), range(12)))
    assert sorted(i for batch in batches for i in batch) == list(range(12))
    assert all(len(batch) <= 3 and len(batch) * max(frames[i] for i in batch) <= 400 for batch in batches)
    (worst,) = setup.worst_case_batches(config)
    assert worst["code"].shape[0] == min(3, 400 // max(frames))


def test_slow_storage_adds_latency_to_every_read_and_preload_removes_it(tiny_corpus: Path, cache: Path, ns2) -> None:
    setup = _setup(ns2, tiny_corpus, TrialConfig(per_device_batch_size=2), read_latency_ms=50)
    dataset: Ns2Dataset = setup.dataset  # type: ignore[assignment]
    started = time.perf_counter()
    for index in range(4):
        dataset[index]
    assert time.perf_counter() - started >= 4 * 0.05
    preload_s = dataset.preload(threads=12)
    assert preload_s < 12 * 0.05  # the waits overlap in threads
    started = time.perf_counter()
    for index in range(4):
        dataset[index]
    assert time.perf_counter() - started < 0.1


def test_preload_knob_reads_every_pickle_before_training(tiny_corpus: Path, cache: Path, ns2) -> None:
    setup = _setup(ns2, tiny_corpus, TrialConfig(per_device_batch_size=2, preload_audio=True))
    assert setup.preload_s > 0 and setup.dataset._in_memory is not None  # type: ignore[attr-defined]


def test_bad_options_are_one_line_errors(tiny_corpus: Path, ns2) -> None:
    data = ns2.load_data(str(tiny_corpus))
    assert ns2.check_options is not None
    with pytest.raises(WorkloadError, match="size='tiny' is not one of full, reduced"):
        ns2.check_options({"size": "tiny"}, data)
    with pytest.raises(WorkloadError, match="read_latency_ms"):
        ns2.check_options({"read_latency_ms": -1}, data)
    assert ns2.check_options({"read_latency_ms": 20}, data) == [
        "read_latency_ms=20: every pickle read waits that long (slow storage)"
    ]


def test_schedule_is_diffusers_cosine_with_warmup_stepped_after_the_optimiser() -> None:
    assert cosine_warmup_lr(1) == 0.0  # the scheduler has not stepped before the first optimiser step
    assert cosine_warmup_lr(2501) == pytest.approx(0.5e-4)
    assert cosine_warmup_lr(5001) == pytest.approx(1e-4)
    assert cosine_warmup_lr(5001 + 397_500) == pytest.approx(0.5e-4)


def test_optimizer_is_adamw_with_the_recipes_clip(tiny_corpus: Path, cache: Path, ns2) -> None:
    setup = _setup(ns2, tiny_corpus, TrialConfig(per_device_batch_size=2))
    assert isinstance(setup.optimizer, torch.optim.AdamW)
    assert setup.optimizer.defaults["weight_decay"] == 0.01  # torch's default: the config gives lr alone
    trainable = sum(p.numel() for group in setup.optimizer.param_groups for p in group["params"])
    assert trainable == sum(p.numel() for p in setup.model.parameters() if p.requires_grad)
    for parameter in setup.model.parameters():
        parameter.grad = torch.full_like(parameter, 10.0) if parameter.requires_grad else None
    setup.optimizer.step()  # the pre-hook sets lr 0 (step 1) and clips the gradients' norm to 0.5
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in setup.model.parameters() if p.grad is not None])
    )
    assert norm == pytest.approx(0.5, rel=1e-4)


@pytest.mark.slow
def test_two_real_steps_at_the_reduced_size(tiny_corpus: Path, tmp_path: Path, ns2) -> None:
    knobs = {"batch_type": "dynamic", "max_frames_in_batch": 600, "max_sentences": 4}
    config = TrialConfig(per_device_batch_size=4, num_workers=1, prefetch_factor=2, workload_knobs=knobs)
    data = ns2.load_data(str(tiny_corpus))
    ns2.prepare_data(data, REDUCED)  # type: ignore[misc]  # the parent's step, before the trial
    result = run_two_steps("naturalspeech2", data, {**REDUCED, "read_latency_ms": 5}, config, tmp_path)
    assert result.samples_per_second > 0
