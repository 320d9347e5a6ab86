"""`autotune run --lightning pkg.module:factory`: a Lightning training built by the user's factory and fitted by
Lightning's own Trainer, as an own-training command under the probe.

The factory is the user's: a callable that returns a LightningModule, a (LightningModule, LightningDataModule) pair,
or a (LightningModule, train DataLoader(s)) pair. It takes, as keyword arguments, the DataLoader knobs it builds its
loaders with, named as the result YAML names them (``per_device_batch_size``, ``num_workers``, ``pin_memory``,
``prefetch_factor``, ``persistent_workers``): those it names are the knobs the search can change through it. The
Trainer's own knobs are autotune's to set: ``precision`` (Lightning's precision string, from the one table the
Lightning export writes too: knobs/precision.py LIGHTNING_PRECISION), ``benchmark`` (cudnn_benchmark) and, on a CPU,
torch's intra-op threads. What the user fixes with ``--trainer KEY=VALUE`` (devices, strategy,
accumulate_grad_batches, use_distributed_sampler, max_epochs...) goes to the Trainer unchanged and is read back by the
probe like any training's: the world size, the batches per optimizer step, each rank's share of an epoch (the
1/N^2 epoch of a sampler sharded twice is caught there).

The Trainer a trial fits saves no checkpoint, logs nothing and runs no validation, unless --trainer says otherwise:
the probe ends the training as soon as its window is measured, and a checkpoint or a validation pass inside the
window would be measured as the training's speed.

This module runs on both sides. In autotune's process, ``describe`` (in a subprocess, so that a factory's imports
cannot break or slow the run) checks the factory before anything runs, and ``lightning_command`` writes the command
trials run. In the training's process, ``python -m autotune.probe.lightning fit ...`` builds and fits; a factory that
returns the wrong thing is said in one line ("autotune probe: ..."), which the launcher reports as the reason.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.probe.command import TrainingCommand

__all__ = [
    "FACTORY_KNOBS",
    "TRAINER_KNOBS",
    "describe",
    "lightning_command",
    "load_factory",
    "main",
    "python_lines",
    "trainer_items",
]

# The DataLoader knobs a factory may take by name; the Trainer's (and the process's) knobs autotune sets itself.
FACTORY_KNOBS = ("per_device_batch_size", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
TRAINER_KNOBS = ("precision", "cudnn_benchmark", "intra_op_threads")
# Trainer arguments a trial sets unless --trainer does: nothing but the training is measured (module docstring).
_QUIET_TRAINER = {
    "enable_checkpointing": False,
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}
# Trainer arguments that are autotune's knobs: --trainer may not fix them (the search sets them).
_KNOB_ARGUMENTS = {"precision": "precision", "benchmark": "cudnn_benchmark"}
_DESCRIBE_TIMEOUT_S = 120.0
_FAILED = "autotune probe: "


class FactoryError(Exception):
    """The factory cannot be loaded, called or fitted as written: one line for the user."""


def _split(spec: str) -> tuple[str, str]:
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise FactoryError(
            f"--lightning {spec!r}: write package.module:factory (or path/to/file.py:factory), the callable that "
            "returns your LightningModule and its data"
        )
    return where, name


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable named by spec, imported from the current folder (a module path or a .py file)."""
    where, name = _split(spec)
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise FactoryError(f"--lightning {spec!r}: {where} is not a file")
            sys.path.insert(0, str(path.resolve().parent))  # its own imports, as `python file.py` would find them
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[path.stem] = module
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(where)
    except FactoryError:
        raise
    except Exception as error:  # the user's module failed to import: its own error, in one line
        text = str(error).splitlines()[0] if str(error) else ""
        raise FactoryError(f"--lightning {spec!r}: importing {where} failed: {type(error).__name__}: {text}") from None
    factory = getattr(module, name, None)
    if factory is None:
        raise FactoryError(f"--lightning {spec!r}: {where} has no {name}")
    if not callable(factory):
        raise FactoryError(f"--lightning {spec!r}: {name} is a {type(factory).__name__}, not a function to call")
    return factory


def _parameters(factory: Callable[..., Any], spec: str) -> dict[str, Any]:
    """The knobs the factory takes, each with its default (the training's value today; None without one). A
    parameter it requires that is not a knob cannot be given by a trial."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}
    taken: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in FACTORY_KNOBS:
            default = parameter.default
            taken[parameter.name] = default if isinstance(default, (bool, int, float, str)) else None
        elif parameter.default is parameter.empty:
            raise FactoryError(
                f"--lightning {spec!r}: the factory requires {parameter.name!r}, which autotune cannot give: give it a "
                f"default; the arguments a trial passes are {', '.join(FACTORY_KNOBS)}"
            )
    return taken


def _trainer_arguments(keys: Sequence[str]) -> None:
    """Each --trainer key an argument of this Lightning's Trainer, and not one of autotune's knobs."""
    if not keys:
        return  # Lightning is imported by the factory's module, if at all: its import error is the user's own
    trainer = _lightning()[0]
    accepted = set(inspect.signature(trainer.__init__).parameters) - {"self"}
    for key in keys:
        if key in _KNOB_ARGUMENTS:
            raise FactoryError(
                f"--trainer {key}: autotune sets it (the {_KNOB_ARGUMENTS[key]} knob, searched from your "
                f"training's value: --baseline {_KNOB_ARGUMENTS[key]}=VALUE)"
            )
        if key not in accepted:
            raise FactoryError(
                f"--trainer {key}: Lightning's Trainer takes no such argument (it takes {', '.join(sorted(accepted))})"
            )


def _lightning() -> tuple[Any, Any, Any]:
    """Lightning's Trainer, LightningModule and LightningDataModule (the `lightning` package, else
    `pytorch_lightning`); FactoryError when neither is installed."""
    for package in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        return module.Trainer, module.LightningModule, module.LightningDataModule
    raise FactoryError("--lightning needs Lightning: pip install lightning")


def describe(spec: str, trainer_keys: Sequence[str], *, cwd: str, python: str = sys.executable) -> dict[str, Any]:
    """The knobs the factory takes and their defaults, checked in a subprocess from cwd (the user's imports stay out
    of this process); UserError with the one line that says what is wrong."""
    argv = [
        python,
        "-m",
        "autotune.probe.lightning",
        "describe",
        spec,
        *(f"--trainer-key={key}" for key in trainer_keys),
    ]
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=_DESCRIBE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"--lightning {spec}: importing it took over {_DESCRIBE_TIMEOUT_S:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "error" in answer:
        raise UserError(str(answer["error"]))
    if "parameters" not in answer:
        last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UserError(f"--lightning {spec}: the factory could not be read ({last})")
    return dict(answer["parameters"])


def lightning_command(
    spec: str,
    *,
    parameters: Sequence[str],
    trainer: Sequence[str],
    apply: Sequence[str] = (),
    cwd: str = ".",
    python: str = sys.executable,
) -> TrainingCommand:
    """The command a trial runs: the factory's knobs and the Trainer's as placeholders, --trainer's values as given."""
    words = [python, "-m", "autotune.probe.lightning", "fit", spec]
    words += [f"--knob={name}={{{name}}}" for name in parameters]
    words += [f"--knob={name}={{{name}}}" for name in TRAINER_KNOBS]
    words += [f"--trainer={item}" for item in trainer]
    template = " ".join(_quote(word) for word in words)
    return TrainingCommand.checked(template, apply=list(apply), cwd=cwd, lightning=spec)


def _quote(word: str) -> str:
    return shlex.quote(word) if "{" not in word else word  # a placeholder is filled, then quoted, by argv()


def python_lines(command: TrainingCommand, config: Any, *, on_cuda: bool) -> list[str]:
    """The winner as the lines a user puts in their own Lightning script: the factory called with its knobs, the
    Trainer with the measured precision and --trainer's arguments, the process settings beside them."""
    from autotune.knobs.precision import LIGHTNING_PRECISION, PrecisionSettings

    assert command.lightning is not None
    where, name = command.lightning.rsplit(":", 1)
    words = shlex.split(command.template)
    knobs = [word.removeprefix("--knob=").split("=", 1)[0] for word in words if word.startswith("--knob=")]
    given = [word.removeprefix("--trainer=") for word in words if word.startswith("--trainer=")]
    module = Path(where).stem if where.endswith(".py") else where
    calls = ", ".join(f"{knob}={getattr(config, knob)!r}" for knob in knobs if knob in FACTORY_KNOBS)
    trainer = {"accelerator": "gpu" if on_cuda else "cpu", **_trainer_values(given)}
    trainer |= {"precision": LIGHTNING_PRECISION[config.precision], "benchmark": config.cudnn_benchmark}
    lines = ["import torch", "from lightning.pytorch import Trainer", f"from {module} import {name}", ""]
    if config.intra_op_threads is not None and not on_cuda:
        lines.append(f"torch.set_num_threads({config.intra_op_threads})")
    tf32 = PrecisionSettings(precision=config.precision, device_type="cuda" if on_cuda else "cpu").tf32
    if on_cuda and tf32 is not None:
        lines.append(f"torch.backends.cuda.matmul.allow_tf32 = {tf32}  # as measured (Lightning sets no TF32 flag)")
        lines.append(f"torch.backends.cudnn.allow_tf32 = {tf32}")
    lines.append(f"made = {name}({calls})")
    lines.append("trainer = Trainer(" + ", ".join(f"{key}={value!r}" for key, value in trainer.items()) + ")")
    lines.append(
        "# trainer.fit(module, datamodule=...) or (module, train_dataloaders=...), as your factory returns them"
    )
    return lines


def _trainer_values(items: Sequence[str]) -> dict[str, Any]:
    from autotune.probe.config_file import safe_scalar

    values: dict[str, Any] = {}
    for item in items:
        key, equals, text = item.partition("=")
        if not equals or not key.strip():
            raise FactoryError(f"--trainer {item!r}: write KEY=VALUE, e.g. --trainer devices=2")
        values[key.strip()] = safe_scalar(text.strip())
    return values


def trainer_items(items: Sequence[str]) -> list[str]:
    """--trainer's items checked for their form (KEY=VALUE), as autotune's process can before the factory loads."""
    try:
        _trainer_values(items)
    except FactoryError as error:
        raise UserError(str(error)) from None
    return list(items)


def _fit_arguments(made: Any, spec: str) -> tuple[Any, dict[str, Any]]:
    """The module and fit()'s data arguments from what the factory returned; FactoryError when it is neither form."""
    _, module_type, data_module_type = _lightning()
    expected = "return a LightningModule, (LightningModule, LightningDataModule) or (LightningModule, train DataLoader)"
    if isinstance(made, module_type):
        return made, {}
    if isinstance(made, (tuple, list)) and len(made) == 2 and isinstance(made[0], module_type):
        module, data = made
        if isinstance(data, data_module_type):
            return module, {"datamodule": data}
        if _is_loaders(data):
            return module, {"train_dataloaders": data}
        raise FactoryError(f"the factory {spec} returned a {type(data).__name__} beside its module: {expected}")
    what = f"a {type(made).__name__}" + (f" of {len(made)}" if isinstance(made, (tuple, list)) else "")
    raise FactoryError(f"the factory {spec} returned {what}: {expected}")


def _is_loaders(data: Any) -> bool:
    import torch.utils.data

    if isinstance(data, torch.utils.data.DataLoader):
        return True
    if isinstance(data, (list, tuple)):
        return bool(data) and all(_is_loaders(item) for item in data)
    if isinstance(data, dict):
        return bool(data) and all(_is_loaders(item) for item in data.values())
    return False


def _fit(spec: str, knobs: dict[str, Any], trainer_given: dict[str, Any]) -> None:
    import torch

    from autotune.knobs.precision import LIGHTNING_PRECISION, PrecisionSettings

    trainer_type = _lightning()[0]
    on_cuda = torch.cuda.is_available() and trainer_given.get("accelerator", "auto") in ("auto", "gpu", "cuda")
    precision = str(knobs.pop("precision"))
    benchmark = bool(knobs.pop("cudnn_benchmark", False))
    threads = knobs.pop("intra_op_threads", None)
    if threads is not None and not on_cuda:
        torch.set_num_threads(int(threads))
    settings = PrecisionSettings(
        precision=precision, device_type="cuda" if on_cuda else "cpu", cudnn_benchmark=benchmark
    )
    settings.apply_backend_flags(torch)  # TF32 on, off or as torch sets it, as for every trial
    if knobs.get("num_workers") == 0:  # what torch's DataLoader requires without workers
        knobs.update({name: None for name in ("prefetch_factor",) if name in knobs})
        knobs.update({name: False for name in ("persistent_workers",) if name in knobs})
    made = load_factory(spec)(**knobs)
    module, data = _fit_arguments(made, spec)
    arguments: dict[str, Any] = {
        "accelerator": "gpu" if on_cuda else "cpu",
        **_QUIET_TRAINER,
        **trainer_given,
        "precision": LIGHTNING_PRECISION[precision],
        "benchmark": benchmark,
    }
    devices = arguments.get("devices", 1)
    if "strategy" not in arguments and isinstance(devices, int) and devices > 1:
        arguments["strategy"] = "ddp"  # one process per device, started by Lightning re-running this command
    trainer_type(**arguments).fit(module, **data)


def _knob_values(items: Sequence[str]) -> dict[str, Any]:
    from autotune.probe.config_file import safe_scalar

    values: dict[str, Any] = {}
    for item in items:
        name, _, text = item.partition("=")
        value = safe_scalar(text)
        values[name] = None if value in ("None", "none", "null") else value
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.probe.lightning", description=__doc__)
    parser.add_argument("action", choices=("describe", "fit"))
    parser.add_argument("factory")
    parser.add_argument("--knob", action="append", default=[])
    parser.add_argument("--trainer", action="append", default=[])
    parser.add_argument("--trainer-key", action="append", default=[])
    args = parser.parse_args(argv)
    if args.action == "describe":
        try:
            _trainer_arguments(args.trainer_key)
            parameters = _parameters(load_factory(args.factory), args.factory)
        except FactoryError as error:
            print(json.dumps({"error": str(error)}))
            return 0
        print(json.dumps({"parameters": parameters}))
        return 0
    try:
        _fit(args.factory, _knob_values(args.knob), _trainer_values(args.trainer))
    except FactoryError as error:
        print(_FAILED + str(error), file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
