"""Readers for ASR data lists: WeNet's raw ``data.list`` and a Kaldi ``text`` file.

WeNet ``data.list`` (``tools/make_raw_list.py``, ``data_type: raw``): one JSON object per line with ``key``, ``wav``
and ``txt``, and, for segments, ``start`` and ``end`` in SECONDS (``wenet/dataset/processor.py`` decode_wav reads
``int(start * sample_rate)`` samples in). autotune also reads an optional ``spk`` (the speaker; WeNet ignores unknown
keys); without it the speaker is the key, as Kaldi does for unknown speakers. WeNet shard lists (one tar path per
line) are refused with a message. Kaldi ``text``: ``<utterance> <transcript>`` lines; a key alone is an empty
transcript (WeNet's token_min_length filter drops it later).

These functions parse text already read; `autotune.data.sources` reads the files and validates the audio.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import DataError

__all__ = ["DATA_LIST_SUFFIXES", "DataListEntry", "is_data_list", "parse_data_list", "parse_transcripts"]

DATA_LIST_SUFFIXES = (".list", ".jsonl")


@dataclass(frozen=True, kw_only=True, slots=True)
class DataListEntry:
    """One line of a data.list; `where` names the file and line for error messages."""

    key: str
    wav: str
    txt: str
    speaker: str
    where: str
    start_s: float | None = None
    end_s: float | None = None


def is_data_list(path: Path) -> bool:
    """Whether a file name says WeNet data list (``data.list``, ``train.list``, ``*.jsonl``)."""
    return path.suffix.lower() in DATA_LIST_SUFFIXES


def _error(message: str) -> DataError:
    return DataError(" ".join(message.splitlines()))


def _string(obj: dict[str, Any], name: str, where: str, *, allow_empty: bool = False) -> str:
    if name not in obj:
        raise _error(f'{where}: missing "{name}"; each line needs "key", "wav" and "txt"')
    value = obj[name]
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise _error(f'{where}: "{name}" must be a non-empty string, found {value!r}')
    return value


def _bounds(obj: dict[str, Any], where: str) -> tuple[float | None, float | None]:
    """Optional start/end in seconds; both or neither."""
    if "start" not in obj and "end" not in obj:
        return None, None
    if "start" not in obj or "end" not in obj:
        raise _error(f'{where}: "start" and "end" (seconds) must come together; add the missing one')
    values = []
    for name in ("start", "end"):
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _error(f'{where}: "{name}" {value!r} is not a number; write it in seconds')
        values.append(float(value))
    start_s, end_s = values
    if not 0.0 <= start_s < end_s:
        raise _error(f"{where}: start {start_s:g} s must be >= 0 and below end {end_s:g} s; fix the line")
    return start_s, end_s


def _parse_line(line: str, where: str) -> DataListEntry:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; json's bare ValueError (an integer past 4300
        # digits); a line nested past Python's stack
        said = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
        raise _error(
            f"{where}: not a JSON object ({said}); a WeNet raw data.list has one "
            '{"key", "wav", "txt"} object per line (shard lists of tar files are not supported)'
        ) from None
    if not isinstance(obj, dict):
        raise _error(f'{where}: expected a JSON object with "key", "wav" and "txt", found {type(obj).__name__}')
    key = _string(obj, "key", where)
    if any(ch.isspace() for ch in key):
        raise _error(f"{where}: key {key!r} contains whitespace; keys must be single tokens")
    speaker = _string(obj, "spk", where) if "spk" in obj else key
    start_s, end_s = _bounds(obj, where)
    return DataListEntry(
        key=key,
        wav=_string(obj, "wav", where),
        txt=_string(obj, "txt", where, allow_empty=True),
        speaker=speaker,
        where=where,
        start_s=start_s,
        end_s=end_s,
    )


def parse_data_list(text: str, path: Path) -> list[DataListEntry]:
    """Entries of a WeNet raw data.list, in file order.

    Raises:
        DataError: a malformed line or a repeated key; the message names the line.
    """
    entries: list[DataListEntry] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        entry = _parse_line(line, f"data list {path} line {number}")
        if entry.key in first_line:
            raise _error(
                f"data list {path} line {number}: key {entry.key!r} is already used on line "
                f"{first_line[entry.key]}; make keys unique"
            )
        first_line[entry.key] = number
        entries.append(entry)
    return entries


def parse_transcripts(text: str, path: Path) -> dict[str, str]:
    """A Kaldi ``text`` file as {utterance: transcript}; a key alone maps to ""."""
    transcripts: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.strip().split(maxsplit=1)
        if not parts:
            continue
        key = parts[0]
        if key in first_line:
            raise _error(f"{path} line {number}: key {key!r} already on line {first_line[key]}; keys must be unique")
        first_line[key] = number
        transcripts[key] = parts[1].strip() if len(parts) > 1 else ""
    return transcripts
