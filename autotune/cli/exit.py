"""How `autotune run` ends: the exit code that tells cron what happened, SIGTERM taken as Ctrl-C, and a machine that
failed the run said in one line.

The codes are the contract of RUN_HELP's 'Exit codes' (cli/run.py): 0 done, 1 no stable configuration, 2 bad
input, 3 regression, 4 the machine failed the run, 130 interrupted. Free of heavy imports so that `autotune --help`
stays fast: storage is imported only when a run fails.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import typer

from autotune.cli.output import fail, plain, stdout_console
from autotune.errors import MACHINE_FAILURE_EXIT_CODE

if TYPE_CHECKING:
    from autotune.run.runner import RunReport

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_NO_STABLE_CONFIG",
    "EXIT_REGRESSION",
    "finish",
    "machine_failure_line",
    "machine_failures",
    "sigterm_interrupts",
]

EXIT_NO_STABLE_CONFIG = 1
EXIT_REGRESSION = 3  # the previous winner got slower (run/drift.py judges it)
EXIT_INTERRUPTED = 130


def machine_failures() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the machine failed the run (a disk that filled, a database that went away)."""
    from autotune.storage import storage_failures

    return storage_failures()


def machine_failure_line(error: BaseException) -> str:
    """The one error line for a machine failure: what failed, that the trials are kept, and how to go on."""
    from autotune.storage import describe_failure

    return (
        f"the machine failed the run ({describe_failure(error)}); completed trials stay in the study: fix it "
        "(free space, bring the database back) and rerun to continue"
    )


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a batch job's time limit or scancel, `timeout`, `kill`) ends the run as Ctrl-C does: the running trial
    is stopped and failed, the best so far written, exit 130. Python's default would die at once, taking the trial's
    processes with it (trial/lifeline.py) but writing nothing. The previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def finish(report: RunReport) -> None:
    """Say what the rerun concluded against the previous result, and exit with the code that tells cron."""
    from autotune.search.settings import STORAGE_FAILED  # here, not at the top: `autotune --help` stays light

    verdict = report.verdict
    if verdict is not None and verdict.previous_path is not None:
        style = "bold red" if verdict.regression else "bold"
        for line in verdict.lines():
            stdout_console.print(f"[{style}]{plain(line)}[/{style}]", highlight=False, soft_wrap=True)
    where = f"best so far written to {report.result_path}" if report.written else "the previous result kept"
    if report.outcome.stopped_by == "interrupted":
        raise fail(f"interrupted; {where}; completed trials stay in the study, rerun to continue", EXIT_INTERRUPTED)
    if report.outcome.stopped_by == STORAGE_FAILED:
        raise fail(
            f"the study's storage failed mid-run ({report.outcome.failure}); {where}; the trials it recorded stay "
            "in it: fix it (free space, bring the database back) and rerun to continue",
            MACHINE_FAILURE_EXIT_CODE,
        )
    if verdict is not None and verdict.regression:
        raise typer.Exit(EXIT_REGRESSION)
