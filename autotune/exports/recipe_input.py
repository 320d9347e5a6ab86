"""What every `--recipe` maker reads the same way: the framework installed, the user's command in words, the
recipe's YAML file. One line each for what is wrong (exports/recipes.py lists the makers)."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UserError

__all__ = ["command_words", "read_mapping"]


def command_words(framework: str, template: str, *, package: str, install: str) -> list[str]:
    """The command's words, once the framework's package is importable here (the trials run it in this
    environment)."""
    if importlib.util.find_spec(package) is None:
        raise UserError(f"--recipe {framework} needs {package} in this environment: pip install {install}")
    try:
        return shlex.split(template)
    except ValueError as error:
        raise UserError(f"--command cannot be split into words as a shell would: {error}") from None


def read_mapping(
    framework: str, path: Path, name: str, *, what: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader
) -> dict[str, Any]:
    """The recipe's YAML file (name: as the command names it) as a mapping; `what` says what it should map."""
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a SafeLoader
    except OSError as error:
        raise UserError(f"--recipe {framework}: cannot read {name}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise UserError(f"--recipe {framework}: {name} is not YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(document, dict):
        raise UserError(f"--recipe {framework}: {name} is not a mapping of {what}")
    return document
