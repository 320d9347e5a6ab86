"""Workload registry: built-ins keyed by CLI name, plus `package.module:factory` plugins."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable

from autotune.errors import WorkloadError
from autotune.workloads.base import Workload

__all__ = ["WORKLOADS", "register", "get", "is_plugin", "names"]

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
    try:
        workload = factory()
    except (Exception, SystemExit) as error:  # sys.exit() in a factory must not end the run silently
        raise WorkloadError(f"plugin {reference!r}: the factory raised {type(error).__name__}: {error}") from None
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"plugin {reference!r}: the factory returned {type(workload).__name__}, not autotune.Workload; see the "
            "README's 'Your own model'"
        )
    return workload
