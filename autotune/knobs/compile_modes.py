"""torch.compile as a knob: which modes a trial may compile its model with, where each runs, and how it is applied.

Values of the `compile` knob:

- ``off``: eager, what every recipe runs.
- ``default``: ``torch.compile(module)`` with torch's defaults (inductor, mode "default", ``dynamic=None``): shapes
  are specialised at first, and a dimension that changes is made symbolic at its first recompile (automatic dynamic
  shapes), so a workload with variable-length batches pays one or a few recompiles, not one per length.
- ``dynamic``: ``torch.compile(module, dynamic=True)``: symbolic shapes from the first compile, SpeechBrain's choice for
  its Conformer (speechbrain/speechbrain PR 2824; its gain: docs/how-it-measures.md); no recompile per length, possibly
  slower kernels.

Not offered, and why (docs/how-it-measures.md says the same):

- ``reduce-overhead`` (CUDA graphs): a graph is recorded per input shape, so padded speech batches of varying length
  re-record and keep a graph per shape; the gain is lost where shapes vary, which is every ASR and TTS workload here.
- ``max-autotune``: benchmarks kernel choices at compile time (minutes more per graph), and has crashed under DDP in
  recent torch releases; a tuner that runs short trials cannot pay or risk that per trial.

Where a mode runs is read from this torch and machine, not assumed: torch.compile must exist, dynamo support this
Python and nn.Module.compile engage it (on torch 2.4-2.8 it did not: probed, not read from the version); inductor on
a CPU needs a C++ compiler (torch._inductor's configured one on PATH), on CUDA it needs Triton.
A mode this machine cannot run is left out of the search space with a note (space/search_space.py), never measured as a
failed trial.

What compiling costs is measured per trial (trial/compile_watch.py) and charged against the throughput over the run
the result is for (trial/run_length.py); that compiled and eager training agree is checked like the AMP check
(trial/amp_check.py), on the same batches from the same weights.
"""

from __future__ import annotations

import functools
import shutil
from typing import Any

__all__ = [
    "MODES",
    "OFF",
    "apply",
    "check_label",
    "compile_kwargs",
    "compiled_modules",
    "left_out",
    "offered",
    "unsupported_reason",
]

OFF = "off"
MODES = (OFF, "default", "dynamic")
_KWARGS: dict[str, dict[str, Any]] = {"default": {}, "dynamic": {"dynamic": True}}


def compile_kwargs(mode: str) -> dict[str, Any]:
    """The keywords torch.compile takes for a mode (none for `default`); `off` compiles nothing.

    Raises:
        ValueError: not one of MODES.
    """
    if mode not in MODES:
        raise ValueError(f"compile {mode!r} is not one of {', '.join(MODES)}")
    if mode == OFF:
        raise ValueError("compile 'off' has no torch.compile arguments: nothing is compiled")
    return dict(_KWARGS[mode])


def _cpu_compiler() -> str | None:
    """The C++ compiler inductor would run on a CPU, when it is on PATH."""
    try:
        from torch._inductor import config

        configured = config.cpp.cxx
    except (ImportError, AttributeError):
        return None
    candidates = [name for name in (configured if isinstance(configured, tuple) else (configured,)) if name]
    return next((name for name in candidates if shutil.which(name)), None)


@functools.cache
def _module_compile_engages() -> bool:
    """Whether nn.Module.compile (how apply compiles) makes dynamo trace a module's call on this torch. On torch
    2.4-2.8 (seen with Python 3.10) it compiles nothing: the module runs eagerly, its first call takes a millisecond,
    and a trial would measure eager training under a compile label. Probed with dynamo's eager backend (a graph is
    captured, no code is generated); dynamo's caches are cleared afterwards."""
    import torch
    from torch._dynamo import utils

    before = utils.counters["stats"].get("unique_graphs", 0)
    try:
        probe = torch.nn.Linear(2, 2)
        probe.compile(backend="eager")
        with torch.no_grad():
            probe(torch.zeros(1, 2))
    except Exception:  # a torch whose Module.compile fails outright cannot compile the models either
        return False
    finally:
        torch._dynamo.reset()
    return utils.counters["stats"].get("unique_graphs", 0) > before


def _has_triton() -> bool:
    """Whether the Triton package is installed. Not torch's has_triton(): that probes the GPU, and the parent, which
    loads the space, never touches CUDA (trials do). A GPU too old for Triton (compute capability below 7.0) fails
    its compiled trials with inductor's own error instead of being left out."""
    try:
        from torch.utils._triton import has_triton_package
    except ImportError:
        return False
    return bool(has_triton_package())


def unsupported_reason(mode: str, device_type: str) -> str | None:
    """Why this torch and machine cannot compile the models with `mode` on `device_type`; None if they can."""
    import torch

    if mode == OFF:
        return None
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (torch 2.0 added it)"
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return f"torch {torch.__version__}'s dynamo does not support this Python"
    if not _module_compile_engages():
        return f"torch {torch.__version__}'s nn.Module.compile compiles nothing here (the model would run eagerly)"
    if device_type == "cpu" and _cpu_compiler() is None:
        return "inductor needs a C++ compiler on a CPU and none is on PATH (install g++, or set CXX)"
    if device_type == "cuda" and not _has_triton():
        return "inductor needs Triton on CUDA and this environment has none (pip install triton)"
    return None


def offered(choices: list[str], device_type: str) -> list[str]:
    """The choices this machine can run (every mode runs where any does: the reasons are the machine's)."""
    return [choice for choice in choices if unsupported_reason(choice, device_type) is None]


def left_out(choices: list[str], device_type: str) -> dict[str, str]:
    """The choices `offered` leaves out, each with the note saying why."""
    reasons = {choice: unsupported_reason(choice, device_type) for choice in choices}
    return {choice: f"compile {choice} left out of the search: {why}" for choice, why in reasons.items() if why}


def check_label(mode: str) -> str:
    """How the numerics check (trial/amp_check.py) names a compile mode beside the precisions it judges; the tuner
    looks a configuration's compile up under it (its word in the trial line)."""
    return f"compile={mode}"


def compiled_modules(model: Any) -> list[Any]:
    """The modules a workload's loss function calls: the model, or each entry of a ModuleDict / ModuleList that only
    holds them (the speaker workloads' embedder, classifier and margin loss), as SpeechBrain compiles each of its
    `modules` and a Lightning user compiles the network.

    The loss function itself is not compiled: the frameworks compile the network, and the result must measure what
    they run.
    """
    from torch import nn

    if isinstance(model, (nn.ModuleDict, nn.ModuleList)):
        return list(model.children())
    return [model]


def apply(model: Any, mode: str) -> int:
    """Compile the model's modules in place (nn.Module.compile: parameters, state-dict keys and the optimiser's
    references unchanged); returns how many modules were wrapped (0 for `off`)."""
    if mode == OFF:
        return 0
    kwargs = compile_kwargs(mode)
    modules = compiled_modules(model)
    for module in modules:
        module.compile(**kwargs)
    return len(modules)
