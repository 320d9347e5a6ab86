"""Reports on a tuning study: the trial table (pandas), PNG plots (matplotlib) and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import io
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from autotune.errors import UserError
from autotune.results import TunedConfig, load_config
from autotune.yamlio import atomic_write_text

__all__ = [
    "ReportFiles",
    "TRIAL_COLUMNS",
    "build_report",
    "load_study",
    "make_plots",
    "trials_frame",
    "write_csv",
    "write_html",
]

logger = logging.getLogger(__name__)

# Column name -> pandas dtype. Nullable dtypes, because a trial that failed before measuring has no result.
TRIAL_COLUMNS: dict[str, str] = {
    "number": "int64",
    "state": "string",
    "role": "string",
    "status": "string",
    "reason": "string",
    "samples_per_second": "float64",
    "data_wait_fraction": "float64",
    "peak_memory_gib": "float64",
    "per_device_batch_size": "Int64",
    "num_workers": "Int64",
    "prefetch_factor": "Int64",
    "pin_memory": "boolean",
    "persistent_workers": "boolean",
    "precision": "string",
    "intra_op_threads": "Int64",
    "wall_s": "float64",
}
_KNOBS = (
    "per_device_batch_size",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "persistent_workers",
    "precision",
    "intra_op_threads",
)
_PRECISION_COLOURS = {"fp32": "#1f77b4", "tf32": "#17becf", "bf16": "#ff7f0e", "fp16": "#9467bd"}
_WINNER_STYLE = {"marker": "*", "s": 360, "color": "#d62728", "edgecolors": "black", "zorder": 5}
_BASELINE_STYLE = {"marker": "D", "s": 120, "color": "#7f7f7f", "edgecolors": "black", "zorder": 5}
_GIB = 2**30


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
    shown = _redact(url)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        # Opening a missing SQLite file would create an empty database; say so instead.
        raise UserError(f"storage {shown} does not exist; pass --storage with the study's database URL")
    try:
        return optuna.load_study(study_name=name, storage=url)
    except KeyError:
        raise UserError(
            f"study {name!r} is not in storage {shown}; pass --storage with the database it ran in"
        ) from None
    except Exception as error:  # SQLAlchemy raises many kinds for a bad URL; all mean the same to the user
        raise UserError(f"cannot open storage {shown} ({type(error).__name__}); check --storage") from None


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per finished trial (running and waiting ones are left out), with the columns of TRIAL_COLUMNS."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    rows = [_trial_row(trial) for trial in study.get_trials(deepcopy=False, states=states)]
    frame = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))
    return frame.astype(TRIAL_COLUMNS).sort_values("number", ignore_index=True)


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
        "peak_memory_gib": peak / _GIB if peak is not None else None,
        **{knob: config.get(knob) for knob in _KNOBS},
        "wall_s": wall,
    }


def make_plots(frame: pd.DataFrame, tuned: TunedConfig, out_dir: str | Path) -> list[Path]:
    """Three PNGs: throughput vs batch by precision, data wait vs workers, throughput vs peak memory.

    Raises:
        UserError: matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("the report's plots need matplotlib, which is not installed: pip install matplotlib") from None
    out_dir = Path(out_dir)
    marks = _Marks.find(frame, tuned)
    subject = f"{tuned.workload.get('name', 'workload')} on {_hardware_line(tuned)}"
    drawers = (
        ("throughput_vs_batch.png", _plot_batch),
        ("data_wait_vs_workers.png", _plot_workers),
        ("throughput_vs_memory.png", _plot_memory),
    )
    paths = []
    for filename, draw in drawers:
        figure = Figure(figsize=(8, 5.2), dpi=110, layout="constrained")
        FigureCanvasAgg(figure)  # the Agg canvas, bound to this figure only: no pyplot, no global backend
        axes = figure.add_subplot()
        draw(axes, frame, marks)
        axes.grid(True, alpha=0.3)
        figure.suptitle(subject, fontsize=9, color="#555555")
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        paths.append(_atomic_write_bytes(out_dir / filename, buffer.getvalue()))
        logger.info("wrote %s", paths[-1])
    return paths


@dataclass(frozen=True, kw_only=True, slots=True)
class _Marks:
    """Rows of the frame that measured the winner's and the baseline's configurations (feasible ones only)."""

    winner: pd.DataFrame
    baseline: pd.DataFrame

    @classmethod
    def find(cls, frame: pd.DataFrame, tuned: TunedConfig) -> _Marks:
        ok = frame[_is_ok(frame)]
        baseline_config = tuned.search.get("baseline_config")
        if baseline_config:
            baseline = ok[_matches(ok, baseline_config)]
        else:
            baseline = ok[ok["role"].eq("baseline").fillna(False).astype(bool)]
        return cls(winner=ok[_matches(ok, tuned.config.to_dict())], baseline=baseline)


def _is_ok(frame: pd.DataFrame) -> pd.Series:
    return frame["status"].eq("ok").fillna(False).astype(bool) & frame["samples_per_second"].notna()


def _matches(frame: pd.DataFrame, config: dict[str, Any]) -> pd.Series:
    """Rows whose knobs equal the configuration's (missing equals missing)."""
    mask = pd.Series(True, index=frame.index)
    for knob in _KNOBS:
        value, column = config.get(knob), frame[knob]
        mask &= column.isna() if value is None else column.eq(value).fillna(False).astype(bool)
    return mask


def _scatter_by_precision(axes: Any, frame: pd.DataFrame, x: str, y: str, scale: float = 1.0) -> None:
    for precision, group in frame.groupby("precision", sort=True):
        colour = _PRECISION_COLOURS.get(str(precision), "#2ca02c")
        axes.scatter(group[x], group[y] * scale, s=42, alpha=0.75, color=colour, label=f"{precision} (feasible)")


def _annotate(axes: Any, rows: pd.DataFrame, x: str, y: str, label: str, style: dict[str, Any], scale: float) -> None:
    """One marker at the median of a configuration's measurements, its label pointing toward the plot's centre."""
    if rows.empty or rows[x].isna().all() or rows[y].isna().all():
        return
    px, py = float(rows[x].median()), float(rows[y].median()) * scale
    axes.scatter([px], [py], label=label, **style)
    axes.get_xlim(), axes.get_ylim()  # settle autoscaling so that the point's place in the axes is final
    fx, fy = axes.transAxes.inverted().transform(axes.transData.transform((px, py)))
    right, up = fx < 0.6, fy < 0.6
    axes.annotate(
        f"{label}\n{rows['samples_per_second'].median():.1f} samples/s",
        (px, py),
        xytext=(18 if right else -18, 22 if up else -30),
        textcoords="offset points",
        ha="left" if right else "right",
        va="bottom" if up else "top",
        fontsize=8.5,
        arrowprops={"arrowstyle": "->", "color": "#333333"},
        bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "alpha": 0.85},
        zorder=6,
    )


def _mark_winner_and_baseline(axes: Any, marks: _Marks, x: str, y: str, scale: float = 1.0) -> None:
    """Call last, after scales and limits are set: label placement depends on them."""
    _annotate(axes, marks.baseline, x, y, "baseline (recipe)", _BASELINE_STYLE, scale)
    _annotate(axes, marks.winner, x, y, "winner", _WINNER_STYLE, scale)


def _legend(axes: Any) -> None:
    legend = axes.legend(loc="best", fontsize=8)
    for handle in legend.legend_handles:  # the winner's star is drawn large; its legend entry need not be
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([60])


def _headroom(values: pd.Series, scale: float = 1.0) -> float:
    """An upper y limit with room above the highest point for its label."""
    top = float(values.max()) * scale if values.notna().any() else 1.0
    return max(top, 1e-9) * 1.18


def _empty_note(axes: Any, what: str) -> None:
    axes.text(0.5, 0.5, f"no {what} measured", transform=axes.transAxes, ha="center", va="center", color="#777777")


def _plot_batch(axes: Any, frame: pd.DataFrame, marks: _Marks) -> None:
    ok = frame[_is_ok(frame)]
    _scatter_by_precision(axes, ok, "per_device_batch_size", "samples_per_second")
    for precision, group in ok.groupby("precision", sort=True):
        best = group.groupby("per_device_batch_size")["samples_per_second"].max()
        axes.plot(best.index, best.values, color=_PRECISION_COLOURS.get(str(precision), "#2ca02c"), alpha=0.5, lw=1.2)
    failed = frame[~_is_ok(frame) & frame["per_device_batch_size"].notna()]
    if not failed.empty:
        axes.scatter(
            failed["per_device_batch_size"],
            [0.0] * len(failed),
            marker="x",
            s=60,
            color="#d62728",
            label="no throughput (oom, pruned, ...)",
            zorder=4,
        )
    batches = sorted({int(b) for b in frame["per_device_batch_size"].dropna()})
    if batches and batches[-1] > 2 * batches[0]:
        axes.set_xscale("log", base=2)  # batch sizes are mostly powers of two
    if batches:
        axes.set_xticks(batches, [str(b) for b in batches])
    if ok.empty:
        _empty_note(axes, "feasible throughput")
    top = _headroom(ok["samples_per_second"])
    axes.set_ylim(-0.04 * top, top)
    axes.set_title("Training throughput vs per-device batch size, by precision")
    axes.set_xlabel("per-device batch size (samples per step)")
    axes.set_ylabel("throughput (samples/s)")
    _mark_winner_and_baseline(axes, marks, "per_device_batch_size", "samples_per_second")
    _legend(axes)


def _plot_workers(axes: Any, frame: pd.DataFrame, marks: _Marks) -> None:
    ok = frame[_is_ok(frame) & frame["data_wait_fraction"].notna()]
    _scatter_by_precision(axes, ok, "num_workers", "data_wait_fraction", scale=100.0)
    if not ok.empty:
        median = ok.groupby("num_workers")["data_wait_fraction"].median() * 100.0
        axes.plot(median.index, median.values, color="black", lw=1.5, ls="--", label="median per worker count")
        workers = sorted({int(w) for w in ok["num_workers"]})
        axes.set_xticks(workers, [str(w) for w in workers])
    else:
        _empty_note(axes, "data-wait fraction")
    axes.set_ylim(0.0, _headroom(ok["data_wait_fraction"], scale=100.0))
    axes.set_title("Time spent waiting for data vs DataLoader workers")
    axes.set_xlabel("DataLoader num_workers (processes per device)")
    axes.set_ylabel("data wait (% of step time)")
    _mark_winner_and_baseline(axes, marks, "num_workers", "data_wait_fraction", scale=100.0)
    _legend(axes)


def _plot_memory(axes: Any, frame: pd.DataFrame, marks: _Marks) -> None:
    ok = frame[_is_ok(frame) & frame["peak_memory_gib"].notna()]
    _scatter_by_precision(axes, ok, "peak_memory_gib", "samples_per_second")
    if ok.empty:
        _empty_note(axes, "peak memory")
    axes.set_xlim(0.0, _headroom(ok["peak_memory_gib"]))
    axes.set_ylim(0.0, _headroom(ok["samples_per_second"]))
    axes.set_title("Training throughput vs peak device memory")
    axes.set_xlabel("peak memory (GiB)")
    axes.set_ylabel("throughput (samples/s)")
    _mark_winner_and_baseline(axes, marks, "peak_memory_gib", "samples_per_second")
    _legend(axes)


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """The trial table as CSV, written atomically."""
    return atomic_write_text(path, frame.to_csv(index=False))


def write_html(frame: pd.DataFrame, tuned: TunedConfig, plots: Sequence[Path], path: str | Path) -> Path:
    """One self-contained HTML page: headline, winner's configuration, plots (embedded), trial table."""
    title = f"autotune report: {tuned.workload.get('name', 'workload')} on {_hardware_line(tuned)}"
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
        _table_html(frame, _Marks.find(frame, tuned)),
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


def _metric(metrics: dict[str, Any], name: str) -> str:
    value = (metrics or {}).get("samples_per_second")
    return f"{value:.1f} samples/s" if isinstance(value, (int, float)) else f"{name} not measured"


def _headline_html(tuned: TunedConfig) -> str:
    metrics, speedup = tuned.metrics, tuned.metrics.get("speedup")
    faster = f"<b>{speedup:.2f}&times;</b> the baseline's throughput" if speedup else "no baseline to compare with"
    return (
        f'<p class="headline">winner {_metric(metrics.get("winner", {}), "winner")} vs baseline '
        f"{_metric(metrics.get('baseline', {}), 'baseline')}: {faster}</p>"
        f"<p>Hardware: {html.escape(_hardware_line(tuned))} (fingerprint "
        f"{html.escape(str(tuned.hardware.get('fingerprint', '?')))}). Measured {html.escape(tuned.created)} with "
        f"autotune {html.escape(tuned.autotune_version)}; study {html.escape(str(tuned.search.get('study_name')))}.</p>"
    )


def _winner_html(tuned: TunedConfig) -> str:
    config = tuned.config
    rows = {
        "configuration": config.short(),
        "per_device_batch_size": config.per_device_batch_size,
        "global_batch_size": config.global_batch_size,
        "precision": config.precision,
        **{f"DataLoader {key}": value for key, value in tuned.dataloader_kwargs().items()},
        "intra_op_threads": config.intra_op_threads,
        "cudnn_benchmark": config.cudnn_benchmark,
        **{f"workload {key}": value for key, value in config.extra.items()},
    }
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items())
    return f'<h2>Winning configuration</h2><table class="winner-config">{cells}</table>'


def _table_html(frame: pd.DataFrame, marks: _Marks) -> str:
    """The trial table, winner and baseline rows highlighted (pandas writes it; a class per row is added after)."""
    shown = frame.copy()
    shown.insert(0, "mark", "")
    shown.loc[shown.index.isin(marks.baseline.index), "mark"] = "baseline"
    shown.loc[shown.index.isin(marks.winner.index), "mark"] = "winner"
    table = shown.to_html(index=False, na_rep="", float_format=lambda value: f"{value:.3f}", classes="trials")
    for mark in ("winner", "baseline"):
        table = table.replace(f"<tr>\n      <td>{mark}</td>", f'<tr class="{mark}">\n      <td>{mark}</td>')
    return table


def _hardware_line(tuned: TunedConfig) -> str:
    from autotune.hardware import Hardware

    try:
        return Hardware.from_dict(tuned.hardware).describe()
    except (TypeError, KeyError, ValueError):  # a result from another autotune version: show what is there
        return str(tuned.hardware.get("fingerprint") or tuned.device_type)


def _redact(url: str) -> str:
    from autotune.runner import redact_url

    return redact_url(url)


def _atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Bytes through a temporary file in the same folder and a rename, like yamlio.atomic_write_text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.chmod(temp_name, 0o644)  # mkstemp makes it owner-only; a report is an ordinary file
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return path


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
    tuned = load_config(result_path)
    frame = trials_frame(load_study(tuned, storage))
    fingerprint = tuned.hardware.get("fingerprint") or result_path.stem
    folder = Path(out_dir) if out_dir is not None else result_path.parent / f"report-{fingerprint}"
    plots = make_plots(frame, tuned, folder)
    page = write_html(frame, tuned, plots, folder / "report.html")
    csv_path = write_csv(frame, csv) if csv is not None else None
    logger.info("report for %d trials: %s", len(frame), page)
    return ReportFiles(out_dir=folder, html=page, plots=tuple(plots), csv=csv_path, trials=len(frame))
