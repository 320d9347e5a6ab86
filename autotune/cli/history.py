"""`autotune history`: every accepted result of a model, as a table (autotune.result.history)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli.app import app
from autotune.cli.output import fail, plain, stdout_console
from autotune.errors import UserError

__all__ = ["history"]


@app.command()
def history(
    model: Annotated[str, typer.Option("--model", "-m", help="Workload whose results to list.")],
    results_dir: Annotated[Path, typer.Option(help="Folder the results were written to.")] = Path("results"),
) -> None:
    """Show every accepted result of a model: date, hardware, versions, winner, throughput and speedup."""
    from autotune.result import history as result_history

    try:
        frame = result_history.load(results_dir, model)
    except UserError as error:
        raise fail(str(error)) from None
    if frame.empty:
        stdout_console.print(f"no results recorded yet for {plain(model)} under {plain(results_dir)}")
        return
    stdout_console.print(result_history.render_table(frame))
