"""Trial child entry: `python -m autotune.trial SPEC.json` writes the TrialResult to the spec's result_path.

Under several ranks (torchrun's environment: RANK, WORLD_SIZE, ...) each rank writes its own result file beside it.
The launcher starts it under the lifeline (`python -m autotune.trial.lifeline autotune.trial SPEC.json`), which ties
the process to the run's life before this module imports torch, and enables faulthandler and logging (a native crash
still leaves a stack in the log), as for every child of a run (trial/launch.py start_child).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from autotune import yamlio
from autotune.trial.child import run_trial
from autotune.trial.distributed import RankInfo
from autotune.trial.spec import LAUNCHED_AT_ENV, TrialSpec, rank_result_path


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    spec = TrialSpec.from_dict(yamlio.read_json(argv[0]))
    rank = RankInfo.from_environment()
    result = run_trial(spec, started, rank)
    launched_at = os.environ.get(LAUNCHED_AT_ENV)
    if launched_at:
        result.start_s = max(0.0, time.time() - float(launched_at) - (time.perf_counter() - started))
    yamlio.write_json(rank_result_path(spec.result_path, rank.rank), result.to_dict())
    if rank.distributed and not result.feasible:
        # A failed rank leaves its peers blocked in collectives; exiting through the interpreter's teardown (process
        # group, CUDA context) could block too. The result is written: leave now, the launcher ends the rest.
        logging.shutdown()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
