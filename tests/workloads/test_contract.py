"""One contract for every registered workload: it builds, its size is the published one, and it really trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune import space, workloads, yamlio
from autotune.knobs.config import TrialConfig
from autotune.machine.hardware import probe
from autotune.trial import TimingSettings, TrialSpec, launch

EXAMPLE_PLUGIN = "examples.xvector_workload:workload"  # the README's bring-your-own-model example
ALL = [*workloads.names(), EXAMPLE_PLUGIN]


@pytest.mark.parametrize("name", ALL, ids=ALL)
def test_parameter_count_is_the_published_one(name):
    workload = workloads.get(name)
    if name == EXAMPLE_PLUGIN:  # a user's model has no published figure to match
        assert workload.published_parameters is None and workload.count_parameters() > 0
        return
    assert workload.published_parameters is not None
    assert workload.count_parameters() == workload.published_parameters


@pytest.mark.parametrize("name", ALL, ids=ALL)
def test_search_space_loads_on_this_machine(name):
    workload = workloads.get(name)
    loaded = space.load(
        space.space_path(workload.space_file or name), probe("cpu"), workload_knobs=tuple(workload.knobs)
    )
    assert loaded.params and loaded.baseline["per_device_batch_size"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL, ids=ALL)
def test_trains_for_real_in_a_trial_subprocess(name, tiny_corpus: Path, tmp_path: Path):
    workload = workloads.get(name)
    data = workload.load_data(str(tiny_corpus))
    data_file = yamlio.write_json(tmp_path / "data.json", data.to_dict())
    options = {"crop_s": 0.5} if "crop_s" in workload.options else {}
    if "size" in workload.options:  # NaturalSpeech2's full 378M parameters take minutes a CPU step: its reduced size
        options["size"] = "reduced"
    spec = TrialSpec(
        workload=name,
        workload_options=options,
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=2, num_workers=1, prefetch_factor=2),
        timing=TimingSettings(warmup_steps=1, window_s=0.1, min_window_steps=2),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
    # A hang guard, not a speed bar: GPT-SoVITS s2's first steps run its 50-iteration codebook initialisation
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=480)
    assert result.status == "ok", result.log_tail
    assert result.all_losses_finite and result.window_steps >= 2 and result.samples_per_second > 0
