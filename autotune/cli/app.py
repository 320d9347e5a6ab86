"""The `autotune` app: the typer application every command module attaches its command to, and the entry point.

Each command lives in a module of its own (run, export, schedule, history, report, models, doctor) and registers on
`app` when it is imported; `autotune.cli` imports them in the order the help lists them. Nothing heavy is imported
at module level (torch, optuna, the runner come inside the commands) so that `autotune --help` stays fast.
"""

from __future__ import annotations

import logging
import sys

import typer

from autotune.cli.output import ConsoleLogHandler, fail
from autotune.errors import UserError

__all__ = ["app", "main", "setup_logging"]

app = typer.Typer(
    name="autotune",
    help="Measure, don't guess: tune speech-model training throughput with short timed trials on this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def setup_logging(verbose: bool) -> None:
    """Log to the stderr console (above the live progress), in detail with --verbose; Optuna's own logger follows."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[ConsoleLogHandler()])
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)


def main() -> None:
    """Console-script entry point (`autotune.cli:main`, which has registered every command). Every way a command line
    can be wrong ends the same: one `error:` line and exit code 2."""
    try:
        code = app(standalone_mode=False)
    except UserError as error:  # raised outside a command's own handling (e.g. while parsing): the same one line
        sys.exit(fail(str(error), error.exit_code).exit_code)
    except Exception as error:
        sys.exit(_parse_failure(error))
    sys.exit(code if isinstance(code, int) else 0)


def _parse_failure(error: Exception) -> int:
    """click's usage errors (a bad value, an unknown option or command) as the one error line, with the help that
    says the rest; a bare invocation shows the help, as before. Anything else is a bug and is raised."""
    show, message = getattr(error, "show", None), getattr(error, "format_message", None)
    if type(error).__name__ == "NoArgsIsHelpError" and show is not None:
        show()  # `autotune` alone: the help, and click's code for it (2), as before
        return int(getattr(error, "exit_code", 2))
    if message is None or not isinstance(getattr(error, "exit_code", None), int):
        if type(error).__name__ == "Abort":
            return fail("aborted", 1).exit_code
        raise error
    context = getattr(error, "ctx", None)
    where = getattr(context, "command_path", "autotune") if context is not None else "autotune"
    said = " ".join(message().split()).rstrip(".")
    return fail(f"{said}; see '{where} --help'", error.exit_code).exit_code  # type: ignore[attr-defined]
