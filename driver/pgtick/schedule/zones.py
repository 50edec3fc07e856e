"""The DST rules: how a wall time in an IANA zone becomes the instants it runs at.

A schedule is expanded in naive wall-clock time of its zone; each wall time is then
mapped to UTC here.  Most wall times exist exactly once.  Two kinds do not:

* a wall time inside a spring-forward gap does not exist.  ``dst_gap`` decides:
  ``shift`` reads it with the UTC offset from before the gap (RFC 5545 section 3.3.5:
  02:30 in New York on the change day is 03:30 EDT); ``end`` runs it at the first
  instant after the gap (03:00 EDT, as Vixie cron does); ``skip`` drops it.
* a wall time inside a fall-back overlap exists twice.  ``dst_repeat`` decides:
  ``first``, ``second`` or ``both`` (two runs, one real hour apart in New York).

``None`` means *auto*, chosen per schedule by `auto_policy`.  Everything here is pure
and works for gaps and overlaps of any length (Lord Howe shifts by 30 minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "DST_GAPS",
    "DST_REPEATS",
    "DstPolicy",
    "ScheduleError",
    "WallTimeRuns",
    "auto_policy",
    "load_place_zone",
    "load_zone",
    "not_a_place",
    "resolve_policy",
    "runs_of_wall_time",
]

DstGap = Literal["shift", "end", "skip"]
DstRepeat = Literal["first", "second", "both"]
DST_GAPS: tuple[DstGap, ...] = ("shift", "end", "skip")
DST_REPEATS: tuple[DstRepeat, ...] = ("first", "second", "both")

#: What a DST mark on an occurrence says: moved by a gap, skipped in a gap, or one of
#: the two readings of a repeated wall time (``doubled`` when both run).
DstMark = Literal["moved", "skipped", "doubled", "first of two", "second of two"]

# The largest UTC offset change any zone has made at once: a day, when Pacific/Apia (2011),
# Pacific/Fakaofo (2011) and Pacific/Kwajalein (1993) moved across the date line, with a
# margin. Summer time moves an hour or two, and a search backs up this far only near one.
MAX_TRANSITION = timedelta(hours=26)
_ONE_SECOND = timedelta(seconds=1)
_LAST_WALL_TIME = datetime.max.replace(microsecond=0)


class ScheduleError(ValueError):
    """A schedule text or time zone that cannot be used; the message names the bad part."""

    def __init__(self, detail: str, *, definition: str | None = None) -> None:
        self.detail = detail
        self.definition = definition
        prefix = "schedule" if definition is None else f"definition={definition} schedule"
        super().__init__(f"{prefix}: {detail}")


class DstChoice(TypedDict, total=False):
    """The DST policy a definition chooses, as the SQL API takes it (None or absent: auto)."""

    dst_gap: str | None
    dst_repeat: str | None


@dataclass(frozen=True)
class DstPolicy:
    """The effective DST policy of a schedule and whether each half was chosen by auto."""

    gap: DstGap
    repeat: DstRepeat
    gap_auto: bool = False
    repeat_auto: bool = False

    def describe(self) -> str:
        """``dst_gap=shift (auto) dst_repeat=first (auto)``"""
        gap = f"dst_gap={self.gap}" + (" (auto)" if self.gap_auto else "")
        return gap + f" dst_repeat={self.repeat}" + (" (auto)" if self.repeat_auto else "")


def auto_policy(*, follows_real_time: bool, kind: Literal["rrule", "cron"]) -> tuple[DstGap, DstRepeat]:
    """What *auto* picks.

    Schedules that follow real time (cron whose minute or hour field starts with ``*``,
    RRULE with FREQ=HOURLY, MINUTELY or SECONDLY) skip the gap and run both readings of
    a repeated hour, so they run every real hour through both changes.  Fixed-time cron
    follows Vixie cron (gap end, first reading); DAILY-and-coarser RRULE follows RFC 5545
    (shift, first reading).
    """
    if follows_real_time:
        return "skip", "both"
    return ("end", "first") if kind == "cron" else ("shift", "first")


def resolve_policy(
    gap: str | None, repeat: str | None, *, follows_real_time: bool, kind: Literal["rrule", "cron"]
) -> DstPolicy:
    """Explicit values win; None is auto.  Unknown values raise ScheduleError."""
    if gap is not None and gap not in DST_GAPS:
        raise ScheduleError(f"dst_gap must be shift, end or skip, got {gap!r}")
    if repeat is not None and repeat not in DST_REPEATS:
        raise ScheduleError(f"dst_repeat must be first, second or both, got {repeat!r}")
    auto_gap, auto_repeat = auto_policy(follows_real_time=follows_real_time, kind=kind)
    return DstPolicy(
        gap=auto_gap if gap is None else gap,
        repeat=auto_repeat if repeat is None else repeat,
        gap_auto=gap is None,
        repeat_auto=repeat is None,
    )


def load_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {name!r}") from None


#: Names in the time zone database that are no place: the host's own zone (each host reads
#: its own), the placeholder, and the rules file.
_NOT_PLACES = frozenset({"localtime", "Factory", "posixrules"})
#: Zones with daylight saving time whose names PostgreSQL also reads as the abbreviation of a
#: fixed offset (its default timezone_abbreviations): in SQL, 'CET' is +01 all year round.
_FIXED_OFFSET_NAMES = frozenset({"CET", "EET", "MET", "WET"})


def not_a_place(name: str) -> str | None:
    """Why a zone name that may load names no place (the host's ``localtime``, ``Factory``,
    the ``posix/`` and ``right/`` copies of every zone: ``right/`` counts leap seconds) or
    is read by PostgreSQL as a fixed offset (``CET``),
    with the name to give instead; None for a place's zone. The database refuses the same
    names for a definition (``jobs._zone_problem``)."""
    if name in _NOT_PLACES:
        return f"{name!r} is not a place's IANA time zone: give one such as Europe/Paris or America/New_York"
    if name in _FIXED_OFFSET_NAMES:
        return (
            f"{name!r} is also the abbreviation of a fixed offset, which PostgreSQL reads it as:"
            " give the region's zone instead, such as Europe/Paris or Europe/Athens"
        )
    prefix, _, rest = name.partition("/")
    if prefix in ("posix", "right") and rest:
        return f"{name!r} is not a place's IANA time zone: give one such as {rest}"
    return None


def load_place_zone(name: str) -> ZoneInfo:
    """``load_zone`` for a name a caller gives: ScheduleError also for a name of no place."""
    why = not_a_place(name)
    if why is not None:
        raise ScheduleError(why)
    return load_zone(name)


def require_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")


def wall_time(instant: datetime, zone: ZoneInfo) -> datetime:
    """Naive wall-clock time of an aware instant (OverflowError past the year 9999)."""
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def fold_offsets(wall: datetime, zone: ZoneInfo) -> tuple[timedelta, timedelta]:
    """The UTC offsets of a naive wall time's two readings (PEP 495 fold 0, then 1): equal
    when it names one instant, the first larger when the clock shows it twice, smaller when
    a gap skips it."""
    before, after = zone.utcoffset(wall), zone.utcoffset(wall.replace(fold=1))
    assert before is not None and after is not None
    return before, after


@dataclass(frozen=True)
class WallTimeRuns:
    """The instants one wall time runs at under a policy, each with its DST mark."""

    wall: datetime
    runs: tuple[tuple[datetime, DstMark | None], ...]
    earliest: datetime  # where the gap-end / first-reading mapping puts it: monotonic in wall
    skipped: bool = False  # a gap wall time dropped by dst_gap=skip


def runs_of_wall_time(wall: datetime, zone: ZoneInfo, policy: DstPolicy) -> WallTimeRuns | None:
    """Map a naive wall time to its runs; None past the year 9999.

    The UTC offsets of its two readings (PEP 495 fold) tell the cases apart: equal, the
    wall time exists once; the earlier reading's offset larger, it exists twice (the
    clock went back); smaller, it fell in a gap (the clock jumped forward).
    """
    try:
        before, after = fold_offsets(wall, zone)
        first = (wall - before).replace(tzinfo=UTC)
        if before == after:
            return WallTimeRuns(wall, ((first, None),), first)
        if before > after:  # exists twice
            second = (wall - after).replace(tzinfo=UTC)
            if policy.repeat == "first":
                runs: tuple[tuple[datetime, DstMark | None], ...] = ((first, "first of two"),)
            elif policy.repeat == "second":
                runs = ((second, "second of two"),)
            else:
                runs = ((first, "doubled"), (second, "doubled"))
            return WallTimeRuns(wall, runs, first)
        # In a gap: `first` reads it with the offset before the gap (the later instant).
        end = gap_end(wall, zone)
        if policy.gap == "shift":
            return WallTimeRuns(wall, ((first, "moved"),), end)
        if policy.gap == "end":
            return WallTimeRuns(wall, ((end, "moved"),), end)
        return WallTimeRuns(wall, (), end, skipped=True)
    except OverflowError:
        return None


def reading_of(instant: datetime, zone: ZoneInfo) -> DstMark | None:
    """Which reading of its wall time an instant is, when the clock shows that time twice."""
    local = instant.astimezone(zone)
    other = local.replace(fold=1 - local.fold)
    if other.utcoffset() == local.utcoffset():
        return None
    return "second of two" if local.fold else "first of two"


def earliest_run(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The gap-end / first-reading instant of a wall time: later wall times never map earlier."""
    try:
        before, after = fold_offsets(wall, zone)
        if before >= after:
            return (wall - before).replace(tzinfo=UTC)
        return gap_end(wall, zone)
    except OverflowError:
        return None


def gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the spring-forward gap that swallows `wall`.

    The two readings of a missing wall time (old and new UTC offset) bracket the
    transition; bisect on whole seconds for the first instant whose wall time has
    passed it.
    """
    readings = [wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)]
    before, after = min(readings), max(readings)
    low, high = 0, int((after - before).total_seconds())
    while high - low > 1:
        middle = (low + high) // 2
        if wall_time(before + timedelta(seconds=middle), zone) >= wall:
            high = middle
        else:
            low = middle
    return before + timedelta(seconds=high)


def latest_wall_time_until(instant: datetime, zone: ZoneInfo) -> datetime | None:
    """The latest whole-second wall time whose earliest run is at or before `instant`.

    None when every representable wall time qualifies.  Turns a UTC ``UNTIL`` into the
    naive bound dateutil needs.  ScheduleError when none does: the instant is earlier than
    the zone's first wall time, in the year 1 (``UNTIL=00010101T000000Z`` west of UTC).
    """

    def runs_by(wall: datetime) -> bool:
        run = earliest_run(wall, zone)
        return run is not None and run <= instant

    try:
        low = wall_time(instant, zone).replace(microsecond=0)
    except OverflowError:
        if instant.year > 1:  # past the last wall time: every one is before it
            return None
        first = strftime(instant, "%Y-%m-%dT%H:%M:%SZ")
        raise ScheduleError(f"no wall time of {zone.key} is at or before {first}") from None
    try:
        high = low + timedelta(days=1)
    except OverflowError:
        high = _LAST_WALL_TIME
    if runs_by(high):
        return high if high < _LAST_WALL_TIME else None
    while high - low > _ONE_SECOND:
        middle = low + timedelta(seconds=int((high - low).total_seconds()) // 2)
        if runs_by(middle):
            low = middle
        else:
            high = middle
    return low


def strftime(moment: datetime, pattern: str) -> str:
    """``moment.strftime(pattern)`` with ``%Y`` always four digits: the C library's strftime
    writes the year 1 as ``1`` (glibc), so ``0001-01-02`` would show as ``1-01-02``."""
    return moment.strftime(pattern.replace("%Y", f"{moment.year:04d}"))
