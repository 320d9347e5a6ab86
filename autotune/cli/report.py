"""`autotune report`: the trial table, plots and an HTML page for a result and its study (autotune.result.report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.cli.app import app
from autotune.cli.output import fail, plain, stdout_console
from autotune.errors import UserError

__all__ = ["report"]


@app.command()
def report(
    result: Annotated[Path, typer.Argument(help="A result YAML written by 'autotune run'.")],
    storage: Annotated[
        Optional[str], typer.Option(help="Storage URL of the study (default: the one in the result).")
    ] = None,
    # Text, not Path: typer reads '' as Path('.'), and an empty value must be refused, not taken as this folder.
    out: Annotated[Optional[str], typer.Option(help="Folder for report.html and the PNG plots.")] = None,
    csv: Annotated[Optional[str], typer.Option(help="Also save the trial table as CSV here.")] = None,
) -> None:
    """Write the trial table, plots and a self-contained HTML page for a result and its study.

    Example: autotune report results/cam++/cpu-x2-cec72d5a08.yaml --csv trials.csv
    """
    from autotune.result.report import build_report

    try:
        files = build_report(result, storage=storage, out_dir=out, csv=csv)
    except UserError as error:
        raise fail(str(error)) from None
    stdout_console.print(f"{files.trials} trials; report: [bold]{plain(files.html)}[/bold]")
    for path in [*files.plots, *([files.csv] if files.csv else [])]:
        stdout_console.print(f"  {plain(path)}")
