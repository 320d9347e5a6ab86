"""What every `--recipe` maker reads the same way: the framework installed, the user's command in words, the
recipe's YAML file. One line each for what is wrong (exports/recipes.py lists the makers)."""

from __future__ import annotations

import ast
import importlib.util
import shlex
import tempfile
import wave
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UserError

__all__ = ["audio_stack", "command_words", "declared_defaults", "read_mapping", "torchaudio_version"]


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


def audio_stack() -> tuple[bool, str | None]:
    """Whether torchaudio.sox_effects imports here, and why torchaudio.load cannot read a WAV file here (None: it
    can), tried on a one-sample file as a recipe's reader calls it: torchaudio 2.9 removed sox_effects (the recipes'
    speed perturbation) and reads files through torchcodec, which needs FFmpeg's libraries."""
    import torchaudio

    try:
        sox_effects = importlib.util.find_spec("torchaudio.sox_effects") is not None
    except ImportError:
        sox_effects = False
    with tempfile.TemporaryDirectory(prefix="autotune-audio-") as folder:
        path = Path(folder) / "one.wav"
        with wave.open(str(path), "wb") as writer:
            writer.setnchannels(1)
            writer.setsampwidth(2)
            writer.setframerate(16000)
            writer.writeframes(b"\0\0")
        try:
            torchaudio.load(str(path))
        except Exception as error:  # noqa: BLE001 - whatever stops it stops the recipe's reader
            return sox_effects, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return sox_effects, None


def torchaudio_version() -> str:
    import torchaudio

    return str(torchaudio.__version__).split("+")[0]


def declared_defaults(path: Path, keys: Collection[str]) -> dict[str, Any] | None:
    """The defaults a framework's parser declares for these `--key`s, read from the file's add_argument calls without
    importing it (the import may pull in every model's dependencies); None where the file cannot be read."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args):
            continue
        flag = node.args[0]
        key = flag.value[2:] if isinstance(flag, ast.Constant) and isinstance(flag.value, str) else ""
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        if key in keys and isinstance(default, ast.Constant):
            found[key] = default.value
    return found
