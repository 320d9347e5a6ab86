"""Item 4: numbers and search spaces are validated once, before any trial; each problem is one line, exit 2, and a
refused run creates nothing (no results folder, no study)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune import space
from autotune.errors import SpaceError
from tests.conftest import make_cpu
from tests.faults.conftest import error_line, invoke

BATCH = "  per_device_batch_size: {type: categorical, choices: [8, 16]}\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--seed", "-1"], "--seed must be between 0 and 4294967295"),
        (["--seed", "4294967296"], "--seed must be between 0 and 4294967295"),
        (["--trial-timeout", "0"], "--trial-timeout must be a positive duration"),
        (["--window", "nan"], "--window must be a positive number of seconds, got nan"),
        (["--window", "inf"], "--window must be a positive number of seconds, got inf"),
        (["--max-throughput-cv", "nan"], "--max-throughput-cv must be 0 (off) or positive"),
        (["--headroom", "nan"], "--headroom must be a fraction in [0, 1)"),
        (["--warm-fraction", "nan"], "--warm-fraction must be in (0, 1]"),
        (["--drift-threshold", "inf"], "--drift-threshold must be in (0, 1)"),
        (["--crop-seconds", "nan"], "--crop-seconds (--option crop_s) must be a finite number"),
        (["--epoch-hours", "nan"], "--epoch-hours must be positive"),
        (["--option", "crop_s=-1"], "--crop-seconds must be positive (--option crop_s too), got -1"),
        (["--option", "crop_s=abc"], "--crop-seconds (--option crop_s) must be a finite number for cam++"),
        (["--option", "memory_efficient=3"], "--option memory_efficient must be true or false"),
        (["--budget", ""], "--budget is empty; write it like 15m or 1h, or none for no budget"),
        (["--budget", "nan"], "cannot read duration 'nan'"),
        (["--space", "/s/sp\udcffce.yaml"], "--space /s/sp\\xffce.yaml is not a valid UTF-8 name"),
        (["--option", "optimizer=sg\udcffd"], "--option optimizer sg\\xffd is not a valid UTF-8 name"),
        (["--trial-timeout", "1s"], "--trial-timeout 1 s cannot hold a trial"),
        (["--trial-timeout", "48h"], "give between 10 s and 24 h"),
        (["--window", "1e308"], "--window 1e+308 s leaves its trial no room to start and warm up"),
        (["--warmup-steps", "1000000000"], "--warmup-steps must be between 1 and 1000"),
        (["--crop-seconds", "1e-9"], "--crop-seconds 1e-09 s cannot be cropped and trained"),
        (["--crop-seconds", "1e9"], "give between 0.1 and 600 s"),
        (["--global-batch", "1000000000000"], "--global-batch 1000000000000 is past any recipe's batch"),
        (["--trials", "10000000"], "--trials must be at most 100,000"),
        (["--devices", "1000000"], "--devices must be at most 65,536"),
        (["--epoch-samples", "10000000000000"], "--epoch-samples must be at most"),
        (["--storage", ""], "--storage is empty; give a value, or leave the option out"),
        (["--option", "optimizer=evil"], "optimizer must be one of sgd, adam"),
        (["--option", "reverb=/dev/null", "--option", "aug_prob=0.5"], "reverb list /dev/null is not a regular file"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_bad_numbers_are_one_line_exit_2_and_create_nothing(tmp_path, args, words):
    results = tmp_path / "results"
    result = invoke(["run", "--model", "cam++", "--results-dir", str(results), *args])
    assert result.exit_code == 2, result.output
    assert words in error_line(result.stderr)
    assert not results.exists()


def _load(tmp_path: Path, text: str, **kwargs) -> space.SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return space.load(path, make_cpu(), **kwargs)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("params: {per_device_batch_size: {type: int, low: -4, high: 8}}\n", "low -4 is below the least"),
        ("params: {num_workers: {type: int, low: -3, high: 2}}\n", "low -3 is below the least num_workers (0)"),
        ("params: {num_workers: {type: float, low: 0, high: 2}}\n", "takes whole numbers; use type int"),
        ("params: {pin_memory: {type: int, low: 0, high: 1}}\n", "takes bool values; search it as a categorical"),
        ("params: {num_workers: {type: int, low: 0, high: .nan}}\n", "must be finite ints"),
        ("params: {num_workers: {type: int, low: 0, high: 4, step: -2}}\n", "'step' must be a positive int"),
        ("params: {num_workers: {type: int, low: 1, high: 4, log: maybe}}\n", "'log' must be true or false"),
        ("params:\n" + BATCH + "fixed: {precision: evil}\n", "fixed precision: unknown precision 'evil'"),
        ("params:\n" + BATCH + "fixed: {num_workers: -3}\n", "fixed num_workers: -3 is below the least"),
        ("params:\n" + BATCH + "fixed: {num_workers: [1, 2]}\n", "is not a single finite number"),
        ("params:\n" + BATCH + "fixed: {precision: bf16}\n" + "cpu: {fixed: {precision: tf32}}\n", "tf32"),
        ("params:\n" + BATCH + "baseline: {per_device_batch_size: abc}\n", "'abc' is not a int"),
        ("params:\n" + BATCH + "baseline: {pin_memory: 1}\n", "baseline pin_memory: 1 is not a bool"),
        ("params:\n" + BATCH + "baseline: {per_device_batch_size: 1000000000000}\n", "above the most"),
        ("params:\n" + BATCH + "fixed: {num_workers: 100000}\n", "fixed num_workers: 100000 is above the most"),
        ("params:\n" + BATCH + "seeds: [{num_workers: [1, wide]}]\n", "seeds num_workers: 'wide' is not a int"),
        (
            "params:\n  num_workers: {type: int, low: 0, high: 2}\n"
            "  prefetch_factor: {type: int, low: 1, high: 4, when: {num_workers: {at_least: one}}}\n",
            "at_least needs a finite number, got 'one'",
        ),
        (
            "params:\n  precision: {type: categorical, choices: [fp32, bf16]}\n"
            "  num_workers: {type: int, low: 0, high: 2, when: {precision: {at_most: 3}}}\n",
            "uses at_least/at_most, but 'precision' is not a number",
        ),
        (
            "params:\n  num_workers: {type: int, low: 0, high: 2}\n"
            "  prefetch_factor: {type: int, low: 1, high: 4, when: {num_workers: {one_of: 2}}}\n",
            "one_of needs a non-empty list",
        ),
        ("description: [a, b]\nparams:\n" + BATCH, "'description' must be text"),
        (
            "description: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
            "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
            "params:\n" + BATCH,
            "expands to more than 200,000 values through YAML aliases",
        ),
    ],
    ids=lambda value: value if len(value) < 40 else None,
)
def test_bad_spaces_are_one_line_errors(tmp_path, text, words):
    with pytest.raises(SpaceError) as caught:
        _load(tmp_path, text)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_wrongly_typed_baseline_of_a_workload_knob_is_one_line(tmp_path):
    text = "params: {max_frames_in_batch: {type: int, low: 1000, high: 8000}}\nbaseline: {max_frames_in_batch: lots}\n"
    with pytest.raises(SpaceError, match="'lots' in the baseline or a seed is not a number"):
        _load(tmp_path, text, workload_knobs=("max_frames_in_batch",))


def test_huge_integer_ranges_are_counted_not_listed(tmp_path):
    huge = "params: {per_device_batch_size: {type: int, low: 1, high: 1000000000000}}\n"
    started = time.perf_counter()
    loaded = _load(tmp_path, huge)
    assert loaded.size() == 10**12
    with pytest.raises(SpaceError, match="1,000,000,000,000 values, too many for a grid search"):
        loaded.grid()
    fitted = _load(tmp_path, huge, global_batch_size=64, world_size=2)  # only divisors of 64 / 2 can qualify
    assert fitted.params[0].distribution.choices == (1, 2, 4, 8, 16, 32)
    assert time.perf_counter() - started < 5  # a MemoryError or minutes of listing otherwise


def test_a_bad_space_stops_the_run_before_anything_is_made(tmp_path, tiny_corpus):
    path, results = tmp_path / "space.yaml", tmp_path / "results"
    path.write_text("params:\n" + BATCH + "fixed: {precision: evil}\n")
    result = invoke(
        ["run", "--model", "cam++", "--data", str(tiny_corpus), "--space", str(path), "--results-dir", str(results)]
    )
    assert result.exit_code == 2 and "unknown precision 'evil'" in error_line(result.stderr)
    assert not results.exists()


def test_a_space_without_a_batch_is_refused_before_anything_is_created(tmp_path):
    """Every configuration needs a per-device batch: a space that neither searches nor fixes one once created the
    study and the results folder, then failed with a TypeError."""
    path = tmp_path / "space.yaml"
    path.write_text("workload: cam++\nparams: {num_workers: {type: int, low: 0, high: 2}}\n")
    results = tmp_path / "results"
    result = invoke(["run", "--model", "cam++", "--space", str(path), "--results-dir", str(results)])
    assert result.exit_code == 2, result.output
    assert "neither searches nor fixes per_device_batch_size" in error_line(result.stderr)
    assert not results.exists()
