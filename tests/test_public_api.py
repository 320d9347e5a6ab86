"""The public interface: docs/api.md names exactly what the packages export (`__all__`), and every name imports."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
PACKAGES = ("autotune", "autotune.workloads", "autotune.exports")


def _documented() -> set[str]:
    """Every backticked name in the page's tables' first column (`name(args)` and `pkg.name` count as `name`)."""
    names: set[str] = set()
    for line in API_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first_cell):
            names.add(token.split("(")[0].split(".")[-1])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_imports_and_is_documented(package):
    module = importlib.import_module(package)
    documented = _documented()
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names {name}, which it lacks"
        assert name in documented, f"{package}.{name} is exported but docs/api.md does not list it"


def test_the_page_lists_nothing_that_is_not_exported():
    exported = {name for package in PACKAGES for name in importlib.import_module(package).__all__}
    assert _documented() - exported == set()


def test_the_readme_points_at_the_page():
    readme = (API_PAGE.parent.parent / "README.md").read_text(encoding="utf-8")
    assert "docs/api.md" in readme


@pytest.mark.parametrize("module", ["autotune", "autotune.cli"])
def test_importing_the_package_or_the_command_loads_no_heavy_library(module):
    """`import autotune` in a user's training code, and `autotune --help`, load no torch, pandas, optuna or
    matplotlib: those come inside the functions that use them."""
    import subprocess
    import sys

    heavy = ("torch", "pandas", "optuna", "matplotlib")
    code = f"import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
