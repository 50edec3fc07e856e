"""RFC 5545 recurrence rules, expanded by python-dateutil in naive wall-clock time.

Accepted: a bare rule (``FREQ=DAILY;BYHOUR=8``), an ``RRULE:`` line, or several lines
with ``DTSTART``, ``RRULE``, ``RDATE`` and ``EXDATE``.  A rule without DTSTART starts at
the anchor the caller gives (the scheduler's: local midnight of the definition's
creation day).  `Rule` is shared with cron, which is expanded the same way.
"""

from __future__ import annotations

import calendar
import math
import re
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta, tzinfo
from itertools import islice
from typing import Any, Literal
from zoneinfo import ZoneInfo

from dateutil.rrule import (
    DAILY,
    HOURLY,
    MINUTELY,
    MONTHLY,
    SECONDLY,
    WEEKLY,
    YEARLY,
    rrule,
    weekday,
    weekdays,
)

from pgtick.schedule.zones import ScheduleError, latest_wall_time_until, load_zone, wall_time

Frequency = Literal[0, 1, 2, 3, 4, 5, 6]  # dateutil's YEARLY .. SECONDLY
_NUMBER = re.compile(r"[0-9]+")

_PERIOD_SECONDS = {WEEKLY: 7 * 86400, DAILY: 86400, HOURLY: 3600, MINUTELY: 60, SECONDLY: 1}
#: The longest INTERVAL of each frequency: a thousand years (a longer step leaves the calendar
#: a datetime can hold after one occurrence, and its arithmetic overflows).
_MAX_INTERVAL = {
    YEARLY: 1000,
    MONTHLY: 12 * 1000,
    **{f: 1000 * 365 * 86400 // seconds for f, seconds in _PERIOD_SECONDS.items()},
}
#: The parts of a rule (dateutil's keywords) that leave whole days out.
_DAY_PARTS = ("bymonth", "bymonthday", "byyearday", "byweekno", "byweekday")
_NO_DAY_PARTS: dict[str, Any] = dict.fromkeys(_DAY_PARTS)
_ONE_MICROSECOND = timedelta(microseconds=1)


def _period_start(moment: datetime, frequency: int, week_start: int) -> datetime:
    """Start of the FREQ period (year, month, week, day, ...) that holds `moment`."""
    if frequency == YEARLY:
        return datetime(moment.year, 1, 1)
    if frequency == MONTHLY:
        return datetime(moment.year, moment.month, 1)
    if frequency == WEEKLY:
        days_into_week = (moment.weekday() - week_start) % 7
        return datetime(moment.year, moment.month, moment.day) - timedelta(days=days_into_week)
    if frequency == DAILY:
        return moment.replace(hour=0, minute=0, second=0)
    if frequency == HOURLY:
        return moment.replace(minute=0, second=0)
    if frequency == MINUTELY:
        return moment.replace(second=0)
    return moment


class Walked:
    """Wall times expanded so far (by every schedule in this process): the work that
    tests and benchmarks bound, independent of the machine's speed."""

    count = 0


class _Pinger(threading.local):
    """This thread's `keeping_alive` hook, if any."""

    ping: Callable[[], object] | None = None
    every = 0.0
    last = 0.0


_pinger = _Pinger()


@contextmanager
def keeping_alive(ping: Callable[[], object], every: float) -> Iterator[None]:
    """While this thread walks schedules, call `ping` whenever `every` seconds have passed
    since the last call: a walk that takes long (a COUNT rule counted from its DTSTART)
    keeps the caller's database session from being ended as idle."""
    saved = (_pinger.ping, _pinger.every, _pinger.last)
    _pinger.ping, _pinger.every, _pinger.last = ping, every, time.monotonic()
    try:
        yield
    finally:
        _pinger.ping, _pinger.every, _pinger.last = saved


def _walked(expansion: Iterator[datetime]) -> Iterator[datetime]:
    for wall in expansion:
        Walked.count += 1
        if not Walked.count & 1023 and _pinger.ping is not None:
            now = time.monotonic()
            if now - _pinger.last >= _pinger.every:
                _pinger.last = now
                _pinger.ping()
        yield wall


@dataclass(frozen=True)
class Rule:
    """One recurrence rule, expanded in naive wall-clock time of the schedule's zone."""

    template: rrule
    frequency: int
    interval: int
    week_start: int  # WKST, 0 = Monday
    start: datetime | None  # naive DTSTART; None for cron, which has no phase to keep
    count: int | None  # COUNT counts from DTSTART: see `counted_before`
    until_utc: datetime | None = None  # a UTC UNTIL bounds instants, not wall times
    # Exactly one occurrence in every INTERVAL-th period (only DTSTART's own parts): counted
    # by arithmetic, never walked.
    one_per_period: bool = False
    # A rule of hours, minutes or seconds with BYMONTH, BYMONTHDAY or BYYEARDAY (and its
    # BYDAY): those day parts as dateutil keywords, and its UNTIL as a wall time; it is
    # expanded day by day (`_DayByDay`), a COUNT counted along. Empty for any other rule.
    day_parts: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    until_wall: datetime | None = None
    # COUNT rules: (rebased start, occurrences before it), ascending; learned as walked.
    _counts: list[tuple[datetime, int]] = field(default_factory=list, compare=False, repr=False)

    def expansion_from(self, not_before: datetime | None, *, rebase: bool) -> Iterable[datetime] | None:
        """The rule's wall times, restarted as close before `not_before` as its phase allows
        (None: a COUNT rule that is used up before it); a rule with `day_parts` is expanded
        day by day."""
        if not_before is None:
            if not rebase or not self.day_parts or self.start is None:
                return self.template
            not_before = self.start
        if self.start is None:  # cron: no phase to keep
            return self.template.replace(dtstart=not_before)
        if not rebase:
            return self.template
        if self.day_parts:
            if self.count is None:
                return _DayByDay(self, not_before)
            left = self.count - self.counted_before(not_before, self.count)
            return islice(_DayByDay(self, not_before), left) if left > 0 else None
        start = self.rebased_start(self.start, not_before)
        if start == self.start:
            return self.template
        if self.count is None:
            return self.template.replace(dtstart=start)
        left = self.count - self.counted_before(start, self.count)
        return self.template.replace(dtstart=start, count=left) if left > 0 else None

    def counted_before(self, start: datetime, limit: int) -> int:
        """How many occurrences the rule has before the rebased start `start` (at most
        `limit`): walked once from the nearest start counted before, and remembered, so a
        COUNT rule far into its life is not walked from its DTSTART again on every query."""
        assert self.start is not None
        if self.one_per_period:
            return min(self._periods_before(self.start, start), limit)
        known = bisect_right(self._counts, (start, limit + 1))
        since, counted = self._counts[known - 1] if known else (self.start, 0)
        if since > start:  # only if two threads raced on the list: start over
            since, counted = self.start, 0
        if since == start:
            return counted
        # From a rebased start the rule expands as from DTSTART (see `rebased_start`); a rule
        # with day parts, day by day from any wall time.
        expansion: Iterable[datetime] = (
            _DayByDay(self, since) if self.day_parts else self.template.replace(dtstart=since, count=None)
        )
        for wall in _walked(iter(expansion)):
            if wall >= start or counted >= limit:
                break
            counted += 1
        self._counts.insert(known, (start, counted))
        if len(self._counts) > 64:  # the cursor only moves forward: keep the latest
            del self._counts[:32]
        return counted

    def _periods_before(self, first: datetime, start: datetime) -> int:
        """How many of first, first + one step, first + two steps ... (a step: INTERVAL
        periods) lie before `start`."""
        if start <= first:
            return 0
        if self.frequency in (YEARLY, MONTHLY):
            step = (12 if self.frequency == YEARLY else 1) * self.interval
            months = (start.year - first.year) * 12 + start.month - first.month
            steps = months // step  # first + steps * step months is in start's month or before it
            month_index = first.year * 12 + first.month - 1 + steps * step
            if first.replace(year=month_index // 12, month=month_index % 12 + 1) < start:
                steps += 1
            return steps
        step_length = timedelta(seconds=_PERIOD_SECONDS[self.frequency] * self.interval)
        return -((first - start) // step_length)  # ceil((start - first) / step)

    def rebased_start(self, start: datetime, target: datetime) -> datetime:
        """A DTSTART at or before `target` that expands like `start` from there on.

        dateutil expands from DTSTART, so a rule anchored years ago would be walked period
        by period.  All implicit BYxxx values have been made explicit from the original
        DTSTART, so DTSTART can move to the start of any period a whole multiple of
        INTERVAL periods after its own: the phase is kept and only the place where the
        expansion begins changes.  Starting exactly at a period start matters: dateutil
        applies BYSETPOS to the rest of DTSTART's week only, and months and years start
        on day 1, which exists in every month.
        """
        try:
            first = _period_start(start, self.frequency, self.week_start)
        except OverflowError:  # a week that began before the year 1
            return start
        if self.frequency in (YEARLY, MONTHLY):
            months_per_period = (12 if self.frequency == YEARLY else 1) * self.interval
            months = (target.year - first.year) * 12 + target.month - first.month
            periods = months // months_per_period
            if periods < 1:
                return start
            month_index = first.year * 12 + first.month - 1 + periods * months_per_period
            return datetime(month_index // 12, month_index % 12 + 1, 1)
        period = timedelta(seconds=_PERIOD_SECONDS[self.frequency] * self.interval)
        periods = (target - first) // period
        if periods < 1:
            return start
        return first + periods * period

    def started_before(self, target: datetime) -> Rule:
        """This rule with its DTSTART moved back to a period start at or before `target`, a
        whole multiple of INTERVAL periods before its own (see `rebased_start`): from its
        own DTSTART on it expands exactly as before, and before it as if it had started
        earlier. A COUNT rule, which counts from its DTSTART, is returned unchanged, and so
        is a rule that starts at or before `target` already."""
        if self.start is None or self.count is not None or target >= self.start:
            return self
        try:
            first = _period_start(self.start, self.frequency, self.week_start)
            if self.frequency in (YEARLY, MONTHLY):
                months_per_period = (12 if self.frequency == YEARLY else 1) * self.interval
                months = (first.year - target.year) * 12 + first.month - target.month
                periods = -(-months // months_per_period)
                month_index = first.year * 12 + first.month - 1 - periods * months_per_period
                start = datetime(month_index // 12, month_index % 12 + 1, 1)
            else:
                period = timedelta(seconds=_PERIOD_SECONDS[self.frequency] * self.interval)
                start = first - -(-(first - target) // period) * period
        except (OverflowError, ValueError):  # before the year 1
            return self
        return replace(self, template=self.template.replace(dtstart=start), start=start, _counts=[])


class _DayByDay:
    """A rule with `day_parts`, from a wall time on: on each day they let through, the rule's
    wall times that day, restarted there in its phase.

    dateutil walks a day those parts leave out period by period when the rule also has time
    parts: a rule of the seconds of one hour on one day a year took seconds to reach its next
    occurrence, and one on a day in 28 years (29 February on a Monday) minutes, in the
    scheduler's tick and in every preview. The days come from a daily rule of the same parts.
    The calendar repeats every 400 years, weekdays included: days stop after 401 years with
    none let through (a rule whose parts never meet has no occurrence)."""

    def __init__(self, rule: Rule, not_before: datetime) -> None:
        assert rule.start is not None and rule.day_parts
        self.rule = rule
        self.start = rule.start
        self.not_before = not_before

    def __iter__(self) -> Iterator[datetime]:
        rule, template, until = self.rule, self.rule.template, self.rule.until_wall
        try:
            for day in self._days(until):
                lowest = max(day, self.not_before)
                last = day + timedelta(days=1) - _ONE_MICROSECOND
                if until is not None:
                    last = min(last, until)
                start = rule.rebased_start(self.start, lowest)
                # Without its day parts (this day has them all): dateutil tests UNTIL only on
                # a wall time it found, and with them it would look for the next one for years.
                # (COUNT counts across days: `expansion_from` and `counted_before` count.)
                for wall in template.replace(dtstart=start, until=last, count=None, **_NO_DAY_PARTS):
                    if wall >= lowest:
                        yield wall
        except (ValueError, OverflowError):  # past the year 9999
            return

    def _days(self, until: datetime | None) -> Iterator[datetime]:
        """The days the rule's day parts let through, from `not_before`'s on, until UNTIL."""
        parts: dict[str, Any] = dict(self.rule.day_parts)
        day = self.not_before.replace(hour=0, minute=0, second=0, microsecond=0)
        while True:
            cycle = day.replace(year=day.year + 401, month=1, day=1) if day.year + 401 <= 9999 else None
            bound = until if cycle is None or (until is not None and until <= cycle) else cycle
            found = None
            for found in rrule(DAILY, dtstart=day, wkst=self.rule.week_start, until=bound, **parts):
                yield found
            if found is None or bound is until:  # none in 401 years; or UNTIL or 9999 reached
                return
            day = found + timedelta(days=1)


def some_day_matches(
    months: Collection[int] = (),
    month_days: Collection[int] = (),
    year_days: Collection[int] = (),
) -> bool:
    """Whether any day passes the BYMONTH, BYMONTHDAY and BYYEARDAY filters (empty: any).

    These filters only depend on the length of the year, so a common and a leap year
    cover every case.  dateutil would otherwise look for a match until the year 9999,
    which takes seconds for a minutely rule.
    """
    for year in (2023, 2024):
        year_length = 366 if calendar.isleap(year) else 365
        for day_of_year in range(1, year_length + 1):
            day = date(year, 1, 1) + timedelta(days=day_of_year - 1)
            month_length = calendar.monthrange(year, day.month)[1]
            if (
                (not months or day.month in months)
                and (not month_days or {day.day, day.day - month_length - 1} & set(month_days))
                and (not year_days or {day_of_year, day_of_year - year_length - 1} & set(year_days))
            ):
                return True
    return False


_FREQUENCIES: dict[str, Frequency] = {
    "YEARLY": YEARLY,
    "MONTHLY": MONTHLY,
    "WEEKLY": WEEKLY,
    "DAILY": DAILY,
    "HOURLY": HOURLY,
    "MINUTELY": MINUTELY,
    "SECONDLY": SECONDLY,
}
_WEEKDAY_CODES = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
# part name -> (rrule keyword, smallest, largest, negative values allowed)
_NUMBER_LIST_PARTS = {
    "BYSECOND": ("bysecond", 0, 59, False),
    "BYMINUTE": ("byminute", 0, 59, False),
    "BYHOUR": ("byhour", 0, 23, False),
    "BYMONTH": ("bymonth", 1, 12, False),
    "BYMONTHDAY": ("bymonthday", 1, 31, True),
    "BYYEARDAY": ("byyearday", 1, 366, True),
    "BYWEEKNO": ("byweekno", 1, 53, True),
    "BYSETPOS": ("bysetpos", 1, 366, True),
}
# RFC 5545 section 3.3.10: parts that only make sense with some frequencies
_PART_FREQUENCIES: dict[str, set[Frequency]] = {
    "BYWEEKNO": {YEARLY},
    "BYYEARDAY": {YEARLY, HOURLY, MINUTELY, SECONDLY},
    "BYMONTHDAY": set(_FREQUENCIES.values()) - {WEEKLY},
}
_PROPERTIES = "DTSTART, RRULE, RDATE, EXDATE"
_BYDAY_ITEM = re.compile(r"([+-]?[0-9]{1,2})?(MO|TU|WE|TH|FR|SA|SU)")
_DATE_TIME = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})(?:T([0-9]{2})([0-9]{2})([0-9]{2})(Z?))?")


@dataclass(frozen=True)
class _DateTimeValue:
    value: datetime  # naive, as written
    is_utc: bool
    is_date: bool


def _parse_date_time(text: str, where: str) -> _DateTimeValue:
    match = _DATE_TIME.fullmatch(text.strip().upper())
    if match is None:
        raise ScheduleError(f"{where}: invalid date-time {text!r}")
    year, month, day, hour, minute, second, utc = match.groups(default="0")
    try:
        value = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError:
        raise ScheduleError(f"{where}: invalid date-time {text!r}") from None
    return _DateTimeValue(value, is_utc=utc == "Z", is_date=match.group(4) is None)


def _number_list(text: str, part: str, low: int, high: int, signed: bool) -> tuple[int, ...]:
    numbers = []
    for item in text.split(","):
        if not re.fullmatch(r"[+-]?[0-9]+" if signed else "[0-9]+", item):
            raise ScheduleError(f"RRULE: invalid {part} value {item!r}")
        number = int(item)
        if not low <= abs(number) <= high or (signed and number == 0):
            allowed = f"{low}-{high}" + (f" or -{high}--{low}" if signed else "")
            raise ScheduleError(f"RRULE: {part} value {number} out of range {allowed}")
        numbers.append(number)
    return tuple(numbers)


def _positive_integer(text: str, part: str, *, most: int | None = None, allow_zero: bool = False) -> int:
    if not _NUMBER.fullmatch(text) or (int(text) == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ScheduleError(f"RRULE: {part} must be a {kind} integer, got {text!r}")
    if most is not None and int(text) > most:
        raise ScheduleError(f"RRULE: {part} must be at most {most:,}, got {text}")
    return int(text)


def _byday(text: str, frequency: int, in_months: bool) -> list[weekday]:
    """BYDAY's weekdays; an ordinal counts them within the year, or within the month with
    FREQ=MONTHLY or BYMONTH (``in_months``), where there are at most five of each."""
    days = []
    for item in text.split(","):
        match = _BYDAY_ITEM.fullmatch(item)
        if match is None:
            raise ScheduleError(f"RRULE: invalid BYDAY value {item!r}")
        ordinal_text, code = match.groups()
        day = weekdays[_WEEKDAY_CODES.index(code)]
        if ordinal_text is None:
            days.append(day)
            continue
        ordinal = int(ordinal_text)
        if not 1 <= abs(ordinal) <= 53:
            raise ScheduleError(f"RRULE: BYDAY value {item!r} ordinal out of range 1-53")
        if frequency not in (MONTHLY, YEARLY):
            raise ScheduleError(f"RRULE: BYDAY value {item!r} needs FREQ=MONTHLY or YEARLY")
        if in_months and abs(ordinal) > 5:  # (dateutil fails on these with an IndexError)
            raise ScheduleError(
                f"RRULE: BYDAY value {item!r} ordinal out of range 1-5"
                " (a month has at most five of each weekday)"
            )
        days.append(day(ordinal))
    return days


def _rule_parts(text: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for part in text.strip().split(";"):
        if not part.strip():
            continue
        name, equals, value = part.partition("=")
        name, value = name.strip().upper(), value.strip().upper()
        if not equals or not name or not value:
            raise ScheduleError(f"RRULE: malformed part {part!r} (expected NAME=VALUE)")
        if name in parts:
            raise ScheduleError(f"RRULE: {name} given more than once")
        parts[name] = value
    return parts


def _parse_rule(text: str, start: datetime, zone: ZoneInfo) -> Rule:
    """One RRULE value (``FREQ=...;...``) with its naive wall-clock DTSTART."""
    parts = _rule_parts(text)
    if "FREQ" not in parts:
        raise ScheduleError("RRULE: missing FREQ")
    if parts["FREQ"] not in _FREQUENCIES:
        raise ScheduleError(f"RRULE: unknown FREQ {parts['FREQ']!r}")
    frequency_name = parts.pop("FREQ")
    frequency = _FREQUENCIES[frequency_name]
    if "COUNT" in parts and "UNTIL" in parts:
        raise ScheduleError("RRULE: COUNT and UNTIL cannot both be given")

    options: dict[str, Any] = {"interval": 1, "wkst": 0}  # RFC 5545 default week start: MO
    until_utc: datetime | None = None
    for name, value in parts.items():
        if name in _PART_FREQUENCIES and frequency not in _PART_FREQUENCIES[name]:
            raise ScheduleError(f"RRULE: {name} cannot be used with FREQ={frequency_name}")
        if name in _NUMBER_LIST_PARTS:
            keyword, low, high, signed = _NUMBER_LIST_PARTS[name]
            options[keyword] = _number_list(value, name, low, high, signed)
        elif name == "INTERVAL":
            options["interval"] = _positive_integer(value, name, most=_MAX_INTERVAL[frequency])
        elif name == "COUNT":
            options["count"] = _positive_integer(value, name, allow_zero=True)
        elif name == "UNTIL":
            until = _parse_date_time(value, "RRULE: UNTIL")
            options["until"] = _until_wall_time(until, zone)
            if until.is_utc and not until.is_date:
                until_utc = until.value.replace(tzinfo=UTC)
        elif name == "WKST":
            if value not in _WEEKDAY_CODES:
                raise ScheduleError(f"RRULE: invalid WKST value {value!r}")
            options["wkst"] = _WEEKDAY_CODES.index(value)
        elif name == "BYDAY":
            options["byweekday"] = _byday(value, frequency, frequency == MONTHLY or "BYMONTH" in parts)
        else:
            raise ScheduleError(f"RRULE: unknown part {name!r}")

    given = options.keys() - {"interval", "count", "wkst", "until"}
    _make_defaults_explicit(options, frequency, start)
    # Only DTSTART's own parts: one occurrence per period, unless its day is missing from
    # some months (the 29th to the 31st monthly, February 29 yearly).
    one_per_period = not given and not (
        (frequency == MONTHLY and start.day > 28)
        or (frequency == YEARLY and (start.month, start.day) == (2, 29))
    )
    if not some_day_matches(
        options.get("bymonth", ()), options.get("bymonthday", ()), options.get("byyearday", ())
    ):
        filters = "BYMONTH/BYMONTHDAY/BYYEARDAY"
        raise ScheduleError(f"RRULE: rule has no occurrences (no day passes {filters})")
    if "bysetpos" in options:
        most = _largest_set(frequency, options)
        if all(abs(position) > most for position in options["bysetpos"]):
            held = f"{most} occurrence{'' if most == 1 else 's'}"
            raise ScheduleError(
                f"RRULE: rule has no occurrences (BYSETPOS counts the occurrences within one "
                f"FREQ={frequency_name} period, which holds at most {held} here)"
            )
    if _never_lands(frequency, start, options):
        raise ScheduleError(
            f"RRULE: rule has no occurrences (steps of INTERVAL={options['interval']} "
            f"{frequency_name} periods from DTSTART never land on a day and time its BY parts allow)"
        )
    try:
        template = rrule(frequency, dtstart=start, **options)
    except ValueError as error:
        raise ScheduleError(f"RRULE: rule has no occurrences ({error})") from None
    # Days of the week alone leave at most six days out: expanded as they are.
    # Sub-daily periods never span two days, so BYSETPOS picks within a day's periods alike.
    day_by_day = frequency in (HOURLY, MINUTELY, SECONDLY) and bool(
        given & {"bymonth", "bymonthday", "byyearday"}
    )
    return Rule(
        template,
        frequency,
        options["interval"],
        week_start=options["wkst"],
        start=start,
        count=options.get("count"),
        until_utc=until_utc,
        one_per_period=one_per_period,
        day_parts=tuple((k, tuple(options[k])) for k in _DAY_PARTS if k in options) if day_by_day else (),
        until_wall=options.get("until"),
    )


#: Periods of a sub-daily or daily FREQ in a day.
_PERIODS_PER_DAY = {DAILY: 1, HOURLY: 24, MINUTELY: 1440, SECONDLY: 86400}

#: Days in which the Gregorian calendar repeats, weekdays included (400 years).
_CALENDAR_CYCLE = 146097


def _never_lands(frequency: int, start: datetime, options: dict[str, Any]) -> bool:
    """Whether a DAILY or shorter rule's periods, every INTERVAL-th from DTSTART's, never fall
    on a day and a time of day that its limiting BY parts allow: BYMONTH, BYMONTHDAY,
    BYYEARDAY and BYDAY limit the days, and BYHOUR (HOURLY and shorter), BYMINUTE (MINUTELY and
    shorter) and BYSECOND (SECONDLY) the periods within a day. ``options`` has the rule's
    defaults made explicit, and its day parts let some day through (``some_day_matches``).

    dateutil looks for a first occurrence up to the year 9999, one period after another, which
    takes minutes for ``FREQ=MINUTELY;INTERVAL=7;BYDAY=SU;BYHOUR=5;BYMINUTE=30`` from a Monday
    05:30 (a week is a whole number of 7-minute steps: every step falls on the same minute of
    each week, never that one). Here: the periods of day D (counted from DTSTART's) that a step
    reaches depend only on D modulo ``p``, the steps' own cycle in days; the days the BY parts
    allow repeat every 7 days (weekdays alone) or every 400 years. Only a day whose residue
    modulo the common part of the two cycles matches one of the residues with a time allowed can
    ever hold an occurrence, and one cycle of allowed days shows them all. COUNT, UNTIL, BYSETPOS
    and EXDATE only take occurrences away, so they do not matter here."""
    per_day = _PERIODS_PER_DAY.get(frequency)
    if per_day is None:
        return False
    hours = options.get("byhour") if frequency >= HOURLY else None
    minutes = options.get("byminute") if frequency >= MINUTELY else None
    seconds = options.get("bysecond") if frequency >= SECONDLY else None
    if frequency > DAILY and not (hours or minutes or seconds):
        return False  # every period of a day is allowed: each day holds one a step reaches
    # (BYWEEKNO and BYDAY ordinals are refused for these frequencies.)
    day_parts = {k: options[k] for k in _DAY_PARTS if options.get(k)}
    # The periods a step reaches are first + k * interval; on day D, period t of the day is one
    # when D * per_day + t - first is a multiple of interval. That holds, for a given t, for the
    # days D of one residue modulo p, or for none.
    interval = options["interval"]
    common = math.gcd(per_day, interval)
    p = interval // common
    inverse = pow(per_day // common, -1, p) if p > 1 else 0
    if frequency == DAILY:
        times: Iterable[int] = (0,)
        first = 0
    else:
        hours = sorted(set(hours)) if hours else range(24)
        minutes = sorted(set(minutes)) if minutes else range(60)
        seconds = sorted(set(seconds)) if seconds else range(60)
        if frequency == HOURLY:
            times, first = hours, start.hour
        elif frequency == MINUTELY:
            times = (h * 60 + m for h in hours for m in minutes)
            first = start.hour * 60 + start.minute
        else:
            times = ((h * 60 + m) * 60 + s for h in hours for m in minutes for s in seconds)
            first = (start.hour * 60 + start.minute) * 60 + start.second
    residues = set()
    for t in times:
        if (first - t) % common == 0:
            if not day_parts:
                return False  # every day is allowed: this period is reached on some
            residues.add((first - t) // common * inverse % p)
    if not residues:
        return True
    cycle = 7 if day_parts.keys() == {"byweekday"} else _CALENDAR_CYCLE
    shared = math.gcd(p, cycle)
    if shared == 1:
        return False  # every day the parts allow can be reached, and some day is allowed
    wanted = {r % shared for r in residues}
    # The days the parts allow in one cycle, found by a daily rule of the same parts, as the
    # expansion of a rule with day parts finds them (_DayByDay).
    first_day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        last_day = first_day + timedelta(days=cycle - 1)
    except OverflowError:
        last_day = datetime.max
    try:
        for day in rrule(DAILY, dtstart=first_day, until=last_day, **day_parts):
            if (day - first_day).days % shared in wanted:
                return False
    except (ValueError, OverflowError):  # past the year 9999: the walk's own end decides
        return False
    return True


def _largest_set(frequency: int, options: dict[str, Any]) -> int:
    """The most occurrences one FREQ period can hold, which BYSETPOS picks among: its days (a
    day for DAILY and shorter periods) times the times of day each of them has (the parts
    finer than FREQ, all explicit by now).

    A BYSETPOS past it never selects anything, and dateutil would look for a period that has
    it up to the year 9999, period by period: hours for FREQ=MINUTELY.
    """
    if frequency == WEEKLY:
        days = len({getattr(day, "weekday", day) for day in options["byweekday"]})
    else:
        days = {YEARLY: 366, MONTHLY: 31}.get(frequency, 1)
    times = 1
    for keyword, finer_than in (("byhour", HOURLY), ("byminute", MINUTELY), ("bysecond", SECONDLY)):
        if frequency < finer_than:
            times *= len(set(options[keyword]))
    return days * times


def _until_wall_time(until: _DateTimeValue, zone: ZoneInfo) -> datetime | None:
    if until.is_date:  # a date bounds the rule inclusively: the whole day counts
        return until.value.replace(hour=23, minute=59, second=59)
    if until.is_utc:
        try:
            return latest_wall_time_until(until.value.replace(tzinfo=UTC), zone)
        except ScheduleError as why:  # an UNTIL before every wall time: not one occurrence
            raise ScheduleError(f"RRULE: rule has no occurrences (UNTIL: {why.detail})") from None
    return until.value


def _make_defaults_explicit(options: dict[str, Any], frequency: int, start: datetime) -> None:
    """Spell out what dateutil would derive from DTSTART, so DTSTART can be moved."""
    if frequency < HOURLY:
        options.setdefault("byhour", (start.hour,))
    if frequency < MINUTELY:
        options.setdefault("byminute", (start.minute,))
    if frequency < SECONDLY:
        options.setdefault("bysecond", (start.second,))
    if not options.keys() & {"byweekno", "byyearday", "bymonthday", "byweekday"}:
        if frequency == YEARLY:
            options.setdefault("bymonth", (start.month,))
            options["bymonthday"] = (start.day,)
        elif frequency == MONTHLY:
            options["bymonthday"] = (start.day,)
        elif frequency == WEEKLY:
            options["byweekday"] = (start.weekday(),)


@dataclass(frozen=True)
class DateValue:
    """A DTSTART / RDATE / EXDATE value: its naive wall time in the schedule's zone, and the
    instant it names when it is one (UTC, or another zone's time), else None. A wall time the
    clock shows twice reads by the DST policy; an instant is that instant."""

    wall: datetime
    instant: datetime | None = None
    is_date: bool = False  # an EXDATE without a time of day: the whole day, as a date UNTIL is


@dataclass(frozen=True)
class RRuleParts:
    """What RRULE text holds: its rules, and the RDATE and EXDATE values (wall times, and
    instants), and DTSTART when it names an instant."""

    rules: tuple[Rule, ...]
    rdates: tuple[datetime, ...]
    exdates: tuple[datetime, ...]
    rdate_instants: tuple[datetime, ...] = ()
    exdate_instants: tuple[datetime, ...] = ()
    start: DateValue | None = None
    anchored: bool = False  # no DTSTART: the rules start at the anchor
    exdate_days: tuple[date, ...] = ()  # EXDATE dates: every wall time of those days


def _date_values(prop: str, params: Sequence[str], value: str, zone: ZoneInfo) -> list[DateValue]:
    """DTSTART / RDATE / EXDATE values: wall times of the schedule's zone, with the instant of
    a value given in UTC or in another zone."""
    value_zone: ZoneInfo | None = None
    for param in params:
        name, _, param_value = param.partition("=")
        name = name.strip().upper()
        if name == "TZID":
            value_zone = load_zone(param_value.strip().strip('"'))
        elif name != "VALUE" or param_value.strip().upper() not in ("DATE-TIME", "DATE"):
            raise ScheduleError(f"{prop}: unsupported parameter {param!r}")
    wall_times: list[DateValue] = []
    for item in value.split(","):
        parsed = _parse_date_time(item, prop)
        if parsed.is_utc and value_zone is not None:
            raise ScheduleError(f"{prop}: {item!r} is UTC but a TZID is also given")
        if prop == "DTSTART" and value_zone is not None and value_zone.key != zone.key:
            raise ScheduleError(f"DTSTART: TZID {value_zone.key!r} is not {zone.key!r}")
        if prop == "EXDATE" and parsed.is_date:  # a day of the schedule's calendar, not an instant
            wall_times.append(DateValue(parsed.value, is_date=True))
            continue
        if parsed.is_utc:
            source_zone: tzinfo = UTC
        elif value_zone is not None and value_zone.key != zone.key:
            source_zone = value_zone
        else:
            wall_times.append(DateValue(parsed.value))  # already wall time in the schedule's zone
            continue
        try:
            instant = parsed.value.replace(tzinfo=source_zone).astimezone(UTC)
            wall_times.append(DateValue(wall_time(instant, zone), instant))
        except OverflowError:
            raise ScheduleError(f"{prop}: {item!r} is out of range") from None
    return wall_times


def _parse_rrule_text(text: str, zone: ZoneInfo, anchor: datetime) -> RRuleParts:
    """RRULE text -> its rules, RDATEs and EXDATEs."""
    start: DateValue | None = None
    rule_texts: list[str] = []
    rdates: list[DateValue] = []
    exdates: list[DateValue] = []
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        head, colon, value = line.partition(":")
        if not colon:  # a bare rule: FREQ=...;...
            rule_texts.append(line)
            continue
        prop, *params = head.split(";")
        prop = prop.strip().upper()
        if prop == "RRULE":
            if params:
                raise ScheduleError(f"RRULE: unsupported parameter {params[0]!r}")
            rule_texts.append(value)
        elif prop == "DTSTART":
            if start is not None:
                raise ScheduleError("DTSTART: given more than once")
            values = _date_values(prop, params, value, zone)
            if len(values) != 1:
                raise ScheduleError("DTSTART: expected exactly one date-time")
            start = values[0]
        elif prop == "RDATE":
            rdates.extend(_date_values(prop, params, value, zone))
        elif prop == "EXDATE":
            exdates.extend(_date_values(prop, params, value, zone))
        else:
            raise ScheduleError(f"unsupported property {prop!r} (use {_PROPERTIES})")
    if not rule_texts and not rdates:
        raise ScheduleError("RRULE: no RRULE or RDATE line")
    if not rule_texts and start is not None:
        # RFC 5545: DTSTART is the first instance of the recurrence set (a rule's expansion
        # starts with it; dates alone do not name it again).
        rdates.insert(0, start)
    rules = tuple(_parse_rule(rule_text, start.wall if start else anchor, zone) for rule_text in rule_texts)
    for number, rule in enumerate(rules, start=1):
        # Checked one by one: a rule that never matches would make every query walk
        # dateutil's expansion up to the year 9999, even next to rules that do match.
        if not _has_occurrence(rule):
            which = "rule" if len(rules) == 1 else f"rule {number}"
            raise ScheduleError(f"RRULE: {which} has no occurrences")
    return RRuleParts(
        rules,
        tuple(d.wall for d in rdates if d.instant is None),
        tuple(d.wall for d in exdates if d.instant is None and not d.is_date),
        tuple(d.instant for d in rdates if d.instant is not None),
        tuple(d.instant for d in exdates if d.instant is not None),
        start if start is not None and start.instant is not None else None,
        anchored=start is None,
        exdate_days=tuple(d.wall.date() for d in exdates if d.is_date),
    )


def _has_occurrence(rule: Rule) -> bool:
    try:
        if not _parts_ever_match(rule):
            return False
        expansion = rule.expansion_from(None, rebase=True)  # day by day where that is faster
        return expansion is not None and next(iter(expansion), None) is not None
    except (ValueError, IndexError):  # dateutil: an empty BYxxx combination, or past the year 9999
        return False


#: The periods of a turn of the calendar (400 years, _CALENDAR_CYCLE days), per FREQ.
_CALENDAR_PERIODS = {YEARLY: 400, MONTHLY: 400 * 12, WEEKLY: _CALENDAR_CYCLE // 7}


def _parts_ever_match(rule: Rule) -> bool:
    """Whether a yearly, monthly or weekly rule's parts pick any time at all (COUNT and UNTIL
    aside), decided within two turns of the calendar. Its steps from DTSTART come back to the
    same months, weekdays and week numbers once whole 400-year cycles have passed, so what none
    of the steps of one such turn picks, none ever will; dateutil, asked for a first occurrence,
    would look until the year 9999 (a second for a monthly rule whose BYDAY and BYMONTHDAY never
    meet). The same search from DTSTART moved whole turns ahead, the latest that still leaves a
    whole turn before 9999, ends there. A rule whose turn is too long to move has few steps
    before 9999: the first-occurrence search decides it."""
    periods = _CALENDAR_PERIODS.get(rule.frequency)
    if periods is None or rule.start is None:
        return True
    years = 400 * (rule.interval // math.gcd(rule.interval, periods))  # a turn of its steps
    turns = (datetime.max.year - 1 - years - rule.start.year) // years
    if turns < 1:
        return True
    moved = rule.start.replace(year=rule.start.year + turns * years)
    probe = rule.template.replace(dtstart=moved, count=None, until=None)
    return next(iter(probe), None) is not None


def parse_rrule_text(text: str, zone: ZoneInfo, anchor: datetime) -> RRuleParts:
    """RRULE text -> its rules, RDATEs and EXDATEs; `anchor` (naive wall time) starts the rules
    when there is no DTSTART."""
    return _parse_rrule_text(text, zone, anchor)


def follows_real_time(rules: Sequence[Rule]) -> bool:
    """Sub-daily rules (HOURLY, MINUTELY, SECONDLY) count real time, not wall time."""
    return any(rule.frequency in (HOURLY, MINUTELY, SECONDLY) for rule in rules)
