"""The report's plots: matplotlib figures drawn on the Agg canvas (no pyplot, no global backend)."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.errors import UserError
from autotune.knobs import declarations as knobs
from autotune.result.tuned_config import TunedConfig
from autotune.yamlio import atomic_write_bytes

__all__ = ["GIB", "KNOBS", "Marks", "hardware_line", "make_plots"]

logger = logging.getLogger(__name__)

KNOBS = knobs.NAMES  # the trial table's knob columns; a workload's own knobs follow them
_PRECISION_COLOURS = {
    "fp32": "#1f77b4",
    "fp32-default": "#aec7e8",
    "tf32": "#17becf",
    "bf16": "#ff7f0e",
    "fp16": "#9467bd",
}
_WINNER_STYLE = {"marker": "*", "s": 360, "color": "#d62728", "edgecolors": "black", "zorder": 5}
_BASELINE_STYLE = {"marker": "D", "s": 120, "color": "#7f7f7f", "edgecolors": "black", "zorder": 5}
GIB = 2**30


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
    marks = Marks.find(frame, tuned)
    subject = f"{tuned.workload.get('name', 'workload')} on {hardware_line(tuned)}"
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
        paths.append(atomic_write_bytes(out_dir / filename, buffer.getvalue()))
        logger.info("wrote %s", paths[-1])
    return paths


@dataclass(frozen=True, kw_only=True, slots=True)
class Marks:
    """Rows of the frame that measured the winner's and the baseline's configurations (feasible ones only)."""

    winner: pd.DataFrame
    baseline: pd.DataFrame

    @classmethod
    def find(cls, frame: pd.DataFrame, tuned: TunedConfig) -> Marks:
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
    """Rows whose knobs, the workload's own included, equal the configuration's (missing equals missing)."""
    mask = pd.Series(True, index=frame.index)
    values = knobs.flat_values(config)
    for knob in [name for name in frame.columns if name in values]:
        value, column = values[knob], frame[knob]
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


def _mark_winner_and_baseline(axes: Any, marks: Marks, x: str, y: str, scale: float = 1.0) -> None:
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


def _plot_batch(axes: Any, frame: pd.DataFrame, marks: Marks) -> None:
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


def _plot_workers(axes: Any, frame: pd.DataFrame, marks: Marks) -> None:
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


def _plot_memory(axes: Any, frame: pd.DataFrame, marks: Marks) -> None:
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


def hardware_line(tuned: TunedConfig) -> str:
    from autotune.machine.hardware import Hardware

    try:
        return Hardware.from_dict(tuned.hardware).describe()
    except (TypeError, KeyError, ValueError):  # a result from another autotune version: show what is there
        return str(tuned.hardware.get("fingerprint") or tuned.device_type)
