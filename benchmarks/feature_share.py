"""The share of a conformer step that its worker featurisation costs, side by side in one process
(knobs/feature_device.py --share conformer).

Per round, on the same random batch of the model's default corpus: the workers' item path timed on one thread, as one
DataLoader worker runs it, with the features (decode, resample, speed perturbation, fbank with dither, SpecAugment) and
without them (feature_device device: the waveform only), the difference being the featurisation a worker does per batch;
then one training step (forward, backward, optimizer) of the full recipe model on the workers' batch, and one on the
waveform batch whose step computes fbank and SpecAugment itself (the device placement's loss function, run on the same
model and optimizer, so that only the placement differs). Rounds alternate which goes first, so a change of load shifts
both alike. Real trials (knobs/feature_device.py's pairs) would measure the same thing with the DataLoader around it,
but a 46M-parameter conformer trial on a shared 2-core CPU takes minutes per configuration; this measures the part that
moves.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch

from autotune import workloads
from autotune.knobs.config import TrialConfig
from autotune.workloads.base import WorkloadContext


def _setups(batch_size: int, precision: str) -> dict[str, Any]:
    workload = workloads.get("conformer")
    data = workload.load_data(None)
    setups = {}
    for placement in ("workers", "device"):
        config = TrialConfig(per_device_batch_size=batch_size, precision=precision, feature_device=placement)
        context = WorkloadContext(data=data, config=config, options=dict(workload.options), device=torch.device("cpu"))
        setups[placement] = workload.build(context)
    return setups


def _item_seconds(dataset: Any, indices: list[int]) -> tuple[float, list[Any]]:
    """Seconds one worker (one thread) spends on these items, and the items."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        items = [dataset[index] for index in indices]
        return time.perf_counter() - start, items
    finally:
        torch.set_num_threads(threads)


def _step_seconds(setup: Any, trained: Any, batch: Any, precision: str) -> float:
    """One training step of `trained`'s model and optimizer through `setup`'s loss function (its placement)."""
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    start = time.perf_counter()
    with autocast:
        loss = setup.loss_fn(trained.model, batch)
    loss.backward()
    trained.optimizer.step()
    trained.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure_share(rounds: int, batch_size: int = 8, precision: str = "bf16", seed: int = 0) -> dict[str, Any]:
    """Per-round milliseconds per batch and the shares of the workers' step (the CPU seed's static batch of 8 in bf16
    by default: conformer.yaml's first CPU seed)."""
    setups = _setups(batch_size, precision)
    with_features = setups["workers"].dataset
    waveforms_only = setups["device"].dataset
    generator = torch.Generator().manual_seed(seed)
    columns = ("worker_features_ms", "worker_waveforms_ms", "step_workers_ms", "step_device_ms")
    values: dict[str, list[float]] = {name: [] for name in columns}
    for round_index in range(rounds + 1):  # round 0 warms up (allocator, first-call kernels) and is not kept
        indices = torch.randperm(len(with_features), generator=generator)[:batch_size].tolist()
        order = ("workers", "device") if round_index % 2 else ("device", "workers")
        timed: dict[str, float] = {}
        batches = {}
        for placement in order:
            dataset = with_features if placement == "workers" else waveforms_only
            timed[placement], items = _item_seconds(dataset, indices)
            batches[placement] = setups[placement].collate_fn(items)
        for placement in order:
            timed[f"step_{placement}"] = _step_seconds(
                setups[placement], setups["workers"], batches[placement], precision
            )
        if round_index == 0:
            continue
        values["worker_waveforms_ms"].append(1000 * timed["device"])
        values["worker_features_ms"].append(1000 * (timed["workers"] - timed["device"]))
        values["step_workers_ms"].append(1000 * timed["step_workers"])
        values["step_device_ms"].append(1000 * timed["step_device"])
    return summarise(values, batch_size, precision)


def summarise(values: dict[str, list[float]], batch_size: int, precision: str) -> dict[str, Any]:
    median = {name: statistics.median(series) for name, series in values.items()}
    step = median["step_workers_ms"]
    spread = (max(values["step_workers_ms"]) - min(values["step_workers_ms"])) / step
    moved = median["step_device_ms"] - step
    return {
        "configuration": f"conformer (full recipe model), static batch {batch_size}, {precision}, CPU",
        "per_round_ms": {name: [round(value, 1) for value in series] for name, series in values.items()},
        "median_ms": {name: round(value, 1) for name, value in median.items()},
        "worker_features_share_of_step": round(median["worker_features_ms"] / step, 4),
        "device_step_over_workers_step": round(median["step_device_ms"] / step, 4),
        "step_spread_over_rounds": round(spread, 4),
        "within_noise": abs(moved) <= spread * step,
    }
