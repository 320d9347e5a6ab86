"""The GPU proof kit (`autotune doctor --gpu-proof`): every GPU-only path of autotune exercised for real on a CUDA
machine within 10 minutes, each step in its own process with pass/fail and the numbers it measured, written as a
markdown report (benchmarks/results/gpu_proof-<device>.md in this repository).

Steps, in order: TF32 on/off (error and time), bf16/fp16 autocast with GradScaler and the skip gate on real
gradients, cudnn.benchmark, NVML telemetry and fraction of peak, CUDA peak memory against NVML, NCCL with DDP, an
OOM trial inside a real study, a full `autotune run --model cam++` with exports, and its YAML in a plain loop.
On a machine without CUDA it proves nothing and says so (exit 1): it never pretends.
"""

from __future__ import annotations

import importlib

from autotune.gpu_proof.registry import STEPS, Proven, Step, StepContext, step
from autotune.gpu_proof.report import NOTHING_PROVEN, ProofReport, StepResult
from autotune.gpu_proof.runner import DEFAULT_TIME_LIMIT_S, ProofSettings, run_proof

# The steps' modules, imported (so registered) in the order the proof runs them: quick kernel checks first, the
# long run last, so that a proof cut short has proven the most it could.
STEP_MODULES = ("steps_kernels", "steps_device", "steps_runs")
for _module in STEP_MODULES:
    importlib.import_module(f"autotune.gpu_proof.{_module}")

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "NOTHING_PROVEN",
    "STEPS",
    "ProofReport",
    "ProofSettings",
    "Proven",
    "Step",
    "StepContext",
    "StepResult",
    "run_proof",
    "step",
]
