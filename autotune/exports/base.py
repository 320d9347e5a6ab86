"""What every export shares: the Export record, the target registry and the view of a result exporters read."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import UserError
from autotune.knobs import declarations as knobs
from autotune.knobs import length_batching
from autotune.knobs.config import TrialConfig
from autotune.knobs.dataloader import dataloader_kwargs
from autotune.knobs.declarations import WORKER_KNOBS
from autotune.knobs.optimizer_kernels import constructor_kwargs
from autotune.knobs.precision import PRECISIONS, TORCH_DEFAULT_FP32
from autotune.result.tuned_config import TunedConfig

if TYPE_CHECKING:
    from autotune.data.buckets import BucketPlan

# The most devices an export launches on: far beyond any cluster a recipe trains on, and small enough that a command
# listing every rank (a hostfile, CUDA_VISIBLE_DEVICES) stays a command.
MAX_WORLD_SIZE = 65_536

__all__ = [
    "Export",
    "ExportContext",
    "Exporter",
    "KnobExport",
    "TARGETS",
    "TARGET_KNOBS",
    "cannot",
    "export",
    "knob_table",
    "register",
    "takes",
    "unsupported",
]

# Environment variables that set TF32 for a whole process, for frameworks with no switch of their own.
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: torch reads it at start-up and allows TF32 in float32 matmuls (PyTorch docs,
# "CUDA Environment Variables"; torch 2.14 then reports cuda.matmul.fp32_precision "tf32"). cuDNN convolutions are
# TF32 already by torch's default, so with it a process runs "tf32" as autotune measures it.
# NVIDIA_TF32_OVERRIDE=0: NVIDIA's libraries (cuBLAS, cuDNN) never use TF32 whatever the framework asks: strict fp32.
TF32_ON_ENV = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"
TF32_OFF_ENV = "NVIDIA_TF32_OVERRIDE=0"

_FP32_MATH_WORDS = {"ieee": "IEEE", "tf32": "TF32"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """A paste-ready snippet for one training framework, with plain notes on what it cannot express.

    A target that cannot take the workload (no recipe for that model in the framework) has neither a config nor a
    command: only notes that say why.
    """

    target: str
    yaml_text: str | None = None  # config override, valid YAML
    python_text: str | None = None  # Python to paste (Lightning)
    command: str | None = None  # launch command line (bash)
    notes: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        return any(part is not None for part in (self.yaml_text, self.python_text, self.command))

    def render(self) -> str:
        """What `autotune export` prints: each part under a '# ...' header, notes as comment lines."""
        sections = [f"# autotune export for {self.target}"]
        if not self.supported:
            sections.append(f"# {self.target} cannot take this workload: nothing to paste (see the notes)")
        if self.yaml_text is not None:
            sections.append("# config override (YAML): merge into your training config\n" + self.yaml_text.rstrip())
        if self.python_text is not None:
            sections.append("# Python: paste into your training script\n" + self.python_text.rstrip())
        if self.command is not None:
            sections.append("# command\n" + self.command.rstrip())
        if self.notes:
            sections.append("# notes\n" + "\n".join(f"# - {note}" for note in self.notes))
        return "\n\n".join(sections) + "\n"


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportContext:
    """A tuned result as exporters read it, for a given number of devices."""

    tuned: TunedConfig
    world_size: int

    @property
    def config(self) -> TrialConfig:
        return self.tuned.config

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def step_batch_size(self) -> int:
        """Samples per forward/backward across all devices (one micro-step, before accumulation)."""
        return self.config.per_device_batch_size * self.world_size

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step across all devices."""
        return self.step_batch_size * self.config.grad_accum_steps

    @property
    def model_name(self) -> str:
        return str(self.tuned.workload.get("name") or "model")

    @property
    def on_cuda(self) -> bool:
        return self.tuned.device_type == "cuda"

    @property
    def max_frames_in_batch(self) -> int | None:
        """The dynamic-batching budget (frames per device batch) when the result was tuned with one."""
        knobs = self.config.workload_knobs
        if knobs.get(length_batching.TYPE_KNOB, length_batching.DYNAMIC) != length_batching.DYNAMIC:
            return None  # a static winner of a space with both
        return length_batching.frame_budget(knobs)

    @property
    def bucket_plan(self) -> BucketPlan | None:
        """The duration buckets and their batch sizes (per device) when the result was tuned with batch_type bucket."""
        return self.tuned.bucket_plan

    @property
    def nodes(self) -> int:
        """Nodes to launch on: the result's (--nodes), where its devices divide among them; else one."""
        nodes = self.tuned.nodes
        return nodes if nodes > 1 and self.world_size % nodes == 0 else 1

    @property
    def devices_per_node(self) -> int:
        return self.world_size // self.nodes

    def multinode_torchrun(self) -> str:
        """torchrun across the result's nodes, as its trials ran (trial/multinode.py): inside an sbatch job of that
        many nodes, srun starts one torchrun per node, and they meet in c10d's rendezvous on the job's first node
        (its name from `scontrol show hostnames`, the port free there: 29500 is torchrun's own default)."""
        first = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):29500"'
        return (
            f"srun --nodes={self.nodes} --ntasks-per-node=1 torchrun --nnodes={self.nodes} "
            f"--nproc_per_node={self.devices_per_node} --rdzv_backend=c10d --rdzv_endpoint={first} "
            '--rdzv_id="$SLURM_JOB_ID"'
        )

    def multinode_note(self) -> str | None:
        """What a multi-node command asks of the job around it (None for one node)."""
        if self.nodes == 1:
            return None
        gpus = f" --gpus-per-node={self.devices_per_node}" if self.on_cuda else ""
        return (
            f"Measured on {self.nodes} nodes of {self.devices_per_node} device(s) each: run the command inside an "
            f"sbatch job of #SBATCH --nodes={self.nodes} --ntasks-per-node=1{gpus} --exclusive (the first node hosts "
            "torchrun's c10d rendezvous on port 29500; NCCL_SOCKET_IFNAME / NCCL_IB_HCA as the result's "
            "cluster.interconnect recorded them)"
        )

    def loader_extras(self) -> dict[str, Any]:
        """prefetch_factor / persistent_workers / in_order: DataLoader accepts them only with workers; unset means its
        default."""
        kwargs = dataloader_kwargs(self.config)
        extras = {name: kwargs[name] for name in WORKER_KNOBS if name in kwargs}
        if extras.get("in_order") is True:  # DataLoader's default: a snippet leaves it out
            del extras["in_order"]
        return extras

    def optimizer_flag(self) -> dict[str, bool]:
        """The keyword the tuned optimizer implementation adds to a torch.optim constructor (none for `default`)."""
        return constructor_kwargs(self.config.optimizer_impl)

    def compile_kwargs(self) -> dict[str, Any] | None:
        """torch.compile's keywords for the tuned mode ({} for default); None when the result trains eagerly."""
        return self.tuned.compile_kwargs()

    def compile_call(self) -> str:
        """How the tuned compile reads as code: `module.compile()` or `module.compile(dynamic=True)`."""
        kwargs = self.compile_kwargs() or {}
        return "module.compile(" + ", ".join(f"{key}={value!r}" for key, value in kwargs.items()) + ")"

    def env_prefix(self) -> str:
        threads = self.config.intra_op_threads
        return f"OMP_NUM_THREADS={threads} " if threads is not None else ""

    def tf32_env(self) -> str:
        """The environment that gives a framework with no TF32 switch the measured float32 maths ("" when none is
        needed: fp32-default is what such a framework runs anyway, and TF32 means nothing on a CPU)."""
        if not self.on_cuda:
            return ""
        return {"fp32": TF32_OFF_ENV + " ", "tf32": TF32_ON_ENV + " "}.get(self.precision, "")

    def tf32_env_note(self, framework: str) -> str | None:
        """Why the command carries a TF32 environment variable, for frameworks with no switch of their own."""
        if not self.on_cuda:
            return None
        if self.precision == "fp32":
            return (
                f"fp32 was measured as strict IEEE float32 (TF32 off in matmuls and cuDNN convolutions); {framework} "
                f"has no switch for it, so the command sets {TF32_OFF_ENV} (NVIDIA's cuBLAS and cuDNN then never use "
                "TF32). Drop it to train as the recipe does (fp32-default: cuDNN convolutions in TF32 on Ampere and "
                "newer), which is at least as fast"
            )
        if self.precision == "tf32":
            return (
                f"tf32 was measured with TF32 in matmuls and cuDNN convolutions; {framework} has no switch for it, so "
                f"the command sets {TF32_ON_ENV} (torch then allows TF32 matmuls; its convolutions use TF32 by "
                "default)"
            )
        return None

    def measured_precision_note(self) -> str:
        """Which precision, and which float32 maths, the winner and the baseline were measured with (a speedup holds
        only under the maths it was measured in)."""
        winner = _describe_precision(self.precision, self.tuned.winner.fp32_math, self.on_cuda)
        note = f"Measured: {winner}"
        baseline_config = (self.tuned.search or {}).get("baseline_config") or {}
        if baseline_config.get("precision"):
            measured = self.tuned.baseline.fp32_math
            baseline = _describe_precision(baseline_config["precision"], measured, self.on_cuda)
            note += f"; the recipe baseline it is compared with ran {baseline}"
        return note

    def common_notes(self) -> tuple[str, ...]:
        notes = [self.measured_precision_note()]
        measured = self.config.world_size
        if self.world_size != measured:
            frames, plan = self.max_frames_in_batch, self.bucket_plan
            kept = (
                f"max_frames_in_batch={frames} per device"
                if frames is not None
                else f"bucket_batch_sizes={list(plan.batch_sizes)} per device"
                if plan is not None
                else f"per_device_batch_size={self.config.per_device_batch_size}, global batch {self.global_batch_size}"
            )
            notes.append(
                f"Measured with world_size={measured}; exported for {self.world_size} device(s) with the per-device "
                f"settings kept ({kept}): throughput on {self.world_size} device(s) was not measured"
            )
        if (
            length_batching.batch_type(self.config.workload_knobs) == length_batching.BUCKET
            and self.bucket_plan is None
        ):
            notes.append(
                "Tuned with bucket batches, but no trial recorded its buckets (metrics.winner.epoch_accounting): the "
                "batch settings below are not what was measured; re-run autotune"
            )
        if self.tuned.nodes > 1 and self.nodes == 1:
            notes.append(
                f"Measured on {self.tuned.nodes} nodes; {self.world_size} device(s) do not divide among them, so this "
                "is a one-node launch: its throughput was not measured"
            )
        if not self.on_cuda:
            notes.append(
                f"This result was measured on {self.tuned.device_type}; on a GPU machine re-run autotune there, since "
                "batch size, workers and precision trade off differently"
            )
        return tuple(notes)


def _describe_precision(precision: str, math: dict[str, str] | None, on_cuda: bool) -> str:
    """ "fp32-default (float32 matmuls IEEE, cuDNN convolutions TF32)" from the float32 maths the trial recorded
    (Measurements.fp32_math), else the flags."""
    if not on_cuda:
        return f"{precision} on the CPU (TF32 does not apply there)"
    if isinstance(math, dict) and {"matmul", "cudnn_conv"} <= math.keys():
        matmul, conv = (_FP32_MATH_WORDS.get(math[key], math[key]) for key in ("matmul", "cudnn_conv"))
        return f"{precision} (float32 matmuls {matmul}, cuDNN convolutions {conv}, as recorded by the trial)"
    described = {
        "fp32": "strict IEEE float32 in matmuls and cuDNN convolutions",
        TORCH_DEFAULT_FP32: "the TF32 flags as torch leaves them: matmuls IEEE, cuDNN convolutions TF32 on Ampere+",
        "tf32": "TF32 in matmuls and cuDNN convolutions",
        "bf16": "bfloat16 autocast",
        "fp16": "float16 autocast with a GradScaler",
    }
    return f"{precision} ({described.get(precision, precision)})"


Exporter = Callable[[ExportContext], Export]
KnobNotes = Callable[[ExportContext], Sequence[str]]

TARGETS: dict[str, Exporter] = {}


@dataclass(frozen=True, kw_only=True, slots=True)
class KnobExport:
    """How one export target takes one knob (knobs/declarations.py): what carries the tuned value (a flag, a config key,
    an argument; "" when nothing can), and the notes that say where the target cannot run what was measured."""

    how: str
    notes: KnobNotes | None = None

    def notes_for(self, context: ExportContext) -> list[str]:
        return list(self.notes(context)) if self.notes is not None else []


def takes(how: str, notes: KnobNotes | None = None) -> KnobExport:
    """The target carries the knob's value (`how`); `notes` say where it still differs from what was measured."""
    return KnobExport(how=how, notes=notes)


def cannot(notes: KnobNotes) -> KnobExport:
    """The target has no way to carry the knob: `notes` say so whenever the tuned value is not what it runs."""
    return KnobExport(how="", notes=notes)


# Each target's table: every knob of knobs/declarations.py, how the target takes it (tests/knobs/test_knobs.py checks
# that none is missing). Their notes follow the target's own in an export, in declaration order.
TARGET_KNOBS: dict[str, dict[str, KnobExport]] = {}


def knob_table(target: str, table: Mapping[str, KnobExport]) -> dict[str, KnobExport]:
    """File a target's knob table; a name that is no declared knob is a mistake (a typo would hide a knob)."""
    unknown = set(table) - set(knobs.NAMES)
    if unknown:
        raise ValueError(f"export target {target!r}: {sorted(unknown)} are not knobs; declared: {knobs.NAMES}")
    ordered = {name: table[name] for name in knobs.NAMES if name in table}
    TARGET_KNOBS[target] = ordered
    return ordered


def register(name: str) -> Callable[[Exporter], Exporter]:
    """Decorator: file an exporter under its CLI name."""

    def decorate(exporter: Exporter) -> Exporter:
        if name in TARGETS:
            raise ValueError(f"export target {name!r} registered twice")
        TARGETS[name] = exporter
        return exporter

    return decorate


def unsupported(target: str, context: ExportContext, reason: str) -> Export:
    """An export that says why the target cannot take this workload, and what to use instead."""
    return Export(
        target=target,
        notes=(
            f"{target} cannot take {context.model_name}: {reason}",
            "Use the values from Python instead (autotune.load_config(RESULT): dataloader_kwargs(), "
            "apply_backend_flags(), autocast(), grad_scaler()) or export to a target that has this model",
        ),
    )


def export(tuned: TunedConfig, target: str, *, world_size: int | None = None) -> Export:
    """A paste-ready snippet of a tuned result for one training framework.

    Args:
        tuned: the result, e.g. from autotune.load_config.
        target: a key of TARGETS ("3d-speaker", "wenet", "speechbrain", "espnet", "lightning").
        world_size: devices to launch on; default the world_size the result was measured with. Per-device
            settings are kept, so global batch sizes scale with it.

    Returns:
        The Export; its render() is what `autotune export` prints.

    Raises:
        UserError: unknown target (the message lists the valid ones), world_size below 1, or a precision this
            version does not know.
    """
    if target not in TARGETS:
        raise UserError(f"unknown export target {target!r}; choose one of {', '.join(sorted(TARGETS))}")
    if world_size is not None and not 1 <= world_size <= MAX_WORLD_SIZE:
        raise UserError(f"--world-size must be between 1 and {MAX_WORLD_SIZE:,} devices, got {world_size}")
    if tuned.config.precision not in PRECISIONS:
        raise UserError(
            f"result precision {tuned.config.precision!r} is not one of {', '.join(PRECISIONS)}; pass a file written "
            "by 'autotune run'"
        )
    context = ExportContext(tuned=tuned, world_size=world_size or tuned.config.world_size)
    result = TARGETS[target](context)
    if not result.supported:
        return result
    knob_notes = tuple(note for entry in TARGET_KNOBS[target].values() for note in entry.notes_for(context))
    return dataclasses.replace(result, notes=result.notes + knob_notes + context.common_notes())
