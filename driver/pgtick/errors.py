"""Exceptions of the driver. Each one a user can cause carries a message they can act on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


class PgtickError(Exception):
    """Base class: an error the CLI reports as one line (exit code 1)."""


class UsageError(PgtickError):
    """The command line or an argument is wrong (exit code 2)."""


class JobStopped(BaseException):
    """Raised at a checkpoint to stop job code. A BaseException so that a job's
    ``except Exception`` does not swallow it by accident."""


class Cancelled(JobStopped):
    """Cancellation of this run was requested (jobs.cancel); the run ends CANCELLED."""


class Abandoned(JobStopped):
    """This worker no longer owns the run (it was reaped or fenced); nothing is reported."""


class JobTimeout(Exception):
    """The run exceeded its timeout; it fails with failure_reason 'Timeout'."""


# -- errors of the SQL API ----------------------------------------------------------
# The one place that maps a SQLSTATE raised by a jobs.* function to a driver exception.
# The client, the CLI and the testing helpers all go through ``translate_errors``.

#: The leading field of a SQL API message: "priority must be between ...",
#: "timezone 'Mars/Olympus' is not a known IANA time zone name", "payloads[1] is 2000009 bytes",
#: "payloads length must be ...", "depends_on names runs that do not exist", "payload nests
#: deeper ...", "depends_on cannot be given with ...". (A rule of two fields names one of them
#: as the error's column.)
_FIELD = re.compile(
    r"^([a-z][a-z0-9_]*)(?:\[\d+\])?(?: length)?(?: '[^']*')? (?:must|is|names|nests|cannot)\b"
)


class SqlApiError(UsageError):
    """Bad input refused by a jobs.* function: the SQL message, its SQLSTATE, and the field,
    hint and detail where the server gave them. A ``UsageError``: the CLI exits 2."""

    #: The SQLSTATE of a refusal the driver makes before it sends anything.
    default_sqlstate = "P0001"

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        field: str | None = None,
        hint: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate or self.default_sqlstate
        self.field = field
        self.hint = hint
        self.detail = detail


class InvalidArgument(SqlApiError, ValueError):
    """An argument was refused (SQLSTATE class 22 or 23, e.g. 22023 invalid parameter), by
    the server or by the driver before it sent anything; ``field`` names it when the message
    or the server says which. Also a ``ValueError``, as Python code expects of a bad value."""

    default_sqlstate = "22023"


class NotFound(SqlApiError):
    """What the call names does not exist (SQLSTATE P0002): a run id, a definition name."""

    default_sqlstate = "P0002"


class WrongTransaction(SqlApiError):
    """The call cannot run in the caller's transaction (SQLSTATE 25000): one that reads what
    other sessions commit needs READ COMMITTED, not REPEATABLE READ or SERIALIZABLE."""

    default_sqlstate = "25000"


class SchemaMismatch(PgtickError):
    """The database's jobs schema lacks a function or parameter this driver called
    (SQLSTATE 42883), or a table, column or the schema itself that it reads: the schema is
    older than the driver, or missing; run ``pgtick migrate``."""


#: undefined table, undefined column, invalid schema name.
_SCHEMA_MISSING = ("42P01", "42703", "3F000")


def from_psycopg(exc: psycopg.Error) -> PgtickError | None:
    """The driver exception for a psycopg error of the SQL API, or None when the error is
    not one (a lost connection, a serialization failure: those stay psycopg errors)."""
    sqlstate = exc.sqlstate or ""
    diag = exc.diag
    message = diag.message_primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if sqlstate == "42883":
        return SchemaMismatch(
            f"{message} (this database's jobs schema is older than pgtick {_version()}: run pgtick migrate)"
        )
    if sqlstate in _SCHEMA_MISSING:  # a table, column or the schema the driver reads is not there
        return SchemaMismatch(
            f"{message} (this database has no jobs schema, or one older than pgtick {_version()}:"
            " run pgtick migrate)"
        )
    if sqlstate == NotFound.default_sqlstate:
        cls: type[SqlApiError] = NotFound
    elif sqlstate == WrongTransaction.default_sqlstate:
        cls = WrongTransaction
    elif sqlstate[:2] in ("22", "23"):
        cls = InvalidArgument
    else:
        return None
    match = _FIELD.match(message)
    field = diag.column_name or (match.group(1) if match else None)
    return cls(message, sqlstate=sqlstate, field=field, hint=diag.message_hint, detail=diag.message_detail)


def _version() -> str:
    from pgtick import __version__

    return __version__


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise the SQL API's errors (class 22/23, P0002, 25000, 42883, and a missing table,
    column or schema) as driver exceptions, chained to the psycopg error; every other
    exception passes through unchanged."""
    try:
        yield
    except psycopg.Error as exc:
        mapped = from_psycopg(exc)
        if mapped is None:
            raise
        raise mapped from exc
