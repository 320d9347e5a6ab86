"""The doctor's report for people (a table, worst verdicts stand out) and for scripts (JSON)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from autotune.doctor.findings import DoctorReport, Verdict

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["render_json", "render_table", "summary_line"]

STYLES = {Verdict.OK: "green", Verdict.INFO: "cyan", Verdict.WARN: "yellow", Verdict.FAIL: "bold red"}


def render_table(report: DoctorReport) -> Table:
    from rich.table import Table

    table = Table(title="autotune doctor", show_lines=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("found")
    table.add_column("fix")
    for finding in report.findings:
        style = STYLES[finding.verdict]
        table.add_row(finding.name, f"[{style}]{finding.verdict.value}[/{style}]", finding.value, finding.fix)
    return table


def summary_line(report: DoctorReport) -> str:
    counts = report.counts()
    parts = ", ".join(f"{counts[verdict.value]} {verdict.value}" for verdict in reversed(Verdict))
    outcome = "a check failed" if report.exit_code else "nothing fails"
    return f"{parts}: {outcome} (exit {report.exit_code})"


def render_json(report: DoctorReport) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str)
