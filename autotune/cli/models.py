"""`autotune models`: the built-in workloads with their task, parameter count and default data."""

from __future__ import annotations

from autotune.cli.app import app
from autotune.cli.output import plain, stdout_console

__all__ = ["models"]


@app.command()
def models() -> None:
    """List the built-in workloads with their task, parameter count and default data."""
    from rich.table import Table

    from autotune import workloads

    table = Table(title="autotune workloads")
    for column in ("model", "task", "parameters", "published", "default data", "description"):
        table.add_column(column)
    for name in workloads.names():
        workload = workloads.get(name)
        counted = workload.count_parameters() if workload.count_parameters else None
        published = workload.published_parameters
        table.add_row(
            plain(name),
            plain(workload.task),
            f"{counted:,}" if counted else "-",
            f"{published:,}" if published else "-",
            "synthetic corpus (generated on first use)",
            plain(workload.description),
        )
    stdout_console.print(table)
