"""What torch.compile costs and buys on one recipe-size network, side by side: eager steps, then the same network
compiled (each mode asked for), its first step (the compile: trace, lowering, the C++ or Triton compiler, the
backward), a step at a new batch length (a recompile under `default`), and its steady step; the ratio of steady steps
and the break-even run (the samples after which the compile is repaid, trial/run_length.py's rule).

Forward, loss and backward of the network on random features of the recipe's crop (no optimizer, no data loading:
those are the same compiled or not). On a 2-core CPU a compile of CAM++ takes minutes; run it with nice beside other
work and write the load average beside the numbers (benchmarks/README.md).

    PYTHONPATH=. python benchmarks/compile_cost.py [--model cam++] [--mode default] [--batch 8] [--frames 200]
        [--device cpu|cuda] [--threads N] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune.knobs import compile_modes


def _networks() -> dict[str, Callable[[], torch.nn.Module]]:
    from autotune.models.campplus import CAMPPlus
    from autotune.models.ecapa_tdnn import ECAPATDNN

    return {"cam++": lambda: CAMPPlus(embedding_size=512), "ecapa-tdnn": lambda: ECAPATDNN(channels=1024)}


def _step(model: torch.nn.Module, features: torch.Tensor, device: torch.device) -> float:
    started = time.perf_counter()
    model(features).float().pow(2).mean().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def measure(name: str, mode: str, batch: int, frames: int, device: torch.device, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _networks()[name]().to(device).train()
    features = torch.randn(batch, frames, 80, device=device)
    other = torch.randn(batch, frames - frames // 10, 80, device=device)  # a new length: a recompile under default
    eager = [_step(model, features, device) for _ in range(steps)]
    compile_modes.apply(model, mode)
    first = _step(model, features, device)
    steady = [_step(model, features, device) for _ in range(steps)]
    try:
        new_length: float | str = _step(model, other, device)
    except Exception as error:  # inductor failing on a new shape is a finding, not a crash of the benchmark
        new_length = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    eager_s, compiled_s = statistics.median(eager[1:]), statistics.median(steady)
    compile_s = first - compiled_s
    saved_per_sample = (eager_s - compiled_s) / batch
    return {
        "model": name,
        "mode": mode,
        "device": device.type,
        "batch": batch,
        "frames": frames,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "eager_step_s": eager_s,
        "compiled_first_step_s": first,
        "compile_s": compile_s,
        "compiled_step_s": compiled_s,
        "steady_speedup": eager_s / compiled_s,
        "new_length_step_s": new_length,
        "break_even_samples": compile_s / saved_per_sample if saved_per_sample > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cam++", choices=sorted(_networks()))
    parser.add_argument("--mode", default="default", choices=[m for m in compile_modes.MODES if m != "off"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=200)  # 2 s of 10-ms frames (3D-Speaker crops 3 s)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.model, args.mode, args.batch, args.frames, torch.device(args.device), args.steps)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
