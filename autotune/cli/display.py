"""What `autotune run` shows a person: a live progress line per trial and a summary they can read at a glance."""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune.cli.output import plain
from autotune.knobs.config import TrialConfig
from autotune.result.measurements import NOT_MEASURED, Measurements
from autotune.trial import TrialResult

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.console import RenderableType

    from autotune.result.sections import Metrics
    from autotune.run.plan import RunPlan
    from autotune.run.runner import RunReport
    from autotune.search.budget import BudgetPlan
    from autotune.search.candidates import TrialRecord
    from autotune.search.settings import TunerSettings

__all__ = ["RichReporter", "print_plan", "print_summary"]

_STATUS_STYLE = {
    "ok": "green",
    "pruned": "dim",
    "stopped": "dim",
    "oom": "red",
    "timeout": "red",
    "signal": "red",
    "error": "red",
}
MIX_SHOWN_FROM = 0.02  # an epoch-mix factor this far from 1 is shown beside the trial's figure


def _rate(value: float | None) -> str:
    return f"{value:,.1f}" if value else "-"


class _PlanProgress(Progress):
    """rich's Progress with the budget plan above the trial bar (rich's documented way: get_renderables)."""

    plan_text = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        if self.plan_text:  # one line, cut to the terminal: a wrapped live line leaves fragments in the scrollback
            yield Text(self.plan_text, style="dim", no_wrap=True, overflow="ellipsis")
        yield self.make_tasks_table(self.tasks)


def print_plan(console: Console, plan: RunPlan) -> None:
    """What the run is about to do, before its first trial: the workload on this machine, the devices per trial, the
    data, the study, the warm start, the space's baseline and the notes on how it was adapted."""
    data = plan.data.describe()
    synthetic = " [yellow](synthetic default corpus)[/yellow]" if plan.data.synthetic else ""
    console.print(f"[bold]autotune[/bold] {plain(plan.workload.name)} on {plain(plan.hardware.describe())}")
    if plan.world_size > 1:
        unit = "GPUs (NCCL)" if plan.hardware.device_type == "cuda" else "processes (gloo)"
        fixed = f", global batch held at {plan.request.global_batch}" if plan.request.global_batch else ""
        across = f" across {plan.nodes} nodes (torchrun on each)" if plan.nodes > 1 else ""
        console.print(f"every trial trains data-parallel on {plan.world_size} {unit}{across}{fixed}")
    if plan.request.command is not None:  # the training reads its own data; its DataLoader said how much
        size = plan.reach.dataset_size if plan.reach is not None else None
        console.print(f"data: your training's own{f' ({size} items in its DataLoader)' if size else ''}")
    else:
        console.print(
            f"data: {data['n_utterances']} utterances, {data['n_speakers']} speakers, "
            f"{data['total_audio_hours']} h{synthetic}"
        )
    if plan.request.command is not None:
        console.print(f"command: {plain(plan.request.command.template)}", highlight=False, soft_wrap=True)
    console.print(f"study: {plain(plan.study_name)}  ({plain(plan.storage_url.split('://')[0])})", highlight=False)
    for line in plan.warm_start.describe() if plan.warm_start else ():
        console.print(plain(line), highlight=False, soft_wrap=True)
    baseline = TrialConfig.from_params(plan.space.baseline, workload_knobs=tuple(plan.workload.knobs)).short()
    origin = "your training as it runs" if plan.request.command is not None else "recipe"
    console.print(f"space: {plain(plan.space_file)}; baseline = {origin}: {plain(baseline)}")
    for note in plan.space.baseline_notes:
        console.print(f"  [dim]baseline adapted: {plain(note)}[/dim]")
    for note in plan.space.space_notes:
        console.print(f"  [dim]space adapted: {plain(note)}[/dim]")
    for note in plan.option_notes:
        console.print(f"  [dim]{plain(note)}[/dim]", highlight=False, soft_wrap=True)


class RichReporter:
    """Progress over trials with the best so far, the budget plan live above it; one line per finished trial."""

    def __init__(self, console: Console, settings: TunerSettings) -> None:
        self.console = console
        self.planned = False
        self.progress = _PlanProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[dim]{task.fields[counted]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        confirmations = settings.confirm_top_k * settings.confirm_repeats
        counted = f"(--trials {settings.trials} + {confirmations} confirmations)" if confirmations else ""
        self.task = self.progress.add_task("starting", total=settings.trials + confirmations, counted=counted)

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.stop()

    def plan_changed(self, plan: BudgetPlan) -> None:
        """The plan as it stands: printed once when the run has made it (before the baseline), then kept live."""
        if not self.planned:
            self.console.print(plain(plan.describe()), highlight=False, soft_wrap=True)
            self.planned = True
        self.progress.plan_text = plan.describe()
        self.progress.refresh()

    def machine_measured(self, description: str, busy: bool) -> None:
        style = "yellow" if busy else "dim"
        self.console.print(f"[{style}]machine: {plain(description)}[/{style}]", highlight=False, soft_wrap=True)

    def trial_started(self, number: int, role: str, config: TrialConfig) -> None:
        self.progress.update(self.task, description=f"#{number} {role}: {plain(config.short())}")

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        result = record.result
        style = _STATUS_STYLE.get(result.status, "yellow")
        figure = f"{_rate(result.samples_per_second)} samples/s" if result.samples_per_second else plain(result.reason)
        best_text = f"best {_rate(best.value)}" if best else "no stable config yet"
        self.console.print(
            f"#{record.number:<3} {record.role:<8} {plain(f'{record.config.short():<44}')} "
            f"[{style}]{result.status:<9}[/{style}] "
            f"{figure}{_compile_text(result)}{_mix_text(result)}  [dim]({best_text}, {result.wall_s or 0:.0f} s)[/dim]",
            highlight=False,
            soft_wrap=True,
        )
        self.progress.advance(self.task)


def _compile_text(result: TrialResult) -> str:
    """A compiled trial's one-off cost beside its figure: the steady rate, compile seconds and recompiles (the figure
    charges the compile over the run length)."""
    if result.compile_s is None or not result.samples_per_second:
        return ""
    steady = f"steady {_rate(result.window_samples_per_second)}, " if result.window_samples_per_second else ""
    return f" [dim]({steady}compile {result.compile_s:.0f} s, {result.recompiles or 0} recompiles)[/dim]"


def _mix_text(result: TrialResult) -> str:
    """Where the epoch's mix of short and long batches moved the figure by 2% or more from the window's own rate
    (trial/epoch_mix.py): both, so that a figure unlike one's own short benchmark explains itself."""
    factor = result.epoch_mix_factor
    if factor is None or not result.window_samples_per_second or abs(factor - 1.0) < MIX_SHOWN_FROM:
        return ""
    return f" [dim](window {_rate(result.window_samples_per_second)}, x{factor:.2f} for the epoch's mix)[/dim]"


def print_summary(console: Console, report: RunReport) -> None:
    """Baseline vs winner, the top trials, the failures with reasons, and where the YAML went."""
    tuned, outcome = report.tuned, report.outcome
    winner, baseline = tuned.winner, tuned.baseline
    table = Table(title="baseline (recipe) vs winner", show_lines=False)
    for column in ("", "winner", "baseline"):
        table.add_column(column)
    base_config = outcome.baseline.config.short() if outcome.baseline else "-"
    table.add_row("configuration", plain(tuned.config.short()), plain(base_config))
    for key, label in (
        ("samples_per_second", "samples/s (median)"),
        ("spread_fraction", "spread (max-min)/median"),
        ("audio_seconds_per_second", "audio s / s"),
        ("step_time_median_s", "step time median s"),
        ("data_wait_fraction", "data-wait fraction"),
        ("measurements", "measurements"),
    ):
        if key == "spread_fraction":  # one window has no spread: 0.000 would read as exact
            base = _spread(baseline) if baseline.ok else _fmt(_baseline_figure(baseline, key))
            table.add_row(label, _spread(winner), base)
            continue
        table.add_row(label, _fmt(getattr(winner, key)), _fmt(_baseline_figure(baseline, key)))
    if winner.compile_s is not None:  # torch.compile's one-off cost, charged in samples/s over the run length
        table.add_row("compile s / recompiles", f"{winner.compile_s:.0f} / {winner.recompiles or 0}", "-")
    if winner.epoch_start_s is not None or (baseline.ok and baseline.epoch_start_s is not None):
        # a new epoch's first batch (trial/epoch_boundary.py), charged in samples/s once per epoch
        table.add_row(
            "new epoch's wait s", _fmt(winner.epoch_start_s), _fmt(_baseline_figure(baseline, "epoch_start_s"))
        )
    table.add_row("peak memory GiB", _gib(winner.peak_memory_bytes), _gib(baseline.peak_memory_bytes))
    if winner.gpu_utilization_percent is not None:
        table.add_row("GPU utilisation %", _fmt(winner.gpu_utilization_percent), _fmt(baseline.gpu_utilization_percent))
    table.add_row("trial setup s / wall s", _overhead(winner), _overhead(baseline))
    console.print(table)
    speedup = tuned.metrics.get("speedup")
    if speedup:
        within = _speedup_range(speedup, tuned.metrics)
        console.print(f"[bold green]speedup over the recipe: {speedup:.2f}x[/bold green]{within}", highlight=False)
    epoch = tuned.metrics.get("epoch") or {}
    if epoch.get("winner_minutes") is not None:
        before = f"~{epoch['baseline_minutes']:.1f} min -> " if epoch.get("baseline_minutes") is not None else ""
        size = f"{epoch['audio_hours']:g} h of audio" if "audio_hours" in epoch else f"{epoch['samples']:,} samples"
        devices = epoch.get("devices", 1)
        where = f" on {devices} devices" if devices > 1 else ""
        console.print(f"epoch of {size}{where}: {before}~{epoch['winner_minutes']:.1f} min/epoch")
    _print_top(console, outcome.records)
    _print_failures(console, outcome.records)
    _print_assessment(console, tuned.metrics)
    for note in tuned.notes:
        console.print(f"[yellow]note:[/yellow] {plain(note)}")
    if outcome.plan is not None:
        console.print(f"[dim]{plain(outcome.plan.describe())}[/dim]", highlight=False, soft_wrap=True)
    console.print(_stopped_line(report), highlight=False)
    if report.written:
        console.print(f"result written to [bold]{plain(report.result_path)}[/bold]  (load with autotune.load_config)")
    else:
        console.print(f"result kept as it was: [bold]{plain(report.result_path)}[/bold]")


def _stopped_line(report: RunReport) -> str:
    """What ended the search and how long the whole run took: the search's own minutes alone read as if most of the
    budget were unused, while input checks, the AMP check and the closing ceiling spent the rest."""
    budget_s = report.plan.request.settings.budget_s
    run_min = (time.monotonic() - report.plan.started_s) / 60
    of_budget = f" of its {budget_s / 60:.1f}-min budget" if budget_s is not None else ""
    search_min = report.outcome.elapsed_s / 60
    return (
        f"search stopped by {plain(report.tuned.search['stopped_by'])} after {search_min:.1f} min; "
        f"the run took {run_min:.1f} min{of_budget}"
    )


def _print_top(console: Console, records: list[TrialRecord]) -> None:
    feasible = sorted((r for r in records if r.result.feasible), key=lambda r: -r.value)[:5]
    if not feasible:
        return
    table = Table(title="top trials")
    for column in ("#", "role", "configuration", "samples/s", "data wait", "peak GiB"):
        table.add_column(column)
    for record in feasible:
        result = record.result
        table.add_row(
            str(record.number),
            record.role,
            plain(record.config.short()),
            _rate(result.samples_per_second),
            _fmt(result.data_wait_fraction),
            _gib(result.peak_memory_bytes),
        )
    console.print(table)


def _print_failures(console: Console, records: list[TrialRecord]) -> None:
    failed = [r for r in records if not r.result.feasible]
    if not failed:
        return
    table = Table(title=f"rejected or pruned configurations ({len(failed)})")
    for column in ("#", "configuration", "status", "reason"):
        table.add_column(column)
    for record in failed:
        table.add_row(
            str(record.number), plain(record.config.short()), record.result.status, plain(record.result.reason)
        )
    console.print(table)


def _speedup_range(speedup: float, metrics: Metrics) -> str:
    """What the measurements support: the windows' worst and best pairings, and, where the run measured its noise
    and the windows' range is narrower (a baseline of one window carries none), the speedup within that noise."""
    spread = metrics.get("speedup_range") or {}
    if not spread:
        return ""
    said = (
        f"{spread['low']:.2f}-{spread['high']:.2f}x across {spread['winner_measurements']} winner and "
        f"{spread['baseline_measurements']} baseline window(s)"
    )
    noise = (metrics.get("noise") or {}).get("median_spread_fraction")
    if noise and (spread["high"] - spread["low"]) / speedup < 2 * noise:
        low, high = min(spread["low"], speedup * (1 - noise)), max(spread["high"], speedup * (1 + noise))
        one = "the baseline rests on one window, and " if spread["baseline_measurements"] == 1 else ""
        said += f"; {one}repeated windows here disagree by {noise:.0%}: about {low:.2f}-{high:.2f}x"
    elif spread["baseline_measurements"] == 1:
        said += "; the baseline rests on one window"
    return f" ({said})"


def _spread(measured: Measurements) -> str:
    """A configuration's spread across its windows; one window has none to show."""
    return "- (one window)" if measured.measurements == 1 else _fmt(measured.spread_fraction)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"
    return "-" if value is None else str(value)


def _baseline_figure(baseline: Measurements, name: str) -> object:
    """The baseline's figure; where it could not be measured, why (its status); nothing where the run had none."""
    if baseline.ok:
        return getattr(baseline, name)
    return None if baseline is NOT_MEASURED else baseline.status


def _overhead(measured: Measurements) -> str:
    """Model, data and loader build against the whole trial (process start and imports are in metrics.overhead)."""
    setup, wall = measured.setup_s, measured.trial_wall_s
    return f"{setup:.1f} / {wall:.1f}" if setup is not None and wall else "-"


def _gib(value: object) -> str:
    return f"{value / 2**30:.2f}" if isinstance(value, (int, float)) and value else "-"


def _print_assessment(console: Console, metrics: Metrics) -> None:
    """Work per sample and the ceiling, the AMP check, the cost of isolation, and what bounds the winner."""
    compute = metrics.get("compute") or {}
    parts = []
    if compute.get("flops_per_sample"):
        parts.append(f"{compute['flops_per_sample'] / 1e9:.3g} GFLOP/sample, {compute['achieved_tflops']:.3g} TFLOP/s")
        if compute.get("fraction_of_peak") is not None:
            parts[-1] += f" ({compute['fraction_of_peak']:.1%} of the {compute['peak_tflops']:g} TFLOP/s peak)"
    efficiency = compute.get("pipeline_efficiency")
    if efficiency is not None:
        at_ceiling = " (at the ceiling: above 100% is measurement noise)" if efficiency >= 1.0 else ""
        parts.append(
            f"compute-only ceiling {_rate(compute['ceiling_samples_per_second'])} samples/s: pipeline efficiency "
            f"{efficiency:.0%}{at_ceiling}"
        )
    if compute.get("ceiling_failed"):
        parts.append(f"compute-only ceiling not measured ({plain(compute['ceiling_failed'])})")
    if parts:
        console.print("compute: " + "; ".join(parts), highlight=False)
    noise = metrics.get("noise") or {}
    if noise.get("configurations"):
        console.print(
            f"measurement noise: repeated windows of one configuration spread {noise['median_spread_fraction']:.0%} "
            f"(median over {noise['configurations']} re-measured; up to {noise['max_spread_fraction']:.0%})",
            highlight=False,
        )
    amp = metrics.get("amp_check") or {}
    for name, verdict in (amp.get("precisions") or {}).items():
        word = {True: "[green]accepted[/green]", False: "[red]rejected[/red]"}.get(
            verdict["accepted"], "[yellow]not judged[/yellow] (the check's time ran out first: not rejected)"
        )
        strays = _percent(verdict.get("max_deviation_fraction"))
        console.print(
            f"AMP check {plain(name)}: {word}, its loss curve strays up to {strays} "
            f"from fp32's (allowed {_percent(verdict.get('allowed_deviation_fraction'))}, {amp.get('steps')} steps"
            f"{_amp_learning_rate(amp.get('learning_rates'))})"
        )
    overhead = metrics.get("overhead") or {}
    if overhead.get("trials"):
        scan = f" + worst-case scan {overhead['mean_worst_case_s']:.1f} s" if overhead.get("mean_worst_case_s") else ""
        console.print(
            f"per-trial overhead (mean of {overhead['trials']}): start and imports "
            f"{overhead.get('mean_start_s') or 0:.1f} s + setup {overhead['mean_setup_s'] or 0:.1f} s + warm-up "
            f"{overhead['mean_warmup_s'] or 0:.1f} s{scan} = {_percent(overhead.get('overhead_share_of_run'))} of the "
            f"run; timed windows {_percent(overhead.get('timed_share_of_run'))}; outside the windows "
            f"{_percent(overhead.get('untimed_share_of_trials'))} of the trials' time",
            highlight=False,
        )
    diagnosis = metrics.get("diagnosis") or {}
    if diagnosis:
        console.print(f"[bold]bound by: {plain(diagnosis['bound'])}[/bold] ({plain('; '.join(diagnosis['evidence']))})")
        for step in diagnosis["next"]:
            console.print(f"  next: {plain(step)}", highlight=False)


def _amp_learning_rate(rates: list[float] | None) -> str:
    """How fast the AMP check trained: a rate the recipe's warm-up held low compares rounding more than training."""
    if not rates or None in rates:
        return ""
    first, last = rates[0], rates[-1]
    if last > 1.5 * first:
        return f" under the recipe's warm-up, learning rate {first:.2g} to {last:.2g}"
    return f" at learning rate {last:.2g}"


def _percent(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"
