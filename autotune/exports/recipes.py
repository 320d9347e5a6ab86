"""A framework's own training as the trial: `autotune run --recipe FRAMEWORK --command '...'` runs the user's
command for that framework with each candidate's values written as the framework's own overrides, from the same
mapping that `autotune export --to FRAMEWORK` writes a result with (one table per framework, in its export module),
so that the winner is by construction a command that runs, measured as it runs. The probe reads back every value as
for any command (docs/own-training.md).
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.errors import UserError
from autotune.exports import espnet, speechbrain
from autotune.probe.command import TrainingCommand

__all__ = ["RECIPES", "recipe_command"]

# framework -> its maker: (the user's command, the folder it runs in) -> (the trial's command, --baseline items)
RECIPES: dict[str, Callable[..., tuple[TrainingCommand, list[str]]]] = {
    "espnet": espnet.recipe_command,
    "speechbrain": speechbrain.recipe_command,
}


def recipe_command(framework: str, template: str, *, cwd: str = ".") -> tuple[TrainingCommand, list[str]]:
    """The trial's command for a framework's recipe and the recipe's values today (--baseline items)."""
    maker = RECIPES.get(framework)
    if maker is None:
        raise UserError(f"--recipe {framework}: autotune runs the recipes of {', '.join(sorted(RECIPES))}")
    return maker(template, cwd=cwd)
