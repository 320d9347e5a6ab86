"""The test SLURM cluster (tests/fixtures/slurm.py), started once per test session that asks for it; skipped with the
reason where it cannot start."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fixtures import slurm


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[slurm.Cluster]:
    why = slurm.unavailable()
    if why:
        pytest.skip(why)
    try:
        context = slurm.running()
        cluster = context.__enter__()
    except RuntimeError as error:
        pytest.skip(f"the test SLURM cluster did not start: {str(error).splitlines()[0]}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # every client this process and its trials start uses it
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        context.__exit__(None, None, None)
