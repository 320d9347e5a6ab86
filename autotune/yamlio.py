"""The one place YAML and JSON files are read and written: safe loaders only, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UserError

__all__ = ["atomic_write_bytes", "atomic_write_text", "read_mapping", "dump_yaml", "write_json", "read_json"]


def read_mapping(path: str | os.PathLike[str], *, what: str, error: type[UserError] = UserError) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; a missing, unreadable or malformed file is a one-line error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} file {path} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} file {path} cannot be read ({exc.__class__.__name__}: {exc}); check the file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise error(f"{what} file {path} is not valid YAML{where}: {problem}; fix the syntax") from None
    if not isinstance(data, dict):
        raise error(f"{what} file {path} must hold a YAML mapping at the top level")
    return data


def plain(data: Any) -> Any:
    """Plain built-in types only (tuples become lists, str subclasses such as torch's version become str)."""
    if isinstance(data, dict):
        return {str(key): plain(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [plain(item) for item in data]
    if isinstance(data, str):
        return str(data)
    return data


def dump_yaml(data: Any) -> str:
    """YAML text in the order given, block style, readable by yaml.safe_load."""
    return yaml.safe_dump(plain(data), sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 text atomically (see atomic_write_bytes): readers see the old file or the new one, never half."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write bytes through a temporary file in the same folder, fsync, then a rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp makes it owner-only; these are ordinary files
        with os.fdopen(handle, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON atomically (trial specs and results)."""
    return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False))


def read_json(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
