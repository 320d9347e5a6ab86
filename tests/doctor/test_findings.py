"""The doctor's report: findings round-trip, counts, and the exit code a script reads."""

from __future__ import annotations

import pytest

from autotune.doctor import EXIT_FAILED, EXIT_OK, DoctorReport, Finding, Verdict
from autotune.doctor.render import render_json, summary_line


def _report(*verdicts: Verdict) -> DoctorReport:
    return DoctorReport(
        findings=tuple(
            Finding(name=f"check{index}", value="v", verdict=verdict, fix="f", data={"bytes": index})
            for index, verdict in enumerate(verdicts)
        )
    )


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ((Verdict.OK, Verdict.INFO), EXIT_OK),
        ((Verdict.OK, Verdict.WARN, Verdict.WARN), EXIT_OK),
        ((Verdict.WARN, Verdict.FAIL), EXIT_FAILED),
        ((), EXIT_OK),
    ],
    ids=["ok-info", "warnings-do-not-fail", "a-failure", "nothing"],
)
def test_exit_code_is_one_only_when_a_check_fails(verdicts, code) -> None:
    report = _report(*verdicts)
    assert report.exit_code == code
    assert f"(exit {code})" in summary_line(report)


def test_report_round_trips_through_json() -> None:
    import json

    report = _report(Verdict.OK, Verdict.INFO, Verdict.WARN, Verdict.FAIL)
    data = json.loads(render_json(report))
    assert DoctorReport.from_dict(data) == report
    assert data["counts"] == {"ok": 1, "info": 1, "warn": 1, "fail": 1}
    assert data["exit_code"] == EXIT_FAILED
