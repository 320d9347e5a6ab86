"""A storage URL opened as Optuna's storage: an SQLAlchemy database URL for its RDBStorage
(`sqlite:///results/studies.db`, `postgresql://user@host/db` for several machines) or `journal:///path/to/study.log`
(its JournalStorage on a file, for several processes on one host).

What is read from the URL before Optuna opens it: the password to hide in anything printed or written
(`redact_url`: credentials never leave this package unredacted), the PostgreSQL driver to name
(`with_installed_driver`) and how to install a missing one (`driver_hint`). Whatever opening or using a storage
raises reaches the user as one line (`storage_errors`); a storage that fails mid-run is described by the database's
or the OS's own words (`describe_failure`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage

from autotune.errors import MachineFailure, UserError
from autotune.storage.heartbeats import GRACE_PERIOD_S, HEARTBEAT_INTERVAL_S, retry_once
from autotune.yamlio import special_file

__all__ = [
    "JOURNAL_PREFIX",
    "SQLITE_PREFIX",
    "URL_FORMS",
    "describe_failure",
    "driver_hint",
    "local_file",
    "open_storage",
    "redact_url",
    "storage_errors",
    "sqlite_url",
    "storage_failures",
    "with_installed_driver",
]

# Databases SQLAlchemy drives (the scheme before any +driver), and the journal.
_KNOWN_SCHEMES = {"sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql", "journal"}
URL_FORMS = "sqlite:///path/to/file.db, postgresql://user@host/db or journal:///path/to/file.log"


def redact_url(url: str) -> str:
    """A storage URL without its password, for anything printed or written: user:password@, or a query parameter
    whose name ends in password (sslpassword too), passwd (MySQL drivers accept it) or pwd (ODBC)."""
    url = re.sub(r"(//[^/:@]*):.*@", r"\1:***@", url)
    return re.sub(r"(?i)([?&;][^=&;]*(?:password|passwd|pwd)=)[^&;]*", r"\1***", url)


# SQLAlchemy's default driver per database, and how to install it (the URL's scheme names the database).
_DRIVER_HINTS = {
    "postgresql": "for PostgreSQL: pip install 'psycopg[binary]'",
    "mysql": "for MySQL: pip install mysqlclient, or pip install pymysql and write mysql+pymysql://",
    "mariadb": "for MariaDB: pip install mariadb, or pip install pymysql and write mariadb+pymysql://",
    "oracle": "for Oracle: pip install oracledb",
    "mssql": "for SQL Server: pip install pyodbc",
}


def with_installed_driver(url: str) -> str:
    """A `postgresql://` URL with the PostgreSQL driver that is installed named in it: psycopg (3, the one the
    hint installs) first, then psycopg2. SQLAlchemy's default for a driverless URL changed in 2.1 from psycopg2 to
    psycopg, and 2.1 needs Python 3.11+: with SQLAlchemy 2.0 (every Python 3.10) a driverless URL fails on a machine
    with only psycopg. Any other URL, or one that names its driver, is left as written."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        return url
    for driver in ("psycopg", "psycopg2"):
        if importlib.util.find_spec(driver) is not None:
            return f"postgresql+{driver}://{rest}"
    return url


def driver_hint(url: str) -> str:
    """How to install the driver a URL needs, for the error when it is missing."""
    scheme = url.split("://", 1)[0].lower()
    database, _, driver = scheme.partition("+")
    database = "postgresql" if database == "postgres" else database
    if driver:
        return f"install the Python package of the {driver!r} driver the URL names"
    return _DRIVER_HINTS.get(database, "install the database driver SQLAlchemy uses for this URL")


JOURNAL_PREFIX = "journal://"
SQLITE_PREFIX = "sqlite:///"


_SQLITE_TIMEOUT_S = 60


_SCHEMA_ATTEMPTS = 4  # concurrent runs on one SQLite file wait for its lock instead of failing


def sqlite_url(path: Path) -> str:
    """The SQLite URL of a database file, its path quoted: a folder named `rd?mode=ro` is a folder, not a query."""
    return SQLITE_PREFIX + urllib.parse.quote(str(path), safe="/")


def local_file(url: str) -> Path | None:
    """The file a SQLite URL (its quoting undone, as SQLAlchemy reads it) or a journal URL names; None for a
    database server's URL."""
    if url.startswith(SQLITE_PREFIX):
        return Path(urllib.parse.unquote(url.removeprefix(SQLITE_PREFIX)))
    if url.startswith(JOURNAL_PREFIX):
        return Path(url.removeprefix(JOURNAL_PREFIX)).expanduser()
    return None


def open_storage(
    url: str, *, heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S, grace_period_s: int = GRACE_PERIOD_S
) -> BaseStorage:
    """An Optuna storage for a URL; the error for a bad one is one line with the password redacted.

    Args:
        url: `journal://PATH` or an SQLAlchemy database URL (sqlite, postgresql, mysql).
        heartbeat_interval_s: seconds between a running trial's heartbeats (RDB storages).
        grace_period_s: a RUNNING trial whose last heartbeat is older than this is failed by the next run.

    Raises:
        UserError: an unknown scheme, a missing driver, an unreachable or unwritable database.
    """
    known = url.split("://", 1)[0].split("+", 1)[0].lower() in _KNOWN_SCHEMES
    fix = "check the file or the server it names" if known else f"use {URL_FORMS}"
    with storage_errors(url, doing="open", fix=fix):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if url.startswith(JOURNAL_PREFIX):
                    return _journal(url)
                if "://" not in url:
                    raise ValueError("no scheme")
                engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
                if url.startswith("sqlite"):
                    engine_kwargs = {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}}
                return _rdb(
                    with_installed_driver(url),
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval_s,
                    grace_period=grace_period_s,
                    heartbeat_stale_trial_callback=retry_once,
                )
        except ImportError:
            raise UserError(
                f"cannot open storage {redact_url(url)}: its database driver is not installed ({driver_hint(url)})"
            ) from None


@contextlib.contextmanager
def storage_errors(url: str, *, doing: str, fix: str) -> Iterator[None]:
    """Whatever opening or using storage `url` raises, as one UserError line that names it with its password hidden
    and says `fix`: SQLAlchemy raises many kinds for a bad URL or an unusable database, all meaning the same to
    the user. A UserError passes through as it is.

    Raises:
        UserError: "cannot {doing} storage URL (what the database or the OS said); {fix}".
    """
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        said = describe_failure(error)
        password = _password(url)
        if password:  # the database's own words may quote the URL it was given
            said = said.replace(password, "***")
        if _machine_failed(error):  # a full or read-only disk is the machine's failure, not the URL's (exit 4)
            raise MachineFailure(f"cannot {doing} storage {redact_url(url)} ({said}); free space and rerun") from None
        raise UserError(f"cannot {doing} storage {redact_url(url)} ({said}); {fix}") from None


def _machine_failed(error: BaseException) -> bool:
    """Whether a storage error is the machine's (a full disk, a read-only one), found under Optuna's and SQLAlchemy's
    wrappers."""
    text = describe_failure(error).lower()
    return any(words in text for words in ("disk is full", "no space left", "disk quota", "read-only file system"))


def _password(url: str) -> str:
    match = re.match(r"[^:]+://[^/:@]*:([^@]*)@", url)
    return match.group(1) if match else ""


def storage_failures() -> tuple[type[BaseException], ...]:
    """What a study's storage raises when the machine fails it mid-run: a full disk or a database that went away
    (Optuna wraps SQLAlchemy's errors in StorageInternalError; the journal writes a file)."""
    failures: tuple[type[BaseException], ...] = (optuna.exceptions.StorageInternalError, OSError)
    try:
        import sqlalchemy.exc
    except ImportError:
        return failures
    return (*failures, sqlalchemy.exc.OperationalError)


def describe_failure(error: BaseException) -> str:
    """One line for a storage failure: the database's or the OS's own words ('database or disk is full', 'No space
    left on device'), found under Optuna's and SQLAlchemy's wrappers."""
    seen: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in seen:
        seen.append(cause)
        cause = getattr(cause, "orig", None) or cause.__cause__ or cause.__context__
    root = seen[-1]
    if isinstance(root, OSError):
        where = f": {root.filename}" if root.filename else ""
        return f"{root.strerror or root}{where}"
    text = " ".join(str(root).split())[:200]
    return f"{type(root).__name__}: {text}" if text else type(root).__name__


def _rdb(url: str, **kwargs: Any) -> BaseStorage:
    """RDBStorage, tried again when another process is creating the same fresh database's tables right now."""
    import sqlalchemy.exc

    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as e:
            racing = not isinstance(e, sqlalchemy.exc.OperationalError) or "already exists" in str(e)
            if not racing or attempt == _SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.5 + attempt)  # the other process's CREATE TABLE / version row wins the race; then load
    raise AssertionError("unreachable")


def _journal(url: str) -> BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    path = Path(url[len(JOURNAL_PREFIX) :]).expanduser()
    if not path.name or not path.parent.is_dir():
        raise UserError(f"journal storage {url}: folder {path.parent} does not exist; create it or use {URL_FORMS}")
    problem = _not_a_journal(path)
    if problem is not None:  # Optuna would append its records to it, then fail reading it back
        raise UserError(f"journal storage {url}: {path} {problem}; give a new file or an Optuna journal")
    return JournalStorage(JournalFileBackend(str(path)))


def _not_a_journal(path: Path) -> str | None:
    """Why an existing file is not an Optuna journal (None for a journal, an empty file or none at all): a
    journal's every line is a JSON record with an op_code, so its first line says."""
    special = special_file(path)
    if special is not None:
        return f"is not a regular file ({special})"
    try:
        with open(path, "rb") as journal:
            first = journal.readline(64 * 1024)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not first.strip():
        return None
    try:
        record = json.loads(first)
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict) or "op_code" not in record:
        return "holds something else than an Optuna journal (its first line is not a journal record)"
    return None
