"""A child process dies with the run that started it: trials, their ranks and the AMP check.

A trial runs in its own session so that the parent can kill its whole process group; but a parent killed outright
(SIGKILL, the OOM killer) kills nothing, and the orphaned child would go on training beside the next run's trials,
skewing their measurements. Linux's PR_SET_PDEATHSIG has the kernel send the child SIGKILL when its parent dies;
its DataLoader workers notice their parent is gone and exit. Elsewhere this is a no-op.

The lifeline must hold from the child's first moment, not from after its imports (torch takes a second or more to
import): every child is started as `python -m autotune.trial.lifeline MODULE ARGS...` (`child_command`), which sets
PR_SET_PDEATHSIG before it imports anything heavy, then checks that its parent is still the process that started it
(the pid in AUTOTUNE_PARENT_PID, set by `parent_environment`). A parent that died before the prctl, which the kernel
would never report, is caught there: the child exits at once instead of training as a permanent orphan. Only then
does it enable faulthandler and logging (prepare_child) and run MODULE as `python -m MODULE` would.

The working folder is kept off the child's import path (`-P`, or its Python 3.10 form: autotune/python_command.py):
it imports exactly what its parent's sys.path (passed in PYTHONPATH) names, never a stray `typer.py` or `torch.py` in
the folder the run was started from.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import faulthandler
import logging
import os
import runpy
import signal
import sys

from autotune.python_command import module_command

__all__ = ["PARENT_PID_ENV", "child_command", "die_with_parent", "parent_environment", "prepare_child"]

logger = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "AUTOTUNE_PARENT_PID"
ORPHAN_EXIT_CODE = 70  # EX_SOFTWARE: the run that started this child was gone before the child could start


def child_command(module: str, *args: str) -> list[str]:
    """The argv that starts `python -m MODULE ARGS` under the lifeline, the working folder off its import path."""
    return module_command("autotune.trial.lifeline", module, *args)


def parent_environment() -> dict[str, str]:
    """What a child started by this process needs to check that this process is still its parent."""
    return {PARENT_PID_ENV: str(os.getpid())}


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; returns whether it could.

    The signal follows the parent *thread* that started this process: autotune launches children from its main
    thread. If AUTOTUNE_PARENT_PID names a parent that is no longer this process's parent (it died before the prctl,
    and this process was handed to init or a subreaper), this process exits at once with ORPHAN_EXIT_CODE.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    except (OSError, AttributeError) as error:
        logger.warning("this process will outlive a killed parent: %s", error)
        return False
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        # Too late for the kernel to tell us: the parent is gone already. Nothing has been imported or started yet.
        os._exit(ORPHAN_EXIT_CODE)
    return True


def prepare_child() -> None:
    """What every child of a run sets before its own module runs: a native crash (a segfault in a kernel, a SIGBUS
    from /dev/shm) still leaves every thread's stack in the child's log, and its log records carry a time and where
    they came from."""
    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)


def main(argv: list[str]) -> None:
    """`python -m autotune.trial.lifeline MODULE ARGS...`: the lifeline first, then MODULE as __main__."""
    die_with_parent()
    prepare_child()
    if not argv:
        raise SystemExit("usage: python -m autotune.trial.lifeline MODULE [ARGS...]")
    sys.argv = argv  # MODULE sees its own arguments, as under `python -m MODULE ARGS`
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
