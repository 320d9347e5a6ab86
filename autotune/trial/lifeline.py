"""A trial process dies with the run that started it.

The trial runs in its own session so that the parent can kill its whole process group; but a parent killed outright
(SIGKILL, the OOM killer) kills nothing, and the orphaned trial would go on training beside the next run's trials,
skewing their measurements. Linux's PR_SET_PDEATHSIG has the kernel send the trial SIGKILL when its parent dies; its
DataLoader workers notice their parent is gone and exit. Elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import signal
import sys

__all__ = ["die_with_parent"]

logger = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; returns whether it could.

    The signal follows the parent *thread* that started this process: autotune launches trials from its main thread.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    except (OSError, AttributeError) as error:
        logger.warning("this trial will outlive a killed parent: %s", error)
        return False
    return True
