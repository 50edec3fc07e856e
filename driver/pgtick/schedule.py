"""Occurrence computation for schedules stored as text on a job definition.

Two notations are accepted, told apart by content:

* RFC 5545 recurrence rules: a bare rule (``FREQ=DAILY;BYHOUR=8``), an ``RRULE:`` line,
  or several lines with ``DTSTART``, ``RRULE``, ``RDATE`` and ``EXDATE``;
* 5-field cron expressions and ``@daily``-style macros, with Vixie cron semantics.

Occurrences are expanded by python-dateutil in the wall-clock time of the definition's
IANA time zone and then mapped to UTC: a wall time inside a spring-forward gap runs at
the first instant after the gap, an ambiguous wall time runs once at its first
occurrence, and wall times that map to the same instant run once.  Pure Python, no
database access.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import (
    DAILY,
    HOURLY,
    MINUTELY,
    MONTHLY,
    SECONDLY,
    WEEKLY,
    YEARLY,
    rrule,
    rruleset,
    weekday,
    weekdays,
)

__all__ = [
    "MISFIRE_POLICIES",
    "Plan",
    "Schedule",
    "ScheduleError",
    "first_cursor",
    "format_preview",
    "parse_schedule",
    "plan_materialization",
    "preview",
]

ScheduleKind = Literal["rrule", "cron"]
Frequency = Literal[0, 1, 2, 3, 4, 5, 6]  # dateutil's YEARLY .. SECONDLY

MISFIRE_POLICIES = ("catch_up", "coalesce", "skip")

# Start of the recurrence when the text has no DTSTART and the caller gives no anchor.
DEFAULT_ANCHOR_WALL_TIME = datetime(2000, 1, 1)

_ONE_SECOND = timedelta(seconds=1)
_LAST_WALL_TIME = datetime.max.replace(microsecond=0)


class ScheduleError(ValueError):
    """A schedule text or time zone that cannot be used; the message names the bad part."""

    def __init__(self, detail: str, *, definition: str | None = None) -> None:
        self.detail = detail
        self.definition = definition
        prefix = "schedule" if definition is None else f"definition={definition} schedule"
        super().__init__(f"{prefix}: {detail}")


# --------------------------------------------------------------------------- time zones


def _load_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {name!r}") from None


def _require_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")


def _wall_time(instant: datetime, zone: ZoneInfo) -> datetime:
    """Naive wall-clock time of an aware instant (OverflowError past the year 9999)."""
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def _run_instant(wall_time: datetime, zone: ZoneInfo) -> datetime | None:
    """The UTC instant an occurrence at `wall_time` runs at; None if past the year 9999.

    An ambiguous wall time (fall-back) runs at its first occurrence; one that does not
    exist (spring-forward gap) runs at the first instant after the gap.  The mapping is
    monotonic: later wall times never run earlier.
    """
    try:
        first = wall_time.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if _wall_time(first, zone) == wall_time:
            return first
        return _gap_end(wall_time, zone)
    except OverflowError:
        return None


def _gap_end(wall_time: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the spring-forward gap that swallows `wall_time`.

    The two readings of a missing wall time (old and new UTC offset) bracket the
    transition; bisect on whole seconds for the first instant whose wall time has
    passed it.  Works for gaps of any length (Lord Howe shifts by 30 minutes).
    """
    readings = [wall_time.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)]
    before, after = min(readings), max(readings)
    low, high = 0, int((after - before).total_seconds())
    while high - low > 1:
        middle = (low + high) // 2
        if _wall_time(before + timedelta(seconds=middle), zone) >= wall_time:
            high = middle
        else:
            low = middle
    return before + timedelta(seconds=high)


def _latest_wall_time_until(instant: datetime, zone: ZoneInfo) -> datetime | None:
    """The latest whole-second wall time that runs at or before `instant`.

    None when every representable wall time does.  Used to turn a UTC ``UNTIL`` into
    the naive bound dateutil needs, exact even inside a repeated fall-back hour.
    """

    def runs_by(wall_time: datetime) -> bool:
        run = _run_instant(wall_time, zone)
        return run is not None and run <= instant

    try:
        low = _wall_time(instant, zone).replace(microsecond=0)
    except OverflowError:
        return None
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


# --------------------------------------------------------------------------- rules

_PERIOD_SECONDS = {WEEKLY: 7 * 86400, DAILY: 86400, HOURLY: 3600, MINUTELY: 60, SECONDLY: 1}


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


@dataclass(frozen=True)
class _Rule:
    """One recurrence rule, expanded in naive wall-clock time of the schedule's zone."""

    template: rrule
    frequency: int
    interval: int
    week_start: int  # WKST, 0 = Monday
    start: datetime | None  # naive DTSTART; None for cron, which has no phase to keep
    has_count: bool  # COUNT rules must be walked from DTSTART to be counted right

    def expansion_from(self, not_before: datetime | None, *, rebase: bool) -> rrule:
        """The rule, restarted as close before `not_before` as its phase allows."""
        if not_before is None or self.has_count:
            return self.template
        if self.start is None:
            return self.template.replace(dtstart=not_before)
        if not rebase:
            return self.template
        start = self.rebased_start(self.start, not_before)
        return self.template if start == self.start else self.template.replace(dtstart=start)

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


def _some_day_matches(
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


# --------------------------------------------------------------------------- schedule


@dataclass(frozen=True, eq=False)
class Schedule:
    """A parsed schedule; build it with `parse_schedule`.

    All public methods take and return aware datetimes; results are in UTC and
    strictly increasing.
    """

    text: str
    timezone: str
    kind: ScheduleKind
    _zone: ZoneInfo = field(repr=False)
    _rules: tuple[_Rule, ...] = field(repr=False)
    _rdates: tuple[datetime, ...] = field(repr=False, default=())
    _exdates: tuple[datetime, ...] = field(repr=False, default=())

    def next_after(self, instant: datetime, *, inclusive: bool = False) -> datetime | None:
        """The first occurrence after `instant` (or at it, if inclusive); None if exhausted."""
        return next(self._run_instants(instant, inclusive=inclusive), None)

    def between(self, start: datetime, end: datetime, *, limit: int) -> list[datetime]:
        """Occurrences t with start <= t <= end, ascending, at most `limit` of them."""
        _require_aware(end, "end")
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        runs: list[datetime] = []
        for run in self._run_instants(start, inclusive=True):
            if run > end or len(runs) >= limit:
                break
            runs.append(run)
        return runs

    def _run_instants(
        self, instant: datetime | None, *, inclusive: bool, rebase: bool = True
    ) -> Iterator[datetime]:
        """Occurrences after `instant` (all of them if None) as strictly increasing UTC.

        `rebase=False` walks every rule from its DTSTART; only tests use it, to check
        that rebasing changes nothing.
        """
        not_before: datetime | None = None
        if instant is not None:
            _require_aware(instant, "instant")
            try:
                # An occurrence running at `instant` may have a wall time just before it:
                # the gap-end instant is where every wall time inside the gap runs.
                not_before = _wall_time(instant - _ONE_SECOND, self._zone).replace(microsecond=0)
            except OverflowError:
                if instant.astimezone(UTC).year > 5000:
                    return
        expansion = rruleset()
        for rule in self._rules:
            expansion.rrule(rule.expansion_from(not_before, rebase=rebase))
        for rdate in self._rdates:
            expansion.rdate(rdate)
        for exdate in self._exdates:
            expansion.exdate(exdate)
        wall_times: Iterator[datetime]
        if not_before is None:
            wall_times = iter(expansion)
        else:
            wall_times = expansion.xafter(not_before, inc=True)

        reached = not_before or datetime.min
        previous: datetime | None = None
        try:
            for wall_time in wall_times:
                reached = wall_time
                run = _run_instant(wall_time, self._zone)
                if run is None:
                    return
                if run == previous or (
                    instant is not None and (run < instant or (run == instant and not inclusive))
                ):
                    continue
                previous = run
                yield run
        except ValueError as error:  # dateutil stops past the year 9999 or on an empty rule
            if reached.year >= datetime.max.year - 1:
                return
            raise ScheduleError(f"RRULE: rule has no occurrences ({error})") from None


# --------------------------------------------------------------------------- cron


@dataclass(frozen=True)
class _CronField:
    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)


_MONTH_NAMES = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
_WEEKDAY_NAMES = "SUN MON TUE WED THU FRI SAT".split()
_CRON_FIELDS = (
    _CronField("minute", 0, 59),
    _CronField("hour", 0, 23),
    _CronField("day-of-month", 1, 31),
    _CronField("month", 1, 12, {name: number for number, name in enumerate(_MONTH_NAMES, 1)}),
    _CronField("day-of-week", 0, 7, {name: number for number, name in enumerate(_WEEKDAY_NAMES)}),
)
_CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NUMBER = re.compile(r"[0-9]+")
# Cron rules always start at the query instant; this start is only a placeholder.
_CRON_TEMPLATE_START = datetime(2000, 1, 1)


def _cron_value(text: str, spec: _CronField) -> int:
    where = f"cron field {spec.name!r}"
    if _NUMBER.fullmatch(text):
        value = int(text)
        if not spec.low <= value <= spec.high:
            raise ScheduleError(f"{where} value {value} out of range {spec.low}-{spec.high}")
        return value
    if text.upper() in spec.names:
        return spec.names[text.upper()]
    if spec.names and text.isalpha():
        raise ScheduleError(f"{where} unknown name {text!r}")
    raise ScheduleError(f"{where} invalid value {text!r}")


def _cron_item(item: str, spec: _CronField) -> range:
    """Values of one list item: N, NAME, *, A-B, */S or A-B/S."""
    where = f"cron field {spec.name!r}"
    if not item:
        raise ScheduleError(f"{where} has an empty list item")
    span, slash, step_text = item.partition("/")
    if span == "*":
        first, last = spec.low, spec.high
    elif "-" in span:
        first_text, _, last_text = span.partition("-")
        first, last = _cron_value(first_text, spec), _cron_value(last_text, spec)
        if first > last:
            raise ScheduleError(f"{where} range {span!r} runs backwards")
    elif slash:
        raise ScheduleError(f"{where} step {item!r} needs '*' or a range before '/'")
    else:
        value = _cron_value(span, spec)
        return range(value, value + 1)
    step = 1
    if slash:
        size = spec.high - spec.low + 1
        if not _NUMBER.fullmatch(step_text) or not 1 <= int(step_text) <= size:
            raise ScheduleError(f"{where} step {step_text!r} in {item!r} must be 1-{size}")
        step = int(step_text)
    return range(first, last + 1, step)


def _cron_field(text: str, spec: _CronField) -> list[int]:
    return sorted({value for item in text.split(",") for value in _cron_item(item, spec)})


def _cron_rule(
    minutes: list[int],
    hours: list[int],
    months: list[int],
    month_days: list[int] | None,
    cron_weekdays: list[int] | None,
) -> _Rule:
    template = rrule(
        DAILY,
        dtstart=_CRON_TEMPLATE_START,
        byminute=minutes,
        byhour=hours,
        bysecond=0,
        bymonth=months if len(months) < 12 else None,
        bymonthday=month_days,
        # cron counts Sunday as 0 (and 7); dateutil counts Monday as 0
        byweekday=None if cron_weekdays is None else sorted({(d - 1) % 7 for d in cron_weekdays}),
    )
    return _Rule(template, DAILY, 1, week_start=0, start=None, has_count=False)


def _parse_cron(text: str) -> tuple[_Rule, ...]:
    if text.startswith("@"):
        if text.lower() not in _CRON_MACROS:
            raise ScheduleError(f"cron: unknown macro {text!r}")
        text = _CRON_MACROS[text.lower()]
    fields = text.split()
    if len(fields) != len(_CRON_FIELDS):
        names = " ".join(spec.name for spec in _CRON_FIELDS)
        raise ScheduleError(f"cron: expected 5 fields ({names}), got {len(fields)}")
    minutes, hours, month_days, months, cron_weekdays = (
        _cron_field(field_text, spec) for field_text, spec in zip(fields, _CRON_FIELDS, strict=True)
    )
    # Vixie cron: a day-of-month or day-of-week field starting with '*' is unrestricted.
    # Only when both are restricted does a day match if EITHER matches.
    if not fields[2].startswith("*") and not fields[4].startswith("*"):
        weekday_rule = _cron_rule(minutes, hours, months, None, cron_weekdays)
        if not _some_day_matches(months, month_days):
            return (weekday_rule,)  # an impossible day rule would make dateutil spin to 9999
        return (_cron_rule(minutes, hours, months, month_days, None), weekday_rule)
    if not _some_day_matches(months, month_days):
        raise ScheduleError(
            f"cron: schedule has no occurrences (day-of-month {fields[2]!r} never occurs "
            f"in month {fields[3]!r})"
        )
    return (
        _cron_rule(
            minutes,
            hours,
            months,
            month_days if len(month_days) < 31 else None,
            cron_weekdays if len({d % 7 for d in cron_weekdays}) < 7 else None,
        ),
    )


# --------------------------------------------------------------------------- RRULE

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


def _positive_integer(text: str, part: str, *, allow_zero: bool = False) -> int:
    if not _NUMBER.fullmatch(text) or (int(text) == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ScheduleError(f"RRULE: {part} must be a {kind} integer, got {text!r}")
    return int(text)


def _byday(text: str, frequency: int) -> list[weekday]:
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


def _parse_rule(text: str, start: datetime, zone: ZoneInfo) -> _Rule:
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
    for name, value in parts.items():
        if name in _PART_FREQUENCIES and frequency not in _PART_FREQUENCIES[name]:
            raise ScheduleError(f"RRULE: {name} cannot be used with FREQ={frequency_name}")
        if name in _NUMBER_LIST_PARTS:
            keyword, low, high, signed = _NUMBER_LIST_PARTS[name]
            options[keyword] = _number_list(value, name, low, high, signed)
        elif name == "INTERVAL":
            options["interval"] = _positive_integer(value, name)
        elif name == "COUNT":
            options["count"] = _positive_integer(value, name, allow_zero=True)
        elif name == "UNTIL":
            options["until"] = _until_wall_time(_parse_date_time(value, "RRULE: UNTIL"), zone)
        elif name == "WKST":
            if value not in _WEEKDAY_CODES:
                raise ScheduleError(f"RRULE: invalid WKST value {value!r}")
            options["wkst"] = _WEEKDAY_CODES.index(value)
        elif name == "BYDAY":
            options["byweekday"] = _byday(value, frequency)
        else:
            raise ScheduleError(f"RRULE: unknown part {name!r}")

    _make_defaults_explicit(options, frequency, start)
    if not _some_day_matches(
        options.get("bymonth", ()), options.get("bymonthday", ()), options.get("byyearday", ())
    ):
        filters = "BYMONTH/BYMONTHDAY/BYYEARDAY"
        raise ScheduleError(f"RRULE: rule has no occurrences (no day passes {filters})")
    try:
        template = rrule(frequency, dtstart=start, **options)
    except ValueError as error:
        raise ScheduleError(f"RRULE: rule has no occurrences ({error})") from None
    return _Rule(
        template,
        frequency,
        options["interval"],
        week_start=options["wkst"],
        start=start,
        has_count="count" in options,
    )


def _until_wall_time(until: _DateTimeValue, zone: ZoneInfo) -> datetime | None:
    if until.is_date:  # a date bounds the rule inclusively: the whole day counts
        return until.value.replace(hour=23, minute=59, second=59)
    if until.is_utc:
        return _latest_wall_time_until(until.value.replace(tzinfo=UTC), zone)
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


def _date_values(prop: str, params: Sequence[str], value: str, zone: ZoneInfo) -> list[datetime]:
    """DTSTART / RDATE / EXDATE values as naive wall times of the schedule's zone."""
    value_zone: ZoneInfo | None = None
    for param in params:
        name, _, param_value = param.partition("=")
        name = name.strip().upper()
        if name == "TZID":
            value_zone = _load_zone(param_value.strip().strip('"'))
        elif name != "VALUE" or param_value.strip().upper() not in ("DATE-TIME", "DATE"):
            raise ScheduleError(f"{prop}: unsupported parameter {param!r}")
    wall_times = []
    for item in value.split(","):
        parsed = _parse_date_time(item, prop)
        if parsed.is_utc and value_zone is not None:
            raise ScheduleError(f"{prop}: {item!r} is UTC but a TZID is also given")
        if prop == "DTSTART" and value_zone is not None and value_zone.key != zone.key:
            raise ScheduleError(f"DTSTART: TZID {value_zone.key!r} is not {zone.key!r}")
        if parsed.is_utc:
            source_zone: tzinfo = UTC
        elif value_zone is not None and value_zone.key != zone.key:
            source_zone = value_zone
        else:
            wall_times.append(parsed.value)  # already wall time in the schedule's zone
            continue
        try:
            wall_times.append(_wall_time(parsed.value.replace(tzinfo=source_zone), zone))
        except OverflowError:
            raise ScheduleError(f"{prop}: {item!r} is out of range") from None
    return wall_times


def _parse_rrule_text(
    text: str, zone: ZoneInfo, anchor: datetime
) -> tuple[tuple[_Rule, ...], tuple[datetime, ...], tuple[datetime, ...]]:
    """RRULE text -> (rules, RDATE wall times, EXDATE wall times)."""
    start: datetime | None = None
    rule_texts: list[str] = []
    rdates: list[datetime] = []
    exdates: list[datetime] = []
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
    rules = tuple(_parse_rule(rule_text, start or anchor, zone) for rule_text in rule_texts)
    for number, rule in enumerate(rules, start=1):
        # Checked one by one: a rule that never matches would make every query walk
        # dateutil's expansion up to the year 9999, even next to rules that do match.
        if not _has_occurrence(rule.template):
            which = "rule" if len(rules) == 1 else f"rule {number}"
            raise ScheduleError(f"RRULE: {which} has no occurrences")
    return rules, tuple(rdates), tuple(exdates)


def _has_occurrence(rule: rrule) -> bool:
    try:
        return next(iter(rule), None) is not None
    except ValueError:  # dateutil: an empty BYxxx combination, or past the year 9999
        return False


def _looks_like_cron(text: str) -> bool:
    """RRULE text always has '=' (FREQ=...) or ':' (DTSTART:...); cron never does."""
    return text.startswith("@") or not ("=" in text or ":" in text)


def parse_schedule(
    text: str,
    timezone: str,
    *,
    anchor: datetime | None = None,
    definition: str | None = None,
) -> Schedule:
    """Parse an RRULE or cron schedule evaluated in the IANA zone `timezone`.

    `anchor` (aware) starts an RRULE that has no DTSTART line; it is read as wall time
    in `timezone`, without microseconds.  Default: 2000-01-01 00:00 local.  Cron has no
    anchor.  `definition` only names the definition in error messages.
    """
    try:
        zone = _load_zone(timezone)
        stripped = text.strip()
        if not stripped:
            raise ScheduleError("schedule text is empty")
        if _looks_like_cron(stripped):
            return Schedule(text, timezone, "cron", zone, _parse_cron(stripped))
        if anchor is None:
            anchor_wall_time = DEFAULT_ANCHOR_WALL_TIME
        else:
            if anchor.tzinfo is None or anchor.utcoffset() is None:
                raise ScheduleError(f"anchor must be timezone-aware, got {anchor!r}")
            anchor_wall_time = _wall_time(anchor, zone).replace(microsecond=0)
        rules, rdates, exdates = _parse_rrule_text(stripped, zone, anchor_wall_time)
        schedule = Schedule(text, timezone, "rrule", zone, rules, rdates, exdates)
        if next(schedule._run_instants(None, inclusive=True), None) is None:
            raise ScheduleError("RRULE: rule has no occurrences")
        return schedule
    except ScheduleError as error:
        raise ScheduleError(error.detail, definition=definition) from None


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Plan:
    """What to materialize now: run times (UTC), where to resume, how many were late.

    `missed` counts the considered occurrences older than now - misfire_grace, whatever
    the policy did with them (ran them late, coalesced them or skipped them).
    """

    run_times: list[datetime]
    next_cursor: datetime | None
    missed: int


def plan_materialization(
    schedule: Schedule,
    cursor: datetime,
    now: datetime,
    *,
    misfire_policy: str,
    lookahead: timedelta,
    misfire_grace: timedelta,
    max_runs: int,
) -> Plan:
    """Decide which occurrences from `cursor` up to now + lookahead to materialize.

    `cursor` is the earliest occurrence not yet materialized.  An occurrence t is due
    if cursor <= t <= now + lookahead and missed if t < now - misfire_grace.  Policies:
    ``catch_up`` runs every due occurrence; ``coalesce`` runs one run at the latest
    missed occurrence, then the due ones that are not missed; ``skip`` drops the missed
    ones.  At most `max_runs` runs are planned (a coalesced run counts as one); when
    that cap stops the plan, next_cursor is the first occurrence not taken.
    """
    if misfire_policy not in MISFIRE_POLICIES:
        expected = ", ".join(MISFIRE_POLICIES)
        raise ValueError(f"unknown misfire policy {misfire_policy!r} (expected {expected})")
    if max_runs < 1:
        raise ValueError(f"max_runs must be at least 1, got {max_runs}")
    if lookahead < timedelta(0) or misfire_grace < timedelta(0):
        raise ValueError("lookahead and misfire_grace must not be negative")
    _require_aware(now, "now")
    horizon = now + lookahead
    missed_before = now - misfire_grace

    run_times: list[datetime] = []
    missed = 0
    latest_missed: datetime | None = None  # waiting to be coalesced
    for occurrence in schedule._run_instants(cursor, inclusive=True):
        if occurrence > horizon or len(run_times) >= max_runs:
            next_cursor: datetime | None = occurrence
            break
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
                break
        run_times.append(occurrence)
    else:
        next_cursor = None
    if latest_missed is not None:
        run_times.append(latest_missed)
    return Plan(run_times, next_cursor, missed)


def first_cursor(schedule: Schedule, now: datetime) -> datetime | None:
    """The first occurrence at or after `now`: where materialization of a new schedule starts."""
    return schedule.next_after(now, inclusive=True)


# --------------------------------------------------------------------------- preview


def preview(schedule: Schedule, after: datetime, count: int) -> list[tuple[datetime, datetime]]:
    """The next `count` occurrences after `after`, as (local aware, UTC aware) pairs."""
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    runs: list[tuple[datetime, datetime]] = []
    for run in schedule._run_instants(after, inclusive=False):
        if len(runs) >= count:
            break
        runs.append((run.astimezone(schedule._zone), run))
    return runs


def _format_offset(offset: timedelta | None) -> str:
    seconds = int(offset.total_seconds()) if offset is not None else 0
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")


def format_preview(schedule: Schedule, after: datetime, count: int) -> list[str]:
    """`preview` as text, one line per run, local time first, e.g.

    ``2026-03-30 09:00 Mon EEST (+03:00)  2026-03-30T06:00:00Z``
    """
    lines = []
    for local, utc in preview(schedule, after, count):
        stamp = local.strftime("%Y-%m-%d %H:%M:%S %a" if local.second else "%Y-%m-%d %H:%M %a")
        offset = _format_offset(local.utcoffset())
        lines.append(f"{stamp} {local.tzname()} ({offset})  {utc:%Y-%m-%dT%H:%M:%SZ}")
    return lines
