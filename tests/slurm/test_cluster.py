"""The test cluster itself: two nodes (two slurmd on this host) that run jobs, alone and together."""

from __future__ import annotations

from tests.fixtures.slurm import NODES


def test_both_emulated_nodes_run_a_job_together(slurm_cluster) -> None:
    out = slurm_cluster.command("srun", "--nodes=2", "--ntasks-per-node=1", "--label", "printenv", "SLURMD_NODENAME")
    assert sorted(line.split(": ")[1] for line in out.splitlines()) == sorted(NODES)
