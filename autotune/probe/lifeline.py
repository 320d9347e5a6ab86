"""`python -m autotune.probe.lifeline PROGRAM ARGS...`: the user's training command, dying with the run that started it.

A command trial runs in a session of its own (its process group is killed when the trial ends), so a run killed
outright (SIGKILL, the OOM killer) would leave the training going on beside the next run. This starts as a small
Python process, sets the trials' lifeline (trial/lifeline.py: PR_SET_PDEATHSIG, and a parent already gone caught at
once) and replaces itself with the command (execvp keeps the death signal): the training is the same process, with
the lifeline set before its first line. A program that cannot be started is one line on stderr and exit code 127.
"""

from __future__ import annotations

import os
import sys

from autotune.trial.lifeline import die_with_parent

__all__ = ["CANNOT_START", "main"]

CANNOT_START = "autotune: the command could not start"


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m autotune.probe.lifeline PROGRAM [ARGS...]")
    die_with_parent()
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        print(f"{CANNOT_START}: {error.strerror}: {argv[0]}", file=sys.stderr, flush=True)
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv[1:])
