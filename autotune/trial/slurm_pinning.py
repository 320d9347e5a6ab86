"""A trial's job pinned to one node (a leader's confirmation, on the node that first measured it: in_flight.on_node),
and how long it may wait in the queue for that node.

A pinned job waits for its node and for nothing else: while another job holds the node (someone else's, on a shared
partition) it pends, and the run's budget runs. So it waits at most the pin wait (--slurm-pin-wait; default_pin_wait_s
from --budget); then it is cancelled and the trial is submitted again to any node of the partition, and its result's
`asked_node` and `node` say that it ran elsewhere (the result's notes too: in_flight.placement_notes). A node that did
not come free within the wait is not waited for again in this run: it is most likely held by a long job, and each wait
would cost the budget as much again. A node down or drained when the job is submitted is not waited for at all.

Why run elsewhere rather than skip the confirmation: the winner is chosen among the leaders on the medians of their
windows, and a leader's median is compared with the others', which were measured on other nodes too when the search ran
trials side by side. Run elsewhere, a confirmation adds one window from a node of the same hardware fingerprint (the
study's, checked on every node): it moves the leader's median by at most the difference between two like nodes, which
the comparison between leaders first measured on different nodes already carries. Skipped, the leader keeps fewer
windows, at worst the single search window confirmation is there to check (often several per cent off on a noisy
landscape: search/confirmation.py), and one lucky window could crown it. The mixed median is the smaller error, and it
is said.
"""

from __future__ import annotations

import logging

from autotune.trial.slurm_state import slurm_command

__all__ = ["PIN_WAIT_SHARE", "NodeNotFree", "available", "default_pin_wait_s", "pinned_node"]

logger = logging.getLogger(__name__)
# A pinned job's queue wait: PIN_WAIT_SHARE of --budget, within [PIN_WAIT_MIN_S, PIN_WAIT_MAX_S]. At least one
# scheduling cycle of a busy controller (the main scheduler runs at least every sched_interval, 60 s by default; the
# backfill scheduler every bf_interval, 30 s): a job that can start on its free node does so within that. Each wait
# that runs out costs its share once per node (the node is not waited for again), so three leaders on three nodes held
# by other jobs cost at most 9% of the budget. At most ten minutes: a node still held then is held by a long job
# (cluster jobs run for hours), which a longer wait rarely outlasts. Without --budget: that most.
PIN_WAIT_SHARE = 0.03
PIN_WAIT_MIN_S = 60.0
PIN_WAIT_MAX_S = 600.0


class NodeNotFree(Exception):
    """A pinned job pended past its wait and was cancelled (SlurmLauncher then submits the trial to any node)."""


def default_pin_wait_s(budget_s: float | None) -> float:
    """How long a pinned job may wait in the queue for its node by default (the constants above say why)."""
    if budget_s is None:
        return PIN_WAIT_MAX_S
    return min(PIN_WAIT_MAX_S, max(PIN_WAIT_MIN_S, PIN_WAIT_SHARE * budget_s))


def available(node: str) -> bool:
    """Whether the controller can give a job this node soon: up and answering, not drained or down (a job asking for
    a node that is not would wait for it without end). sinfo's short states: `idle*` is not answering."""
    done = slurm_command("sinfo", "--noheader", "--nodes", node, "--format=%t")
    states = done.stdout.split() if done.returncode == 0 else []
    return bool(states) and all(state.rstrip("~#%$@^-") in ("idle", "mix", "alloc", "comp") for state in states)


def pinned_node(node: str | None, not_free: set[str], trial: str) -> str | None:
    """The node a trial's job asks for: `node` where it is available and has not already failed to come free within
    the pin wait in this run; None (any node) otherwise, with a warning."""
    if not node:
        return None
    if node in not_free:
        logger.warning("node %s did not come free earlier in this run; trial %s runs on another node", node, trial)
        return None
    if not available(node):
        logger.warning("node %s is not available; trial %s runs on another node", node, trial)
        return None
    return node
