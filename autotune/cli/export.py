"""`autotune export`: a result as a paste-ready snippet for a training framework (autotune.exports)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.cli.app import app
from autotune.cli.output import fail
from autotune.errors import UserError

__all__ = ["export"]


@app.command()
def export(
    result: Annotated[Path, typer.Argument(help="A result YAML written by 'autotune run'.")],
    to: Annotated[
        Optional[str],
        typer.Option(
            "--to",
            help="3d-speaker, wenet, speechbrain, espnet, lightning, amphion or gpt-sovits; a result of 'autotune run "
            "--command' without --to prints its command.",
        ),
    ] = None,
    world_size: Annotated[Optional[int], typer.Option(help="Devices to train on (default: as measured).")] = None,
) -> None:
    """Print the configuration as an override for a training framework, with its real keys and batch semantics.

    Example: autotune export results/cam++/cpu-x2-cec72d5a08.yaml --to 3d-speaker --world-size 4
    """
    from autotune.exports import TARGETS
    from autotune.exports import export as make_export
    from autotune.exports.own_training import command_text
    from autotune.probe.command import OWN_TASK
    from autotune.result.tuned_config import load_config

    try:
        tuned = load_config(result)
        if to is None and tuned.workload.get("task") == OWN_TASK:
            text = command_text(tuned, result)
        elif to is None:
            raise UserError(f"give --to TARGET: one of {', '.join(sorted(TARGETS))}")
        else:
            text = make_export(tuned, to, world_size=world_size).render()
    except UserError as error:
        raise fail(str(error)) from None
    typer.echo(text)
