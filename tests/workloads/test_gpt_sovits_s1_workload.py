"""The GPT-SoVITS s1 workload: the one-off experiment folder, Text2SemanticDataset's filters and collate, the recipe's
2-second bucket sampler dealt by rank, ScaledAdam and the locked schedule, real trial steps at the reduced size, and
the 1/N^2 epoch of Lightning's re-sharding caught by a real 2-rank trial."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune import workloads, yamlio
from autotune.data.gpt_sovits import (
    BERT_DIR,
    EOS,
    NAME2SEMANTIC,
    NAME2TEXT,
    S1Dataset,
    bucket_sampler_epoch,
    collate_s1,
    ensure_s1_data,
    loader_batches,
    make_buckets,
    recipe_items,
    reshard,
    semantic_length,
)
from autotune.data.ns2_prep import transcript_phones
from autotune.data.sources import Utterance
from autotune.errors import WorkloadError
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec, launch
from autotune.workloads.base import WorkloadContext
from autotune.workloads.gpt_sovits import recipe_batch_size, recipe_lr
from autotune.workloads.scaled_adam import ScaledAdam
from tests.workloads.short_trial import run_two_steps

REDUCED = {"size": "reduced", "lightning_resharding": False}


@pytest.fixture(scope="module")
def s1() -> workloads.Workload:
    return workloads.get("gpt-sovits-s1")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _utterances(tmp_path: Path, shapes: list[tuple[float, str]]) -> list[Utterance]:
    audio = tmp_path / "a.wav"
    audio.touch()  # the cache key stats the file; the preparation never decodes it
    return [
        Utterance(utt_id=f"u{i}", path=str(audio), speaker="s", duration_s=seconds, text=text)
        for i, (seconds, text) in enumerate(shapes)
    ]


def test_registered_as_tts_with_its_options_and_space(s1: workloads.Workload) -> None:
    assert s1.task == "tts" and s1.space_file == "gpt-sovits-s1.yaml"
    assert s1.options == {"size": "full", "lightning_resharding": False}  # the recipe after PR 756
    assert s1.published_parameters == 77_606_402 and not s1.knobs


def test_preparation_writes_the_recipes_experiment_folder_once(tiny_corpus: Path, cache: Path, s1) -> None:
    utterances = s1.load_data(str(tiny_corpus)).utterances
    corpus, done = ensure_s1_data(utterances)
    assert not done.reused and done.items == len(utterances) == 12
    texts = (corpus.root / NAME2TEXT).read_text().strip("\n").split("\n")
    assert len(texts) == 12 and all(len(line.split("\t")) == 4 for line in texts)  # dataset.py:78-82 keeps these
    semantic_rows = (corpus.root / NAME2SEMANTIC).read_text().splitlines()
    assert semantic_rows[0] == "item_name\tsemantic_audio" and len(semantic_rows) == 13  # pandas reads a header
    for index, utt in enumerate(utterances):
        ids = corpus.semantic[index]
        assert len(ids) == semantic_length(utt) and abs(len(ids) - 25 * utt.duration_s) <= 0.5  # 25 Hz
        assert 0 <= ids.min() and ids.max() < 1024
        assert len(corpus.phones[index]) == len(transcript_phones(utt.text or ""))
        bert = torch.load(corpus.root / BERT_DIR / f"{corpus.names[index]}.pt")
        assert bert.shape == (1024, len(corpus.phones[index])) and bert.dtype == torch.float16
    again, reused = ensure_s1_data(utterances)
    assert reused.reused and again.names == corpus.names


def test_the_dataset_filters_and_repeats_as_the_recipes(tmp_path: Path) -> None:
    shapes = [(2.0, "aeiou" * 2), (60.0, "aeiou" * 100), (10.0, "a"), (1.0, "aeiou" * 3)]  # 11, -, 0.4, 32 phones/s
    corpus, _ = ensure_s1_data(_utterances(tmp_path, shapes), cache_dir=tmp_path / "cache")
    assert recipe_items(corpus) == [0] * 100  # over 54 s, under 3 and over 25 phones per second dropped; then x100
    dataset = S1Dataset(corpus)
    assert len(dataset) == 100 and dataset.seconds[0] == 2.0
    item = dataset[3]
    assert item["idx"] == 3 and item["bert_feature"].shape == (1024, 22)  # "sil", 10 x 2 phones, "sil"


def test_collate_pads_phones_with_zero_semantic_ids_with_eos_and_bert_with_zeros(tmp_path: Path) -> None:
    corpus, _ = ensure_s1_data(_utterances(tmp_path, [(2.0, "ae"), (3.0, "aeiou")]), cache_dir=tmp_path / "c")
    dataset = S1Dataset(corpus)
    short, long = dataset[0], dataset[dataset.items.index(1)]
    batch = collate_s1([short, long])
    assert batch["phoneme_ids_len"].tolist() == [6, 12] and batch["semantic_ids_len"].tolist() == [50, 75]
    assert batch["phoneme_ids"].shape == (2, 12) and (batch["phoneme_ids"][0, 6:] == 0).all()
    assert (batch["semantic_ids"][0, 50:] == EOS).all() and batch["semantic_ids"].shape == (2, 75)
    assert batch["bert_feature"].shape == (2, 1024, 12) and batch["bert_feature"].dtype == torch.float32
    assert (batch["bert_feature"][0, :, 6:] == 0).all() and (batch["bert_feature"][0, :, :6] != 0).any()


def test_buckets_are_two_seconds_wide_as_make_buckets_cuts_them() -> None:
    seconds = [5.0, 0.5, 1.9, 2.0, 3.5, 9.0, 2.5]
    # sorted: 0.5 1.9 | 2.0 2.5 3.5 | 5.0 | 9.0: each item at or over the limit opens a bucket and raises the limit
    # by 2 s once (bucket_sampler.py:83-96), so 5.0 opens the [4, 6) bucket and 9.0 the next, whatever its length
    assert make_buckets(seconds) == [[1, 2], [3, 6, 4], [0], [5]]


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_the_bucket_sampler_deals_each_rank_its_share_of_whole_groups(replicas: int) -> None:
    # five 2-second buckets of 4 x N items each: every group of batch x N items is one bucket
    seconds = [2.0 * bucket + 0.5 + 0.01 * item for bucket in range(5) for item in range(4 * replicas)]
    shares = [bucket_sampler_epoch(seconds, batch_size=4, replicas=replicas, rank=r, seed=7) for r in range(replicas)]
    assert all(len(own) == 20 for own in shares)  # len / N each (bucket_sampler.py:66-69)
    assert sorted(index for own in shares for index in own) == list(range(len(seconds)))  # each item once
    for own in shares:
        batches = loader_batches(own, 4)
        assert len(batches) == 5 and all(len({int(seconds[index] // 2) for index in batch}) == 1 for batch in batches)
    epoch = {seed: bucket_sampler_epoch(seconds, batch_size=4, replicas=replicas, rank=0, seed=seed) for seed in (7, 8)}
    assert epoch[7] == shares[0] and epoch[8] != epoch[7]  # the same order from the same seed, on every rank


def test_the_bucket_sampler_pads_to_a_multiple_of_the_ranks() -> None:
    seconds = [0.4 * (i % 25) + 0.3 for i in range(101)]
    shares = [bucket_sampler_epoch(seconds, batch_size=4, replicas=3, rank=r, seed=1) for r in range(3)]
    assert [len(own) for own in shares] == [34, 34, 34]  # ceil(101 / 3), the list padded from its own start
    assert set().union(*shares) == set(range(101))


def test_lightning_resharding_leaves_each_rank_a_quarter_on_two_ranks() -> None:
    seconds = [1.0 + 0.1 * i for i in range(96)]
    shares = [bucket_sampler_epoch(seconds, batch_size=4, replicas=2, rank=r, seed=1) for r in range(2)]
    twice = [reshard(own, replicas=2, rank=r, seed=1, epoch=0) for r, own in enumerate(shares)]
    assert [len(own) for own in shares] == [48, 48] and [len(own) for own in twice] == [24, 24]  # 96 / 2^2
    assert all(set(again) <= set(own) for again, own in zip(twice, shares, strict=True))


def test_the_loader_batch_is_capped_at_a_quarter_of_the_dataset() -> None:
    assert recipe_batch_size(8, 1000) == 8 and recipe_batch_size(8, 20) == 5 and recipe_batch_size(8, 2) == 1
    assert loader_batches([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]  # drop_last off: the short one stays


def test_one_process_trains_on_every_item_in_the_recipes_batches(tiny_corpus: Path, cache: Path, s1) -> None:
    context = WorkloadContext(
        data=s1.load_data(str(tiny_corpus)),
        config=TrialConfig(per_device_batch_size=8, preload_audio=True),
        options={**s1.options, **REDUCED},
        device=torch.device("cpu"),
    )
    setup = s1.build(context)
    assert len(setup.dataset) == 96 and setup.preload_s > 0  # 12 items x 8 (dataset.py:179-188), BERT read once
    assert setup.batch_sampler_factory is not None and setup.worst_case_batches is not None
    batches = setup.batch_sampler_factory(context.config, torch.Generator().manual_seed(0), [0, 1])
    assert sorted(index for batch in batches for index in batch) == list(range(96))  # not autotune's share [0, 1]
    assert all(len(batch) == 8 for batch in batches)
    worst = setup.worst_case_batches(context.config)[0]
    assert worst["semantic_ids"].shape[1] == max(setup.dataset.semantic_counts)  # type: ignore[attr-defined]
    assert isinstance(setup.optimizer, ScaledAdam) and setup.optimizer.defaults["betas"] == (0.9, 0.95)
    loss = setup.loss_fn(setup.model, collate_s1([setup.dataset[i] for i in batches[0]]))
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_bad_options_are_one_line_errors(tiny_corpus: Path, s1) -> None:
    data = s1.load_data(str(tiny_corpus))
    assert s1.check_options is not None
    with pytest.raises(WorkloadError, match="size='tiny' is not one of full, reduced"):
        s1.check_options({"size": "tiny"}, data)
    with pytest.raises(WorkloadError, match="lightning_resharding='yes' must be true or false"):
        s1.check_options({"lightning_resharding": "yes"}, data)
    (note,) = s1.check_options({"lightning_resharding": True}, data)
    assert "1/N^2" in note


def test_the_schedule_is_locked_at_0_002_after_scaled_adams_first_step() -> None:
    assert recipe_lr(1) == 0.01  # ScaledAdam(lr=0.01): the scheduler steps after the optimizer
    assert recipe_lr(2) == recipe_lr(5000) == 0.002  # lr_schedulers.py:58 whatever the warm-up says


def test_scaled_adam_steps_each_tensor_by_its_rms_and_scalars_as_adam() -> None:
    weight = torch.nn.Parameter(torch.tensor([[3.0, -4.0], [0.0, 0.0]]))  # rms 2.5
    scalar = torch.nn.Parameter(torch.tensor([0.5]))
    optimizer = ScaledAdam([weight, scalar], lr=0.01, betas=(0.9, 0.95), clipping_scale=2.0)
    weight.grad = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    scalar.grad = torch.tensor([3.0])
    before = weight.detach().clone()
    optimizer.step()
    # first step: Adam's bias-corrected second moment makes grad / sqrt(v) the gradient's sign; size lr (1 - beta1) rms
    expected = before - 0.01 * 0.1 * 2.5 * torch.sign(weight.grad)
    assert torch.allclose(weight.detach(), expected, atol=1e-6)
    assert scalar.item() == pytest.approx(0.5 - 0.01 * 0.1 * 0.1, abs=1e-7)  # lr x scalar_lr_scale x (1 - beta1)


def test_scaled_adam_trains_and_clips_after_a_period_of_norms() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = ScaledAdam(model.parameters(), lr=0.05, clipping_scale=2.0, clipping_update_period=5)
    inputs = torch.randn(64, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    assert "threshold" in optimizer.norms[0] and optimizer.norms[0]["threshold"] > 0


@pytest.mark.slow
def test_two_real_steps_at_the_reduced_size(tiny_corpus: Path, tmp_path: Path, s1) -> None:
    config = TrialConfig(per_device_batch_size=4, num_workers=1, prefetch_factor=16, persistent_workers=True)
    data = s1.load_data(str(tiny_corpus))
    s1.prepare_data(data, REDUCED)  # type: ignore[misc]  # the parent's step, before the trial
    result = run_two_steps("gpt-sovits-s1", data, REDUCED, config, tmp_path)
    assert result.samples_per_second > 0


def _two_rank_trial(tmp_path: Path, corpus: Path, s1: workloads.Workload, resharding: bool) -> object:
    data = s1.load_data(str(corpus))
    spec = TrialSpec(
        workload="gpt-sovits-s1",
        workload_options={"size": "reduced", "lightning_resharding": resharding},
        data_file=str(yamlio.write_json(tmp_path / "data.json", data.to_dict())),
        config=TrialConfig(per_device_batch_size=2, world_size=2, intra_op_threads=1),
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=1, max_window_steps=2),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
        collective_timeout_s=120,
    )
    return launch(spec, workdir=tmp_path / "trial", timeout_s=240)


@pytest.mark.slow
def test_two_gloo_ranks_of_the_fixed_recipe_train_on_every_item_once(tiny_corpus: Path, tmp_path: Path, s1) -> None:
    result = _two_rank_trial(tmp_path, tiny_corpus, s1, resharding=False)
    assert result.status == "ok", result.log_tail  # type: ignore[attr-defined]
    accounting = result.epoch_accounting  # type: ignore[attr-defined]
    assert accounting["dataset_size"] == 96 and accounting["samples_per_epoch"] == 96
    assert accounting["batches_per_epoch_per_rank"] == [24, 24]  # 48 items each, batches of 2


@pytest.mark.slow
def test_lightning_resharding_on_two_gloo_ranks_fails_the_epoch_accounting(
    tiny_corpus: Path, tmp_path: Path, s1
) -> None:
    """The issue's 1/N^2 epoch (GPT-SoVITS 750/1318 before PR 756): each rank's samples per epoch against len/N."""
    result = _two_rank_trial(tmp_path, tiny_corpus, s1, resharding=True)
    assert result.status == "accounting", result.log_tail  # type: ignore[attr-defined]
    reason = result.reason  # type: ignore[attr-defined]
    assert "12 batches per epoch per rank x 2 ranks" in reason and "cover 48 samples" in reason
    assert "dataset has 96" in reason and "split across ranks more than once" in reason and "\n" not in reason
