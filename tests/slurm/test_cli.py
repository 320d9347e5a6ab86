"""`autotune run --executor slurm` as a person meets it: bad input is one line and exit code 2 before any trial; a
short run on the test cluster runs its trials as SLURM jobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from tests.fixtures.runs import error_line, run_args, wait_for
from tests.fixtures.slurm import PARTITION

runner = CliRunner()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--executor", "kubernetes"], "--executor 'kubernetes': unknown; use one of local, slurm"),
        (["--slurm-partition", "gpu"], "--slurm-partition apply to SLURM trials only; add --executor slurm"),
        (["--executor", "slurm", "--slurm-option", "mem"], "--slurm-option 'mem' is not KEY=VALUE"),
        (["--slurm-pin-wait", "3m"], "--slurm-pin-wait apply to SLURM trials only; add --executor slurm"),
        (["--executor", "slurm", "--slurm-pin-wait", "soon"], "--slurm-pin-wait: cannot read duration 'soon'"),
    ],
    ids=["unknown-executor", "slurm-option-without-slurm", "option-form", "pin-wait-without-slurm", "pin-wait-form"],
)
def test_bad_executor_input_is_one_line_and_exit_2(extra, words, tiny_corpus: Path, tmp_path: Path) -> None:
    assert words in error_line(run_args(tiny_corpus, tmp_path / "results", *extra))
    assert not (tmp_path / "results").exists()  # refused before anything was written


def test_slurm_without_its_commands_is_refused(tiny_corpus: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, scontrol, scancel or sinfo
    line = error_line(run_args(tiny_corpus, tmp_path / "results", "--executor", "slurm"))
    assert "sbatch, scontrol, scancel, sinfo not found on PATH" in line and "--executor local" in line


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--slurm-partition", "nope"], "--slurm-partition nope: no such partition on this cluster"),
        (["--slurm-option", "memory=4G"], "--slurm-option memory: not a parameter submitit passes to sbatch"),
    ],
    ids=["partition", "option-key"],
)
def test_the_cluster_checks_the_partition_and_options(slurm_cluster, extra, words, tiny_corpus, tmp_path) -> None:
    assert words in error_line(run_args(tiny_corpus, tmp_path / "results", "--executor", "slurm", *extra))


@pytest.mark.slow
def test_a_run_submits_its_trials_as_slurm_jobs(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    before = _autotune_jobs(slurm_cluster)
    args = ["--trials", "2", "--no-amp-check", "--executor", "slurm", "--slurm-partition", PARTITION]
    args += ["--max-throughput-cv", "0"]  # the erratic gate has its own tests; other jobs load this machine
    out = tmp_path / "best.yaml"
    result = runner.invoke(app, [*run_args(tiny_corpus, tmp_path / "results", *args), "--out", str(out)])
    assert result.exit_code == 0, (result.output, slurm_cluster.logs())
    tuned = load_config(out)
    assert tuned.metrics["winner"]["samples_per_second"] > 0 and tuned.metrics["compute"]["pipeline_efficiency"] > 0
    assert tuned.search["executor"] == {"name": "slurm", "partition": PARTITION, "options": {}}
    # A run ends when it has read its last result; its job is still exiting (the interpreter, SLURM's epilog) then.
    busy = ("JobState=RUNNING", "JobState=COMPLETING")
    wait_for(lambda: not any(s in job for job in _autotune_jobs(slurm_cluster) for s in busy), "jobs to end", 60)
    jobs = _autotune_jobs(slurm_cluster) - before
    assert len(jobs) == 3, jobs  # the baseline, one search trial and the compute-only ceiling, each a job
    assert all("JobState=COMPLETED" in job for job in jobs), jobs


def _autotune_jobs(cluster) -> set[str]:
    lines = cluster.command("scontrol", "show", "jobs", "--oneliner").splitlines()
    return {line for line in lines if "JobName=autotune-" in line}
