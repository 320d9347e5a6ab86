"""The speaker workloads train through their recipes' pipelines: 3D-Speaker's (speed perturbation with tripled classes,
noise/reverb corruption in the workers) and SpeechBrain's (4 augmented copies and Fbank on the device)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune import space, workloads
from autotune.errors import UserError
from autotune.knobs.config import TrialConfig
from tests.workloads.short_trial import run_two_steps
from tests.workloads.speaker_setup import build

RECIPES = json.loads((Path(__file__).resolve().parents[1] / "reference" / "speaker_recipes.json").read_text())
SMALL_ECAPA = {"crop_s": 0.5, "channels": 64}
THREED_SPEAKER = {"cam++": "cam++", "eres2net": "eres2net", "eres2net-large": "eres2net"}


@pytest.mark.parametrize("name", sorted(THREED_SPEAKER))
def test_3d_speaker_workloads_take_their_own_recipes_values(name: str) -> None:
    recipe = RECIPES["3d-speaker"]["recipes"][THREED_SPEAKER[name]]
    options = workloads.get(name).options
    assert (options["lr"], options["margin"], options["scale"]) == (
        recipe["lr"],
        recipe["final_margin"],
        recipe["loss_scale"],
    )
    assert (options["aug_prob"], options["speed_perturb"]) == (recipe["aug_prob"], recipe["speed_pertub"])
    assert (options["noise"], options["reverb"]) == (None, None)  # autotune's synthetic set unless the user names one


def test_ecapa_trains_with_speechbrains_four_augmented_copies_by_default() -> None:
    augmenter = RECIPES["speechbrain"]["augmenter"]
    assert augmenter["concat_original"] and augmenter["min_augmentations"] == augmenter["max_augmentations"] == 4
    assert workloads.get("ecapa-tdnn").options["augment_copies"] == 4
    assert workloads.get("ecapa-tdnn-512").options["augment_copies"] == 4
    assert "augment_copies" not in workloads.get("cam++").options


def test_speed_perturbation_triples_the_classes(tiny_corpus: Path) -> None:
    setup = build("cam++", tiny_corpus, crop_s=0.5, aug_prob=0.0)
    assert setup.model["classifier"].weight.shape == (3 * 4, 512)  # 4 speakers at 3 speeds
    torch.manual_seed(0)
    seen: set[int] = set()
    for draw in range(240):  # until every speaker was seen at every speed (about 40 draws)
        label = setup.dataset[draw % 12][1]  # type: ignore[index]
        assert label % 4 == setup.dataset.labels[draw % 12]  # type: ignore[attr-defined]
        seen.add(label)
        if len(seen) == 12:
            break
    assert seen == set(range(12))
    features, _ = setup.dataset[0]  # type: ignore[index]
    assert features.shape == (48, 80)
    plain = build("cam++", tiny_corpus, crop_s=0.5, aug_prob=0.0, speed_perturb=False)
    assert plain.model["classifier"].weight.shape == (4, 512)


def test_3d_speaker_items_are_corrupted_in_the_workers(tiny_corpus: Path) -> None:
    clean = build("eres2net-large", tiny_corpus, crop_s=0.5, aug_prob=0.0, speed_perturb=False)
    noisy = build("eres2net-large", tiny_corpus, crop_s=0.5, aug_prob=1.0, speed_perturb=False)
    assert noisy.dataset.corruption.aug_prob == 1.0 and len(noisy.dataset.corruption.noise) >= 1  # type: ignore[attr-defined]
    for index in range(3):
        torch.manual_seed(index)
        clean_features, _ = clean.dataset[index]  # type: ignore[index]
        torch.manual_seed(index)
        noisy_features, _ = noisy.dataset[index]  # type: ignore[index]
        assert not torch.allclose(clean_features, noisy_features, atol=1e-3)


@pytest.mark.slow
def test_corruption_and_speed_perturbation_train_in_a_trial_subprocess(tiny_corpus: Path, tmp_path: Path) -> None:
    data = workloads.get("cam++").load_data(str(tiny_corpus))
    options = {"crop_s": 0.5, "aug_prob": 1.0}
    result = run_two_steps("cam++", data, options, TrialConfig(per_device_batch_size=2, num_workers=1), tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0


def _scp(path: Path, files: list[Path]) -> Path:
    path.write_text("".join(f"k{index} {file}\n" for index, file in enumerate(files)))
    return path


def test_check_options_notes_the_synthetic_set_and_probes_users_lists(tiny_corpus: Path, tmp_path: Path) -> None:
    workload = workloads.get("cam++")
    data = workload.load_data(str(tiny_corpus))
    notes = workload.check_options(dict(workload.options), data)  # type: ignore[misc]
    assert len(notes) == 1 and "synthetic" in notes[0] and "--option noise=" in notes[0]
    wavs = sorted(tiny_corpus.rglob("*.wav"))
    noise, reverb = _scp(tmp_path / "noise.scp", wavs[:2]), _scp(tmp_path / "rir.scp", wavs[2:3])
    assert workload.check_options({**workload.options, "noise": str(noise), "reverb": str(reverb)}, data) == []  # type: ignore[misc]
    assert workload.check_options({**workload.options, "aug_prob": 0.0}, data) == []  # type: ignore[misc]
    assert workloads.get("ecapa-tdnn").check_options(dict(workloads.get("ecapa-tdnn").options), data) == []  # type: ignore[misc]


def _refusal(tiny_corpus: Path, **options: object) -> str:
    workload = workloads.get("eres2net")
    with pytest.raises(UserError) as info:
        workload.check_options({**workload.options, **options}, workload.load_data(str(tiny_corpus)))  # type: ignore[misc]
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bad_augmentation_options_are_refused_before_any_trial(tiny_corpus: Path, tmp_path: Path) -> None:
    assert "does not exist" in _refusal(tiny_corpus, noise=str(tmp_path / "missing.scp"))
    assert "line 1" in _refusal(tiny_corpus, reverb=str(_scp(tmp_path / "gone.scp", [tmp_path / "gone.wav"])))
    narrow = tmp_path / "8k.wav"
    sf.write(narrow, np.zeros(8000, dtype=np.int16), 8000)
    assert "8000 Hz" in _refusal(tiny_corpus, noise=str(_scp(tmp_path / "8k.scp", [narrow])))
    (tmp_path / "empty.scp").write_text("")
    assert "lists no files" in _refusal(tiny_corpus, noise=str(tmp_path / "empty.scp"))
    assert "aug_prob must be in [0, 1]" in _refusal(tiny_corpus, aug_prob=1.5)
    assert "speed_perturb must be true or false" in _refusal(tiny_corpus, speed_perturb="yes")


def test_speechbrain_shape_model_batch_is_five_times_the_loader_batch(tiny_corpus: Path) -> None:
    torch.manual_seed(0)
    setup = build("ecapa-tdnn", tiny_corpus, **SMALL_ECAPA, augment_copies=4)
    waveform, label = setup.dataset[0]  # type: ignore[misc]
    assert waveform.shape == (8000,) and isinstance(label, int)  # a 0.5 s crop: features come later, on the device
    batch = setup.collate_fn([setup.dataset[index] for index in range(3)])  # type: ignore[misc]
    seen: list[tuple[int, ...]] = []
    setup.model["embedder"].register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    loss = setup.loss_fn(setup.model, batch)
    loss.backward()
    assert seen == [(15, 51, 80)]  # 3 originals + 4 x 3 augmented copies, 51 Fbank frames of 80 bins each
    assert setup.samples_in(batch) == 3 and setup.audio_seconds_in(batch) == pytest.approx(1.5)
    assert setup.model["classifier"].weight.shape[0] == 4  # no speed perturbation in SpeechBrain's recipe
    assert torch.isfinite(loss)


def test_no_copies_still_computes_the_fbank_in_the_step(tiny_corpus: Path) -> None:
    """SpeechBrain's compute_forward featurises the batch whether or not it augments: so does the built-in."""
    torch.manual_seed(0)
    setup = build("ecapa-tdnn", tiny_corpus, **SMALL_ECAPA, augment_copies=0)
    waveform, _ = setup.dataset[0]  # type: ignore[misc]
    assert waveform.shape == (8000,)  # the worker hands over the crop, not its fbank
    batch = setup.collate_fn([setup.dataset[index] for index in range(3)])  # type: ignore[misc]
    seen: list[tuple[int, ...]] = []
    setup.model["embedder"].register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    assert torch.isfinite(setup.loss_fn(setup.model, batch))
    assert seen == [(3, 51, 80)]  # the loader batch alone, featurised by SpeechBrain's Fbank in the step


@pytest.mark.parametrize("copies", [-1, 2.5, True, "4"])
def test_bad_copies_are_refused(tiny_corpus: Path, copies: object) -> None:
    with pytest.raises(ValueError, match="augment_copies must be a whole number >= 0"):
        build("ecapa-tdnn", tiny_corpus, **SMALL_ECAPA, augment_copies=copies)
    workload = workloads.get("ecapa-tdnn")
    with pytest.raises(UserError, match="augment_copies must be a whole number >= 0"):
        workload.check_options({**workload.options, "augment_copies": copies}, workload.load_data(str(tiny_corpus)))  # type: ignore[misc]


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
    setup = build("ecapa-tdnn", copied, preload=True, **SMALL_ECAPA, augment_copies=0)
    waveforms = build("ecapa-tdnn", copied, preload=True, **SMALL_ECAPA, augment_copies=4)
    speakerlab = build("cam++", copied, preload=True, crop_s=0.5, aug_prob=0.0)
    assert setup.preload_s > 0 and len(setup.dataset.audio) == len(setup.dataset) == 12  # type: ignore[attr-defined]
    for wav in copied.rglob("*.wav"):
        wav.unlink()
    crop, _ = setup.dataset[0]  # type: ignore[misc]
    waveform, _ = waveforms.dataset[0]  # type: ignore[misc]
    features, _ = speakerlab.dataset[0]  # type: ignore[misc]
    assert crop.shape == waveform.shape == (8000,) and features.shape == (48, 80)
    assert build("ecapa-tdnn", tiny_corpus, **SMALL_ECAPA).preload_s == 0.0


def test_ecapa_baseline_is_tf32_because_speechbrain_turns_it_on_at_import() -> None:
    """SpeechBrain's allow_tf32 quirk (speechbrain/utils/quirks.py, applied when the package is imported) sets TF32
    for matmuls and cuDNN: its recipe's plain fp32 runs as autotune's tf32, so that is ECAPA's GPU baseline."""
    pytest.importorskip("speechbrain")
    probe = (
        "import torch; m, c = torch.backends.cuda.matmul, torch.backends.cudnn; before = (m.allow_tf32, c.allow_tf32);"
        "import speechbrain; print(before, (m.allow_tf32, c.allow_tf32))"
    )
    env = {key: value for key, value in os.environ.items() if key != "SB_DISABLE_QUIRKS"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split("\n")[-2] == "(False, True) (True, True)"  # torch's defaults, then SpeechBrain's
    for name in ("ecapa-tdnn", "ecapa-tdnn-512"):
        recipe = space.read(space.space_path(f"{name}.yaml"))  # `extends` merged in: 512 builds on ecapa-tdnn
        assert recipe["baseline"]["precision"] == "tf32" and recipe["cpu"]["baseline"]["precision"] == "fp32"


@pytest.mark.parametrize(
    ("knob", "option", "checkpointed"),
    [(None, True, True), (None, False, False), (False, True, False), (True, False, True)],
)
def test_campplus_checkpoints_as_the_knob_says_or_as_its_recipe(
    knob: bool | None, option: bool, checkpointed: bool, tiny_corpus: Path
) -> None:
    """activation_checkpointing, where set, decides CAM++'s memory_efficient; unset, the recipe's option does."""
    config = TrialConfig(per_device_batch_size=3, activation_checkpointing=knob)
    setup = build("cam++", tiny_corpus, config=config, crop_s=0.5, aug_prob=0.0, memory_efficient=option)
    layers = [module for module in setup.model.modules() if hasattr(module, "memory_efficient")]
    assert layers and {layer.memory_efficient for layer in layers} == {checkpointed}
