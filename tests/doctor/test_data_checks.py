"""The audio stack, and a short read of the data list through the trials' decoder against the tuned rate."""

from __future__ import annotations

import pytest

from autotune.doctor import DoctorRequest, Verdict
from autotune.doctor.data_checks import read_sample
from autotune.knobs.config import TrialConfig
from tests.doctor.conftest import one, write_result


def test_audio_decoders_are_this_machines(no_nvml) -> None:
    import soundfile

    found = one("audio.decoders")
    assert found.verdict is Verdict.OK
    assert found.data["libsndfile"] == soundfile.__libsndfile_version__
    assert "FLAC" in found.data["formats"]


def test_read_sample_decodes_whole_files_or_crops(tiny_corpus) -> None:
    from autotune.data import load_source

    utterances = list(load_source(tiny_corpus).utterances)
    whole = read_sample(utterances, crop_s=None, budget_s=10.0)
    assert whole.files == len(utterances) == 12
    assert whole.audio_seconds == pytest.approx(sum(u.duration_s for u in utterances), rel=1e-3)
    crops = read_sample(utterances, crop_s=0.5, budget_s=10.0)
    assert crops.audio_seconds == pytest.approx(12 * 0.5, rel=1e-3)
    assert crops.files_per_second > 0


def test_read_sample_stops_at_its_time_budget(tiny_corpus) -> None:
    from autotune.data import load_source

    sample = read_sample(list(load_source(tiny_corpus).utterances), crop_s=None, budget_s=1e-9)
    assert sample.files == 1


def test_data_read_without_data_says_how_to_measure(no_nvml) -> None:
    found = one("data.read")
    assert (found.verdict, found.value) == (Verdict.INFO, "not measured")
    assert "--data" in found.fix


def test_data_read_measures_the_list(no_nvml, tiny_corpus) -> None:
    found = one("data.read", DoctorRequest(data=str(tiny_corpus), read_files=5))
    assert found.verdict is Verdict.INFO
    assert found.data["files"] == 5 and found.data["crop_s"] is None
    assert "--result" in found.fix


@pytest.mark.parametrize(("rate", "verdict"), [(1e-3, Verdict.OK), (1e9, Verdict.WARN)], ids=["keeps-up", "too-slow"])
def test_data_read_against_the_results_rate(no_nvml, tiny_corpus, tmp_path, rate, verdict) -> None:
    result = write_result(tmp_path, TrialConfig(per_device_batch_size=8, num_workers=2), samples_per_second=rate)
    found = one("data.read", DoctorRequest(data=str(tiny_corpus), result=str(result)))
    assert found.verdict is verdict
    assert found.data["crop_s"] == 3.0  # cam++'s trials read 3 s crops
    assert found.data["readers"] == 2


def test_unreadable_data_fails_with_the_data_error(no_nvml, tmp_path) -> None:
    (tmp_path / "broken.wav").write_bytes(b"not a wav file")
    found = one("data.read", DoctorRequest(data=str(tmp_path)))
    assert found.verdict is Verdict.FAIL
    assert "broken.wav" in found.value + found.fix
