"""A result of `autotune run --command` as the command that runs your training with the winner's values."""

from __future__ import annotations

import shlex
from pathlib import Path

from autotune.errors import UserError
from autotune.probe import config_file
from autotune.probe.command import TrainingCommand
from autotune.probe.lightning import python_lines
from autotune.result.tuned_config import TunedConfig

__all__ = ["command_text"]


def command_text(tuned: TunedConfig, result_path: Path) -> str:
    """The winner's command, where it runs, the tuned copy of the config file and what autotune applied itself."""
    recorded = tuned.workload.get("options", {}).get("command")
    if not isinstance(recorded, dict) or "template" not in recorded:
        raise UserError(f"{result_path} records no training command; it is not a result of 'autotune run --command'")
    command = TrainingCommand.from_dict(recorded)
    copy = None
    if command.config_path:
        copy = config_file.tuned_folder(result_path) / Path(command.config_path).name
    lines = [
        f"# your training with the values autotune measured fastest ({result_path.name})",
        f"cd {shlex.quote(command.cwd)}",
        shlex.join(command.argv(tuned.config, copy)),
    ]
    if copy is not None:
        lines.append(f"# {copy}: your {command.config_path} with the tuned keys (the diff: {copy}.diff)")
    if command.lightning is not None:
        lines.append("# or, in your own script (the factory's values and Lightning's Trainer as measured):")
        on_cuda = tuned.device_type == "cuda"
        lines += [f"#   {line}" if line else "#" for line in python_lines(command, tuned.config, on_cuda=on_cuda)]
    for name in command.apply:
        value = getattr(tuned.config, name)
        lines.append(f"# {name}={value} was set inside your training by autotune (--apply): set it in your DataLoader")
    return "\n".join(lines)
