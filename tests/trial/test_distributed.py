"""Multi-process trials on a CPU with gloo: summed throughput, the batch accounting check, a failing rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune import yamlio
from autotune.data import load_source
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec, launch
from autotune.trial.child import combine_rank_summaries
from tests.fixtures.inductor import NEEDS_INDUCTOR

FAULTY = "tests.fixtures.faulty_workload:workload"
TIMING = TimingSettings(warmup_steps=2, window_s=0.5, min_window_steps=4)


def _spec(tmp_path: Path, corpus: Path, batch: int, world_size: int = 2, **config: object) -> TrialSpec:
    data_file = yamlio.write_json(tmp_path / "data.json", load_source(corpus).to_dict())
    return TrialSpec(
        workload=FAULTY,
        workload_options={},
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=batch, world_size=world_size, intra_op_threads=1, **config),
        timing=TIMING,
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
        collective_timeout_s=120,
    )


def _leftovers(tmp_path: Path) -> list[int]:
    """Processes still running a trial of this test (ranks or their DataLoader workers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(tmp_path).encode() in environ:
            found.append(int(pid))
    return found


def test_two_ranks_sum_their_throughput_and_their_epochs_add_up(tmp_path, tiny_corpus):
    result = launch(_spec(tmp_path, tiny_corpus, 5, num_workers=1), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.world_size == 2
    # 64 vectors dealt to 2 ranks (32 each), batches of 5 with the last short one dropped: 6 per rank, 60 samples.
    assert result.epoch_accounting == {
        "dataset_size": 64,
        "world_size": 2,
        "batches_per_epoch_per_rank": [6, 6],
        "samples_per_epoch": 60,
    }
    per_rank = result.per_rank_samples_per_second
    assert per_rank is not None and len(per_rank) == 2 and min(per_rank) > 0
    # Both ranks ran the same steps over one shared window: the trial's rate is the sum, not one rank's.
    assert 0.8 * sum(per_rank) <= result.window_samples_per_second <= 1.001 * sum(per_rank)
    assert result.window_steps >= 4 and result.all_losses_finite
    assert (tmp_path / "trial" / "trial.rank1.log").exists()


def test_a_sampler_that_splits_by_rank_twice_fails_with_the_numbers(tmp_path, tiny_corpus):
    result = launch(_spec(tmp_path, tiny_corpus, 9), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "accounting"
    assert "1 batches per epoch per rank x 2 ranks" in result.reason and "dataset has 64" in result.reason
    assert "split across ranks more than once" in result.reason
    assert "\n" not in result.reason


def test_one_rank_failing_ends_the_trial_at_once_with_its_reason(tmp_path, tiny_corpus):
    result = launch(_spec(tmp_path, tiny_corpus, 10), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "oom"
    assert result.reason.startswith("rank 1 of 2: out of memory")
    # Rank 0 was left waiting in an all-reduce with a 120 s collective timeout: the launcher did not wait for it.
    assert result.wall_s < 60
    assert _leftovers(tmp_path) == []


def test_combined_summary_sums_samples_over_the_longest_window_and_keeps_the_worst_rank():
    def rank(samples: int, window_s: float, wait: float, peak: int) -> dict[str, object]:
        rate = samples / window_s
        return {
            "samples_per_second": rate * 0.9,
            "window_samples_per_second": rate,
            "audio_seconds_per_second": rate * 0.9 * 3.0,  # each rank's epoch: 3 s of audio per sample
            "samples": samples,
            "audio_s": samples * 3.0,
            "window_s": window_s,
            "data_wait_fraction": wait,
            "step_time_median_s": window_s / 10,
            "window_steps": 10,
            "peak_memory_bytes": peak,
            "memory_capacity_bytes": 1000,
            "gpu_utilization_percent": None,
            "gpu_power_watts": None,
        }

    combined = combine_rank_summaries([rank(100, 2.0, 0.1, 10), rank(100, 2.5, 0.3, 20)], device_type="cpu")
    assert combined["window_samples_per_second"] == pytest.approx(200 / 2.5)
    assert combined["samples_per_second"] == pytest.approx(200 / 2.5 * 0.9)
    assert combined["audio_seconds_per_second"] == pytest.approx(600 / 2.5 * 0.9)
    assert combined["per_rank_samples_per_second"] == pytest.approx([50.0, 40.0])
    assert combined["data_wait_fraction"] == 0.3 and combined["step_time_median_s"] == 0.25
    assert combined["peak_memory_bytes"] == 30  # ranks on one CPU share its memory
    on_gpus = combine_rank_summaries([rank(100, 2.0, 0.1, 10), rank(100, 2.5, 0.3, 20)], device_type="cuda")
    assert on_gpus["peak_memory_bytes"] == 20  # each GPU has its own: the fullest one counts
    assert on_gpus["worst_case_optimizer_state_held"] is None  # no scan ran
    held = [{**rank(100, 2.0, 0.1, 10), "worst_case_optimizer_state_held": flag} for flag in (True, False)]
    assert combine_rank_summaries(held, device_type="cuda")["worst_case_optimizer_state_held"] is False  # every rank


@pytest.mark.slow
def test_a_real_model_trains_data_parallel_with_accumulation(tmp_path, tiny_corpus):
    """CAM++ (its loss calls submodules of a ModuleDict) through DDP on 2 gloo ranks, 2 micro-batches per step."""
    data_file = yamlio.write_json(tmp_path / "data.json", load_source(tiny_corpus).to_dict())
    spec = TrialSpec(
        workload="cam++",
        workload_options={"crop_s": 0.5},
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=2, world_size=2, grad_accum_steps=2, intra_op_threads=1),
        timing=TimingSettings(warmup_steps=2, window_s=0.5, min_window_steps=4),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
        collective_timeout_s=120,
    )
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=240)
    assert result.status == "ok", result.log_tail
    assert result.window_steps % 2 == 0  # the window ends on an optimiser step
    assert result.epoch_accounting["samples_per_epoch"] == 12  # 12 utterances, 6 per rank, 3 batches of 2 each


def test_ranks_join_nccl_on_gpus_and_gloo_on_a_cpu(monkeypatch):
    """The GPU path at its boundary: NCCL, bound to the rank's own device, with the trial's timeout."""
    import torch

    from autotune.trial import distributed

    calls: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    rank = distributed.RankInfo(rank=1, world_size=4, local_rank=1)
    distributed.start(rank, torch.device("cuda", 1), timeout_s=90)
    distributed.start(rank, torch.device("cpu"), timeout_s=90)
    distributed.start(distributed.RankInfo(), torch.device("cpu"), timeout_s=90)  # one rank: no process group
    (nccl, nccl_kw), (gloo, gloo_kw) = calls
    assert nccl == "nccl" and nccl_kw["device_id"] == torch.device("cuda", 1) and nccl_kw["rank"] == 1
    assert gloo == "gloo" and "device_id" not in gloo_kw and gloo_kw["world_size"] == 4
    assert nccl_kw["timeout"].total_seconds() == 90


def test_rank_environment_follows_torchruns_contract(tmp_path, monkeypatch):
    import sys

    from autotune.trial.launch import child_environment

    monkeypatch.setattr(sys.modules["autotune.trial.launch"], "available_cores", lambda: 8)
    spec = TrialSpec(**_spec_fields(tmp_path), config=TrialConfig(per_device_batch_size=5, world_size=4))
    env = child_environment(spec, rank=3, port=29611)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "3", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29611")
    assert env["OMP_NUM_THREADS"] == "2"  # 8 cores shared by 4 ranks on a CPU


def test_gpu_ranks_get_torchruns_thread_default_unless_the_user_set_one(tmp_path, monkeypatch):
    from autotune.trial.launch import child_environment

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fields = {**_spec_fields(tmp_path), "device_type": "cuda"}
    ranks = TrialSpec(**fields, config=TrialConfig(per_device_batch_size=5, world_size=4))
    assert child_environment(ranks, rank=0, port=29611)["OMP_NUM_THREADS"] == "1"  # torch.distributed.run's default
    one = TrialSpec(**fields, config=TrialConfig(per_device_batch_size=5))
    assert "OMP_NUM_THREADS" not in child_environment(one)  # one process, as `python train.py` runs it
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert child_environment(ranks, rank=0, port=29611)["OMP_NUM_THREADS"] == "6"  # the user's, as torchrun keeps it


def _spec_fields(tmp_path: Path) -> dict[str, object]:
    return {
        "workload": FAULTY,
        "workload_options": {},
        "data_file": str(tmp_path / "data.json"),
        "timing": TIMING,
        "device_type": "cpu",
        "result_path": str(tmp_path / "result.json"),
    }


def test_the_rank_that_failed_first_is_the_cause_not_the_peers_it_knocked_out(tmp_path):
    from autotune.trial.launch import _Ranks

    class Running:
        returncode = None

        def poll(self) -> None:
            return None

    spec = TrialSpec(**_spec_fields(tmp_path), config=TrialConfig(per_device_batch_size=5, world_size=3))
    ranks = _Ranks(processes=[Running(), Running(), Running()], spec=spec, logs=[])  # type: ignore[list-item]
    assert ranks.failed_rank() is None
    failures = {0: ("error", 2_000), 2: ("oom", 1_000), 1: ("ok", 500)}  # rank 2 failed first; rank 0 lost its peer
    for rank, (status, written_ns) in failures.items():
        path = tmp_path / ("result.json" if rank == 0 else f"result.json.rank{rank}")
        yamlio.write_json(path, {"status": status})
        os.utime(path, ns=(written_ns, written_ns))
    assert ranks.failed_rank() == 2


@pytest.mark.slow
@NEEDS_INDUCTOR
def test_two_ranks_compile_under_ddp_and_agree_on_their_steps(tmp_path, tiny_corpus):
    """torch.compile inside DDP on gloo: each rank compiles its network, the compiling steps stay out of the shared
    window on both, and the ranks still run the same number of steps (a rank that counted differently would hang
    in the all-reduce until the collective timeout)."""
    result = launch(_spec(tmp_path, tiny_corpus, 5, compile="dynamic"), workdir=tmp_path / "trial", timeout_s=300)
    assert result.status == "ok", result.log_tail
    assert result.world_size == 2 and result.compile_s is not None and result.compile_s > 0.2
    assert result.window_steps >= 4 and result.samples_per_second < result.window_samples_per_second
