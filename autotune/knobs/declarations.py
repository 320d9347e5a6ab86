"""The tuning knobs: one declaration each, from which every layer that names a knob derives what it needs.

A knob is one setting a trial runs with and the result hands over (a DataLoader argument, a precision, a thread
count...). Declared here once, it gives the search space its type and least value (space/params.py CORE_PARAMS,
MINIMUM, RECIPE_SETTINGS), the trial line its word (TrialConfig.short()), the trial table and CSV their column
(result/report.py TRIAL_COLUMNS) and the plots their matching (result/plots.py KNOBS), and the result file its place
(TunedConfig.to_dict / from_dict). TrialConfig keeps one typed field per knob, and every export target one entry per
knob in its table (exports/base.py TARGET_KNOBS); tests/knobs/test_knobs.py fails when a knob is declared without them.
docs/adding-a-knob.md walks through adding one.

Workload knobs (a workload's own, e.g. the conformer's batch_type and max_frames_in_batch: Workload.knobs) are not
declared here: they travel as TrialConfig.workload_knobs and in the result's `workload_knobs` section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autotune.knobs import compile_modes, optimizer_kernels
from autotune.knobs.compile_modes import MODES as COMPILE_MODES
from autotune.knobs.compile_modes import OFF as COMPILE_OFF
from autotune.knobs.dataloader import in_order_unsupported
from autotune.knobs.feature_device import DEVICE as FEATURES_ON_DEVICE
from autotune.knobs.feature_device import PLACEMENTS as FEATURE_PLACEMENTS
from autotune.knobs.feature_device import WORKERS as FEATURE_WORKERS
from autotune.knobs.optimizer_kernels import DEFAULT as DEFAULT_OPTIMIZER
from autotune.knobs.optimizer_kernels import IMPLEMENTATIONS as OPTIMIZER_IMPLEMENTATIONS
from autotune.knobs.precision import PRECISIONS

__all__ = [
    "KNOBS",
    "NAMES",
    "RESULT_SECTIONS",
    "TORCH_DEFAULTS",
    "WORKER_KNOBS",
    "Knob",
    "flat_values",
    "get",
    "result_sections",
    "read_result",
    "trial_words",
]

# Where a knob acts: the DataLoader's arguments, the training process (threads, backend flags), the model's maths
# (autocast), the dataset (preloading), or the run's shape (devices, accumulation).
Applies = Literal["dataloader", "process", "model", "data", "run"]
# How a search space may name it: searched (params, fixed, baseline, seeds), fixed only (a recipe setting every
# configuration keeps), or not at all (set by the run: --world-size, the preload probe).
SpaceRole = Literal["searched", "fixed", "run"]
# The result file's knob sections, in the order they are written.
RESULT_SECTIONS = ("batch", "dataloader", "precision", "optimizer", "memory", "threads", "audio", "features", "compile")
_COLUMN_DTYPES = {int: "Int64", bool: "boolean", str: "string"}  # nullable: a failed trial has no configuration


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    """One knob: its name and type, where it acts, how a space may name it, its word and its place in the result.

    Attributes:
        name: the TrialConfig field, the space's parameter and the trial table's column.
        type: int, bool or str (a knob that may be unset, e.g. prefetch_factor, is None then).
        applies: where it acts (Applies).
        space: how a search space may name it (SpaceRole).
        minimum: the least value of a count (a batch of one, no workers, one thread).
        maximum: the most a count may be: far past any machine, so that a typo (a batch of 10**12) is refused before
            it costs a run rather than trained.
        choices: the only values a word may take (precision).
        section: the result section it is written in (RESULT_SECTIONS).
        key: its key in that section, when not its name.
        required: every result autotune wrote has it; False: an older result without it reads TrialConfig's default.
        word: its word in the trial line for a value (None: nothing to say, the line stays short).
        torch_default: what a training script runs when it does not set the knob (torch's own default; for
            feature_device the recipes' placement); None where the knob has no such value.
        needs_workers: DataLoader takes it only with workers (TrialConfig resets it without; dataloader_kwargs
            leaves it out).
        unsupported: why this torch and machine cannot run a value on a device type (None: it can); a space that
            fixes such a value is refused with the reason.
        left_out: the choices of a searched knob the search leaves out on a device type, each with the note that
            says why (what cannot run here, and for optimizer_impl kernels that `default` already runs).
    """

    name: str
    type: type
    applies: Applies
    space: SpaceRole
    section: str
    word: Callable[[Any], str | None]
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    key: str | None = None
    required: bool = True
    torch_default: Any = None
    needs_workers: bool = False
    unsupported: Callable[[Any, str], str | None] | None = None
    left_out: Callable[[list[Any], str], dict[Any, str]] | None = None

    @property
    def result_key(self) -> str:
        return self.key or self.name

    @property
    def column_dtype(self) -> str:
        """The trial table's pandas dtype for this knob."""
        return _COLUMN_DTYPES[self.type]


def _flag(word: str) -> Callable[[Any], str | None]:
    return lambda value: word if value else None


def _labelled(label: str) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else f"{label}={value}"


def _optimizer_word(value: str) -> str | None:
    """The recipe's own optimizer (`default`) is left out of the trial line: lines recorded before the knob existed
    (benchmarks/replay.py keys by them) stay the lines of the same configurations."""
    return None if value == DEFAULT_OPTIMIZER else value


def _feature_word(value: str | None) -> str | None:
    """Only features moved onto the device get a word: the recipe's placement (unset, or the workers of the recipes
    that have one) keeps the lines recorded before the knob existed."""
    return "fbank@dev" if value == FEATURES_ON_DEVICE else None


def _checkpointing_word(value: bool | None) -> str | None:
    """`ckpt` / `no-ckpt` where a configuration sets activation checkpointing; nothing where it runs the recipe's own
    (unset), so that lines recorded before the knob stay the lines of the same configurations."""
    return None if value is None else ("ckpt" if value else "no-ckpt")


def _compile_word(value: str) -> str | None:
    """Eager (`off`) is left out of the trial line: lines recorded before the knob existed (benchmarks/replay.py
    keys by them) stay the lines of the same configurations."""
    return None if value == COMPILE_OFF else f"compile={value}"


def _in_order_unsupported(value: bool, device_type: str) -> str | None:
    """Only out-of-order delivery needs the argument; in order is how every DataLoader runs."""
    return None if value else in_order_unsupported()


def _in_order_left_out(choices: list[Any], device_type: str) -> dict[Any, str]:
    why = _in_order_unsupported(False, device_type) if False in choices else None
    return {False: f"in_order false left out of the search: {why}"} if why else {}


def _unshown(value: Any) -> None:
    """cudnn_benchmark is left out of the trial line: every shipped space fixes it, and recorded benchmark runs are
    keyed by the line (benchmarks/replay.py)."""
    return None


KNOBS: tuple[Knob, ...] = (
    Knob(
        name="per_device_batch_size",
        type=int,
        applies="dataloader",
        space="searched",
        minimum=1,
        maximum=2**20,
        section="batch",
        word=lambda value: f"bs={value}",
    ),
    Knob(
        name="num_workers",
        type=int,
        applies="dataloader",
        space="searched",
        minimum=0,
        maximum=4096,
        section="dataloader",
        word=lambda value: f"w={value}",
        torch_default=0,
    ),
    Knob(
        name="prefetch_factor",
        type=int,
        applies="dataloader",
        space="searched",
        minimum=1,
        maximum=4096,
        section="dataloader",
        required=False,  # unset (DataLoader's own default) is not written
        word=_labelled("pf"),
        torch_default=2,
        needs_workers=True,
    ),
    Knob(
        name="pin_memory",
        type=bool,
        applies="dataloader",
        space="searched",
        section="dataloader",
        word=_flag("pin"),
        torch_default=False,
    ),
    Knob(
        name="persistent_workers",
        type=bool,
        applies="dataloader",
        space="searched",
        section="dataloader",
        required=False,  # not written without workers
        word=_flag("persist"),
        torch_default=False,
        needs_workers=True,
    ),
    Knob(
        name="in_order",
        type=bool,
        applies="dataloader",
        space="searched",
        section="dataloader",
        required=False,  # not written without workers; results written before the knob ran DataLoader's default
        word=lambda value: None if value else "unordered",
        torch_default=True,
        needs_workers=True,
        unsupported=_in_order_unsupported,
        left_out=_in_order_left_out,
    ),
    Knob(
        name="precision",
        type=str,
        applies="model",
        space="searched",
        choices=PRECISIONS,
        section="precision",
        key="name",
        word=str,
    ),
    Knob(
        name="optimizer_impl",
        type=str,
        applies="model",
        space="searched",
        choices=OPTIMIZER_IMPLEMENTATIONS,
        section="optimizer",
        key="implementation",
        required=False,  # results written before the knob stepped the recipe's optimizer as built: `default`
        word=_optimizer_word,
        torch_default=DEFAULT_OPTIMIZER,
        unsupported=optimizer_kernels.unsupported_reason,
        left_out=optimizer_kernels.left_out,
    ),
    Knob(
        name="activation_checkpointing",
        type=bool,
        applies="model",
        space="searched",
        section="memory",
        required=False,  # results written before the knob trained as the recipe does: unset (None)
        word=_checkpointing_word,
    ),
    Knob(
        name="intra_op_threads",
        type=int,
        applies="process",
        space="searched",
        minimum=1,
        maximum=4096,
        section="threads",
        required=False,
        word=_labelled("thr"),
    ),
    Knob(
        name="cudnn_benchmark",
        type=bool,
        applies="process",
        space="searched",
        section="precision",
        word=_unshown,
        torch_default=False,
    ),
    Knob(
        name="world_size",
        type=int,
        applies="run",
        space="run",
        minimum=1,
        maximum=2**16,
        section="batch",
        word=lambda value: f"x{value}dev" if value > 1 else None,
    ),
    Knob(
        name="grad_accum_steps",
        type=int,
        applies="run",
        space="fixed",
        minimum=1,
        maximum=2**16,
        section="batch",
        word=lambda value: f"accum={value}" if value > 1 else None,
    ),
    Knob(
        name="preload_audio",
        type=bool,
        applies="data",
        space="run",
        section="audio",
        key="preload_decoded",
        required=False,
        word=_flag("preload"),
    ),
    Knob(
        name="feature_device",
        type=str,
        applies="data",
        space="searched",
        choices=FEATURE_PLACEMENTS,
        section="features",
        key="computed_in",
        required=False,  # unset: where the recipe computes them (results before the knob, workloads without a choice)
        word=_feature_word,
        torch_default=FEATURE_WORKERS,
    ),
    Knob(
        name="compile",
        type=str,
        applies="model",
        space="searched",
        choices=COMPILE_MODES,
        section="compile",
        key="mode",
        required=False,  # results written before the knob trained eagerly: `off`
        word=_compile_word,
        torch_default=COMPILE_OFF,
        unsupported=compile_modes.unsupported_reason,
        left_out=compile_modes.left_out,
    ),
)
NAMES: tuple[str, ...] = tuple(knob.name for knob in KNOBS)
_BY_NAME = {knob.name: knob for knob in KNOBS}


WORKER_KNOBS: tuple[str, ...] = tuple(knob.name for knob in KNOBS if knob.needs_workers)
# What a training script runs for each knob it does not set (torch's defaults; the recipes' feature placement).
TORCH_DEFAULTS: dict[str, Any] = {knob.name: knob.torch_default for knob in KNOBS if knob.torch_default is not None}


def get(name: str) -> Knob:
    """A declared knob by name (KeyError for anything else: a workload knob has no declaration)."""
    return _BY_NAME[name]


def trial_words(values: Mapping[str, Any]) -> list[str]:
    """The trial line's words for a configuration's knob values, in declaration order."""
    words = (knob.word(values[knob.name]) for knob in KNOBS)
    return [word for word in words if word is not None]


def result_sections(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every knob's value under its section and key, sections in RESULT_SECTIONS order."""
    sections: dict[str, dict[str, Any]] = {section: {} for section in RESULT_SECTIONS}
    for knob in KNOBS:
        sections[knob.section][knob.result_key] = values[knob.name]
    return sections


def read_result(data: Mapping[str, Any]) -> dict[str, Any]:
    """The knob values a result file holds, by knob name; a knob it lacks (required=False) is left out, so that
    TrialConfig's default applies.

    Raises:
        KeyError: a required knob or its section is missing (the caller says the file is not an autotune result).
        TypeError: a section is not a mapping.
        ValueError: a value of the wrong type, out of its bounds, or a word the knob does not take.
    """
    values: dict[str, Any] = {}
    for knob in KNOBS:
        section = data[knob.section] if knob.required else (data.get(knob.section) or {})
        if not isinstance(section, Mapping):  # `threads: [2]`: not a result, never a default read past it
            raise TypeError(f"section {knob.section!r} is a {type(section).__name__}, not a mapping")
        if knob.required or knob.result_key in section:
            values[knob.name] = _checked(knob, section[knob.result_key])
    return values


def _checked(knob: Knob, value: Any) -> Any:
    """A knob's value as a result holds it: of the knob's type (None only where the knob may be unset), a count
    within its bounds, a word one of its choices. A hand-edited `batch_size: abc` or `implementation: apex` is not an
    autotune result, and would otherwise fail only where the value is used, or be exported as is."""
    where = f"{knob.section}.{knob.result_key}"
    if value is None and not knob.required:
        return value
    right_type = isinstance(value, knob.type) and not (knob.type is int and isinstance(value, bool))
    if not right_type:
        raise ValueError(f"{where} {value!r} is not a{'n' if knob.type is int else ''} {knob.type.__name__}")
    if knob.choices and value not in knob.choices:
        raise ValueError(f"{where} {value!r} is not one of {', '.join(knob.choices)}")
    if knob.minimum is not None and value < knob.minimum:
        raise ValueError(f"{where} {value!r} is below the least ({knob.minimum})")
    if knob.maximum is not None and value > knob.maximum:
        raise ValueError(f"{where} {value!r} is above the most ({knob.maximum:,})")
    return value


def flat_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored configuration (TrialConfig.to_dict(), e.g. a trial's user attribute) as one flat mapping: the
    declared knobs and the workload's own (also under the name older versions stored them as, `extra`)."""
    workload = config.get("workload_knobs") or config.get("extra") or {}
    return {**{name: config.get(name) for name in NAMES}, **workload}
