"""The result file's evidence sections, typed: what a TunedConfig's workload, metrics, hardware, data, search and
cluster mappings hold, key by key.

They stay mappings (TypedDicts), because they are written to YAML as they are and read back from files that older
versions wrote: every key is optional to the reader (`total=False`), and the knob sections are typed by TrialConfig
itself. docs/result.md says what each key means to a user.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, TypedDict

__all__ = [
    "ClusterSection",
    "DataSection",
    "HardwareSection",
    "Metrics",
    "SearchSection",
    "WorkloadSection",
    "check_sections",
]


class WorkloadSection(TypedDict, total=False):
    """What was tuned: the workload's name, the --model it was asked for, its task and options."""

    name: str
    model: str
    task: str
    options: dict[str, Any]


class Metrics(TypedDict, total=False):
    """What the run measured and concluded: the winner's and the baseline's measurements (Measurements.to_dict),
    the speedup with its range, the epoch prediction, and the assessment's sections."""

    objective: str  # samples_per_second
    run_length: dict[str, Any]  # RunLength.to_dict(): what one-off costs were charged over
    winner: dict[str, Any]
    baseline: dict[str, Any]
    speedup: float | None
    speedup_range: dict[str, Any] | None
    epoch: dict[str, Any] | None
    data_preparation: dict[str, Any] | None
    compute: dict[str, Any]
    overhead: dict[str, Any]
    noise: dict[str, Any]
    amp_check: dict[str, Any]
    preload: dict[str, Any] | None
    diagnosis: dict[str, Any]


class HardwareSection(TypedDict, total=False):
    """The machine it was measured on (Hardware.to_dict), its fingerprint included."""

    device_type: str
    gpus: list[dict[str, Any]]
    cpu_model: str
    cpu_cores: int
    memory_bytes: int
    shm_bytes: int | None
    driver_version: str | None
    torch_version: str
    cuda_version: str | None
    torchaudio_version: str | None
    python_version: str
    fingerprint: str


class DataSection(TypedDict, total=False):
    """The data it was measured on (DataSource.describe)."""

    kind: str
    path: str | None
    synthetic: bool
    n_utterances: int
    n_utterances_total: int
    subset: bool
    n_speakers: int
    total_audio_hours: float
    sample_rates: list[int]


class SearchSection(TypedDict, total=False):
    """How the winner was found: the space, the study and its storage (password hidden), where the trials ran, how
    many ended how, what stopped the search, the timing rules and the budget plan, and the machine's load."""

    space_file: str
    space: dict[str, Any]
    baseline_config: dict[str, Any] | None  # TrialConfig.to_dict() of the recipe's baseline
    sampler: str
    study_name: str
    storage: str
    executor: dict[str, Any]
    trials_this_run: int
    trial_statuses: dict[str, int]
    stopped_by: str
    elapsed_s: float
    timing: dict[str, Any]  # TimingSettings.to_dict()
    budget_plan: dict[str, Any] | None
    machine_load: dict[str, Any]


class ClusterSection(TypedDict, total=False):
    """A result measured across nodes (--nodes): its shape, hosts and interconnect; absent for one machine."""

    nodes: int
    devices_per_node: int
    world_size: int
    global_batch_size: int
    launcher: str
    hosts: list[str]
    interconnect: dict[str, Any]


# The sections a result holds, in the order it writes them; all but cluster (one machine) are always there.
SECTIONS: dict[str, type] = {
    "workload": WorkloadSection,
    "metrics": Metrics,
    "hardware": HardwareSection,
    "data": DataSection,
    "search": SearchSection,
    "cluster": ClusterSection,
}


def check_sections(data: Mapping[str, Any]) -> None:
    """One check of a result file's sections against their declared types, on every read: a section that is not a
    mapping, or a key whose value is not of its type (a model that is a list, a speedup that is "fast"), is refused
    here, naming the field, rather than failing as an AttributeError wherever it is used. Keys a newer autotune
    added pass unchecked.

    Raises:
        ValueError: the first field that does not fit.
    """
    for name, declared in SECTIONS.items():
        if name not in data and name == "cluster":
            continue
        section = data[name]
        if not isinstance(section, Mapping):
            raise ValueError(f"{name} is a {type(section).__name__}, not a mapping")
        for key, hint in typing.get_type_hints(declared).items():
            if key in section and not _fits(section[key], hint):
                raise ValueError(f"{name}.{key} {_shown(section[key])} is not {_described(hint)}")


def _fits(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_fits(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin is float:  # YAML writes a whole float as an int
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


def _described(hint: Any) -> str:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_described(option) for option in typing.get_args(hint))
    names = {str: "text", int: "a whole number", float: "a number", bool: "true or false", dict: "a mapping"}
    names |= {list: "a list", type(None): "empty (null)"}
    return names.get(typing.get_origin(hint) or hint, str(hint))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
