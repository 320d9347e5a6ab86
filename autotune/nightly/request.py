"""What a nightly job is: the validated request and the command it runs, before cron or systemd is involved.

The job runs the interpreter scheduling it with `-P` (`python -P -m autotune`): `-m` alone would put the working
folder first on sys.path, and a `typer.py` or `torch.py` lying there would run as part of the nightly job. What the job
imports is named instead: autotune as installed in that interpreter and, for a plugin model, the folder its package
was imported from now (PYTHONPATH=that folder), so that a plugin beside the results still loads.

Everything a user typed is checked here, once, as the request is made (a one-line UserError each): the time, the
model, the folder, a password in --storage, control characters; nightly/schedule.py then writes it for cron or systemd.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune import workloads
from autotune.errors import UserError
from autotune.python_command import module_command
from autotune.storage import redact_url

__all__ = ["ScheduleRequest", "default_executable", "parse_at", "plugin_path", "unit_name_for"]

_AT = re.compile(r"(\d{1,2}):(\d{2})")
_UNSAFE_IN_RESULTS_FOLDER = re.compile(r"[^A-Za-z0-9+._-]")  # the folder name `autotune run` writes results into
_UNIT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def default_executable() -> tuple[str, ...]:
    """`python -P -m autotune` with the interpreter running now: a venv works without PATH, and the working folder
    never shadows a module (Python 3.10, without -P: the same through -c)."""
    return tuple(module_command("autotune"))


def plugin_path(model: str) -> tuple[str, ...]:
    """The folder a plugin model (`package.module:factory`) was imported from, for the job's PYTHONPATH; () for a
    built-in model or a plugin installed in site-packages, which the interpreter finds by itself."""
    if ":" not in model:
        return ()
    top = sys.modules.get(model.partition(":")[0].split(".")[0])
    origin = getattr(top, "__file__", None)
    if not origin:
        return ()
    folder = Path(origin).resolve().parent
    root = folder.parent if Path(origin).name == "__init__.py" else folder
    return () if root.name in ("site-packages", "dist-packages") else (str(root),)


def parse_at(text: str) -> tuple[int, int]:
    """'02:30' (24-hour HH:MM; '2:30' is accepted too) -> (2, 30).

    Raises:
        UserError: not a time of day between 00:00 and 23:59.
    """
    match = _AT.fullmatch(text.strip())
    if match is None or int(match[1]) > 23 or int(match[2]) > 59:
        raise UserError(f"--at {text!r} is not a time of day; write it as HH:MM between 00:00 and 23:59, e.g. 02:30")
    return int(match[1]), int(match[2])


def unit_name_for(model: str) -> str:
    """A systemd-safe unit name for a model: 'cam++' -> 'autotune-cam-plus-plus'."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower().replace("+", "-plus-")).strip("-")
    return f"autotune-{slug}" if slug else "autotune"


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleRequest:
    """One nightly `autotune run`, validated on construction (every problem is a one-line UserError).

    Args:
        model: a workload name (see `autotune models`) or a plugin as package.module:factory.
        at: time of day, 24-hour HH:MM, in the machine's local time zone (cron and systemd both use it).
        workdir: folder the job runs in (relative --data / --results-dir paths resolve there); made absolute.
        run_args: extra arguments for `autotune run`, e.g. ("--data", "/d/train.csv", "--budget", "30m").
        log_file: where stdout and stderr are appended; relative to workdir; default
            <workdir>/<results dir>/<model>/nightly.log, next to the results.
        executable: the argv that starts autotune; default `default_executable()`.
        python_path: folders for the job's PYTHONPATH; default `plugin_path(model)`.
        systemd: install a systemd user timer + service instead of a crontab line.
        unit_name: systemd unit name without suffix; derived from the model by default.
    """

    model: str
    at: str
    workdir: str = field(default_factory=lambda: _working_folder())
    run_args: tuple[str, ...] = ()
    log_file: str = ""
    executable: tuple[str, ...] = field(default_factory=default_executable)
    python_path: tuple[str, ...] | None = None
    systemd: bool = False
    unit_name: str = ""

    def __post_init__(self) -> None:
        parse_at(self.at)
        run_args = tuple(self.run_args)
        # With --command or --lightning the job tunes the user's own training and --model only names its results.
        own = any(arg.split("=", 1)[0] in ("--command", "--lightning") for arg in run_args)
        name = self.model if own else workloads.get(self.model).name  # one-line WorkloadError listing the names
        if {"--model", "-m"} & set(run_args) or any(arg.startswith("--model=") for arg in run_args):
            raise UserError("give the model once, as --model of 'autotune schedule', not among the run arguments")
        workdir = os.path.abspath(os.path.expanduser(self.workdir))
        if not os.path.isdir(workdir):
            raise UserError(f"working folder {workdir} does not exist; create it or run from an existing folder")
        if not self.executable or not os.path.isabs(self.executable[0]):
            raise UserError(f"the autotune command must start with an absolute path, got {list(self.executable)}")
        storage_url = _option_value(run_args, "--storage")
        if storage_url and redact_url(storage_url) != storage_url:
            # The job line is printed, kept in the crontab or unit file and shown by ps: no place for a password.
            raise UserError(
                f"--storage {redact_url(storage_url)} carries a password; leave it out of the URL and put it in "
                "~/.pgpass (or PGPASSWORD in the job's environment)"
            )
        results_dir = _option_value(run_args, "--results-dir") or "results"
        folder = _UNSAFE_IN_RESULTS_FOLDER.sub("_", name)
        log_file = self.log_file or os.path.join(results_dir, folder, "nightly.log")
        unit_name = self.unit_name or unit_name_for(self.model)
        if not _UNIT_NAME.fullmatch(unit_name):
            raise UserError(f"unit name {unit_name!r} may only use letters, digits, '_', '.' and '-'")
        object.__setattr__(self, "run_args", run_args)
        object.__setattr__(self, "workdir", workdir)
        object.__setattr__(self, "log_file", os.path.normpath(os.path.join(workdir, os.path.expanduser(log_file))))
        object.__setattr__(self, "executable", tuple(self.executable))
        python_path = plugin_path(self.model) if self.python_path is None else tuple(self.python_path)
        object.__setattr__(self, "python_path", python_path)
        for folder in python_path:
            _check_no_control("import folder", folder)
        object.__setattr__(self, "unit_name", unit_name)
        for what, value in (("workdir", workdir), ("log file", self.log_file), ("model", self.model)):
            _check_no_control(what, value)
        for value in (*self.executable, *run_args):
            _check_no_control("argument", value)

    @property
    def argv(self) -> list[str]:
        """The nightly command, one list item per argument."""
        return [*self.executable, "run", "--model", self.model, *self.run_args]

    @property
    def marker(self) -> str:
        """The trailing comment that identifies this model's line in a crontab."""
        return f"# autotune:{self.model}"


def _working_folder() -> str:
    """The folder the job runs in: this one, which must still exist (a shell can stand in a deleted folder)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UserError("the current folder no longer exists; cd to an existing folder and schedule again") from None


def _option_value(args: Sequence[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(f"{name}="):
            return arg[len(name) + 1 :]
    return None


def _check_no_control(what: str, value: str) -> None:
    if _CONTROL.search(value):
        raise UserError(f"{what} {value!r} contains a control character (newline, tab...); remove it")
