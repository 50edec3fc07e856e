"""Materialization planning: where a definition's schedule starts and what to insert now.

The anchor of a rule without DTSTART is local midnight of the day the definition was
created (`anchor_for`), for the scheduler and for ``pgtick preview --definition`` alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import time as dtime

from pgtick.schedule.occurrences import Schedule
from pgtick.schedule.zones import load_zone, require_aware

MISFIRE_POLICIES = ("catch_up", "coalesce", "skip")


def anchor_for(created_at: datetime, timezone: str) -> datetime:
    """Start of a DTSTART-less RRULE: local midnight of the day `created_at` falls on in
    `timezone`, so FREQ=DAILY;BYHOUR=8 means 08:00:00 and FREQ=HOURLY means on the hour.

    A day that starts inside a DST gap (America/Santiago) starts where the gap ends.
    """
    require_aware(created_at, "created_at")
    zone = load_zone(timezone)
    local_day = created_at.astimezone(zone).date()
    return datetime.combine(local_day, dtime(0, 0), tzinfo=zone)


@dataclass(frozen=True)
class Plan:
    """What to materialize now: run times (UTC), where to resume, how many were late.

    `missed` counts the considered occurrences older than now - misfire_grace, whatever
    the policy did with them (ran them late, coalesced them or skipped them).  `late`
    counts the considered occurrences at or before now (`first_late` .. `last_late`), so
    a catch-up is told without walking them again.  `partial`: a budget stopped the walk
    among missed occurrences, or ``catch_up`` reached its cap of runs there; `next_cursor`
    is the first one not considered, and a coalesced run is held back (a later missed
    occurrence supersedes it).
    """

    run_times: list[datetime]
    next_cursor: datetime | None
    missed: int
    late: int = field(default=0, compare=False)
    first_late: datetime | None = field(default=None, compare=False)
    last_late: datetime | None = field(default=None, compare=False)
    partial: bool = field(default=False, compare=False)


def plan_materialization(
    schedule: Schedule,
    cursor: datetime,
    now: datetime,
    *,
    misfire_policy: str,
    lookahead: timedelta,
    misfire_grace: timedelta,
    max_runs: int,
    budget: int | None = None,
    deadline: float | None = None,
) -> Plan:
    """Decide which occurrences from `cursor` up to now + lookahead to materialize.

    `cursor` is the earliest occurrence not yet materialized.  An occurrence t is due
    if cursor <= t <= now + lookahead and missed if t < now - misfire_grace.  Policies:
    ``catch_up`` runs every due occurrence; ``coalesce`` runs one run at the latest
    missed occurrence, then the due ones that are not missed; ``skip`` drops the missed
    ones.  At most `max_runs` runs are planned (a coalesced run counts as one); when
    that cap stops the plan, next_cursor is the first occurrence not taken.

    A walk over missed occurrences (after downtime: there may be millions) is bounded by
    `budget` occurrences and the `deadline` (a ``time.monotonic()`` instant): when either
    runs out among missed occurrences, the plan is `partial` and resumes from next_cursor
    (at least one occurrence is always considered, so every plan makes progress).
    """
    if misfire_policy not in MISFIRE_POLICIES:
        expected = ", ".join(MISFIRE_POLICIES)
        raise ValueError(f"unknown misfire policy {misfire_policy!r} (expected {expected})")
    if max_runs < 1:
        raise ValueError(f"max_runs must be at least 1, got {max_runs}")
    if lookahead < timedelta(0) or misfire_grace < timedelta(0):
        raise ValueError("lookahead and misfire_grace must not be negative")
    require_aware(now, "now")
    horizon = now + lookahead
    missed_before = now - misfire_grace

    run_times: list[datetime] = []
    missed = late = 0
    first_late: datetime | None = None
    last_late: datetime | None = None
    latest_missed: datetime | None = None  # waiting to be coalesced
    for found in schedule.occurrences(cursor, inclusive=True):
        occurrence = found.at
        assert occurrence is not None
        if occurrence > horizon or len(run_times) >= max_runs:
            next_cursor: datetime | None = occurrence
            partial = occurrence < missed_before  # catch_up at its cap: more missed ones follow
            break
        if occurrence < missed_before and missed and _spent(missed, budget, deadline):
            return Plan(run_times, occurrence, missed, late, first_late, last_late, partial=True)
        if occurrence <= now:
            late += 1
            first_late = first_late or occurrence
            last_late = occurrence
        if occurrence < missed_before:
            missed += 1
            if misfire_policy == "catch_up":
                run_times.append(occurrence)
            elif misfire_policy == "coalesce":
                latest_missed = occurrence
            continue
        if latest_missed is not None:
            run_times.append(latest_missed)
            latest_missed = None
            if len(run_times) >= max_runs:
                next_cursor = occurrence
                partial = False
                break
        run_times.append(occurrence)
    else:
        next_cursor = None
        partial = False
    if latest_missed is not None:
        run_times.append(latest_missed)
    return Plan(run_times, next_cursor, missed, late, first_late, last_late, partial)


def _spent(considered: int, budget: int | None, deadline: float | None) -> bool:
    """Whether a walk that considered this many missed occurrences must stop here (the
    clock is read every 256 occurrences only)."""
    if budget is not None and considered >= budget:
        return True
    return deadline is not None and considered % 256 == 0 and time.monotonic() >= deadline


def first_cursor(schedule: Schedule, now: datetime) -> datetime | None:
    """The first occurrence at or after `now`: where materialization of a new schedule starts."""
    return schedule.next_after(now, inclusive=True)
