"""The one place YAML and JSON files are read and written: safe loaders only, atomic writes."""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from autotune.errors import UserError

__all__ = [
    "atomic_write_bytes",
    "from_fields",
    "special_file",
    "atomic_write_text",
    "read_mapping",
    "dump_yaml",
    "write_json",
    "read_json",
]

# A YAML file may name one node many times through anchors and aliases; loaded, they share one object, but anything
# that copies the data (plain(), a result that records it) expands them: 300 bytes of nested aliases become gigabytes.
# No file autotune reads needs more than a few thousand nodes.
MAX_EXPANDED_NODES = 200_000
_T = TypeVar("_T")


# The largest YAML file autotune reads (a result, a search space: kilobytes); anything larger is not one, and reading
# it whole could exhaust the machine (a path to /dev/zero, a log named by mistake).
MAX_YAML_BYTES = 16 * 2**20


def special_file(path: str | os.PathLike[str]) -> str | None:
    """What a path is when it is there but not a regular file (a named pipe, a device, a socket, a folder): reading
    one blocks or never ends, so a reader refuses it before opening it. None for a regular file, or nothing there."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = {
        "a named pipe": stat.S_ISFIFO,
        "a character device": stat.S_ISCHR,
        "a block device": stat.S_ISBLK,
        "a socket": stat.S_ISSOCK,
        "a folder": stat.S_ISDIR,
    }
    return next((name for name, test in kinds.items() if test(mode)), "not a regular file")


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a mapping that names a key twice: YAML keeps the last, silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                line = key_node.start_mark.line + 1
                where = f"on line {line}" if line == seen[key] else f"on lines {seen[key]} and {line}"
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice {where}", key_node.start_mark
                )
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_mapping(path: str | os.PathLike[str], *, what: str, error: type[UserError] = UserError) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; a missing, unreadable, oversized or malformed file, or one that
    names a key twice, is a one-line error."""
    path = Path(path)
    kind = special_file(path)
    if kind is not None:
        raise error(f"{what} file {path} is not a regular file ({kind}); give the path of a YAML file")
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise error(
                f"{what} file {path} holds {size:,} bytes, more than any {what} ({MAX_YAML_BYTES // 2**20} MiB at "
                "most); check the path"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} file {path} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} file {path} cannot be read ({exc.__class__.__name__}: {exc}); check the file") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: safe_load with one more check
    except RecursionError:
        raise error(
            f"{what} file {path} nests deeper than any {what} (Python's stack ran out); check the file"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise error(f"{what} file {path} is not valid YAML{where}: {problem}; fix the syntax") from None
    if not isinstance(data, dict):
        raise error(f"{what} file {path} must hold a YAML mapping at the top level")
    if _expanded_nodes(data, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
        raise error(
            f"{what} file {path} expands to more than {MAX_EXPANDED_NODES:,} values through YAML aliases (*name); "
            "write the values out instead"
        )
    return data


def _expanded_nodes(data: Any, limit: int) -> int:
    """How many values `data` holds with every alias expanded, counted once per shared object (stops past limit)."""
    sizes: dict[int, int] = {}

    def count(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        total = 1
        for child in children:
            total += count(child)
            if total > limit:
                break
        sizes[id(node)] = total
        return total

    return count(data)


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
    """Write bytes through a temporary file in the same folder, fsync, a rename over the target, then fsync the
    folder, so that after a power loss the file is the old one or the new one, never empty or half.

    Raises:
        OSError: the folder cannot be written (full disk, read-only, permissions) or the target is a folder; the
            target is then untouched and no temporary file is left behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = _create_temporary(path)
    try:
        with os.fdopen(handle, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path`, created with mode 0666 less the umask as any ordinary file (mkstemp would make it
    owner-only, and reading the umask means setting it, which races with other threads creating files)."""
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the file itself is already durable
    finally:
        os.close(descriptor)


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON atomically (trial specs and results)."""
    return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False))


def read_json(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def from_fields(cls: type[_T], data: dict[str, Any]) -> _T:
    """A dataclass from a dict of its fields; a key that is no field is an error naming it (a misspelled or stale
    key must not vanish silently: what crosses a process or is read back is exactly what was written).

    Raises:
        ValueError: data has keys cls has no field for.
    """
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = [key for key in data if key not in names]
    if unknown:
        raise ValueError(
            f"{cls.__name__} has no field {', '.join(repr(key) for key in unknown)} "
            f"(its fields: {', '.join(sorted(names))})"
        )
    return cls(**data)
