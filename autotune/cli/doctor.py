"""`autotune doctor`: parse, call autotune.doctor (or the GPU proof kit), print."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.cli.app import app
from autotune.cli.output import fail, stderr_console, stdout_console
from autotune.errors import UserError

__all__ = ["DOCTOR_HELP", "doctor"]

DOCTOR_HELP = """Check this machine before a long tuning or training run: what will cost speed or stability, each \
with a verdict and a one-line fix.

The torch build against the GPUs (CUDA, cuDNN, kernels for this architecture), the driver, every visible GPU \
through NVML (memory and load, MIG, ECC, persistence mode, clocks and throttle reasons, PCIe link, power limit), \
CUDA_VISIBLE_DEVICES as CUDA reads it, TF32 defaults, bf16, NCCL/gloo, CPU cores, affinity, NUMA and governor, \
/dev/shm and open files against what the DataLoader of --model needs, the audio decoders, and --data's read speed.

[bold]Examples[/bold]

  autotune doctor --model cam++

  autotune doctor --result results/cam++/h100-x1-abc.yaml --data data/train.csv --json

  autotune doctor --gpu-proof --out gpu_proof.md   [dim]# on a CUDA machine: prove every GPU path, ~10 min[/dim]

[bold]Exit codes[/bold]: 0 nothing fails (warnings may stand); 1 a check failed (or, with --gpu-proof, a proof step \
failed or no CUDA device was there to prove anything); 2 bad input.
"""


@app.command(help=DOCTOR_HELP)
def doctor(
    model: Annotated[
        Optional[str], typer.Option("--model", "-m", help="Workload whose DataLoader to size /dev/shm for.")
    ] = None,
    batch_size: Annotated[
        Optional[int], typer.Option(help="Per-device batch (default: --result's winner, else the recipe's).")
    ] = None,
    workers: Annotated[Optional[int], typer.Option(help="DataLoader workers per process.")] = None,
    prefetch_factor: Annotated[Optional[int], typer.Option(help="Batches each worker prefetches.")] = None,
    data: Annotated[Optional[str], typer.Option(help="Data list or folder: time reading a short sample of it.")] = None,
    result: Annotated[
        Optional[Path], typer.Option(help="A result YAML: size for its winner and compare its data rate.")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
    gpu_proof: Annotated[
        bool, typer.Option("--gpu-proof", help="Exercise every GPU-only path for real and write a report.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Markdown report of --gpu-proof (a JSON twin beside it).")] = Path(
        "gpu_proof.md"
    ),
    time_limit: Annotated[float, typer.Option(help="Seconds --gpu-proof may take in all.")] = 600.0,
    proof_steps: Annotated[
        Optional[str],
        typer.Option(help="Only these --gpu-proof steps, comma-separated (e.g. to re-run what failed)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens in detail.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if gpu_proof:
        _prove(out, time_limit, proof_steps)
        return
    from autotune.doctor import DoctorRequest, diagnose
    from autotune.doctor.render import render_json, render_table, summary_line

    request = DoctorRequest(
        model=model,
        per_device_batch_size=batch_size,
        num_workers=workers,
        prefetch_factor=prefetch_factor,
        data=data,
        result=str(result) if result else None,
    )
    try:
        report = diagnose(request)
    except UserError as error:
        raise fail(str(error)) from None
    if json_output:
        typer.echo(render_json(report))
    else:
        stdout_console.print(render_table(report))
        stdout_console.print(summary_line(report), highlight=False)
    raise typer.Exit(report.exit_code)


def _prove(out: Path, time_limit_s: float, steps: str | None) -> None:
    from autotune.gpu_proof import ProofSettings, run_proof

    chosen = tuple(name.strip() for name in steps.split(",") if name.strip()) if steps else None
    try:
        report = run_proof(ProofSettings(out=out, time_limit_s=time_limit_s, steps=chosen))
    except UserError as error:
        raise fail(str(error)) from None
    if report.nothing_proven:
        raise fail(report.verdict_line(), 1)
    stdout_console.print(report.verdict_line(), highlight=False)
    stderr_console.print(f"report: [bold]{out}[/bold]")
    raise typer.Exit(report.exit_code)
