"""The package's layers: every module in the package of its concept, and every import pointing down the order.

The order (docs/layout.md draws it) is what lets a newcomer read one folder without the ones above it, and lets
the trial child import what it needs without the parent's search. An import inside a function or under
TYPE_CHECKING is still an arrow: a late import hides a cycle, it does not remove it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"

# Top to bottom: a package may import from the packages below it, never from one above it or beside it (on its line).
ORDER = (
    ("cli",),
    ("gpu_proof",),
    ("doctor",),
    ("nightly",),
    ("run",),
    ("search", "exports"),
    ("result",),
    ("storage",),
    ("probe",),
    ("trial",),
    ("workloads",),
    ("models",),
    ("space",),
    ("data",),
    ("machine",),
    ("knobs",),
    ("yamlio", "python_command"),
    ("errors",),
)
RANK = {name: len(ORDER) - level for level, names in enumerate(ORDER) for name in names}
# Modules directly in autotune/: the public API, the entry point and what every layer shares.
TOP_LEVEL = {"__init__", "__main__", "errors", "yamlio", "python_command"}
MAX_TOP_LEVEL = 8
# What the package's own modules may take from `autotune` itself (its __init__ imports exports, results, workloads).
FROM_ROOT = {"__version__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _target(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """Every autotune module `module` imports, wherever the import stands: (target, line, names taken from it)."""
    path = MODULES[module]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "autotune":
                    yield alias.name, node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            target = _target(module, node, path.name == "__init__.py")
            if target.split(".")[0] != "autotune":
                continue
            for alias in node.names:  # `from autotune.trial import spec` imports the module autotune.trial.spec
                submodule = f"{target}.{alias.name}"
                yield (submodule, node.lineno, ()) if submodule in MODULES else (target, node.lineno, (alias.name,))


def layer(module: str) -> str:
    """The package (or top-level module) a module belongs to: autotune.search.tuner -> search."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else ""


def test_every_module_sits_in_a_ranked_package_or_is_one_of_the_few_top_level_ones():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL, f"a module directly in autotune/ belongs in the package of its concept: {top - TOP_LEVEL}"
    assert len(top) <= MAX_TOP_LEVEL
    unranked = sorted({layer(module) for module in MODULES if layer(module) and layer(module) not in RANK})
    assert not unranked, f"packages missing from ORDER (place each where its imports allow): {unranked}"


def upward_imports() -> list[str]:
    found = []
    for module in MODULES:
        here = layer(module)
        for target, line, names in imports(module):
            there = layer(target)
            if here == there or module == "autotune.__main__":
                continue
            if not there:  # the root package: its version only
                if here and not set(names) <= FROM_ROOT:
                    found.append(f"{module}:{line} takes {', '.join(names)} from autotune itself")
                continue
            if here and RANK[there] >= RANK[here]:
                found.append(f"{module}:{line} imports {target} ({here} -> {there})")
    return found


def test_every_import_points_down_the_order():
    assert upward_imports() == []


def test_the_check_sees_late_and_type_only_imports(tmp_path, monkeypatch):
    """An upward import in a function or under TYPE_CHECKING is found like one at the top of a module."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from autotune.search.tuner import Tuner\n"
        "def f():\n    from autotune.run import runner\n"
    )
    path = tmp_path / "late.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "autotune.knobs.late", path)
    found = upward_imports()
    assert len(found) == 2 and all(line.startswith("autotune.knobs.late:") for line in found), found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_a_module(module):
    """A name with a leading underscore is its module's own: another module needing it needs a public name."""
    taken = [
        f"{target}.{name}:{line}"
        for target, line, names in imports(module)
        for name in names
        if name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert taken == []
