"""The feature_device knob in the speaker workloads: 3D-Speaker's fbank moved from the DataLoader workers into the
training step gives the model the same features from the same audio, and trains in a real trial subprocess; the
pipelines without a choice refuse it before any trial."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune import space, workloads
from autotune.data import collate_speaker_batch
from autotune.errors import SpaceError
from autotune.knobs.config import TrialConfig
from autotune.knobs.feature_device import KNOB
from autotune.machine.hardware import probe
from autotune.space.knob_checks import check_feature_device as check_space
from autotune.space.knob_checks import feature_device_values as space_values
from tests.conftest import make_cpu, make_cuda
from tests.workloads.short_trial import run_two_steps
from tests.workloads.speaker_setup import build


@pytest.mark.slow
def test_device_features_are_the_workers_features_of_the_same_audio(tiny_corpus: Path) -> None:
    """The recipe's whole item (decode, speed perturbation, corruption, crop) with the same draws: the workers'
    fbank and the step's batched fbank of the crops agree, and so do the losses of one model over them. CAM++ and
    ERes2Net share this pipeline (speaker.py _dataset); a narrow ERes2Net keeps the model cheap."""
    name = "eres2net-large"
    options = {"crop_s": 0.5, "aug_prob": 1.0}
    workers = build(name, tiny_corpus, feature_device="workers", **options)
    device = build(name, tiny_corpus, feature_device="device", **options)
    assert workers.dataset.featurise and not device.dataset.featurise  # type: ignore[attr-defined]
    items = {}
    for label, setup in (("workers", workers), ("device", device)):
        torch.manual_seed(3)
        items[label] = [setup.dataset[index] for index in (0, 5, 11)]  # type: ignore[index]
    assert [label for _, label in items["workers"]] == [label for _, label in items["device"]]
    assert items["device"][0][0].shape == (8000,) and items["workers"][0][0].shape == (48, 80)
    worker_batch = collate_speaker_batch(items["workers"])
    device_batch = collate_speaker_batch(items["device"])
    device.model.load_state_dict(workers.model.state_dict())
    seen: dict[str, list[torch.Tensor]] = {"workers": [], "device": []}
    losses = {}
    for label, setup, batch in (("workers", workers, worker_batch), ("device", device, device_batch)):
        inputs = seen[label]
        setup.model["embedder"].register_forward_pre_hook(lambda module, args, inputs=inputs: inputs.append(args[0]))
        losses[label] = setup.loss_fn(setup.model, batch).item()
    torch.testing.assert_close(seen["device"][0], seen["workers"][0], rtol=0, atol=1e-4)
    assert losses["device"] == pytest.approx(losses["workers"], rel=1e-4)


def test_device_features_are_computed_in_float32_under_autocast(tiny_corpus: Path) -> None:
    setup = build("eres2net-large", tiny_corpus, feature_device="device", crop_s=0.5, aug_prob=0.0)
    batch = collate_speaker_batch([setup.dataset[index] for index in range(2)])  # type: ignore[index]
    seen: list[torch.Tensor] = []
    setup.model["embedder"].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        setup.loss_fn(setup.model, batch)
    assert seen[0].dtype == torch.float32 and seen[0].shape == (2, 48, 80)


def test_pipelines_without_a_choice_refuse_a_placement(tiny_corpus: Path) -> None:
    assert workloads.get("cam++").feature_devices == ("workers", "device")
    assert workloads.get("conformer").feature_devices == ("workers", "device")  # test_asr_feature_device.py
    for name in ("ecapa-tdnn", "fastspeech2"):
        assert workloads.get(name).feature_devices == ()
    with pytest.raises(ValueError, match="not a placement the speechbrain pipeline runs"):
        build("ecapa-tdnn", tiny_corpus, feature_device="device", crop_s=0.5)
    unset = build("ecapa-tdnn", tiny_corpus, crop_s=0.5, augment_copies=0)  # unset: the recipe's own placement
    assert unset.dataset[0][0].shape == (8000,)  # type: ignore[index]  # a crop: compute_forward featurises it


def _space(tmp_path: Path, workload: str, text: str) -> space.SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(f"extends: shared/core\nworkload: {workload}\n{text}")
    return space.load(path, probe("cpu"))


def test_a_space_naming_a_placement_the_workload_cannot_run_is_refused(tmp_path: Path) -> None:
    searched = _space(
        tmp_path, "ecapa-tdnn", "params:\n  feature_device: {type: categorical, choices: [workers, device]}\n"
    )
    assert space_values(searched) == {"workers", "device"}
    with pytest.raises(SpaceError, match="ecapa-tdnn has no feature placement to choose"):
        check_space(searched, "ecapa-tdnn", workloads.get("ecapa-tdnn").feature_devices, "space.yaml")
    seeded = _space(tmp_path, "cam++", "fixed:\n  feature_device: device\n")
    check_space(seeded, "cam++", workloads.get("cam++").feature_devices, "space.yaml")  # both run there
    with pytest.raises(SpaceError, match="'device' is not a placement mine can run; it runs workers"):
        check_space(seeded, "mine", ("workers",), "space.yaml")


def test_the_shipped_spaces_search_it_only_where_the_pipeline_has_both() -> None:
    for workload in workloads.names():
        spec = workloads.get(workload)
        path = space.space_path(spec.space_file or workload)
        assert KNOB not in space.load(path, make_cpu(2), workload_knobs=tuple(spec.knobs)).baseline  # CUDA only
        loaded = space.load(path, make_cuda(), workload_knobs=tuple(spec.knobs))
        check_space(loaded, workload, workloads.get(workload).feature_devices, workload)
        named = space_values(loaded)
        assert named == ({"workers", "device"} if workloads.get(workload).feature_devices else set()), workload
        if named:
            assert loaded.baseline["feature_device"] == "workers"  # the recipe's placement is the baseline


@pytest.mark.slow
def test_device_features_train_in_a_trial_subprocess(tiny_corpus: Path, tmp_path: Path) -> None:
    data = workloads.get("cam++").load_data(str(tiny_corpus))
    config = TrialConfig(per_device_batch_size=2, num_workers=1, feature_device="device")
    result = run_two_steps("cam++", data, {"crop_s": 0.5, "aug_prob": 1.0}, config, tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.audio_seconds_per_second == pytest.approx(0.5 * result.samples_per_second, rel=1e-6)
