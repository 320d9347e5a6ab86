"""Folders autotune generates once into its cache (the synthetic corpus, the synthetic noise and room responses).

A folder is generated into a hidden temp folder beside its final name and renamed into place only once its manifest
(written last) exists, so a run killed half-way never leaves a folder that looks finished, and two processes racing
to generate it (trial ranks, parallel runs) both end up using one complete folder.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.errors import DataError

__all__ = [
    "build_folder_atomically",
    "canonical_params",
    "default_cache_dir",
    "ensure_generated",
    "params_digest",
    "read_manifest",
    "temp_sibling",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"


def default_cache_dir() -> Path:
    """Where autotune caches generated data.

    Returns:
        ``$AUTOTUNE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``.
    """
    if os.environ.get("AUTOTUNE_CACHE_DIR"):
        return Path(os.environ["AUTOTUNE_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "autotune"
    return Path.home() / ".cache" / "autotune"


def canonical_params(signature: inspect.Signature, **kwargs: Any) -> dict[str, Any]:
    """A generator's parameters in canonical, JSON-ready form: its keyword defaults updated by kwargs, each cast to
    its default's type (a TypeError on unknown names, as a call would raise). The generator's first parameter is
    the output folder and is left out."""
    bound = signature.bind_partial("unused-out-dir", **kwargs)
    bound.apply_defaults()
    del bound.arguments[next(iter(signature.parameters))]
    return {name: type(signature.parameters[name].default)(value) for name, value in bound.arguments.items()}


def params_digest(params: dict[str, Any]) -> str:
    """10 hex digits naming a set of generation parameters in a cache folder's name."""
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A generated folder's manifest, or None when it is missing or unreadable (the folder is unfinished)."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def temp_sibling(final: Path) -> Path:
    """A hidden temp path beside `final`, named for this host and process (so stale ones can be found and removed)."""
    return final.with_name(f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _remove_stale_temp_folders(cache: Path, final_name: str) -> None:
    """Delete temp folders left by killed runs on this host (their pid is gone); they can hold hundreds of MB."""
    prefix = f".{final_name}.tmp-{socket.gethostname()}-"
    for folder in cache.glob(f"{prefix}*"):
        pid_text = folder.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            logger.info("removing half-built %s left by a killed run", folder)
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # alive, owned by someone else


def build_folder_atomically(
    final: Path,
    *,
    build: Callable[[Path], Any],
    is_complete: Callable[[Path], bool],
    failure: Callable[[OSError], Exception],
) -> None:
    """Make `final` by calling `build` on an empty temp sibling and renaming it into place.

    Half-built temp folders of killed runs on this host are removed first, and so is a folder at `final` that is not
    complete (something other than this function wrote it). Losing a race to another process that finished the same
    folder is not an error.

    Args:
        build: writes the folder's content (its completion mark, e.g. a manifest, last) into the folder it is given.
        is_complete: whether a folder is finished and of the wanted version and parameters.
        failure: the error to raise for an OSError that left no complete folder (a full disk, a read-only cache).
    """
    temp = temp_sibling(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temp_folders(final.parent, final.name)
        if final.exists() and not is_complete(final):
            logger.warning("removing incomplete folder %s", final)
            shutil.rmtree(final)
        temp.mkdir()
        build(temp)
        os.rename(temp, final)
    except OSError as error:
        if not is_complete(final):  # not a lost race with another process: a real failure
            raise failure(error) from error
        logger.info("another process finished %s first; using it", final)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def ensure_generated(
    final: Path, *, is_complete: Callable[[Path], bool], generate: Callable[[Path], Any], size_mb: int, what: str
) -> Path:
    """Return ``final``, generating it first (build_folder_atomically) unless it already holds a finished folder.

    Args:
        final: the folder's path in the cache.
        is_complete: whether a folder is finished and of the wanted version and parameters.
        generate: writes the folder's content (manifest last) into the path it is given.
        size_mb: disk it needs, named in the error when the cache cannot be written.
        what: what it is, for the log ("the synthetic default corpus").

    Raises:
        DataError: the cache cannot be written; the message says how much room it needs and where else to put it.
    """
    if is_complete(final):
        return final
    logger.info("generating %s into %s (first use only)", what, final)

    def failure(error: OSError) -> DataError:
        return DataError(
            f"cannot write {what} into {final.parent} ({error.strerror or error}); it needs about {size_mb} MB: free "
            "disk space or set AUTOTUNE_CACHE_DIR to a writable folder"
        )

    build_folder_atomically(final, build=generate, is_complete=is_complete, failure=failure)
    return final
