"""Times as the dashboard shows them: UTC, a definition's local time, DST marks.

Occurrences come from ``pgtick.schedule`` (the same code the scheduler runs, with the
same anchor); this module only labels them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from pgtick.schedule import Schedule, ScheduleError, anchor_for, parse_schedule, preview
from pgtick.schedule.preview import SKIPPED_RANGE
from pgtick.schedule.zones import MAX_TRANSITION

#: A definition's stored DST policy, (dst_gap, dst_repeat); None is auto.
Policy = tuple[str | None, str | None]
#: A stored definition's schedule as the scheduler reads it: (text, created_at, policy).
ScheduleRef = tuple[str, datetime, Policy]

#: How an occurrence's DST mark from pgtick.schedule reads on a page.
_MARKS = {
    "moved": "DST gap: moved ({gap})",
    "skipped": "DST gap: skipped",
    "doubled": "DST repeat: runs at both readings",
    "first of two": "DST repeat: first of two",
    "second of two": "DST repeat: second of two",
}


@dataclass(frozen=True)
class Occurrence:
    local: datetime
    utc: datetime | None  # None: a wall time the DST policy skipped
    marks: tuple[str, ...]
    until: datetime | None = None  # skipped: the last of consecutive wall times shown as one
    walls: int = 1  # skipped: how many wall times this row stands for


def offset_text(moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}"


def occurrences(
    schedule_text: str,
    timezone: str,
    *,
    after: datetime,
    count: int,
    created_at: datetime | None = None,
    policy: Policy = (None, None),
    deadline: float | None = None,
) -> list[Occurrence]:
    """The next `count` occurrences after `after`, labelled; raises ScheduleError on a bad rule.
    Fewer when the `deadline` (``time.monotonic()``) passes first.

    With `created_at` (a stored definition) the anchor is the scheduler's; without it,
    a DTSTART-less RRULE starts at local midnight of `after`'s day. `policy` is the
    definition's stored (dst_gap, dst_repeat), None for auto, as the scheduler reads it.
    Wall times the policy skips are listed with `utc` None.
    """
    schedule = _parsed(schedule_text, timezone, anchor_for(created_at or after, timezone), policy)
    zone = schedule.zone
    out: list[Occurrence] = []
    previous: datetime | None = None
    for item in preview(schedule, after, count, deadline):
        mark = _MARKS[item.dst].format(gap=schedule.policy.gap) if item.dst else None
        if item.at is None:
            out.append(Occurrence(item.wall.replace(tzinfo=zone), None, (mark or _MARKS["skipped"],)))
            continue
        local = item.at.astimezone(zone)
        marks: tuple[str, ...] = (mark,) if mark else ()
        if previous is not None and previous.utcoffset() != local.utcoffset():
            marks += (f"UTC offset changed {offset_text(previous)} → {offset_text(local)}",)
        out.append(Occurrence(local, item.at, marks))
        previous = local
    return _skipped_ranges(out)


def policy_text(schedule_text: str, timezone: str, *, after: datetime, policy: Policy = (None, None)) -> str:
    """The effective DST policy of a schedule previewed from `after`, as ``pgtick preview``
    heads its list: ``dst_gap=shift (auto) dst_repeat=both``."""
    return _parsed(schedule_text, timezone, anchor_for(after, timezone), policy).policy.describe()


def _skipped_ranges(found: list[Occurrence]) -> list[Occurrence]:
    """Consecutive skipped wall times, `SKIPPED_RANGE` or more, as one row from the first to
    the last (as ``pgtick preview`` prints them): a rule of minutes crossing a spring-forward
    hour would otherwise list sixty."""
    out: list[Occurrence] = []
    group: list[Occurrence] = []
    for item in [*found, None]:
        if item is not None and item.utc is None and (not group or group[0].marks == item.marks):
            group.append(item)
            continue
        if len(group) >= SKIPPED_RANGE:
            out.append(replace(group[0], until=group[-1].local, walls=len(group)))
        else:
            out += group
        group = [item] if item is not None and item.utc is None else []
        if item is not None and item.utc is not None:
            out.append(item)
    return out


@lru_cache(maxsize=2048)
def _parsed(schedule_text: str, timezone: str, anchor: datetime, policy: Policy) -> Schedule:
    gap, repeat = policy
    return parse_schedule(schedule_text, timezone, anchor=anchor, dst_gap=gap, dst_repeat=repeat)


def next_occurrence(
    schedule_text: str,
    timezone: str,
    created_at: datetime,
    after: datetime,
    policy: Policy = (None, None),
) -> Occurrence | None:
    """The definition's next run after `after`, labelled; None if none or unreadable."""
    try:
        found = occurrences(
            schedule_text, timezone, after=after, count=2, created_at=created_at, policy=policy
        )
    except (ScheduleError, ValueError, LookupError, OverflowError):
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


def delayed(found: list[Occurrence], offsets: list[timedelta]) -> list[Occurrence]:
    """Occurrences as their runs start: each run (`offsets` in order: the definition's
    jobs.jitter_offset of each) later by its jitter, marked with it, as ``pgtick preview
    --definition`` shows them; skipped wall times stay as they are."""
    delays = iter(offsets)
    out: list[Occurrence] = []
    for item in found:
        delay = next(delays) if item.utc is not None else timedelta(0)
        if item.utc is None or not delay:
            out.append(item)
            continue
        start = item.utc + delay
        mark = f"jitter +{int(delay.total_seconds())}s"
        out.append(Occurrence(start.astimezone(item.local.tzinfo), start, (*item.marks, mark)))
    return out


def labelled(run: datetime, timezone: str, now: datetime, schedule: ScheduleRef | None = None) -> Occurrence:
    """A stored run time in its definition's zone, marked as the upcoming runs are: when it is
    an occurrence of the definition's `schedule` that DST moved or that falls in a repeated
    hour, with the schedule module's mark (moved by the gap, which reading of the hour); else
    when the instant is in a repeated hour; and when the UTC offset changes before it."""
    zone = ZoneInfo(timezone)
    local = run.astimezone(zone)
    marks: list[str] = []
    mark = _schedule_mark(run, timezone, schedule) if schedule is not None else None
    if mark is not None:
        marks.append(mark)
    elif _in_repeated_hour(local):
        marks.append("in the repeated hour (this wall time happens twice)")
    current = now.astimezone(zone)
    if current.utcoffset() != local.utcoffset():
        marks.append(f"UTC offset changes before it: {offset_text(current)} → {offset_text(local)}")
    return Occurrence(local, run, tuple(marks))


def _in_repeated_hour(local: datetime) -> bool:
    wall = local.replace(tzinfo=None)
    return bool(
        wall.replace(tzinfo=local.tzinfo, fold=0).utcoffset()
        != wall.replace(tzinfo=local.tzinfo, fold=1).utcoffset()
    )


def _schedule_mark(run: datetime, timezone: str, schedule: ScheduleRef) -> str | None:
    """The schedule module's DST mark of the occurrence that runs at `run`, as the upcoming
    runs show it; None when `run` is no such occurrence (a jittered start, a run queued by
    hand) or DST did nothing to it. The schedule is read only near a change of the zone's
    UTC offset, where an occurrence can carry a mark."""
    zone = ZoneInfo(timezone)
    offset = run.astimezone(zone).utcoffset()
    try:
        near = any(
            (run + step).astimezone(zone).utcoffset() != offset for step in (-MAX_TRANSITION, MAX_TRANSITION)
        )
    except OverflowError:
        return None
    if not near:
        return None
    text, created_at, policy = schedule
    try:
        parsed = _parsed(text, timezone, anchor_for(created_at, timezone), policy)
        found = next(parsed.occurrences(run, inclusive=True), None)
    except (ScheduleError, ValueError, LookupError, OverflowError):
        return None
    if found is None or found.at != run or found.dst is None:
        return None
    return _MARKS[found.dst].format(gap=parsed.policy.gap)


__all__ = [
    "Occurrence",
    "Policy",
    "ScheduleError",
    "ScheduleRef",
    "delayed",
    "labelled",
    "next_occurrence",
    "occurrences",
    "offset_text",
    "policy_text",
]
