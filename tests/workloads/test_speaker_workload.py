"""The speaker workloads' SpeechBrain augmentation option: the model sees 5x the loader batch, throughput counts 1x."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from autotune import workloads
from autotune.trial import TrialConfig
from autotune.workloads.base import WorkloadContext
from tests.workloads.short_trial import run_two_steps

SMALL_ECAPA = {"crop_s": 0.5, "channels": 64}


def _setup(tiny_corpus: Path, preload: bool = False, **options: object) -> workloads.TrainingSetup:
    workload = workloads.get("ecapa-tdnn")
    context = WorkloadContext(
        data=workload.load_data(str(tiny_corpus)),
        config=TrialConfig(per_device_batch_size=3, preload_audio=preload),
        options={**workload.options, **SMALL_ECAPA, **options},
        device=torch.device("cpu"),
    )
    return workload.build(context)


def test_only_ecapa_takes_the_option_and_it_is_off_by_default() -> None:
    assert workloads.get("ecapa-tdnn").options["augment_copies"] == 0
    assert workloads.get("ecapa-tdnn-512").options["augment_copies"] == 0
    assert "augment_copies" not in workloads.get("cam++").options


def test_speechbrain_shape_model_batch_is_five_times_the_loader_batch(tiny_corpus: Path) -> None:
    torch.manual_seed(0)
    setup = _setup(tiny_corpus, augment_copies=4)
    waveform, label = setup.dataset[0]  # type: ignore[misc]
    assert waveform.shape == (8000,) and isinstance(label, int)  # a 0.5 s crop: features come later, on the device
    batch = setup.collate_fn([setup.dataset[index] for index in range(3)])  # type: ignore[misc]
    seen: list[tuple[int, ...]] = []
    setup.model["embedder"].register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    loss = setup.loss_fn(setup.model, batch)
    loss.backward()
    assert seen == [(15, 51, 80)]  # 3 originals + 4 x 3 augmented copies, 51 Fbank frames of 80 bins each
    assert setup.samples_in(batch) == 3 and setup.audio_seconds_in(batch) == pytest.approx(1.5)
    assert torch.isfinite(loss)


def test_off_keeps_fbank_in_the_workers(tiny_corpus: Path) -> None:
    features, _ = _setup(tiny_corpus).dataset[0]  # type: ignore[misc]
    assert features.shape == (48, 80)


@pytest.mark.parametrize("copies", [-1, 2.5, True, "4"])
def test_bad_copies_are_refused(tiny_corpus: Path, copies: object) -> None:
    with pytest.raises(ValueError, match="augment_copies must be a whole number >= 0"):
        _setup(tiny_corpus, augment_copies=copies)


def test_trains_with_augmentation_from_preloaded_audio_in_a_trial_subprocess(tiny_corpus: Path, tmp_path: Path) -> None:
    data = workloads.get("ecapa-tdnn").load_data(str(tiny_corpus))
    options = {**SMALL_ECAPA, "augment_copies": 4}
    config = TrialConfig(per_device_batch_size=2, num_workers=1, preload_audio=True)
    result = run_two_steps("ecapa-tdnn", data, options, config, tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.preload_s and 0 < result.preload_s < result.setup_s  # reported on its own, counted in set-up
    # Loader samples: 0.5 s each, however many augmented copies the model saw.
    assert result.audio_seconds_per_second == pytest.approx(0.5 * result.samples_per_second, rel=1e-6)


def test_preloaded_dataset_reads_nothing_from_disk(tiny_corpus: Path, tmp_path: Path) -> None:
    copied = shutil.copytree(tiny_corpus, tmp_path / "corpus")
    setup, waveforms = _setup(copied, preload=True), _setup(copied, preload=True, augment_copies=4)
    assert setup.preload_s > 0 and len(setup.dataset.audio) == len(setup.dataset) == 12  # type: ignore[attr-defined]
    for wav in copied.rglob("*.wav"):
        wav.unlink()
    features, _ = setup.dataset[0]  # type: ignore[misc]
    waveform, _ = waveforms.dataset[0]  # type: ignore[misc]
    assert features.shape == (48, 80) and waveform.shape == (8000,)  # fbank in the workers, or a waveform crop
    assert _setup(tiny_corpus).preload_s == 0.0
