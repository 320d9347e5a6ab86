"""Readers of the data-list formats autotune accepts, each turning a list into rows (id, path, speaker, segment).

3D-Speaker train.csv (start/stop in seconds), Kaldi folders (wav.scp + utt2spk, optional text), WeNet data.list and
folders of audio files (speaker = parent folder). Lists are parsed here; `sources` probes each file and turns the
rows into Utterances.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from autotune.data.asr_lists import is_data_list, parse_data_list, parse_transcripts
from autotune.errors import DataError
from autotune.yamlio import special_file

__all__ = ["ACCEPTED", "AUDIO_EXTENSIONS", "CSV_HEADER", "Row", "one_line_error", "read_rows", "read_scp"]

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg")
CSV_HEADER = ("ID", "dur", "path", "start", "stop", "spk")
ACCEPTED = (
    "give a 3D-Speaker train.csv, a WeNet data.list, a Kaldi folder with wav.scp and utt2spk (or text), or a folder "
    "of .wav/.flac/.ogg files (one sub-folder per speaker)"
)


def one_line_error(message: str) -> DataError:
    """A DataError whose message is guaranteed to be one line: line breaks become spaces, and any other control
    character (a NUL in a listed path) is shown escaped, as Python writes it."""
    flat = " ".join(message.split("\n")).replace("\r", " ")
    return DataError("".join(char if char.isprintable() else repr(char)[1:-1] for char in flat))


@dataclass(frozen=True, slots=True)
class Row:
    """One parsed, not yet validated entry of a list; `where` locates it for error messages."""

    utt_id: str
    path: str
    speaker: str
    where: str
    start_s: float | None = None
    stop_s: float | None = None
    text: str | None = None


def _resolve(audio_path: str, base: Path) -> str:
    """Absolute path of an audio path given relative to the list's folder."""
    return os.path.normpath(os.path.join(base, os.path.expanduser(audio_path)))


def _read_text(path: Path) -> str:
    kind = special_file(path)
    if kind is not None:  # reading a pipe or a device blocks or never ends
        raise one_line_error(f"data list {path} is not a regular file ({kind}); give a list file or a folder")
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark (Excel, Notepad) is not data
    except UnicodeDecodeError as exc:
        raise one_line_error(f"data list {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise one_line_error(f"data list {path} cannot be read ({exc.strerror}); check its permissions") from exc


def _seconds(text: str, column: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise one_line_error(f"{where}: {column} {text!r} is not a number; write it in seconds") from None
    if not math.isfinite(value):
        raise one_line_error(f"{where}: {column} {text!r} is not a finite number; write it in seconds")
    return value


def _parse_csv_row(fields: list[str], where: str, base: Path) -> Row:
    """One data row of a 3D-Speaker train.csv."""
    if len(fields) != len(CSV_HEADER):
        raise one_line_error(
            f"{where}: expected 6 comma-separated fields ({','.join(CSV_HEADER)}), found {len(fields)}; fix it"
        )
    utt_id, dur, audio, start, stop, spk = (f.strip() for f in fields)
    if not (utt_id and audio and spk):
        raise one_line_error(f"{where}: ID, path and spk must not be empty; fix the row")
    _seconds(dur, "dur", where)
    start_s, stop_s = _seconds(start, "start", where), _seconds(stop, "stop", where)
    if not 0.0 <= start_s < stop_s:
        raise one_line_error(f"{where}: start {start} s must be >= 0 and below stop {stop} s; fix the row")
    return Row(utt_id, _resolve(audio, base), spk, where, start_s, stop_s)


def _read_csv(path: Path) -> list[Row]:
    """Rows of a 3D-Speaker train.csv (header ID,dur,path,start,stop,spk; start/stop in seconds)."""
    reader = csv.reader(io.StringIO(_read_text(path)), skipinitialspace=True)
    rows: list[Row] = []
    first_line: dict[str, int] = {}
    try:
        header = next(reader, None)
        if header is None:
            raise one_line_error(
                f"data list {path} is empty; write the header {','.join(CSV_HEADER)} and one row per chunk"
            )
        if tuple(h.strip() for h in header) != CSV_HEADER:
            raise one_line_error(
                f"data list {path} line 1: header is {','.join(header)!r} but a 3D-Speaker train.csv needs exactly "
                f"{','.join(CSV_HEADER)!r}; fix the header"
            )
        for fields in reader:
            if not any(f.strip() for f in fields):
                continue
            row = _parse_csv_row(fields, f"data list {path} line {reader.line_num}", path.parent)
            if row.utt_id in first_line:
                raise one_line_error(
                    f"{row.where}: ID {row.utt_id!r} is already used on line {first_line[row.utt_id]}; make IDs unique"
                )
            first_line[row.utt_id] = reader.line_num
            rows.append(row)
    except csv.Error as exc:
        raise one_line_error(f"data list {path} line {reader.line_num}: malformed csv ({exc}); fix the row") from exc
    return rows


def _table(path: Path, n_fields: int | None) -> Iterator[tuple[str, str, int]]:
    """(key, rest of line, line number) of a Kaldi table; n_fields=2 also requires the rest to be one token."""
    seen: dict[str, int] = {}
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        parts = line.strip().split(maxsplit=1)
        if not parts:
            continue
        if len(parts) < 2 or (n_fields == 2 and len(parts[1].split()) != 1):
            raise one_line_error(
                f"{path} line {number}: expected '<key> <value>', found {line.strip()!r}; fix the line"
            )
        if parts[0] in seen:
            raise one_line_error(
                f"{path} line {number}: key {parts[0]!r} already on line {seen[parts[0]]}; keys must be unique"
            )
        seen[parts[0]] = number
        yield parts[0], parts[1].strip(), number


def read_scp(path: Path) -> list[tuple[str, str, str]]:
    """(key, absolute audio path, where) of each line of a wav.scp-style list (``<key> <path>``), e.g. the noise and
    room-response lists of 3D-Speaker's recipes; paths relative to the list's folder are resolved against it."""
    return [(key, _resolve(value, path.parent), f"{path} line {number}") for key, value, number in _table(path, 2)]


def _read_kaldi(folder: Path) -> list[Row]:
    """Rows of a Kaldi data folder: wav.scp, utt2spk (optional with text: speaker = utterance) and optional text."""
    scp, utt2spk_path, text_path = folder / "wav.scp", folder / "utt2spk", folder / "text"
    if not utt2spk_path.is_file() and not text_path.is_file():
        raise one_line_error(
            f"Kaldi folder {folder} has wav.scp but no utt2spk; add utt2spk with '<utterance> <speaker>' lines"
        )
    if (folder / "segments").is_file():  # its wav.scp keys are recordings, not utterances: refuse, don't misread
        raise one_line_error(
            f"Kaldi folder {folder} has a segments file, which autotune does not read; cut the segments into "
            "files or list them in a 3D-Speaker train.csv (start/stop in seconds)"
        )
    utt2spk = {key: value for key, value, _ in _table(utt2spk_path, 2)} if utt2spk_path.is_file() else None
    texts = parse_transcripts(_read_text(text_path), text_path) if text_path.is_file() else {}
    rows: list[Row] = []
    for key, value, number in _table(scp, None):
        where = f"{scp} line {number}"
        if value.endswith("|") or value.startswith("|"):
            raise one_line_error(
                f"{where}: piped command {value!r} is not supported; write its output to an audio file (e.g. run "
                "the command once into a .wav) and list that path"
            )
        if utt2spk is not None and key not in utt2spk:
            raise one_line_error(
                f"{where}: utterance {key!r} is missing from {utt2spk_path}; add '{key} <speaker>' there or "
                "remove the line"
            )
        speaker = key if utt2spk is None else utt2spk[key]
        rows.append(Row(key, _resolve(value, folder), speaker, where, text=texts.get(key)))
    return rows


def _read_data_list(path: Path) -> list[Row]:
    """Rows of a WeNet raw data.list (JSON lines key/wav/txt, optional start/end in seconds and spk)."""
    return [
        Row(e.key, _resolve(e.wav, path.parent), e.speaker, e.where, e.start_s, e.end_s, e.txt)
        for e in parse_data_list(_read_text(path), path)
    ]


def _read_folder(folder: Path) -> list[Row]:
    """One row per audio file under folder (recursive, sorted); the speaker is the file's parent folder name."""
    rows: list[Row] = []
    visited: set[str] = set()
    for root, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in visited:  # a symlink cycle
            dirs[:] = []
            continue
        visited.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            stem, ext = os.path.splitext(name)
            if name.startswith(".") or ext.lower() not in AUDIO_EXTENSIONS:
                continue
            rel = os.path.relpath(os.path.join(root, stem), folder).replace(os.sep, "/")
            rows.append(Row(rel, os.path.join(root, name), os.path.basename(root), f"audio folder {folder}"))
    if not rows:
        raise one_line_error(f"folder {folder} contains no .wav, .flac or .ogg files; {ACCEPTED}")
    return rows


def read_rows(path: Path) -> tuple[str, list[Row]]:
    """Pick the reader by what path is; returns (kind, rows)."""
    if path.is_dir():
        if (path / "wav.scp").is_file():
            return "kaldi", _read_kaldi(path)
        if (path / "data.list").is_file():
            return "wenet-data-list", _read_data_list(path / "data.list")
        return "folder", _read_folder(path)
    if path.name == "wav.scp":
        return "kaldi", _read_kaldi(path.parent)
    if path.suffix.lower() == ".csv":
        return "3d-speaker-csv", _read_csv(path)
    if is_data_list(path):
        return "wenet-data-list", _read_data_list(path)
    raise one_line_error(f"data path {path} is not a supported list; {ACCEPTED}")
