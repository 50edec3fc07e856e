"""A parsed schedule and its occurrences: the one place that says when a schedule runs.

`parse_schedule` reads RRULE or cron text in an IANA zone with an explicit anchor (where
a rule without DTSTART starts) and a DST policy; `Schedule.occurrences` yields what it
runs, in UTC and in order.  The scheduler, ``pgtick preview``, validation and the tests
all call this, so what preview shows is what the scheduler materializes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from itertools import count, dropwhile, groupby
from typing import Literal
from zoneinfo import ZoneInfo

from pgtick.schedule.cron import parse_cron
from pgtick.schedule.rrule import DateValue, Rule, _walked, follows_real_time, parse_rrule_text
from pgtick.schedule.zones import (
    MAX_TRANSITION,
    DstMark,
    DstPolicy,
    ScheduleError,
    WallTimeRuns,
    fold_offsets,
    load_zone,
    reading_of,
    require_aware,
    resolve_policy,
    runs_of_wall_time,
    wall_time,
)

ScheduleKind = Literal["rrule", "cron"]

_ONE_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Occurrence:
    """One occurrence: the wall time the rule produced and the instant it runs at.

    `at` is None for a wall time that a ``dst_gap=skip`` policy dropped (only yielded
    when asked for).  `dst` says what DST did to it, if anything.
    """

    wall: datetime
    at: datetime | None
    dst: DstMark | None = None


@dataclass(frozen=True, eq=False)
class Schedule:
    """A parsed schedule; build it with `parse_schedule`.

    All public methods take and return aware datetimes; run instants are UTC and
    strictly increasing.
    """

    text: str
    timezone: str
    kind: ScheduleKind
    policy: DstPolicy
    anchor: datetime
    _zone: ZoneInfo = field(repr=False)
    _rules: tuple[Rule, ...] = field(repr=False)
    _rdates: tuple[datetime, ...] = field(repr=False, default=())
    _exdates: tuple[datetime, ...] = field(repr=False, default=())
    # RDATE, EXDATE and DTSTART values that name instants (UTC, or another zone's time): an
    # instant is that instant, whichever reading of a repeated wall time it is.
    _rdate_instants: tuple[datetime, ...] = field(repr=False, default=())
    _exdate_instants: frozenset[datetime] = field(repr=False, default=frozenset())
    _start: DateValue | None = field(repr=False, default=None)
    # The rules start at the anchor (an RRULE without DTSTART), not at a DTSTART of their own.
    _anchored: bool = field(repr=False, default=False)
    # EXDATE dates (no time of day): every wall time of those days is left out.
    _exdate_days: frozenset[date] = field(repr=False, default=frozenset())

    @property
    def zone(self) -> ZoneInfo:
        return self._zone

    def occurrences(
        self, after: datetime | None, *, inclusive: bool = False, include_skipped: bool = False
    ) -> Iterator[Occurrence]:
        """Occurrences running after `after` (at it too if inclusive; all if None), in order.

        Occurrences that map to the same instant are one.  With `include_skipped`, wall
        times dropped in a DST gap are yielded too (``at`` None), where the gap ends.
        """
        return self._occurrences(after, inclusive=inclusive, include_skipped=include_skipped)

    def reaching_back(self, instant: datetime) -> Schedule:
        """This schedule as if it had started before `instant`: an RRULE without DTSTART
        (which starts at its anchor, the definition's creation day) keeps its phase and
        has the occurrences it would have had before the anchor, for a backfill of a
        window before the definition was created. From the anchor on nothing changes;
        cron, a rule's own DTSTART and COUNT (counted from the anchor) stay as they are."""
        require_aware(instant, "instant")
        if not self._anchored:
            return self
        try:
            target = wall_time(instant, self._zone).replace(microsecond=0) - MAX_TRANSITION
        except OverflowError:
            return self
        return replace(self, _rules=tuple(rule.started_before(target) for rule in self._rules))

    def next_after(self, instant: datetime, *, inclusive: bool = False) -> datetime | None:
        """The first run after `instant` (or at it, if inclusive); None if exhausted."""
        for occurrence in self.occurrences(instant, inclusive=inclusive):
            return occurrence.at
        return None

    def between(self, start: datetime, end: datetime, *, limit: int) -> list[datetime]:
        """Runs t with start <= t <= end, ascending, at most `limit` of them."""
        require_aware(end, "end")
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        runs: list[datetime] = []
        for occurrence in self.occurrences(start, inclusive=True):
            assert occurrence.at is not None
            if occurrence.at > end or len(runs) >= limit:
                break
            runs.append(occurrence.at)
        return runs

    def _run_instants(
        self, instant: datetime | None, *, inclusive: bool, rebase: bool = True
    ) -> Iterator[datetime]:
        """Run instants only; `rebase=False` walks every rule from its DTSTART (tests)."""
        for occurrence in self._occurrences(instant, inclusive=inclusive, rebase=rebase):
            assert occurrence.at is not None
            yield occurrence.at

    def _wall_times(
        self, not_before: datetime | None, *, rebase: bool
    ) -> Iterator[tuple[datetime, datetime | None]]:
        """The wall times of the rules and RDATEs in order, once each, but the EXDATEs; each
        with the latest instant it may run at: a rule's UTC UNTIL bounds the instants of that
        rule alone (RFC 5545), so a wall time another rule or an RDATE gives too is bounded by
        none of them (None)."""
        streams: list[Iterator[tuple[datetime, datetime | None]]] = []
        for rule in self._rules:
            restarted = rule.expansion_from(not_before, rebase=rebase)
            if restarted is not None:  # an rrule, or wall times in order
                streams.append(_tagged(_from(iter(restarted), not_before), rule.until_utc))
        rdates = sorted(r for r in self._rdates if not_before is None or r >= not_before)
        if rdates:
            streams.append(_tagged(iter(rdates), None))
        excluded, days = set(self._exdates), self._exdate_days

        def kept(wall: datetime) -> bool:
            return wall not in excluded and not (days and wall.date() in days)

        if len(streams) == 1:  # one rule (most schedules): its wall times come once each already
            yield from (pair for pair in streams[0] if kept(pair[0]))
            return
        merged = heapq.merge(*streams, key=_first)
        for wall, same in groupby(merged, key=_first):
            if kept(wall):
                bounds = [bound for _, bound in same]
                yield wall, None if None in bounds else max(b for b in bounds if b is not None)

    def _start_wall_time(self, instant: datetime) -> datetime | None:
        """The earliest wall time that can run at or after `instant` (None: past 9999; the
        calendar's first near the year 1).

        Away from DST changes that is the wall time of `instant`. Every run of a wall time
        (each reading, a gap's shift and its end) is at or before the wall time less the
        smaller of its two UTC offsets, so an earlier wall time can run at or after `instant`
        only when that offset is below the current one: up to a change's size after a
        spring-forward gap, or before a fall-back. There the search starts at `instant`
        read with the lower offset (an hour back for summer time); elsewhere, a second
        back. (Backing up a whole day near every change made each query of a rule of
        seconds walk 90,000 wall times for two days around it.)
        """
        try:
            utc = instant.astimezone(UTC)
            lowest = _lowest_offset_near(self._zone, utc.replace(minute=0, second=0, microsecond=0))
            if lowest is None:  # no change near (or at the ends of the calendar)
                return wall_time(instant - _ONE_SECOND, self._zone).replace(microsecond=0)
            offset = utc.astimezone(self._zone).utcoffset()
            assert offset is not None
            reach = offset - lowest  # at least the size of a change that can matter here
            if reach > timedelta(0):
                for moment in (utc - reach, utc + reach):
                    there = moment.astimezone(self._zone).utcoffset()
                    if there is not None and there < offset:
                        offset = there
            return (utc.replace(tzinfo=None) + offset - _ONE_SECOND).replace(microsecond=0)
        except OverflowError:  # backed up past the year 1: from the calendar's first wall time
            return datetime.min if instant.year == 1 else None

    def _occurrences(
        self,
        instant: datetime | None,
        *,
        inclusive: bool,
        include_skipped: bool = False,
        rebase: bool = True,
    ) -> Iterator[Occurrence]:
        not_before: datetime | None = None
        if instant is not None:
            require_aware(instant, "instant")
            not_before = self._start_wall_time(instant)
            if not_before is None and instant.astimezone(UTC).year > 5000:
                return

        def wanted(moment: datetime) -> bool:
            if moment in self._exdate_instants:
                return False
            return instant is None or moment > instant or (inclusive and moment == instant)

        def marked(occurrence: Occurrence) -> Occurrence:
            """A reading marked doubled whose twin the rule drops (an EXDATE instant) runs
            alone: it is the first or second of two, as when told so."""
            if occurrence.dst != "doubled" or occurrence.at is None:
                return occurrence
            before, after = fold_offsets(occurrence.wall, self._zone)
            readings = {(occurrence.wall - offset).replace(tzinfo=UTC) for offset in (before, after)}
            if any(twin in self._exdate_instants for twin in readings - {occurrence.at}):
                return replace(occurrence, dst=reading_of(occurrence.at, self._zone))
            return occurrence

        # Near a DST change a later wall time can run earlier (a gap shift, a second
        # reading); every policy maps a wall time at or after its earliest reading, which
        # never decreases, so what sorts below that is final.
        pending: list[tuple[datetime, int, Occurrence]] = []
        order = count()
        for at in self._rdate_instants:
            occurrence = Occurrence(wall_time(at, self._zone), at, reading_of(at, self._zone))
            heapq.heappush(pending, (at, next(order), occurrence))
        previous: datetime | None = None
        reached = not_before or datetime.min
        try:
            for wall, bound in self._wall_times(not_before, rebase=rebase):
                reached = wall
                mapped = runs_of_wall_time(wall, self._zone, self.policy)
                if mapped is None:
                    break
                if self._start is not None and wall == self._start.wall:
                    mapped = self._started(mapped)
                if bound is not None:  # a UTC UNTIL: a later reading or a gap's shift runs past it
                    mapped = _until(mapped, bound, self._zone)
                while pending and pending[0][0] <= mapped.earliest:
                    key, _, occurrence = heapq.heappop(pending)
                    if occurrence.at is None:
                        if include_skipped and wanted(key):
                            yield occurrence
                        continue
                    if occurrence.at != previous and wanted(occurrence.at):
                        previous = occurrence.at
                        yield marked(occurrence)
                for at, mark in mapped.runs:
                    heapq.heappush(pending, (at, next(order), Occurrence(wall, at, mark)))
                if mapped.skipped:
                    heapq.heappush(pending, (mapped.earliest, next(order), Occurrence(wall, None, "skipped")))
        except ValueError as error:  # dateutil stops past the year 9999 or on an empty rule
            if reached.year < datetime.max.year - 1:
                raise ScheduleError(f"RRULE: rule has no occurrences ({error})") from None
        while pending:
            key, _, occurrence = heapq.heappop(pending)
            if occurrence.at is None:
                if include_skipped and wanted(key):
                    yield occurrence
            elif occurrence.at != previous and wanted(occurrence.at):
                previous = occurrence.at
                yield marked(occurrence)

    def _started(self, mapped: WallTimeRuns) -> WallTimeRuns:
        """The runs of DTSTART's wall time when DTSTART names an instant: that instant first,
        then (``dst_repeat=both``) a later reading of the same wall time."""
        assert self._start is not None and self._start.instant is not None
        at = self._start.instant
        later = [(t, mark) for t, mark in mapped.runs if t > at] if self.policy.repeat == "both" else []
        # Both readings run (the instant, then the later one): each is marked doubled.
        runs: list[tuple[datetime, DstMark | None]] = [
            (at, "doubled" if later else reading_of(at, self._zone))
        ]
        return replace(mapped, runs=(*runs, *later))


def _until(mapped: WallTimeRuns, bound: datetime, zone: ZoneInfo) -> WallTimeRuns:
    """The runs of a wall time at or before a UTC UNTIL; a reading marked doubled whose twin
    falls past it runs alone, marked as the reading it is."""
    runs = [(at, mark) for at, mark in mapped.runs if at <= bound]
    skipped = mapped.skipped and mapped.earliest <= bound
    if len(runs) == len(mapped.runs) and skipped == mapped.skipped:
        return mapped
    alone = [(at, reading_of(at, zone) if mark == "doubled" else mark) for at, mark in runs]
    return replace(mapped, runs=tuple(alone), skipped=skipped)


def _from(walls: Iterator[datetime], not_before: datetime | None) -> Iterator[datetime]:
    """The wall times at or after `not_before` (all when None), counted for the walk's pings."""
    walked = _walked(walls)
    return walked if not_before is None else dropwhile(lambda wall: wall < not_before, walked)


def _tagged(walls: Iterator[datetime], bound: datetime | None) -> Iterator[tuple[datetime, datetime | None]]:
    return ((wall, bound) for wall in walls)


def _first(pair: tuple[datetime, datetime | None]) -> datetime:
    return pair[0]


@lru_cache(maxsize=4096)
def _lowest_offset_near(zone: ZoneInfo, hour: datetime) -> timedelta | None:
    """The smallest UTC offset of the zone within MAX_TRANSITION (plus the hour) of `hour`
    when its offset changes there; None when it does not."""
    reach = MAX_TRANSITION + timedelta(hours=1)
    try:
        offsets = {moment.astimezone(zone).utcoffset() for moment in (hour - reach, hour, hour + reach)}
    except OverflowError:
        return None
    if len(offsets) < 2:
        return None
    return min(offset for offset in offsets if offset is not None)


def looks_like_cron(text: str) -> bool:
    """RRULE text always has '=' (FREQ=...) or ':' (DTSTART:...); cron never does."""
    stripped = text.strip()
    return stripped.startswith("@") or not ("=" in stripped or ":" in stripped)


def parse_schedule(
    text: str,
    timezone: str,
    *,
    anchor: datetime,
    dst_gap: str | None = None,
    dst_repeat: str | None = None,
    definition: str | None = None,
) -> Schedule:
    """Parse an RRULE or cron schedule evaluated in the IANA zone `timezone`.

    `anchor` (aware) starts an RRULE that has no DTSTART line, read as wall time in
    `timezone` without microseconds; the scheduler passes local midnight of the
    definition's creation day (`plan.anchor_for`).  Cron has no phase and ignores it.
    `dst_gap` / `dst_repeat` None means auto (zones.py).  `definition` only names the
    definition in error messages.
    """
    try:
        if anchor.tzinfo is None or anchor.utcoffset() is None:
            raise ScheduleError(f"anchor must be timezone-aware, got {anchor!r}")
        zone = load_zone(timezone)
        stripped = text.strip()
        if not stripped:
            raise ScheduleError("schedule text is empty")
        if looks_like_cron(stripped):
            rules, real_time = parse_cron(stripped)
            policy = resolve_policy(dst_gap, dst_repeat, follows_real_time=real_time, kind="cron")
            return Schedule(text, timezone, "cron", policy, anchor, zone, rules)
        anchor_wall_time = wall_time(anchor, zone).replace(microsecond=0)
        parts = parse_rrule_text(stripped, zone, anchor_wall_time)
        policy = resolve_policy(
            dst_gap, dst_repeat, follows_real_time=follows_real_time(parts.rules), kind="rrule"
        )
        schedule = Schedule(
            text,
            timezone,
            "rrule",
            policy,
            anchor,
            zone,
            parts.rules,
            parts.rdates,
            parts.exdates,
            parts.rdate_instants,
            frozenset(parts.exdate_instants),
            parts.start,
            parts.anchored,
            frozenset(parts.exdate_days),
        )
        if next(schedule.occurrences(None, include_skipped=True), None) is None:
            raise ScheduleError("RRULE: rule has no occurrences")
        return schedule
    except ScheduleError as error:
        raise ScheduleError(error.detail, definition=definition) from None
