"""What `autotune run`'s options make: the RunRequest the runner is handed.

`autotune run` builds its request here, and `autotune schedule` builds its job's the same way (cli/schedule.py), so
that a nightly job's typo fails when it is scheduled. Nothing heavy is imported at module level (`autotune --help`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autotune.cli.parsing import (
    parse_budget,
    parse_duration,
    parse_executor,
    parse_run_length,
    parse_workload_options,
)

if TYPE_CHECKING:
    from autotune.probe.command import TrainingCommand
    from autotune.run.plan import RunRequest

__all__ = ["run_request"]


def _lightning_training(
    spec: str, trainer: list[str], apply: list[str], baseline: list[str]
) -> tuple[TrainingCommand, list[str]]:
    """The command a --lightning run's trials run, and its baseline: --baseline's values, else the factory's own
    defaults for the knobs it takes (the training as it runs today)."""
    from autotune.probe.lightning import describe, lightning_command, trainer_items

    items = trainer_items(trainer)
    parameters = describe(spec, [item.partition("=")[0].strip() for item in items], cwd=".")
    given = {item.partition("=")[0].strip() for item in baseline}
    defaults = [f"{name}={value}" for name, value in parameters.items() if value is not None and name not in given]
    command = lightning_command(spec, parameters=list(parameters), trainer=items, apply=apply)
    return command, [*baseline, *defaults]


def run_request(
    *,
    model: str | None,
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
    run_length: str,
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
    force: bool = False,
    command: str | None = None,
    config_file: Path | None = None,
    set_key: list[str] | None = None,
    apply: list[str] | None = None,
    baseline: list[str] | None = None,
    lightning: str | None = None,
    trainer: list[str] | None = None,
    recipe: str | None = None,
) -> RunRequest:
    """The RunRequest `autotune run` makes of its options (what `autotune schedule` checks its run arguments with).

    Raises:
        UserError: a value that cannot be read (a duration, an option, an executor).
    """
    from autotune.errors import UserError
    from autotune.probe.command import TrainingCommand
    from autotune.run.plan import RunRequest
    from autotune.search.settings import TunerSettings
    from autotune.trial import TimingSettings
    from autotune.trial.amp_curves import AmpCheckSettings

    if recipe is not None and command is None:
        raise UserError(
            f"--recipe {recipe} goes with --command: your recipe's command as you run it, e.g. --command "
            "'python train.py hparams/train.yaml --data_folder data'"
        )
    if command is not None and lightning is not None:
        raise UserError("give --command or --lightning, not both: --lightning makes the command itself")
    if command is None and lightning is None and not model:
        raise UserError(
            "give --model NAME (see 'autotune models'), --command 'YOUR TRAINING COMMAND' or --lightning "
            "package.module:factory"
        )
    if command is None and lightning is None and (config_file or set_key or apply or baseline):
        raise UserError("--config-file, --set, --apply and --baseline go with --command (your own training)")
    if trainer and lightning is None:
        raise UserError("--trainer goes with --lightning: the arguments of Lightning's Trainer")
    if lightning is not None and (config_file or set_key):
        raise UserError(
            "--config-file and --set go with --command; your --lightning factory takes the knobs as its arguments"
        )
    if recipe is not None and (config_file or set_key or apply):
        raise UserError(
            f"--config-file, --set and --apply do not go with --recipe {recipe}: autotune writes the values as the "
            "framework's own overrides"
        )
    training = None
    if recipe is not None:
        from autotune.exports.recipes import recipe_command

        assert command is not None
        training, defaults = recipe_command(recipe, command)
        given = {item.partition("=")[0].strip() for item in baseline or []}
        baseline = [*(baseline or []), *(item for item in defaults if item.partition("=")[0] not in given)]
    elif lightning is not None:
        training, baseline = _lightning_training(lightning, trainer or [], apply or [], baseline or [])
    elif command is not None:
        training = TrainingCommand.checked(
            command,
            config_path=str(config_file) if config_file else None,
            sets=set_key or [],
            apply=apply or [],
        )
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
    return RunRequest(
        model=model or "",
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
        force=force,
        command=training,
        baseline=tuple(baseline or ()),
    )
