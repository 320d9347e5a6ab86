"""A proof step's process: `python -m autotune.gpu_proof.child STEP CONTEXT.json RESULT.json`."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from autotune import yamlio
from autotune.gpu_proof import STEPS
from autotune.gpu_proof.registry import Proven, StepContext


def main(argv: list[str]) -> int:
    name, context_file, result_file = argv
    context = StepContext.from_dict(json.loads(Path(context_file).read_text()))
    try:
        proven = STEPS[name].run(context)
    except Exception as error:  # the step failed; say how, and let the next step run
        traceback.print_exc()
        proven = Proven(passed=False, notes=[f"raised {type(error).__name__}: {error}".replace("\n", " ")[:500]])
    yamlio.write_json(result_file, proven.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
