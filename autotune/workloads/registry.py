"""Workload registry: built-ins keyed by CLI name, plus `package.module:factory` plugins."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import TypeVar

from autotune.errors import WorkloadError
from autotune.workloads.base import Workload

__all__ = ["WORKLOADS", "call_plugin", "register", "get", "is_plugin", "names"]

WORKLOADS: dict[str, Workload] = {}


def register(factory: Callable[[], Workload]) -> Callable[[], Workload]:
    """Decorator: call the factory once and file its workload under its name."""
    workload = factory()
    if workload.name in WORKLOADS:
        raise ValueError(f"workload {workload.name!r} registered twice")
    WORKLOADS[workload.name] = workload
    return factory


def names() -> list[str]:
    return sorted(WORKLOADS)


def is_plugin(model: str) -> bool:
    """Whether a --model is a user's `package.module:factory` rather than a built-in name: its results live under
    its workload's own name, its baseline is held strictly, and autotune's own data machinery (preloading) may not
    apply to its dataset."""
    return ":" in model


def get(name: str) -> Workload:
    """A built-in workload by name, or a plugin given as `package.module:factory`.

    Raises:
        WorkloadError: unknown name (the message lists the valid ones), or a plugin that cannot be imported or
            whose factory does not return a Workload.
    """
    if name in WORKLOADS:
        return WORKLOADS[name]
    if not is_plugin(name):
        raise WorkloadError(
            f"unknown model {name!r}; choose one of {', '.join(names())} or give a plugin as package.module:factory"
        )
    return _load_plugin(name)


def _load_plugin(reference: str) -> Workload:
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as error:  # a plugin's import may fail in any way; the user must see which and why
        raise WorkloadError(
            f"cannot import plugin module {module_name!r} ({type(error).__name__}: {error}); check the name and "
            "that it is on PYTHONPATH"
        ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise WorkloadError(f"plugin {reference!r}: module {module_name!r} has no callable {attribute!r}")
    if not (inspect.isroutine(factory) or inspect.isclass(factory) or isinstance(factory, functools.partial)):
        # an object that is merely callable (a typer app, a model) would run as it runs, not build a workload
        raise WorkloadError(
            f"plugin {reference!r}: {attribute!r} is a {type(factory).__name__}, not a function or class that returns "
            "an autotune.Workload"
        )
    return call_plugin(
        factory, f"plugin {reference!r}: the factory", Workload, "not autotune.Workload; see docs/adding-a-model.md"
    )


_T = TypeVar("_T")


def call_plugin(call: Callable[[], object], what: str, expected: type[_T], fix: str) -> _T:
    """A plugin's code, called: whatever it raises (sys.exit too: a run must not end silently) is one line naming
    `what` raised it, and a result of another type says what it returned and `fix`.

    Raises:
        WorkloadError: "{what} raised Type: message", or "{what} returned Type, {fix}".
    """
    try:
        result = call()
    except (Exception, SystemExit) as error:
        said = " ".join(str(error).split())[:300]
        raise WorkloadError(f"{what} raised {type(error).__name__}: {said}") from None
    if not isinstance(result, expected):
        raise WorkloadError(f"{what} returned {type(result).__name__}, {fix}")
    return result
