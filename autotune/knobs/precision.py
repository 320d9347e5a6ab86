"""Precision settings: autocast dtype, TF32 backend flags and fp16 loss scaling, shared by trials and users.

"fp32-default" is float32 with the TF32 flags left as this torch sets them, as a recipe that sets none of them runs
(3D-Speaker, WeNet, ming024's FastSpeech2): in torch 2.x that is cuDNN convolutions in TF32 on Ampere and newer
(`torch.backends.cudnn.allow_tf32` True; `cudnn.conv.fp32_precision` "tf32") and matmuls in IEEE. It is the honest
baseline for those recipes: a strict-IEEE baseline runs slower maths than the recipe really does. "fp32" is strict
IEEE float32 everywhere: it says so to cuDNN too. "tf32" is float32 storage with TF32 matmuls and convolutions.
"bf16" and "fp16" are autocast; fp16 on CUDA scales the loss with GradScaler.

TF32 is set through both APIs where torch has the per-backend fp32_precision settings, the legacy allow_tf32 flags
first: in torch 2.14 the new setters leave the legacy state behind, and any later legacy read
(torch.backends.cudnn.flags(), which ESPnet's CTC enters every step; inductor's matmul precision query) then raises
"a mix of the legacy and new APIs". The legacy setters keep both states in step, and the per-backend values set
after them make conv and rnn explicit ("ieee" rather than "none").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "PRECISIONS",
    "TORCH_DEFAULT_FP32",
    "PrecisionSettings",
    "apply_backend_flags",
    "fp32_math",
    "uses_new_tf32_api",
    "LIGHTNING_PRECISION",
    "NullScaler",
]

TORCH_DEFAULT_FP32 = "fp32-default"
# Every precision a trial can run, from the most to the least exact maths.
PRECISIONS = ("fp32", TORCH_DEFAULT_FP32, "tf32", "bf16", "fp16")
_AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
# Each precision as Lightning 2.x's Trainer(precision=...) says it: float32 runs as "32-true", its TF32 flags set
# beside the Trainer (Lightning sets none). One table for both directions: the Lightning export writes it, a
# --lightning trial fits with it.
LIGHTNING_PRECISION = {
    "fp32": "32-true",
    TORCH_DEFAULT_FP32: "32-true",
    "tf32": "32-true",
    "bf16": "bf16-mixed",
    "fp16": "16-mixed",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionSettings:
    """How to run the maths of one training step."""

    precision: str  # one of PRECISIONS
    device_type: str  # cuda | cpu
    cudnn_benchmark: bool = True

    @property
    def amp_dtype_name(self) -> str | None:
        return _AMP_DTYPES.get(self.precision)

    @property
    def tf32(self) -> bool | None:
        """TF32 on (tf32), off (strict fp32 and the autocast precisions), or None: left as torch sets it."""
        if self.precision == TORCH_DEFAULT_FP32:
            return None
        return self.precision == "tf32"

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "fp16" and self.device_type == "cuda"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast for bf16/fp16; a no-op context for fp32 and tf32."""
        import torch

        if self.amp_dtype_name is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=getattr(torch, self.amp_dtype_name)):
            yield

    def apply_backend_flags(self, torch_module: ModuleType | None = None) -> str:
        """Set TF32 and cudnn.benchmark for this process; returns the TF32 API used ("fp32_precision" or "legacy"),
        or "default" where the TF32 flags are left as torch sets them (fp32-default)."""
        return apply_backend_flags(tf32=self.tf32, cudnn_benchmark=self.cudnn_benchmark, torch_module=torch_module)

    def grad_scaler(self) -> Any:
        """torch.amp.GradScaler("cuda") for fp16 on CUDA, else a scaler that does nothing."""
        if not self.uses_grad_scaler:
            return NullScaler()
        import torch

        return torch.amp.GradScaler("cuda")


def uses_new_tf32_api(torch_module: ModuleType) -> bool:
    """Whether this torch has the per-backend fp32_precision settings."""
    backends = torch_module.backends
    return hasattr(backends.cuda.matmul, "fp32_precision") and hasattr(backends.cudnn, "conv")


def apply_backend_flags(*, tf32: bool | None, cudnn_benchmark: bool, torch_module: ModuleType | None = None) -> str:
    """Set TF32 on or off explicitly, or leave it as torch sets it (a recipe that sets nothing).

    A tuned precision sets TF32 explicitly rather than trusting torch's default, which has changed between releases;
    fp32-default leaves it alone on purpose, to measure a recipe as it really runs on this torch.

    Args:
        tf32: allow TF32 in float32 matmuls and cuDNN convolutions/RNNs; None: leave every TF32 flag untouched.
        cudnn_benchmark: let cuDNN time its algorithms for each new input shape.
        torch_module: torch, or a stand-in for tests.

    Returns:
        "fp32_precision" when the per-backend settings were set too, "legacy" when only the allow_tf32 flags were,
        "default" when no TF32 flag was touched.
    """
    if torch_module is None:
        import torch

        torch_module = torch  # an assignment, unlike `import torch as torch_module`, narrows the Optional for mypy
    backends = torch_module.backends
    backends.cudnn.benchmark = cudnn_benchmark
    if tf32 is None:
        return "default"
    new_api = uses_new_tf32_api(torch_module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # their deprecation notice: deliberate, see the module docstring
        backends.cuda.matmul.allow_tf32 = tf32
        backends.cudnn.allow_tf32 = tf32
    if not new_api:
        return "legacy"
    value = "tf32" if tf32 else "ieee"
    # The generic torch.backends.fp32_precision does not reach cudnn.conv: set each backend.
    backends.cuda.matmul.fp32_precision = value
    backends.cudnn.conv.fp32_precision = value
    backends.cudnn.rnn.fp32_precision = value
    return "fp32_precision"


def fp32_math(torch_module: ModuleType | None = None) -> dict[str, str]:
    """How float32 matmuls and cuDNN convolutions run in this process now: "ieee" or "tf32" for each.

    Read after the precision's flags are set, so that a result says which maths was measured: fp32-default's state
    is whatever this torch release defaults to. Reads the API the flags were set through (new where torch has it):
    a legacy read after a new-API write raises in torch 2.9+. A "none" per-backend value inherits the generic
    setting, and "none" there means IEEE.
    """
    if torch_module is None:
        import torch

        torch_module = torch  # an assignment, unlike `import torch as torch_module`, narrows the Optional for mypy
    backends = torch_module.backends
    if not uses_new_tf32_api(torch_module):
        return {
            "matmul": "tf32" if backends.cuda.matmul.allow_tf32 else "ieee",
            "cudnn_conv": "tf32" if backends.cudnn.allow_tf32 else "ieee",
        }

    def resolved(*values: str) -> str:
        chosen = next((value for value in values if value != "none"), "ieee")
        return "tf32" if chosen == "tf32" else "ieee"

    generic = getattr(backends, "fp32_precision", "none")
    return {
        "matmul": resolved(backends.cuda.matmul.fp32_precision, generic),
        "cudnn_conv": resolved(
            backends.cudnn.conv.fp32_precision, getattr(backends.cudnn, "fp32_precision", "none"), generic
        ),
    }


class NullScaler:
    """The GradScaler interface for runs that need no loss scaling."""

    def scale(self, loss: Any) -> Any:
        return loss

    def unscale_(self, optimizer: Any) -> None:
        return None  # gradients are not scaled; training code that clips gradients calls this

    def step(self, optimizer: Any) -> Any:
        return optimizer.step()

    def update(self) -> None:
        return None

    def get_scale(self) -> float:
        return 1.0
