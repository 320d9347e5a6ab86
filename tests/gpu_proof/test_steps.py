"""The proof's steps at the boundary a CPU can reach: the OOM study's space, and the plain load_config loop."""

from __future__ import annotations

import pytest

from autotune import space
from autotune.gpu_proof.steps_runs import OOM_BATCH, _oom_space, _plain_training, study_verdict
from autotune.results import TunedConfig, write_config
from autotune.trial.spec import TrialConfig
from tests.conftest import make_cpu, make_cuda


def test_the_oom_space_measures_the_huge_batch_right_after_the_baseline(tmp_path) -> None:
    loaded = space.load(_oom_space(tmp_path), make_cuda("NVIDIA H100 80GB HBM3", (9, 0)))
    assert loaded.baseline["per_device_batch_size"] == 32
    assert [seed["per_device_batch_size"] for seed in loaded.seeds] == [OOM_BATCH]


@pytest.mark.slow
def test_the_plain_loop_trains_with_what_load_config_gives(tmp_path, tiny_corpus) -> None:
    from autotune import data, workloads

    source = data.load_source(tiny_corpus)
    tuned = TunedConfig(
        workload={"name": "cam++", "model": "cam++", "options": {**workloads.get("cam++").options, "crop_s": 1.0}},
        config=TrialConfig(per_device_batch_size=2, num_workers=1, prefetch_factor=2, precision="fp32"),
        device_type="cpu",
        metrics={"winner": {"status": "ok", "samples_per_second": 10.0}},
        hardware=make_cpu().to_dict(),
        data=source.describe(),
        search={},
        created="2026-01-01T00:00:00+00:00",
        autotune_version="0.1.0",
    )
    measured = _plain_training(write_config(tuned, tmp_path / "cam++.yaml"), "cpu", window_s=1.0)
    assert measured["samples_per_second"] > 0 and measured["steps"] >= 4


@pytest.mark.slow
def test_the_study_verdict_reads_an_oom_trial_from_a_real_study(tmp_path, tiny_corpus) -> None:
    """The faulty workload runs out of memory at batch 1 (as CUDA does) and trains at 5: a real run's study says so."""
    from tests.fixtures import runs

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "workload: faulty\nparams:\n  per_device_batch_size: {type: categorical, choices: [1, 5]}\n"
        "fixed:\n  num_workers: 0\nbaseline:\n  per_device_batch_size: 5\nseeds:\n  - {per_device_batch_size: 1}\n"
    )
    args = runs.run_args(tiny_corpus, tmp_path, "--trials", "2", "--no-amp-check", "--no-ceiling")
    args[args.index(str(runs.FIXTURES / "fast_space.yaml"))] = str(space_file)
    process = runs.start(args, tmp_path / "run.log")
    assert process.wait(timeout=240) == 0, (tmp_path / "run.log").read_text()[-2000:]
    classified, measured, lines = study_verdict(tmp_path, oom_batch=1)
    assert (classified, measured) == (True, True), lines
    assert "bs=1: oom (infeasible=1.0)" in lines and "bs=5: ok (infeasible=0.0)" in lines
