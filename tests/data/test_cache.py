"""One mechanism builds every cached folder (the synthetic corpus and noise, prepared TTS features): a temp sibling
renamed into place, half-built folders never used, a lost race no error, a real failure one typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.data.cache import build_folder_atomically
from autotune.errors import DataError


def _complete(folder: Path) -> bool:
    return (folder / "done").exists()


def _build(folder: Path) -> None:
    (folder / "data").write_text("content")
    (folder / "done").write_text("")  # the completion mark last


def _failure(error: OSError) -> DataError:
    return DataError(f"cannot write the test folder ({error.strerror or error})")


def test_a_folder_is_built_beside_its_place_and_an_incomplete_one_replaced(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "built"
    final.mkdir(parents=True)
    (final / "partial").write_text("left by something else")
    build_folder_atomically(final, build=_build, is_complete=_complete, failure=_failure)
    assert sorted(path.name for path in final.iterdir()) == ["data", "done"]
    assert [path.name for path in final.parent.iterdir()] == ["built"]  # no temp folder left


def test_losing_a_race_is_no_error_and_a_real_failure_is_the_callers_error(tmp_path: Path) -> None:
    final = tmp_path / "built"

    def finished_by_another_process(folder: Path) -> None:
        final.mkdir()
        _build(final)
        raise OSError(39, "Directory not empty")  # as os.rename onto the other process's folder fails

    build_folder_atomically(final, build=finished_by_another_process, is_complete=_complete, failure=_failure)
    assert _complete(final)

    def disk_full(folder: Path) -> None:
        raise OSError(28, "No space left on device")

    elsewhere = tmp_path / "other"
    with pytest.raises(DataError, match=r"cannot write the test folder \(No space left on device\)"):
        build_folder_atomically(elsewhere, build=disk_full, is_complete=_complete, failure=_failure)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["built"]  # no temp folder, nothing half-built
