"""What the own-training probe costs a training per optimizer step: the same training with and without it, side by
side in one run.

Each round starts the training twice as a fresh process, once plain and once under the probe (its window set beyond
the run, so it measures and never ends it), in alternating order; each process times its own steady steps (the
second half). The training is deliberately tiny (a 4-layer MLP on in-memory batches through a DataLoader, a step of
about a millisecond on a CPU), so that the probe's per-step cost in microseconds is not lost in the step's noise; the
cost in percent of a real step follows from it (built-in workloads' steps: tens to hundreds of milliseconds on a GPU,
seconds on a CPU).

    .venv/bin/python benchmarks/probe_overhead.py --rounds 6 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune import yamlio
from autotune.probe.settings import PROBE_ENV, ProbeSettings, bootstrap_dir
from autotune.trial.spec import TimingSettings


def child(steps: int) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times: list[float] = []
    last = time.perf_counter()
    while len(times) < steps:
        for features, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
            if len(times) >= steps:
                break
    steady = times[steps // 2 :]
    print(json.dumps({"median_step_s": statistics.median(steady), "mean_step_s": statistics.fmean(steady)}))


def run_one(steps: int, probed: bool, folder: Path) -> dict[str, float]:
    env = dict(os.environ)
    if probed:
        settings = ProbeSettings(
            result_path=str(folder / "result.json"),
            timing=TimingSettings(window_s=1e6, max_window_steps=10**9, max_warmup_steps=10, min_timed_share=0.0),
        )
        env[PROBE_ENV] = str(yamlio.write_json(folder / "probe.json", settings.to_dict()))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(bootstrap_dir()), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(steps)], env=env, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def direct_cost_s(calls: int = 20000) -> float:
    """The probe's own work per step, timed in this process without a training around it: one batch through the
    iterator hook, one loss through the backward hook, one optimizer step through the step hook."""
    import torch

    from autotune.probe.agent import Session

    timing = TimingSettings(window_s=1e6, max_window_steps=10**9, max_warmup_steps=10, min_timed_share=0.0)
    with tempfile.TemporaryDirectory() as scratch:
        session = Session(ProbeSettings(result_path=str(Path(scratch) / "r.json"), timing=timing), torch)
        batch, loss, optimizer = (torch.randn(8, 64), torch.randint(0, 10, (8,))), torch.tensor(1.5), object()
        for _ in range(100):  # warm-up and past the probe's own warm-up steps
            session.on_batch(None, batch, 1e-5)
            session.on_loss(loss)
            session.on_optimizer_step(optimizer, (), {})
        started = time.perf_counter()
        for _ in range(calls):
            session.on_batch(None, batch, 1e-5)
            session.on_loss(loss)
            session.on_optimizer_step(optimizer, (), {})
        return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    plain, probed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            order = (False, True) if round_index % 2 == 0 else (True, False)
            for with_probe in order:
                figures = run_one(args.steps, with_probe, Path(scratch))
                (probed if with_probe else plain).append(figures["median_step_s"])
    plain_s, probed_s = statistics.median(plain), statistics.median(probed)
    cost_s = probed_s - plain_s
    print(f"rounds {args.rounds}, {args.steps} steps each, steady half timed")
    print(f"plain   median step {plain_s * 1e6:8.1f} us  (rounds: {', '.join(f'{t * 1e6:.0f}' for t in plain)})")
    print(f"probed  median step {probed_s * 1e6:8.1f} us  (rounds: {', '.join(f'{t * 1e6:.0f}' for t in probed)})")
    print(f"probe cost per step {cost_s * 1e6:8.1f} us = {100 * cost_s / plain_s:.1f}% of this tiny step")
    direct_s = direct_cost_s()
    print(f"probe's hooks timed directly: {direct_s * 1e6:.1f} us per step (a batch, a loss, an optimizer step)")
    for step_ms in (10, 50, 100, 1000):
        print(
            f"  a {step_ms:4d} ms step: {100 * direct_s / (step_ms / 1e3):.3f}% (directly), "
            f"{100 * cost_s / (step_ms / 1e3):.3f}% (side by side)"
        )


if __name__ == "__main__":
    main()
