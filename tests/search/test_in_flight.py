"""Search trials in flight at once (autotune/search/in_flight.py) through the Tuner, with a launcher that stands in for
the SLURM executor's wait (no cluster needed; tests/slurm/test_parallel.py runs the same on the test cluster)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import optuna
import pytest

from autotune.search.settings import TunerSettings
from autotune.trial import TrialResult, TrialSpec
from tests.fixtures.tuners import cam_tuner


@dataclass
class Nodes:
    """A launcher with a stop event, as SlurmLauncher has: each trial 'runs' for `run_s` on a node of its own."""

    run_s: float = 0.3
    stop: threading.Event = field(default_factory=threading.Event)
    node: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = 0
    most: int = 0
    threads: set[str] = field(default_factory=set)
    cancelled: int = 0

    def __call__(self, spec: TrialSpec, *, workdir, timeout_s, should_prune=None) -> TrialResult:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.current_thread().name)
        try:
            ends = time.monotonic() + self.run_s
            while time.monotonic() < ends:
                if self.stop.is_set():
                    self.cancelled += 1
                    raise KeyboardInterrupt  # as SlurmLauncher._wait does, after cancelling its job
                time.sleep(0.01)
            rate = 100.0 / spec.config.per_device_batch_size + spec.config.per_device_batch_size
            return TrialResult(status="ok", samples_per_second=rate, wall_s=self.run_s, node=f"node{self.running}")
        finally:
            with self.lock:
                self.running -= 1


def test_trials_in_flight_run_side_by_side_and_each_counts_once(tmp_path, cpu_hardware) -> None:
    nodes = Nodes()
    settings = TunerSettings(trials=7, parallel=3, confirm_top_k=1, confirm_repeats=2, prune=False)
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=nodes)
    outcome = tuner.run()
    roles = [record.role for record in outcome.records]
    assert roles[0] == "baseline" and roles.count("confirm") == 2 and len(roles) == 7 + 2
    numbers = [record.number for record in outcome.records]
    assert len(set(numbers)) == len(numbers)  # none recorded twice
    assert nodes.most == 3 and len(nodes.threads) > 1  # three in flight at once, in threads
    study = tuner.study.get_trials(deepcopy=False)
    assert len(study) == 9 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study)
    assert outcome.winner is not None


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C's own handler, as at a terminal: a suite started in the background (`pytest &`, nohup) inherits SIGINT
    ignored, and interrupt_main() then does nothing (the trials ran to their end, 150 s, and the run ended by
    "trials")."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_every_trial_in_flight_and_keeps_what_was_measured(tmp_path, cpu_hardware, ctrl_c) -> None:
    nodes = Nodes(run_s=30.0)
    settings = TunerSettings(trials=6, parallel=2, confirm_top_k=1, prune=False)
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=nodes)
    baseline_run = nodes.run_s

    def interrupt_when_two_run() -> None:
        while nodes.most < 2:
            time.sleep(0.01)
        import _thread

        _thread.interrupt_main()  # Ctrl-C, in the main thread

    nodes.run_s = 0.05  # the baseline
    original = tuner._run_one

    def run_one(role, params=None):  # the baseline done, the search's trials run long
        record = original(role, params)
        nodes.run_s = baseline_run
        return record

    tuner._run_one = run_one  # type: ignore[method-assign]
    threading.Thread(target=interrupt_when_two_run, daemon=True).start()
    outcome = tuner.run()
    assert outcome.stopped_by == "interrupted" and nodes.cancelled == 2
    assert [record.role for record in outcome.records] == ["baseline"]
    states = [t.state for t in tuner.study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.FAIL]
