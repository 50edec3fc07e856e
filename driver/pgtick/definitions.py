"""Writing definitions and retry policies: the one path the CLI and ``pgtick run`` (app sync) share.

The driver parses a schedule before it is saved (SQL checks only its shape),
so a bad one is refused with the definition and the bad part named.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgtick import calls
from pgtick.app import App
from pgtick.errors import UsageError
from pgtick.schedule import ScheduleError, anchor_for, parse_schedule


def validate_schedule(
    schedule: str,
    timezone: str,
    name: str,
    *,
    dst_gap: str | None = None,
    dst_repeat: str | None = None,
    jitter: timedelta | None = None,
) -> None:
    """Raise UsageError naming the definition and the bad part of its schedule.

    Anchored as the scheduler will anchor a definition created now.  A jitter longer than
    the spacing of the next runs is refused: delayed runs could overtake or coincide."""
    now = datetime.now(UTC)
    try:
        parsed = parse_schedule(
            schedule,
            timezone,
            anchor=anchor_for(now, timezone),
            dst_gap=dst_gap,
            dst_repeat=dst_repeat,
            definition=name,
        )
        if jitter:
            runs = parsed.between(now, now + timedelta(days=3660), limit=50)
            spacing = min((b - a for a, b in itertools.pairwise(runs)), default=None)
            if spacing is not None and jitter > spacing:
                raise UsageError(
                    f"definition={name} jitter {jitter} is longer than the {spacing} between runs "
                    "of its schedule: delayed runs could overtake or coincide"
                )
    except ScheduleError as exc:
        raise UsageError(str(exc)) from exc


def define(conn: psycopg.Connection[Any], name: str, kind: str, **params: Any) -> Any:
    """jobs.define with named arguments (only those given), after the driver has
    parsed the schedule: SQL checks only its shape, the driver checks every part."""
    if params.get("schedule") is not None:
        validate_schedule(
            params["schedule"],
            params.get("timezone") or "UTC",
            name,
            dst_gap=params.get("dst_gap"),
            dst_repeat=params.get("dst_repeat"),
            jitter=params["jitter"] if isinstance(params.get("jitter"), timedelta) else None,
        )
    if isinstance(params.get("payload"), dict):
        params["payload"] = Jsonb(params["payload"])
    given = {k: v for k, v in params.items() if v is not None}
    return calls.define(conn, name, kind, given)


def sync_app(app: App, conn: psycopg.Connection[Any]) -> None:
    """Write the app's retry policies and declared schedules (validated here first)."""
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
    for s in app.schedules.values():
        define(
            conn,
            s.name,
            s.kind,
            schedule=s.schedule,
            timezone=s.timezone,
            run_at=s.run_at,
            **s.options,
        )
