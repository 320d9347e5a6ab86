"""Reading search-space files: `extends:` resolved, so that a space says only what differs from the one it builds on.

A space file may name another as its base::

    extends: cam++            # the built-in cam++ space, with bigger batches
    workload: cam++
    params:
      per_device_batch_size: {type: categorical, choices: [256, 512, 1024]}

`extends` names a built-in space (search_spaces/<name>.yaml: `cam++`, `ecapa-tdnn`, or a shared base such as
`shared/core`) or a .yaml file, relative to the file that names it. The base is read first (it may extend another),
then the file is merged over it:

- mappings (params, fixed, baseline, cpu, cuda and the params, fixed and baseline inside cpu and cuda) merge key by key;
- a parameter's distribution (an entry under `params`) is replaced whole, never field by field: the base's `choices`
  beside the file's `low`/`high` would be neither distribution;
- lists (seeds, choices) and single values are replaced whole;
- `null` removes the base's key (a knob the base searches that this space fixes instead); a `null` for a key the
  base does not have is an error, since it is a misspelling more often than not;
- order: within a section, the keys a file adds come first, in its order, then the base's keys in the base's order
  (a key both name keeps the base's place, with the file's value). Order matters for `params`: a `when` may name only
  an earlier parameter, and Optuna is asked in declaration order; a model's own batch knobs (which the shared loading
  knobs never depend on) come first this way. The sections themselves (top level, and inside `cpu` and `cuda`) come
  in the order of SECTIONS and DEVICE_SECTIONS, as every built-in space spells them out, so that the result file
  records them in the order results already on disk have;
- `workload` and `description` belong to the file that says them and are never inherited.

The result is one plain mapping without `extends`, exactly what the file would say spelled out; it is what the result
file records as the space searched. Files without `extends` are read as they always were.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.errors import SpaceError

__all__ = ["DEVICE_SECTIONS", "SECTIONS", "SPACES_DIR", "builtin_names", "read", "resolve"]

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
# A space file's sections, in the order a merged space lists them; autotune.space.search_space accepts these and no
# others.
SECTIONS = ("workload", "description", "params", "fixed", "recipe_batch", "baseline", "seeds", "cpu", "cuda")
DEVICE_SECTIONS = ("params", "fixed", "baseline", "seeds")  # what `cpu:` and `cuda:` may hold
NOT_INHERITED = ("workload", "description")
MAX_EXTENDS = 32  # files in one chain of `extends`: a space and the ones it builds on
_SUFFIXES = (".yaml", ".yml")


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A space file as one mapping, its `extends` chain merged in; every problem is a one-line SpaceError."""
    return _read(Path(path), chain=())


def resolve(data: dict[str, Any], *, origin: str, folder: Path) -> dict[str, Any]:
    """`data` with its `extends` merged in (unchanged without one); a relative file reference is read from `folder`."""
    return _resolve(data, origin=origin, folder=folder, chain=())


def builtin_names() -> list[str]:
    """The names `extends` accepts for built-in spaces: the models' spaces, then the shared bases."""
    files = [*sorted(SPACES_DIR.glob("*.yaml")), *sorted(SPACES_DIR.glob("*/*.yaml"))]
    return [path.relative_to(SPACES_DIR).with_suffix("").as_posix() for path in files]


def _read(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if len(chain) >= MAX_EXTENDS:
        raise SpaceError(
            f"{chain[0]}: 'extends' goes {len(chain)} files deep; a space builds on at most {MAX_EXTENDS - 1} others"
        )
    data = yamlio.read_mapping(path, what="search space", error=SpaceError)
    return _resolve(data, origin=str(path), folder=path.parent, chain=(*chain, path.resolve()))


def _resolve(data: dict[str, Any], *, origin: str, folder: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if "extends" not in data:
        return data
    own = {key: value for key, value in data.items() if key != "extends"}
    base_path = _base_path(data["extends"], origin, folder)
    if base_path.resolve() in chain:
        names = " -> ".join(str(path) for path in (*chain, base_path.resolve()))
        raise SpaceError(f"{origin}: 'extends' goes round in a circle ({names}); a space cannot build on itself")
    base = _read(base_path, chain)
    inherited = {key: value for key, value in base.items() if key not in NOT_INHERITED}
    merged = _in_order(_merge(inherited, own, origin, where="", whole_values=False), SECTIONS)
    for device in ("cpu", "cuda"):
        if isinstance(merged.get(device), dict):
            merged[device] = _in_order(merged[device], DEVICE_SECTIONS)
    return merged


def _in_order(mapping: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """`mapping` with the keys of `order` first, in that order; any other key (refused later, by name) after them."""
    return {
        **{key: mapping[key] for key in order if key in mapping},
        **{key: value for key, value in mapping.items() if key not in order},
    }


def _base_path(reference: Any, origin: str, folder: Path) -> Path:
    """The file `extends` names: a path ending in .yaml (relative to the naming file), else a built-in space."""
    if not isinstance(reference, str) or not reference.strip():
        raise SpaceError(
            f"{origin}: 'extends' must name a space: a built-in ({', '.join(builtin_names())}) or a .yaml file"
        )
    if reference.endswith(_SUFFIXES):
        path = folder / Path(reference).expanduser()
        if not path.is_file():
            raise SpaceError(
                f"{origin}: extends {reference!r}, but {path} is not a file; give a path relative to this file"
            )
        return path
    path = SPACES_DIR / f"{reference}.yaml"
    inside = path.resolve().is_relative_to(SPACES_DIR.resolve())
    if not inside or not path.is_file():
        raise SpaceError(
            f"{origin}: extends {reference!r}, which is no built-in space; use one of {', '.join(builtin_names())} "
            "or a path ending in .yaml"
        )
    return path


def _merge(base: dict[str, Any], own: dict[str, Any], origin: str, *, where: str, whole_values: bool) -> dict[str, Any]:
    """`own` over `base` by the rules in the module docstring; `whole_values`: entries are replaced, never merged
    (a parameter's distribution)."""
    merged: dict[str, Any] = {}
    for key, value in own.items():  # what this file adds comes first
        if key in base:
            continue
        if value is None:
            raise SpaceError(
                f"{origin}: {where}{key} is null, which removes a key of the base space, but the base has no {key!r}; "
                "check the spelling or leave it out"
            )
        merged[key] = value
    for key, value in base.items():
        if key not in own:
            merged[key] = value
        elif own[key] is None:
            continue  # removed
        elif isinstance(value, dict) and isinstance(own[key], dict) and not whole_values:
            merged[key] = _merge(value, own[key], origin, where=f"{where}{key}.", whole_values=key == "params")
        else:
            merged[key] = own[key]
    return merged
