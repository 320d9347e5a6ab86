"""Optimizer kernels: which implementation of its recipe's SGD or Adam a trial steps with, and where each runs.

torch's SGD and Adam have three implementations of the same update: a Python for-loop over the parameters, `foreach`
(one multi-tensor op per step phase; with a real kernel on CUDA, a C++ loop elsewhere) and `fused` (one kernel for
the whole step). `default` passes neither flag, as every recipe does, and gets torch's own choice
(torch/optim/optimizer.py `_default_to_fused_or_foreach`: foreach when every parameter is on a device with foreach
kernels, the for-loop otherwise; never fused). So on CUDA `default` and `foreach` run the same kernels, and on a CPU
all three differ.

What a device can run is read from this torch, not assumed from its version: the optimizers' constructors must
take the flag, and `fused` must list the device type among torch's fused-kernel devices (the check torch itself makes
at the first step, `_device_dtype_check_for_fused`). torch 2.4 added fused SGD/Adam on the CPU. A value the device
cannot run is left out of the search space with a note (space/search_space.py), never measured as a failed trial.

The three implementations compute the same update up to the order of floating-point operations
(tests/knobs/test_optimizer_kernels.py steps the workloads' own optimizers with each and compares the parameters).
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = [
    "DEFAULT",
    "IMPLEMENTATIONS",
    "build",
    "constructor_kwargs",
    "left_out",
    "offered",
    "same_kernels",
    "unsupported_reason",
]

DEFAULT = "default"
IMPLEMENTATIONS = (DEFAULT, "foreach", "fused")
# The optimizers the built-in workloads step with (workloads/speaker.py, workloads/asr.py, workloads/tts.py): a flag
# counts as supported only when all of them take it.
_OPTIMIZERS = ("SGD", "Adam")
# torch.utils._foreach_utils' lists when this torch has none (older releases): CUDA only, as they started.
_FALLBACK_DEVICES = ("cuda",)


def constructor_kwargs(implementation: str) -> dict[str, bool]:
    """The keyword a torch.optim constructor takes for an implementation: none for `default` (torch's own choice)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"optimizer_impl {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    return {} if implementation == DEFAULT else {implementation: True}


def build(optimizer_class: Any, parameters: Any, implementation: str, **recipe: Any) -> Any:
    """The recipe's optimizer (its class and arguments) with the implementation's flag added."""
    return optimizer_class(parameters, **recipe, **constructor_kwargs(implementation))


def _kernel_devices(kind: str) -> tuple[str, ...]:
    from torch.utils import _foreach_utils

    lister = getattr(_foreach_utils, f"_get_{kind}_kernels_supported_devices", None)
    return tuple(lister()) if callable(lister) else _FALLBACK_DEVICES


def unsupported_reason(implementation: str, device_type: str) -> str | None:
    """Why this torch cannot step the workloads' optimizers with `implementation` on `device_type`; None if it can.

    foreach runs everywhere its flag exists (without a multi-tensor kernel, torch loops over the tensors in C++).
    """
    import torch

    if implementation == DEFAULT:
        return None
    for name in _OPTIMIZERS:
        if implementation not in inspect.signature(getattr(torch.optim, name)).parameters:
            return f"torch {torch.__version__}'s torch.optim.{name} has no {implementation} argument"
    if implementation == "fused" and device_type not in _kernel_devices("fused"):
        return f"torch {torch.__version__} has no fused optimizer kernels for {device_type}"
    return None


def same_kernels(implementation: str, device_type: str) -> bool:
    """Whether `implementation` is what `default` runs on this device type anyway (foreach where torch picks it)."""
    return implementation == "foreach" and device_type in _kernel_devices("foreach")


def offered(choices: list[str], device_type: str) -> list[str]:
    """The choices this torch and device can run, each set of kernels once (foreach is left out where it is what
    `default` runs: measuring it again would spend a trial on the same kernels)."""
    return [choice for choice in choices if choice not in left_out(choices, device_type)]


def left_out(choices: list[str], device_type: str) -> dict[str, str]:
    """The choices `offered` leaves out, each with the note saying why."""
    notes: dict[str, str] = {}
    for choice in choices:
        reason = unsupported_reason(choice, device_type)
        if reason is not None:
            notes[choice] = f"optimizer_impl {choice} left out of the search: {reason}"
        elif DEFAULT in choices and same_kernels(choice, device_type):
            notes[choice] = (
                f"optimizer_impl {choice} left out of the search: it is what torch runs by default on {device_type} "
                "(the same kernels as `default`)"
            )
    return notes
