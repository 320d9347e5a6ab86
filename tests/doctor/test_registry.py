"""The registry: one dict of checks keyed by name, per-GPU checks run GPU by GPU, a check that raises is reported."""

from __future__ import annotations

import pytest

from autotune.doctor import CHECKS, Verdict, check, examine
from autotune.doctor.context import DoctorContext, DoctorRequest, GpuHandle, NvmlView
from autotune.doctor.registry import Check, ok
from autotune.machine.gpus import GpuInfo


def _context(gpu_count: int = 0) -> DoctorContext:
    devices = [
        GpuHandle(
            index=index,
            handle=index,
            info=GpuInfo(name="G", uuid=f"GPU-{index}", memory_bytes=1, compute_capability=(9, 0)),
            mig=None,
            nvml=None,  # type: ignore[arg-type]
        )
        for index in range(gpu_count)
    ]
    return DoctorContext(request=DoctorRequest(), tuned=None, workload=None, nvml=NvmlView(devices=devices))


PER_GPU = {"load", "mig", "ecc", "persistence", "clocks", "pcie", "power"}
MACHINE = {"torch.build", "driver", "cuda.visible_devices", "tf32", "bf16", "distributed", "cpu.cores", "cpu.numa"}
MACHINE |= {"cpu.governor", "env.distributed", "env.runtime", "loader.shm", "loader.open_files"}
MACHINE |= {"audio.decoders", "data.read"}


def test_the_built_in_checks_cover_what_the_issue_asks() -> None:
    assert {name for name, entry in CHECKS.items() if entry.per_gpu} == PER_GPU
    assert MACHINE <= {name for name, entry in CHECKS.items() if not entry.per_gpu}


def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        check("tf32")(lambda context: ok("x"))


def test_per_gpu_checks_run_gpu_by_gpu_and_are_named_after_the_gpu() -> None:
    checks = [
        Check("first", lambda context: ok("machine")),
        Check("a", lambda context, gpu: ok(f"a{gpu.index}"), per_gpu=True),
        Check("b", lambda context, gpu: ok(f"b{gpu.index}"), per_gpu=True),
        Check("last", lambda context: ok("machine")),
    ]
    report = examine(_context(gpu_count=2), checks)
    assert [f.name for f in report.findings] == ["first", "gpu0.a", "gpu0.b", "gpu1.a", "gpu1.b", "last"]
    assert [f.value for f in report.findings][1:5] == ["a0", "b0", "a1", "b1"]


def test_without_gpus_per_gpu_checks_report_nothing() -> None:
    report = examine(_context(gpu_count=0), [Check("a", lambda context, gpu: ok("x"), per_gpu=True)])
    assert report.findings == ()


def test_a_check_that_raises_is_a_warning_and_the_others_still_run() -> None:
    def broken(context: DoctorContext):
        raise OSError("/proc went away")

    report = examine(_context(), [Check("broken", broken), Check("fine", lambda context: ok("fine"))])
    first, second = report.findings
    assert first.name == "broken" and first.verdict is Verdict.WARN
    assert first.value == "could not check: OSError: /proc went away"
    assert "bug" in first.fix
    assert second.value == "fine"
