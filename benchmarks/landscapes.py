"""Synthetic GPU throughput landscapes: what a trial would measure for each configuration of a real search space.

No GPU has been lent to this project's search benchmarks, and a real GPU grid of 500+ trials costs a day of a node.
benchmarks/simulate.py replays the real Tuner over these models instead. A landscape is a noise-free model of one
model on one named machine, over that model's shipped search space (search_spaces/<model>.yaml with its `cuda:`
section, as autotune loads it for that machine):

- GPU time per step: a fixed part (optimiser, all-reduce) plus per-sample (per-frame for ASR) time at strict fp32,
  divided by the precision's speed-up; host time per step (Python dispatch, kernel launches) overlaps the GPU's.
  Without pinned memory the copy runs at pageable bandwidth and blocks the host until the GPU has caught up, so the
  launch queue refills after it (part of the host's time is exposed).
- cudnn.benchmark on variable-length batches re-times kernels for every new shape (anchors: SpeechBrain, WeNet).
- The data pipeline: each DataLoader worker on one physical core makes `worker_rate` samples/s; hyper-threads add a
  quarter; with no workers the main process loads serially. Producer and consumer combine as a soft minimum whose
  sharpness grows with the batches in flight, workers x prefetch (a deeper queue absorbs the jitter of single
  batches near the balance point): the data-bound plateau.
  Workers busy on every core slow the main process that launches the kernels.
- Memory: weights, gradients and optimiser state plus saved activations per sample (per frame), times 0.55 under
  AMP; over the device's memory the trial is "oom" (it ends in its first steps), over 90% of it "headroom" (the
  trial's gate: measured in full, then rejected).
- Without persistent workers every epoch pays the loader's start-up (the trial's objective amortises it per epoch).
- A trial's wall time: process start, the first batch, the worst-case scan, warm-up, the window as a real trial sizes
  it (autotune/trial/steady.py window_target_s: at least 10 s and two steps, and four fifths of the whole trial, up
  to 40 s; a GPU trial's 15-25 s of start-up make it 40 s), shutdown. It grows with the step time, as on a GPU.
  Budgets are fractions of the grid's time, priced the same way, so the window's length changes the trials per search
  little; the 2-5% noise is per window at the length a trial measures.

The four landscapes, their machines and their calibration against published figures are in
benchmarks/published_landscapes.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import space  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.machine.gpus import GpuInfo  # noqa: E402
from autotune.machine.hardware import Hardware  # noqa: E402
from autotune.trial import TimingSettings
from autotune.trial.steady import window_target_s  # noqa: E402

GIB = 2**30
AMP_ACTIVATIONS = 0.55  # autocast saves conv/linear outputs in 16 bits; losses, statistics and a few others in 32
ALLOCATOR_OVERHEAD = 1.10
CUDNN_WORKSPACE_GIB = 0.5  # cudnn.benchmark may pick algorithms with larger workspaces
HEADROOM = TimingSettings().memory_headroom_fraction
TIMING = TimingSettings()
WINDOW_S, MIN_WINDOW_STEPS = TIMING.window_s, TIMING.min_window_steps
UNPINNED_EXPOSED = 0.05  # share of the host's per-step time exposed when a pageable copy blocks it (assumed)
PAGEABLE_BYTES_S, FORK_S, END_S, BENCHMARK_FIRST_S = 6e9, 0.05, 2.0, 1.5  # assumed
MAX_SHARPNESS = 12.0  # a queue of 64+ batches: at the balance point the soft minimum still loses 6%
HYPERTHREAD_GAIN = 0.25  # a second hardware thread on a busy core adds about a quarter (assumed)
FBANK_BYTES_PER_FRAME = 80 * 4
# Knobs no landscape models: evaluate() never reads them (their GPU gains and costs are not calibrated here). The
# searches still search them, as the shipped spaces do; the grid (simulate.py) and best() hold each at one value.
UNMODELLED_KNOBS = ("optimizer_impl", "compile", "activation_checkpointing", "feature_device", "in_order")


def without_bucket_batches(data: dict[str, Any]) -> dict[str, Any]:
    """A space mapping with batch_type bucket, its knobs and its seeds taken out (where it has them)."""
    data = copy.deepcopy(data)
    for section in (data, data.get("cpu") or {}, data.get("cuda") or {}):
        params = section.get("params") or {}
        for knob in ("num_buckets", "bucket_scaling"):
            params.pop(knob, None)
        if "bucket" in (params.get("batch_type") or {}).get("choices", []):
            params["batch_type"]["choices"].remove("bucket")
        when = (params.get("max_frames_in_batch") or {}).get("when") or {}
        if isinstance(when.get("batch_type"), list):
            kept = [value for value in when["batch_type"] if value != "bucket"]
            when["batch_type"] = kept[0] if len(kept) == 1 else kept
        if "seeds" in section:
            section["seeds"] = [seed for seed in section["seeds"] if seed.get("batch_type") != "bucket"]
    return data


@dataclass(frozen=True, kw_only=True, slots=True)
class Machine:
    """A training node: its GPUs (as NVML names them) and its CPU."""

    gpu: str
    gpu_memory_gib: float  # what NVML reports (a "32 GB" V100: 31.74 GiB)
    compute_capability: tuple[int, int]
    devices: int
    physical_cores: int
    logical_cores: int  # os.sched_getaffinity: what `num_workers: auto` divides among the devices

    def hardware(self) -> Hardware:
        gpu = GpuInfo(
            name=self.gpu,
            uuid="GPU-simulated",
            memory_bytes=int(self.gpu_memory_gib * GIB),
            compute_capability=self.compute_capability,
        )
        return Hardware(device_type="cuda", gpus=(gpu,) * self.devices, cpu_cores=self.logical_cores)


@dataclass(frozen=True, kw_only=True, slots=True)
class Expected:
    """What a trial of one configuration measures, without noise."""

    status: str  # ok | oom | headroom
    samples_per_second: float  # summed over the devices; 0 when infeasible
    wall_s: float
    step_s: float  # per device
    data_wait_fraction: float
    peak_memory_gib: float
    until_window_s: float  # wall time when the window starts (for pruning)
    warmup_step_s: float
    window_s: float = 0.0  # the timed window, as the landscape's timing sizes it


@dataclass(frozen=True, kw_only=True, slots=True)
class Landscape:
    """One model on one machine; constants per device (rank)."""

    name: str
    workload: str  # search_spaces/<workload>.yaml
    bottleneck: str
    machine: Machine
    knobs: tuple[str, ...] = ()  # the workload's own knobs among the space's parameters
    # compute
    unit_s: float  # GPU seconds per sample (per frame for ASR) in strict fp32, large-batch limit
    gpu_fixed_s: float  # GPU seconds per step regardless of batch: optimiser step, all-reduce
    host_s: float  # host seconds per step: Python dispatch and kernel launches
    speedup: dict[str, float]  # over strict fp32, per precision (fp32-default only where the GPU has TF32)
    variable_shapes: bool = False
    retune_s: float = 0.0  # cudnn.benchmark re-timing per step when shapes vary
    # memory
    fixed_gib: float  # weights, gradients, optimiser state, CUDA context
    activation_mib: float  # saved activations per sample (per frame for ASR), fp32
    # data
    worker_rate: float  # samples/s one worker makes on one physical core
    epoch_samples: int  # per device
    frames_per_sample: int = 298  # fbank frames per sample (3-s crops); ASR: the mean utterance
    longest_frames: int = 298  # the worst-case batch's utterance length
    padding: float = 1.0  # padded / real frames in a length-sorted batch
    # trial
    start_s: float  # process start, imports, model, CUDA context (and process group)
    warmup_steps: int = 4
    scan_steps: int = 0  # the workload's worst-case batches
    noise: float  # sd of a window's relative deviation, at the window the shipped timing (TIMING) gives
    sources: tuple[str, ...] = field(default_factory=tuple)
    timing: TimingSettings = TIMING  # the trials' warm-up and window rules (simulate.py --timing tries others)

    def space(self) -> space.SearchSpace:
        """The shipped search space, as autotune loads it on this machine, without per-length-bucket batches: no
        landscape models them (their gain depends on the corpus' duration spread, not calibrated here), so the
        simulated figures stay those of the static and dynamic batches they were measured with."""
        return space.from_dict(
            without_bucket_batches(space.read(space.space_path(self.workload))),
            self.machine.hardware(),
            workload_knobs=self.knobs,
            origin=str(space.space_path(self.workload)),
            world_size=self.machine.devices,
        )

    def config(self, params: dict[str, Any]) -> TrialConfig:
        return TrialConfig.from_params(params, world_size=self.machine.devices, workload_knobs=self.knobs)

    def _batch(self, config: TrialConfig) -> tuple[float, float, float]:
        """(samples per step, work units per step, units of the worst-case batch); units are samples or frames."""
        if not self.variable_shapes:
            batch = float(config.per_device_batch_size)
            return batch, batch, batch
        if config.workload_knobs.get("batch_type") == "dynamic":
            frames = float(config.workload_knobs["max_frames_in_batch"])
            return frames / (self.frames_per_sample * self.padding), frames, frames
        batch = float(config.per_device_batch_size)
        return batch, batch * self.frames_per_sample * self.padding, batch * self.longest_frames

    def peak_memory_gib(self, config: TrialConfig) -> float:
        _, _, worst = self._batch(config)
        activations = worst * self.activation_mib / 1024 * ALLOCATOR_OVERHEAD
        if config.precision in ("bf16", "fp16"):
            activations *= AMP_ACTIVATIONS
        return self.fixed_gib + activations + (CUDNN_WORKSPACE_GIB if config.cudnn_benchmark else 0.0)

    def _cores(self) -> tuple[int, int]:
        devices = self.machine.devices
        return max(1, self.machine.physical_cores // devices), max(1, self.machine.logical_cores // devices)

    def _producer(self, workers: int) -> float:
        physical, logical = self._cores()
        cores = min(workers, physical) + HYPERTHREAD_GAIN * max(0, min(workers, logical) - physical)
        return self.worker_rate * cores

    def _step_s(self, config: TrialConfig, units: float, host_s: float) -> float:
        gpu_s = self.gpu_fixed_s + units * self.unit_s / self.speedup[config.precision]
        step_s = max(gpu_s, host_s)
        if not config.pin_memory:  # a pageable copy is slower and blocks the host until the GPU has caught up
            step_s += UNPINNED_EXPOSED * host_s + units * self._bytes_per_unit() / PAGEABLE_BYTES_S
        if config.cudnn_benchmark and self.variable_shapes:
            step_s += self.retune_s
        return step_s

    def _bytes_per_unit(self) -> float:
        return FBANK_BYTES_PER_FRAME * (1 if self.variable_shapes else self.frames_per_sample)

    def _rate(self, config: TrialConfig, batch: float, units: float) -> tuple[float, float]:
        """(samples/s of one device, compute-only samples/s): the loader and the step combined."""
        if config.num_workers == 0:
            step_s = self._step_s(config, units, self.host_s)
            return batch / (step_s + batch / self.worker_rate), batch / step_s
        producer = self._producer(config.num_workers)
        # batches in flight: every worker keeps prefetch_factor of them queued
        sharpness = min(MAX_SHARPNESS, 3.0 + 1.5 * math.log2(config.num_workers * (config.prefetch_factor or 2)))
        _, logical = self._cores()
        host_s = self.host_s
        for _ in range(3):  # busy workers slow the main process, which changes how busy they are
            compute = batch / self._step_s(config, units, host_s)
            rate = (compute**-sharpness + producer**-sharpness) ** (-1.0 / sharpness)
            busy = rate / producer * min(config.num_workers, logical) + 1.0
            host_s = self.host_s * max(1.0, busy / logical)
        return rate, compute

    def evaluate(self, config: TrialConfig) -> Expected:
        """The noise-free measurement of one configuration."""
        batch, units, worst = self._batch(config)
        peak = self.peak_memory_gib(config)
        capacity = self.machine.gpu_memory_gib
        first_batch_s = FORK_S * config.num_workers + batch / self.worker_rate
        if peak > capacity:
            wall = self.start_s + first_batch_s + 1.0 + END_S  # the first training step runs out of memory
            return Expected(
                status="oom",
                samples_per_second=0.0,
                wall_s=wall,
                step_s=0.0,
                data_wait_fraction=0.0,
                peak_memory_gib=capacity,
                until_window_s=wall,
                warmup_step_s=0.0,
            )
        rate, compute = self._rate(config, batch, units)
        if not config.persistent_workers and config.num_workers > 0:  # a fresh loader every epoch
            epoch_s = self.epoch_samples / rate
            rate *= epoch_s / (epoch_s + first_batch_s)
        step_s = batch / rate
        scan_s = self.scan_steps * self._step_s(config, worst, self.host_s)
        warmup_step_s = 1.2 * step_s
        until_window = self.start_s + first_batch_s + scan_s + self.warmup_steps * warmup_step_s
        until_window += BENCHMARK_FIRST_S if config.cudnn_benchmark else 0.0
        window = max(window_target_s(until_window, self.timing), self.timing.min_window_steps * step_s)
        wall = until_window + window + END_S
        feasible = peak <= (1.0 - HEADROOM) * capacity
        return Expected(
            status="ok" if feasible else "headroom",
            samples_per_second=rate * self.machine.devices if feasible else 0.0,
            wall_s=wall,
            step_s=step_s,
            data_wait_fraction=max(0.0, 1.0 - rate / compute),
            peak_memory_gib=peak,
            until_window_s=until_window,
            warmup_step_s=warmup_step_s,
            window_s=window,
        )

    def best(self) -> tuple[TrialConfig, float]:
        """The fastest feasible configuration of the shipped space and its samples/s: every point evaluated, the
        knobs no landscape models (UNMODELLED_KNOBS) held at one value, since evaluate() never reads them (the
        conformer's 20 million points are 410,000 evaluations: 7 min -> 10 s on this machine, the same best)."""
        shipped = self.space()
        modelled = dataclasses.replace(
            shipped, params=tuple(param for param in shipped.params if param.name not in UNMODELLED_KNOBS)
        )
        evaluated = (
            (config, self.evaluate(config).samples_per_second) for config in map(self.config, modelled.iter_points())
        )
        return max(evaluated, key=lambda pair: pair[1])
