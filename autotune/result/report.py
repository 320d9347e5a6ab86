"""Reports on a tuning study: the trial table (pandas), PNG plots (matplotlib) and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from autotune.errors import OutputError, UserError, describe_os_error
from autotune.knobs import declarations as knobs
from autotune.result.history import folder_name
from autotune.result.measurements import Measurements
from autotune.result.plots import GIB, Marks, hardware_line, make_plots
from autotune.result.tuned_config import TunedConfig, load_config
from autotune.storage import local_file, open_storage, redact_url, storage_errors
from autotune.yamlio import atomic_write_text, special_file

__all__ = ["ReportFiles", "TRIAL_COLUMNS", "build_report", "load_study", "trials_frame", "write_csv", "write_html"]

logger = logging.getLogger(__name__)

# Column name -> pandas dtype. Nullable dtypes, because a trial that failed before measuring has no result. One column
# per declared knob (knobs/declarations.py); a workload's own knobs follow these columns (trials_frame).
TRIAL_COLUMNS: dict[str, str] = {
    "number": "int64",
    "state": "string",
    "role": "string",
    "status": "string",
    "reason": "string",
    "samples_per_second": "float64",
    "data_wait_fraction": "float64",
    "peak_memory_gib": "float64",
    "window_samples_per_second": "float64",  # steady state, beside the objective that charges compiling over the run
    "compile_s": "float64",
    "recompiles": "Int64",
    "epoch_start_s": "float64",  # a new epoch's first batch, charged per epoch in samples_per_second (where measured)
    **{knob.name: knob.column_dtype for knob in knobs.KNOBS},
    "wall_s": "float64",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportFiles:
    """What build_report wrote."""

    out_dir: Path
    html: Path
    plots: tuple[Path, ...]
    csv: Path | None
    trials: int


def load_study(tuned: TunedConfig, storage: str | None) -> optuna.Study:
    """Open the study a result came from.

    Args:
        tuned: the result; its `search` section names the study and its (password-redacted) storage.
        storage: an explicit storage URL; None uses the result's own.

    Raises:
        UserError: the storage is redacted or unreachable, or the study is not in it.
    """
    name = tuned.search.get("study_name")
    url = storage or tuned.search.get("storage")
    if not name or not url:
        raise UserError("the result names no study or storage (written by an older autotune?); pass --storage URL")
    if storage is None and ":***@" in url:
        raise UserError(f"the result's storage {url} has its password redacted; pass --storage with the full URL")
    shown = redact_url(url)
    file = local_file(url)
    if file is not None and not file.exists():
        # Opening a missing SQLite or journal file would create an empty one; say so instead.
        raise UserError(f"storage {shown} does not exist; pass --storage with the study's database URL")
    with storage_errors(url, doing="open", fix="check --storage"):
        try:
            return optuna.load_study(study_name=name, storage=open_storage(url))
        except KeyError:
            raise UserError(
                f"study {name!r} is not in storage {shown}; pass --storage with the database it ran in"
            ) from None


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per finished trial (running and waiting ones are left out), with the columns of TRIAL_COLUMNS, then
    one per workload knob the trials ran with (e.g. max_frames_in_batch), its dtype inferred (nullable)."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    trials = study.get_trials(deepcopy=False, states=states)
    rows = [_trial_row(trial) for trial in trials]
    workload_knobs = list(dict.fromkeys(name for trial in trials for name in _workload_knobs(trial)))
    frame = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, *workload_knobs]).astype(TRIAL_COLUMNS)
    if workload_knobs:
        frame[workload_knobs] = frame[workload_knobs].convert_dtypes()
    return frame.sort_values("number", ignore_index=True)


def _workload_knobs(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    config = trial.user_attrs.get("config") or {}
    return {name: value for name, value in knobs.flat_values(config).items() if name not in knobs.NAMES}


def _trial_row(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    config = trial.user_attrs.get("config") or {}
    result = trial.user_attrs.get("result") or {}
    peak = result.get("peak_memory_bytes")
    wall = result.get("wall_s")
    if wall is None and trial.duration is not None:
        wall = trial.duration.total_seconds()
    return {
        "number": trial.number,
        "state": trial.state.name,
        "role": trial.user_attrs.get("role"),
        "status": result.get("status"),
        "reason": result.get("reason"),
        "samples_per_second": result.get("samples_per_second"),
        "data_wait_fraction": result.get("data_wait_fraction"),
        "peak_memory_gib": peak / GIB if peak is not None else None,
        "window_samples_per_second": result.get("window_samples_per_second"),
        "compile_s": result.get("compile_s"),
        "recompiles": result.get("recompiles"),
        "epoch_start_s": result.get("epoch_boundary_s"),
        **knobs.flat_values(config),
        "wall_s": wall,
    }


_CSV_HEADER = ",".join(TRIAL_COLUMNS)  # how a trial table this command wrote starts


def _check_csv(path: Path | None) -> None:
    """Before anything is written: --csv names a file to create, or a trial table this command wrote before, never a
    user's file, a pipe or a device.

    Raises:
        OutputError: what is there, and what to do instead.
    """
    if path is None:
        raise OutputError("--csv is empty; give the path of a CSV file to write, or leave the option out")
    special = special_file(path)
    if special is not None:
        raise OutputError(f"--csv {path} is not a regular file ({special}); give the path of a CSV file to write")
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as table:
            first = table.readline(4096).rstrip("\n")
        if not first.startswith(_CSV_HEADER):
            raise OutputError(f"--csv {path} holds a file autotune did not write; choose another --csv")


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """The trial table as CSV, written atomically."""
    return atomic_write_text(path, frame.to_csv(index=False))


def write_html(frame: pd.DataFrame, tuned: TunedConfig, plots: Sequence[Path], path: str | Path) -> Path:
    """One self-contained HTML page: headline, winner's configuration, plots (embedded), trial table."""
    title = f"autotune report: {tuned.workload.get('name', 'workload')} on {hardware_line(tuned)}"
    images = "\n".join(
        f'<figure><img alt="{html.escape(plot.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(plot.read_bytes()).decode("ascii")}"></figure>'
        for plot in plots
    )
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in tuned.notes)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        _headline_html(tuned),
        _winner_html(tuned),
        f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
        f"<h2>Plots</h2>{images}",
        f"<h2>Trials ({len(frame)})</h2>",
        _table_html(frame, Marks.find(frame, tuned)),
    ]
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_CSS}</style></head>\n<body>\n" + "\n".join(part for part in body if part) + "\n</body></html>\n"
    )
    return atomic_write_text(path, page)


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
    ".headline{font-size:1.25em;background:#f4f7fb;padding:.8em 1em;border-left:4px solid #d62728}"
    "table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}"
    "tr.winner td{background:#fde8e8;font-weight:bold}tr.baseline td{background:#eeeeee}"
    "figure{margin:1em 0}img{max-width:100%}"
)


def _metric(measured: Measurements, name: str) -> str:
    value = measured.samples_per_second
    return f"{value:.1f} samples/s" if isinstance(value, (int, float)) else f"{name} not measured"


def _headline_html(tuned: TunedConfig) -> str:
    speedup = tuned.metrics.get("speedup")
    faster = f"<b>{speedup:.2f}&times;</b> the baseline's throughput" if speedup else "no baseline to compare with"
    return (
        f'<p class="headline">winner {_metric(tuned.winner, "winner")} vs baseline '
        f"{_metric(tuned.baseline, 'baseline')}: {faster}</p>"
        f"<p>Hardware: {html.escape(hardware_line(tuned))} (fingerprint "
        f"{html.escape(str(tuned.hardware.get('fingerprint', '?')))}). Measured {html.escape(tuned.created)} with "
        f"autotune {html.escape(tuned.autotune_version)}; study {html.escape(str(tuned.search.get('study_name')))}.</p>"
    )


def _winner_html(tuned: TunedConfig) -> str:
    config = tuned.config
    rows = {
        "configuration": config.short(),
        **config.knob_values(),
        "global_batch_size": config.global_batch_size,
        **{f"DataLoader {key}": value for key, value in tuned.dataloader_kwargs().items()},
        **{f"workload {key}": value for key, value in config.workload_knobs.items()},
    }
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items())
    return f'<h2>Winning configuration</h2><table class="winner-config">{cells}</table>'


def _table_html(frame: pd.DataFrame, marks: Marks) -> str:
    """The trial table, winner and baseline rows highlighted (pandas writes it; a class per row is added after)."""
    shown = frame.copy()
    shown.insert(0, "mark", "")
    shown.loc[shown.index.isin(marks.baseline.index), "mark"] = "baseline"
    shown.loc[shown.index.isin(marks.winner.index), "mark"] = "winner"
    table = shown.to_html(index=False, na_rep="", float_format=lambda value: f"{value:.3f}", classes="trials")
    for mark in ("winner", "baseline"):
        table = table.replace(f"<tr>\n      <td>{mark}</td>", f'<tr class="{mark}">\n      <td>{mark}</td>')
    return table


def build_report(
    result_path: str | Path,
    *,
    storage: str | None = None,
    out_dir: str | Path | None = None,
    csv: str | Path | None = None,
) -> ReportFiles:
    """Table, plots and HTML page for a result YAML's study.

    Args:
        result_path: a result YAML written by `autotune run`.
        storage: the study's storage URL, needed when the result's is password-redacted.
        out_dir: where the plots and report.html go; default <result folder>/report-<hardware fingerprint>/.
        csv: also save the trial table here.

    Raises:
        UserError: the result, its storage or its study cannot be read, or matplotlib is missing.
    """
    result_path = Path(result_path)
    if out_dir is not None and not str(out_dir):
        raise OutputError("--out is empty; give a folder for the report, or leave the option out")
    if csv is not None:
        _check_csv(Path(csv) if str(csv) else None)
    tuned = load_config(result_path)
    frame = trials_frame(load_study(tuned, storage))
    fingerprint = folder_name(str(tuned.hardware.get("fingerprint") or result_path.stem))  # a folder beside the result
    folder = Path(out_dir) if out_dir is not None else result_path.parent / f"report-{fingerprint}"
    try:
        plots = make_plots(frame, tuned, folder)
        page = write_html(frame, tuned, plots, folder / "report.html")
    except OSError as error:  # a file where the folder goes, a read-only folder, a full disk
        raise OutputError(
            f"cannot write the report in {folder} ({describe_os_error(error)}); choose another --out"
        ) from None
    try:
        csv_path = write_csv(frame, csv) if csv is not None else None
    except OSError as error:
        raise OutputError(
            f"cannot write the trial table {csv} ({describe_os_error(error)}); choose another --csv"
        ) from None
    logger.info("report for %d trials: %s", len(frame), page)
    return ReportFiles(out_dir=folder, html=page, plots=tuple(plots), csv=csv_path, trials=len(frame))
