"""What the parent sends a trial child (TrialSpec) and what the child answers (TrialResult), as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.knobs.config import TrialConfig
from autotune.trial.run_length import RunLength
from autotune.yamlio import from_fields

__all__ = [
    "LAUNCHED_AT_ENV",
    "PROGRESS_SUFFIX",
    "TimingSettings",
    "TrialSpec",
    "TrialResult",
    "STATUSES",
    "FEASIBLE_STATUSES",
    "NEUTRAL_STATUSES",
    "rank_result_path",
]

# Every status a TrialResult can have (TrialResult refuses others). "ok": measured and feasible. The others name why
# a configuration cannot be used, or why it was not measured.
# "erratic": throughput stalled or drifted within the window, twice (the tuner re-measures once: a shared machine's
# passing load must not condemn a configuration).
# "precision": the AMP check rejected the configuration's precision for this workload; such a trial is never launched.
# "skipped": not launched because the run's --budget had no room left for it (the compute-only ceiling).
# "stopped": the run's --budget ended while it was measured, before its window had timed enough to keep (a window it
# cut after that is kept: status ok, window_cut_by_budget); it says nothing about the configuration.
STATUSES = (
    "ok",
    "oom",
    "nonfinite",
    "timeout",
    "signal",
    "error",
    "headroom",
    "unstable",
    "pruned",
    "accounting",
    "precision",
    "erratic",
    "skipped",
    "stopped",
)
FEASIBLE_STATUSES = ("ok",)
# Not feasible, yet no verdict on the configuration: the budget stopped it, or the pruner found it slower than the
# best so far. Another measurement of the same configuration that is ok stands (candidates.Candidate.feasible).
NEUTRAL_STATUSES = ("stopped", "pruned")
ERRATIC_THROUGHPUT_CV = 0.3  # trials not competing for cores vary far less: benchmarks/README.md#the-erratic-threshold
LAUNCHED_AT_ENV = "AUTOTUNE_LAUNCHED_AT"  # the parent's time.time() when it started the child (for start_s)
PROGRESS_SUFFIX = ".progress"  # beside the result file: the child's running throughput, read by the parent to prune


def rank_result_path(result_path: str, rank: int) -> str:
    """Where a rank writes its result: rank 0 (the whole trial's result) at result_path, others beside it."""
    return result_path if rank == 0 else f"{result_path}.rank{rank}"


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingSettings:
    """How long a trial warms up and measures: seconds, with steps as floors (trial/steady.py explains the rules).

    Settings, as TunerSettings and AmpCheckSettings: the same for every trial of a run. A *Config is a configuration:
    TrialConfig the point a trial measures, TunedConfig the one a run hands over.
    """

    window_s: float = 10.0  # the timed window, at least; the scale of the whole measurement (below)
    warmup_steps: int = 1  # at least this many (the first step carries start-up), lasting min_warmup_s
    min_warmup_fraction: float = 0.1  # of window_s
    max_warmup_factor: float = 3.0  # warm-up, trimmed window fronts included, stops at this many window_s...
    max_warmup_steps: int = 1000  # ...or this many steps
    warmup_settle_fraction: float = 0.2  # CUDA / several ranks: consecutive chunks of warm-up steps agree this well
    settle_chunk_s: float = 0.5  # ... chunks of at least this long (one step when steps are longer)
    steady_tolerance_fraction: float = 0.1  # CPU, one rank: a window's first quarter this far off the rest is warm-up
    trim_transient: bool = True  # judge steadiness with hindsight where each step's time is its own (CPU, one rank)
    min_window_steps: int = 2  # a rate needs two steps; the stability gate judges windows of four or more
    max_window_steps: int = 10_000
    # The window is at least this share of the trial (0: off)... 0.8, not 0.75: the parent's launch and the child's
    # result and teardown are outside the window too, and the trials' untimed share must stay <= 25%
    # (benchmarks/README.md#short-budgets-and-what-a-trial-costs).
    min_timed_share: float = 0.8
    max_window_factor: float = 4.0  # ...up to this many window_s
    # A window at least this long, whatever the share rule: a long run's confirmation trials measure the time its
    # round holds in one window rather than in several trials each paying start-up (search/confirmation.py); warm-up
    # keeps window_s's scale. 0: the rules above alone.
    window_at_least_s: float = 0.0
    memory_headroom_fraction: float = 0.10
    # Throughput CV across the window's quarters above which a config is 'erratic' (trial/window_record.py
    # throughput_cv); None switches the gate off.
    max_throughput_cv: float | None = ERRATIC_THROUGHPUT_CV
    max_scaler_skip_fraction: float | None = 0.05  # fp16: share of window steps GradScaler may skip (after calibration)
    worst_case_scan: bool = True  # train on the workload's most expensive batches before warm-up (trial/worst_case.py)

    @property
    def min_warmup_s(self) -> float:
        return self.min_warmup_fraction * self.window_s

    @property
    def max_warmup_s(self) -> float:
        return self.max_warmup_factor * self.window_s

    @property
    def max_window_s(self) -> float:
        return max(self.window_s, self.max_window_factor * self.window_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingSettings:
        return from_fields(cls, data)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialSpec:
    """Everything a trial child needs, in one JSON file: no live objects, no shell."""

    workload: str  # registry name or "package.module:factory"
    workload_options: dict[str, Any]
    data_file: str  # JSON of DataSource.to_dict(), written once per run
    config: TrialConfig
    timing: TimingSettings
    device_type: str  # "cuda" | "cpu"
    result_path: str
    seed: int = 0
    collective_timeout_s: float = 300.0  # a rank waiting on a dead or hung peer gives up after this
    compute_only: bool = False  # batches collated once and kept on the device: the ceiling (trial/compute_only.py)
    count_flops: bool = False  # count FLOPs per sample after the window (trial/flops.py)
    # The training the result is for: the objective charges one-off costs (compiling) over it (trial/run_length.py).
    run_length: RunLength = field(default_factory=RunLength)
    # SLURM nodes the trial spans (--nodes): config.world_size ranks in all, world_size // nodes on each, started by
    # torchrun on every node (trial/multinode.py); 1: autotune's own launcher on one machine (trial/launch.py).
    nodes: int = 1
    # The wall-clock time (time.time()) by which the run's --budget ends this trial, less the seconds its result takes
    # to write (search/in_flight.py): the window ends at the last optimiser step that fits and keeps what it timed
    # (trial/loop.py measure). None: no budget end in sight; the launch's own timeout still holds.
    window_deadline_unix_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"], data["timing"] = self.config.to_dict(), self.timing.to_dict()
        data["run_length"] = self.run_length.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        data = dict(data)
        data["config"] = TrialConfig.from_dict(data["config"])
        data["timing"] = TimingSettings.from_dict(data["timing"])
        if "run_length" in data:
            data["run_length"] = RunLength.from_dict(data["run_length"])
        return from_fields(cls, data)


@dataclass(kw_only=True, slots=True)
class TrialResult:
    """What one trial measured, or why it could not."""

    status: str
    reason: str = ""
    # The objective: the window's rate with loader restarts and compiling charged over the run (trial/run_length.py)
    samples_per_second: float | None = None
    window_samples_per_second: float | None = None  # the timed window alone
    # Items that differ in length: the epoch's mix of batches against the window's, under the step cost fitted in the
    # window (trial/epoch_mix.py); samples_per_second includes it. None where items are alike.
    epoch_mix_factor: float | None = None
    audio_seconds_per_second: float | None = None
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_cv: float | None = None
    throughput_cv: float | None = (
        None  # across the window's quarters (trial/window_record.py throughput_cv): the stability gate
    )
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    memory_capacity_bytes: int | None = None
    all_losses_finite: bool | None = None
    gpu_utilization_percent: float | None = None  # NVML, mean over the window; None without NVML or on a CPU
    gpu_memory_used_bytes: int | None = None
    gpu_power_watts: float | None = None
    window_steps: int = 0
    window_s: float | None = None
    warmup_s: float | None = None
    warmup_steps: int | None = None
    warmup_first_steps_s: list[float] | None = None  # the first warm-up steps' times: where start-up went
    # CUDA: the allocator's own peak plus what it did not hold, over warm-up and window (trial/memory.py: cuDNN's
    # benchmark searches are in it), kept, not judged; and its retries after freeing its cache (a search shows here)
    allocator_peak_memory_bytes: int | None = None
    cuda_alloc_retries: int | None = None
    loader_start_s: float | None = None  # iter(loader) to first batch: the workers' cold start
    # A new epoch's extra wait for its first batch, measured at a real epoch end after the window where it can matter
    # (trial/epoch_boundary.py); the objective charges it once per epoch. None: not measured (then loader_start_s
    # without persistent workers, nothing with them).
    epoch_boundary_s: float | None = None
    start_s: float | None = None  # from the parent's launch to the child's main(): process start and imports
    setup_s: float | None = None  # from main(): process group, model, data and loader build
    preload_s: float | None = None  # of setup_s: decoding the audio into RAM (config.preload_audio; 0 without)
    wall_s: float | None = None  # whole trial as the parent saw it
    world_size: int = 1  # ranks that trained; throughput and samples are summed over them
    per_rank_samples_per_second: list[float] | None = None  # each rank over its own view of the shared window
    epoch_accounting: dict[str, Any] | None = None  # batches per epoch per rank vs the dataset (sampling.py)
    scaler_skip_fraction: float | None = None  # fp16 on CUDA: optimiser steps GradScaler skipped in the window
    worst_case_batches: int = 0  # most expensive batches trained before warm-up (0: the workload names none)
    worst_case_s: float | None = None
    worst_case_peak_memory_bytes: int | None = None  # counted in peak_memory_bytes too
    # False: GradScaler skipped every scan step, so the scan's peak lacks the optimiser state (the window's has it)
    worst_case_optimizer_state_held: bool | None = None
    flops_per_sample: float | None = None  # forward + backward, when the spec asked for it
    # On CUDA, how float32 matmuls and cuDNN convolutions ran ({"matmul": "ieee"|"tf32", "cudnn_conv": ...}), read
    # after the precision's flags were set: fp32-default's maths depends on this torch's defaults. None on a CPU.
    fp32_math: dict[str, str] | None = None
    trimmed_steps: int = 0  # window steps found to be warm-up with hindsight (trial/steady.py); in warmup_steps
    # The run's --budget ended the window before its rules did (TrialSpec.window_deadline_unix_s): a shorter window,
    # kept because its spread could still be measured (throughput_cv); window_planned_s is what the rules asked for.
    window_cut_by_budget: bool = False
    window_planned_s: float | None = None
    others_cpu_fraction: float | None = None  # share of the CPUs other processes took during the window (0: none)
    # The window was erratic while other processes took at least BUSY_OTHERS_FRACTION (machine/cpu_load.py) of the
    # CPU: kept (status ok) and re-measured with the leaders, not condemned for someone else's job.
    disturbed: bool = False
    node: str = ""  # where it was measured: the SLURM node that ran the job (--executor slurm); "" for a local trial
    # torch.compile (config.compile): seconds its compiling steps took beyond a steady step, in warm-up and window
    # (compiling steps are kept out of the window), the compiling steps after the first (new shapes), and the graphs
    # dynamo compiled (trial/compile_watch.py). None for an eager trial.
    compile_s: float | None = None
    recompiles: int | None = None
    compiled_graphs: int | None = None
    nodes: int = 1  # nodes the ranks ran on (--nodes); world_size counts the ranks of all of them
    hosts: list[str] | None = None  # each rank's node (SLURM's name, else the host name), in rank order
    # How the ranks met and talked (trial/interconnect.py): backend, rendezvous, gloo's interface or NCCL's version
    # and the NCCL_* environment; None for a trial of one rank.
    interconnect: dict[str, Any] | None = None
    # The node the trial's job asked for (a leader's confirmation: in_flight.on_node); "" where any would do. Unlike
    # `node`, the asked node was down or drained, or not free within the queue wait (trial/slurm_pinning.py).
    asked_node: str = ""
    # Own training (autotune/probe): the knob values the training really ran with, read inside it by the probe, and
    # per knob whether the trial's value was in force ({"asked", "ran", "in_force", "by", "note"}); None elsewhere.
    observed: dict[str, Any] | None = None
    in_force: dict[str, dict[str, Any]] | None = None
    log_tail: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"trial status {self.status!r} is not one of {', '.join(STATUSES)}")

    @property
    def feasible(self) -> bool:
        return self.status in FEASIBLE_STATUSES

    @property
    def condemns(self) -> bool:
        """Whether this result rules its configuration out (infeasible for a reason that is the configuration's)."""
        return not self.feasible and self.status not in NEUTRAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        return from_fields(cls, data)
