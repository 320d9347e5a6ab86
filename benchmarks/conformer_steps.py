"""The conformer recipe's steps one by one, and what the worst-case scan leaves behind, on this machine.

Two measurements behind benchmarks/results/conformer-own-figure-2026-12-04-vm.md:

- `steps PRECISION N`: the first N batches of a trial's shuffle (seed 0) trained in this process as a trial trains
  them (the recipe's batch of 16, 2 workers, accumulation 4, 2 intra-op threads: the trial's Stepper), each step
  timed alone, with its samples and seconds of audio; one JSON line. `--scan` runs the trial's worst-case scan
  first, `--flush-denormal` sets torch.set_flush_denormal(True) (is what the scan leaves denormal numbers?).
- `scan PRECISION on|off`: one real trial subprocess of 12 window steps with the worst-case scan on or off; one JSON
  line of its step median, window rate and first warm-up steps.

    .venv/bin/python benchmarks/conformer_steps.py steps fp32 40 --data-file DATA.json
    .venv/bin/python benchmarks/conformer_steps.py scan bf16 on --data-file DATA.json

DATA.json is a trial's data file (a run's trials/*/data.json, or a peers.py --keep folder's data.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

import torch  # noqa: E402

from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.trial import TimingSettings, TrialSpec, launch  # noqa: E402


def _config(precision: str) -> TrialConfig:
    return TrialConfig(
        per_device_batch_size=16,
        num_workers=2,
        prefetch_factor=10,
        persistent_workers=True,
        precision=precision,
        intra_op_threads=2,
        grad_accum_steps=4,
        workload_knobs={"batch_type": "static"},
    )


def _spec(data_file: str, precision: str, timing: TimingSettings, result: Path) -> TrialSpec:
    return TrialSpec(
        workload="conformer",
        workload_options={},
        data_file=data_file,
        config=_config(precision),
        timing=timing,
        device_type="cpu",
        result_path=str(result),
    )


def steps(data_file: str, precision: str, count: int, *, scan_first: bool = False, flush: bool = False) -> dict:
    from autotune.knobs.process import apply_process_settings
    from autotune.trial.distributed import Forward
    from autotune.trial.loader import build_loader
    from autotune.trial.loop import Stepper
    from autotune.trial.process import TrialProcess
    from autotune.trial.worst_case import scan_worst_case

    torch.set_flush_denormal(flush)

    spec = _spec(data_file, precision, TimingSettings(), Path(tempfile.mkdtemp()) / "result.json")
    process = TrialProcess.open(spec)
    settings = process.precision(spec.config)
    apply_process_settings(spec.config, settings)
    setup = process.build(spec.config)
    loader = build_loader(setup, spec.config, total_batches=count, seed=spec.seed)
    forward = Forward(setup.model, setup.loss_fn, process.device)
    scanned_s = 0.0
    if scan_first:
        began = time.perf_counter()
        scan_worst_case(setup, spec.config, forward=forward, precision=settings, device=process.device)
        scanned_s = round(time.perf_counter() - began, 1)
    step = Stepper(setup, forward, settings, spec.config.grad_accum_steps)
    rows, last = [], time.perf_counter()
    for index, batch in enumerate(loader):
        step(setup.batch_to_device(batch, process.device, False))
        now = time.perf_counter()
        rows.append([index, round(now - last, 3), setup.samples_in(batch), round(setup.audio_seconds_in(batch), 1)])
        last = now
        if index + 1 >= count:
            break
    return {
        "precision": precision,
        "scan_s": scanned_s if scan_first else None,
        "flush_denormal": flush,
        "rows (batch, step s, samples, audio s)": rows,
    }


def scan(data_file: str, precision: str, on: bool) -> dict:
    timing = TimingSettings(
        worst_case_scan=on, min_window_steps=12, max_window_steps=12, window_s=1.0, min_timed_share=0.0
    )
    work = Path(tempfile.mkdtemp())
    result = launch(_spec(data_file, precision, timing, work / "result.json"), workdir=work, timeout_s=900)
    keys = ("status", "reason", "step_time_median_s", "window_samples_per_second", "worst_case_s")
    return {
        "precision": precision,
        "scan": on,
        **{k: getattr(result, k) for k in keys},
        "warmup_first_steps_s": result.warmup_first_steps_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("steps", "scan"))
    parser.add_argument("precision", choices=("fp32", "bf16"))
    parser.add_argument("arg", help="steps: how many batches; scan: on or off")
    parser.add_argument("--data-file", required=True)
    parser.add_argument("--scan", action="store_true", help="steps: the worst-case scan first")
    parser.add_argument("--flush-denormal", action="store_true", help="steps: torch.set_flush_denormal(True)")
    args = parser.parse_args()
    if args.what == "steps":
        result = steps(args.data_file, args.precision, int(args.arg), scan_first=args.scan, flush=args.flush_denormal)
        print(json.dumps(result))
    else:
        print(json.dumps(scan(args.data_file, args.precision, args.arg == "on")))


if __name__ == "__main__":
    main()
