"""What the fault matrix needs from the machine: a small real disk (tmpfs) to fill, PID namespaces (unshare), and a
look at processes and folders afterwards. Where the machine cannot give one, the test that needs it is skipped with
the reason, and its fault-injecting twin in the same file covers the same code path."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from tests.fixtures.runs import ROOT, command_lines

NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]


@functools.cache
def namespace_unavailable() -> str:
    """'' where `unshare --pid --fork --mount-proc` works here (root, or user namespaces); else why not."""
    if shutil.which("unshare") is None:
        return "the unshare command is not installed (util-linux)"
    probe = subprocess.run([*NAMESPACE, "true"], capture_output=True, text=True, timeout=30, check=False)
    return "" if probe.returncode == 0 else f"unshare --pid --fork --mount-proc failed: {probe.stderr.strip()[:200]}"


def require_namespaces() -> None:
    reason = namespace_unavailable()
    if reason:
        pytest.skip(f"no PID namespaces here ({reason}); the injected-owner twin covers the same code path")


def mount_small_disk(folder: Path, size_kib: int) -> str:
    """Mount a tmpfs of size_kib on folder; '' on success, else why it could not be."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "mounting a tmpfs needs root and the mount command"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0777", "autotune-faults", str(folder)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "" if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()[:200]}"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Makes real small disks (tmpfs) under tmp_path, unmounted afterwards; skips the test with the reason where
    this machine cannot mount one."""
    mounted: list[Path] = []

    def make(size_kib: int) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        reason = mount_small_disk(folder, size_kib)
        if reason:
            pytest.skip(f"no small disk here ({reason}); the fault-injecting twin covers the same code path")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30, check=False)


def fill(folder: Path) -> Path:
    """Write a file in folder until the disk is full (ENOSPC); returns it (delete it to free the space)."""
    filler = folder / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(descriptor, b"\0" * 4096)
    except OSError as error:
        assert error.errno == 28, error  # ENOSPC: the disk is full
    finally:
        os.close(descriptor)
    return filler


def invoke(args: list[str]):
    """`autotune ARGS` in this process (typer's CliRunner); stdout and stderr apart."""
    return CliRunner().invoke(app, args, catch_exceptions=False)


def error_line(output: str) -> str:
    """The one 'error:' line of a command's stderr; no traceback anywhere."""
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    assert "Traceback" not in output, output
    return lines[0]


def python_env() -> dict[str, str]:
    """This environment with the repository first on the import path (for `python -m` children)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def start_python(args: list[str], log: Path, *, prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
    """`[PREFIX] python ARGS` in a session of its own (so that the test can kill it and all it started)."""
    with open(log, "wb") as output:
        return subprocess.Popen(
            [*(prefix or []), sys.executable, *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=python_env(),
            cwd=ROOT,
            start_new_session=True,
        )


def kill_session(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_with(argument: str) -> list[int]:
    """Live pids (not this one) whose command line has an argument containing `argument` (a spec path, a folder)."""
    return [
        pid
        for pid, argv in command_lines()
        if pid != os.getpid() and any(argument.encode() in arg for arg in argv) and alive(pid)
    ]
