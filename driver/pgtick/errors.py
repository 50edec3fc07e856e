"""Exceptions of the driver. Each one a user can cause carries a message they can act on."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

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


class Snooze(Exception):
    """Raised by job code (or ``ctx.snooze(delay)``) to say "not now, run me again later": the
    run goes back to QUEUED, due ``delay`` from now, with the same attempt (``jobs.snooze``).
    Not a failure: no retry policy is asked and no attempt is used up. ``delay`` is seconds (a
    number) or a ``timedelta``, more than 0 and at most 365 days; anything else is refused here,
    as an ``InvalidArgument`` naming ``delay``."""

    def __init__(self, delay: float | timedelta) -> None:
        self.delay = snooze_delay(delay)
        super().__init__(f"snoozed for {self.delay.total_seconds():g}s")

    def __reduce__(self) -> tuple[type[Snooze], tuple[timedelta]]:
        return (type(self), (self.delay,))


#: The longest snooze ``jobs.snooze`` takes.
MAX_SNOOZE = timedelta(days=365)


def snooze_delay(delay: object) -> timedelta:
    """``delay`` as a timedelta, or an ``InvalidArgument`` naming it: seconds (an int or a
    float, not a bool) or a timedelta, more than 0 and at most 365 days, finite."""
    if isinstance(delay, bool) or not isinstance(delay, int | float | timedelta):
        raise InvalidArgument(f"delay must be seconds or a timedelta, got {delay!r}", field="delay")
    if isinstance(delay, timedelta):
        value = delay
    elif not math.isfinite(delay) or not 0 < delay <= MAX_SNOOZE.total_seconds():
        value = None
    else:
        value = timedelta(seconds=delay)
    if value is None or not timedelta(0) < value <= MAX_SNOOZE:
        raise InvalidArgument(
            f"delay must be more than 0 seconds and at most 365 days, got {delay!r}", field="delay"
        )
    return value


class MemoryLimitExceeded(MemoryError):
    """A process job went past its kind's ``memory_limit`` (an allocation failed in its job
    process); the run fails with failure_reason 'Error' and this class chain, so a retry
    policy can name it or ``MemoryError``."""


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


class NotAllowed(PgtickError):
    """The database refused the call for what the session may do, not for its arguments: the
    server's message with what to do about it, its SQLSTATE, and the psycopg error as
    ``__cause__``. Not a ``UsageError``: the CLI exits 1."""

    default_sqlstate = "42501"

    def __init__(self, message: str, *, sqlstate: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate or self.default_sqlstate
        self.hint = hint


class PermissionDenied(NotAllowed):
    """The login lacks the pgtick role the call needs (SQLSTATE 42501 insufficient_privilege):
    ``role`` names it where the caller knows which (the client's calls: ``jobs_operator``,
    ``get_run`` ``jobs_reader``), and the message says to grant it."""

    default_sqlstate = "42501"

    def __init__(
        self, message: str, *, sqlstate: str | None = None, hint: str | None = None, role: str | None = None
    ) -> None:
        super().__init__(message, sqlstate=sqlstate, hint=hint)
        self.role = role


class ReadOnly(NotAllowed):
    """The call writes and the transaction only reads (SQLSTATE 25006 read_only_sql_transaction):
    the server is a standby, or the transaction or session is READ ONLY. ``standby`` says which
    where the connection told (True, False), else None."""

    default_sqlstate = "25006"

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        hint: str | None = None,
        standby: bool | None = None,
    ) -> None:
        super().__init__(message, sqlstate=sqlstate, hint=hint)
        self.standby = standby


class SchemaMismatch(PgtickError):
    """The database's jobs schema lacks a function or parameter this driver called
    (SQLSTATE 42883), or a table, column or the schema itself that it reads: the schema is
    older than the driver, or missing; run ``pgtick migrate``."""


#: undefined table, undefined column, invalid schema name.
_SCHEMA_MISSING = ("42P01", "42703", "3F000")


#: A role name SQL takes without quotes.
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*")


@dataclass
class Session:
    """What ``translate_errors`` knows of the call it wraps, to say what to do about a refusal:
    the role the call needs (``PermissionDenied``) and the connection it ran on (a standby or
    a read-only transaction, ``ReadOnly``; the login to grant the role to). The caller fills
    in what it knows, also after the ``with`` began (the connection, once it has one)."""

    role: str | None = None
    what: str = "this call"
    info: psycopg.ConnectionInfo | None = None

    def login(self) -> str:
        """The login a grant goes to, as the connection names it, else a placeholder."""
        if self.info is None:
            return "<login>"
        name = self.info.parameter_status("session_authorization") or self.info.user
        if not name:
            return "<login>"
        return name if _PLAIN_NAME.fullmatch(name) else '"' + name.replace('"', '""') + '"'

    def standby(self) -> bool | None:
        """Whether the server is a standby, as the connection reports it (PostgreSQL 14 and
        later report ``in_hot_standby``); None when it does not say."""
        if self.info is None:
            return None
        reported = self.info.parameter_status("in_hot_standby")
        return None if reported is None else reported == "on"


def from_psycopg(exc: psycopg.Error, session: Session | None = None) -> PgtickError | None:
    """The driver exception for a psycopg error of the SQL API, or None when the error is
    not one (a lost connection, a serialization failure: those stay psycopg errors).
    ``session``: what the caller knows of the call, for the advice of a refusal."""
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
    if sqlstate == PermissionDenied.default_sqlstate:
        return _permission_denied(message, diag.message_hint, session or Session())
    if sqlstate == ReadOnly.default_sqlstate:
        return _read_only(message, diag.message_hint, session or Session())
    if sqlstate == NotFound.default_sqlstate:
        cls: type[SqlApiError] = NotFound
    elif sqlstate == WrongTransaction.default_sqlstate:
        cls = WrongTransaction
    elif sqlstate[:2] in ("22", "23") or sqlstate == "54000":  # 54000: a value past a server limit
        cls = InvalidArgument
    else:
        return None
    match = _FIELD.match(message)
    field = diag.column_name or (match.group(1) if match else None)
    return cls(message, sqlstate=sqlstate, field=field, hint=diag.message_hint, detail=diag.message_detail)


def _permission_denied(message: str, hint: str | None, session: Session) -> PermissionDenied:
    if session.role is not None:
        advice = (
            f"{session.what} needs a login granted {session.role}: GRANT {session.role} TO {session.login()}"
        )
    else:
        advice = (
            "the login lacks the pgtick role this needs: jobs_operator to enqueue and manage runs,"
            " jobs_reader to read them, jobs_worker to run them"
        )
    return PermissionDenied(f"{message} ({advice})", hint=hint, role=session.role)


def _read_only(message: str, hint: str | None, session: Session) -> ReadOnly:
    standby = session.standby()
    if standby:
        advice = "the server is a standby, which only reads: connect to the primary"
    elif standby is None:
        advice = (
            "the server is a standby, or the transaction is READ ONLY: connect to the primary,"
            " and call it in a read-write transaction"
        )
    else:
        advice = (
            "the transaction is READ ONLY (SET TRANSACTION READ ONLY, or default_transaction_read_only"
            " on): call it in a read-write transaction"
        )
    return ReadOnly(f"{message} ({advice})", hint=hint, standby=standby)


def _version() -> str:
    from pgtick import __version__

    return __version__


@contextmanager
def translate_errors(session: Session | None = None) -> Iterator[Session]:
    """Re-raise the SQL API's errors (class 22/23, a value past a server limit 54000, P0002,
    25000, 42883, a missing table, column or schema, and the refusals 42501 and 25006) as driver
    exceptions, chained to the psycopg error; every other exception passes through unchanged.
    Yields ``session`` (a new one if not given), which the caller may fill in as the call goes
    on."""
    session = session or Session()
    try:
        yield session
    except psycopg.Error as exc:
        mapped = from_psycopg(exc, session)
        if mapped is None:
            raise
        raise mapped from exc
