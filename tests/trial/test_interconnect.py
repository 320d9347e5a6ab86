"""The interconnect facts a trial of several ranks records (trial/interconnect.py): gloo's interface on a CPU, read
from this machine; NCCL's version and environment on CUDA, tested at their boundary with fakes (no GPU here)."""

from __future__ import annotations

import pytest

from autotune.trial import interconnect


def _raises() -> tuple[int, int, int]:
    raise RuntimeError("NCCL is not available in this build")


@pytest.mark.parametrize(
    ("reported", "version"),
    [(lambda: (2, 21, 5), "2.21.5"), (lambda: 21805, "2.18.5"), (lambda: 2708, "2.7.8"), (_raises, None)],
    ids=["tuple", "code-from-2.9", "code-before-2.9", "no-nccl"],
)
def test_cuda_records_nccls_version_and_its_environment(reported, version) -> None:
    env = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0", "TORCHELASTIC_RUN_ID": "autotune-7", "HOME": "/h"}
    env |= {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    facts = interconnect.facts("cuda", env, nccl_version=reported)
    assert facts["backend"] == "nccl" and facts["nccl_version"] == version
    assert facts["nccl_env"] == {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "ib0"}  # NCCL_* only, sorted
    assert facts["rendezvous"] == "c10d (torchrun)" and facts["master"] == "10.0.0.1:29500"
    assert "gloo_interface" not in facts


def test_the_real_nccl_version_reads_as_text() -> None:
    facts = interconnect.facts("cuda", {})  # this torch's own NCCL (a CUDA build, whether or not a GPU is here)
    assert facts["nccl_version"] is None or facts["nccl_version"].count(".") == 2


def test_gloo_named_interface_is_recorded_with_its_address() -> None:
    facts = interconnect.facts("cpu", {"GLOO_SOCKET_IFNAME": "lo"})
    assert facts["backend"] == "gloo" and facts["rendezvous"] == "env (autotune's launcher)"
    assert (facts["gloo_interface"], facts["gloo_address"]) == ("lo", "127.0.0.1")
    assert facts["gloo_interface_from"] == "GLOO_SOCKET_IFNAME"


def test_gloo_without_a_name_takes_the_host_names_address() -> None:
    facts = interconnect.facts("cpu", {})
    assert facts["gloo_interface_from"] == "the host name's address" and facts["gloo_address"]
    assert facts["gloo_interface"]  # the interface holding it (loopback where the name resolves to 127.x)


def test_a_ranks_host_is_slurms_name_for_its_node() -> None:
    assert interconnect.rank_host({"SLURMD_NODENAME": "node2"}) == "node2"
    assert interconnect.rank_host({})  # the host name otherwise
