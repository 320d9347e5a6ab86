"""Starts autotune's probe in a training command's Python processes (its PYTHONPATH puts this folder first).

Python imports one `sitecustomize` at start-up: this one starts the probe, then runs the one it shadows (the next on
sys.path), so an environment's own site customisation still happens. It never raises: a probe that cannot start
says why on stderr and in its result file, and the training runs on unmeasured (the trial then fails with that line).
"""

import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


def _start_probe() -> None:
    if not os.environ.get("AUTOTUNE_PROBE"):
        return
    try:
        from autotune.probe import agent
    except Exception as error:  # noqa: BLE001 - anything at all: the training must not fail because of us
        print(f"autotune probe: cannot start in {sys.executable}: {type(error).__name__}: {error}", file=sys.stderr)
        return
    agent.install()


_run_shadowed()
_start_probe()
