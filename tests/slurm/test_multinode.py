"""Multi-node trials on the two-node test cluster (--nodes 2): torchrun on both nodes, gloo across them, the ranks'
hosts and the global batch recorded, one rank killed on one node classified as on one node (trial/multinode.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import load_config, workloads, yamlio
from autotune.cli import app
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.slurm import SlurmLauncher, SlurmSettings
from tests.fixtures.runs import error_line, run_args
from tests.fixtures.slurm import NODES, PARTITION


def _spec(tmp_path: Path, corpus: Path, *, devices: int = 1, window_s: float = 0.01, steps: int = 1) -> TrialSpec:
    data = workloads.get("cam++").load_data(str(corpus))
    return TrialSpec(
        workload="cam++",
        workload_options={"crop_s": 0.5},
        data_file=str(yamlio.write_json(tmp_path / "data.json", data.to_dict())),
        config=TrialConfig(per_device_batch_size=2, world_size=2 * devices, grad_accum_steps=2, intra_op_threads=1),
        timing=TimingSettings(
            warmup_steps=1, window_s=window_s, min_window_steps=steps, max_window_steps=steps, min_timed_share=0
        ),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
        nodes=2,
    )


def _launcher() -> SlurmLauncher:
    return SlurmLauncher(settings=SlurmSettings(partition=PARTITION), poll_s=0.2)


@pytest.mark.slow
@pytest.mark.parametrize("devices", (1, 2), ids=("1-per-node", "2-per-node"))
def test_a_cam_plus_plus_trial_spans_both_nodes(slurm_cluster, devices: int, tiny_corpus: Path, tmp_path: Path) -> None:
    spec = _spec(tmp_path, tiny_corpus, devices=devices)
    result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=150)
    assert result.status == "ok", (result.reason, result.log_tail, slurm_cluster.logs())
    assert result.world_size == 2 * devices and result.nodes == 2
    assert sorted(result.hosts or []) == sorted(NODES * devices)  # `devices` ranks on each emulated node
    assert result.interconnect["backend"] == "gloo" and result.interconnect["rendezvous"] == "c10d (torchrun)"
    assert result.interconnect["gloo_interface"]  # the interface gloo's device sits on (loopback here)
    assert spec.config.global_batch_size == 2 * devices * 2 * 2  # per device x devices x nodes x accumulation
    # One process group across the nodes: the epoch split over both ranks, each rank's rate over the shared window.
    accounting = result.epoch_accounting or {}
    assert accounting["world_size"] == 2 * devices and len(accounting["batches_per_epoch_per_rank"]) == 2 * devices
    assert accounting["samples_per_epoch"] == 2 * sum(accounting["batches_per_epoch_per_rank"])  # whole batches of 2
    rates = result.per_rank_samples_per_second or []
    assert len(rates) == 2 * devices and min(rates) > 0
    assert result.window_samples_per_second == pytest.approx(sum(rates), rel=0.1)
    script = next((tmp_path / "trial" / "slurm").glob("*_submission.sh")).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert (tmp_path / "trial" / "trial.node1.log").exists()  # the second node's torchrun logged on the shared folder


def _kill_a_rank_on(node: str, after: Path, stop: threading.Event) -> list[int]:
    """SIGKILL the trial's rank on `node` once the trial is in its window (its progress file exists)."""
    killed: list[int] = []
    while not stop.is_set() and not killed:
        if after.exists():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                with contextlib.suppress(OSError):
                    environ = (entry / "environ").read_bytes()
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    is_rank = b"autotune.trial" in argv and b"autotune.trial.torchrun_agent" not in argv
                    on_node = f"SLURMD_NODENAME={node}\0".encode() in environ
                    if is_rank and on_node and b"TORCHELASTIC_RUN_ID=" in environ:
                        os.kill(int(entry.name), signal.SIGKILL)
                        killed.append(int(entry.name))
        time.sleep(0.1)
    return killed


@pytest.mark.slow
def test_a_rank_killed_on_one_node_fails_the_trial_as_on_one_node(
    slurm_cluster, tiny_corpus: Path, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, tiny_corpus, window_s=30.0, steps=10_000)  # long enough to be killed in
    stop, killed = threading.Event(), []
    killer = threading.Thread(
        target=lambda: killed.extend(_kill_a_rank_on(NODES[1], Path(spec.result_path + ".progress"), stop))
    )
    killer.start()
    try:
        result = _launcher()(spec, workdir=tmp_path / "trial", timeout_s=150)
    finally:
        stop.set()
        killer.join()
    assert killed, "no rank found on node2"
    assert result.status == "signal", (result.reason, result.log_tail)
    assert "of 2: killed by SIGKILL" in result.reason and f"(on node {NODES[1]})" in result.reason
    assert result.wall_s is not None and result.wall_s < 100  # failed at once, not after a collective's timeout


# `autotune run --nodes` as a person meets it: bad input is one line and exit code 2 before anything is written; a
# short run on the test cluster writes a result that says it spanned two nodes.
SLURM = ["--executor", "slurm", "--slurm-partition", PARTITION, "--no-amp-check", "--no-ceiling"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--nodes", "2"], "--nodes 2 needs --executor slurm"),
        (["--nodes", "0"], "--nodes must be at least 1, got 0"),
        (["--nodes", "0", *SLURM], "--nodes must be at least 1, got 0"),
    ],
    ids=["without-slurm", "zero", "zero-with-slurm"],
)
def test_bad_nodes_input_is_one_line_and_exit_2(extra, words, tiny_corpus: Path, tmp_path: Path) -> None:
    assert words in error_line(run_args(tiny_corpus, tmp_path / "results", *extra))
    assert not (tmp_path / "results").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--nodes", "3"], f"--nodes 3: partition {PARTITION} has 2 node(s); use --nodes 2 or less"),
        (["--nodes", "2", "--parallel", "2"], "--parallel 2 x --nodes 2: partition tests has 2 node(s), not the 4"),
    ],
    ids=["above-the-partition", "parallel-times-nodes"],
)
def test_more_nodes_than_the_partition_has_is_refused(slurm_cluster, extra, words, tiny_corpus, tmp_path) -> None:
    assert words in error_line(run_args(tiny_corpus, tmp_path / "results", *SLURM, *extra))
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_run_across_two_nodes_records_them(slurm_cluster, tiny_corpus: Path, tmp_path: Path) -> None:
    args = [*SLURM, "--nodes", "2", "--devices", "1", "--trials", "1", "--confirm", "0", "--max-throughput-cv", "0"]
    result = CliRunner().invoke(app, run_args(tiny_corpus, tmp_path / "results", *args))
    assert result.exit_code == 0, (result.output, slurm_cluster.logs())
    said = " ".join(result.output.split())  # the console wraps its lines
    assert "data-parallel on 2 processes (gloo) across 2 nodes (torchrun on each)" in said
    (path,) = (tmp_path / "results").glob("*/*-nodes2.yaml")  # its own file: never a one-node result's
    tuned = load_config(path)
    cluster, config = tuned.cluster, tuned.config
    assert cluster["nodes"] == 2 and cluster["devices_per_node"] == 1 and config.world_size == 2
    assert cluster["global_batch_size"] == config.per_device_batch_size * 1 * 2 * config.grad_accum_steps
    assert sorted(cluster["hosts"]) == sorted(NODES) and cluster["interconnect"]["backend"] == "gloo"
    assert tuned.search["study_name"].endswith("-ws2-nodes2")  # its own study: not compared with one node's
    exported = CliRunner().invoke(app, ["export", str(path), "--to", "lightning"])
    assert exported.exit_code == 0 and "num_nodes=2" in exported.output and "devices=1" in exported.output
