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
- A trial's wall time: process start, the first batch, the worst-case scan, warm-up, the 10-s window (at least five
  steps), shutdown. It grows with the step time, as on a GPU.

Calibration (each constant below names where it comes from; `calibration()` reproduces the published figures, and
tests/test_benchmark_landscapes.py holds them to it):

- 3D-Speaker, egs/3dspeaker/sv-cam++/README.md and model-facts.md: 4x V100 32 GB, batch 256 (64 per GPU), fp32,
  cudnn.benchmark, 16 workers: CAM++ ~25 min per epoch, ERes2Net-base ~30 min. An epoch of 3D-Speaker-train is about
  1.29M 3-s chunks: modelscope/3D-Speaker issue #258 logs 7540 batches of 128 per epoch for the same train.csv cut
  into 4-s chunks (sv-eres2netv2/local/prepare_data_csv.py --seg_dur 4.0, sv-cam++'s is 3.0): 965,120 x 4/3.
  Hence 860 samples/s for CAM++ and 717 for ERes2Net on the node. FLOPs per 3-s sample (forward + backward,
  FlopCounterMode on autotune's models): CAM++ 10.05 G, ERes2Net 30.24 G, ECAPA-TDNN 33.28 G; so CAM++ runs at 14%
  of a V100's fp32 peak and ERes2Net at 34% (3D-Speaker issue #1: CAM++'s pooling and concatenations use a GPU less
  well than a plain ResNet).
- SpeechBrain issue #2531 (an Ampere GPU: TF32 was the difference): 2.08 it/s in strict fp32, 3.83 with TF32
  (torch 1.11's default), 3.93 fp16, 4.11 bf16: end-to-end ratios 1.84 / 1.89 / 1.98, held by the ECAPA landscape at
  the recipe's configuration.
- WeNet issue #2661: RTX 4090, 1-5 s clips, the librispeech recipe (examples/librispeech/s0/run.sh: --num_workers 1,
  --pin_memory) with batch 24: 4 epochs a day of 1500 h = 250 audio-s/s = 83 utterances/s, the GPU idle most of the
  time. Hence one worker's rate, and a data wait of most of the step at that configuration.
- Saved activations per sample (3-s crops) or per frame, summed over autograd's saved tensors on autotune's models
  in fp32: CAM++ 86.8 MiB, ERes2Net 340.1 MiB, ECAPA-TDNN 86.2 MiB, conformer 415.8 KiB per input frame; 10% more
  for the allocator and backward's transients.
- One worker of autotune's speaker pipeline (decode, 3-s crop, fbank) made 560 samples/s on one thread of this
  project's AMD EPYC (load 5.5); 3D-Speaker's pipeline adds speed perturbation and, with probability 0.8, noise or
  reverberation (a second decoded file and a convolution): taken as three times the work, 180 samples/s.

What is assumed rather than published is marked "assumed" where it is set: fp16 speed-ups on V100, the host
launch time per step, the machines' core counts, start-up times.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import space  # noqa: E402
from autotune.gpus import GpuInfo  # noqa: E402
from autotune.hardware import Hardware  # noqa: E402
from autotune.trial import TimingSettings, TrialConfig  # noqa: E402

GIB = 2**30
AMP_ACTIVATIONS = 0.55  # autocast saves conv/linear outputs in 16 bits; losses, statistics and a few others in 32
ALLOCATOR_OVERHEAD = 1.10
CUDNN_WORKSPACE_GIB = 0.5  # cudnn.benchmark may pick algorithms with larger workspaces
HEADROOM = TimingSettings().memory_headroom_fraction
WINDOW_S, MIN_WINDOW_STEPS = TimingSettings().window_s, TimingSettings().min_window_steps
UNPINNED_EXPOSED = 0.05  # share of the host's per-step time exposed when a pageable copy blocks it (assumed)
PAGEABLE_BYTES_S, FORK_S, END_S, BENCHMARK_FIRST_S = 6e9, 0.05, 2.0, 1.5  # assumed
MAX_SHARPNESS = 12.0  # a queue of 64+ batches: at the balance point the soft minimum still loses 6%
HYPERTHREAD_GAIN = 0.25  # a second hardware thread on a busy core adds about a quarter (assumed)
FBANK_BYTES_PER_FRAME = 80 * 4


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
    noise: float  # sd of a window's relative deviation
    sources: tuple[str, ...] = field(default_factory=tuple)

    def space(self) -> space.SearchSpace:
        """The shipped search space, as autotune loads it on this machine, without per-length-bucket batches: no
        landscape models them (their gain depends on the corpus' duration spread, not calibrated here), so the
        simulated figures stay those of the static and dynamic batches they were measured with (issue 20)."""
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
        wall = until_window + max(WINDOW_S, MIN_WINDOW_STEPS * step_s) + END_S
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
        )

    def best(self) -> tuple[TrialConfig, float]:
        """The fastest feasible configuration of the shipped space and its samples/s (every point evaluated)."""
        configs = [self.config(point) for point in self.space().iter_points()]
        return max(((config, self.evaluate(config).samples_per_second) for config in configs), key=lambda x: x[1])


# V100 has no TF32 or bf16 kernels: its space offers fp32 and fp16 only (Hardware.supported_precisions).
DGX1_V100 = Machine(
    gpu="Tesla V100-SXM2-32GB",
    gpu_memory_gib=31.74,
    compute_capability=(7, 0),
    devices=4,
    physical_cores=40,  # DGX-1: 2x Xeon E5-2698 v4, 20 cores each (NVIDIA's datasheet); 3D-Speaker used 4 of 8 GPUs
    logical_cores=80,
)
DGX_A100 = Machine(
    gpu="NVIDIA A100-SXM4-80GB",
    gpu_memory_gib=79.15,
    compute_capability=(8, 0),
    devices=1,
    physical_cores=16,  # one GPU's share of a DGX A100: 2x 64-core EPYC 7742 over 8 GPUs (NVIDIA's datasheet)
    logical_cores=32,
)
RTX4090_DESKTOP = Machine(
    gpu="NVIDIA GeForce RTX 4090",
    gpu_memory_gib=23.99,
    compute_capability=(8, 9),
    devices=1,
    physical_cores=16,  # assumed: a 16-core desktop CPU (WeNet issue #2661 does not name it)
    logical_cores=32,
)
THREED_SPEAKER_EPOCH = 1_287_000  # 3-s chunks of 3D-Speaker-train: 7540 x 128 x 4/3 (issue #258), see above
THREED_SPEAKER_WORKER_RATE = 180.0
V100_FP16 = 1.7  # assumed for CAM++: memory-bound layers gain at most 2x from 16-bit traffic; SpeechBrain saw 1.89

LANDSCAPES: dict[str, Landscape] = {
    landscape.name: landscape
    for landscape in (
        Landscape(
            name="cam++ 4xV100",
            workload="cam++",
            bottleneck="compute (fp16 only); memory cliff at large batches",
            machine=DGX1_V100,
            # 215 samples/s per GPU at the recipe's 64: (64 / 215 - gpu_fixed) / 64 per sample
            unit_s=4.53e-3,
            gpu_fixed_s=0.008,  # SGD step on 7.2M parameters and an NVLink all-reduce of 29 MB (assumed)
            host_s=0.025,  # assumed: ~2000 kernel launches per step
            speedup={"fp32": 1.0, "fp16": V100_FP16},
            fixed_gib=1.2,
            activation_mib=86.8,
            worker_rate=THREED_SPEAKER_WORKER_RATE,
            epoch_samples=THREED_SPEAKER_EPOCH // 4,
            start_s=25.0,  # assumed: four ranks, NCCL initialisation
            noise=0.02,
            sources=("3D-Speaker sv-cam++ README (4x V100, batch 256)", "model-facts.md: ~25 min/epoch"),
        ),
        Landscape(
            name="eres2net 4xV100",
            workload="eres2net",
            bottleneck="memory cliff at small batches (340 MiB of activations per sample)",
            machine=DGX1_V100,
            unit_s=5.46e-3,  # 179 samples/s per GPU at 64
            gpu_fixed_s=0.008,
            host_s=0.03,
            speedup={"fp32": 1.0, "fp16": 2.0},  # assumed: 2-D convolutions on tensor cores gain more than CAM++
            fixed_gib=1.2,
            activation_mib=340.1,
            worker_rate=THREED_SPEAKER_WORKER_RATE,
            epoch_samples=THREED_SPEAKER_EPOCH // 4,
            start_s=25.0,
            noise=0.02,
            sources=("3D-Speaker sv-eres2net (4x V100, batch 256)", "model-facts.md: ~30 min/epoch"),
        ),
        Landscape(
            name="ecapa-tdnn 1xA100",
            workload="ecapa-tdnn",
            bottleneck="precision and GPU utilisation at small batches",
            machine=DGX_A100,
            unit_s=3.8e-3,  # assumed: 33.28 GFLOP per sample at 45% of the A100's 19.5 TFLOP/s strict fp32
            gpu_fixed_s=0.003,  # Adam on 20.8M parameters
            host_s=0.035,  # assumed: Res2Net's scale-8 splits launch many small kernels
            # solved so that the end-to-end ratios at the recipe's batch 32 are SpeechBrain's 1.84 / 1.89 / 1.98
            # fp32-default (torch's defaults: TF32 convolutions, IEEE matmuls) assumed within 1% of tf32: ECAPA's
            # Conv1d layers carry nearly all of its FLOPs, the attentive pooling's and the head's matmuls little
            speedup={"fp32": 1.0, "fp32-default": 1.89, "tf32": 1.91, "fp16": 1.965, "bf16": 2.065},
            fixed_gib=1.5,
            activation_mib=86.2,
            worker_rate=500.0,  # autotune's own pipeline (fbank in the workers): 560/s measured on one EPYC thread
            epoch_samples=1_092_009,  # VoxCeleb2 dev utterances (one 3-s crop each per epoch)
            start_s=15.0,
            noise=0.03,
            sources=("SpeechBrain issue #2531", "model-facts.md: SpeechBrain seed figures"),
        ),
        Landscape(
            name="conformer 1xRTX4090 short clips",
            workload="conformer",
            bottleneck="data: CPU decoding and fbank starve the GPU; cudnn.benchmark re-times every new shape",
            machine=RTX4090_DESKTOP,
            # the workload's knobs; batch_type bucket is left out of the simulated space (Landscape.space)
            knobs=("batch_type", "max_frames_in_batch", "num_buckets", "bucket_scaling"),
            unit_s=3.06e-6,  # per frame: 76 MFLOP (22.75 GFLOP per 3-s utterance) at 30% of 82.6 TFLOP/s (assumed)
            gpu_fixed_s=0.006,
            host_s=0.06,  # assumed: 12 encoder and 6 decoder layers, ~4000 launches, Adam on 46M parameters
            # tf32 has no more peak than fp32 on Ada (datasheet: 82.6 both); bf16/fp16 twice (assumed 1.9 / 1.85)
            # fp32-default (TF32 convolutions only) assumed 1.02: only the conv2d subsampling and the depthwise
            # convolution modules, a small share of a conformer's FLOPs, run in TF32
            speedup={"fp32": 1.0, "fp32-default": 1.02, "tf32": 1.1, "bf16": 1.9, "fp16": 1.85},
            variable_shapes=True,
            retune_s=0.04,  # assumed: most batches of a 10-s window bring a new (length, batch) shape
            fixed_gib=1.5,
            activation_mib=415.8 / 1024,
            worker_rate=83.0,  # WeNet issue #2661: one worker, 250 audio-s/s of 1-5 s clips
            epoch_samples=1_800_000,  # 1500 h of 3-s clips
            frames_per_sample=300,
            longest_frames=500,
            padding=1.08,
            start_s=20.0,
            warmup_steps=8,
            scan_steps=2,
            noise=0.05,
            sources=("WeNet issue #2661", "WeNet examples/librispeech/s0/run.sh"),
        ),
    )
}


def _recipe(landscape: Landscape, **changes: Any) -> TrialConfig:
    return landscape.config({**landscape.space().baseline, **changes})


def calibration() -> list[tuple[str, float, float, float | None]]:
    """(figure, this model's value, the published value, relative tolerance or None for "at least") per target."""
    cam, eres = LANDSCAPES["cam++ 4xV100"], LANDSCAPES["eres2net 4xV100"]
    cam_rate = cam.evaluate(_recipe(cam)).samples_per_second
    eres_rate = eres.evaluate(_recipe(eres)).samples_per_second
    rows: list[tuple[str, float, float, float | None]] = [
        ("CAM++ 4xV100 epoch of 3D-Speaker-train, min", THREED_SPEAKER_EPOCH / cam_rate / 60, 25.0, 0.05),
        ("ERes2Net 4xV100 epoch of 3D-Speaker-train, min", THREED_SPEAKER_EPOCH / eres_rate / 60, 30.0, 0.05),
    ]
    ecapa = LANDSCAPES["ecapa-tdnn 1xA100"]
    fp32 = ecapa.evaluate(_recipe(ecapa, precision="fp32")).samples_per_second
    for precision, published in (("tf32", 3.83), ("fp16", 3.93), ("bf16", 4.11)):
        rate = ecapa.evaluate(_recipe(ecapa, precision=precision)).samples_per_second
        rows.append((f"SpeechBrain {precision} over strict fp32", rate / fp32, published / 2.08, 0.02))
    wenet = LANDSCAPES["conformer 1xRTX4090 short clips"]
    issue = _recipe(wenet, per_device_batch_size=24, num_workers=1, prefetch_factor=16, precision="fp32")
    expected = wenet.evaluate(issue)
    rows.append(("WeNet #2661 utterances per s (batch 24, 1 worker)", expected.samples_per_second, 250.0 / 3, 0.05))
    rows.append(("WeNet #2661 data wait (GPU idle most of the time)", expected.data_wait_fraction, 0.75, None))
    return rows
