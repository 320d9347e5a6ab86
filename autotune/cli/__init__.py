"""The `autotune` command: a typer app (cli/app.py) and one module per command, each attaching its own."""

from __future__ import annotations

# Each module registers its command on `app` when imported: in the order `autotune --help` lists them.
# isort: off
from autotune.cli import run  # noqa: F401
from autotune.cli import export  # noqa: F401
from autotune.cli import schedule  # noqa: F401
from autotune.cli import history  # noqa: F401
from autotune.cli import report  # noqa: F401
from autotune.cli import models  # noqa: F401
from autotune.cli import doctor  # noqa: F401

# isort: on
from autotune.cli.app import app, main

__all__ = ["app", "main"]
