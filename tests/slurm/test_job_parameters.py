"""What a trial asks of SLURM, and how a job the scheduler ended is classified (no cluster needed)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cli.parsing import parse_slurm_options
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.slurm import JobState, SlurmSettings, classify, job_parameters, same_trial

SPEC = TrialSpec(
    workload="cam++",
    workload_options={},
    data_file="data.json",
    config=TrialConfig(per_device_batch_size=64, num_workers=4, world_size=8),
    timing=TimingSettings(),
    device_type="cuda",
    result_path="/shared/run/trial-0007/result.json",
)


def test_a_cuda_trial_asks_for_its_gpus_cpus_and_a_whole_node() -> None:
    parameters = job_parameters(SPEC, 300.0, SlurmSettings(partition="gpu"))
    assert parameters["nodes"] == 1 and parameters["ntasks_per_node"] == 1  # trial.launch starts the ranks
    assert parameters["gpus_per_node"] == 8 and parameters["cpus_per_task"] == 8 * (1 + 4)
    assert parameters["exclusive"] is True and parameters["partition"] == "gpu"
    assert parameters["time"] == 7  # 300 s of trial, 60 s to start, 30 s of warning, in whole minutes
    assert parameters["job_name"] == "autotune-trial-0007"


def test_trial_jobs_are_not_requeued_by_slurm(tmp_path) -> None:
    # autotune measures a trial that lost its node again itself; submitit's own sbatch script says so to SLURM.
    pytest.importorskip("submitit")
    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(command="true", folder=tmp_path, **job_parameters(SPEC, 300.0, SlurmSettings()))
    assert "#SBATCH --no-requeue\n" in script and "#SBATCH --exclusive\n" in script


def test_a_recorded_job_measures_the_same_trial_whatever_its_paths_and_timing() -> None:
    moved = dataclasses.replace(
        SPEC, data_file="/shared/run2/data.json", result_path="/x/result.json", timing=TimingSettings(window_s=9.0)
    )
    assert same_trial(SPEC.to_dict(), moved)
    other = dataclasses.replace(SPEC, config=TrialConfig(per_device_batch_size=32, num_workers=4, world_size=8))
    assert not same_trial(SPEC.to_dict(), other)
    assert not same_trial(SPEC.to_dict(), dataclasses.replace(SPEC, workload_options={"crop_s": 2.0}))
    assert not same_trial({}, SPEC)


def test_a_cpu_trial_asks_for_no_gpu_and_options_override() -> None:
    cpu = dataclasses.replace(SPEC, device_type="cpu", config=TrialConfig(per_device_batch_size=2))
    options = parse_slurm_options(
        [
            "exclusive=false",
            "mem=64G",
            "cpus-per-task=16",
            "time=20",
            "setup=module load cuda",
            "srun_args=--mpi=none -l",
        ]
    )
    parameters = job_parameters(cpu, 30.0, SlurmSettings(options=options))
    assert "gpus_per_node" not in parameters and "exclusive" not in parameters and "partition" not in parameters
    assert (parameters["mem"], parameters["cpus_per_task"], parameters["time"]) == ("64G", 16, 20)
    assert parameters["setup"] == ["module load cuda"] and parameters["srun_args"] == ["--mpi=none", "-l"]


@pytest.mark.parametrize(
    ("state", "status", "words"),
    [
        (JobState("TIMEOUT", "TimeLimit", "0:15", "node1"), "timeout", "SLURM job 12 on node1 reached its time limit"),
        (JobState("OUT_OF_MEMORY", nodes="node2"), "oom", "killed for exceeding its memory"),
        (JobState("NODE_FAIL", "NodeDown", nodes="node2"), "signal", "on node2 lost its node mid-trial (NodeDown)"),
        (JobState("PREEMPTED"), "signal", "SLURM job 12 was preempted mid-trial"),
        (JobState("CANCELLED", "None", "0:15", "node1"), "signal", "was cancelled mid-trial"),
        (JobState("FAILED", "NonZeroExitCode", "1:0"), "error", "ended FAILED with exit code 1:0 and no result"),
    ],
    ids=["timeout", "oom", "node-fail", "preempted", "cancelled", "failed"],
)
def test_a_job_the_scheduler_ended_is_classified(state: JobState, status: str, words: str) -> None:
    assert state.final
    found, reason = classify("12", state)
    assert found == status and words in reason and "\n" not in reason


@pytest.mark.parametrize(
    ("states", "jobs", "status"),
    [
        (["NODE_FAIL", "COMPLETED"], 2, "ok"),  # measured again, on a node that is up
        (["NODE_FAIL", "NODE_FAIL"], 2, "signal"),  # twice: it may be what takes nodes down
        (["PREEMPTED", "COMPLETED"], 2, "ok"),
        (["CANCELLED"], 1, "signal"),  # someone ended it on purpose: not measured again
        (["OUT_OF_MEMORY"], 1, "oom"),  # the configuration's own doing
    ],
    ids=["lost-once", "lost-twice", "preempted", "cancelled", "oom"],
)
def test_a_trial_whose_node_is_lost_is_measured_once_more(states, jobs, status, tmp_path, monkeypatch) -> None:
    # The rule alone, jobs and their ends stood in for (the real thing: test_executor.py kills a node mid-trial).
    from autotune.trial import slurm

    submitted: list[str] = []

    class Job:
        def __init__(self, job_id: str) -> None:
            self.job_id = job_id

    def submit(self, spec, workdir, timeout_s, node=None):
        submitted.append(str(40 + len(submitted)))
        return Job(submitted[-1])

    def wait(self, job, spec, workdir, should_prune, pinned_until):
        state = JobState(states[len(submitted) - 1], nodes=f"node{len(submitted)}")
        if state.state == "COMPLETED":
            return slurm.TrialResult(status="ok", samples_per_second=10.0), None
        ended, reason = classify(job.job_id, state)
        return slurm.TrialResult(status=ended, reason=reason), state

    monkeypatch.setattr(slurm.SlurmLauncher, "_submit", submit)
    monkeypatch.setattr(slurm.SlurmLauncher, "_wait", wait)
    result = slurm.SlurmLauncher()(SPEC, workdir=tmp_path / "trial", timeout_s=60)
    assert len(submitted) == jobs and result.status == status
    if states == ["NODE_FAIL", "NODE_FAIL"]:
        assert "SLURM job 41 on node2 lost its node" in result.reason and "earlier job 40 had lost its node too" in (
            result.reason
        )


def test_a_node_unlike_the_study_s_measures_nothing_and_says_why(tmp_path, monkeypatch) -> None:
    """run_on_node as the job runs it, on this machine: a study fingerprint that is not this node's is an error result
    naming the node and both fingerprints, written where the controller reads it, and no trial is launched."""
    pytest.importorskip("submitit")
    from autotune import yamlio
    from autotune.machine.hardware import probe
    from autotune.trial import slurm_on_node

    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setattr(slurm_on_node, "launch", lambda *args, **kwargs: pytest.fail("a trial was launched"))
    spec = dataclasses.replace(SPEC, device_type="cpu", result_path=str(tmp_path / "result.json"))
    data = slurm_on_node.run_on_node(spec.to_dict(), str(tmp_path), 60.0, fingerprint="a100-x8-0123456789")
    own = probe("cpu").fingerprint()
    assert data["status"] == "error" and data["node"] == "node7"
    assert f"node node7's hardware fingerprint {own} is not the study's a100-x8-0123456789" in data["reason"]
    assert yamlio.read_json(slurm_on_node.result_file(tmp_path, "41")) == data
