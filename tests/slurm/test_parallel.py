"""--parallel N on the test cluster: search trials in flight at once, each a job on a node of its own; bad input is
one line and exit code 2 before any trial; Ctrl-C cancels every job in flight (docs/cluster.md,
autotune/search/in_flight.py).
"""

from __future__ import annotations

import re
import signal
from datetime import datetime
from pathlib import Path

import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune.cli import app
from tests.fixtures.runs import all_trials, error_line, run_args, start, wait_for
from tests.fixtures.slurm import NODES, PARTITION

runner = CliRunner()
SLURM = ["--executor", "slurm", "--slurm-partition", PARTITION, "--no-amp-check", "--no-ceiling"]
SLURM += ["--max-throughput-cv", "0"]  # the erratic gate has its own tests; other jobs load this machine


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--parallel", "2"], "--parallel 2 needs --executor slurm"),
        (["--parallel", "0"], "--parallel must be at least 1 (trials in flight), got 0"),
    ],
    ids=["without-slurm", "zero"],
)
def test_bad_parallel_input_is_one_line_and_exit_2(extra, words, tiny_corpus: Path, tmp_path: Path) -> None:
    assert words in error_line(run_args(tiny_corpus, tmp_path / "results", *extra))
    assert not (tmp_path / "results").exists()  # refused before anything was written


def test_more_trials_in_flight_than_nodes_is_refused(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    line = error_line(run_args(tiny_corpus, tmp_path / "results", *SLURM, "--parallel", "3"))
    assert f"--parallel 3: partition {PARTITION} has 2 node(s)" in line and "--parallel 2 or less" in line
    assert not (tmp_path / "results").exists()


def _jobs(cluster) -> dict[str, dict[str, str]]:
    """job id -> scontrol's fields, for the controller's autotune jobs (MinJobAge keeps finished ones)."""
    jobs = {}
    for line in cluster.command("scontrol", "show", "jobs", "--oneliner").splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("JobName", "").startswith("autotune-"):
            jobs[fields["JobId"]] = fields
    return jobs


@pytest.mark.slow
def test_two_search_trials_run_at_once_on_both_nodes(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    url = f"journal://{tmp_path / 'study.log'}"
    before = set(_jobs(slurm_cluster))
    args = run_args(tiny_corpus, tmp_path / "results", *SLURM, "--parallel", "2", "--trials", "5", "--storage", url)
    result = runner.invoke(app, [*args, "--confirm", "1"])  # the leader measured twice more (the last --confirm)
    assert result.exit_code == 0, (result.output, slurm_cluster.logs())

    trials = all_trials(url)
    assert all(t.state == TrialState.COMPLETE for t in trials), trials
    confirmations = [t for t in trials if t.user_attrs["role"] == "confirm"]
    first = next(t for t in trials if t.params == confirmations[0].params)  # where the leader was first measured
    assert len(confirmations) == 2 and all(t.params == first.params for t in confirmations), confirmations
    assert {t.user_attrs["result"]["node"] for t in confirmations} == {first.user_attrs["result"]["node"]}
    trials = [t for t in trials if t.user_attrs["role"] != "confirm"]
    assert len(trials) == 5, trials  # none counted twice, none lost
    assert [t.user_attrs["role"] for t in trials].count("baseline") == 1
    nodes = [t.user_attrs["result"]["node"] for t in trials]
    assert set(nodes) == set(NODES), nodes  # each result says where it was measured; both nodes were used
    search = sorted((t for t in trials if t.user_attrs["role"] != "baseline"), key=lambda t: t.datetime_start)
    baseline = next(t for t in trials if t.user_attrs["role"] == "baseline")
    assert all(t.datetime_start >= baseline.datetime_complete for t in search)  # the baseline first and alone
    pairs = zip(search, search[1:], strict=False)
    assert any(a.datetime_complete > b.datetime_start for a, b in pairs), search  # two in flight at once

    wait_for(lambda: _all_ended(slurm_cluster, before), "every trial job to end", timeout_s=60)  # COMPLETING
    jobs = {job: fields for job, fields in _jobs(slurm_cluster).items() if job not in before}
    states = {job: fields["JobState"] for job, fields in jobs.items()}
    assert len(jobs) == 7 and set(states.values()) == {"COMPLETED"}, states  # one job a trial
    asked = {f["JobName"]: f.get("ReqNodeList", "") for f in jobs.values()}
    node = first.user_attrs["result"]["node"]
    assert all(asked[f"autotune-trial-{t.number:04d}"] == node for t in confirmations), asked  # pinned, not by luck
    spans = sorted((_time(f["StartTime"]), _time(f["EndTime"]), f["NodeList"]) for f in jobs.values())
    overlapping = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    assert overlapping and all(a[2] != b[2] for a, b in overlapping), spans  # side by side, on different nodes


@pytest.mark.slow
def test_ctrl_c_cancels_every_job_in_flight(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    url = f"journal://{tmp_path / 'study.log'}"
    before = set(_jobs(slurm_cluster))
    args = run_args(tiny_corpus, tmp_path / "results", *SLURM, "--parallel", "2", "--trials", "6", "--storage", url)
    args += ["--window", "20"]  # trials long enough that Ctrl-C finds both jobs running (the last --window counts)
    controller = start(args, tmp_path / "controller.log")

    def two_running() -> bool:
        running = [j for j, f in _jobs(slurm_cluster).items() if j not in before and f["JobState"] == "RUNNING"]
        return len(running) == 2

    try:
        wait_for(two_running, "two trial jobs running at once", timeout_s=240)
    finally:
        controller.send_signal(signal.SIGINT)
        code = controller.wait(timeout=120)
    log = (tmp_path / "controller.log").read_text()
    assert code in (0, 130), log
    running = {j: f for j, f in _jobs(slurm_cluster).items() if j not in before}
    wait_for(lambda: _all_ended(slurm_cluster, before), "every trial job to end", timeout_s=60)
    cancelled = [j for j, f in _jobs(slurm_cluster).items() if j not in before and f["JobState"] == "CANCELLED"]
    assert len(cancelled) >= 2, (running, log)  # both jobs in flight went with the controller
    assert "cancelled 2 trial(s) in flight" in log, log
    assert not [t for t in all_trials(url) if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def _all_ended(cluster, before: set[str]) -> bool:
    ended = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")
    return all(f["JobState"] in ended for j, f in _jobs(cluster).items() if j not in before)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)
