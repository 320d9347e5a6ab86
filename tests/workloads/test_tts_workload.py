"""The FastSpeech 2 TTS workload: data loading, the recipe's optimiser step, text-sorted batches, real trial steps."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune import workloads
from autotune.errors import DataError, WorkloadError
from autotune.knobs.config import TrialConfig
from autotune.workloads.base import WorkloadContext
from autotune.workloads.tts import noam_lr
from tests.workloads.short_trial import run_two_steps

# The recipe's architecture at a fraction of its size, so that CPU steps take well under a second; the full model is
# what the workload builds by default (and the contract test trains).
SMALL_MODEL = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "conv_filter_size": 64,
    "variance_filter_size": 16,
    "postnet_channels": 16,
}


@pytest.fixture(scope="module")
def fastspeech2() -> workloads.Workload:
    return workloads.get("fastspeech2")


def _setup(workload: workloads.Workload, corpus: Path, config: TrialConfig) -> workloads.TrainingSetup:
    context = WorkloadContext(
        data=workload.load_data(str(corpus)),
        config=config,
        options={**workload.options, "model": SMALL_MODEL},
        device=torch.device("cpu"),
    )
    return workload.build(context)


def test_registered_as_tts_with_its_space(fastspeech2: workloads.Workload) -> None:
    assert fastspeech2.task == "tts" and fastspeech2.space_file == "fastspeech2.yaml"
    assert "fastspeech2" in workloads.names()


def test_data_needs_transcripts(fastspeech2: workloads.Workload, tiny_corpus: Path, tmp_path: Path) -> None:
    assert all(u.text for u in fastspeech2.load_data(str(tiny_corpus)).utterances)
    (tmp_path / "spk").mkdir()
    sf.write(tmp_path / "spk" / "a.wav", np.zeros(8000), 16000)
    with pytest.raises(DataError, match="1 of 1 utterances have no transcript .*TTS needs text") as info:
        fastspeech2.load_data(str(tmp_path))
    assert "\n" not in str(info.value)


def test_batches_are_full_and_sorted_by_text_length(fastspeech2: workloads.Workload, tiny_corpus: Path) -> None:
    config = TrialConfig(per_device_batch_size=3)
    setup = _setup(fastspeech2, tiny_corpus, config)
    counts = setup.dataset.token_counts  # type: ignore[attr-defined]
    assert setup.batch_sampler_factory is not None
    batches = list(setup.batch_sampler_factory(config, torch.Generator().manual_seed(0), range(7)))
    assert len(batches) == 2 and all(len(batch) == 3 for batch in batches)  # 7 items: the short third batch dropped
    assert all(set(batch) <= set(range(7)) for batch in batches)
    # One sort window of 4 x 3 items holds all 7: the stream is sorted by symbol count throughout.
    stream = [counts[index] for batch in batches for index in batch]
    assert stream == sorted(stream)
    batch = setup.collate_fn([setup.dataset[index] for index in batches[0]])  # type: ignore[misc]
    assert setup.samples_in(batch) == 3 and setup.audio_seconds_in(batch) >= 3.0


def test_worst_case_batch_is_the_longest_utterances(fastspeech2: workloads.Workload, tiny_corpus: Path) -> None:
    setup = _setup(fastspeech2, tiny_corpus, TrialConfig(per_device_batch_size=3))
    frames, counts = setup.dataset.frames, setup.dataset.token_counts  # type: ignore[attr-defined]
    assert setup.worst_case_batches is not None
    (batch,) = setup.worst_case_batches(TrialConfig(per_device_batch_size=3))
    # Real items, featurised and padded as the DataLoader's: the most frames and the most symbols of the corpus.
    assert setup.samples_in(batch) == 3 and batch["mels"].shape[1] == max(frames)
    assert int(batch["token_lengths"].max()) == batch["tokens"].shape[1] == max(counts)
    assert sorted(batch["mel_lengths"].tolist(), reverse=True)[:2] == sorted(frames, reverse=True)[:2]
    (single,) = setup.worst_case_batches(TrialConfig(per_device_batch_size=1))
    assert single["mel_lengths"].tolist() == [max(frames)]


def test_optimizer_step_follows_the_noam_schedule_and_clips(fastspeech2: workloads.Workload, tiny_corpus: Path) -> None:
    assert noam_lr(4000) == pytest.approx(256**-0.5 * 4000**-0.5)
    assert noam_lr(1) == pytest.approx(256**-0.5 * 4000**-1.5)
    assert noam_lr(350_000) == pytest.approx(256**-0.5 * 350_000**-0.5 * 0.3)
    setup = _setup(fastspeech2, tiny_corpus, TrialConfig(per_device_batch_size=2))
    group = setup.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0
    for parameter in setup.model.parameters():
        parameter.grad = torch.full_like(parameter, 10.0)
    setup.optimizer.step()
    setup.optimizer.step()
    assert group["lr"] == pytest.approx(noam_lr(2, d_model=32))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in setup.model.parameters()]))
    assert float(norm) == pytest.approx(1.0, rel=1e-4)  # clipped to the recipe's grad_clip_thresh


def test_trains_in_a_trial_subprocess(fastspeech2: workloads.Workload, tiny_corpus: Path, tmp_path: Path) -> None:
    data = fastspeech2.load_data(str(tiny_corpus))
    config = TrialConfig(per_device_batch_size=2, num_workers=1)
    result = run_two_steps("fastspeech2", data, {"model": SMALL_MODEL}, config, tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.audio_seconds_per_second and result.audio_seconds_per_second > result.samples_per_second  # >1 s each
    assert result.worst_case_batches == 1 and result.worst_case_s  # the longest utterances trained before warm-up


def test_preloads_only_the_kept_utterances_and_reads_them_from_ram(
    fastspeech2: workloads.Workload, tiny_corpus: Path, tmp_path: Path
) -> None:
    source = fastspeech2.load_data(str(shutil.copytree(tiny_corpus, tmp_path / "corpus")))
    # No known symbol: the dataset drops it, so its audio (missing here) must not be preloaded.
    dropped = replace(source.utterances[0], utt_id="no-text", path=str(tmp_path / "gone.wav"), text="%")
    options = {**fastspeech2.options, "model": SMALL_MODEL, "features": "on_the_fly"}  # the workers read audio

    def build(preload: bool) -> workloads.TrainingSetup:
        config = TrialConfig(per_device_batch_size=3, preload_audio=preload)
        data = replace(source, utterances=(*source.utterances, dropped))
        return fastspeech2.build(WorkloadContext(data=data, config=config, options=options, device=torch.device("cpu")))

    from_disk, from_ram = build(False), build(True)
    assert from_disk.preload_s == 0.0 and from_ram.preload_s > 0
    assert len(from_ram.dataset.audio) == len(from_ram.dataset) == 12  # type: ignore[attr-defined]
    expected = from_disk.dataset[0]  # type: ignore[index]
    for utt in source.utterances:
        Path(utt.path).unlink()
    assert torch.equal(from_ram.dataset[0]["mel"], expected["mel"])  # type: ignore[index]


def test_targets_are_prepared_once_and_read_as_ming024_reads_them(
    fastspeech2: workloads.Workload, tiny_corpus: Path, tmp_path: Path
) -> None:
    """The default (the recipe): targets precomputed before the trials, the workers load .npy files, the bins span the
    corpus's normalised pitch and energy; preloading reads those arrays into RAM."""
    data = fastspeech2.load_data(str(shutil.copytree(tiny_corpus, tmp_path / "corpus")))
    options = {**fastspeech2.options, "model": SMALL_MODEL}
    assert options["features"] == "precomputed" and fastspeech2.prepare_data is not None
    prepared = fastspeech2.prepare_data(data, options)
    assert prepared is not None and not prepared.reused and prepared.items == 12 and prepared.seconds > 0
    assert fastspeech2.prepare_data(data, options).reused  # type: ignore[union-attr]

    def build(preload: bool) -> workloads.TrainingSetup:
        config = TrialConfig(per_device_batch_size=3, preload_audio=preload)
        return fastspeech2.build(WorkloadContext(data=data, config=config, options=options, device=torch.device("cpu")))

    from_disk, from_ram = build(False), build(True)
    store = from_disk.dataset.store  # type: ignore[attr-defined]
    assert str(store.root) == prepared.path
    bins = from_disk.model.variance_adaptor.pitch_bins  # type: ignore[union-attr]
    assert float(bins[0]) == pytest.approx(store.pitch.minimum) and float(bins[-1]) == pytest.approx(
        store.pitch.maximum
    )
    item = from_disk.dataset[0]  # type: ignore[index]
    assert item["mel"].shape == (store.frames[0], 80) and int(item["durations"].sum()) == store.frames[0]
    assert from_disk.preload_s == 0.0 and from_ram.preload_s > 0
    shutil.rmtree(store.root)  # preloaded: the workers no longer read the files
    assert torch.equal(from_ram.dataset[0]["mel"], item["mel"])  # type: ignore[index]
    assert not fastspeech2.prepare_data(data, options).reused  # type: ignore[union-attr]


def test_features_option_is_checked_before_any_trial(fastspeech2: workloads.Workload, tiny_corpus: Path) -> None:
    data = fastspeech2.load_data(str(tiny_corpus))
    assert fastspeech2.prepare_data is not None
    assert fastspeech2.prepare_data(data, {**fastspeech2.options, "features": "on_the_fly"}) is None
    with pytest.raises(WorkloadError, match="features='npy' is not one of precomputed, on_the_fly"):
        fastspeech2.prepare_data(data, {**fastspeech2.options, "features": "npy"})


@pytest.mark.parametrize("implementation", ("default", "foreach", "fused"))
def test_builds_ming024s_adam_with_the_tuned_optimizer_kernel(
    fastspeech2: workloads.Workload, tiny_corpus: Path, implementation: str
) -> None:
    setup = _setup(fastspeech2, tiny_corpus, TrialConfig(per_device_batch_size=2, optimizer_impl=implementation))
    optimizer = setup.optimizer
    assert type(optimizer) is torch.optim.Adam
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9  # the recipe's
    assert optimizer.defaults["foreach"] is (True if implementation == "foreach" else None)
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)
    assert len(optimizer._optimizer_step_pre_hooks) == 1  # the Noam schedule and clipping, whatever the kernel


@pytest.mark.slow
def test_trains_with_the_foreach_adam_in_a_trial_subprocess(
    fastspeech2: workloads.Workload, tiny_corpus: Path, tmp_path: Path
) -> None:
    config = TrialConfig(per_device_batch_size=2, num_workers=0, optimizer_impl="foreach")
    result = run_two_steps(
        "fastspeech2", fastspeech2.load_data(str(tiny_corpus)), {"model": SMALL_MODEL}, config, tmp_path
    )
    assert result.samples_per_second and result.samples_per_second > 0
