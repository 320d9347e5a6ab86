"""What `autotune run`'s options make: the RunRequest, and the check of a nightly job's run arguments.

`autotune run` builds its request here (`run_request`); `autotune schedule` reads the arguments it will pass to
`autotune run` with the same parser and checks them with the same checks (`check_run_args`), so that a job's typo
fails when it is scheduled and not every night. Nothing heavy is imported at module level (`autotune --help`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotune.cli_parsing import parse_budget, parse_duration, parse_executor, parse_workload_options
from autotune.errors import UserError

if TYPE_CHECKING:
    from autotune.run_plan import RunRequest

__all__ = ["check_run_args", "run_request"]


def run_request(
    *,
    model: str,
    data: str | None,
    trials: int,
    budget: str | None,
    storage: str | None,
    out: Path | None,
    results_dir: Path,
    space: Path | None,
    device: str,
    devices: int | None,
    global_batch: int | None,
    sampler: str,
    window: float,
    warmup_steps: int,
    trial_timeout: str,
    confirm: int,
    headroom: float,
    max_throughput_cv: float,
    crop_seconds: float | None,
    option: list[str] | None,
    epoch_samples: int | None,
    epoch_hours: float | None,
    run_length: str | None,
    prune: bool,
    amp_check: bool,
    ceiling: bool,
    seed: int,
    warm_start: bool,
    warm_fraction: float,
    drift_threshold: float,
    executor: str,
    slurm_partition: str | None,
    slurm_option: list[str] | None,
    slurm_pin_wait: str | None,
    parallel: int,
    nodes: int,
) -> RunRequest:
    """The RunRequest `autotune run` makes of its options (what `autotune schedule` checks its run arguments with).

    Raises:
        UserError: a value that cannot be read (a duration, an option, an executor).
    """
    from autotune import runner
    from autotune.trial import TimingSettings
    from autotune.trial.amp_check import AmpCheckSettings
    from autotune.trial.run_length import parse_run_length
    from autotune.tuner_settings import TunerSettings

    timing = TimingSettings(
        warmup_steps=warmup_steps,
        window_s=window,
        memory_headroom_fraction=headroom,
        max_throughput_cv=max_throughput_cv or None,
    )
    settings = TunerSettings(
        trials=trials,
        budget_s=parse_budget(budget),
        sampler=sampler,
        seed=seed,
        confirm_top_k=confirm,
        prune=prune,
        parallel=parallel,
        trial_timeout_s=parse_duration(trial_timeout),
        timing=timing,
    )
    return runner.RunRequest(
        model=model,
        data=data,
        space=str(space) if space else None,
        storage=storage,
        out=str(out) if out else None,
        results_dir=str(results_dir),
        device=device,
        settings=settings,
        workload_options=parse_workload_options(option, crop_seconds),
        epoch_samples=epoch_samples,
        epoch_hours=epoch_hours,
        run_length=parse_run_length(run_length),
        devices=devices,
        global_batch=global_batch,
        warm_start=warm_start,
        warm_fraction=warm_fraction,
        drift_threshold=drift_threshold,
        amp_check=AmpCheckSettings() if amp_check else None,
        compute_ceiling=ceiling,
        slurm=parse_executor(executor, slurm_partition, slurm_option, slurm_pin_wait),
        nodes=nodes,
    )


def check_run_args(model: str, args: list[str] | tuple[str, ...], workdir: str = ".") -> RunRequest:
    """Parse and check `autotune run` arguments as the command would, without running it: every problem that needs
    no hardware, workload or data is the same one-line UserError `autotune run` gives (`autotune schedule` calls this,
    so that a nightly job's typo fails now and not every night). --data and --space must exist as seen from
    `workdir`, where the job runs. Returns the RunRequest.

    Raises:
        UserError: an unknown option, a missing or unreadable value, a setting `autotune run` would refuse.
    """
    from autotune import workloads
    from autotune.validation import check_request, check_workload_options

    if "--help" in args:  # the parser would print run's help and exit
        raise UserError("--help is not a run argument for a scheduled job; leave it out")
    from autotune.cli import app  # the command whose parser reads them (it imports this module)

    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    try:
        context = command.make_context("autotune run", ["--model", model, *args])
    except typer.Exit:
        raise UserError("the arguments for 'autotune run' end the command before it runs; leave that one out") from None
    except Exception as error:  # click's (or typer's vendored click's) usage errors: no common public base to name
        message = getattr(error, "format_message", None)
        if message is None:
            raise
        raise UserError(f"the arguments for 'autotune run': {message()}") from None
    params = {name: value for name, value in context.params.items() if name != "verbose"}
    request = run_request(**params)
    check_request(request)
    check_workload_options(workloads.get(model), request.workload_options)
    for flag, path in (("--data", request.data), ("--space", request.space)):
        if path and not os.path.exists(os.path.join(workdir, os.path.expanduser(path))):
            raise UserError(f"{flag} {path} does not exist, seen from {workdir} where the job runs; fix the path")
    return request
