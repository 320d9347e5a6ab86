"""Errors a user can cause: one line saying what is wrong and how to fix it, exit code 2 at the CLI edge."""

from __future__ import annotations

__all__ = [
    "UserError",
    "DataError",
    "SpaceError",
    "WorkloadError",
    "OutputError",
    "USER_ERROR_EXIT_CODE",
    "MACHINE_FAILURE_EXIT_CODE",
    "MachineFailure",
    "describe_os_error",
]

USER_ERROR_EXIT_CODE = 2
MACHINE_FAILURE_EXIT_CODE = 4


class UserError(Exception):
    """Bad input from the user; the message is one line that says what is wrong and how to fix it."""

    exit_code = USER_ERROR_EXIT_CODE


class DataError(UserError):
    """A data path, list or audio file that cannot be used."""


class SpaceError(UserError):
    """A search-space YAML that is malformed or invalid."""


class WorkloadError(UserError):
    """An unknown workload name or a plugin that does not follow the workload protocol."""


class OutputError(UserError, OSError):
    """A file or folder autotune must write that the machine refuses: a full disk, a read-only or missing folder.

    An OSError too, so that code around a write that handles the OS's refusal handles this one line as well."""


def describe_os_error(error: OSError) -> str:
    """'No space left on device' rather than '[Errno 28] No space left on device: ...': the path is said elsewhere."""
    return error.strerror or str(error) or type(error).__name__


class MachineFailure(UserError):
    """The machine failed a run under way (a disk that filled, a storage that stopped answering): one line saying
    what, and what was kept; exit code 4, apart from bad input (2), so that a nightly job can tell them apart."""

    exit_code = MACHINE_FAILURE_EXIT_CODE
