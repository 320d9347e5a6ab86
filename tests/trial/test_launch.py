"""Failure classification through real trial subprocesses: each failure costs one trial, with a reason."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.trial import TimingSettings, TrialSpec, launch
from tests.trial.tiny_setups import faulty_spec

TIMING = TimingSettings(warmup_steps=1, window_s=0.5, min_window_steps=2)


def _spec(tmp_path: Path, corpus: Path, batch: int, num_workers: int = 0) -> TrialSpec:
    return faulty_spec(tmp_path, corpus, batch, num_workers=num_workers, timing=TIMING)


@pytest.mark.parametrize(
    ("batch", "workers", "status", "words"),
    [
        (5, 0, "ok", ""),
        (1, 0, "oom", "out of memory"),
        (2, 0, "nonfinite", "non-finite"),
        (4, 0, "signal", "SIGBUS: shared memory (/dev/shm)"),
        (6, 1, "signal", "DataLoader worker was killed: SIGBUS"),
    ],
    ids=["ok", "oom", "nan", "sigbus", "worker-sigbus"],
)
def test_failures_are_classified(tmp_path, tiny_corpus, batch, workers, status, words):
    result = launch(_spec(tmp_path, tiny_corpus, batch, workers), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == status, result.log_tail
    assert words in result.reason
    assert "\n" not in result.reason
    if status == "ok":
        assert result.samples_per_second > 0 and result.window_steps >= 2 and result.all_losses_finite
        assert 0.0 <= result.data_wait_fraction <= 1.0 and result.peak_memory_bytes > 0
    else:
        assert result.log_tail  # what the child printed, for the user to read


def test_hang_is_killed_with_its_process_group(tmp_path, tiny_corpus):
    # 8 s: the child has forked its DataLoader worker about 3 s in, even at load 4.7 on 2 cores (15 s waited 7 more).
    result = launch(_spec(tmp_path, tiny_corpus, 3, num_workers=1), workdir=tmp_path / "trial", timeout_s=8)
    assert result.status == "timeout" and "8 s" in result.reason
    assert result.wall_s < 30
    # The child ran in its own session: nothing of it (DataLoader worker included) may survive the kill.
    leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_trial_of(int(pid), tmp_path)]
    assert leftovers == []


def _is_trial_of(pid: int, tmp_path: Path) -> bool:
    try:
        return str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_a_hopeless_trial_is_pruned_from_its_progress(tmp_path, tiny_corpus):
    spec = _spec(tmp_path, tiny_corpus, 7)
    seen: list[dict] = []

    def should_prune(progress: dict) -> str | None:
        seen.append(progress)
        return "too slow" if progress["phase"] == "warmup" else None

    result = launch(spec, workdir=tmp_path / "trial", timeout_s=120, should_prune=should_prune)
    assert result.status == "pruned" and result.reason == "too slow"
    assert seen and seen[-1]["samples_per_second"] > 0


def test_a_trial_is_over_when_its_result_is_written_not_when_its_interpreter_exits(tmp_path, tiny_corpus):
    result = launch(_spec(tmp_path, tiny_corpus, 13), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok" and result.wall_s < 45  # not the minute its teardown would take
    assert 0 < result.start_s < result.wall_s  # process start and imports, reported apart from setup
    leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_trial_of(int(pid), tmp_path)]
    assert leftovers == []


def test_a_trial_asked_for_a_longer_window_measures_it(tmp_path, tiny_corpus):
    """A long run's confirmation asks its trials for longer windows (TimingSettings.window_at_least_s,
    search/confirmation.py): the real child measures that long (its steps' times add up to 3 s; the wall clock's window,
    less a trimmed front, within a step's timer of it), where its own rules give 0.5 s, and says how long it
    measured."""
    spec = faulty_spec(tmp_path, tiny_corpus, 5, timing=replace(TIMING, window_at_least_s=3.0))
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok" and result.window_s is not None and result.window_s >= 0.95 * 3.0
