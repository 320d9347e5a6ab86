"""Trial child entry: `python -m autotune.trial SPEC.json` writes the TrialResult to the spec's result_path."""

from __future__ import annotations

import faulthandler
import logging
import sys
import time

from autotune import yamlio
from autotune.trial.child import run_trial
from autotune.trial.spec import TrialSpec


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    faulthandler.enable()  # a native crash still leaves a stack in the log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    spec = TrialSpec.from_dict(yamlio.read_json(argv[0]))
    result = run_trial(spec, started)
    yamlio.write_json(spec.result_path, result.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
