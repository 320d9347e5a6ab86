"""The small `autotune` commands that read what `autotune run` wrote: export, schedule, history, report, models.

Plain functions with typer annotations; `autotune.cli` registers them on the app (after `run`, which keeps the help's
order). Each parses its arguments, calls one library function and prints; the library is imported inside the
command so that `autotune --help` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from autotune.cli_output import fail, plain, stdout_console
from autotune.errors import UserError

__all__ = ["SCHEDULE_CONTEXT", "export", "history", "models", "report", "schedule"]

# `schedule` passes everything after `--` on to 'autotune run', so it must accept arguments it does not know.
SCHEDULE_CONTEXT: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}


def export(
    result: Annotated[Path, typer.Argument(help="A result YAML written by 'autotune run'.")],
    to: Annotated[str, typer.Option("--to", help="3d-speaker, wenet, speechbrain, espnet or lightning.")],
    world_size: Annotated[Optional[int], typer.Option(help="Devices to train on (default: as measured).")] = None,
) -> None:
    """Print the configuration as an override for a training framework, with its real keys and batch semantics.

    Example: autotune export results/cam++/cpu-x2-cec72d5a08.yaml --to 3d-speaker --world-size 4
    """
    from autotune.exports import export as make_export
    from autotune.results import load_config

    try:
        text = make_export(load_config(result), to, world_size=world_size).render()
    except UserError as error:
        raise fail(str(error)) from None
    typer.echo(text)


def schedule(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", "-m", help="Workload to retune nightly.")],
    at: Annotated[str, typer.Option(help="Local time of day, HH:MM (24 h).")] = "02:30",
    systemd: Annotated[bool, typer.Option("--systemd", help="A systemd user timer + service instead of cron.")] = False,
    install: Annotated[
        bool, typer.Option("--install", help="Install it (crontab, or ~/.config/systemd/user).")
    ] = False,
) -> None:
    """Print (or install) a nightly retuning job; arguments after -- go to 'autotune run'.

    Example: autotune schedule --model cam++ --at 02:30 -- --data /data/train.csv --budget 30m
    """
    from autotune import schedule as scheduling
    from autotune.schedule_request import ScheduleRequest

    try:
        request = ScheduleRequest(model=model, at=at, run_args=tuple(ctx.args), systemd=systemd)
        from autotune.cli_run_args import check_run_args

        check_run_args(model, request.run_args, workdir=os.path.abspath(os.path.expanduser(request.workdir)))
        if install:
            lines = scheduling.install(request)
        elif systemd:
            lines = [f"# {name}\n{text}" for name, text in scheduling.systemd_units(request).items()]
            lines.append(f"# then: {scheduling.enable_command(request)}")
        else:
            lines = [scheduling.cron_line(request)]
    except UserError as error:
        raise fail(str(error)) from None
    for line in lines:
        typer.echo(line)


def history(
    model: Annotated[str, typer.Option("--model", "-m", help="Workload whose results to list.")],
    results_dir: Annotated[Path, typer.Option(help="Folder the results were written to.")] = Path("results"),
) -> None:
    """Show every accepted result of a model: date, hardware, versions, winner, throughput and speedup."""
    from autotune import history as result_history

    frame = result_history.load(results_dir, model)
    if frame.empty:
        stdout_console.print(f"no results recorded yet for {plain(model)} under {plain(results_dir)}")
        return
    stdout_console.print(result_history.render_table(frame))


def report(
    result: Annotated[Path, typer.Argument(help="A result YAML written by 'autotune run'.")],
    storage: Annotated[
        Optional[str], typer.Option(help="Storage URL of the study (default: the one in the result).")
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Folder for report.html and the PNG plots.")] = None,
    csv: Annotated[Optional[Path], typer.Option(help="Also save the trial table as CSV here.")] = None,
) -> None:
    """Write the trial table, plots and a self-contained HTML page for a result and its study.

    Example: autotune report results/cam++/cpu-x2-cec72d5a08.yaml --csv trials.csv
    """
    from autotune.report import build_report

    try:
        files = build_report(result, storage=storage, out_dir=out, csv=csv)
    except UserError as error:
        raise fail(str(error)) from None
    stdout_console.print(f"{files.trials} trials; report: [bold]{plain(files.html)}[/bold]")
    for path in [*files.plots, *([files.csv] if files.csv else [])]:
        stdout_console.print(f"  {plain(path)}")


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
