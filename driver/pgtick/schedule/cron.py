"""5-field cron expressions and ``@daily``-style macros, as cronie (Vixie cron) reads them.

* day-of-month and day-of-week: when both are restricted a day matches if EITHER does;
  a field that starts with ``*`` (``*``, ``*/2``) is unrestricted;
* day-of-week 0 and 7 are Sunday, and a range that ends in Sunday (``fri-sun``,
  ``5-0``) ends at 7;
* a step larger than its whole field (``*/90`` for minutes) is refused with the RRULE
  to write instead: cron steps restart at every hour, day or month.

Cron is expanded as a DAILY `Rule` with no phase of its own.  A schedule whose minute
or hour field starts with ``*`` is interval-like: it follows real time (zones.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from dateutil.rrule import DAILY, rrule

from pgtick.schedule.rrule import Rule, some_day_matches
from pgtick.schedule.zones import ScheduleError


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
# What a step too large for its field means, and the RRULE that says it.
_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_RESTARTS = dict(zip(_FIELDS, ("hour", "day", "month", "year", "week"), strict=True))
_UNITS = dict(zip(_FIELDS, ("minutes", "hours", "days", "months", "days"), strict=True))
_FREQS = dict(zip(_FIELDS, ("MINUTELY", "HOURLY", "DAILY", "MONTHLY", "DAILY"), strict=True))
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
        if spec.name == "day-of-week" and last == 0 and first > 0:
            last = 7  # cronie: a range that ends in Sunday ends at 7 (fri-sun, 5-0)
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
        if not _NUMBER.fullmatch(step_text) or int(step_text) < 1:
            raise ScheduleError(f"{where} step {step_text!r} in {item!r} must be 1-{size}")
        if int(step_text) > size:
            raise ScheduleError(
                f"{where} step {step_text!r} in {item!r} must be 1-{size}: cron steps restart "
                f"every {_RESTARTS[spec.name]}; for every {step_text} {_UNITS[spec.name]} write "
                f"an RRULE such as FREQ={_FREQS[spec.name]};INTERVAL={step_text}"
            )
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
) -> Rule:
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
    return Rule(template, DAILY, 1, week_start=0, start=None, count=None)


def parse_cron(text: str) -> tuple[tuple[Rule, ...], bool]:
    """Cron text -> (rules, follows real time: the minute or hour field starts with '*')."""
    if text.startswith("@"):
        if text.lower() not in _CRON_MACROS:
            raise ScheduleError(f"cron: unknown macro {text!r}")
        text = _CRON_MACROS[text.lower()]
    fields = text.split()
    return _parse_cron(text), len(fields) == 5 and (fields[0].startswith("*") or fields[1].startswith("*"))


def _parse_cron(text: str) -> tuple[Rule, ...]:
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
        if not some_day_matches(months, month_days):
            return (weekday_rule,)  # an impossible day rule would make dateutil spin to 9999
        return (_cron_rule(minutes, hours, months, month_days, None), weekday_rule)
    if not some_day_matches(months, month_days):
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
