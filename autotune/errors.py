"""Errors a user can cause: one line saying what is wrong and how to fix it, exit code 2 at the CLI edge."""

from __future__ import annotations

__all__ = ["UserError", "DataError", "SpaceError", "WorkloadError", "USER_ERROR_EXIT_CODE"]

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad input from the user; the message is one line that says what is wrong and how to fix it."""

    exit_code = USER_ERROR_EXIT_CODE


class DataError(UserError):
    """A data path, list or audio file that cannot be used."""


class SpaceError(UserError):
    """A search-space YAML that is malformed or invalid."""


class WorkloadError(UserError):
    """An unknown workload name or a plugin that does not follow the workload protocol."""
