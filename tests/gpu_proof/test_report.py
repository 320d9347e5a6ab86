"""The proof's report: markdown with every step's numbers, a JSON twin that reads back, and honest verdicts."""

from __future__ import annotations

import json

from autotune.gpu_proof import NOTHING_PROVEN, ProofReport, StepResult


def _report(*outcomes: bool | None) -> ProofReport:
    steps = [
        StepResult(name=f"s{index}", title=f"proves {index}", passed=passed, numbers={"ratio": 0.98765, "n": 3})
        for index, passed in enumerate(outcomes)
    ]
    return ProofReport(device="NVIDIA H100 80GB HBM3, driver 580", environment={"torch": "2.11"}, steps=steps)


def test_all_steps_passing_is_exit_zero() -> None:
    report = _report(True, True)
    assert (report.passed, report.exit_code) == (True, 0)
    assert report.verdict_line().startswith("GPU proof on NVIDIA H100 80GB HBM3, driver 580: 2 of 2 steps passed")


def test_a_failed_or_unrun_step_is_exit_one_and_named() -> None:
    report = _report(True, False, None)
    assert report.exit_code == 1
    line = report.verdict_line()
    assert "1 of 3 steps passed, 1 failed (s1), 1 not run (time limit)" in line


def test_nothing_proven_never_passes() -> None:
    report = ProofReport(device="NVML could not start", nothing_proven=True)
    assert (report.passed, report.exit_code) == (False, 1)
    assert report.verdict_line() == f"{NOTHING_PROVEN} (NVML could not start)"
    assert not ProofReport(device="x").passed  # no steps: nothing proven either


def test_markdown_names_the_device_and_every_number(tmp_path) -> None:
    report = _report(True, False)
    report.steps[1].error = "killed after 60 s: ..."
    report.write(tmp_path / "gpu_proof-h100.md")
    text = (tmp_path / "gpu_proof-h100.md").read_text()
    assert "- device: NVIDIA H100 80GB HBM3, driver 580" in text
    assert "| s0 | pass | proves 0 |" in text and "| s1 | FAIL | proves 1 |" in text
    assert "- `ratio`: 0.9877" in text and "**error**: killed after 60 s" in text
    again = ProofReport.from_dict(json.loads((tmp_path / "gpu_proof-h100.json").read_text()))
    assert again == report
