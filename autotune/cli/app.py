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
    """Console-script entry point (`autotune.cli:main`, which has registered every command)."""
    try:
        app()
    except UserError as error:  # raised outside a command's own handling (e.g. while parsing): the same one line
        sys.exit(fail(str(error), error.exit_code).exit_code)
