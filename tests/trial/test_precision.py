"""Precision settings: TF32 backend flags (new and legacy torch APIs), autocast and loss scaling."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from autotune.knobs.precision import (
    NullScaler,
    PrecisionSettings,
    apply_backend_flags,
    fp32_math,
    uses_new_tf32_api,
)


def new_api_torch() -> SimpleNamespace:
    """A torch with both the legacy allow_tf32 flags and the per-backend fp32_precision settings (2.9 and later)."""
    cuda = SimpleNamespace(matmul=SimpleNamespace(allow_tf32=None, fp32_precision="none"))
    cudnn = SimpleNamespace(
        allow_tf32=None,
        benchmark=False,
        conv=SimpleNamespace(fp32_precision="none"),
        rnn=SimpleNamespace(fp32_precision="none"),
    )
    return SimpleNamespace(backends=SimpleNamespace(cuda=cuda, cudnn=cudnn, fp32_precision="none"))


def legacy_torch() -> SimpleNamespace:
    cuda = SimpleNamespace(matmul=SimpleNamespace(allow_tf32=None))
    cudnn = SimpleNamespace(allow_tf32=None, benchmark=None)
    return SimpleNamespace(backends=SimpleNamespace(cuda=cuda, cudnn=cudnn))


def _new_api_values(fake: SimpleNamespace) -> tuple[str, str, str]:
    backends = fake.backends
    return (
        backends.cuda.matmul.fp32_precision,
        backends.cudnn.conv.fp32_precision,
        backends.cudnn.rnn.fp32_precision,
    )


@pytest.mark.parametrize(("tf32", "expected"), [(True, "tf32"), (False, "ieee")], ids=["tf32", "fp32"])
def test_new_api_sets_each_backend_and_the_legacy_flags_too(tf32: bool, expected: str) -> None:
    fake = new_api_torch()
    assert uses_new_tf32_api(fake)  # type: ignore[arg-type]
    assert apply_backend_flags(tf32=tf32, cudnn_benchmark=True, torch_module=fake) == "fp32_precision"  # type: ignore[arg-type]
    assert _new_api_values(fake) == (expected, expected, expected)
    assert fake.backends.cudnn.benchmark is True
    assert fake.backends.cudnn.allow_tf32 is tf32 and fake.backends.cuda.matmul.allow_tf32 is tf32


@pytest.mark.parametrize(("tf32", "benchmark"), [(True, False), (False, True)], ids=["tf32", "fp32"])
def test_legacy_api_sets_allow_tf32_and_benchmark(tf32: bool, benchmark: bool) -> None:
    fake = legacy_torch()
    assert not uses_new_tf32_api(fake)  # type: ignore[arg-type]
    assert apply_backend_flags(tf32=tf32, cudnn_benchmark=benchmark, torch_module=fake) == "legacy"  # type: ignore[arg-type]
    assert fake.backends.cuda.matmul.allow_tf32 is tf32
    assert fake.backends.cudnn.allow_tf32 is tf32
    assert fake.backends.cudnn.benchmark is benchmark


def test_matmul_precision_without_cudnn_conv_is_legacy() -> None:
    fake = legacy_torch()
    fake.backends.cuda.matmul.fp32_precision = "none"  # a torch midway between the two APIs
    assert apply_backend_flags(tf32=True, cudnn_benchmark=True, torch_module=fake) == "legacy"  # type: ignore[arg-type]
    assert fake.backends.cudnn.allow_tf32 is True


def test_settings_apply_flags_through_the_module_function() -> None:
    fake = new_api_torch()
    settings = PrecisionSettings(precision="tf32", device_type="cuda", cudnn_benchmark=False)
    assert settings.apply_backend_flags(torch_module=fake) == "fp32_precision"  # type: ignore[arg-type]
    assert _new_api_values(fake) == ("tf32", "tf32", "tf32")
    assert fake.backends.cudnn.benchmark is False


# The real torch's fp32_precision settings arrived in torch 2.9; an older torch (the floor pyproject.toml names is
# tested too) has only the legacy flags, whose path the fakes above cover.
new_api_only = pytest.mark.skipif(
    not uses_new_tf32_api(torch), reason=f"torch {torch.__version__} has no fp32_precision settings (torch 2.9+)"
)


@pytest.fixture
def restore_torch_flags() -> Iterator[None]:
    backends = torch.backends
    saved = (*_new_api_values(torch), backends.cudnn.benchmark)  # type: ignore[arg-type]
    yield
    matmul, conv, rnn, benchmark = saved
    backends.cuda.matmul.fp32_precision = matmul
    backends.cudnn.conv.fp32_precision = conv
    backends.cudnn.rnn.fp32_precision = rnn
    backends.cudnn.benchmark = benchmark


@new_api_only
@pytest.mark.parametrize(("precision", "expected"), [("fp32", "ieee"), ("tf32", "tf32")], ids=["fp32", "tf32"])
def test_real_torch_takes_the_new_api(restore_torch_flags: None, precision: str, expected: str) -> None:
    settings = PrecisionSettings(precision=precision, device_type="cpu")
    assert settings.apply_backend_flags() == "fp32_precision"
    assert torch.backends.cudnn.conv.fp32_precision == expected
    assert torch.backends.cuda.matmul.fp32_precision == expected
    assert torch.backends.cudnn.benchmark is True


@pytest.mark.parametrize("fake", [new_api_torch, legacy_torch], ids=["new-api", "legacy"])
def test_torch_default_fp32_leaves_every_tf32_flag_alone(fake: Any) -> None:
    """fp32-default measures a recipe that sets no TF32 flag: nothing is touched but cudnn.benchmark."""
    module = fake()
    before = repr(module)
    settings = PrecisionSettings(precision="fp32-default", device_type="cuda", cudnn_benchmark=True)
    assert settings.apply_backend_flags(torch_module=module) == "default"
    assert module.backends.cudnn.benchmark is True
    module.backends.cudnn.benchmark = False if "new" in fake.__name__ else None
    assert repr(module) == before


def test_fp32_math_resolves_inherited_values_and_the_legacy_flags() -> None:
    fake = new_api_torch()  # "none" everywhere: every backend inherits the generic setting, which is IEEE
    assert fp32_math(fake) == {"matmul": "ieee", "cudnn_conv": "ieee"}  # type: ignore[arg-type]
    fake.backends.cudnn.conv.fp32_precision = "tf32"  # torch 2.9+'s own default for convolutions
    assert fp32_math(fake) == {"matmul": "ieee", "cudnn_conv": "tf32"}  # type: ignore[arg-type]
    fake.backends.fp32_precision = "tf32"
    assert fp32_math(fake) == {"matmul": "tf32", "cudnn_conv": "tf32"}  # type: ignore[arg-type]
    legacy = legacy_torch()
    legacy.backends.cuda.matmul.allow_tf32, legacy.backends.cudnn.allow_tf32 = False, True
    assert fp32_math(legacy) == {"matmul": "ieee", "cudnn_conv": "tf32"}  # type: ignore[arg-type]


_FP32_MATH_OF_EACH_PRECISION = """
from autotune.knobs.precision import PrecisionSettings, fp32_math
for precision in ("fp32-default", "fp32", "tf32"):
    PrecisionSettings(precision=precision, device_type="cuda").apply_backend_flags()
    math = fp32_math()
    print(precision, math["matmul"], math["cudnn_conv"])
"""


def test_real_torch_defaults_run_convolutions_in_tf32_and_matmuls_in_ieee() -> None:
    """The premise of fp32-default, on the torch installed here (2.x): a recipe that sets no flag gets TF32 cuDNN
    convolutions and IEEE matmuls, so a strict-IEEE baseline would be slower than the recipe really is."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FP32_MATH_OF_EACH_PRECISION], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["fp32-default ieee tf32", "fp32 ieee ieee", "tf32 tf32 tf32"]


_READ_EVERY_TF32_GETTER = """
import warnings
import torch
from autotune.knobs.precision import PrecisionSettings
with warnings.catch_warnings():
    warnings.simplefilter("error")  # the legacy setters' deprecation notice must not reach the user
    for precision in ("fp32", "tf32", "fp32"):
        PrecisionSettings(precision=precision, device_type="cuda").apply_backend_flags()
        print(
            precision,
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
            torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.rnn.fp32_precision,
        )
        with torch.backends.cudnn.flags(enabled=True, deterministic=True):  # ESPnet's CTC does this every step
            pass
"""


@new_api_only
def test_after_the_flags_every_tf32_getter_of_real_torch_reads_without_error() -> None:
    """A fresh interpreter: legacy reads after the new setters alone raise 'a mix of the legacy and new APIs'."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _READ_EVERY_TF32_GETTER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == [
        "fp32 False False highest ieee ieee ieee",
        "tf32 True True high tf32 tf32 tf32",
        "fp32 False False highest ieee ieee ieee",
    ]


@pytest.mark.parametrize(
    ("precision", "dtype_name", "tf32"),
    [
        ("fp32", None, False),
        ("fp32-default", None, None),
        ("tf32", None, True),
        ("bf16", "bfloat16", False),
        ("fp16", "float16", False),
    ],
    ids=["fp32", "fp32-default", "tf32", "bf16", "fp16"],
)
def test_amp_dtype_names(precision: str, dtype_name: str | None, tf32: bool | None) -> None:
    settings = PrecisionSettings(precision=precision, device_type="cuda")
    assert settings.amp_dtype_name == dtype_name
    assert settings.tf32 is tf32


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16", torch.bfloat16), ("fp32", torch.float32), ("tf32", torch.float32)],
    ids=["bf16", "fp32", "tf32"],
)
def test_cpu_autocast_sets_matmul_dtype(precision: str, dtype: torch.dtype) -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with PrecisionSettings(precision=precision, device_type="cpu").autocast():
        out = a @ b
    assert out.dtype == dtype
    assert (a @ b).dtype == torch.float32  # autocast ends with the context


class RecordingGradScaler:
    made: list[tuple[Any, ...]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        RecordingGradScaler.made.append((args, kwargs))


@pytest.fixture
def fake_grad_scaler(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    RecordingGradScaler.made = []
    monkeypatch.setattr(torch.amp, "GradScaler", RecordingGradScaler)
    return RecordingGradScaler.made


@pytest.mark.parametrize(
    ("precision", "device_type"),
    [("fp16", "cpu"), ("bf16", "cpu"), ("bf16", "cuda"), ("fp32", "cuda"), ("tf32", "cuda")],
    ids=["cpu-fp16", "cpu-bf16", "cuda-bf16", "cuda-fp32", "cuda-tf32"],
)
def test_no_loss_scaling_outside_cuda_fp16(fake_grad_scaler: list, precision: str, device_type: str) -> None:
    settings = PrecisionSettings(precision=precision, device_type=device_type)
    assert not settings.uses_grad_scaler
    assert isinstance(settings.grad_scaler(), NullScaler)
    assert fake_grad_scaler == []


def test_cuda_fp16_makes_a_cuda_grad_scaler(fake_grad_scaler: list) -> None:
    scaler = PrecisionSettings(precision="fp16", device_type="cuda").grad_scaler()
    assert isinstance(scaler, RecordingGradScaler)
    assert fake_grad_scaler == [(("cuda",), {})]


def test_null_scaler_steps_the_optimizer() -> None:
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaler = NullScaler()
    loss = (weight * 2).sum()
    scaled = scaler.scale(loss)
    assert scaled is loss
    scaled.backward()
    scaler.unscale_(optimizer)  # gradient clipping code calls this between backward and step
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach(), torch.zeros(2))
    assert scaler.get_scale() == 1.0
