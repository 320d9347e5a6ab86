"""torchrun on one node of a multi-node trial: `python -m autotune.trial.torchrun_agent REPORT.json TORCHRUN-ARGS...`.

Started under the lifeline by trial/multinode.py (it dies with the node's job task). It runs torch's own launcher
(torch.distributed.run, what `torchrun` runs) in this process, so that:

- the ranks it starts are its own children: each rank's lifeline (AUTOTUNE_PARENT_PID) must name this process, or
  the rank would take itself for an orphan and exit at once;
- which rank failed and how is read from torch's ChildFailedError (each failed rank's exit code and when torchrun saw
  it), not from its printed report, and written to REPORT.json for the node that judges the trial: a rank killed by
  a signal writes no result of its own, and its peers' results only say that it went away.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from autotune import yamlio
from autotune.trial.lifeline import PARENT_PID_ENV

__all__ = ["main"]


def main(argv: list[str]) -> int:
    report, args = argv[0], argv[1:]
    os.environ[PARENT_PID_ENV] = str(os.getpid())  # the ranks' parent is this process, not the node's task
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    failures: dict[str, Any] = {}
    code = 0
    try:
        run(parse_args(args))
    except ChildFailedError as error:
        code = 1
        failures = {
            str(rank): {"exitcode": failure.exitcode, "timestamp": failure.timestamp, "local_rank": failure.local_rank}
            for rank, failure in error.failures.items()
        }
    except Exception as error:  # the rendezvous failed (a peer never came, the store went away): no rank to blame
        code, line = 2, (str(error).strip().splitlines() or [""])[0][:300]
        failures = {"agent": {"error": f"{type(error).__name__}: {line}"}}
    yamlio.write_json(report, {"exit_code": code, "failures": failures})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
