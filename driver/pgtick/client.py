"""The client application code uses to enqueue and manage runs: ``Client`` and ``AsyncClient``.

    client = pgtick.Client("postgresql://localhost/app")       # or a Connection, or a pool
    with psycopg.connect(dsn) as conn:                         # the caller's transaction
        order_id = insert_order(conn)
        client.enqueue("send-receipt", {"order": order_id}, conn=conn)
    # the order and its run commit together, or neither does

Every method is a thin ``SELECT * FROM jobs.<function>(name => value, ...)``: only
the arguments the caller gave are sent, in named notation, so the SQL defaults
apply to the rest and a schema that has more parameters still works. Errors of
the SQL API arrive as ``pgtick.errors.InvalidArgument`` / ``NotFound``, a login without
the role a call needs as ``PermissionDenied``, a write in a read-only transaction or on a
standby as ``ReadOnly`` (see ``pgtick.errors``).

Transactions. With ``conn=`` a call runs on that connection inside whatever
transaction it has open and never commits: it commits or rolls back with the
caller. Without ``conn=`` the client uses what it was built over:

* a conninfo string: one connection of its own (opened on first use, autocommit; opened
  again in a forked child process, and when the server ended it while it was idle), each
  call its own transaction;
* a ``psycopg_pool`` pool: a connection from the pool per call, its own transaction;
* a psycopg connection: ``conn.transaction()`` on it, which is a transaction of its
  own when the connection is idle, and a savepoint of the transaction in progress
  (so it commits with it) when one is open.

A call reads what it gets back in binary, so a caller's connection or pool whose session
writes times or durations in another ``DateStyle`` or ``IntervalStyle`` (``SQL, DMY``,
``sql_standard``) gets the same exact values; nothing is SET on a caller's session.

Calls on one connection go one at a time, whichever client, thread or task makes them.
A connection whose transaction has failed (a statement in it raised an error and it was
not rolled back) is refused with ``pgtick.errors.WrongTransaction``: roll it back first.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import os
import re
import select
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any, Generic, TypedDict, TypeVar, Unpack, cast, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from psycopg import sql
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict
from psycopg.postgres import types as _pg_types
from psycopg.pq import Format, TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg.types.numeric import Int8
from psycopg.types.string import TextBinaryLoader
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgtick import instrumentation
from pgtick.db import prepare, prepare_async, without_password
from pgtick.errors import InvalidArgument, NotFound, Session, UsageError, WrongTransaction, translate_errors
from pgtick.schedule.zones import not_a_place

__all__ = [
    "AsyncClient",
    "Client",
    "DefineOptions",
    "Definition",
    "DefinitionOptions",
    "EnqueueManyOptions",
    "EnqueueOptions",
    "EnqueueWithConnOptions",
    "PerRunOptions",
    "Run",
]

log = logging.getLogger("pgtick.client")

#: On the client's own connection (not behind a transaction-mode pooler), an enqueuing call's
#: NOTIFY waits for its commit: its transaction defers it (pgtick.defer_wake) and the client
#: sends it once the transaction committed, in a transaction of its own that does not wait for
#: a WAL flush (WAKE). PostgreSQL holds the notify queue's lock through a notifying commit's
#: flush, so durable enqueues that notify commit one at a time, however many sessions send them;
#: deferred, they share their flushes. The statements go pipelined, in as many round trips as
#: the call alone. Inside a caller's transaction, or on a connection or pool the client was
#: given, the NOTIFY goes with the transaction's commit.
DEFER_WAKE = "SELECT set_config('pgtick.defer_wake', 'on', true)"
WAKE = "SELECT set_config('synchronous_commit', 'off', true), pg_notify('jobs', '')"
_UNWOKEN = "could not wake the workers after an enqueue (they find its runs at their next poll): %s"

Row = dict[str, Any]
T = TypeVar("T", bound="_Record")


# -- typed results ------------------------------------------------------------------


@dataclass(frozen=True)
class _Record:
    """Built from a row by column name; columns this class does not name go to ``extra``."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False, compare=False)

    @classmethod
    def from_row(cls: type[T], row: Mapping[str, Any]) -> T:
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(
            **{k: v for k, v in row.items() if k in known},
            extra={k: v for k, v in row.items() if k not in known},
        )


@dataclass(frozen=True)
class Run(_Record):
    """One row of ``jobs.runs`` (one execution attempt). Columns a schema does not have are
    None; columns this class does not name (a newer schema) are in ``extra``, as psycopg reads
    them in binary (an enum's as its label; one of a type psycopg has no loader for as bytes)."""

    id: int
    kind: str
    status: str
    payload: dict[str, Any] = field(default_factory=dict)
    definition_id: int | None = None
    attempt: int = 1
    max_attempts: int | None = None
    retry_of: int | None = None
    scheduled_for: datetime | None = None
    priority: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    finished_at: datetime | None = None
    worker: str | None = None
    origin: str | None = None
    cancel_requested: bool = False
    failure_reason: str | None = None
    error: str | None = None
    result: Any = None
    idempotency_key: str | None = None
    timeout: timedelta | None = None
    heartbeat_timeout: timedelta | None = None
    # queues, limits, uniqueness and dependencies (schemas that have them)
    queue: str | None = None
    concurrency_key: str | None = None
    unique_key: str | None = None
    depends_on: list[int] | None = None
    blocked: bool | None = None
    # the occurrence a scheduled run (or its retry) is for, before the definition's jitter
    occurrence_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("COMPLETED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class Definition(_Record):
    """One row of ``jobs.definitions``; like ``Run``, tolerant of older and newer schemas."""

    id: int
    name: str
    kind: str
    schedule: str | None = None
    timezone: str = "UTC"
    run_at: datetime | None = None
    next_run_at: datetime | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    max_concurrent_runs: int | None = None
    priority: int = 0
    max_attempts: int | None = None
    misfire_policy: str | None = None
    overlap_policy: str | None = None
    timeout: timedelta | None = None
    heartbeat_timeout: timedelta | None = None
    revision: int = 1
    schedule_error: str | None = None
    finished_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    # queues, limits and the schedule controls (schemas that have them)
    queue: str | None = None
    concurrency_key: str | None = None
    dst_gap: str | None = None
    dst_repeat: str | None = None
    jitter: timedelta | None = None
    pause_after_failures: int | None = None
    paused_reason: str | None = None
    failure_streak_since: datetime | None = None


def _run(row: Row | None) -> Run:
    assert row is not None, "a jobs function that returns a run returned no row"
    return Run.from_row(row)


# -- building the calls ---------------------------------------------------------------


def _zone(tz: str | tzinfo, what: str) -> tzinfo:
    """The zone a wall time is read in. A tzinfo that names an IANA zone (pytz's ``.zone``)
    is read as that ZoneInfo, so its gaps and repeated hours follow pgtick's rules: a pytz
    zone put on a datetime with ``replace(tzinfo=...)`` gives that zone's oldest offset
    (Sofia's local mean time, +01:33), not the offset of the day. A pytz zone without a name
    is refused; other tzinfos (fixed offsets, dateutil's) are used as they are."""
    if isinstance(tz, ZoneInfo | timezone):
        return tz
    if isinstance(tz, tzinfo):
        name = getattr(tz, "zone", None)
        if isinstance(name, str):
            try:
                return ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                pass
        if hasattr(tz, "localize") and tz.utcoffset(None) is None:  # a pytz zone with DST
            raise InvalidArgument(
                f"{what} {tz!r} is a pytz zone pgtick cannot name: give the zone's IANA name,"
                " such as 'Europe/Sofia', or a zoneinfo.ZoneInfo",
                field=what,
            )
        return tz
    if not isinstance(tz, str):
        raise InvalidArgument(
            f"{what} must be an IANA time zone name or a tzinfo, got {type(tz).__name__} {tz!r}", field=what
        )
    why = not_a_place(tz)
    if why is not None:  # localtime would read the time in this host's zone
        raise InvalidArgument(f"{what} {why}", field=what)
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"{what} {tz!r} is not a known IANA time zone name", field=what) from None


# -- what a caller hands over: times, numbers, durations --------------------------------------

#: The documented range of each integer argument of the SQL API (jobs.define, jobs.enqueue,
#: jobs.cancel ...); a value outside it is refused before any SQL is sent.
BIGINT_MAX = 2**63 - 1
INTEGER_MAX = 2**31 - 1
RANGES: dict[str, tuple[int, int]] = {
    "run_id": (1, BIGINT_MAX),
    "depends_on": (1, BIGINT_MAX),
    "priority": (-1000, 1000),
    "max_attempts": (1, 1000),
    "max_concurrent_runs": (1, 100_000),
    "pause_after_failures": (1, 1000),
}

#: The longest duration the driver accepts (timeouts, jitter, unique_for ...): a hundred
#: years, far inside what a PostgreSQL interval and a Python timedelta both hold.
MAX_DURATION = timedelta(days=36_525)


def check_int(field_name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int within [low, high] (default: the documented range of ``field_name``);
    else InvalidArgument naming the field. Booleans and floats are not integers here. A value
    that is not one is named briefly: a Run by its id, never with its payload."""
    if low is None or high is None:
        low, high = RANGES[field_name]
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgument(
            f"{field_name} must be an integer between {low} and {high}, got {_brief(value)}", field=field_name
        )
    number = value.__index__()
    if not low <= number <= high:
        raise InvalidArgument(
            f"{field_name} must be between {low} and {high}, got {number}", field=field_name
        )
    return int(number)


def check_duration(field_name: str, value: float | timedelta) -> timedelta:
    """Seconds or a timedelta as a timedelta of at most ``MAX_DURATION`` either way (the SQL
    API decides which signs it takes); NaN, infinities and overflows are refused by name."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if abs(value) > MAX_DURATION.total_seconds():
            duration = MAX_DURATION * 2  # refused below, with the value as given
        else:
            duration = timedelta(seconds=value)
    else:
        raise InvalidArgument(
            f"{field_name} must be a finite number of seconds or a timedelta, got {value!r}", field=field_name
        )
    if abs(duration) > MAX_DURATION:
        raise InvalidArgument(
            f"{field_name} must be at most {MAX_DURATION.days} days, got {value!r}", field=field_name
        )
    return duration


def parse_time(text: str, field_name: str = "run_at") -> datetime:
    """An ISO 8601 date or time as typed by a person (``Z`` for UTC allowed); naive when it
    has no UTC offset (read it with ``read_time``)."""
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise InvalidArgument(
            f"{field_name}: {_why_not_a_time(str(exc))}: {text[:60]!r} (e.g. 2026-12-24T18:00:00+02:00)",
            field=field_name,
        ) from None


def _why_not_a_time(problem: str) -> str:
    """What ``datetime.fromisoformat`` found wrong, in the words of the one who typed it."""
    field = re.match(r"(month|hour|minute|second|microsecond) must be in (\d+)\.\.(\d+)", problem)
    if field:
        return f"the {field[1]} must be {field[2]} to {field[3]}"
    if problem.startswith("day is out of range"):
        return "no such day in that month"
    if problem.startswith("year"):
        return "a date out of range (years 1 to 9999)"
    if problem.startswith("offset must be"):
        return "the UTC offset must be under 24 hours"
    return "not an ISO 8601 time"


class _Reading(TypedDict, total=False):
    """How ``read_time`` names what it reads and reads a wall time the zone skips or repeats."""

    field_name: str
    zone_name: str
    dst_gap: str | None
    dst_repeat: str | None


@overload
def read_time(value: datetime | str, zone: str | tzinfo | None, **how: Unpack[_Reading]) -> datetime: ...
@overload
def read_time(value: None, zone: str | tzinfo | None, **how: Unpack[_Reading]) -> None: ...
@overload
def read_time(
    value: datetime | str | None, zone: str | tzinfo | None, **how: Unpack[_Reading]
) -> datetime | None: ...


def read_time(
    value: datetime | str | None,
    zone: str | tzinfo | None,
    *,
    field_name: str = "run_at",
    zone_name: str = "tz",
    dst_gap: str | None = None,
    dst_repeat: str | None = None,
) -> datetime | None:
    """The instant a caller means by ``value`` (a datetime or ISO 8601 text): kept if it has
    a UTC offset (``zone`` is then not used), else read as wall time in ``zone``. A naive
    value without a zone is refused: it is never read in the server's, the session's or
    this machine's zone.

    A wall time the zone skips (a spring-forward gap) or repeats (a fall-back overlap) is
    read as a DAILY schedule reads it (``pgtick.schedule.zones``): ``dst_gap`` shift (default:
    the offset before the gap) or end (the first instant after it); ``dst_repeat`` first
    (default) or second; a naive datetime with ``fold=1`` means the second unless
    ``dst_repeat`` says otherwise. ``skip`` and ``both`` cannot name one instant and are refused."""
    if value is None:
        return None
    if not isinstance(value, str | datetime):  # a date has no time of day, a number no unit
        raise InvalidArgument(
            f"{field_name} must be a datetime or ISO 8601 text, got {type(value).__name__} {value!r}",
            field=field_name,
        )
    when = parse_time(value, field_name) if isinstance(value, str) else value
    if when.tzinfo is not None and when.utcoffset() is not None:
        try:
            return when.astimezone(UTC)
        except OverflowError:
            raise InvalidArgument(
                f"{field_name} {when.isoformat()} is out of range (years 1 to 9999 in UTC)", field=field_name
            ) from None
    if zone is None:
        raise InvalidArgument(
            f"{field_name} is a naive datetime ({when.isoformat()}); give an aware datetime "
            f"or the zone it is in with {zone_name}=",
            field=field_name,
        )
    return _wall_time_in(when, _zone(zone, zone_name), field_name, dst_gap, dst_repeat)


def _wall_time_in(
    wall: datetime, zone: tzinfo, field_name: str, dst_gap: str | None, dst_repeat: str | None
) -> datetime:
    from pgtick.schedule.zones import ScheduleError, resolve_policy, runs_of_wall_time

    if dst_repeat is None and wall.fold == 1:  # Python's own mark of a repeated time's second pass
        dst_repeat = "second"
    try:
        policy = resolve_policy(dst_gap, dst_repeat, follows_real_time=False, kind="rrule")
    except ScheduleError as exc:
        raise InvalidArgument(
            exc.detail, field="dst_gap" if "dst_gap" in exc.detail else "dst_repeat"
        ) from None
    if not isinstance(zone, ZoneInfo):  # a fixed offset, or a tzinfo that reads its own gaps
        try:
            return wall.replace(tzinfo=zone).astimezone(UTC)
        except OverflowError:
            runs = None
    else:
        runs = runs_of_wall_time(wall.replace(fold=0), zone, policy)
    if runs is None or not runs.runs:
        if runs is None:
            why = "is out of range (years 1 to 9999 in UTC)"
        else:
            why = f"does not exist in {zone} (the clocks skip it) and dst_gap=skip drops it"
        raise InvalidArgument(f"{field_name} {wall.isoformat()} {why}", field=field_name)
    if len(runs.runs) > 1:
        raise InvalidArgument(
            f"{field_name} {wall.isoformat()} happens twice in {zone} and dst_repeat=both would run it "
            "twice: give a UTC offset or dst_repeat first or second",
            field=field_name,
        )
    return runs.runs[0][0]


_DURATIONS = ("timeout", "heartbeat_timeout", "unique_for", "jitter")
_FLAGS = ("enabled",)


#: What no PostgreSQL text holds: NUL, and a lone UTF-16 surrogate (not a character at all).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_text(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` ("NUL characters (\\u0000)", "a lone surrogate
    (\\ud800)"), or None when it can."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "NUL characters (\\u0000)"
    return f"a lone surrogate (\\u{ord(found.group()):04x}), which is not a character"


def unstorable_json(value: Any) -> str | None:
    """Why jsonb cannot store a JSON value's keys and strings (``unstorable_text``), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            why = unstorable_text(item)
            if why is not None:
                return why
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


#: Why a value two of whose keys JSON writes alike is refused.
MERGED_KEYS = "two keys that JSON writes alike (True and 'true', 1 and '1'): one would be lost"


def merged_keys(value: Any) -> bool:
    """Whether a mapping in ``value`` (a JSON-encodable value) has two keys JSON writes alike."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if _keys_collide(item):
                return True
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _keys_collide(mapping: Mapping[Any, Any]) -> bool:
    """Whether two keys of a mapping become one key in JSON, which writes every key as text:
    ``True`` as "true", ``1`` as "1", ``None`` as "null" (the object would keep only one)."""
    if all(isinstance(key, str) for key in mapping):
        return False
    try:
        written: list[str] = json.loads(
            json.dumps(dict.fromkeys(mapping, 0)), object_pairs_hook=lambda pairs: [k for k, _ in pairs]
        )
    except (TypeError, ValueError):  # a key JSON has no form for: the encoder says so
        return False
    return len(set(written)) < len(written)


def _jsonb(name: str, value: Any) -> Jsonb:
    """``value`` as jsonb, serialized here once so that what PostgreSQL cannot store (NaN,
    infinities, NUL, nesting deeper than Python serializes) is refused by name before
    anything is sent. Objects the standard encoder has no form for are left to the JSON
    dumps the application configured in psycopg."""
    if isinstance(value, Mapping) and not isinstance(value, dict):
        value = dict(value)  # a read-only or custom mapping is a JSON object all the same
    try:
        text = json.dumps(value, allow_nan=False)
    except TypeError:
        return Jsonb(value)
    except (ValueError, RecursionError) as exc:  # NaN, infinities, a circular reference
        why = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidArgument(f"{name} must be JSON that PostgreSQL can store: {why}", field=name) from None
    unstorable = MERGED_KEYS if merged_keys(value) else unstorable_json(value)  # after dumps: no cycles
    if unstorable is not None:
        raise InvalidArgument(f"{name} must not contain {unstorable}", field=name)
    return Jsonb(value, dumps=lambda _: text)


def _brief(value: Any) -> str:
    """A value named in a refusal: a Run by its id (its payload is the caller's data, and long)."""
    return f"Run(id={value.id})" if isinstance(value, Run) else repr(value)[:80]


def _sql_value(name: str, value: Any) -> Any:
    """An argument as sent, checked first: numbers in their documented range, durations
    finite and in range, flags true or false, the rest text without NUL (PostgreSQL text
    cannot hold it). ``run_at`` comes read already (``read_time``)."""
    if name in ("payload", "payloads", "result"):
        return _jsonb(name, value)
    if name == "depends_on":
        if isinstance(value, str | bytes | Mapping | Run) or not isinstance(value, Iterable):
            raise InvalidArgument(
                f"depends_on must be a list of run ids or Runs, got {type(value).__name__} {_brief(value)}",
                field=name,
            )
        return [Int8(check_int(name, v.id if isinstance(v, Run) else v)) for v in value]
    if name in RANGES:
        return check_int(name, value)
    if name in _DURATIONS:
        return check_duration(name, value)
    if name == "run_at":
        return value
    if name in _FLAGS:
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be True or False, got {type(value).__name__}", field=name)
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be text, got {type(value).__name__}", field=name)
    why = unstorable_text(value)
    if why is not None:
        raise InvalidArgument(f"{name} must not contain {why}, got {value[:60]!r}", field=name)
    if name == "kind" and not value.strip():  # a kind no one can read in a log, a table or app.job
        raise InvalidArgument(
            f"kind must be a non-empty text, not only whitespace, got {value!r}", field=name
        )
    return value


#: The arguments each SQL function has no default for: None there is a mistake, not "the default".
REQUIRED: dict[str, tuple[str, ...]] = {
    "enqueue": ("kind",),
    "enqueue_many": ("kind", "payloads"),
    "run_now": ("name",),
    "define": ("name", "kind"),
    "cancel": ("run_id",),
    "retry": ("run_id",),
    "pause_queue": ("name",),
    "resume_queue": ("name",),
}


def call(function: str, args: Mapping[str, Any], *, returns_row: bool = True) -> tuple[sql.Composed, Row]:
    """``SELECT * FROM jobs.<function>(a => %(a)s, ...)`` for the arguments that are not None
    (the SQL API's defaults apply to the others; a required one is refused by name)."""
    for name in REQUIRED.get(function, ()):
        if args.get(name) is None:
            raise InvalidArgument(f"{name} must be given, got None", field=name)
    given = {k: _sql_value(k, v) for k, v in args.items() if v is not None}
    named = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in given
    )
    template = "SELECT * FROM jobs.{}({})" if returns_row else "SELECT jobs.{}({}) AS value"
    return sql.SQL(template).format(sql.Identifier(function), named), given


# -- the keyword options, declared once ---------------------------------------------------
# Client and AsyncClient take these as ``**options: Unpack[...]``: type checkers and IDEs see
# each keyword with its type, ``_takes`` shows them in the runtime signature and refuses any
# other keyword as Python does, and each method's arguments are built in one function below.


class PerRunOptions(TypedDict, total=False):
    """What every run gets: how it is claimed and how long it may take. None (the default)
    leaves a value to the SQL API's default."""

    priority: int | None
    queue: str | None
    concurrency_key: str | None
    max_attempts: int | None
    timeout: float | timedelta | None
    heartbeat_timeout: float | timedelta | None


class EnqueueManyOptions(PerRunOptions, total=False):
    """The keyword options of ``enqueue_many``: ``run_at`` aware, or naive with ``tz=``."""

    run_at: datetime | None
    tz: str | tzinfo | None
    depends_on: Sequence[int | Run] | None  # run ids, or the Runs the client returned


class EnqueueOptions(EnqueueManyOptions, total=False):
    """The keyword options of ``enqueue``: those of ``enqueue_many`` and the keys that make
    a run unique or idempotent."""

    idempotency_key: str | None
    unique_key: str | None
    unique_while: str | None
    unique_for: float | timedelta | None
    on_conflict: str | None


class EnqueueWithConnOptions(EnqueueOptions, total=False):
    """``Client.enqueue``'s keywords, ``conn=`` included: what a wrapper passes on to it."""

    conn: psycopg.Connection[Any] | None


class DefinitionOptions(PerRunOptions, total=False):
    """The keyword options of ``App.schedule``: those of ``define`` but the zone and the
    one-shot time, which ``App.schedule`` takes as ``tz`` and ``run_at``."""

    payload: Mapping[str, Any] | None
    enabled: bool | None
    max_concurrent_runs: int | None
    misfire_policy: str | None
    overlap_policy: str | None
    dst_gap: str | None
    dst_repeat: str | None
    jitter: float | timedelta | None
    pause_after_failures: int | None


class DefineOptions(DefinitionOptions, total=False):
    """The keyword options of ``define``."""

    timezone: str | None
    run_at: datetime | None


def check_keywords(function: str, known: Iterable[str], given: Iterable[str]) -> None:
    """A TypeError for the first keyword in ``given`` that ``known`` does not name, worded as
    Python words it (``function`` is the qualified name it shows, e.g. ``Client.define``)."""
    names = frozenset(known)
    for name in given:
        if name not in names:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _takes(options: Any) -> Callable[[_Method], _Method]:
    """A method that takes ``**options: Unpack[options]`` (a TypedDict): its signature as
    ``inspect`` and ``help()`` show it lists each option as a keyword-only argument (default
    None), and a keyword neither the method nor ``options`` names is a TypeError, worded as
    Python words it, before the method runs."""
    declared = {  # the annotation as written (a TypedDict keeps it as a ForwardRef)
        name: getattr(annotation, "__forward_arg__", annotation)
        for name, annotation in options.__annotations__.items()
    }

    def decorate(method: _Method) -> _Method:
        signature = inspect.signature(method)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        keywords = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
            for name, annotation in declared.items()
        ]
        first_keyword = next((i for i, p in enumerate(own) if p.kind is p.KEYWORD_ONLY), len(own))
        shown = signature.replace(parameters=[*own[:first_keyword], *keywords, *own[first_keyword:]])
        known = frozenset(shown.parameters)

        def check(kwargs: Mapping[str, Any]) -> None:
            check_keywords(method.__qualname__, known, kwargs)

        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def checked_async(*args: Any, **kwargs: Any) -> Any:
                check(kwargs)
                return await method(*args, **kwargs)

            wrapper: Callable[..., Any] = checked_async
        else:

            @functools.wraps(method)
            def checked(*args: Any, **kwargs: Any) -> Any:
                check(kwargs)
                return method(*args, **kwargs)

            wrapper = checked
        wrapper.__signature__ = shown  # type: ignore[attr-defined]
        return cast(_Method, wrapper)

    return decorate


# -- what each method sends, for both clients -------------------------------------------------

_R = TypeVar("_R")


@dataclass(frozen=True)
class _Call(Generic[_R]):
    """One method's statement and how its rows become the method's result. Client and
    AsyncClient only execute it (``_send``)."""

    function: str
    query: sql.Composed | str
    params: Mapping[str, Any]
    result: Callable[[list[Row]], _R]
    args: Mapping[str, Any] = field(default_factory=dict)

    @contextmanager
    def adapting(self, info: psycopg.ConnectionInfo | None = None) -> Iterator[None]:
        """A JSON argument that the JSON dumps configured in psycopg cannot serialize either
        (a set, a Decimal...) is refused by name: psycopg raises a bare TypeError while it
        adapts the arguments, before anything is sent. So is a text argument with a character
        the connection's encoding (``info``: a caller's connection in LATIN1) has no byte for,
        which psycopg refuses with a bare UnicodeEncodeError."""
        try:
            yield
        except TypeError as exc:
            named = next((k for k, v in self.params.items() if isinstance(v, Jsonb)), None)
            if named is None:
                raise
            raise InvalidArgument(f"{named} must be JSON-serializable: {exc}", field=named) from exc
        except UnicodeEncodeError as exc:
            named = next((k for k, v in self.params.items() if isinstance(v, str) and v == exc.object), None)
            if named is None:
                raise
            told = info.parameter_status("client_encoding") if info is not None else None
            encoding = told or exc.encoding
            raise InvalidArgument(
                f"{named} has a character ({exc.object[exc.start]!r}) that the connection's client_encoding"
                f" {encoding} cannot carry, got {exc.object[:60]!r}: use a UTF8 connection for it",
                field=named,
            ) from exc

    def adapt(self) -> None:
        """Serialize the JSON arguments now, with the JSON dumps configured in psycopg for
        every connection (those a new connection starts with), and refuse what ``adapting``
        refuses: for a call checked here and sent later, on a connection not made yet."""
        dumps = Transformer()
        with self.adapting():
            for value in self.params.values():
                if isinstance(value, Jsonb):
                    dumps.get_dumper(value, PyFormat.AUTO).dump(value)

    @contextmanager
    def trace_context(self) -> Iterator[str | None]:
        """The trace context an enqueuing call stores with its runs (see instrumentation), or None."""
        if self.function not in instrumentation.ENQUEUING:
            yield None
            return
        with instrumentation.current.enqueue(self.function, self.args) as context:
            yield context


def _jobs_call(function: str, args: Mapping[str, Any], result: Callable[[list[Row]], _R]) -> _Call[_R]:
    query, params = call(function, args)
    return _Call(function, query, params, result, args)


def _jobs_value(function: str, args: Mapping[str, Any], result: Callable[[Any], _R]) -> _Call[_R]:
    """A call of a function that returns one value (not a row)."""
    query, params = call(function, args, returns_row=False)
    return _Call(function, query, params, lambda rows: result(rows[0]["value"] if rows else None), args)


def _first_run(rows: list[Row]) -> Run:
    return _run(rows[0] if rows else None)


def _runs(rows: list[Row]) -> list[Run]:
    return [Run.from_row(r) for r in rows]


def _definition(rows: list[Row]) -> Definition:
    return Definition.from_row(rows[0])


def _timed(options: EnqueueManyOptions) -> dict[str, Any]:
    """The options of an enqueuing call as sent: ``run_at`` read in ``tz`` (not sent)."""
    args: dict[str, Any] = {k: v for k, v in options.items() if k != "tz"}
    if (zone := options.get("tz")) is not None:  # checked even where it reads nothing: not sent
        _zone(zone, "tz")
    args["run_at"] = read_time(options.get("run_at"), options.get("tz"))
    return args


def _enqueue(kind: str, payload: Mapping[str, Any] | None, options: EnqueueOptions) -> _Call[Run]:
    return _jobs_call("enqueue", {"kind": kind, "payload": payload, **_timed(options)}, _first_run)


def _enqueue_many(
    kind: str, payloads: Iterable[Mapping[str, Any]], options: EnqueueManyOptions
) -> _Call[list[Run]]:
    if isinstance(payloads, Mapping | str | bytes) or not isinstance(payloads, Iterable):
        raise InvalidArgument("payloads must be a list of JSON objects (mappings)", field="payloads")
    payloads = list(payloads)  # read once: an iterator is checked and sent, not used up by the check
    for i, p in enumerate(payloads):
        if not isinstance(p, Mapping):
            raise InvalidArgument(
                f"payloads[{i}] must be a JSON object (a mapping), got {type(p).__name__}", field="payloads"
            )
    args = {"kind": kind, "payloads": [dict(p) for p in payloads], **_timed(options)}
    return _jobs_call("enqueue_many", args, _runs)


def _run_now(name: str, payload: Mapping[str, Any] | None) -> _Call[Run]:
    return _jobs_call("run_now", {"name": name, "payload": payload}, _first_run)


def _define(name: str, kind: str, schedule: str | None, options: DefineOptions) -> _Call[Definition]:
    timezone = options.get("timezone")
    run_at = read_time(options.get("run_at"), timezone, zone_name="timezone")
    args = {"name": name, "kind": kind, "schedule": schedule, **options, "run_at": run_at}
    define = _jobs_call("define", args, _definition)  # the arguments checked, the schedule next
    if schedule is not None:
        from pgtick.definitions import check_schedule  # every part parsed here; SQL checks the shape

        check_schedule(name, schedule, timezone, options)
    return define


def check_definition(
    name: str, kind: str, schedule: str | None, options: DefineOptions, *, zone_name: str = "timezone"
) -> None:
    """What ``define`` checks before it sends anything, for a definition written later
    (``App.schedule``, which ``pgtick run`` writes): every argument's type and range, the
    schedule parsed in its zone, the payload serialized. The zone must be an IANA name
    (``zone_name``: what the caller calls it). What only the database knows is left to it."""
    timezone = options.get("timezone")
    if timezone is not None:
        if not isinstance(timezone, str):
            known = isinstance(timezone, ZoneInfo) and timezone.key
            name_it = f" (give its name, {timezone.key!r})" if known else ""
            raise InvalidArgument(
                f"{zone_name} must be an IANA time zone name such as 'Europe/Sofia', got "
                f"{type(timezone).__name__} {timezone!r}{name_it}",
                field=zone_name,
            )
        _zone(timezone, zone_name)
    _define(name, kind, schedule, options).adapt()


def _cancel(run_id: int) -> _Call[str]:
    return _jobs_value("cancel", {"run_id": run_id}, str)


def _retry(run_id: int) -> _Call[Run]:
    return _jobs_call("retry", {"run_id": run_id}, _first_run)


def _queue_switch(function: str, name: str) -> _Call[bool]:
    """jobs.pause_queue or jobs.resume_queue: whether the queue's state changed."""
    return _jobs_value(function, {"name": name}, bool)


_GET_RUN = "SELECT r.* FROM jobs.get_run(%(run_id)s) AS r"


def _get_run(run_id: int) -> _Call[Run]:
    checked = check_int("run_id", run_id)

    def found(rows: list[Row]) -> Run:
        if not rows:
            raise NotFound(f"run {run_id} does not exist", field="run_id")
        return Run.from_row(rows[0])

    return _Call("get_run", _GET_RUN, {"run_id": checked}, found)


_AnyCursor = TypeVar("_AnyCursor", psycopg.Cursor[Any], psycopg.AsyncCursor[Any])

#: The OID psycopg reads a column of a type it has no loader for by.
_UNKNOWN_TYPE = 0
JSON_OID, JSONB_OID = _pg_types["json"].oid, _pg_types["jsonb"].oid


class _EnumLabelLoader(TextBinaryLoader):
    """A value of a type psycopg has no binary loader for, which the client's calls return
    only for an enum: read as text, which is an enum's binary form. A value that is not text
    (a column of another type a newer schema added, for ``extra``) stays bytes."""

    def load(self, data: Any) -> Any:
        try:
            return super().load(data)
        except UnicodeDecodeError:
            return bytes(data)


#: The connection encodings psycopg reads JSON in as it is (UTF-8; SQL_ASCII, which converts nothing).
_JSON_AS_SENT = ("utf-8", "ascii")


def _read_json_in_its_encoding(cursor: psycopg.Cursor[Row] | psycopg.AsyncCursor[Row]) -> None:
    """psycopg reads JSON as UTF-8 whatever the connection's encoding, and the server sends it
    in that encoding: on a caller's connection in LATIN1 a payload with an ``ü`` failed the call
    (UnicodeDecodeError) after its statement had run. On such a connection this cursor's JSON
    loaders, the ones the connection has (its ``loads`` kept), get it recoded to UTF-8 first."""
    encoding = cursor.connection.info.encoding
    if encoding in _JSON_AS_SENT:
        return
    for oid in (JSON_OID, JSONB_OID):
        loader = cursor.adapters.get_loader(oid, Format.BINARY)
        if loader is None:
            continue

        class Recoded(loader):  # type: ignore[valid-type,misc]
            def load(self, data: Any) -> Any:
                return super().load(bytes(data).decode(encoding).encode())

        cursor.adapters.register_loader(oid, Recoded)


def _cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Row]:
    """The cursor a call runs on, whose query's rows come in binary (``binary=True``): in text,
    times and durations come in the session's ``DateStyle`` and ``IntervalStyle``, and
    psycopg reads only ISO and ``postgres`` (a caller's connection set to ``SQL, DMY`` or
    ``sql_standard`` failed every call); in binary they are the same whatever the session
    says, and nothing is SET on the caller's session. A server-binding cursor whatever the
    connection's ``cursor_factory`` (Django's ``ClientCursor`` reads no binary). An enum (a
    run's ``status``) has no binary loader in psycopg, which would give its label as bytes:
    a type without one is read as text (``_EnumLabelLoader``). Only this cursor's loaders
    change, not the connection's."""
    return _reading(psycopg.Cursor(conn, row_factory=dict_row))


def _cursor_async(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Row]:
    """``_cursor`` for an async connection."""
    return _reading(psycopg.AsyncCursor(conn, row_factory=dict_row))


def _reading(cursor: _AnyCursor) -> _AnyCursor:
    """``cursor`` with the loaders of a call: an enum's label as text, JSON in the connection's
    encoding."""
    cursor.adapters.register_loader(_UNKNOWN_TYPE, _EnumLabelLoader)
    _read_json_in_its_encoding(cursor)
    return cursor


def _prepare(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool | None:
    """Whether a call's statement may be prepared: not on a connection whose cursors bind on
    the client (its owner chose no server-side statements, a pooler's reason); else as the
    connection's ``prepare_threshold`` says."""
    factory = conn.cursor_factory
    return False if issubclass(factory, psycopg.ClientCursor | psycopg.AsyncClientCursor) else None


#: The role each call needs (docs: "The client's role needs jobs_operator"); the rest jobs_operator.
_ROLES = {"get_run": "jobs_reader"}


def _session(client: object, call: _Call[Any]) -> Session:
    """What a refusal of ``call`` says to do: the role it needs, named with the method."""
    return Session(
        role=_ROLES.get(call.function, "jobs_operator"), what=f"{type(client).__name__}.{call.function}"
    )


# -- the sync client ------------------------------------------------------------------


_Conn = TypeVar("_Conn", psycopg.Connection[Any], psycopg.AsyncConnection[Any])
_Pool = TypeVar("_Pool", ConnectionPool[Any], AsyncConnectionPool[Any])


@contextmanager
def _committed(conn: psycopg.Connection[Any], wake: bool) -> Iterator[None]:
    """The client's transaction for one call on its own connection; with ``wake``, the call's
    NOTIFY deferred to after the commit (``DEFER_WAKE``), all pipelined: the BEGIN, the
    deferral and the call go in the call's round trip, the COMMIT in its own (its failure is
    the call's), the NOTIFY in a third. A failed NOTIFY is logged, not raised: the runs are
    committed, and a caller told otherwise would queue them again."""
    if not wake:
        with conn.transaction():
            yield
        return
    with conn.pipeline() as pipeline:
        with conn.transaction():
            conn.execute(DEFER_WAKE)
            yield
        pipeline.sync()
        try:
            conn.execute(WAKE)
            pipeline.sync()
        except psycopg.Error as exc:
            log.warning(_UNWOKEN, exc)


@asynccontextmanager
async def _committed_async(conn: psycopg.AsyncConnection[Any], wake: bool) -> AsyncIterator[None]:
    """``_committed`` for an async connection."""
    if not wake:
        async with conn.transaction():
            yield
        return
    async with conn.pipeline() as pipeline:
        async with conn.transaction():
            await conn.execute(DEFER_WAKE)
            yield
        await pipeline.sync()
        try:
            await conn.execute(WAKE)
            await pipeline.sync()
        except psycopg.Error as exc:
            log.warning(_UNWOKEN, exc)


#: One call at a time on a connection, whichever client makes it and whoever shares the
#: connection (threads, or the tasks of an ``asyncio.gather``): each call runs in a savepoint
#: (or a transaction) of its own, and two calls interleaved on one connection would end each
#: other's savepoints out of order, so both raise while their runs stay in the transaction.
_calls_lock = threading.Lock()
_calls_sync: weakref.WeakKeyDictionary[psycopg.Connection[Any], threading.RLock] = weakref.WeakKeyDictionary()
_calls_async: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _one_call_on(conn: psycopg.Connection[Any]) -> threading.RLock:
    """The lock a call holds on ``conn`` from its savepoint's start to its end (``_calls_sync``)."""
    with _calls_lock:
        lock = _calls_sync.get(conn)
        if lock is None:
            lock = _calls_sync[conn] = threading.RLock()
        return lock


def _one_call_on_async(conn: psycopg.AsyncConnection[Any]) -> asyncio.Lock:
    """``_one_call_on`` for an async connection (which serves one event loop)."""
    with _calls_lock:
        lock = _calls_async.get(conn)
        if lock is None:
            lock = _calls_async[conn] = asyncio.Lock()
        return lock


def _check_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """A WrongTransaction when the connection's transaction has failed (a statement in it
    raised an error and it was not rolled back): no call, nor its savepoint, can run in it."""
    if conn.info.transaction_status == TransactionStatus.INERROR:
        raise WrongTransaction(
            "the connection's transaction has failed (a statement in it raised an error): roll it back first",
            sqlstate="25P02",
        )


def _ended_while_idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server ended an idle connection (a restart, ``pg_terminate_backend``,
    ``idle_session_timeout``): asked nothing, its socket has something to read, the server's
    last error or the end of the stream. Nothing was sent on it since, so a call can go on
    another connection without doubt about what this one did."""
    try:
        fd = conn.fileno()
    except (OSError, ValueError, psycopg.OperationalError):  # no socket any more
        return True
    # poll, not select: a process with more than FD_SETSIZE (1024) descriptors open, as a busy
    # web server has, gets socket numbers that select() refuses.
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    try:
        return bool(poller.poll(0))
    except OSError:
        return True


def _discard(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Let go of a connection the server ended: its socket is closed, nothing is sent."""
    conn.pgconn.finish()


def _checked_conninfo(client: str, conninfo: str) -> str:
    """``conninfo`` if libpq can read it; else InvalidArgument naming it, now rather than at the
    first call, with libpq's reason and any password in it masked (libpq quotes the URL)."""
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        why = without_password(" ".join(str(exc).split()))
    else:
        return conninfo
    # raised outside the except block: libpq's message, password and all, is not its context
    raise InvalidArgument(
        f"{client}: the conninfo is not a connection string or URL: {why}", field="conninfo"
    )


#: Every client made in this process, for ``_after_fork_in_child``.
_clients: weakref.WeakSet[_Source[Any, Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a process forked while another thread of its parent was in a call: the locks that
    thread held would be held for ever (no thread of the child releases them), so every
    client's locks, and those of the connections calls are made on, are made anew."""
    global _calls_lock
    _calls_lock = threading.Lock()
    _calls_sync.clear()
    _calls_async.clear()
    AsyncClient._users_lock = threading.Lock()
    for client in list(_clients):
        client._forked()


class _Source(Generic[_Conn, _Pool]):
    """What a client is built over, for both clients: a conninfo string (a connection of its
    own, opened on first use), a connection or a pool of the client's kind (sync or async);
    and whether it is closed (a closed client refuses every call, ``conn=`` or not)."""

    _accepts: tuple[type[_Conn], type[_Pool]]
    _other: tuple[str, tuple[type, type]]  # what the other client takes, for the error
    _new_lock: Callable[[], Any]  # one call at a time on a shared or an own connection

    def __init__(self, source: str | _Conn | _Pool, *, application_name: str = "pgtick-client") -> None:
        self._conninfo: str | None = None
        self._conn: _Conn | None = None
        self._pool: _Pool | None = None
        self._own: _Conn | None = None
        self._own_pid = 0  # the process that opened the own connection
        self._own_pooled = False  # the own connection is behind a transaction-mode pooler
        self._closed = False
        self._lock = self._new_lock()
        self.application_name = application_name
        _clients.add(self)
        connection, pool = self._accepts
        if isinstance(source, str):
            self._conninfo = _checked_conninfo(type(self).__name__, source)
        elif isinstance(source, connection):
            self._conn = source
        elif isinstance(source, pool):
            self._pool = source
        else:
            other, its_sources = self._other
            raise TypeError(
                f"{type(self).__name__} needs a conninfo string, a psycopg.{connection.__name__} or a "
                f"psycopg_pool.{pool.__name__}, got {type(source).__name__}"
                + (f" (use {other})" if isinstance(source, its_sources) else "")
            )

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called: the client then refuses every call."""
        return self._closed

    def _check_open(self) -> None:
        """A UsageError if the client was closed: it never opens a connection again."""
        if self._closed:
            name = type(self).__name__
            raise UsageError(f"this {name} is closed (close() was called on it): make a new {name}")

    def _own_ready(self) -> bool:
        """Whether the client's own connection can take a call: open, not broken, and opened
        by this process. A process forked after it was opened (a web server's workers forked
        from a parent that enqueued, ``multiprocessing``) shares its socket with the parent and
        its siblings: their calls would read each other's answers. Such a process opens its
        own; the inherited one is left to the parent, never closed here (closing it would end
        the parent's session, and psycopg does not close it on collection in another process).
        One the server ended while it was idle (``_ended_while_idle``) is closed: the call
        goes on a new one rather than failing on it."""
        own = self._own
        if own is None or own.closed or own.broken or self._own_pid != os.getpid():
            return False
        if _ended_while_idle(own):
            log.info("the client's connection was ended by the server while idle: opening another")
            _discard(own)
            return False
        return True

    def _forked(self) -> None:
        """In a forked child (``_after_fork_in_child``): no call is in progress here."""
        self._lock = self._new_lock()

    def _inherited_own(self) -> bool:
        """Whether the own connection was opened by another process (see ``_own_ready``)."""
        return self._own is not None and self._own_pid != os.getpid()

    def _callers(self, conn: Any) -> _Conn:
        """``conn=`` as given, if it is a connection of the client's kind; else a TypeError
        saying what it takes (an AsyncConnection to a Client, a pool or a conninfo string)."""
        connection = self._accepts[0]
        if not isinstance(conn, connection):
            other, its_sources = self._other
            raise TypeError(
                f"{type(self).__name__}: conn= takes a psycopg.{connection.__name__} (one in your "
                f"transaction), got {type(conn).__name__}"
                + (f" (use {other})" if isinstance(conn, its_sources[0]) else "")
            )
        return conn


class Client(_Source[psycopg.Connection[Any], ConnectionPool[Any]]):
    """Enqueue and manage runs from application code (see the module docstring for how
    calls relate to transactions). Usable as a context manager; ``close()`` closes only
    what the client opened itself, and a closed client refuses every call after it."""

    _accepts = (psycopg.Connection, ConnectionPool)
    _new_lock = threading.Lock
    _lock: threading.Lock
    _other = "AsyncClient for async connections and pools", (psycopg.AsyncConnection, AsyncConnectionPool)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection the client opened itself (a connection or pool it was given
        stays open: it is the giver's); every later call raises ``UsageError``. Idempotent."""
        with self._lock:  # after a call in progress on the client's connection
            self._closed = True
            if self._own is not None and not self._inherited_own():  # a parent's is the parent's
                self._own.close()
            self._own = None

    @contextmanager
    def _connection(
        self, conn: psycopg.Connection[Any] | None, wake: bool = False
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection in a transaction for one call. ``wake``: the call may queue runs, and
        on the client's own connection their NOTIFY is sent after the commit (``DEFER_WAKE``)."""
        self._check_open()
        if conn is not None:  # the caller's transaction, the call in a savepoint of it
            conn = self._callers(conn)
            with _one_call_on(conn):
                _check_transaction(conn)
                if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                    conn.execute("SELECT")  # begins the caller's transaction: the savepoint is inside
                with conn.transaction():
                    yield conn
        elif self._pool is not None:
            with self._pool.connection() as pooled, pooled.transaction():
                yield pooled
        elif self._conn is not None:
            with self._lock, _one_call_on(self._conn):  # one call at a time on a shared connection
                _check_transaction(self._conn)
                with self._conn.transaction():
                    yield self._conn
        else:
            with self._lock:
                self._check_open()  # again under the lock: a close() on another thread came first
                if not self._own_ready():
                    assert self._conninfo is not None
                    opened = psycopg.connect(
                        self._conninfo, autocommit=True, application_name=self.application_name
                    )
                    try:
                        pooled = prepare(opened)
                    except BaseException:  # interrupted: a connection half set up is never used
                        opened.close()
                        raise
                    self._own, self._own_pid, self._own_pooled = opened, os.getpid(), pooled
                own = self._own
                assert own is not None
                with _committed(own, wake and not self._own_pooled):
                    yield own

    def _send(self, call: _Call[_R], conn: psycopg.Connection[Any] | None) -> _R:
        wake = call.function in instrumentation.ENQUEUING
        with (
            translate_errors(_session(self, call)) as session,
            self._connection(conn, wake) as c,
            _cursor(c) as cur,
        ):
            session.info = c.info
            with call.trace_context() as trace_context:
                # The setting is transaction-local: both statements in one transaction, the
                # caller's when one is open (a non-autocommit connection always has one).
                with c.transaction() if trace_context and c.autocommit else nullcontext():
                    if trace_context:
                        cur.execute(instrumentation.SET_TRACE_CONTEXT, (trace_context,))
                    with call.adapting(c.info):
                        cur.execute(call.query, call.params, prepare=_prepare(c), binary=True)
                    rows = cur.fetchall()
                    if trace_context:
                        cur.execute(instrumentation.SET_TRACE_CONTEXT, ("",))
        return call.result(rows)

    @_takes(EnqueueOptions)
    def enqueue(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Run:
        """Queue an ad-hoc run of ``kind`` (jobs.enqueue). ``run_at``: an aware datetime, or a
        naive one with ``tz=`` (an IANA name); default now. Durations: seconds or timedelta.
        Returns the run (the existing one when an idempotency or unique key matched)."""
        return self._send(_enqueue(kind, payload, options), conn)

    @_takes(EnqueueManyOptions)
    def enqueue_many(
        self,
        kind: str,
        payloads: Iterable[Mapping[str, Any]],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[EnqueueManyOptions],
    ) -> list[Run]:
        """Queue one run of ``kind`` per payload in one statement and one NOTIFY
        (jobs.enqueue_many); the other arguments apply to every run. Returns the runs."""
        return self._send(_enqueue_many(kind, payloads, options), conn)

    def run_now(
        self,
        name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> Run:
        """Queue a run of the named definition now, optionally with another payload (jobs.run_now)."""
        return self._send(_run_now(name, payload), conn)

    def cancel(self, run_id: int, *, conn: psycopg.Connection[Any] | None = None) -> str:
        """Cancel a run (jobs.cancel): QUEUED -> CANCELLED at once, RUNNING -> cancel requested.
        Returns the run's status after the call."""
        return self._send(_cancel(run_id), conn)

    def retry(self, run_id: int, *, conn: psycopg.Connection[Any] | None = None) -> Run:
        """Queue a FAILED or CANCELLED run again now as its next attempt, whatever its retry
        policy says (jobs.retry). Returns the new run; ``InvalidArgument`` when the run cannot
        be retried (it is not finished, or was retried already), ``NotFound`` if there is none."""
        return self._send(_retry(run_id), conn)

    @_takes(DefineOptions)
    def define(
        self,
        name: str,
        kind: str,
        schedule: str | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[DefineOptions],
    ) -> Definition:
        """Create or replace the definition ``name`` (jobs.define): recurring with ``schedule``
        (RRULE or cron, read in ``timezone``) or one-shot with ``run_at`` (aware, or naive and
        read in an explicitly given ``timezone``)."""
        return self._send(_define(name, kind, schedule, options), conn)

    def pause_queue(self, name: str, *, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Stop claiming from the queue ``name`` (jobs.pause_queue); RUNNING runs finish.
        False if it was paused already."""
        return self._send(_queue_switch("pause_queue", name), conn)

    def resume_queue(self, name: str, *, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Claim from the queue ``name`` again (jobs.resume_queue). False if it was not paused."""
        return self._send(_queue_switch("resume_queue", name), conn)

    def get_run(self, run_id: int, *, conn: psycopg.Connection[Any] | None = None) -> Run:
        """The run ``run_id`` as it is now; ``NotFound`` if there is none."""
        return self._send(_get_run(run_id), conn)


@asynccontextmanager
async def _async_null() -> AsyncIterator[None]:
    yield


# -- the async client ------------------------------------------------------------------


class AsyncClient(_Source[psycopg.AsyncConnection[Any], AsyncConnectionPool[Any]]):
    """``Client`` for asyncio code, over a conninfo string, a ``psycopg.AsyncConnection`` or a
    ``psycopg_pool.AsyncConnectionPool``; the same methods, awaited, with the same
    transaction rules (``conn=`` takes an ``AsyncConnection``)."""

    _accepts = (psycopg.AsyncConnection, AsyncConnectionPool)
    _new_lock = asyncio.Lock
    _lock: asyncio.Lock
    _lock_loop: weakref.ReferenceType[asyncio.AbstractEventLoop] | None = None
    _other = "Client for sync connections and pools", (psycopg.Connection, ConnectionPool)

    _users = 0  # calls in progress on the client's connection, all from the loop of _lock_loop
    _users_lock = threading.Lock()

    @asynccontextmanager
    async def _loop_lock(self) -> AsyncIterator[None]:
        """One call at a time on the client's connection. An asyncio.Lock belongs to the loop
        it first waited in, and one client may serve one loop after another (a module-level
        client under ``asyncio.run`` per call, or a test loop per test): each loop gets a new
        one. Two loops at once (two threads) would drive one connection together: the second
        is refused with ``UsageError`` rather than left to hang."""
        loop = asyncio.get_running_loop()
        with AsyncClient._users_lock:
            owner = self._lock_loop() if self._lock_loop is not None else None
            if self._users and owner is not loop:
                raise UsageError(
                    "this AsyncClient's connection is in use by another event loop (another thread):"
                    " give each loop its own AsyncClient, or a pool per loop"
                )
            if owner is not loop:
                self._lock, self._lock_loop = asyncio.Lock(), weakref.ref(loop)
            self._users += 1
            lock = self._lock
        try:
            async with lock:
                yield
        finally:
            with AsyncClient._users_lock:
                self._users -= 1

    def _forked(self) -> None:
        super()._forked()
        self._users, self._lock_loop = 0, None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """See ``Client.close``."""
        async with self._loop_lock():  # after a call in progress on the client's connection
            self._closed = True
            if self._own is not None and not self._inherited_own():  # a parent's is the parent's
                await self._own.close()
            self._own = None

    @asynccontextmanager
    async def _connection(
        self, conn: psycopg.AsyncConnection[Any] | None, wake: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        self._check_open()
        if conn is not None:  # the caller's transaction, the call in a savepoint of it
            conn = self._callers(conn)
            async with _one_call_on_async(conn):
                _check_transaction(conn)
                if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                    await conn.execute("SELECT")  # begins the caller's transaction: the savepoint is inside
                async with conn.transaction():
                    yield conn
        elif self._pool is not None:
            async with self._pool.connection() as pooled, pooled.transaction():
                yield pooled
        elif self._conn is not None:
            async with self._loop_lock(), _one_call_on_async(self._conn):  # one call at a time
                _check_transaction(self._conn)
                async with self._conn.transaction():
                    yield self._conn
        else:
            async with self._loop_lock():
                self._check_open()  # again under the lock: a close() in another task came first
                if not self._own_ready():
                    assert self._conninfo is not None
                    opened = await psycopg.AsyncConnection.connect(
                        self._conninfo, autocommit=True, application_name=self.application_name
                    )
                    try:
                        pooled = await prepare_async(opened)
                    except BaseException:  # cancelled: never used half set up (see Client)
                        await opened.close()
                        raise
                    self._own, self._own_pid, self._own_pooled = opened, os.getpid(), pooled
                own = self._own
                assert own is not None
                async with _committed_async(own, wake and not self._own_pooled):
                    yield own

    async def _send(self, call: _Call[_R], conn: psycopg.AsyncConnection[Any] | None) -> _R:
        wake = call.function in instrumentation.ENQUEUING
        with translate_errors(_session(self, call)) as session:
            async with (
                self._connection(conn, wake) as c,
                _cursor_async(c) as cur,
            ):
                session.info = c.info
                with call.trace_context() as trace_context:
                    async with c.transaction() if trace_context and c.autocommit else _async_null():
                        if trace_context:  # see Client._send
                            await cur.execute(instrumentation.SET_TRACE_CONTEXT, (trace_context,))
                        with call.adapting(c.info):
                            await cur.execute(call.query, call.params, prepare=_prepare(c), binary=True)
                        rows = await cur.fetchall()
                        if trace_context:
                            await cur.execute(instrumentation.SET_TRACE_CONTEXT, ("",))
        return call.result(rows)

    @_takes(EnqueueOptions)
    async def enqueue(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Run:
        """See ``Client.enqueue``."""
        return await self._send(_enqueue(kind, payload, options), conn)

    @_takes(EnqueueManyOptions)
    async def enqueue_many(
        self,
        kind: str,
        payloads: Iterable[Mapping[str, Any]],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueManyOptions],
    ) -> list[Run]:
        """See ``Client.enqueue_many``."""
        return await self._send(_enqueue_many(kind, payloads, options), conn)

    async def run_now(
        self,
        name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Run:
        """See ``Client.run_now``."""
        return await self._send(_run_now(name, payload), conn)

    async def cancel(self, run_id: int, *, conn: psycopg.AsyncConnection[Any] | None = None) -> str:
        """See ``Client.cancel``."""
        return await self._send(_cancel(run_id), conn)

    async def retry(self, run_id: int, *, conn: psycopg.AsyncConnection[Any] | None = None) -> Run:
        """See ``Client.retry``."""
        return await self._send(_retry(run_id), conn)

    @_takes(DefineOptions)
    async def define(
        self,
        name: str,
        kind: str,
        schedule: str | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[DefineOptions],
    ) -> Definition:
        """See ``Client.define``."""
        return await self._send(_define(name, kind, schedule, options), conn)

    async def pause_queue(self, name: str, *, conn: psycopg.AsyncConnection[Any] | None = None) -> bool:
        """See ``Client.pause_queue``."""
        return await self._send(_queue_switch("pause_queue", name), conn)

    async def resume_queue(self, name: str, *, conn: psycopg.AsyncConnection[Any] | None = None) -> bool:
        """See ``Client.resume_queue``."""
        return await self._send(_queue_switch("resume_queue", name), conn)

    async def get_run(self, run_id: int, *, conn: psycopg.AsyncConnection[Any] | None = None) -> Run:
        """See ``Client.get_run``."""
        return await self._send(_get_run(run_id), conn)


os.register_at_fork(after_in_child=_after_fork_in_child)
