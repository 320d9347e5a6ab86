"""Proof steps on the maths: TF32 really on and off through autotune's flags, bf16 and fp16 autocast with GradScaler
and its skip gate on a real model's gradients, and what cudnn.benchmark does to CAM++'s convolutions."""

from __future__ import annotations

from typing import Any

from autotune.gpu_proof.campplus import build_campplus, campplus_loss, random_fbank_batch
from autotune.gpu_proof.registry import Proven, StepContext, step, synchronize, time_per_call

__all__ = ["MATMUL_SIZE"]

MATMUL_SIZE = 4096
NUM_SPEAKERS = 100


def _relative_error(value: Any, reference: Any) -> float:
    return float((value.double() - reference).abs().max() / reference.abs().max())


def _tf32_state() -> dict[str, Any]:
    from autotune.doctor.torch_checks import tf32_defaults

    return tf32_defaults()  # after apply_backend_flags this reads what it set, through both APIs


@step(
    "tf32", "TF32 set on and off through autotune's flags changes matmul and conv error and time", budget_s=90, min_s=20
)
def tf32(context: StepContext) -> Proven:
    import torch
    import torch.nn.functional as F

    from autotune.knobs.precision import apply_backend_flags

    device = torch.device(context.device)
    size = context.sized(MATMUL_SIZE, 256)
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device) for _ in range(2))
    x = torch.randn(context.sized(32, 2), 128, 64, 64, generator=generator).to(device)
    w = torch.randn(128, 128, 3, 3, generator=generator).to(device) / 30
    matmul_reference, conv_reference = a.double() @ b.double(), F.conv2d(x.double(), w.double(), padding=1)
    numbers: dict[str, Any] = {}
    for mode in ("ieee", "tf32"):
        numbers[f"api_{mode}"] = apply_backend_flags(tf32=mode == "tf32", cudnn_benchmark=False)
        numbers[f"matmul_{mode}_relative_error"] = _relative_error(a @ b, matmul_reference)
        seconds = time_per_call(lambda: a @ b, device, repeats=20)
        numbers[f"matmul_{mode}_tflops"] = 2 * size**3 / seconds / 1e12
        numbers[f"conv_{mode}_relative_error"] = _relative_error(F.conv2d(x, w, padding=1), conv_reference)
        numbers[f"conv_{mode}_s"] = time_per_call(lambda: F.conv2d(x, w, padding=1), device, repeats=20)
        numbers[f"flags_{mode}"] = _tf32_state()
        with torch.backends.cudnn.flags(enabled=True):  # ESPnet's CTC enters this every step: no API-mix error
            pass
    speedup = numbers["matmul_tf32_tflops"] / numbers["matmul_ieee_tflops"]
    numbers["matmul_tf32_speedup"] = speedup
    error_grew = numbers["matmul_tf32_relative_error"] > 10 * numbers["matmul_ieee_relative_error"]
    conv_error_grew = numbers["conv_tf32_relative_error"] > 10 * numbers["conv_ieee_relative_error"]
    passed = error_grew and conv_error_grew and numbers["matmul_ieee_relative_error"] < 1e-5 and speedup > 1.5
    return Proven(
        passed=passed,
        numbers=numbers,
        notes=[
            f"fp32 {MATMUL_SIZE}^3 matmul and a 3x3 conv against float64: TF32 keeps 10 mantissa bits (error ~1e-3), "
            "IEEE fp32 23 (~1e-6); passing needs both errors to grow >10x with TF32 on, IEEE under 1e-5 and the "
            "TF32 matmul >1.5x faster",
        ],
    )


def _train(context: StepContext, precision: str, steps: int, *, overflow: bool = False) -> dict[str, Any]:
    """Train CAM++ `steps` window steps in a precision through PrecisionSettings and SkipCountingScaler, as trials
    do; `overflow` multiplies the loss by 1e30 in the window so that fp16 gradients overflow for real."""
    import torch

    from autotune.knobs.precision import PrecisionSettings
    from autotune.trial.scaler import SkipCountingScaler, skip_gate_reason

    device = context.device
    settings = PrecisionSettings(precision=precision, device_type=torch.device(device).type)
    settings.apply_backend_flags()
    model, optimizer = build_campplus(device, NUM_SPEAKERS)
    features, labels = random_fbank_batch(device, context.sized(64, 2), NUM_SPEAKERS, frames=context.sized(298, 64))
    scaler = SkipCountingScaler(settings.grad_scaler())
    losses: list[Any] = []
    dtypes: set[str] = set()
    first_conv = next(m for m in model.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)))
    first_conv.register_forward_hook(lambda module, inputs, output: dtypes.add(str(output.dtype)))

    def one_step(factor: float) -> None:
        optimizer.zero_grad(set_to_none=True)
        with settings.autocast():
            loss = campplus_loss(model, features, labels)
        scaler.scale(loss * factor).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.detach())

    for _ in range(context.sized(20, 2)):  # warm-up: cudnn, allocator, and GradScaler's calibration from 2**16
        one_step(1.0)
    scaler.start_window()
    synchronize(device)
    seconds = time_per_call(lambda: one_step(1e30 if overflow else 1.0), device, repeats=steps, warmup=0)
    fraction = scaler.window_skip_fraction()
    return {
        "step_s": seconds,
        "autocast_dtype": ",".join(sorted(dtypes)),  # what the first convolution computed in
        "losses_finite": bool(torch.isfinite(torch.stack(losses)).all()),
        "calibrated": scaler.has_taken_a_step(),
        "final_scale": scaler.get_scale(),
        "skip_fraction": fraction,
        "gate": skip_gate_reason(fraction, 0.05),
    }


@step(
    "amp",
    "bf16 and fp16 autocast train CAM++; GradScaler calibrates; the skip gate sees real overflow",
    budget_s=120,
    min_s=30,
)
def amp(context: StepContext) -> Proven:
    steps = context.sized(20, 2)
    # A CPU rehearsal leaves fp16 out: CPU autocast has no GradScaler (so no gate) and its fp16 convolutions crawl.
    precisions = ("fp32", "bf16", "fp16") if context.device == "cuda" else ("fp32", "bf16")
    runs = {precision: _train(context, precision, steps) for precision in precisions}
    if context.device == "cuda":
        runs["fp16_forced_overflow"] = _train(context, "fp16", steps, overflow=True)
    numbers = {f"{name}_{key}": value for name, run in runs.items() for key, value in run.items()}
    if context.device != "cuda":
        passed = runs["bf16"]["autocast_dtype"] == "torch.bfloat16" and runs["fp32"]["losses_finite"]
        return Proven(passed=passed, numbers=numbers, notes=["a CPU rehearsal: fp32 and bf16 only"])
    dtypes_right = (runs["bf16"]["autocast_dtype"], runs["fp16"]["autocast_dtype"]) == (
        "torch.bfloat16",
        "torch.float16",
    )
    healthy = all(runs[p]["losses_finite"] for p in precisions)
    gate_quiet = runs["fp16"]["gate"] is None and runs["fp16"]["calibrated"]
    forced = runs["fp16_forced_overflow"]
    gate_fires = forced["skip_fraction"] == 1.0 and forced["gate"] is not None
    return Proven(
        passed=dtypes_right and healthy and gate_quiet and gate_fires,
        numbers=numbers,
        notes=[
            "20 warm-up steps (GradScaler halves its 2**16 start until the gradients fit: calibration, not counted), "
            "then timed window steps of CAM++ at batch 64 on random 3 s fbank; the forced run scales the loss by "
            "1e30 in the window so that every fp16 step overflows and must be skipped, and the gate (5%) must fire",
        ],
    )


def cudnn_first_steps(device_name: str, benchmark: bool, batch: int, frames: int, repeats: int) -> dict[str, Any]:
    """In a fresh process (the caller's spawn): CAM++'s first training step with cudnn.benchmark on or off, what the
    allocator reserved for it and how often it freed its cache to retry, then the steady step."""
    import torch

    from autotune.knobs.precision import apply_backend_flags

    device = torch.device(device_name)
    apply_backend_flags(tf32=True, cudnn_benchmark=benchmark)
    model, optimizer = build_campplus(device, NUM_SPEAKERS)
    features, labels = random_fbank_batch(device, batch, NUM_SPEAKERS, frames=frames)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        campplus_loss(model, features, labels).backward()
        optimizer.step()

    numbers: dict[str, Any] = {"first_step_s": time_per_call(train_step, device, repeats=1, warmup=0)}
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        numbers["first_step_reserved_peak_bytes"] = int(stats.get("reserved_bytes.all.peak", 0))
        numbers["first_step_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    numbers["step_s"] = time_per_call(train_step, device, repeats=repeats, warmup=min(3, repeats))
    if device.type == "cuda":
        numbers["steady_step_reserved_peak_bytes"] = int(torch.cuda.max_memory_reserved(device))
    return numbers


@step(
    "cudnn_benchmark",
    "cudnn.benchmark's effect on CAM++ training steps, and its autotuning cost",
    budget_s=90,
    min_s=20,
)
def cudnn_benchmark(context: StepContext) -> Proven:
    import multiprocessing

    import torch

    # Each setting in a fresh process, as each trial is: in one process the benchmark pass finds the heuristic pass's
    # algorithms already chosen for its shapes (PyTorch's plan cache is keyed by the convolution) and searches nothing
    # (benchmarks/gpu_proof.md#results).
    arguments = (context.device, context.sized(128, 2), context.sized(298, 64), context.sized(10, 1))
    numbers: dict[str, Any] = {}
    spawn = multiprocessing.get_context("spawn")
    for benchmark in (False, True):
        with spawn.Pool(1) as pool:
            measured = pool.apply(cudnn_first_steps, (arguments[0], benchmark, *arguments[1:]))
        key = "on" if benchmark else "off"
        numbers.update({name.replace("step", f"step_{key}", 1): value for name, value in measured.items()})
    numbers["speedup"] = numbers["step_off_s"] / numbers["step_on_s"]
    numbers["cudnn_enabled"] = bool(torch.backends.cudnn.enabled)
    return Proven(
        passed=numbers["step_on_s"] <= 1.10 * numbers["step_off_s"],
        numbers=numbers,
        notes=[
            "CAM++ forward+backward+SGD at batch 128, 3 s fbank, TF32, each setting in a fresh process as a trial is: "
            "the first step with benchmark on includes cuDNN's algorithm search (its time, the allocator's reserved "
            "peak and its cache-freeing retries are recorded: a search takes the free device as workspace); passing "
            "needs benchmark on to be no slower than off beyond 10% noise in the steady steps",
        ],
    )
