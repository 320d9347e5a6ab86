"""`autotune schedule`: a nightly retuning job printed or installed (autotune.nightly), its run arguments checked
now with the parser and checks of `autotune run`, so that a typo fails when it is scheduled and not every night."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from autotune.cli.app import app
from autotune.cli.output import fail
from autotune.cli.run import run
from autotune.errors import UserError

if TYPE_CHECKING:
    from autotune.run.plan import RunRequest

__all__ = ["check_run_args", "schedule"]

# `schedule` passes everything after `--` on to 'autotune run', so it must accept arguments it does not know.
SCHEDULE_CONTEXT: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(context_settings=SCHEDULE_CONTEXT)
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

    Your own training: autotune schedule --model train -- --command 'python train.py --num-workers {num_workers}' ...
    (--model names its results).
    """
    from autotune.nightly import schedule as scheduling
    from autotune.nightly.request import ScheduleRequest

    try:
        request = ScheduleRequest(model=model, at=at, run_args=tuple(ctx.args), systemd=systemd)
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


def check_run_args(model: str, args: list[str] | tuple[str, ...], workdir: str = ".") -> RunRequest:
    """Parse and check `autotune run` arguments as the command would, without running it: every problem that needs
    no hardware, workload or data is the same one-line UserError `autotune run` gives (`autotune schedule` calls this,
    so that a nightly job's typo fails now and not every night). --data and --space must exist as seen from
    `workdir`, where the job runs. Returns the RunRequest.

    Raises:
        UserError: an unknown option, a missing or unreadable value, a setting `autotune run` would refuse.
    """
    from autotune import workloads
    from autotune.cli.run_args import run_request
    from autotune.run.runner import check_own_training
    from autotune.run.validation import check_request, check_workload_options

    if "--help" in args:  # the parser would print run's help and exit
        raise UserError("--help is not a run argument for a scheduled job; leave it out")
    command = typer.main.get_command(_run_alone())
    try:
        context = command.make_context("autotune run", ["--model", model, *args])
    except typer.Exit:
        raise UserError("the arguments for 'autotune run' end the command before it runs; leave that one out") from None
    except Exception as error:  # click's (or typer's vendored click's) usage errors: no common public base to name
        message = getattr(error, "format_message", None)
        if message is None:
            raise
        raise UserError(f"the arguments for 'autotune run': {message()}") from None
    params = {name: value for name, value in context.params.items() if name != "verbose"}
    request = run_request(**params)
    check_request(request)
    if request.command is not None:  # the user's own training: --model names its results, no workload to check
        check_own_training(request)
        return request
    check_workload_options(workloads.get(model), request.workload_options)
    for flag, path in (("--data", request.data), ("--space", request.space)):
        if path and not os.path.exists(os.path.join(workdir, os.path.expanduser(path))):
            raise UserError(f"{flag} {path} does not exist, seen from {workdir} where the job runs; fix the path")
    if request.space:  # read as the job will read it, on this machine: a bad space would fail every night
        from autotune import space
        from autotune.machine.hardware import probe

        path = os.path.join(workdir, os.path.expanduser(request.space))
        space.load(path, probe(request.device), workload_knobs=tuple(workloads.get(model).knobs))
    return request


def _run_alone() -> typer.Typer:
    """`autotune run` on an app of its own: its parser, without the app that registers every command."""
    alone = typer.Typer(add_completion=False)
    alone.command()(run)
    return alone
