"""How autotune starts Python: `python -m MODULE ARGS` with the interpreter running now, the working folder never on
the import path.

`python -m` alone puts the folder it was started from first on sys.path: a `json.py`, `typer.py`, `logging.py` or
`torch.py` lying there (a recipe folder often has one) would run in place of the real module, inside a trial, the AMP
check or the nightly job. Python 3.11+ has `-P` for this; Python 3.10 (which autotune supports) has not, so there
the same is done in code: `python -c` drops the folder from sys.path before anything else is imported, then runs
MODULE as `-m` would. What a child imports is what its parent's sys.path names (PYTHONPATH, trial/launch.py).
"""

from __future__ import annotations

import sys

__all__ = ["module_command", "module_command_without_flag"]

_WITHOUT_FLAG = (
    "import sys; del sys.path[0]; import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def module_command(module: str, *args: str) -> list[str]:
    """The argv of `python -P -m MODULE ARGS` (Python 3.11+), or its Python 3.10 form."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return module_command_without_flag(module, *args)


def module_command_without_flag(module: str, *args: str) -> list[str]:
    """The Python 3.10 form (any version runs it): `python -c` that drops the working folder, then runs MODULE as
    __main__ with ARGS as its arguments (sys.argv[0] its file, as under `-m`)."""
    return [sys.executable, "-c", _WITHOUT_FLAG.format(module=module), *args]
