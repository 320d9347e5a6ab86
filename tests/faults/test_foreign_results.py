"""A result file you did not write cannot crash a command: every read (load_config, export, report, doctor --result)
checks the file's sections and knob values against their declared types once, and refuses the first field that does
not fit in one line, exit code 2; a hand-edited history shows the bad cell as unknown instead of a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from autotune import yamlio
from autotune.errors import UserError
from autotune.result.tuned_config import load_config
from tests.faults.conftest import error_line, invoke
from tests.result.test_results import make_tuned


def _edited(path: Path, edit: dict[tuple[str, ...], Any]) -> Path:
    data = copy.deepcopy(make_tuned().to_dict())
    for keys, value in edit.items():
        holder = data
        for key in keys[:-1]:
            holder = holder[key]
        holder[keys[-1]] = value
    path.write_text(yamlio.dump_yaml(data))
    return path


CASES = {
    "workload-a-string": ({("workload",): "cam++"}, "workload is a str, not a mapping"),
    "model-a-list": ({("workload", "model"): ["cam++"]}, "workload.model ['cam++'] is not text"),
    "fingerprint-a-mapping": ({("hardware", "fingerprint"): {"a": 1}}, "hardware.fingerprint {'a': 1} is not text"),
    "speedup-fast": ({("metrics", "speedup"): "fast"}, "metrics.speedup 'fast' is not a number or empty (null)"),
    "batch-abc": ({("batch", "per_device_batch_size"): "abc"}, "batch.per_device_batch_size 'abc' is not an int"),
    "workers-past-max": ({("dataloader", "num_workers"): 10**9}, "dataloader.num_workers 1000000000 is above the most"),
    "pin-a-word": ({("dataloader", "pin_memory"): "yes"}, "dataloader.pin_memory 'yes' is not a bool"),
}


@pytest.mark.parametrize(("edit", "words"), CASES.values(), ids=CASES.keys())
def test_load_config_names_the_field_that_does_not_fit(tmp_path, edit, words):
    path = _edited(tmp_path / "r.yaml", edit)
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("command", ["export", "report", "doctor"])
@pytest.mark.parametrize(("edit", "words"), list(CASES.values())[:4], ids=list(CASES)[:4])
def test_every_command_that_reads_a_result_refuses_it_in_one_line(tmp_path, command, edit, words):
    path = _edited(tmp_path / "r.yaml", edit)
    args = {
        "export": ["export", str(path), "--to", "wenet"],
        "report": ["report", str(path), "--out", str(tmp_path / "report")],
        "doctor": ["doctor", "--result", str(path)],
    }[command]
    result = invoke(args)
    assert result.exit_code == 2, result.output
    assert words in error_line(result.stderr)
    assert not (tmp_path / "report").exists()


def test_a_hand_edited_history_shows_bad_cells_as_unknown(tmp_path):
    folder = tmp_path / "results" / "cam++"
    folder.mkdir(parents=True)
    good = {"created": "2026-11-01T00:00:00+00:00", "model": "cam++", "fingerprint": "cpu-x2", "speedup": 1.5}
    bad = {**good, "model": ["cam++"], "fingerprint": {"a": 1}, "speedup": "fast", "samples_per_second": [1]}
    (folder / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in (good, bad)))
    result = invoke(["history", "--model", "cam++", "--results-dir", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "1.50x" in result.stdout
