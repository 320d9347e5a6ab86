"""The workload registry: built-in names and `package.module:factory` plugins told apart in one place."""

from __future__ import annotations

import pytest

from autotune import workloads
from autotune.errors import WorkloadError


def test_a_plugin_is_a_module_and_factory_reference() -> None:
    assert workloads.is_plugin("tests.faults.plugins:factory")
    assert not any(workloads.is_plugin(name) for name in workloads.names())
    with pytest.raises(WorkloadError, match="unknown model 'nope'"):
        workloads.get("nope")  # no colon: an unknown built-in, never an import attempt
