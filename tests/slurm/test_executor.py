"""Trials through the SLURM executor on a real (test) cluster: a built-in model's trial, a job cancelled mid-trial,
a job killed for its time limit."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from autotune import workloads, yamlio
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.slurm import JOB_FILE, SlurmLauncher, SlurmSettings, read_state
from tests.fixtures import slurm
from tests.fixtures.slurm import PARTITION
from tests.trial.tiny_setups import faulty_spec

pytestmark = pytest.mark.slow


def _launcher(**options: object) -> SlurmLauncher:
    return SlurmLauncher(settings=SlurmSettings(partition=PARTITION, options=dict(options)), poll_s=0.2)


def test_a_cam_plus_plus_trial_runs_as_a_slurm_job(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    data = workloads.get("cam++").load_data(str(tiny_corpus))
    spec = TrialSpec(
        workload="cam++",
        workload_options={"crop_s": 0.5},
        data_file=str(yamlio.write_json(tmp_path / "data.json", data.to_dict())),
        config=TrialConfig(per_device_batch_size=2),
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=1, max_window_steps=1),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
    result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.samples_per_second > 0 and result.window_steps == 1 and result.all_losses_finite
    assert result.wall_s and result.wall_s > 0
    jobs = list((tmp_path / "trial" / "slurm").glob("*_submission.sh"))
    assert len(jobs) == 1  # one sbatch script, as submitit wrote it
    script = jobs[0].read_text()
    assert "#SBATCH --exclusive" in script and "#SBATCH --nodes=1" in script and "--time=4" in script
    assert (tmp_path / "trial" / "trial.log").exists()  # the trial's log came back on the shared file system


def test_a_failing_trial_keeps_its_own_status(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    result = _launcher()(faulty_spec(tmp_path, tiny_corpus, 2), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "nonfinite", result.log_tail


def test_a_job_cancelled_mid_trial_is_classified(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    spec = faulty_spec(tmp_path, tiny_corpus, 3)  # hangs in its first step

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            scripts = list((tmp_path / "trial" / "slurm").glob("*_submission.sh"))
            job_id = scripts[0].name.split("_")[0] if scripts else None
            state = read_state(job_id) if job_id else None
            if state and state.state == "RUNNING" and (tmp_path / "trial" / "trial.log").exists():
                slurm_cluster.command("scancel", job_id)
                return
            time.sleep(0.2)

    canceller = threading.Thread(target=cancel_when_running)
    canceller.start()
    result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=120)
    canceller.join()
    assert result.status == "signal", (result.reason, slurm_cluster.logs())
    assert "was cancelled mid-trial" in result.reason and "on node" in result.reason and "SIGTERM" in result.reason
    assert "\n" not in result.reason


def test_a_job_past_its_time_limit_is_a_timeout(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    # The trial's own timeout (600 s) is far off; the job's one-minute limit comes first. submitit asks SLURM for a
    # warning signal before the limit (30 s by default; 50 s here: due 10 s in, sent at slurmctld's next time-limit
    # check, every 30 s), which stops the trial; its result says so.
    spec = faulty_spec(tmp_path, tiny_corpus, 3)
    started = time.monotonic()
    result = _launcher(time=1, signal_delay_s=50)(spec, workdir=tmp_path / "trial", timeout_s=600)
    assert result.status == "timeout", (result.reason, result.log_tail)
    assert "time limit" in result.reason and "--slurm-option time=" in result.reason
    assert time.monotonic() - started < 45


def test_a_hopeless_trial_is_pruned_from_its_progress_on_the_shared_folder(slurm_cluster, tiny_corpus, tmp_path):
    seen: list[dict] = []

    def should_prune(progress: dict) -> str | None:
        seen.append(progress)
        return "too slow" if progress["phase"] == "warmup" else None

    spec = faulty_spec(tmp_path, tiny_corpus, 7)  # trains, 0.3 s a step
    result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=120, should_prune=should_prune)
    assert result.status == "pruned" and result.reason == "too slow"
    assert seen and seen[-1]["samples_per_second"] > 0
    job_id = next((tmp_path / "trial" / "slurm").glob("*_submission.sh")).name.split("_")[0]
    deadline = time.monotonic() + 15
    while (state := read_state(job_id)) is not None and not state.final and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state is not None and state.state == "CANCELLED"  # the job was taken down with the trial


def test_a_job_that_ends_without_a_result_is_an_error_with_its_log(slurm_cluster, tiny_corpus, tmp_path) -> None:
    # The job script fails before the trial starts (a site's module load that fails, say): no result file.
    launcher = _launcher(setup="echo 'module: cuda/99 not found' >&2; exit 3")
    result = launcher(faulty_spec(tmp_path, tiny_corpus, 5), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "error", (result.reason, result.log_tail)
    assert "ended FAILED with exit code 3:0 and no result" in result.reason and "\n" not in result.reason
    assert "module: cuda/99 not found" in result.log_tail


def test_a_trial_whose_node_dies_is_measured_again_on_another_node(slurm_cluster, tiny_corpus, tmp_path) -> None:
    # The node running the trial dies mid-window (its slurmd, slurmstepd and ranks killed, the controller told it is
    # down): the job ends NODE_FAIL, which says nothing of the configuration, so the trial runs again in a new job,
    # on the node left. SLURM's own requeue (two minutes later, over the same files) is off for trial jobs.
    timing = TimingSettings(warmup_steps=1, window_s=3.0, min_window_steps=2)
    spec = faulty_spec(tmp_path, tiny_corpus, 7, timing=timing)  # trains, 0.3 s a step
    progress = Path(spec.result_path + ".progress")
    killed: dict[str, str] = {}

    def kill_its_node_mid_trial() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not killed:
            scripts = list((tmp_path / "trial" / "slurm").glob("*_submission.sh"))
            state = read_state(scripts[0].name.split("_")[0]) if scripts else None
            if state and state.state == "RUNNING" and progress.exists():  # the trial is training
                killed.update(node=state.nodes, jobs=",".join(slurm.kill_node(slurm_cluster, state.nodes)))
            time.sleep(0.2)

    killer = threading.Thread(target=kill_its_node_mid_trial)
    killer.start()
    try:
        result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=120)
    finally:
        killer.join()
        if killed:
            slurm.revive_node(slurm_cluster, killed["node"])
    assert killed, "the trial's node was never seen running it"
    assert result.status == "ok" and result.samples_per_second > 0, (result.reason, slurm_cluster.logs())
    jobs = sorted(int(path.name.split("_")[0]) for path in (tmp_path / "trial" / "slurm").glob("*_submission.sh"))
    assert len(jobs) == 2 and killed["jobs"] == str(jobs[0])  # the lost job and the one that measured the trial
    first, second = read_state(str(jobs[0])), read_state(str(jobs[1]))
    assert first.state == "NODE_FAIL" and first.nodes == killed["node"], first
    assert second.state == "COMPLETED" and second.nodes != killed["node"], second
    assert "#SBATCH --no-requeue" in next((tmp_path / "trial" / "slurm").glob(f"{jobs[0]}_submission.sh")).read_text()


def test_a_recorded_job_of_another_trial_is_cancelled_not_re_attached(slurm_cluster, tiny_corpus, tmp_path) -> None:
    # The folder records a job that measures another configuration (a rerun with other settings): it is cancelled,
    # and the trial runs in a job of its own.
    spec = faulty_spec(tmp_path, tiny_corpus, 5)
    other = dataclasses.replace(spec, config=TrialConfig(per_device_batch_size=7))
    stranger = slurm_cluster.command("sbatch", "--parsable", f"--partition={PARTITION}", "--wrap", "sleep 120").strip()
    (tmp_path / "trial").mkdir()
    yamlio.write_json(tmp_path / "trial" / JOB_FILE, {"job_id": stranger, "spec": other.to_dict()})
    result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", (result.reason, result.log_tail)
    assert read_state(stranger).state == "CANCELLED"
    assert yamlio.read_json(tmp_path / "trial" / JOB_FILE)["job_id"] != stranger  # the trial's own job now
