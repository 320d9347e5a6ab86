"""`autotune run --command`: the user's own training as the run's workload (docs/own-training.md).

What differs from a built-in workload, and why:
- The baseline is the training as it runs today: the values given with --baseline, else the config file's own
  values for --set keys that take one knob whole, else torch's default for the knob (no workers, no pinning). A
  batch size has no default: the user says it.
- The space holds only the knobs the command carries (search_spaces/command.yaml, cut to them), the batch range set
  around the baseline's.
- Before the search, one reach check runs the command with every carried knob moved off its baseline: the probe
  reads back which values arrived. A knob that did not is left out of the search (it would measure nothing) with the
  probe's line saying where the training sets it; the knobs the command does not carry are fixed at what the training
  ran with, so the result says what the training really runs. A command that cannot be measured at all (it fails at
  import, never steps an optimizer) ends the run here, before any trial, with the trial's reason.
- The result carries the winner's exact command, and the user's config file written with the tuned keys (a new file
  beside the result, with a diff; the user's file is never written).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import yamlio
from autotune.data import DataSource
from autotune.errors import UserError
from autotune.knobs import declarations
from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import TORCH_DEFAULT_FP32
from autotune.machine.hardware import Hardware
from autotune.probe import config_file
from autotune.probe.command import CONFIG_PLACEHOLDER, OWN_TASK, TrainingCommand
from autotune.probe.launcher import CommandLauncher
from autotune.space import from_dict as space_from_dict
from autotune.space import space_path
from autotune.space.files import read as read_space
from autotune.space.search_space import SearchSpace
from autotune.trial.spec import TimingSettings
from autotune.workloads.base import Workload, WorkloadContext

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.result.tuned_config import TunedConfig
    from autotune.run.plan import RunPlan
    from autotune.trial.spec import TrialResult

__all__ = [
    "ReachCheck",
    "after_reach",
    "baseline_values",
    "command_space",
    "command_workload",
    "moved_off_baseline",
    "reach_check",
    "write_back",
]

logger = logging.getLogger(__name__)
# The reach check measures nothing that counts: a short window is enough for the probe to read the values back.
_REACH_TIMING = TimingSettings(window_s=1.0, min_timed_share=0.0, max_warmup_factor=2.0, max_throughput_cv=None)


def _never_built(context: WorkloadContext) -> Any:
    raise RuntimeError("an own-training run trains the user's command; autotune builds no model for it")


def command_workload(command: TrainingCommand, name: str | None) -> Workload:
    """The run's workload: named by --model, else by the training script (train.py -> train) or the Lightning
    factory's module."""
    if not name and command.lightning:  # pkg.train:make -> train, train.py:make -> train
        where = command.lightning.rsplit(":", 1)[0]
        name = Path(where).stem if where.endswith(".py") else where.rsplit(".", 1)[-1]
    if not name:
        words = shlex.split(command.template)
        scripts = [word for word in words if word.endswith(".py")]
        modules = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "-m"]  # python -m pkg.train
        name = Path(scripts[0]).stem if scripts else modules[0].rsplit(".", 1)[-1] if modules else Path(words[0]).name
    identity = "\n".join([command.cwd, command.template, command.config_path or "", *map("=".join, command.sets)])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]

    def own_data(path: str | None) -> DataSource:
        # The training reads its own data; the source stands for the command (the study is the command's).
        return DataSource(kind=OWN_TASK, path=f"{command.cwd}#{digest}", utterances=(), speakers=())

    return Workload(
        name=name,
        task=OWN_TASK,
        description=f"your training: {command.template}",
        build=_never_built,
        load_data=own_data,
        space_file="command",
        options={"command": command.to_dict()},  # the result's record of what ran (autotune export prints it)
    )


def _parse_baseline(items: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items:
        name, equals, text = item.partition("=")
        name = name.strip()
        if not equals or name not in declarations.NAMES:
            raise UserError(
                f"--baseline {item!r}: write KNOB=VALUE with a knob of the result YAML, e.g. "
                "--baseline per_device_batch_size=32"
            )
        values[name] = config_file.safe_scalar(text.strip())
    return values


def baseline_values(command: TrainingCommand, given: list[str]) -> dict[str, Any]:
    """The training's values today for each knob the command carries (module docstring says where each comes from)."""
    values = _parse_baseline(given)
    document = config_file.read(command.config_path) if command.config_path else {}
    for key, template in command.sets:
        name = template.strip()[1:-1] if template.strip().startswith("{") and template.strip().endswith("}") else None
        if name and name != CONFIG_PLACEHOLDER and name not in values:
            container, index = config_file.walk(document, key)
            values[name] = container[index]
    for name in command.knobs:
        if name in values:
            continue
        default = TORCH_DEFAULT_FP32 if name == "precision" else declarations.get(name).torch_default
        if default is None and name != "intra_op_threads":  # threads: None is torch's own choice
            raise UserError(
                f"the baseline needs {name}: your training's value today is not in --baseline nor in --config-file; "
                f"give --baseline {name}=VALUE"
            )
        values[name] = default
    return {name: value for name, value in values.items() if name in command.knobs or name == "per_device_batch_size"}


def command_space(command: TrainingCommand, baseline: dict[str, Any], hardware: Hardware) -> SearchSpace:
    """search_spaces/command.yaml cut to the command's knobs, its batch range around the baseline's."""
    data = read_space(space_path("command"))
    params = {name: dict(spec) for name, spec in data["params"].items() if name in command.knobs}
    expressible = command.precisions.get(hardware.device_type)
    if expressible and "precision" in params:  # a framework's own flag trains only these as asked
        params["precision"]["choices"] = [name for name in params["precision"]["choices"] if name in expressible]
        if baseline.get("precision") not in expressible:
            baseline = {**baseline, "precision": expressible[0]}  # what the recipe trains with its own default
    for name, least in command.least.items():  # what the framework cannot run is never asked for
        if name in params and "low" in params[name]:
            params[name]["low"] = max(int(params[name]["low"]), least)
    if "per_device_batch_size" in params:
        batch = int(baseline["per_device_batch_size"])
        params["per_device_batch_size"].update(low=max(1, batch // 4), high=max(2, batch * 4))
    for spec in params.values():  # a condition on a knob the command does not carry cannot hold: drop it
        when = spec.get("when")
        if isinstance(when, dict):
            kept = {key: value for key, value in when.items() if key == "device" or key in params}
            spec.pop("when")
            if kept:
                spec["when"] = kept
    fixed = (
        {}
        if "per_device_batch_size" in command.knobs
        else {"per_device_batch_size": baseline.get("per_device_batch_size", 1)}
    )
    if not params:
        raise UserError(
            "--command carries no knob this machine can search: put {placeholders} in it (e.g. {num_workers}), "
            "--set config keys, or --apply DataLoader knobs"
        )
    # None is torch's own choice (intra_op_threads): the baseline leaves the knob unset, as a recipe's does
    space_baseline = {name: value for name, value in baseline.items() if name in params and value is not None}
    return space_from_dict(
        {"workload": "command", "params": params, "fixed": fixed, "baseline": space_baseline},
        hardware,
        origin="the command's space",
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReachCheck:
    """What the reach check found: each carried knob's verdict, the values the training ran with, its cost."""

    in_force: dict[str, dict[str, Any]]
    observed: dict[str, Any]
    wall_s: float
    dataset_size: int | None = None  # the training's dataset, by its DataLoader: the epoch the prediction uses

    def left_out(self) -> list[str]:
        return [name for name, verdict in self.in_force.items() if verdict["in_force"] is False]

    def notes(self) -> list[str]:
        lines = [f"{self.in_force[name]['note']}: left out of the search" for name in self.left_out()]
        lines += [verdict["note"] for verdict in self.in_force.values() if verdict["in_force"] and verdict["note"]]
        return lines


def moved_off_baseline(space: SearchSpace, baseline: dict[str, Any], device_type: str) -> TrialConfig:
    """The baseline with every searched knob moved to another value it can take, so that a value that does not
    arrive shows (the baseline's own values may equal what a training hard-codes)."""
    values: dict[str, Any] = {**space.fixed, **baseline}
    for param in space.params:
        current = values.get(param.name)
        choices = getattr(param.distribution, "choices", None)
        if choices is not None:
            others = [choice for choice in choices if choice != current]
            values[param.name] = others[0] if others else current
        else:
            low, high = int(param.distribution.low), int(param.distribution.high)  # type: ignore[attr-defined]
            base = int(current) if current is not None else low
            values[param.name] = base + 1 if base + 1 <= high else max(low, base - 1)
    if values.get("num_workers", 0) == 0:
        values.pop("prefetch_factor", None)
        values.pop("persistent_workers", None)
    return TrialConfig.from_dict({key: value for key, value in values.items() if key in declarations.NAMES})


def reach_check(
    command: TrainingCommand,
    space: SearchSpace,
    name: str,
    device_type: str,
    timeout_s: float,
    launcher: Callable[..., TrialResult] | None = None,
) -> ReachCheck:
    """Run the command once with every carried knob moved; raise UserError when it cannot be measured at all. Its
    files live in a folder of their own, removed after it, or named in the error (the trial's log is there)."""
    from autotune.trial.spec import TrialSpec

    # A SLURM job's node sees the command's folder (it runs there), not this machine's /tmp: the check's files go there.
    shared = command.cwd if launcher is not None else None
    folder = Path(tempfile.mkdtemp(prefix=".autotune-reach-check-" if shared else "autotune-reach-check-", dir=shared))
    spec = TrialSpec(
        workload=name,
        workload_options={},
        data_file="",
        config=moved_off_baseline(space, space.baseline, device_type),
        timing=_REACH_TIMING,
        device_type=device_type,
        result_path=str(folder / "result.json"),
    )
    run = launcher if launcher is not None else CommandLauncher(command=command)  # a SLURM job under --executor slurm
    result = run(spec, workdir=folder, timeout_s=timeout_s)
    if result.observed is None or result.in_force is None:
        raise UserError(f"your training could not be measured: {result.reason} (its log: {folder / 'trial.log'})")
    shutil.rmtree(folder, ignore_errors=True)
    size = (result.epoch_accounting or {}).get("dataset_size")
    return ReachCheck(
        in_force=result.in_force,
        observed=result.observed,
        wall_s=result.wall_s or 0.0,
        dataset_size=int(size) if isinstance(size, int) else None,
    )


def after_reach(space: SearchSpace, reach: ReachCheck, command: TrainingCommand) -> SearchSpace:
    """The space the search runs: knobs that did not arrive fixed at the baseline, knobs the command does not carry
    fixed at what the training ran with."""
    left_out = set(reach.left_out())
    params = tuple(param for param in space.params if param.name not in left_out)
    if not params:
        raise UserError(
            "none of the values autotune set reached your training: "
            + "; ".join(reach.in_force[name]["note"] for name in sorted(left_out))
        )
    fixed = dict(space.fixed)
    for name in left_out:
        fixed[name] = space.baseline.get(name, fixed.get(name))
    for name, value in reach.observed.items():
        if name in declarations.NAMES and name not in command.knobs and name != "world_size" and value is not None:
            if name == "grad_accum_steps" and not isinstance(value, int):
                continue
            fixed[name] = value
    baseline = {name: value for name, value in space.baseline.items() if name not in left_out}
    return dataclasses.replace(space, params=params, fixed=fixed, baseline=baseline)


def write_back(plan: RunPlan, tuned: TunedConfig, result_path: Path) -> list[str]:
    """The winner's command and, with --config-file, the user's file with the tuned keys, beside the result (a new
    file and its diff). Returns what was written, for the output."""
    command = plan.request.command
    assert command is not None
    written: list[str] = []
    copy = command.write_config(tuned.config, config_file.tuned_folder(result_path))
    if copy is not None and command.config_path is not None:
        diff = config_file.diff(command.config_path, copy)
        diff_path = yamlio.atomic_write_text(copy.with_name(copy.name + ".diff"), diff)
        written += [str(copy), str(diff_path)]
    argv = command.argv(tuned.config, copy)
    script = yamlio.atomic_write_text(
        result_path.with_suffix(".command.sh"),
        f"# the tuned training, as measured by autotune ({result_path.name})\ncd {shlex.quote(command.cwd)}\n"
        f"{shlex.join(argv)}\n",
    )
    written.append(str(script))
    return written
