"""Precision settings: autocast dtype, TF32 backend flags and fp16 loss scaling, shared by trials and users.

"fp32" is strict IEEE float32 everywhere: it says so to cuDNN too, whose convolution default in current torch is
TF32. "tf32" is float32 storage with TF32 matmuls and convolutions. "bf16" and "fp16" are autocast; fp16 on CUDA
scales the loss with GradScaler. TF32 is set through both APIs where torch has the per-backend fp32_precision
settings, the legacy allow_tf32 flags first: in torch 2.14 the new setters leave the legacy state behind, and any
later legacy read (torch.backends.cudnn.flags(), which ESPnet's CTC enters every step; inductor's matmul precision
query) then raises "a mix of the legacy and new APIs". The legacy setters keep both states in step, and the
per-backend values set after them make conv and rnn explicit ("ieee" rather than "none").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["PrecisionSettings", "apply_backend_flags", "uses_new_tf32_api", "NullScaler"]

_AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionSettings:
    """How to run the maths of one training step."""

    precision: str  # fp32 | tf32 | bf16 | fp16
    device_type: str  # cuda | cpu
    cudnn_benchmark: bool = True

    @property
    def amp_dtype_name(self) -> str | None:
        return _AMP_DTYPES.get(self.precision)

    @property
    def tf32(self) -> bool:
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
        """Set TF32 and cudnn.benchmark for this process; returns the TF32 API used ("fp32_precision" or "legacy")."""
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


def apply_backend_flags(*, tf32: bool, cudnn_benchmark: bool, torch_module: ModuleType | None = None) -> str:
    """Set TF32 on or off explicitly (never left to torch's default, which has changed between releases).

    Args:
        tf32: allow TF32 in float32 matmuls and cuDNN convolutions/RNNs.
        cudnn_benchmark: let cuDNN time its algorithms for each new input shape.
        torch_module: torch, or a stand-in for tests.

    Returns:
        "fp32_precision" when the per-backend settings were set too, "legacy" when only the allow_tf32 flags were.
    """
    if torch_module is None:
        import torch as torch_module
    backends = torch_module.backends
    backends.cudnn.benchmark = cudnn_benchmark
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
