"""The GPT-SoVITS s2 workload: the one-off experiment folder (32 kHz audio, cnhubert features, phones), items decoded
through a real ffmpeg subprocess, TextAudioSpeakerLoader's filters and collate, the recipe's spectrogram buckets
dealt by rank (drops and padding counted by the epoch accounting), the AdamW groups and the discriminator step inside
the loss, and real trial steps at the reduced size, on one process and on two gloo ranks under DDP."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from autotune import workloads, yamlio
from autotune.data import ffmpeg
from autotune.data.gpt_sovits_s2 import (
    HUBERT_DIR,
    NAME2TEXT,
    SAMPLE_RATE,
    WAV_DIR,
    ensure_s2_data,
    hubert_frames,
)
from autotune.data.gpt_sovits_s2_loader import (
    BOUNDARIES,
    S2Dataset,
    bucket_items,
    bucket_sampler_epoch,
    collate_s2,
    samples_per_epoch,
    worst_bucket_batch,
)
from autotune.data.ns2_prep import transcript_phones
from autotune.data.sources import DataSource, Utterance
from autotune.errors import DataError, WorkloadError
from autotune.knobs.config import TrialConfig
from autotune.models.gpt_sovits_s2 import S2_V2_STEP, linear_spectrogram
from autotune.trial import TimingSettings, TrialSpec, launch
from autotune.trial.sampling import epoch_size
from autotune.workloads.base import WorkloadContext
from autotune.workloads.gpt_sovits_s2 import RECIPE_LR, gradient_norm, model_configs
from tests.workloads.short_trial import run_two_steps

REDUCED = {"size": "reduced"}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def s2() -> workloads.Workload:
    return workloads.get("gpt-sovits-s2")


@pytest.fixture(scope="module")
def ffmpeg_program() -> str:
    found = ffmpeg.find_ffmpeg()
    assert found is not None, f"the tests decode through ffmpeg: {ffmpeg.FFMPEG_INSTALL}"
    return found


def _spectrogram() -> object:
    return lambda wav: linear_spectrogram(wav, S2_V2_STEP)


def _utterances(tmp_path: Path, seconds: list[float], rate: int = 16_000) -> list[Utterance]:
    """Real 16-bit WAV files of these lengths (a tone with noise), each with a transcript of a few syllables."""
    rng = np.random.default_rng(0)
    utterances = []
    for index, duration in enumerate(seconds):
        samples = round(duration * rate)
        audio = 0.3 * np.sin(np.arange(samples) * 0.05) + 0.05 * rng.standard_normal(samples)
        path = tmp_path / f"u{index}.wav"
        sf.write(path, audio.astype(np.float32), rate, subtype="PCM_16")
        utterances.append(
            Utterance(
                utt_id=f"u{index}", path=str(path), speaker="s", duration_s=duration, sample_rate=rate, text="aeiou"
            )
        )
    return utterances


def test_registered_as_tts_with_its_options_and_space(s2: workloads.Workload) -> None:
    assert "gpt-sovits-s2" in workloads.names()
    assert s2.task == "tts" and s2.space_file == "gpt-sovits-s2.yaml"
    assert s2.options == {"size": "full"} and not s2.knobs
    assert s2.published_parameters == 51_310_080  # net_g v2, the seed notes' and the model tests' figure


@pytest.mark.slow  # counts every workload's parameters, the full models too
def test_autotune_models_lists_it() -> None:
    from autotune.cli import app

    result = CliRunner().invoke(app, ["models"], catch_exceptions=False, env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "gpt-sovits-s2" in result.output and "51,310,080" in result.output


def test_preparation_writes_the_recipes_experiment_folder_once(tiny_corpus: Path, s2, tmp_path: Path) -> None:
    utterances = s2.load_data(str(tiny_corpus)).utterances
    corpus, done = ensure_s2_data(utterances, cache_dir=tmp_path / "cache")  # its own: other tests prepare it too
    assert not done.reused and done.items == len(utterances) == len(corpus.names) == 12
    lines = (corpus.root / NAME2TEXT).read_text().strip("\n").split("\n")
    assert len(lines) == 12 and all(len(line.split("\t")) == 4 for line in lines)  # the loader keeps these
    for index, utt in enumerate(utterances):
        name = corpus.names[index]
        assert name == f"{index:07d}.wav" and len(corpus.phones[index]) == len(transcript_phones(utt.text or ""))
        info = sf.info(corpus.root / WAV_DIR / name)
        assert (info.samplerate, info.channels, info.subtype, info.format) == (SAMPLE_RATE, 1, "PCM_16", "WAV")
        assert info.frames == pytest.approx(utt.duration_s * SAMPLE_RATE, abs=2)
        features = torch.load(corpus.root / HUBERT_DIR / f"{name}.pt")
        assert features.dtype == torch.float16 and features.shape == (1, 768, hubert_frames(info.frames))
        peak = np.abs(sf.read(corpus.root / WAV_DIR / name, dtype="int16")[0]).max()
        assert 15_000 < peak <= 32_767  # 0.95 x 0.5 x 32768 plus half the audio, as 2-get-hubert-wav32k.py scales
    again, reused = ensure_s2_data(utterances, cache_dir=tmp_path / "cache")
    assert reused.reused and again == corpus


def test_cnhubert_frames_are_one_fewer_than_the_spectrograms_or_equal() -> None:
    for samples in range(20_000, 40_000, 37):
        spec_frames = samples // 640  # mel_processing's padding, center=False, hop 640
        assert spec_frames - hubert_frames(samples) in (0, 1)


def test_ffmpeg_decodes_as_my_utils_load_audio_does(tiny_corpus: Path, s2, ffmpeg_program: str) -> None:
    corpus, _ = ensure_s2_data(s2.load_data(str(tiny_corpus)).utterances)
    path = corpus.wav_path(corpus.names[0])
    decoded = ffmpeg.load_audio(path, SAMPLE_RATE, ffmpeg_program)
    stored, _ = sf.read(path, dtype="int16")
    assert decoded.dtype == np.float32 and np.array_equal(decoded, stored.astype(np.float32) / 32768)
    resampled = ffmpeg.load_audio(path, 16_000, ffmpeg_program)  # ffmpeg resamples on the way, as -ar asks
    assert abs(len(resampled) - len(decoded) / 2) <= 2
    with pytest.raises(DataError, match="ffmpeg could not decode .*missing.wav"):
        ffmpeg.load_audio(str(Path(path).with_name("missing.wav")), SAMPLE_RATE, ffmpeg_program)


def test_ffmpeg_is_found_on_path_first_else_from_imageio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ffmpeg.shutil, "which", lambda name: "/opt/bin/ffmpeg")
    assert ffmpeg.find_ffmpeg() == "/opt/bin/ffmpeg"
    monkeypatch.setattr(ffmpeg.shutil, "which", lambda name: None)
    found = ffmpeg.find_ffmpeg()
    assert found is not None and "imageio_ffmpeg" in found


def test_without_ffmpeg_the_workload_says_what_to_install(
    tiny_corpus: Path, s2, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ffmpeg, "find_ffmpeg", lambda: None)
    assert s2.check_options is not None
    with pytest.raises(WorkloadError, match="ffmpeg program, which is missing; .*pip install imageio-ffmpeg") as error:
        s2.check_options({"size": "full"}, s2.load_data(str(tiny_corpus)))
    assert "\n" not in str(error.value)


def test_the_dataset_repeats_shuffles_and_filters_as_the_recipes(tmp_path: Path, ffmpeg_program: str) -> None:
    seconds = [0.5, 0.63, 1.5, 2.5, 40.0, 60.0]
    corpus, _ = ensure_s2_data(_utterances(tmp_path, seconds), cache_dir=tmp_path / "cache")
    dataset = S2Dataset(corpus, spectrogram=_spectrogram(), ffmpeg=ffmpeg_program)  # type: ignore[arg-type]
    # 6 items x 16 copies (fewer than 100: max(2, 100 // 6)), the 0.5 s and 60 s ones dropped by duration
    assert len(dataset) == 4 * 16 and sorted(set(dataset.items)) == [1, 2, 3, 4]
    assert dataset.items[:8] != sorted(dataset.items[:8])  # shuffled (random.seed(1234))
    frames = {item: length for item, length in zip(dataset.items, dataset.lengths, strict=True)}
    assert frames[1] <= BOUNDARIES[0] and frames[4] > BOUNDARIES[-1]  # kept here, dropped by the sampler
    assert frames[2] == (44 + 2 * 48_000) // 1280 and dataset.seconds[dataset.items.index(2)] == pytest.approx(1.5)
    ssl, spec, wav, text = dataset[dataset.items.index(3)]
    assert wav.shape == (1, 80_000) and spec.shape == (1025, 125) and ssl.shape == (1, 768, 125)  # 2.5 s at 32 kHz
    assert ssl.dtype == torch.float16 and text.dtype == torch.float32 and text.shape == (12,)  # sil, 5 x 2, sil
    assert torch.allclose(spec, linear_spectrogram(wav, S2_V2_STEP)[0])  # the STFT of the ffmpeg-decoded audio


def test_too_little_audio_is_a_one_line_error(tmp_path: Path, ffmpeg_program: str) -> None:
    corpus, _ = ensure_s2_data(_utterances(tmp_path, [0.3, 0.5]), cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match="0 of the 2 utterances last over 0.6 s and under 54.0 s"):
        S2Dataset(corpus, spectrogram=_spectrogram(), ffmpeg=ffmpeg_program)  # type: ignore[arg-type]


def test_data_the_sampler_would_never_batch_is_refused_before_any_trial(tmp_path: Path, s2) -> None:
    utterances = tuple(_utterances(tmp_path, [0.62, 0.63]))  # kept by the dataset (> 0.6 s), 31 frames: no bucket
    data = DataSource(kind="folder", path=str(tmp_path), utterances=utterances, speakers=("s",))
    assert s2.prepare_data is not None
    with pytest.raises(DataError, match="none of the 100 items has 33 to 1900 spectrogram frames"):
        s2.prepare_data(data, REDUCED)


def test_collate_sorts_longest_first_and_pads_to_the_even_width_above(tmp_path: Path, ffmpeg_program: str) -> None:
    corpus, _ = ensure_s2_data(_utterances(tmp_path, [1.0, 1.5]), cache_dir=tmp_path / "cache")
    dataset = S2Dataset(corpus, spectrogram=_spectrogram(), ffmpeg=ffmpeg_program)  # type: ignore[arg-type]
    short, long = dataset[dataset.items.index(0)], dataset[dataset.items.index(1)]
    batch = collate_s2([short, long])
    assert batch["spec_lengths"].tolist() == [75, 50] and batch["ssl_lengths"].tolist() == [75, 50]
    assert batch["spec"].shape == (2, 1025, 76) and batch["ssl"].shape == (2, 768, 76)  # 2 * (75 // 2 + 1)
    assert batch["wav"].shape == (2, 1, 48_000) and batch["wav_lengths"].tolist() == [48_000, 32_000]
    assert batch["text"].dtype == torch.long and batch["text_lengths"].tolist() == [12, 12]
    assert (batch["spec"][1, :, 50:] == 0).all() and (batch["wav"][1, :, 32_000:] == 0).all()
    assert torch.equal(batch["ssl"][0, :, :75], long[0][0].float())


def test_items_go_to_the_bucket_of_their_frames_and_outside_ones_are_dropped() -> None:
    lengths = [32, 33, 300, 301, 1900, 1901, 20, 450, 299]
    # (32, 300]: 33, 300, 299; (300, 400]: 301; (400, 500]: 450; (1800, 1900]: 1900; 32, 1901 and 20 in none
    assert bucket_items(lengths) == [[1, 2, 8], [3], [7], [4]]


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_the_bucket_sampler_pads_each_bucket_to_whole_global_batches_dealt_by_rank(replicas: int) -> None:
    lengths = [100 + i for i in range(13)] + [350 + i for i in range(5)] + [10, 5000]  # two buckets, two dropped
    batch_size = 4
    group = batch_size * replicas
    expected = math.ceil(13 / group) * group + math.ceil(5 / group) * group
    assert samples_per_epoch(lengths, batch_size=batch_size, replicas=replicas) == expected
    shares = [
        bucket_sampler_epoch(lengths, batch_size=batch_size, replicas=replicas, rank=rank, epoch=3)
        for rank in range(replicas)
    ]
    for batches in shares:
        assert len(batches) == expected // group and all(len(batch) == batch_size for batch in batches)
        assert all(len({lengths[index] >= 350 for index in batch}) == 1 for batch in batches)  # one bucket each
    dealt = [index for batches in shares for batch in batches for index in batch]
    assert len(dealt) == expected and set(dealt) == set(range(18))  # every bucketed item; 18 and 19 never
    again = bucket_sampler_epoch(lengths, batch_size=batch_size, replicas=replicas, rank=0, epoch=3)
    other = bucket_sampler_epoch(lengths, batch_size=batch_size, replicas=replicas, rank=0, epoch=4)
    assert again == shares[0] and other != shares[0]  # seeded by the epoch, the same order on every rank


def test_the_worst_batch_is_the_longest_buckets_longest_items() -> None:
    lengths = [100, 350, 360, 120, 340]
    phones = [5, 9, 3, 5, 9]
    assert worst_bucket_batch(lengths, phones, 2) == [2, 1]
    assert worst_bucket_batch(lengths, phones, 5) == [2, 1, 4, 2, 1]  # repeated, as the bucket's padding repeats


def test_gradient_norm_is_the_global_two_norm() -> None:
    weights = [
        torch.nn.Parameter(torch.zeros(2)),
        torch.nn.Parameter(torch.zeros(3)),
        torch.nn.Parameter(torch.ones(1)),
    ]
    weights[0].grad, weights[1].grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0, 12.0])
    assert gradient_norm(weights) == pytest.approx(13.0)  # the third has no gradient and is skipped


def test_bad_options_are_one_line_errors(tiny_corpus: Path, s2) -> None:
    assert s2.check_options is not None
    with pytest.raises(WorkloadError, match="size='tiny' is not one of full, reduced"):
        s2.check_options({"size": "tiny"}, s2.load_data(str(tiny_corpus)))
    model, step = model_configs(REDUCED)
    assert model.hop_length == step.hop_length == 640 and step.segment_size == 8 * 640  # the recipe's data


def test_one_process_builds_the_recipes_optimisers_sampler_and_worst_batch(tiny_corpus: Path, s2) -> None:
    config = TrialConfig(per_device_batch_size=5)
    context = WorkloadContext(data=s2.load_data(str(tiny_corpus)), config=config, options=REDUCED, device=CPU)
    torch.manual_seed(0)
    setup = s2.build(context)
    dataset = setup.dataset
    assert len(dataset) == 96 and setup.find_unused_parameters  # 12 items x 8; ssl_proj never gets a gradient
    # 1-2 s items: one bucket (32, 300], padded from 96 to 100 (whole batches of 5); the accounting counts those
    assert epoch_size(setup, config, 1) == 100 and epoch_size(setup, config, 2) == 100
    assert setup.batch_sampler_factory is not None and setup.worst_case_batches is not None
    batches = list(setup.batch_sampler_factory(config, torch.Generator().manual_seed(0), [0, 1]))
    assert len(batches) == 20 and set().union(*map(set, batches)) == set(range(96))  # not autotune's share [0, 1]
    groups = setup.optimizer.param_groups
    assert [group["lr"] for group in groups] == pytest.approx([RECIPE_LR] + [RECIPE_LR * 0.4] * 3)
    assert groups[0]["betas"] == (0.8, 0.99) and groups[0]["eps"] == 1e-9 and RECIPE_LR == 1e-4 * 0.999875
    enc_p = setup.model.enc_p  # type: ignore[union-attr]
    assert groups[1]["params"] == list(enc_p.text_embedding.parameters())
    worst = setup.worst_case_batches(config)[0]
    longest = max(dataset.lengths)  # type: ignore[attr-defined]  # frames from the file size, to one frame
    assert worst["spec"].shape[0] == 5 and longest - 1 <= int(worst["spec_lengths"][0]) <= longest


@pytest.mark.slow  # the first steps of 72M parameters (net_d 46.7M at every size) take tens of seconds on a CPU
def test_the_loss_steps_the_discriminator_before_the_generators_loss(tiny_corpus: Path, s2) -> None:
    config = TrialConfig(per_device_batch_size=2)
    context = WorkloadContext(data=s2.load_data(str(tiny_corpus)), config=config, options=REDUCED, device=CPU)
    torch.manual_seed(0)
    setup = s2.build(context)
    batch = collate_s2([setup.dataset[0], setup.dataset[1]])
    net_d = setup.loss_fn.discriminator.net_d  # type: ignore[attr-defined]  # the discriminator's step is the loss's
    before = [parameter.detach().clone() for parameter in net_d.parameters()]
    loss = setup.loss_fn(setup.model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    changed = [not torch.equal(old, new) for old, new in zip(before, net_d.parameters(), strict=True)]
    assert all(changed)  # optim_d stepped inside the loss, before the generator's loss was computed
    loss.backward()
    assert setup.model.ssl_proj.weight.grad is None  # type: ignore[union-attr]
    assert all(p.grad is not None for name, p in setup.model.named_parameters() if not name.startswith("ssl_proj"))


def test_gradient_accumulation_is_refused(tiny_corpus: Path, s2) -> None:
    config = TrialConfig(per_device_batch_size=2, grad_accum_steps=2)
    context = WorkloadContext(data=s2.load_data(str(tiny_corpus)), config=config, options=REDUCED, device=CPU)
    with pytest.raises(WorkloadError, match="grad_accum_steps=2: s2_train.py steps both models every batch"):
        s2.build(context)


@pytest.mark.slow
def test_two_real_steps_at_the_reduced_size(tiny_corpus: Path, tmp_path: Path, s2) -> None:
    config = TrialConfig(
        per_device_batch_size=4, num_workers=1, prefetch_factor=3, persistent_workers=True, intra_op_threads=2
    )
    data = s2.load_data(str(tiny_corpus))
    s2.prepare_data(data, REDUCED)  # type: ignore[misc]  # the parent's step, before the trial
    result = run_two_steps("gpt-sovits-s2", data, REDUCED, config, tmp_path)
    assert result.samples_per_second > 0 and result.audio_seconds_per_second > 0
    assert result.epoch_accounting["samples_per_epoch"] == 96  # type: ignore[index]  # 96 items, batches of 4


@pytest.mark.slow
def test_two_gloo_ranks_train_under_ddp_with_unused_parameters(tiny_corpus: Path, tmp_path: Path, s2) -> None:
    """net_g under the loop's DDP and net_d under its own, both with find_unused_parameters (ssl_proj has no
    gradient: without it DDP fails the second step); each rank its bucket share, padded to whole batches."""
    data = s2.load_data(str(tiny_corpus))
    spec = TrialSpec(
        workload="gpt-sovits-s2",
        workload_options=REDUCED,
        data_file=str(yamlio.write_json(tmp_path / "data.json", data.to_dict())),
        config=TrialConfig(per_device_batch_size=5, world_size=2, intra_op_threads=1),
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=1, max_window_steps=2),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
        collective_timeout_s=240,
    )
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=480)
    assert result.status == "ok", result.log_tail
    accounting = result.epoch_accounting
    assert accounting is not None and accounting["dataset_size"] == 100  # 96 items padded to whole batches of 2 x 5
    assert accounting["batches_per_epoch_per_rank"] == [10, 10] and accounting["samples_per_epoch"] == 100
