"""--nodes M checked before any trial: a multi-node trial is a SLURM job of M nodes (trial/multinode.py runs it).

Each refusal is one line (UserError, exit 2) and comes before anything is created: --nodes below 1, --nodes without
--executor slurm (autotune's own launcher starts the ranks of one machine only), more nodes than the partition has
(the job would wait in the queue for ever), and --parallel trials of M nodes each that the partition cannot hold at
once (they would only queue while the budget runs).
"""

from __future__ import annotations

from autotune.errors import UserError
from autotune.trial.slurm import SlurmSettings
from autotune.trial.slurm_state import slurm_command

__all__ = ["check_nodes", "check_parallel", "partition_nodes"]


def partition_nodes(settings: SlurmSettings) -> int | None:
    """The nodes of the partition trials go to (sinfo; the default partition where none is named), None where sinfo
    does not say."""
    partition = settings.partition or settings.options.get("partition")
    done = slurm_command("sinfo", "--noheader", "--format=%D", *(["--partition", str(partition)] if partition else []))
    counts = [int(word) for word in done.stdout.split() if word.isdigit()] if done.returncode == 0 else []
    return sum(counts) if counts else None


def check_parallel(settings: SlurmSettings, parallel: int) -> None:
    """--parallel N: at most as many trials in flight as the partition has nodes (each trial takes a node to itself;
    more would only wait in the queue while their budget runs). Raises UserError with one line."""
    available = partition_nodes(settings) if parallel > 1 else None
    if available is not None and parallel > available:
        partition = settings.partition or settings.options.get("partition")
        where = f"partition {partition}" if partition else "the default partition"
        raise UserError(
            f"--parallel {parallel}: {where} has {available} node(s) and each trial takes one to itself; "
            f"use --parallel {available} or less"
        )


def check_nodes(settings: SlurmSettings | None, nodes: int, parallel: int = 1) -> None:
    """Raises UserError with one line where --nodes cannot run as asked (this module's docstring)."""
    if nodes < 1:
        raise UserError(f"--nodes must be at least 1, got {nodes}")
    if nodes == 1:
        return
    if settings is None:
        raise UserError(
            f"--nodes {nodes} needs --executor slurm: a multi-node trial is a SLURM job across {nodes} nodes "
            "(without it every trial runs on this machine; use --devices for its GPUs)"
        )
    available = partition_nodes(settings)
    if available is None:
        return  # sinfo said nothing countable: the scheduler refuses the job if it cannot be run (a trial's error)
    partition = settings.partition or settings.options.get("partition")
    where = f"partition {partition}" if partition else "the default partition"
    if nodes > available:
        raise UserError(f"--nodes {nodes}: {where} has {available} node(s); use --nodes {available} or less")
    if parallel * nodes > available:
        raise UserError(
            f"--parallel {parallel} x --nodes {nodes}: {where} has {available} node(s), not the {parallel * nodes} "
            f"that many trials at once take; use --parallel {max(1, available // nodes)} or less"
        )
