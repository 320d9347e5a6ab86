"""Result history: one JSON line per accepted result, read back sorted, corrupt lines skipped, shown as a table."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from pathlib import Path

import pytest
from rich.console import Console

from autotune.knobs.config import TrialConfig
from autotune.result import history
from autotune.result.tuned_config import TunedConfig
from tests.conftest import make_cpu, make_cuda

CONFIG = TrialConfig(per_device_batch_size=64, num_workers=4, prefetch_factor=2, pin_memory=True, precision="bf16")


def make_tuned(created: str, samples_per_second: float, *, cuda: bool = True) -> TunedConfig:
    hardware = make_cuda() if cuda else make_cpu()
    return TunedConfig(
        workload={"name": "cam++", "model": "cam++", "task": "speaker", "options": {}},
        config=CONFIG,
        device_type=hardware.device_type,
        metrics={
            "objective": "samples_per_second",
            "winner": {"status": "ok", "samples_per_second": samples_per_second, "spread_fraction": 0.02},
            "baseline": {"status": "ok", "samples_per_second": 100.0},
            "speedup": round(samples_per_second / 100.0, 3),
        },
        hardware=hardware.to_dict(),
        data={"source": "synthetic"},
        search={},
        created=created,
        autotune_version="0.1.0",
    )


def result_path(root: Path, tuned: TunedConfig) -> Path:
    return root / "results" / "cam++" / f"{tuned.hardware['fingerprint']}.yaml"


def test_record_twice_gives_two_rows_oldest_first(tmp_path: Path) -> None:
    newer, older = make_tuned("2025-03-02T02:30:00+00:00", 180.0), make_tuned("2025-03-01T02:30:00+00:00", 200.0)
    for tuned in (newer, older):  # recorded out of order: load sorts by date
        path = history.record(tuned, result_path(tmp_path, tuned), tmp_path / "results")
    assert path == tmp_path / "results" / "cam++" / "history.jsonl"
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2
    frame = history.load(tmp_path / "results", "cam++")
    assert list(frame.columns) == list(history.COLUMNS)
    assert list(frame["samples_per_second"]) == [200.0, 180.0]
    row = frame.iloc[0]
    assert row["fingerprint"] == older.hardware["fingerprint"]
    assert (row["torch_version"], row["cuda_version"], row["driver_version"]) == ("x", "13.0", "560.35")
    assert row["config"] == "bs=64 w=4 pf=2 pin bf16"
    assert (row["spread_fraction"], row["baseline_samples_per_second"], row["speedup"]) == (0.02, 100.0, 2.0)
    assert row["result_path"] == str(result_path(tmp_path, older))
    assert str(frame["created"].dt.tz) == "UTC"


def test_every_fingerprint_is_kept(tmp_path: Path) -> None:
    for tuned in (make_tuned("2025-03-01T00:00:00+00:00", 50.0, cuda=False), make_tuned("2025-03-02T00:00:00Z", 9.0)):
        history.record(tuned, result_path(tmp_path, tuned), tmp_path / "results")
    frame = history.load(tmp_path / "results", "cam++")
    assert frame["fingerprint"].nunique() == 2
    assert frame["device_type"].tolist() == ["cpu", "cuda"]


def test_corrupt_lines_are_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tuned = make_tuned("2025-03-01T02:30:00+00:00", 200.0)
    path = history.record(tuned, result_path(tmp_path, tuned), tmp_path / "results")
    with path.open("ab") as file:
        file.write(b'{"created": "2025-03-0\n[1, 2]\n\xff\xfe\n')
    with path.open("ab") as file:
        file.write(b'{"created": "2025-03-03T02:30:00+00:00", "samp')  # torn by a crash, no newline
    history.record(make_tuned("2025-03-04T02:30:00+00:00", 190.0), result_path(tmp_path, tuned), tmp_path / "results")
    with caplog.at_level(logging.WARNING, logger="autotune.result.history"):
        frame = history.load(tmp_path / "results", "cam++")
    assert list(frame["samples_per_second"]) == [200.0, 190.0]
    assert len([r for r in caplog.records if "not a history record" in r.getMessage()]) == 4


def test_rows_from_another_version_fill_missing_columns(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "cam++"
    folder.mkdir(parents=True)
    line = json.dumps({"created": "2025-03-01T02:30:00+00:00", "samples_per_second": 5, "new_field": 1})
    (folder / "history.jsonl").write_text(line + "\n", encoding="utf-8")
    frame = history.load(tmp_path / "results", "cam++")
    assert list(frame.columns) == list(history.COLUMNS)
    assert frame["samples_per_second"].tolist() == [5.0] and frame["fingerprint"].isna().all()


def test_no_history_is_an_empty_frame_with_the_columns(tmp_path: Path) -> None:
    frame = history.load(tmp_path / "results", "cam++")
    assert frame.empty and list(frame.columns) == list(history.COLUMNS)
    assert history.render_table(frame).row_count == 0


def test_a_multi_node_result_is_never_compared_with_one_nodes(tmp_path: Path) -> None:
    one = make_tuned("2025-03-01T02:30:00+00:00", 200.0)
    two = dataclasses.replace(make_tuned("2025-03-02T02:30:00+00:00", 150.0), cluster={"nodes": 2})
    for tuned in (one, two):
        history.record(tuned, result_path(tmp_path, tuned), tmp_path / "results")
    frame = history.load(tmp_path / "results", "cam++")
    assert frame["fingerprint"].tolist() == [one.hardware["fingerprint"], f"{one.hardware['fingerprint']}-nodes2"]
    change_cells = history.render_table(frame).columns[-1]._cells
    assert change_cells == ["-", "-"]  # 150 on two nodes is no regression from 200 on one: nothing to compare


def render(table) -> str:
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(table)
    return console.file.getvalue()


def test_table_has_the_rows_and_flags_a_regression(tmp_path: Path) -> None:
    runs = [("2025-03-01T02:30:00+00:00", 200.0), ("2025-03-02T02:30:00+00:00", 150.0)]
    for created, samples_per_second in runs:
        tuned = make_tuned(created, samples_per_second)
        history.record(tuned, result_path(tmp_path, tuned), tmp_path / "results")
    table = history.render_table(history.load(tmp_path / "results", "cam++"))
    assert table.row_count == 2
    assert table.title == "autotune history: cam++"
    text = render(table)
    assert "2025-03-01 02:30" in text and "2025-03-02 02:30" in text
    assert "200.0" in text and "150.0" in text and "bs=64 w=4 pf=2 pin bf16" in text
    assert "-25.0%" in text
    change_cells = table.columns[-1]._cells
    assert change_cells[0] == "-" and change_cells[1].startswith("[red]")


def test_record_keeps_earlier_lines_when_result_is_rewritten(tmp_path: Path) -> None:
    """The YAML of a machine is overwritten by each run; its history lines are not."""
    first = make_tuned("2025-03-01T02:30:00+00:00", 200.0)
    second = dataclasses.replace(first, created="2025-03-02T02:30:00+00:00")
    path = history.record(first, result_path(tmp_path, first), tmp_path / "results")
    before = path.read_bytes()
    history.record(second, result_path(tmp_path, second), tmp_path / "results")
    assert path.read_bytes().startswith(before)
