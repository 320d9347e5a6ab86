"""What autotune reads from a storage URL before Optuna opens it: the password to hide in anything printed or
written (`redact_url`), the PostgreSQL driver to name (`with_installed_driver`) and how to install a missing one
(`driver_hint`). storage/studies.py opens the storage."""

from __future__ import annotations

import importlib.util
import re

__all__ = ["URL_FORMS", "driver_hint", "redact_url", "with_installed_driver"]

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
