"""Times as the dashboard shows them: UTC, a definition's local time, DST marks.

Occurrences come from ``pgtick.schedule`` (the same code the scheduler runs, with the
same anchor); this module only labels them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from pgtick.schedule import Schedule, ScheduleError, parse_schedule, preview
from pgtick.scheduler import anchor_for

#: What the scheduler does with wall times DST makes missing or double (pgtick.schedule).
BUILTIN_DST_POLICY = {"dst_gap": "end", "dst_repeat": "first"}

_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Occurrence:
    local: datetime
    utc: datetime | None  # None: a wall time the DST policy skipped
    marks: tuple[str, ...]


def offset_text(moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}"


def dst_marks(local: datetime, previous: datetime | None) -> tuple[str, ...]:
    """Why this occurrence's local time deserves a look: moved out of a gap, in a repeated
    hour, or on the other side of an offset change from the previous occurrence."""
    zone = local.tzinfo
    assert zone is not None
    marks = []
    before = (local.astimezone(UTC) - _SECOND).astimezone(zone)
    if before.utcoffset() != local.utcoffset() and (before.utcoffset() or timedelta(0)) < (
        local.utcoffset() or timedelta(0)
    ):
        marks.append("at the end of the spring-forward gap (a wall time inside the gap runs here)")
    wall = local.replace(tzinfo=None)
    first = wall.replace(tzinfo=zone, fold=0).utcoffset()
    second = wall.replace(tzinfo=zone, fold=1).utcoffset()
    if first != second:
        marks.append("in the repeated hour (this wall time happens twice)")
    if previous is not None and previous.utcoffset() != local.utcoffset():
        marks.append(f"UTC offset changed {offset_text(previous)} → {offset_text(local)}")
    return tuple(marks)


def occurrences(
    schedule_text: str,
    timezone: str,
    *,
    after: datetime,
    count: int,
    created_at: datetime | None = None,
    policy: tuple[str | None, str | None] = (None, None),
) -> list[Occurrence]:
    """The next `count` occurrences after `after`, labelled; raises ScheduleError on a bad rule.

    With `created_at` (a stored definition) the anchor is the scheduler's; without it,
    a DTSTART-less RRULE starts at local midnight of `after`'s day. `policy` is the
    definition's (dst_gap, dst_repeat) where the schedule module takes one.
    """
    schedule = _parsed(schedule_text, timezone, anchor_for(created_at or after, timezone), policy)
    zone = ZoneInfo(timezone)
    out: list[Occurrence] = []
    previous: datetime | None = None
    for item in preview(schedule, after, count):
        if isinstance(item, tuple):  # (local, utc) pairs
            local, utc = item
            own: tuple[str, ...] = ()
        else:  # Occurrence(wall, at, dst): the schedule module marks DST itself
            if item.at is None:
                wall = item.wall.replace(tzinfo=zone) if item.wall.tzinfo is None else item.wall
                out.append(Occurrence(wall, None, (f"DST gap: {item.dst or 'skipped'}",)))
                continue
            utc = item.at
            local = utc.astimezone(zone)
            own = (f"DST: {item.dst}",) if item.dst else ()
        marks = own or dst_marks(local, previous)
        if own and previous is not None and previous.utcoffset() != local.utcoffset():
            marks += (f"UTC offset changed {offset_text(previous)} → {offset_text(local)}",)
        out.append(Occurrence(local, utc, marks))
        previous = local
    return out


@lru_cache(maxsize=2048)
def _parsed(
    schedule_text: str, timezone: str, anchor: datetime, policy: tuple[str | None, str | None]
) -> Schedule:
    gap, repeat = policy
    extra = {k: v for k, v in (("dst_gap", gap), ("dst_repeat", repeat)) if v is not None}
    return parse_schedule(schedule_text, timezone, anchor=anchor, **extra)


def next_occurrence(
    schedule_text: str,
    timezone: str,
    created_at: datetime,
    after: datetime,
    policy: tuple[str | None, str | None] = (None, None),
) -> Occurrence | None:
    """The definition's next run after `after`, labelled; None if none or unreadable."""
    try:
        found = occurrences(
            schedule_text, timezone, after=after, count=2, created_at=created_at, policy=policy
        )
    except (ScheduleError, ValueError, LookupError):
        return None
    runs = [o for o in found if o.utc is not None]
    if not runs:
        return None
    first = runs[0]
    now_offset = after.astimezone(first.local.tzinfo).utcoffset()
    if now_offset != first.local.utcoffset() and not first.marks:
        change = f"UTC offset changes before it: {offset_text(after.astimezone(first.local.tzinfo))} → "
        return Occurrence(first.local, first.utc, (change + offset_text(first.local),))
    return first


def labelled(run: datetime, timezone: str, now: datetime) -> Occurrence:
    """A stored run time in its definition's zone, marked when DST moves the offset before it."""
    zone = ZoneInfo(timezone)
    local = run.astimezone(zone)
    marks = dst_marks(local, now.astimezone(zone))
    return Occurrence(local, run, tuple(m.replace("changed", "changes before it:") for m in marks))


__all__ = [
    "BUILTIN_DST_POLICY",
    "Occurrence",
    "ScheduleError",
    "dst_marks",
    "labelled",
    "next_occurrence",
    "occurrences",
    "offset_text",
]
