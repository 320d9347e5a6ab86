"""Who else uses the CPUs: /proc figures, the calibration with a real busy neighbour, what a busy machine changes."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.machine import cpu_load as machine_load
from autotune.machine.cpu_load import (
    CpuSample,
    MachineLoad,
    calibrate,
    cpu_sample,
    measure_load,
    others_fraction,
    process_tree,
)
from autotune.run.preflight import adapt
from autotune.search.settings import TunerSettings
from autotune.trial import TimingSettings

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_others_share_is_the_cpus_busy_time_less_ours():
    before = CpuSample(at_s=0.0, cpus=2, busy_s=100.0, own_s=10.0)
    after = CpuSample(at_s=10.0, cpus=2, busy_s=115.0, own_s=19.0)
    assert others_fraction(before, after) == pytest.approx((15.0 - 9.0) / 20.0)
    assert others_fraction(before, after, own_s=15.0) == 0.0  # several ranks' trees: all of the busy time is ours
    assert others_fraction(before, CpuSample(at_s=10.0, cpus=2, busy_s=None, own_s=19.0)) is None


@linux_only
def test_our_process_tree_and_its_cpu_time_are_read_from_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in process_tree()
        before = cpu_sample()
        end = time.process_time() + 0.3
        while time.process_time() < end:  # burn some CPU ourselves
            pass
        after = cpu_sample()
        assert after.own_s - before.own_s >= 0.2 and after.busy_s - before.busy_s >= 0.2
    finally:
        child.kill()
        child.wait()


@linux_only
def test_the_calibration_sees_a_neighbour_burning_a_core(tmp_path):
    """A process outside our tree (its parent shell exits, so it is re-parented) spinning on one core is 'others', in
    one calibration and in both of the run's."""
    spin = "import time; end = time.time() + 20\nwhile time.time() < end: pass"
    pid_file = tmp_path / "spinner.pid"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{spin}" >/dev/null 2>&1 & echo $! > {pid_file}'], check=True)
    pid = int(pid_file.read_text())
    try:
        assert pid not in process_tree()
        time.sleep(0.3)
        load = calibrate(seconds=1.0)
        assert load.others_cpu_fraction is not None and load.others_cpu_fraction >= 0.2
        assert load.busy and "other processes took" in load.describe()
        lasting = measure_load(seconds=1.0)  # the run's reading: busy once, taken again, busy again
        assert lasting.busy and "during the quieter of 2 calibrations of" in lasting.describe()
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_busy_first_reading_is_taken_again_and_the_quieter_stands(monkeypatch):
    """A moment's load (another process starting, the VM's host taking the CPU) must not set the whole run's plan: a
    busy reading is taken again and the quieter of the two stands; a quiet first reading is not repeated."""

    def reading(others: float) -> MachineLoad:
        return MachineLoad(
            cores=2, load_average=0.8, others_cpu_fraction=others, kernel_spread_fraction=0.1, seconds=1.0
        )

    readings: list[MachineLoad] = []
    monkeypatch.setattr(machine_load, "calibrate", lambda seconds: readings.pop(0))
    readings[:] = [reading(0.34), reading(0.01)]
    load = measure_load()
    assert (load.others_cpu_fraction, load.busy, load.calibrations, readings) == (0.01, False, 2, [])
    readings[:] = [reading(0.45), reading(0.30)]
    load = measure_load()
    assert (load.others_cpu_fraction, load.busy, load.calibrations) == (0.30, True, 2)
    readings[:] = [reading(0.02), reading(0.5)]
    load = measure_load()
    assert (load.others_cpu_fraction, load.calibrations, len(readings)) == (0.02, 1, 1)
    assert "during a 1.0-s calibration" in load.describe()


def test_a_busy_machine_gets_longer_windows():
    busy = MachineLoad(cores=2, load_average=3.1, others_cpu_fraction=0.45, kernel_spread_fraction=0.2, seconds=1.5)
    quiet = MachineLoad(cores=2, load_average=0.1, others_cpu_fraction=0.01, kernel_spread_fraction=0.02, seconds=1.5)
    settings = TunerSettings(timing=TimingSettings(window_s=10.0), confirm_repeats=2)
    assert adapt(settings, quiet) == (settings, [])
    adapted, changes = adapt(settings, busy)
    assert adapted.timing.window_s == 10.0 * machine_load.BUSY_WINDOW_FACTOR and adapted.confirm_repeats == 2
    assert "windows of at least 20 s" in changes[0]
    assert busy.to_dict()["busy"] and not quiet.to_dict()["busy"]
    assert busy.free_cores == 1 and quiet.free_cores == 2 and adapted.free_cores == 1
    assert changes[1] == "the seeds that train on every core train on the 1 of 2 the others left"
    light = dataclasses.replace(busy, others_cpu_fraction=0.22)  # busy, but both cores about free
    assert light.free_cores == 2 and adapt(settings, light)[0].free_cores is None


def test_the_load_is_recorded_in_a_new_result_and_the_frozen_one_is_left_as_it_was():
    from autotune.run import preflight
    from tests.result.test_results import make_tuned

    busy = MachineLoad(cores=2, load_average=3.1, others_cpu_fraction=0.45, kernel_spread_fraction=0.2, seconds=1.5)
    changes = ["busy: windows of at least 20 s instead of 10"]
    tuned = make_tuned()
    before = (dict(tuned.search), list(tuned.notes))
    recorded = preflight.record(
        preflight.Preflight(settings=TunerSettings(), load=busy, adaptations=changes), tuned, records=[]
    )
    assert (tuned.search, tuned.notes) == before
    assert recorded.search == {**tuned.search, "machine_load": {**busy.to_dict(), "adapted": changes}}
    assert recorded.notes[: len(tuned.notes)] == tuned.notes and "the machine was busy" in recorded.notes[-1]


def test_on_a_busy_cpu_the_amp_check_trains_on_the_free_cores_as_the_seeds_do(monkeypatch, tmp_path):
    """On every core of a busy machine the check's steps crawl as a seed's do (2.9 s a step of batch 4 beside two busy
    processes): it trains on the free cores; a quiet machine's check keeps torch's own thread count."""
    from types import SimpleNamespace

    from autotune import space
    from autotune.run import assessment, preflight
    from autotune.trial import TrialSpec
    from autotune.trial.amp_check import AmpCheckResult
    from autotune.trial.amp_curves import AmpCheckSettings
    from tests.conftest import make_cpu

    checked = []
    monkeypatch.setattr(
        assessment, "run_amp_check", lambda spec, folder: checked.append(spec) or AmpCheckResult(status="ok")
    )

    def make_spec(config, path: str) -> TrialSpec:
        return TrialSpec(
            workload="cam++", workload_options={}, data_file="", config=config, timing=TimingSettings(),
            device_type="cpu", result_path=path,
        )  # fmt: skip

    busy = MachineLoad(cores=2, load_average=3.1, others_cpu_fraction=0.45, kernel_spread_fraction=0.2, seconds=1.5)
    request = SimpleNamespace(amp_check=AmpCheckSettings(), settings=TunerSettings(budget_s=300.0))
    plan = SimpleNamespace(
        started_s=time.monotonic(),
        request=request,
        workdir=tmp_path,
        space=space.load(space.space_path("cam++"), make_cpu()),
    )
    for load, threads in ((busy, 1), (dataclasses.replace(busy, others_cpu_fraction=0.01), None)):
        settings, changes = adapt(request.settings, load)
        preflight.check_precisions(
            preflight.Preflight(settings=settings, load=load, adaptations=changes), plan, make_spec
        )
        assert checked[-1].trial.config.intra_op_threads == threads
