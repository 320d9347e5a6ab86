"""Every accepted result, kept: one JSON line per run in <results>/<model>/history.jsonl, read back as a table.

The result YAML of a machine is overwritten by each run; the history keeps the evidence of every run (date,
hardware fingerprint, software versions, winner and baseline throughput), so a nightly rerun shows a regression
after a driver, CUDA or PyTorch upgrade.

Example::

    path = write_config(tuned, "results/cam++/cpu-x2-cec72d5a08.yaml")
    history.record(tuned, path)                       # appends to results/cam++/history.jsonl
    frame = history.load(Path("results"), "cam++")    # every fingerprint, oldest first
    rich.console.Console().print(history.render_table(frame))
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from rich.markup import escape
from rich.table import Table

from autotune import workloads
from autotune.errors import UserError
from autotune.result.tuned_config import TunedConfig
from autotune.yamlio import special_file

__all__ = ["COLUMNS", "HISTORY_FILE", "folder_name", "history_row", "load", "record", "render_table"]

logger = logging.getLogger(__name__)

HISTORY_FILE = "history.jsonl"
COLUMNS = (
    "created",
    "model",
    "fingerprint",
    "device_type",
    "torch_version",
    "cuda_version",
    "driver_version",
    "config",
    "samples_per_second",
    "spread_fraction",
    "baseline_samples_per_second",
    "speedup",
    "autotune_version",
    "result_path",
)
_NUMERIC = ("samples_per_second", "spread_fraction", "baseline_samples_per_second", "speedup")


def history_row(tuned: TunedConfig, result_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The history record of one accepted result: plain JSON values, keyed by COLUMNS."""
    metrics, hardware = tuned.metrics, tuned.hardware
    winner, baseline = tuned.winner, tuned.baseline
    return {
        "created": tuned.created,
        "model": tuned.workload.get("name"),
        "fingerprint": _fingerprint(tuned),
        "device_type": tuned.device_type,
        "torch_version": _text(hardware.get("torch_version")),
        "cuda_version": _text(hardware.get("cuda_version")),
        "driver_version": _text(hardware.get("driver_version")),
        "config": tuned.config.short(),
        "samples_per_second": winner.samples_per_second,
        "spread_fraction": winner.spread_fraction,
        "baseline_samples_per_second": baseline.samples_per_second if baseline.ok else None,
        "speedup": metrics.get("speedup"),
        "autotune_version": tuned.autotune_version,
        "result_path": str(result_path),
    }


def _fingerprint(tuned: TunedConfig) -> str | None:
    """The hardware a result ran on: a multi-node result's is its nodes' fingerprint and their count (-nodes2), so
    that its throughput is never compared with (or flagged as a regression against) one node's."""
    fingerprint = tuned.hardware.get("fingerprint")
    return f"{fingerprint}-nodes{tuned.nodes}" if fingerprint and tuned.nodes > 1 else fingerprint


def _text(value: Any) -> str | None:
    return None if value is None else str(value)  # torch's version is a str subclass


def record(tuned: TunedConfig, result_path: str | os.PathLike[str], results_dir: str | os.PathLike[str]) -> Path:
    """Append one JSON line for an accepted result to RESULTS_DIR/MODEL/history.jsonl (wherever --out put the YAML).

    The line is appended (O_APPEND, one write, fsync) under an exclusive flock rather than rewriting the file: earlier
    lines are never touched, two runs finishing together cannot drop each other's line (a read + rename would), and
    a crash mid-write leaves at most one torn last line, which load() skips and the next record starts after.

    Returns:
        The history file.
    """
    path = _history_path(results_dir, tuned.workload["model"])
    line = json.dumps(history_row(tuned, result_path), ensure_ascii=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    _append_line(path, line)
    return path


def _append_line(path: Path, line: str) -> None:
    data = (line + "\n").encode("utf-8")
    handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by close
        size = os.fstat(handle).st_size
        if size and os.pread(handle, 1, size - 1) != b"\n":
            data = b"\n" + data  # a torn line from a crash stays on its own line, and stays skipped
        while data:
            data = data[os.write(handle, data) :]
        os.fsync(handle)
    finally:
        os.close(handle)


def folder_name(name: str) -> str:
    """A workload's folder under --results-dir, where its results, history and trials go: anything but letters,
    digits and +._- becomes _, and a name of dots alone (`..` would be the parent) becomes underscores."""
    safe = re.sub(r"[^A-Za-z0-9+._-]", "_", name)
    return safe if safe.strip(".") else "_" * max(1, len(safe))


def _history_path(results_dir: str | os.PathLike[str], model: str) -> Path:
    # A plugin's results live under its own name.
    name = workloads.get(model).name if workloads.is_plugin(model) else model
    return Path(results_dir) / folder_name(name) / HISTORY_FILE


def _read_rows(path: Path) -> Iterator[dict[str, Any]]:
    kind = special_file(path)
    if kind is not None:  # a pipe or a device (a link to /dev/zero) would be read forever
        raise UserError(f"history {path} is not a regular file ({kind}); remove it, and autotune run starts a new one")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as error:
        raise UserError(f"cannot read history {path} ({error.strerror or error}); check its permissions") from None
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            row = None
        if not isinstance(row, dict):
            logger.warning("%s line %d is not a history record; skipped", path, number)
            continue
        scalars = {key: value for key, value in row.items() if value is None or isinstance(value, (str, int, float))}
        if len(scalars) < len(row):  # a list or a mapping where a cell belongs: shown as unknown, not a crash
            logger.warning(
                "%s line %d: %s not single values; shown as unknown", path, number, sorted(row.keys() - scalars.keys())
            )
        yield scalars


def load(results_dir: str | os.PathLike[str], model: str) -> pd.DataFrame:
    """Every history row of a model (all fingerprints), oldest first; an empty frame with COLUMNS when none.

    Args:
        results_dir: the --results-dir of `autotune run` ("results" by default).
        model: a workload name or a plugin reference (package.module:factory).

    Returns:
        One row per recorded run: `created` as UTC datetimes, throughput columns as floats.
    """
    frame = pd.DataFrame(list(_read_rows(_history_path(results_dir, model))), columns=list(COLUMNS))
    frame["created"] = pd.to_datetime(frame["created"], utc=True, errors="coerce", format="ISO8601")
    for column in _NUMERIC:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    return frame.sort_values("created", kind="stable", na_position="last").reset_index(drop=True)


def _text_cell(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else escape(str(value))  # a cell is rich markup: show '[' as is


def _number_cell(value: Any, template: str) -> str:
    return "-" if value is None or pd.isna(value) else template.format(value)


_TEXT_COLUMNS = {
    "hardware": "fingerprint",
    "torch": "torch_version",
    "CUDA": "cuda_version",
    "driver": "driver_version",
    "winner": "config",
}
_NUMBER_COLUMNS = {
    "samples/s": ("samples_per_second", "{:,.1f}"),
    "spread": ("spread_fraction", "{:.1%}"),
    "baseline": ("baseline_samples_per_second", "{:,.1f}"),
    "speedup": ("speedup", "{:.2f}x"),
}


def render_table(frame: pd.DataFrame, *, title: str | None = None) -> Table:
    """A rich table of load()'s frame.

    The last column compares each run's throughput with the previous run on the same hardware fingerprint; it is red
    where the drop is larger than the run's own measurement spread (a regression, not noise).
    """
    if title is None:
        models = frame["model"].dropna().unique()
        title = f"autotune history: {escape(str(models[0]))}" if len(models) == 1 else "autotune history"
    table = Table(title=title)
    table.add_column("date (UTC)")
    for header in _TEXT_COLUMNS:
        table.add_column(header)
    for header in (*_NUMBER_COLUMNS, "vs previous"):
        table.add_column(header, justify="right")
    previous = frame.groupby("fingerprint", sort=False, dropna=False)["samples_per_second"].shift(1)
    changes = frame["samples_per_second"] / previous - 1
    for (_, row), change in zip(frame.iterrows(), changes, strict=True):
        noise = 0.0 if pd.isna(row["spread_fraction"]) else row["spread_fraction"]
        change_cell = _number_cell(change, "{:+.1%}")
        table.add_row(
            "-" if pd.isna(row["created"]) else row["created"].strftime("%Y-%m-%d %H:%M"),
            *(_text_cell(row[key]) for key in _TEXT_COLUMNS.values()),
            *(_number_cell(row[key], template) for key, template in _NUMBER_COLUMNS.values()),
            f"[red]{change_cell}[/red]" if change < -noise else change_cell,
        )
    return table
