"""autotune itself (the controller) SIGKILLed while a trial runs as a SLURM job, and the same command run again: the
study resumes, the job that outlived its controller is re-attached to rather than measured again, and no trial is
lost or counted twice (docs/reliability.md, docs/cluster.md)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune import yamlio
from autotune.cli import app
from autotune.trial.slurm import JOB_FILE, read_state
from autotune.trial.slurm_on_node import result_file
from tests.fixtures.runs import all_trials, run_args, start, wait_for
from tests.fixtures.slurm import PARTITION

pytestmark = pytest.mark.slow


def _job_names(cluster) -> dict[str, str]:
    """job id -> job name, for every job the controller knows (MinJobAge keeps finished ones)."""
    names = {}
    for line in cluster.command("scontrol", "show", "jobs", "--oneliner").splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "JobId" in fields:
            names[fields["JobId"]] = fields.get("JobName", "")
    return names


def test_a_killed_controller_s_job_is_re_attached_by_the_rerun(slurm_cluster, tiny_corpus, tmp_path: Path) -> None:
    url = f"journal://{tmp_path / 'study.log'}"
    args = run_args(tiny_corpus, tmp_path / "results", "--trials", "3", "--storage", url, "--no-amp-check")
    args += ["--no-ceiling", "--max-throughput-cv", "0", "--executor", "slurm", "--slurm-partition", PARTITION]
    known = set(_job_names(slurm_cluster))
    controller = start(args, tmp_path / "first.log")
    seen: dict[str, str] = {}

    def second_trial_s_job_running() -> bool:
        trials = {t.number: t for t in all_trials(url)} if (tmp_path / "study.log").exists() else {}
        if 1 not in trials or trials[1].state != TrialState.RUNNING or "folder" not in trials[1].user_attrs:
            return False
        folder = Path(trials[1].user_attrs["folder"])
        if not (folder / JOB_FILE).exists():
            return False
        job_id = str(yamlio.read_json(folder / JOB_FILE)["job_id"])
        state = read_state(job_id)
        seen.update(job=job_id, folder=str(folder))
        return state is not None and state.state == "RUNNING" and not result_file(folder, job_id).exists()

    try:
        wait_for(second_trial_s_job_running, "trial 1's SLURM job to run", timeout_s=240)
    finally:
        controller.send_signal(signal.SIGKILL)  # the job lives on: it is the cluster's, not the controller's child
        controller.wait()

    result = CliRunner().invoke(app, args)  # the same command again
    assert result.exit_code == 0, (result.output, (tmp_path / "first.log").read_text(), slurm_cluster.logs())
    trials = {t.number: t for t in all_trials(url)}
    assert trials[0].state == TrialState.COMPLETE and trials[1].state == TrialState.FAIL
    retries = [t for t in trials.values() if t.user_attrs.get("retry_of") == 1]
    assert len(retries) == 1, trials
    retry = retries[0]
    assert retry.state == TrialState.COMPLETE and retry.params == trials[1].params
    assert retry.user_attrs["folder"] == seen["folder"]  # measured where the dead run's trial was: its job's result
    assert not [t for t in trials.values() if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # the first run's two trials; the rerun's baseline, the collected retry and the study's best re-measured first
    assert len(trials) == 5 and sum(t.state == TrialState.COMPLETE for t in trials.values()) == 4

    new_jobs = {job: name for job, name in _job_names(slurm_cluster).items() if job not in known}
    assert list(new_jobs.values()).count("autotune-trial-0001") == 1, new_jobs  # never submitted again
    assert len(new_jobs) == 4, new_jobs  # trials 0 and 1, the rerun's baseline and its warm start: one job each
    assert read_state(seen["job"]).state == "COMPLETED"  # the orphan ran to its end; its result was collected
