"""A framework's own training as the trial: `autotune run --recipe FRAMEWORK --command '...'` runs the user's
command for that framework with each candidate's values written as the framework's own overrides, from the same
mapping that `autotune export --to FRAMEWORK` writes a result with (one table per framework, in its export module),
so that the winner is by construction a command that runs, measured as it runs. The probe reads back every value as
for any command (docs/own-training.md).
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.errors import UserError
from autotune.exports import espnet, speakerlab, speechbrain, wenet
from autotune.probe.command import TrainingCommand

__all__ = ["CUDA_ONLY", "RECIPES", "check_device", "recipe_command"]

# framework -> its maker: (the user's command, the folder it runs in) -> (the trial's command, --baseline items)
RECIPES: dict[str, Callable[..., tuple[TrainingCommand, list[str]]]] = {
    "3d-speaker": speakerlab.recipe_command,
    "espnet": espnet.recipe_command,
    "speechbrain": speechbrain.recipe_command,
    "wenet": wenet.recipe_command,
}
# Frameworks whose training script runs on CUDA only, with the line that says so.
CUDA_ONLY = {
    "3d-speaker": "speakerlab/bin/train.py trains on CUDA only (torch.cuda.set_device, the nccl process group)",
}


def recipe_command(framework: str, template: str, *, cwd: str = ".") -> tuple[TrainingCommand, list[str]]:
    """The trial's command for a framework's recipe and the recipe's values today (--baseline items)."""
    maker = RECIPES.get(framework)
    if maker is None:
        raise UserError(f"--recipe {framework}: autotune runs the recipes of {', '.join(sorted(RECIPES))}")
    return maker(template, cwd=cwd)


def check_device(framework: str | None, device_type: str) -> None:
    """Refuse, before any trial, a recipe whose framework cannot train on this machine's device."""
    if framework in CUDA_ONLY and device_type != "cuda":
        raise UserError(f"--recipe {framework}: {CUDA_ONLY[framework]}; this machine has no GPU")
