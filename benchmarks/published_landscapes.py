"""The four simulated GPU landscapes of benchmarks/simulate.py: named machines, and models calibrated against
published training figures (the landscape model itself is benchmarks/landscapes.py).

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

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune.knobs.config import TrialConfig  # noqa: E402
from benchmarks.landscapes import Landscape, Machine  # noqa: E402

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
THREED_SPEAKER_EPOCH = 1_287_000  # 3-s chunks of 3D-Speaker-train: 7540 x 128 x 4/3 (3D-Speaker issue #258), see above
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
