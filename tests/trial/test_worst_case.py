"""Worst case first: the most expensive batches train before warm-up; an OOM there is the trial's OOM."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from torch import nn

from autotune import workloads
from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import PrecisionSettings
from autotune.trial import launch
from autotune.trial.child import classify_exception
from autotune.trial.distributed import Forward
from autotune.trial.worst_case import MAX_SCALE_SEARCH_STEPS, WorstCaseOutOfMemoryError, scan_worst_case
from autotune.workloads.base import TrainingSetup, WorkloadContext
from tests.trial.tiny_setups import faulty_spec, linear_setup

CPU = torch.device("cpu")
FP32 = PrecisionSettings(precision="fp32", device_type="cpu")


def _setup(worst_samples: int | None, fits: int = 32) -> TrainingSetup:
    def loss_fn(module: nn.Module, batch):
        if batch[0].shape[0] > fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return nn.functional.cross_entropy(module(batch[0]), batch[1])

    def worst(config: TrialConfig) -> list:
        return [(torch.randn(worst_samples, 8), torch.zeros(worst_samples, dtype=torch.int64))]

    setup = linear_setup(features=8, loss_fn=loss_fn, worst_case_batches=worst if worst_samples else None)
    setup.optimizer = torch.optim.SGD(setup.model.parameters(), lr=0.1, momentum=0.9)
    return setup


def _scan(setup: TrainingSetup):
    forward = Forward(setup.model, setup.loss_fn, CPU)
    return scan_worst_case(setup, TrialConfig(per_device_batch_size=4), forward=forward, precision=FP32, device=CPU)


def test_worst_batches_train_with_the_optimizer_state_allocated():
    setup = _setup(worst_samples=24)
    before = setup.model.weight.detach().clone()
    scan = _scan(setup)
    # A fresh optimiser: its momentum is allocated by the first step, so the worst batch runs once more.
    assert scan.batches == 1 and scan.steps == 2 and scan.largest_batch_samples == 24
    assert scan.peak_memory_bytes > 0 and scan.seconds > 0
    assert not torch.equal(setup.model.weight, before) and setup.optimizer.state
    assert scan.summary()["worst_case_batches"] == 1 and scan.summary()["worst_case_s"] == scan.seconds


@pytest.mark.parametrize("searches", [False, True])
def test_the_scan_reads_its_peak_at_each_step_s_end_and_again_once_cudnn_searched(monkeypatch, searches):
    """On CUDA the scan's peak is read at each step's end, as the window's (trial/memory.py). Each worst batch is a
    shape cuDNN has not searched yet, and a search mid-step empties the cache after the step's peak: with
    cudnn.benchmark the worst batches run again, searches done, and those readings are the need."""
    ends: list[int] = []
    monkeypatch.setattr("autotune.trial.memory.PeakMemory.step_done", lambda self: ends.append(1))
    monkeypatch.setattr("autotune.trial.worst_case.cudnn_searches", lambda device: searches)
    scan = _scan(_setup(worst_samples=24))
    assert scan.second_pass is searches
    # the worst batch, again holding the optimiser's state, then (searches) the pass again
    assert len(ends) == scan.steps == (3 if searches else 2)


class SkipsFirstSteps:
    """GradScaler as the scan meets it under fp16: the first `skips` steps overflow, so optimizer.step() is not called
    and the scale halves; later steps are taken."""

    def __init__(self, skips: int) -> None:
        self.skips, self.steps, self._scale = skips, 0, 2.0**16

    def scale(self, loss):
        return loss

    def unscale_(self, optimizer) -> None:
        return None

    def step(self, optimizer) -> None:
        self.steps += 1
        if self.steps > self.skips:
            optimizer.step()

    def update(self) -> None:
        if self.steps <= self.skips:
            self._scale /= 2

    def get_scale(self) -> float:
        return self._scale


def _scan_with_skips(monkeypatch, setup: TrainingSetup, skips: int) -> tuple[object, list[bool]]:
    """Scan under a scaler that skips the first `skips` steps; also whether each step began with optimiser state."""
    monkeypatch.setattr(PrecisionSettings, "grad_scaler", lambda self: SkipsFirstSteps(skips))
    state_held, loss_fn = [], setup.loss_fn

    def recording_loss(module: nn.Module, batch):
        state_held.append(bool(setup.optimizer.state))
        return loss_fn(module, batch)

    setup.loss_fn = recording_loss
    return _scan(setup), state_held


@pytest.mark.parametrize("skips", [0, 1, 5, MAX_SCALE_SEARCH_STEPS])
def test_under_loss_scaling_the_worst_batch_repeats_until_a_step_holds_the_optimizer_state(monkeypatch, skips):
    setup = _setup(worst_samples=24)
    before = setup.model.weight.detach().clone()
    scan, state_held = _scan_with_skips(monkeypatch, setup, skips)
    # The worst batch, its repeats while GradScaler skips, the first taken step, then one step holding its state.
    assert scan.steps == skips + 2 and scan.optimizer_state_held
    assert state_held == [False] * (skips + 1) + [True]
    assert setup.optimizer.state and not torch.equal(setup.model.weight, before)


def test_a_scaler_that_never_steps_in_the_scan_is_left_to_the_window_gate(monkeypatch, caplog):
    setup = _setup(worst_samples=24)
    before = setup.model.weight.detach().clone()
    with caplog.at_level("WARNING", logger="autotune.trial.worst_case"):
        scan, state_held = _scan_with_skips(monkeypatch, setup, 1000)
    # Bounded: the worst batch, the plain repeat, then MAX_SCALE_SEARCH_STEPS more; no error, the weights untouched.
    assert scan.steps == 2 + MAX_SCALE_SEARCH_STEPS and not scan.optimizer_state_held and not any(state_held)
    assert not setup.optimizer.state and torch.equal(setup.model.weight, before)
    assert "GradScaler skipped all 22 steps" in caplog.text
    assert scan.summary()["worst_case_optimizer_state_held"] is False  # a result field, not only a log line


def test_an_optimizer_without_state_repeats_only_until_a_step_is_taken(monkeypatch):
    setup = _setup(worst_samples=24)
    setup.optimizer = torch.optim.SGD(setup.model.parameters(), lr=0.1)  # no momentum: never any state
    scan, _ = _scan_with_skips(monkeypatch, setup, 3)
    assert scan.steps == 3 + 2 and scan.optimizer_state_held and not setup.optimizer.state


def test_an_optimizer_with_state_already_does_not_repeat(monkeypatch):
    setup = _setup(worst_samples=24)
    setup.model(torch.randn(2, 8)).sum().backward()
    setup.optimizer.step()
    scan, _ = _scan_with_skips(monkeypatch, setup, 3)
    assert scan.steps == 1 and scan.optimizer_state_held
    assert scan.summary()["worst_case_optimizer_state_held"] is True


def test_no_worst_case_is_a_no_op():
    scan = _scan(_setup(worst_samples=None))
    assert scan.steps == 0 and scan.summary() == {
        "worst_case_batches": 0,
        "worst_case_s": None,
        "worst_case_peak_memory_bytes": None,
        "worst_case_optimizer_state_held": None,
    }


def test_an_oom_on_the_worst_batch_says_so():
    with pytest.raises(WorstCaseOutOfMemoryError) as info:
        _scan(_setup(worst_samples=40))
    status, reason = classify_exception(info.value)
    assert status == "oom"
    assert reason.startswith("out of memory: in the worst-case scan (1 most expensive batch(es), up to 40 samples)")
    assert "Tried to allocate 2.00 GiB" in reason and "\n" not in reason


def test_asr_worst_batches_are_the_longest_utterances_packed_to_the_limit(tiny_corpus):
    conformer = workloads.get("conformer")
    small = {"output_size": 32, "attention_heads": 2, "linear_units": 32, "num_blocks": 1, "decoder_blocks": 1}
    context = WorkloadContext(
        data=conformer.load_data(str(tiny_corpus)),
        config=TrialConfig(per_device_batch_size=3),
        options={**conformer.options, "model": small},
        device=CPU,
    )
    setup = conformer.build(context)
    frames = setup.dataset.max_frames  # type: ignore[attr-defined]
    longest = sorted(frames, reverse=True)
    (static,) = setup.worst_case_batches(TrialConfig(per_device_batch_size=3))  # type: ignore[misc]
    # the three longest, at the slowest speed (0.9): exactly their most frames
    assert sorted(static["feat_lengths"].tolist(), reverse=True) == longest[:3]
    budget = 2 * longest[0] + 1
    dynamic_config = TrialConfig(
        per_device_batch_size=3, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": budget}
    )
    (dynamic,) = setup.worst_case_batches(dynamic_config)  # type: ignore[misc]
    assert dynamic["feat_lengths"].shape[0] == 2 and int(dynamic["feats"].shape[1]) * 2 <= budget


def test_a_trial_whose_worst_batch_does_not_fit_is_oom(tmp_path: Path, tiny_corpus: Path):
    result = launch(faulty_spec(tmp_path, tiny_corpus, 11), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "oom" and "in the worst-case scan" in result.reason, result.log_tail


def test_the_heap_the_worst_batches_freed_goes_back_before_the_workers_fork():
    """Kept, it is shared copy-on-write with the DataLoader's workers forked after the scan, and each step's reuse of it
    copies pages (the conformer recipe's steps ran 15% slower with two workers, as fast without)."""
    from autotune.trial.worst_case import release_freed_memory

    big = torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1)  # 64 MiB freed below: something to give back
    del big
    assert release_freed_memory(torch.device("cpu")) in (True, False)  # glibc says whether it trimmed
    if platform.libc_ver()[0] == "glibc":  # small blocks stay in the heap when freed (big ones are unmapped at once)
        chunks = [bytearray(4096) for _ in range(50_000)]
        del chunks
        assert release_freed_memory(torch.device("cpu")) is True
    assert release_freed_memory(torch.device("cuda")) is False  # an accelerator's memory is its allocator's


def test_a_trial_gives_the_heap_back_right_after_its_scan(monkeypatch, tmp_path: Path, tiny_corpus: Path):
    from autotune.trial import child, worst_case  # the trial imports the scan where it runs: patched at its source

    order: list[str] = []

    real_scan = worst_case.scan_worst_case
    monkeypatch.setattr(worst_case, "scan_worst_case", lambda *a, **k: order.append("scan") or real_scan(*a, **k))
    monkeypatch.setattr(worst_case, "release_freed_memory", lambda device: order.append("release") or True)
    result = child.run_trial(faulty_spec(tmp_path, tiny_corpus, 5))  # trains fine
    assert result.status == "ok", result.log_tail
    assert order == ["scan", "release"]
