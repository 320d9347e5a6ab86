"""The result a run writes: a TunedConfig built from the plan and the search's outcome."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import TYPE_CHECKING, Any, cast

from autotune import __version__
from autotune.knobs.dataloader import UNORDERED_NOTE
from autotune.result.measurements import NOT_MEASURED, Measurements, speedup_range, summarise_measurements
from autotune.result.sections import ClusterSection, DataSection, HardwareSection, SearchSection
from autotune.result.tuned_config import TunedConfig
from autotune.search.in_flight import placement_notes
from autotune.storage import redact_url
from autotune.trial.run_length import RunLength

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.run.plan import RunPlan
    from autotune.search.settings import TuningOutcome

__all__ = ["tuned_config", "learning_rate_advice", "predict_epoch", "epoch_start_note"]


def tuned_config(plan: RunPlan, outcome: TuningOutcome) -> TunedConfig:
    """The result of a run whose search found a winner: its configuration, its and the baseline's measurements
    summarised, the speedup with its range, the epoch prediction, the search's summary and the notes it calls for."""
    assert outcome.winner is not None
    winner = summarise_measurements([r.result for r in outcome.winner.records])
    baseline = (
        summarise_measurements([r.result for r in outcome.baseline.records]) if outcome.baseline else NOT_MEASURED
    )
    speedup = None
    if baseline.ok and winner.samples_per_second and baseline.samples_per_second:
        speedup = round(winner.samples_per_second / baseline.samples_per_second, 3)
    notes = [f"baseline adapted to this machine: {note}" for note in plan.space.baseline_notes]
    notes += [f"space adapted to this machine: {note}" for note in plan.space.space_notes]
    if plan.data.synthetic:
        notes.append("measured on autotune's synthetic default corpus; rerun with --data on your own list to be sure")
    notes.extend(plan.option_notes)
    if baseline is not NOT_MEASURED and not baseline.ok:
        notes.append(f"the recipe baseline could not be used here: {baseline.status}: {baseline.reason}")
    if outcome.winner_reason.startswith("fastest by paired"):
        notes.append(
            f"other processes took the CPU during the run: the winner is the {outcome.winner_reason} "
            "of confirmation (its leaders measured in turn in the same minutes; the search's windows, each from other "
            "minutes, are in the report but not in the choice)"
        )
    elif outcome.winner_reason and outcome.winner_reason != "fastest by median":
        notes.append(outcome.winner_reason)
    if outcome.set_aside:
        notes.append(
            f"the budget ended confirmation part-way through a pass of the leaders: its {outcome.set_aside} window(s), "
            "of only some of them, are in the report but not in the choice of the winner (like is compared with like)"
        )
    notes.extend(outcome.skipped)  # each with the budget that would have held it
    if winner.measurements < 2:
        notes.append("the winner rests on a single measurement (budget too small for confirmation)")
    notes.extend(placement_notes(outcome.confirmed))  # confirmations that could not have their leader's node
    lr_note = learning_rate_advice(
        outcome.winner.config,
        outcome.baseline.config if outcome.baseline else None,
        global_batch=plan.request.global_batch,
        lr=plan.options.get("lr"),
    )
    if lr_note:
        notes.append(lr_note)
    if plan.preparation is not None:
        notes.append(plan.preparation.note())
    if not outcome.winner.config.in_order:
        notes.append(UNORDERED_NOTE)
    epoch_note = epoch_start_note(outcome.winner.records, plan.objective_run_length())
    if epoch_note:
        notes.append(epoch_note)
    return TunedConfig(
        workload={
            "name": plan.workload.name,
            "model": plan.request.model,
            "task": plan.workload.task,
            "options": plan.options,
        },
        config=outcome.winner.config,
        device_type=plan.hardware.device_type,
        metrics={
            "objective": "samples_per_second",
            "run_length": plan.objective_run_length().to_dict(),  # what one-off costs were charged over
            "winner": winner.to_dict(),
            "baseline": baseline.to_dict(),
            "speedup": speedup,
            "speedup_range": speedup_range(winner, baseline),
            "epoch": predict_epoch(
                winner,
                baseline,
                data_samples=plan.data.describe()["n_utterances_total"],
                epoch_samples=plan.request.epoch_samples,
                epoch_hours=plan.request.epoch_hours,
                devices=plan.world_size,
            ),
            "data_preparation": plan.preparation.to_dict() if plan.preparation else None,
        },
        hardware=cast(HardwareSection, plan.hardware.to_dict()),
        data=cast(DataSection, plan.data.describe()),
        search=_search_summary(plan, outcome),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        autotune_version=__version__,
        notes=notes,
        cluster=cluster_section(plan, outcome),
    )


def cluster_section(plan: RunPlan, outcome: TuningOutcome) -> ClusterSection:
    """A multi-node result's own section: nodes, devices per node, the global batch, and the hosts and interconnect
    facts its winner's first measurement recorded (trial/interconnect.py); empty for one machine."""
    if plan.nodes <= 1 or outcome.winner is None:
        return {}
    config = outcome.winner.config
    measured = next((record.result for record in outcome.winner.records if record.result.hosts), None)
    return {
        "nodes": plan.nodes,
        "devices_per_node": config.world_size // plan.nodes,
        "world_size": config.world_size,
        "global_batch_size": config.global_batch_size,
        "launcher": "torchrun (c10d rendezvous on the first node), one per node under a SLURM job",
        "hosts": list(measured.hosts or []) if measured else [],
        "interconnect": dict(measured.interconnect or {}) if measured else {},
    }


EPOCH_START_NOTE_SHARE = 0.05  # of an epoch's time: a new epoch's start that weighs this much is worth a note


def epoch_start_note(records: list[Any], run: RunLength) -> str | None:
    """A note where a new epoch's start (trial/epoch_boundary.py) takes a large share of each epoch: a small corpus,
    a large batch, few steps an epoch. Real training over a larger corpus pays it less often than this run did; on
    the synthetic stand-in it is measured but not charged (trial/run_length.py), and the note says what it would cost
    an epoch of the stand-in's size, where a loop over that corpus pays it."""
    for record in records:
        result = record.result
        boundary, rate = result.epoch_boundary_s, result.window_samples_per_second
        accounting = result.epoch_accounting or {}
        samples = run.epoch_samples or accounting.get("dataset_size")
        if boundary is None or not rate or not samples:
            continue
        epoch_s = samples / rate + boundary  # the samples of every rank at the rate of every rank
        share = boundary / epoch_s
        if share < EPOCH_START_NOTE_SHARE:
            return None
        if not run.per_epoch_costs:
            return (
                f"a new epoch's first batch waits {boundary:.2f} s (prepared with nothing prefetched): not charged in "
                f"samples_per_second, since the synthetic corpus' {epoch_s:.1f}-s epochs are no training's; a loop "
                f"over this corpus pays it every epoch ({share:.0%} of each), and over your data once per epoch: give "
                "--epoch-samples N (your corpus) to rank by it"
            )
        where = "--epoch-samples" if run.epoch_samples else "this data"
        return (
            f"a new epoch's first batch waits {boundary:.2f} s (prepared with nothing prefetched): {share:.0%} of each "
            f"{epoch_s:.1f}-s epoch of {where}, charged in samples_per_second; over a larger corpus (longer epochs) "
            f"the winner runs nearer its steady {rate:,.1f} samples/s, and the ranking can differ: rerun with --data "
            "on your own list"
        )
    return None


def learning_rate_advice(
    winner: TrialConfig, baseline: TrialConfig | None, *, global_batch: int | None, lr: Any
) -> str | None:
    """Without --global-batch the winner's global batch is free; say how to keep the optimisation comparable.

    Args:
        winner, baseline: the two configurations (no baseline: nothing to compare with).
        global_batch: the run's --global-batch (held fixed: nothing changes); lr: the workload's lr option, if any.
    """
    if global_batch is not None or baseline is None:
        return None
    new, recipe = winner.global_batch_size, baseline.global_batch_size
    if new == recipe:
        return None
    factor = new / recipe
    example = f" (lr {lr:g} -> {lr * factor:.3g})" if isinstance(lr, (int, float)) and lr > 0 else ""
    return (
        f"the global batch changes from the baseline's {recipe} to {new} ({winner.per_device_batch_size}"
        f" per device x {winner.world_size} device(s) x {winner.grad_accum_steps} accumulation): by the "
        f"linear scaling rule multiply the learning rate by {factor:.3g}{example} and keep the warm-up, or rerun with "
        f"--global-batch {recipe} to hold the recipe's batch fixed"
    )


def predict_epoch(
    winner: Measurements,
    baseline: Measurements,
    *,
    data_samples: int,
    epoch_samples: int | None,
    epoch_hours: float | None,
    devices: int,
) -> dict[str, Any]:
    """Minutes per epoch for baseline and winner, as users think in epochs, on the devices a trial used.

    The epoch is --epoch-hours of audio (divided by the audio each sample carries, as measured), --epoch-samples,
    or the data list's size (data_samples).
    """
    samples = epoch_samples or data_samples
    source = "--epoch-samples" if epoch_samples else "the data list (one sample per entry)"

    def minutes(measured: Measurements) -> float | None:
        if not measured.ok:
            return None
        if epoch_hours is not None and measured.audio_seconds_per_second:
            return round(epoch_hours * 3600.0 / measured.audio_seconds_per_second / 60.0, 1)
        rate = measured.samples_per_second
        return round(samples / rate / 60.0, 1) if rate else None

    prediction: dict[str, Any] = {"samples": samples, "samples_from": source}
    if epoch_hours is not None:
        prediction = {"audio_hours": epoch_hours, "samples_from": "--epoch-hours (audio per sample measured)"}
    return {
        **prediction,
        "devices": devices,
        "baseline_minutes": minutes(baseline),
        "winner_minutes": minutes(winner),
    }


def _executor(plan: RunPlan) -> dict[str, Any]:
    """Where the trials ran: local, or SLURM with the partition and options they were submitted with."""
    slurm = plan.request.slurm
    if slurm is None:
        return {"name": "local"}
    return {"name": "slurm", "partition": slurm.partition, "options": dict(slurm.options)}


def _search_summary(plan: RunPlan, outcome: TuningOutcome) -> SearchSection:
    settings = plan.request.settings
    return {
        "space_file": str(plan.space_file),
        "space": plan.space.source,
        "baseline_config": outcome.baseline.config.to_dict() if outcome.baseline else None,
        "sampler": settings.sampler,
        "study_name": plan.study_name,
        "storage": redact_url(plan.storage_url),
        "executor": _executor(plan),
        "trials_this_run": len(outcome.records),
        "trial_statuses": dict(Counter(r.result.status for r in outcome.records)),
        "stopped_by": outcome.stopped_by,
        "elapsed_s": round(outcome.elapsed_s, 1),
        "timing": settings.timing.to_dict(),
        "budget_plan": outcome.plan.to_dict() if outcome.plan else None,
    }
