"""Markdown tables for the benchmark scripts' printed and written results."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["markdown_table", "publish"]


def markdown_table(rows: Sequence[Mapping[str, object]], header: Sequence[str] | None = None) -> list[str]:
    """One line per row under a header (default: every key, in order of first appearance); '-' where a row lacks one."""
    header = list(header) if header is not None else list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(row.get(key, "-")) for key in header) + " |" for row in rows]


def publish(lines: Sequence[str], out: Path | None, raw: object = None) -> None:
    """Print the result; with out, also write it there (markdown) and the raw figures beside it (.json)."""
    print("\n".join(lines))
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    if raw is not None:
        out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
