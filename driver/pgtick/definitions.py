"""Writing definitions and retry policies: the one path the CLI and ``pgtick run`` (app sync) share.

The driver parses a schedule before it is saved (SQL checks only its shape),
so a bad one is refused with the definition and the bad part named.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import math
import re
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Unpack
from zoneinfo import ZoneInfo

import psycopg

from pgtick import calls, json_numbers
from pgtick.app import App
from pgtick.client import check_duration, read_time, unstorable_json, unstorable_text
from pgtick.errors import InvalidArgument, UsageError
from pgtick.schedule import ScheduleError, anchor_for, parse_schedule
from pgtick.schedule.zones import DstChoice, load_zone, not_a_place
from pgtick.terminal import counted

log = logging.getLogger("pgtick.definitions")

#: A line of an RFC 5545 recurrence set that adds runs: a rule or dates.
_RULE_LINE = re.compile(r"^\s*(?:RRULE|RDATE)\s*[:;]", re.IGNORECASE | re.MULTILINE)


#: What a schedule may not hold (jobs._schedule_problem): a control character but a line break
#: or a tab. Each would reach every terminal that shows the schedule.
_SCHEDULE_CONTROL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def validate_schedule(
    schedule: str, timezone: str, name: str, *, jitter: timedelta | None = None, **dst: Unpack[DstChoice]
) -> None:
    """Raise InvalidArgument (a UsageError) naming the definition and the bad part of its
    schedule: ``field`` is dst_gap, dst_repeat or jitter when one of those is wrong, else
    schedule.

    Anchored as the scheduler will anchor a definition created now.  A jitter longer than
    the spacing of the next runs, or of the runs around the zone's DST changes of the next
    two years (where a repeated hour can put two runs an hour apart), is refused: delayed
    runs could overtake or coincide."""
    now = datetime.now(UTC)
    if _SCHEDULE_CONTROL.search(schedule):  # as jobs._schedule_problem says it
        got = json.dumps(schedule[:200], ensure_ascii=False)
        raise InvalidArgument(
            f"definition={name} schedule must not contain control characters (but line breaks), got {got}",
            field="schedule",
        )
    why = not_a_place(timezone)
    if why is not None:  # the scheduler on another host would read localtime as its own zone
        raise InvalidArgument(f"definition={name} timezone {why}", field="timezone")
    try:
        load_zone(timezone)
    except ScheduleError:  # the definition's zone, not a TZID in the schedule text
        raise InvalidArgument(
            f"definition={name} timezone {timezone!r} is not a known IANA time zone name", field="timezone"
        ) from None
    try:
        parsed = parse_schedule(schedule, timezone, anchor=anchor_for(now, timezone), definition=name, **dst)
        if jitter:
            # Several rules or dates together can come close anywhere (a yearly rule an hour off
            # a daily one): such a set is sampled over its next 2,000 runs, one rule over 50.
            combined = len(_RULE_LINE.findall(schedule)) > 1
            windows = [(now, now + timedelta(days=3660), 2000 if combined else 50)]
            windows += [
                (day - timedelta(days=1), day + timedelta(days=2), 500)
                for day in _offset_changes(parsed.zone, now)
            ]
            spacing = min(
                (
                    b - a
                    for start, end, limit in windows
                    for a, b in itertools.pairwise(parsed.between(start, end, limit=limit))
                ),
                default=None,
            )
            if spacing is not None and jitter > spacing:
                raise InvalidArgument(
                    f"definition={name} jitter {jitter} is longer than the {spacing} between runs "
                    "of its schedule: delayed runs could overtake or coincide",
                    field="jitter",
                )
    except ScheduleError as exc:
        field = next((f for f in ("dst_gap", "dst_repeat") if exc.detail.startswith(f)), "schedule")
        raise InvalidArgument(str(exc), field=field) from None


def _offset_changes(zone: ZoneInfo, start: datetime, days: int = 731) -> list[datetime]:
    """The UTC midnights of the days, in the next two years, in whose first hours or the day
    before the zone's UTC offset changed (its DST changes)."""
    changes = []
    previous = start.astimezone(zone).utcoffset()
    for n in range(1, days + 1):
        day = (start + timedelta(days=n)).replace(hour=0, minute=0, second=0, microsecond=0)
        offset = day.astimezone(zone).utcoffset()
        if offset != previous:
            changes.append(day - timedelta(days=1))
        previous = offset
    return changes


def check_schedule(name: str, schedule: str, timezone: str | None, options: Mapping[str, Any]) -> None:
    """The driver's check of a recurring definition before it is saved, the same for
    ``Client.define``, ``pgtick define`` and an app's schedules: ``validate_schedule`` with
    the definition's zone (default UTC), DST choice and jitter (seconds or a timedelta; other
    values are left for the SQL API to refuse by name)."""
    jitter = options.get("jitter")
    if isinstance(jitter, bool) or not isinstance(jitter, int | float | timedelta):
        jitter = None
    validate_schedule(
        schedule,
        timezone or "UTC",
        name,
        jitter=None if jitter is None else check_duration("jitter", jitter),
        dst_gap=options.get("dst_gap"),
        dst_repeat=options.get("dst_repeat"),
    )


def define(conn: psycopg.Connection[Any], name: str, kind: str, **params: Any) -> Any:
    """jobs.define with named arguments (only those given), after the driver has
    parsed the schedule: SQL checks only its shape, the driver checks every part."""
    if params.get("schedule") is not None:
        check_schedule(name, params["schedule"], params.get("timezone"), params)
    if isinstance(params.get("payload"), dict):
        params["payload"] = json_numbers.jsonb(params["payload"])
    params["run_at"] = _run_at(name, params)
    given = {k: v for k, v in params.items() if v is not None}
    return calls.define(conn, name, kind, given)


def _run_at(name: object, params: dict[str, Any]) -> Any:
    """A definition's one-shot time as an instant: without a UTC offset it is wall time in
    the definition's zone (UTC unless given), never the session's; in a DST gap or repeat,
    read as ``read_time`` reads it by default. Values that are neither a time nor text are
    left for the SQL API to refuse by name."""
    value = params.get("run_at")
    if not isinstance(value, str | datetime):
        return value
    zone = params.get("timezone") or "UTC"
    return read_time(value, zone, field_name=f"definition={name} run_at", zone_name="timezone")


def _json_value(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _interval(conn: psycopg.Connection[Any], text: str) -> timedelta | str:
    """Interval text ("10 minutes", "00:10:00", "600") as PostgreSQL reads it, as jobs.define_many
    reads a jitter written so; the text itself when it is no interval (the SQL API refuses it
    by name)."""
    try:
        with conn.transaction():  # a savepoint when the caller's transaction is open
            value = calls.interval(conn, text)
    except psycopg.DataError:
        return text
    return text if value is None else value


def define_many(conn: psycopg.Connection[Any], definitions: list[dict[str, Any]]) -> list[Any]:
    """jobs.define_many after the driver has checked every distinct schedule once (its text,
    zone, DST choice and jitter, as ``check_schedule`` checks one definition; a jitter written
    as interval text is read by the server first, as jobs.define_many reads it)."""
    checked: set[tuple[Any, ...]] = set()
    intervals: dict[str, timedelta | str] = {}
    for d in definitions:
        schedule, zone, jitter = d.get("schedule"), d.get("timezone") or "UTC", d.get("jitter")
        if isinstance(schedule, str) and isinstance(jitter, str):
            if jitter not in intervals:
                intervals[jitter] = _interval(conn, jitter)
            jitter = intervals[jitter]
        key = (schedule, zone, d.get("dst_gap"), d.get("dst_repeat"), repr(jitter))
        if isinstance(schedule, str) and key not in checked:
            check_schedule(str(d.get("name")), schedule, zone, {**d, "jitter": jitter})
            checked.add(key)
    timed = [{**d, "run_at": _run_at(d.get("name"), d)} if "run_at" in d else d for d in definitions]
    clean = [{k: _json_value(v) for k, v in d.items() if v is not None} for d in timed]
    return calls.define_many(conn, clean)


def read_json(text: str) -> Any:
    """JSON text as PostgreSQL's jsonb takes it: no NaN or Infinity, no number past a
    double's range (a worker in Python would read it as infinity), no NUL character or lone
    surrogate in a key or string. ValueError says what is wrong ("is not valid JSON: ...").
    A number with a fraction or an exponent is a Decimal of its every digit (jsonb stores it
    so; ``json_numbers.jsonb`` writes it so), an integer an int."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"is not valid JSON: {constant} is not a JSON number")

    def finite(number: str) -> Decimal:
        if math.isinf(float(number)):
            raise ValueError(f"is not usable JSON: the number {number[:40]} is out of range")
        return Decimal(number)

    def integer(digits: str) -> int:
        # Python converts at most 4300 digits (sys.get_int_max_str_digits): a worker in Python
        # could not read the run's payload.
        if len(digits.lstrip("-")) > 4300:
            raise ValueError(
                f"is not usable JSON: the integer {digits[:20]}... has {len(digits.lstrip('-'))} digits,"
                " more than a worker in Python reads (4300)"
            )
        return int(digits)

    try:
        value = json.loads(text, parse_constant=refuse, parse_float=finite, parse_int=integer)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("is nested too deeply") from None
    except ValueError as exc:  # NaN, or an integer of more digits than Python converts
        message = str(exc)
        raise ValueError(message if message.startswith("is ") else f"is not usable JSON: {message}") from None
    why = unstorable_json(value)
    if why is not None:
        raise ValueError(f"must not contain {why}")
    return value


_INT_FIELDS = ("max_concurrent_runs", "priority", "max_attempts", "pause_after_failures")


def read_definitions(path: str) -> list[dict[str, Any]]:
    """Definitions from a file for ``pgtick define --from-file``: JSON lines (one object per
    line, the fields of jobs.define_many) or CSV with a header row of those field names
    (``.csv``; empty cells are not given, payload is JSON text, enabled true/false,
    timeouts seconds or interval text). ``-`` reads standard input as JSON lines."""
    if path == "-" and sys.stdin is None:
        raise UsageError("cannot read -: standard input is closed")
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})"
        ) from None
    text = text.removeprefix("\ufeff")  # a byte order mark, as spreadsheets write (standard input)
    if path.lower().endswith(".csv"):
        return _read_csv(text, path)
    out = []
    # Lines end at \n (or \r\n) only: str.splitlines() would also break a valid line at a
    # U+2028, U+2029 or U+0085 inside a JSON string.
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            item = read_json(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{number}: {exc}") from None
        if not isinstance(item, dict):
            raise UsageError(f"{path}:{number}: each line must be a JSON object")
        out.append(item)
    return out


def _read_csv(text: str, path: str) -> list[dict[str, Any]]:
    # strict: a quote left open at the end of the file, or text after a closing quote, is an
    # error, not text read into the cell. A record the csv module cannot read is named by the
    # line it starts on (a quoted cell may hold line breaks, an RRULE of several lines).
    reader = csv.reader(io.StringIO(text), strict=True)

    def records() -> Iterator[tuple[int, list[str]]]:
        while True:
            first = reader.line_num + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                why = str(exc)
                if why == "unexpected end of data":
                    why = "a quoted cell is not closed before the end of the file"
                raise UsageError(f"{path}:{first}: not readable as CSV: {why}") from None
            if record:  # a blank line
                yield first, record

    rows = records()
    columns = next(rows, (0, []))[1]
    unknown = sorted(set(columns) - calls.DEFINE_MANY_FIELDS)
    if unknown:
        raise UsageError(f"{path}: unknown column {unknown[0]!r}")
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise UsageError(f"{path}: column {twice[0]!r} is in the header more than once")
    out = []
    for number, record in rows:
        if len(record) > len(columns):
            raise UsageError(
                f"{path}:{number}: {len(record)} cells,"
                f" but the header names {counted(len(columns), 'column')}"
            )
        item: dict[str, Any] = {}
        for key, cell in zip(columns, record, strict=False):
            if cell == "":
                continue
            why = unstorable_text(cell)
            if why is not None:
                raise UsageError(f"{path}:{number}: {key} must not contain {why}")
            try:
                if key in _INT_FIELDS:
                    # int() also takes "1_0" and other scripts' digits: a cell is ASCII digits.
                    if not re.fullmatch(r"\s*[+-]?[0-9]{1,19}\s*", cell):
                        raise ValueError(cell)
                    item[key] = int(cell)
                elif key == "payload":
                    item[key] = read_json(cell)
                elif key == "enabled":
                    item[key] = {"true": True, "false": False}[cell.strip().lower()]
                elif key in ("timeout", "heartbeat_timeout") and re.fullmatch(r"[0-9]+(\.[0-9]+)?", cell):
                    item[key] = float(cell)
                else:
                    item[key] = cell
            except (ValueError, KeyError) as exc:
                shown = cell if len(cell) <= 40 else cell[:40] + "..."
                raise UsageError(f"{path}:{number}: bad {key} {shown!r}") from exc
        out.append(item)
    return out


def sync_app(app: App, conn: psycopg.Connection[Any]) -> None:
    """Write the app's retry policies and declared schedules (validated here first), in one
    transaction: a schedule refused leaves the policies as they were too."""
    with conn.transaction():
        _sync_app(app, conn)


def _sync_app(app: App, conn: psycopg.Connection[Any]) -> None:
    for spec in app.jobs.values():
        calls.set_retry_policy(
            conn,
            spec.kind,
            spec.retry_on,
            spec.never_retry,
            spec.max_attempts,
            spec.backoff_initial,
            spec.backoff_factor,
            spec.backoff_max,
            spec.jitter,
        )
    bulk: list[dict[str, Any]] = []
    for s in app.schedules.values():
        if s.kind not in app.jobs:
            log.warning(
                "schedule %r runs kind %r, which this app does not register: its runs wait for a"
                " worker whose app does",
                s.name,
                s.kind,
            )
        item: dict[str, Any] = {
            "name": s.name,
            "kind": s.kind,
            "schedule": s.schedule,
            "timezone": s.timezone,
        }
        item.update(run_at=s.run_at, **s.options)
        bulk.append(item)
    if bulk:
        define_many(conn, bulk)  # every schedule in one statement
