"""The user's training config file (YAML or JSON): its keys checked, and copies of it with keys changed.

The user's file is only ever read. A copy changes exactly the keys asked for: in YAML, line by line so that the
comments, order and layout of everything else survive (the copy is then read back and compared with the file with
those keys set; where the layout is one line editing cannot follow, such as flow style, the copy is written whole
and loses its comments); JSON is written whole, as JSON has no comments to keep.
"""

from __future__ import annotations

import copy as copying
import difflib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from autotune import yamlio
from autotune.errors import UserError

__all__ = ["check_key", "diff", "read", "safe_scalar", "set_key", "tuned_folder", "walk", "write_changed"]

_KEY_LINE = re.compile(
    r"^(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>[^\s#'\"{\[][^:#]*?|'[^']*'|\"[^\"]*\"):(?P<gap>\s+|$)"
    r"(?P<rest>.*)$"
)


def read(path: str) -> dict[str, Any]:
    """The file's contents; a file that is missing, unreadable or not a mapping is one line."""
    return yamlio.read_mapping(path, what="--config-file")


def safe_scalar(text: str) -> Any:
    """A filled-in value as YAML reads it: 32 a number, true a flag, bf16 a word."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) or value is None else text


def walk(document: Any, key: str) -> tuple[Any, str | int]:
    """The container holding a dotted key's last part, and that part (an index for a list)."""
    parts = key.split(".")
    node = document
    for depth, part in enumerate(parts):
        at = ".".join(parts[:depth]) or "the top level"
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            index: str | int = int(part)
        elif isinstance(node, dict) and part in node:
            index = part
        else:
            keys = ", ".join(map(str, list(node)[:12])) if isinstance(node, dict) else f"a {type(node).__name__}"
            raise KeyError(f"{part!r} is not under {at} (there: {keys})")
        if depth == len(parts) - 1:
            return node, index
        node = node[index]
    raise KeyError(key)


def check_key(document: dict[str, Any], key: str, path: str) -> None:
    """A --set key must name a value already in the file: a typo must not add a key the training never reads."""
    try:
        container, index = walk(document, key)
    except KeyError as error:
        raise UserError(f"--set {key}: {error.args[0]} in {path}; give a key the file has") from None
    if isinstance(container[index], (dict, list)):
        raise UserError(f"--set {key}: in {path} it holds a {type(container[index]).__name__}, not one value")


def set_key(document: dict[str, Any], key: str, value: Any) -> None:
    container, index = walk(document, key)
    container[index] = value


def _changed(document: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    result = copying.deepcopy(document)
    for key, value in changes.items():
        set_key(result, key, value)
    return result


def _edit_lines(text: str, changes: dict[str, Any]) -> str:
    """The YAML text with each changed key's value replaced on its own line; keys it cannot find stay as they are."""
    stack: list[tuple[int, str]] = []
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        match = _KEY_LINE.match(line.rstrip("\n"))
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"]) + (len(match["dash"]) if match["dash"] else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match["key"].strip().strip("'\"")
        path = ".".join([*(part for _, part in stack), key])
        stack.append((indent, key))
        if path not in changes or not match["rest"].strip() or match["rest"].lstrip()[:1] in "|>&*!":
            continue
        rest = match["rest"]
        comment = re.search(r"\s+#.*$", rest)
        rendered = yaml.safe_dump(changes[path], default_flow_style=True).strip().removesuffix("...").strip()
        ending = "\n" if line.endswith("\n") else ""
        head = line[: len(line.rstrip("\n")) - len(rest)]
        lines[number] = f"{head}{rendered}{comment.group(0) if comment else ''}{ending}"
    return "".join(lines)


def write_changed(source: str, changes: dict[str, Any], destination: Path) -> None:
    """A copy of source at destination with the keys changed (dotted key -> value); source is not touched."""
    document = read(source)
    wanted = _changed(document, changes)
    if Path(source).suffix.lower() == ".json":
        yamlio.atomic_write_text(destination, json.dumps(wanted, indent=2) + "\n")
        return
    text = Path(source).read_text(encoding="utf-8")
    edited = _edit_lines(text, changes)
    try:
        kept = yaml.safe_load(edited) == wanted
    except yaml.YAMLError:
        kept = False
    yamlio.atomic_write_text(destination, edited if kept else yamlio.dump_yaml(wanted))


def diff(source: str, changed: Path) -> str:
    """A unified diff from the user's file to the changed copy."""
    before = Path(source).read_text(encoding="utf-8").splitlines(keepends=True)
    after = changed.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, fromfile=source, tofile=str(changed)))


def tuned_folder(result_path: Path) -> Path:
    """Where a result's copy of the user's config file is written: beside the result, named after it."""
    return result_path.resolve().parent / f"{result_path.stem}.config"
