"""``pgtick preview``: the next occurrences as the scheduler will materialize them.

Each line shows local time, UTC and what DST did to the occurrence; the header names
the anchor and the effective DST policy, so a preview can be checked against a run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from pgtick.schedule.occurrences import Occurrence, Schedule
from pgtick.schedule.zones import strftime

_MARKS = {
    "moved": "DST gap: moved ({gap})",
    "skipped": "DST gap: skipped",
    "doubled": "DST repeat: doubled",
    "first of two": "DST repeat: first of two",
    "second of two": "DST repeat: second of two",
}


def preview(
    schedule: Schedule, after: datetime, count: int, deadline: float | None = None
) -> list[Occurrence]:
    """The next `count` occurrences after `after`, with the ones DST skipped in between; fewer
    when the `deadline` (a ``time.monotonic()`` instant) passes first (a sparse rule can take
    seconds between two occurrences)."""
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    found: list[Occurrence] = []
    runs = 0
    for occurrence in schedule.occurrences(after, include_skipped=True):
        if runs >= count:
            break
        found.append(occurrence)
        runs += occurrence.at is not None
        if deadline is not None and time.monotonic() >= deadline:
            break
    return found


def format_offset(offset: timedelta | None) -> str:
    """``+02:00``, ``-03:30``, ``-04:56:02`` (an offset of seconds: local mean time)."""
    seconds = int(offset.total_seconds()) if offset is not None else 0
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")


#: Consecutive wall times a gap skipped from which the text shows them as one range: a rule of
#: minutes crossing a spring-forward hour would otherwise print sixty lines, one of seconds 3,600.
SKIPPED_RANGE = 3


def _with_gaps(occurrences: Sequence[Occurrence]) -> list[tuple[Occurrence, list[datetime]]]:
    """The occurrences, each with the wall times it stands for: a run of `SKIPPED_RANGE` or
    more consecutive skipped wall times becomes its first, standing for all of them."""
    groups: list[list[Occurrence]] = []
    for occurrence in occurrences:
        if occurrence.at is None and groups and groups[-1][-1].at is None:
            groups[-1].append(occurrence)
        else:
            groups.append([occurrence])
    out: list[tuple[Occurrence, list[datetime]]] = []
    for group in groups:
        if len(group) >= SKIPPED_RANGE:
            out.append((group[0], [o.wall for o in group]))
        else:
            out += [(o, [o.wall]) for o in group]
    return out


def _skipped_stamp(walls: Sequence[datetime], seconds: bool) -> str:
    """``2026-03-08 02:00 Sun (wall time)``, or for a range of skipped wall times
    ``2026-03-08 02:00 Sun to 02:59 (60 wall times)`` (the last one's date too when it differs)."""
    first, last = walls[0], walls[-1]
    if len(walls) == 1:
        return f"{_stamp(first, seconds)} (wall time)"
    clock = "%H:%M:%S" if seconds or last.second else "%H:%M"
    until = strftime(last, clock) if last.date() == first.date() else _stamp(last, seconds)
    return f"{_stamp(first, seconds)} to {until} ({len(walls)} wall times)"


def _stamp(moment: datetime, seconds: bool = False) -> str:
    """``2026-03-08 03:30 Sun``; with the seconds when ``seconds`` or the moment has some."""
    return strftime(moment, "%Y-%m-%d %H:%M:%S %a" if seconds or moment.second else "%Y-%m-%d %H:%M %a")


#: A DTSTART line in RRULE text: the rule starts there, not at the anchor.
_STARTED = re.compile(r"^\s*DTSTART\b", re.IGNORECASE | re.MULTILINE)


def header(schedule: Schedule, *, anchor_note: str) -> list[str]:
    """Lines that say how the preview was computed: anchor (for RRULE) and DST policy."""
    lines = []
    if schedule.kind == "rrule" and _STARTED.search(schedule.text):
        lines.append("anchor: none (the rule's DTSTART starts it)")
    elif schedule.kind == "rrule":
        lines.append(f"anchor: {schedule.anchor.isoformat()} ({anchor_note})")
    lines.append(f"dst: {schedule.policy.describe()}")
    return lines


def format_preview(
    schedule: Schedule,
    after: datetime,
    count: int,
    *,
    delay: Callable[[Sequence[datetime]], Sequence[timedelta]] | None = None,
) -> list[str]:
    """`preview` as text, one line per occurrence, local time first, e.g.

    ``2026-03-08 03:30 Sun EDT (-04:00)  2026-03-08T07:30:00Z  DST gap: moved (shift)``

    `delay` maps run instants to their jitter (the database computes it for a stored
    definition); a delayed run shows where it will actually start.
    """
    occurrences = preview(schedule, after, count)
    runs = [o.at for o in occurrences if o.at is not None]
    delays = list(delay(runs)) if delay is not None and runs else [timedelta(0)] * len(runs)
    by_run = dict(zip(runs, delays, strict=True))
    starts = {at: (at + by_run[at]).astimezone(schedule.zone) for at in runs}
    walls = [o.wall for o in occurrences if o.at is None]
    # One layout for every line, so that a column does not move where the zone's
    # abbreviation changes length (EET, EEST) or one time has seconds and another not.
    seconds = any(moment.second for moment in [*starts.values(), *walls])
    abbreviation = max((len(local.tzname() or "") for local in starts.values()), default=0)
    rows: list[tuple[str, str, str]] = []
    for occurrence, gap in _with_gaps(occurrences):
        mark = _MARKS[occurrence.dst].format(gap=schedule.policy.gap) if occurrence.dst else ""
        if occurrence.at is None:
            rows.append((_skipped_stamp(gap, seconds), "-", mark))
            continue
        local = starts[occurrence.at]
        zone = f"{local.tzname() or '':<{abbreviation}}"
        stamp = f"{_stamp(local, seconds)} {zone} ({format_offset(local.utcoffset())})"
        extra = [mark] if mark else []
        if by_run[occurrence.at]:
            extra.append(f"jitter +{int(by_run[occurrence.at].total_seconds())}s")
        utc = strftime(occurrence.at + by_run[occurrence.at], "%Y-%m-%dT%H:%M:%SZ")
        rows.append((stamp, utc, "; ".join(extra)))
    first = max((len(row[0]) for row in rows), default=0)
    return [f"{stamp:<{first}}  {utc:<20}  {extra}".rstrip() for stamp, utc, extra in rows]
