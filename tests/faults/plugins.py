"""Plugin workloads that misbehave while loading their data, for the fault matrix (`--model tests.faults.plugins:X`)."""

from __future__ import annotations

import dataclasses
import sys

from autotune.workloads import Workload
from tests.fixtures.faulty_workload import workload as faulty


def _raise(path: str | None) -> None:
    raise KeyError("speaker_id column")


def _exit(path: str | None) -> None:
    sys.exit(0)


def raising_load_data() -> Workload:
    return dataclasses.replace(faulty(), name="raises-in-load-data", load_data=_raise)


def exiting_load_data() -> Workload:
    return dataclasses.replace(faulty(), name="exits-in-load-data", load_data=_exit)


def none_load_data() -> Workload:
    return dataclasses.replace(faulty(), name="none-from-load-data", load_data=lambda path: None)
