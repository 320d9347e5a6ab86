"""Where a run writes, and what happens when the machine refuses: checked before any trial, created only once
every input passed (a refused run leaves nothing behind), and the result written atomically with a one-line error
that says what survives when the disk is full."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from autotune.errors import MachineFailure, OutputError, UserError, describe_os_error
from autotune.result.tuned_config import TunedConfig, load_config, write_config
from autotune.yamlio import special_file

__all__ = ["check_replaceable", "check_writable", "make_folders", "remove_empty", "write_result"]


def check_writable(path: Path) -> None:
    """Fail now, with one line, if a file could not be created where it must be written later. Creates nothing: a
    refused run must leave no empty folders behind (folders are made by `make_folders` once every input passed)."""
    existing = next(folder for folder in (path.parent.absolute(), *path.parent.absolute().parents) if folder.exists())
    longest = _name_max(existing)
    too_long = [part for part in path.absolute().relative_to(existing).parts if len(os.fsencode(part)) > longest]
    if too_long:  # before anything stats the path: a name past the limit is an OSError there
        problem = f"the name {too_long[0][:40]}... is longer than the file system allows ({longest} bytes)"
    elif path.is_dir():
        problem = "a folder of that name is in the way"
    elif not existing.is_dir():
        problem = f"{existing} is a file, not a folder"
    else:
        try:
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".autotune-check-"):
                return
        except OSError as error:
            problem = f"{describe_os_error(error)}: {existing}"
    raise OutputError(f"cannot write {path} ({problem}); choose a writable --out or --results-dir")


def _name_max(folder: Path) -> int:
    """The longest file name the file system under `folder` takes (255 bytes on most)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_replaceable(path: Path, *, force: bool) -> None:
    """Fail now, with one line, if the result would replace something it must not: anything but a regular file (a
    device, a pipe, a socket: the atomic rename would put a file in its place), or a file autotune did not write,
    unless `force` (--force). An earlier autotune result is what a rerun replaces.

    Raises:
        OutputError: what is there, and what to do instead.
    """
    if not os.path.lexists(path):
        return
    try:
        path.stat()
    except OSError as error:  # a dangling or looping link, a folder we may not search
        raise OutputError(f"--out {path} cannot be read ({describe_os_error(error)}); choose another --out") from None
    kind = special_file(path)
    if kind is not None:
        raise OutputError(f"--out {path} is not a regular file ({kind}); give the path of a YAML file to write")
    if force:
        return
    try:
        load_config(path)
    except UserError as error:
        said = str(error).split("; ")[0]
        raise OutputError(
            f"--out {path} holds a file autotune did not write ({said}); choose another --out, or pass --force to "
            "replace it"
        ) from None


def make_folders(paths: list[Path]) -> list[Path]:
    """Create the folders a run writes into; returns the ones this call created, outermost first."""
    created: list[Path] = []
    for folder in paths:
        missing = [p for p in (folder.absolute(), *folder.absolute().parents) if not p.exists()][::-1]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(f"cannot create {folder} ({describe_os_error(error)}); choose another path") from None
        created += [p for p in missing if p not in created]
    return created


def remove_empty(folders: list[Path]) -> None:
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if still empty


def write_result(tuned: TunedConfig, path: Path) -> Path:
    """The result YAML; a machine that refuses it (a full disk) is one line saying what survives: the measured
    trials stay in the study, whose best configuration a rerun re-measures first."""
    try:
        return write_config(tuned, path)
    except OutputError as error:
        raise MachineFailure(
            f"{error}; the winner was {tuned.config.short()} at {tuned.winner.samples_per_second or 0:,.1f} "
            "samples/s, and the measured trials stay in the study: free space (or choose another --out) and rerun, "
            "which re-measures it first"
        ) from None
