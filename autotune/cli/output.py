"""Where every `autotune` command writes: results on stdout, progress and errors on stderr.

One place for the consoles and the error line, shared by every command module.
"""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.markup import escape

from autotune.errors import USER_ERROR_EXIT_CODE

__all__ = ["ConsoleLogHandler", "fail", "plain", "stderr_console", "stdout_console"]

stderr_console = Console(stderr=True)
stdout_console = Console()


def plain(value: object) -> str:
    """Text from outside (a model name, a path, an error message) made safe to put into rich markup: a '[/x]' in a
    file name is shown as typed, never read as a closing tag (a MarkupError) nor eaten ('psycopg[binary]')."""
    return escape(str(value))


def fail(message: str, code: int = USER_ERROR_EXIT_CODE) -> typer.Exit:
    """Print one 'error:' line on stderr and return the exit to raise, so a caller writes `raise fail(...)`."""
    stderr_console.print(f"[bold red]error:[/bold red] {plain(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


class ConsoleLogHandler(logging.Handler):
    """Library log records printed through the stderr console: above a live progress display rather than through
    it (a raw stream write leaves the display's fragments behind), and as a word, not a logger's name and level.
    Its own formatter is the message alone: logging.basicConfig gives a handler without one 'LEVEL:name:message'."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = plain(self.format(record))
            if record.levelno >= logging.WARNING:
                stderr_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)
            else:
                stderr_console.print(f"[dim]{plain(record.name)}: {message}[/dim]", highlight=False, soft_wrap=True)
        except Exception:  # a log line must never end the run
            self.handleError(record)
