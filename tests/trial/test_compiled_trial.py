"""Compiled trials for real (inductor on this CPU, gcc/g++): compiling steps kept out of the steady window and
counted as compile time, a new shape counted as a recompile, the objective charging the compile over the run, and
the same through a real trial subprocess. A tiny model: compiling CAM++ on 2 cores takes minutes
(benchmarks/README.md), a linear model seconds."""

from __future__ import annotations

import dataclasses
import itertools
import statistics

import pytest
import torch

from autotune.knobs import compile_modes
from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import PrecisionSettings
from autotune.trial import TimingSettings, launch
from autotune.trial.loop import measure
from autotune.trial.memory import PeakMemory
from autotune.trial.run_length import RunLength
from tests.fixtures.inductor import NEEDS_INDUCTOR
from tests.trial.tiny_setups import faulty_spec, linear_setup

pytestmark = [pytest.mark.slow, NEEDS_INDUCTOR]
TIMING = TimingSettings(warmup_steps=2, window_s=0.5, min_window_steps=4, trim_transient=False)


def _batches(sizes: list[int], features: int = 4):
    """Batches of these sizes, then the last size forever (a new size is a new shape: a recompile)."""
    for size in itertools.chain(sizes, itertools.repeat(sizes[-1])):
        yield torch.randn(size, features), torch.randint(0, 2, (size,))


def _measure(config: TrialConfig, sizes: list[int]):
    setup = linear_setup()
    compile_modes.apply(setup.model, config.compile)
    return measure(
        setup,
        _batches(sizes),
        config=config,
        timing=TIMING,
        precision=PrecisionSettings(device_type="cpu", precision="fp32"),
        device=torch.device("cpu"),
        memory=PeakMemory(torch.device("cpu")),
    )


def test_a_compiled_window_is_steady_and_its_compiling_steps_are_charged_once() -> None:
    torch._dynamo.reset()
    config = TrialConfig(per_device_batch_size=8, compile="default")
    # 8 for warm-up and the window's first steps, then 6 (a new shape) well inside the window: a recompile there.
    window = _measure(config, [8] * 40 + [6])
    cost = window.compile
    assert cost.steps >= 2 and cost.recompiles >= 1, cost  # the first compile, and the new shape's
    assert cost.graphs >= 2
    # Compiling steps take longer than steady ones (seconds against milliseconds; a warm inductor cache shortens the
    # recompile to a few tenths).
    assert min(cost.step_times_s) > statistics.median(window.step_times_s)
    summary = window.summary(100, config, RunLength())
    # Charged, however warm the cache (a warm inductor cache made it 0.13 s in a full suite run on this machine).
    assert summary["recompiles"] == cost.recompiles and summary["compile_s"] > 0
    assert summary["samples_per_second"] < 0.5 * summary["window_samples_per_second"]  # one short epoch: not repaid
    long_run = window.summary(100, config, RunLength(epochs=None, hours=1000))
    assert long_run["samples_per_second"] == pytest.approx(summary["window_samples_per_second"], rel=0.01)
    # The window's own rate is the steady one: its seconds exclude the compiling steps it ran.
    assert window.window_s == pytest.approx(sum(window.step_times_s), rel=0.2)


def test_dynamic_compiles_once_for_every_length() -> None:
    """dynamic=True: symbolic shapes from the first compile, so a new batch size costs no recompile."""
    torch._dynamo.reset()
    window = _measure(TrialConfig(per_device_batch_size=8, compile="dynamic"), [8] * 40 + [6])
    assert window.compile.recompiles == 0 and window.compile.steps >= 1


def test_an_eager_trial_reads_no_compile_figures() -> None:
    config = TrialConfig(per_device_batch_size=8)
    window = _measure(config, [8] * 20 + [6])
    assert window.compile.steps == 0
    assert "compile_s" not in window.summary(100, config, RunLength())


def test_a_compiled_trial_subprocess_reports_its_compile(tmp_path, tiny_corpus) -> None:
    spec = faulty_spec(tmp_path, tiny_corpus, 5, timing=TimingSettings(warmup_steps=1, window_s=0.5))
    spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, compile="default"))
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=240)
    assert result.status == "ok", result.log_tail
    assert result.compile_s is not None and result.compile_s > 0  # charged, however warm the cache
    assert result.recompiles is not None and result.compiled_graphs and result.compiled_graphs >= 1
    assert result.samples_per_second < result.window_samples_per_second  # the compile charged over one epoch
