"""The proof's steps at the boundary a CPU can reach: the OOM study's space, and the plain load_config loop."""

from __future__ import annotations

import pytest

from autotune import space
from autotune.gpu_proof.steps_runs import (
    EXPORT_TARGETS,
    OOM_BATCH,
    _oom_space,
    _plain_training,
    autotune_command,
    oom_batch,
    predicted_loop_rate,
    result_figures,
    study_verdict,
)
from autotune.knobs.config import TrialConfig
from autotune.result.tuned_config import TunedConfig, write_config
from tests.conftest import make_cpu, make_cuda


def test_the_oom_space_measures_the_huge_batch_right_after_the_baseline(tmp_path) -> None:
    loaded = space.load(_oom_space(tmp_path), make_cuda("NVIDIA H100 80GB HBM3", (9, 0)))
    assert loaded.baseline["per_device_batch_size"] == 32
    assert [seed["per_device_batch_size"] for seed in loaded.seeds] == [OOM_BATCH]
    # Only the OOM is proven here: no cuDNN search per shape, the fbank on the GPU rather than in one worker.
    assert loaded.fixed["cudnn_benchmark"] is False and loaded.seeds[0]["feature_device"] == "device"
    sized = space.load(_oom_space(tmp_path, 4096), make_cuda("NVIDIA H200", (9, 0)))
    assert [seed["per_device_batch_size"] for seed in sized.seeds] == [4096]


def test_the_oom_batch_needs_well_over_the_devices_memory() -> None:
    """bs=2048 fitted an H200 (133 GiB of 139.8) and was refused for headroom: the batch grows with the device."""
    assert oom_batch(None) == OOM_BATCH  # a CPU rehearsal
    assert oom_batch(80 * 10**9) == 2048  # an H100: 2,048 x 64 MiB = 128 GiB, 1.7x its 74.5 GiB
    assert oom_batch(150_109_880_320) == 4096  # the H200 as NVML reads it
    assert oom_batch(192 * 2**30) == 8192


@pytest.fixture
def cpu_result(tmp_path, tiny_corpus):
    """A cam++ result YAML over the tiny corpus, as `autotune run` writes one."""
    from autotune import data, workloads

    tuned = TunedConfig(
        workload={"name": "cam++", "model": "cam++", "options": {**workloads.get("cam++").options, "crop_s": 1.0}},
        config=TrialConfig(per_device_batch_size=2, num_workers=1, prefetch_factor=2, precision="fp32"),
        device_type="cpu",
        metrics={
            "winner": {"status": "ok", "samples_per_second": 10.0, "spread_fraction": 0.04},
            "baseline": {"status": "ok", "samples_per_second": 5.0},
            "speedup": 2.0,
            "compute": {"fraction_of_peak": None},
        },
        hardware=make_cpu().to_dict(),
        data=data.load_source(tiny_corpus).describe(),
        search={},
        created="2026-01-01T00:00:00+00:00",
        autotune_version="0.1.0",
    )
    return write_config(tuned, tmp_path / "cam++.yaml")


@pytest.mark.slow
def test_the_plain_loop_trains_with_what_load_config_gives(cpu_result) -> None:
    measured = _plain_training(cpu_result, "cpu", window_s=1.0, read_loss=True)
    assert measured["samples_per_second"] > 0 and measured["steps"] >= 4 and measured["epochs"] >= 1


def test_the_loop_is_held_to_what_the_result_predicts_for_its_own_epochs() -> None:
    """Where the run charged each epoch's start, the winner's figure; on the synthetic stand-in (measured, not
    charged), the steady rate with the measured start added to each epoch of the result's accounting."""
    winner = {
        "samples_per_second": 1153.84,
        "steady_samples_per_second": 1153.84,
        "epoch_start_s": 2.0855,
        "epoch_accounting": {"samples_per_epoch": 1792},
    }
    stand_in = {"metrics": {"winner": winner, "run_length": {"epochs": 1.0, "per_epoch_costs": False}}}
    rate, basis = predicted_loop_rate(stand_in)
    assert rate == pytest.approx(1792 / (1792 / 1153.84 + 2.0855)) and "2.09-s epoch start" in basis
    charged = {"metrics": {"winner": {**winner, "samples_per_second": 523.7}, "run_length": {"epochs": 1.0}}}
    assert predicted_loop_rate(charged)[0] == 523.7  # a result from before the stand-in rule: charged
    unmeasured = {"metrics": {"winner": {"samples_per_second": 10.0}, "run_length": {"per_epoch_costs": False}}}
    assert predicted_loop_rate(unmeasured)[0] == 10.0


def test_the_full_runs_figures_and_exports_come_from_its_yaml(cpu_result, tmp_path) -> None:
    figures = result_figures(cpu_result)
    assert (figures["winner_samples_per_second"], figures["baseline_samples_per_second"]) == (10.0, 5.0)
    assert (figures["speedup"], figures["winner_precision"]) == (2.0, "fp32")
    assert figures["winner_dataloader"]["batch_size"] == 2
    for target in EXPORT_TARGETS:
        snippet = autotune_command("export", str(cpu_result), "--to", target, cwd=tmp_path, timeout_s=60)
        assert snippet.returncode == 0 and snippet.stdout.strip(), snippet.stdout


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
