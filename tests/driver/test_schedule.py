"""Tests for pgtick.schedule: DST handling, cron and RRULE expansion, rebasing, planning."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from dateutil.rrule import rrule, rrulestr
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from pgtick.schedule import (
    Plan,
    Schedule,
    ScheduleError,
    first_cursor,
    format_preview,
    plan_materialization,
    preview,
)
from pgtick.schedule import parse_schedule as parse_with_anchor
from pgtick.schedule.rrule import Walked


def parse_schedule(
    text: str, timezone: str, *, anchor: datetime | None = None, **options: str | None
) -> Schedule:
    """parse_schedule anchored, unless told otherwise, at 2000-01-01 00:00 local time."""
    if anchor is None:
        try:
            anchor = datetime(2000, 1, 1, tzinfo=ZoneInfo(timezone))
        except (LookupError, ValueError, OSError):
            anchor = datetime(2000, 1, 1, tzinfo=UTC)
    return parse_with_anchor(text, timezone, anchor=anchor, **options)


def utc(year: int, month: int, day: int, h: int = 0, m: int = 0, s: int = 0) -> datetime:
    return datetime(year, month, day, h, m, s, tzinfo=UTC)


def runs_on(schedule: Schedule, day: date) -> list[datetime]:
    """Runs whose local date (in the schedule's zone) is `day`."""
    zone = ZoneInfo(schedule.timezone)
    around = datetime(day.year, day.month, day.day, tzinfo=UTC)
    runs = schedule.between(around - timedelta(days=2), around + timedelta(days=2), limit=10_000)
    return [run for run in runs if run.astimezone(zone).date() == day]


def assert_strictly_increasing(runs: list[datetime]) -> None:
    assert all(earlier < later for earlier, later in pairwise(runs)), runs


# --------------------------------------------------------------------------- DST


def test_daily_0800_in_sofia_is_0800_local_every_day_of_2026() -> None:
    zone = ZoneInfo("Europe/Sofia")
    schedule = parse_schedule("FREQ=DAILY;BYHOUR=8;BYMINUTE=0", "Europe/Sofia")
    runs = schedule.between(utc(2026, 1, 1), utc(2026, 12, 31, 23, 59, 59), limit=1000)

    assert len(runs) == 365
    assert [run.astimezone(zone).date() for run in runs] == [
        date(2026, 1, 1) + timedelta(days=offset) for offset in range(365)
    ]
    for run in runs:
        local = run.astimezone(zone)
        assert (local.hour, local.minute, local.second) == (8, 0, 0)
        summer = date(2026, 3, 29) <= local.date() < date(2026, 10, 25)
        assert run.hour == (5 if summer else 6), run
    assert runs_on(schedule, date(2026, 3, 29)) == [utc(2026, 3, 29, 5)]
    assert runs_on(schedule, date(2026, 10, 25)) == [utc(2026, 10, 25, 6)]


@pytest.mark.parametrize(
    ("text", "gap_run"),
    [("FREQ=DAILY;BYHOUR=2;BYMINUTE=30", utc(2026, 3, 8, 7, 30)), ("30 2 * * *", utc(2026, 3, 8, 7))],
)
def test_0230_in_new_york_runs_once_on_both_change_days(text: str, gap_run: datetime) -> None:
    schedule = parse_schedule(text, "America/New_York")
    # 02:30 does not exist on 2026-03-08: RRULE reads it with the offset before the gap
    # (03:30 EDT, RFC 5545); cron runs it when the gap ends (03:00 EDT, Vixie cron).
    assert runs_on(schedule, date(2026, 3, 8)) == [gap_run]
    # 02:30 exists once on 2026-11-01 (clocks went back at 02:00 EDT to 01:00 EST).
    assert runs_on(schedule, date(2026, 11, 1)) == [utc(2026, 11, 1, 7, 30)]
    assert runs_on(schedule, date(2026, 3, 9)) == [utc(2026, 3, 9, 6, 30)]


@pytest.mark.parametrize("text", ["FREQ=DAILY;BYHOUR=1;BYMINUTE=30", "30 1 * * *"])
def test_ambiguous_0130_in_new_york_runs_once_at_its_first_occurrence(text: str) -> None:
    schedule = parse_schedule(text, "America/New_York")
    assert runs_on(schedule, date(2026, 11, 1)) == [utc(2026, 11, 1, 5, 30)]  # 01:30 EDT
    assert runs_on(schedule, date(2026, 11, 2)) == [utc(2026, 11, 2, 6, 30)]  # 01:30 EST


def test_every_15_minutes_in_the_gap_hour_runs_once_at_gap_end_when_told() -> None:
    schedule = parse_schedule("*/15 2 * * *", "America/New_York", dst_gap="end")
    assert runs_on(schedule, date(2026, 3, 8)) == [utc(2026, 3, 8, 7)]
    assert runs_on(schedule, date(2026, 3, 7)) == [utc(2026, 3, 7, 7, m) for m in (0, 15, 30, 45)]
    assert runs_on(schedule, date(2026, 11, 1)) == [utc(2026, 11, 1, 7, m) for m in (0, 15, 30, 45)]
    runs = schedule.between(utc(2026, 3, 1), utc(2026, 3, 15), limit=100)
    assert_strictly_increasing(runs)
    assert len(runs) == 14 * 4 - 3


@pytest.mark.parametrize(
    ("text", "gap_run"),
    [("FREQ=DAILY;BYHOUR=2;BYMINUTE=15", utc(2026, 10, 3, 15, 45)), ("15 2 * * *", utc(2026, 10, 3, 15, 30))],
)
def test_lord_howe_half_hour_shifts(text: str, gap_run: datetime) -> None:
    schedule = parse_schedule(text, "Australia/Lord_Howe")
    # 2026-10-04 02:00 +10:30 -> 02:30 +11:00: 02:15 is missing; RRULE shifts it by the
    # half hour (02:45 +11:00, 15:45Z), cron runs it when the gap ends (02:30, 15:30Z).
    assert runs_on(schedule, date(2026, 10, 4)) == [gap_run]
    assert runs_on(schedule, date(2026, 10, 5)) == [utc(2026, 10, 4, 15, 15)]
    # 2026-04-05 02:00 +11:00 -> 01:30 +10:30: 02:15 is after the repeated half hour.
    assert runs_on(schedule, date(2026, 4, 5)) == [utc(2026, 4, 4, 15, 45)]


def test_lord_howe_repeated_half_hour_runs_once() -> None:
    schedule = parse_schedule("45 1 * * *", "Australia/Lord_Howe")
    assert runs_on(schedule, date(2026, 4, 5)) == [utc(2026, 4, 4, 14, 45)]  # 01:45 +11:00


@pytest.mark.parametrize(("zone_name", "utc_hour"), [("Asia/Tokyo", 0), ("UTC", 9)])
def test_zone_without_dst_keeps_the_same_utc_time_all_year(zone_name: str, utc_hour: int) -> None:
    schedule = parse_schedule("0 9 * * *", zone_name)
    runs = schedule.between(utc(2026, 1, 1), utc(2026, 12, 31, 23), limit=1000)
    assert len(runs) == 365
    assert {(run.hour, run.minute) for run in runs} == {(utc_hour, 0)}


def test_results_are_aware_utc() -> None:
    schedule = parse_schedule("0 9 * * *", "Europe/Sofia")
    run = schedule.next_after(utc(2026, 1, 1))
    assert run == utc(2026, 1, 1, 7)
    assert run is not None and run.tzinfo is UTC


def test_next_after_is_exclusive_unless_inclusive() -> None:
    schedule = parse_schedule("30 2 * * *", "America/New_York")
    gap_end = utc(2026, 3, 8, 7)
    assert schedule.next_after(gap_end, inclusive=True) == gap_end
    assert schedule.next_after(gap_end) == utc(2026, 3, 9, 6, 30)
    assert schedule.next_after(gap_end - timedelta(microseconds=1)) == gap_end


def test_naive_instants_are_rejected() -> None:
    schedule = parse_schedule("0 9 * * *", "UTC")
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_after(datetime(2026, 1, 1))


# --------------------------------------------------------------------------- cron vs croniter
#
# croniter is the oracle, run with implement_cron_bug=True so that a day-of-month or
# day-of-week field *starting* with '*' counts as unrestricted, as in Vixie cron (its
# default day_or=True then gives the OR of both day fields when both are restricted).
# The generator avoids two spots where croniter deliberately departs from Vixie cron:
# equal-bound ranges ('5-5' means the whole cycle to croniter) and '*' items after the
# first list item (croniter looks for '*' anywhere in the field, Vixie at its start).
# croniter handles DST gaps and repeated hours differently from us, so in zones with
# DST only occurrences more than a day away from any UTC offset change are compared;
# UTC and fixed-offset zones are compared in full.

MONTH_NAMES = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
WEEKDAY_NAMES = "SUN MON TUE WED THU FRI SAT".split()


@st.composite
def cron_fields(draw: st.DrawFn, low: int, high: int, names: list[str] | None = None) -> str:
    name_low = 1 if names == MONTH_NAMES else 0

    def show(value: int) -> str:
        if names and name_low <= value < name_low + len(names) and draw(st.booleans()):
            name = names[value - name_low]
            return draw(st.sampled_from([name, name.lower(), name.title()]))
        return str(value)

    items = []
    for position in range(draw(st.integers(1, 3))):
        kinds = ["value", "range", "range-step"] + (["*", "*-step"] if position == 0 else [])
        kind = draw(st.sampled_from(kinds))
        step = draw(st.integers(1, high - low + 1))
        if kind == "*":
            items.append("*")
        elif kind == "*-step":
            items.append(f"*/{step}")
        elif kind == "value":
            items.append(show(draw(st.integers(low, high))))
        else:
            first = draw(st.integers(low, high - 1))
            last = draw(st.integers(first + 1, high))
            span = f"{show(first)}-{show(last)}"
            items.append(span if kind == "range" else f"{span}/{step}")
    return ",".join(items)


cron_expressions = st.tuples(
    cron_fields(0, 59),
    cron_fields(0, 23),
    cron_fields(1, 31),
    cron_fields(1, 12, MONTH_NAMES),
    cron_fields(0, 7, WEEKDAY_NAMES),
).map(" ".join)
start_instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)


def next_runs(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    runs: list[datetime] = []
    while len(runs) < count:
        run = schedule.next_after(runs[-1] if runs else start)
        assert run is not None
        runs.append(run)
    return runs


def croniter_runs(expression: str, start: datetime, zone: ZoneInfo, count: int) -> list[datetime]:
    oracle = croniter(expression, start.astimezone(zone), implement_cron_bug=True)
    return [oracle.get_next(datetime).astimezone(UTC) for _ in range(count)]


def parse_or_skip(expression: str, zone_name: str) -> Schedule:
    try:
        return parse_schedule(expression, zone_name)
    except ScheduleError as error:
        # e.g. '0 0 30 2 *': nothing to compare, but croniter must agree it never runs
        assert "no occurrences" in str(error)
        assert not croniter.is_valid(expression, strict=True), expression
        assume(False)
        raise


def near_offset_change(instant: datetime, zone: ZoneInfo) -> bool:
    """Whether the zone's UTC offset changes within about a day of `instant`."""
    window = timedelta(hours=26)
    before = (instant - window).astimezone(zone).utcoffset()
    after = (instant + window).astimezone(zone).utcoffset()
    return before != after


def against_croniter(examples: int, zones: list[str]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A property test over random cron expressions, start instants and one of ``zones``."""

    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        chosen = given(expression=cron_expressions, start=start_instants, zone_name=st.sampled_from(zones))
        return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])(
            chosen(test)
        )

    return wrap


@against_croniter(2000, ["UTC", "Asia/Kolkata", "Etc/GMT+11"])
def test_cron_matches_croniter_in_fixed_offset_zones(
    expression: str, start: datetime, zone_name: str
) -> None:
    schedule = parse_or_skip(expression, zone_name)
    ours = next_runs(schedule, start, 5)
    assert ours == croniter_runs(expression, start, ZoneInfo(zone_name), 5), expression
    assert_strictly_increasing(ours)


@against_croniter(1000, ["America/New_York", "Europe/Sofia", "Australia/Lord_Howe"])
def test_cron_matches_croniter_away_from_dst_changes(
    expression: str, start: datetime, zone_name: str
) -> None:
    zone = ZoneInfo(zone_name)
    schedule = parse_or_skip(expression, zone_name)
    theirs = croniter_runs(expression, start, zone, 5)
    ours = schedule.between(start + timedelta(microseconds=1), theirs[-1], limit=10_000)
    assert_strictly_increasing(ours)
    assert [t for t in ours if not near_offset_change(t, zone)] == [
        t for t in theirs if not near_offset_change(t, zone)
    ], expression


def test_cron_day_fields_follow_vixie_or_and_semantics() -> None:
    # Both day fields restricted: the 13th OR any Friday.
    either = parse_schedule("0 0 13 * FRI", "UTC")
    days = [run.day for run in either.between(utc(2026, 3, 1), utc(2026, 3, 31), limit=50)]
    assert days == [6, 13, 20, 27]
    # A field starting with '*' is unrestricted: odd days AND Mondays.
    both = parse_schedule("0 0 */2 * MON", "UTC")
    days = [run.day for run in both.between(utc(2026, 3, 1), utc(2026, 3, 31), limit=50)]
    assert days == [9, 23]
    # Day-of-week 7 is Sunday, like 0.
    sundays = parse_schedule("0 0 * * 7", "UTC").between(utc(2026, 3, 1), utc(2026, 3, 31), limit=9)
    assert [run.day for run in sundays] == [1, 8, 15, 22, 29]


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@ANNUALLY", "0 0 1 1 *"),
    ],
)
def test_cron_macros(macro: str, equivalent: str) -> None:
    start, end = utc(2025, 12, 1), utc(2028, 1, 1)
    macro_runs = parse_schedule(macro, "Europe/Sofia").between(start, end, limit=100)
    assert macro_runs == parse_schedule(equivalent, "Europe/Sofia").between(start, end, limit=100)
    assert macro_runs and parse_schedule(macro, "UTC").kind == "cron"


# --------------------------------------------------------------------------- RRULE vs dateutil

RRULE_TEXTS = [
    "DTSTART:20260105T090000\nRRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1",
    "DTSTART:20260101T100000\nRRULE:FREQ=YEARLY;BYWEEKNO=20;BYDAY=MO",
    "DTSTART:20260101T100000\nRRULE:FREQ=YEARLY;BYWEEKNO=1,-1;BYDAY=MO,SU;WKST=SU",
    "DTSTART:20260102T083000\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=TU,TH;COUNT=25",
    "DTSTART:20260101T000000\nRRULE:FREQ=DAILY;UNTIL=20260315T000000",
    "DTSTART:20260101T080000\nRRULE:FREQ=DAILY;BYHOUR=8,20\n"
    "EXDATE:20260103T080000,20260110T200000\nRDATE:20260105T123000,20270101T000000",
    "DTSTART:20260131T070000\nRRULE:FREQ=MONTHLY;COUNT=14",
    "DTSTART:20240229T120000\nRRULE:FREQ=YEARLY;COUNT=3",
    "DTSTART:20260101T000000\nRRULE:FREQ=MONTHLY;BYDAY=-2FR;BYMONTH=1,4,7,10",
    "DTSTART:20260101T000000\nRRULE:FREQ=YEARLY;BYYEARDAY=1,100,-1;BYHOUR=6",
    "DTSTART:20260101T000000\nRRULE:FREQ=MONTHLY;BYMONTHDAY=-1,15;BYHOUR=9;BYMINUTE=15,45",
    "DTSTART:20260101T000000\nRRULE:FREQ=HOURLY;INTERVAL=5;BYDAY=SA,SU",
    "DTSTART:20260101T000000\nRRULE:FREQ=MINUTELY;INTERVAL=45;BYHOUR=9,10,11;COUNT=40",
    "DTSTART:20260101T000000\nRRULE:FREQ=SECONDLY;INTERVAL=90;BYMINUTE=0,30;COUNT=30",
    "DTSTART:20260101T000000\nRRULE:FREQ=YEARLY;BYMONTH=11;BYDAY=4TH;BYHOUR=12",
    "DTSTART:20260101\nRRULE:FREQ=MONTHLY;INTERVAL=3;BYDAY=MO,FR;BYSETPOS=1,-1;UNTIL=20280101",
    "DTSTART:20260101T120000\nRRULE:FREQ=DAILY;COUNT=10\nRRULE:FREQ=WEEKLY;BYDAY=FR;COUNT=5",
    "FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=7;BYMINUTE=5",
    "RRULE:FREQ=MONTHLY;BYMONTHDAY=31;BYHOUR=23;BYMINUTE=59;BYSECOND=59",
]


@pytest.mark.parametrize("text", RRULE_TEXTS)
def test_rrule_matches_dateutil_expansion_in_utc(text: str) -> None:
    start, end = datetime(2025, 12, 31), datetime(2029, 1, 1)
    # dateutil's own expansion with a naive DTSTART (default: our 2000-01-01 anchor);
    # a date-only UTC UNTIL is inclusive of the whole day for us, so spell it out.
    oracle_text = text.replace("UNTIL=20280101", "UNTIL=20280101T235959")
    expected = rrulestr(oracle_text, dtstart=datetime(2000, 1, 1)).between(start, end, inc=True)
    schedule = parse_schedule(text, "UTC")
    ours = schedule.between(start.replace(tzinfo=UTC), end.replace(tzinfo=UTC), limit=10_000)
    assert [run.replace(tzinfo=None) for run in ours] == expected
    assert expected, "the oracle must produce something to compare"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29", utc(2028, 2, 29)),
        ("FREQ=DAILY;BYMONTH=2;BYMONTHDAY=-29", utc(2028, 2, 1)),
        ("FREQ=YEARLY;BYYEARDAY=366", utc(2028, 12, 31)),
        ("FREQ=YEARLY;BYYEARDAY=-366", utc(2028, 1, 1)),
        ("0 0 29 2 *", utc(2028, 2, 29)),
        ("0 0 31 2 MON", utc(2026, 2, 2)),  # the impossible day-of-month side drops out
    ],
)
def test_rare_but_possible_days_are_accepted(text: str, expected: datetime) -> None:
    assert parse_schedule(text, "UTC").next_after(utc(2026, 1, 1)) == expected


def some_day_matches(months: list[int], month_days: list[int], year_days: list[int]) -> bool:
    """Brute force over 2000-2003 (leap and common years) for the test below."""
    day = date(2000, 1, 1)
    while day.year < 2004:
        month_day_from_end = day.day - calendar.monthrange(day.year, day.month)[1] - 1
        year_day = day.timetuple().tm_yday
        year_day_from_end = year_day - (366 if calendar.isleap(day.year) else 365) - 1
        if (
            (not months or day.month in months)
            and (not month_days or {day.day, month_day_from_end} & set(month_days))
            and (not year_days or {year_day, year_day_from_end} & set(year_days))
        ):
            return True
        day += timedelta(days=1)
    return False


@settings(max_examples=300, deadline=None)
@given(
    months=st.lists(st.integers(1, 12), max_size=3, unique=True),
    month_days=st.lists(st.integers(1, 31) | st.integers(-31, -1), max_size=3, unique=True),
    year_days=st.lists(st.integers(1, 366) | st.integers(-366, -1), max_size=2, unique=True),
)
def test_rules_whose_days_never_exist_are_rejected_up_front(
    months: list[int], month_days: list[int], year_days: list[int]
) -> None:
    rule = "FREQ=MINUTELY"
    for name, values in (("BYMONTH", months), ("BYMONTHDAY", month_days), ("BYYEARDAY", year_days)):
        if values:
            rule += f";{name}=" + ",".join(map(str, values))
    possible = some_day_matches(months, month_days, year_days)
    began = time.perf_counter()
    try:
        schedule = parse_schedule(rule, "UTC")
    except ScheduleError as error:
        assert "has no occurrences" in str(error)
        assert not possible, rule
        assert time.perf_counter() - began < 0.5  # found without walking to the year 9999
    else:
        assert possible, rule
        assert schedule.next_after(utc(2026, 1, 1)) is not None


def test_dtstart_forms_agree() -> None:
    forms = [
        "DTSTART;TZID=Europe/Sofia:20260101T080000\nRRULE:FREQ=DAILY",
        "DTSTART:20260101T080000\nRRULE:FREQ=DAILY",
        "DTSTART:20260101T060000Z\nRRULE:FREQ=DAILY",
        "FREQ=DAILY",
    ]
    anchor = utc(2026, 1, 1, 6, 0, 0) + timedelta(microseconds=250)
    expected = [utc(2026, 1, 1, 6), utc(2026, 1, 2, 6), utc(2026, 7, 1, 5)]
    for text in forms:
        schedule = parse_schedule(text, "Europe/Sofia", anchor=anchor)
        runs = schedule.between(utc(2025, 12, 1), utc(2026, 12, 1), limit=1000)
        assert [runs[0], runs[1], runs[181]] == expected, text


def test_anchor_sets_the_phase_of_a_bare_rule() -> None:
    anchor = datetime(2026, 1, 1, 3, 17, 45, 123456, tzinfo=UTC)
    schedule = parse_schedule("FREQ=HOURLY;INTERVAL=5", "UTC", anchor=anchor)
    assert schedule.between(utc(2025, 1, 1), utc(2026, 1, 1, 14), limit=10) == [
        utc(2026, 1, 1, 3, 17, 45),
        utc(2026, 1, 1, 8, 17, 45),
        utc(2026, 1, 1, 13, 17, 45),
    ]


def test_utc_until_is_exact_inside_a_repeated_hour() -> None:
    # 06:45Z is 01:45 EST, the second pass of 01:xx; wall time 01:50 ran at 01:50 EDT
    # (05:50Z), before UNTIL, and 02:00 EST (07:00Z) is after it.
    text = "DTSTART:20261101T000000\nRRULE:FREQ=MINUTELY;INTERVAL=10;UNTIL=20261101T064500Z"
    schedule = parse_schedule(text, "America/New_York", dst_repeat="first")
    runs = schedule.between(utc(2026, 11, 1), utc(2026, 11, 2), limit=100)
    assert len(runs) == 12
    assert runs[-1] == utc(2026, 11, 1, 5, 50)
    assert schedule.next_after(runs[-1]) is None
    # Auto runs both readings of 01:xx; the second ones after UNTIL do not run.
    both = parse_schedule(text, "America/New_York").between(utc(2026, 11, 1), utc(2026, 11, 2), limit=100)
    assert both == runs[:6] + sorted(runs[6:] + [utc(2026, 11, 1, 6, m) for m in (0, 10, 20, 30, 40)])


@pytest.mark.parametrize(
    "beside",
    ["RDATE;TZID=America/New_York:20241201T090000", "RRULE:FREQ=WEEKLY;BYDAY=SU;BYHOUR=9;BYMINUTE=0;COUNT=6"],
    ids=["an-rdate", "a-second-rule"],
)
def test_a_utc_until_bounds_its_own_rules_instants_whatever_else_the_set_holds(beside: str) -> None:
    """RFC 5545: a rule's UNTIL bounds that rule's instances. Daily at 01:30 New York until
    06:00Z on the day the clocks go back: 01:30 EDT (05:30Z) runs, its second reading 01:30
    EST (06:30Z) does not, with or without another rule or an RDATE in the set, and what
    those give runs past the UNTIL."""
    base = "DTSTART;TZID=America/New_York:20241101T013000\nRRULE:FREQ=DAILY;UNTIL=20241103T060000Z"
    alone = parse_schedule(base, "America/New_York", anchor=utc(2024, 11, 1), dst_repeat="both")
    ours = [utc(2024, 11, 1, 5, 30), utc(2024, 11, 2, 5, 30), utc(2024, 11, 3, 5, 30)]
    assert alone.between(utc(2024, 11, 1), utc(2025, 1, 1), limit=50) == ours
    schedule = parse_schedule(
        f"{base}\n{beside}", "America/New_York", anchor=utc(2024, 11, 1), dst_repeat="both"
    )
    runs = schedule.between(utc(2024, 11, 1), utc(2025, 1, 1), limit=50)
    others = [r for r in runs if r.astimezone(ZoneInfo("America/New_York")).hour != 1]
    assert [r for r in runs if r not in others] == ours, runs
    assert others and all(r > utc(2024, 11, 3, 6) for r in others), runs
    # The one left of a doubled wall time runs as the reading it is, not as one of two.
    third = next(o for o in schedule.occurrences(utc(2024, 11, 3)) if o.at == ours[2])
    assert third.dst != "doubled", third


def test_a_utc_until_bounds_a_gap_time_shifted_past_it() -> None:
    """02:30 New York on the day the clocks spring forward does not exist; dst_gap=shift runs
    it at 03:30 EDT (07:30Z), past an UNTIL of 07:15Z: it does not run."""
    text = "DTSTART;TZID=America/New_York:20260307T023000\nRRULE:FREQ=DAILY;UNTIL=20260308T071500Z"
    schedule = parse_schedule(text, "America/New_York", anchor=utc(2026, 3, 7), dst_gap="shift")
    assert schedule.between(utc(2026, 3, 1), utc(2026, 4, 1), limit=10) == [utc(2026, 3, 7, 7, 30)]


def test_date_until_includes_the_whole_day() -> None:
    schedule = parse_schedule(
        "DTSTART:20260101T000000\nRRULE:FREQ=DAILY;BYHOUR=20;UNTIL=20260110", "Europe/Sofia"
    )
    runs = schedule.between(utc(2026, 1, 1), utc(2026, 2, 1), limit=100)
    assert len(runs) == 10
    assert runs[-1] == utc(2026, 1, 10, 18)


@pytest.mark.parametrize(
    "rules",
    ["RRULE:FREQ=DAILY;BYHOUR=9,17", "RRULE:FREQ=DAILY;BYHOUR=9\nRRULE:FREQ=DAILY;BYHOUR=17"],
    ids=["one-rule", "two-rules"],
)
def test_an_exdate_without_a_time_of_day_leaves_out_the_whole_day(rules: str) -> None:
    """An EXDATE given as a date (VALUE=DATE, or eight digits) leaves out every run of that day
    in the schedule's zone, as a date UNTIL takes in the whole day; it used to leave out a
    midnight that never ran, and so nothing. A date-time EXDATE still leaves out that run alone."""
    text = (
        f"DTSTART;TZID=Europe/London:20240101T090000\n{rules}\n"
        "EXDATE;VALUE=DATE:20240103\nEXDATE:20240105\nEXDATE:20240106T170000"
    )
    schedule = parse_schedule(text, "Europe/London", anchor=utc(2024, 1, 1))
    runs = schedule.between(utc(2024, 1, 1), utc(2024, 1, 8), limit=50)
    days: dict[int, list[int]] = {}
    for run in runs:
        days.setdefault(run.day, []).append(run.hour)
    assert days == {1: [9, 17], 2: [9, 17], 4: [9, 17], 6: [9], 7: [9, 17]}, runs


@pytest.mark.parametrize("frequency", ["DAILY", "MINUTELY"])
def test_a_utc_until_before_the_zones_first_wall_time_has_no_occurrences(frequency: str) -> None:
    """UNTIL at the first instant of the year 1 is before every wall time of a zone west of
    UTC: a rule with no occurrences, said at once, not a walk towards the year 9999 (which
    held a leader's tick for minutes)."""
    with pytest.raises(
        ScheduleError, match=r"rule has no occurrences \(UNTIL: no wall time of America/New_York"
    ):
        parse_schedule(f"FREQ={frequency};UNTIL=00010101T000000Z", "America/New_York", anchor=utc(2023, 1, 1))
    # East of UTC the same bound follows the zone's first wall times: the rule keeps its runs.
    east = parse_schedule(f"FREQ={frequency};UNTIL=00010103T000000Z", "Asia/Tokyo", anchor=utc(1, 1, 1))
    runs = east.between(utc(1, 1, 1), utc(1, 1, 5), limit=5)
    assert runs and all(run <= utc(1, 1, 3) for run in runs), runs


def test_exdate_and_rdate_in_other_notations() -> None:
    schedule = parse_schedule(
        "DTSTART;TZID=America/New_York:20260301T093000\nRRULE:FREQ=DAILY;COUNT=4\n"
        "EXDATE:20260302T143000Z\nRDATE;TZID=Europe/Sofia:20260310T120000",
        "America/New_York",
    )
    assert schedule.between(utc(2026, 1, 1), utc(2027, 1, 1), limit=100) == [
        utc(2026, 3, 1, 14, 30),
        utc(2026, 3, 3, 14, 30),
        utc(2026, 3, 4, 14, 30),
        utc(2026, 3, 10, 10),
    ]
    assert schedule.next_after(utc(2026, 3, 10, 10)) is None


@pytest.mark.parametrize(
    ("text", "options", "expected"),
    [
        # DTSTART in UTC names one reading of 01:30 on the fall-back day: the first run is it.
        (
            "DTSTART:20271107T063000Z\nRRULE:FREQ=DAILY;COUNT=2",
            {},
            [utc(2027, 11, 7, 6, 30), utc(2027, 11, 8, 6, 30)],
        ),
        (
            "DTSTART:20271107T053000Z\nRRULE:FREQ=DAILY;COUNT=2",
            {"dst_repeat": "second"},
            [utc(2027, 11, 7, 5, 30), utc(2027, 11, 8, 6, 30)],
        ),
        # With both readings wanted, a later reading of DTSTART's wall time still runs.
        (
            "DTSTART:20271107T053000Z\nRRULE:FREQ=DAILY;COUNT=2",
            {"dst_repeat": "both"},
            [utc(2027, 11, 7, 5, 30), utc(2027, 11, 7, 6, 30), utc(2027, 11, 8, 6, 30)],
        ),
        (
            "DTSTART:20271107T063000Z\nRRULE:FREQ=DAILY;COUNT=2",
            {"dst_repeat": "both"},
            [utc(2027, 11, 7, 6, 30), utc(2027, 11, 8, 6, 30)],
        ),
        # RDATEs that are instants: each is its own run, whichever reading it is.
        ("RDATE:20261101T063000Z", {}, [utc(2026, 11, 1, 6, 30)]),
        ("RDATE:20261101T053000Z,20261101T063000Z", {}, [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)]),
        ("RDATE;TZID=Europe/London:20261101T063000", {}, [utc(2026, 11, 1, 6, 30)]),
        # Hourly (dst_repeat both): an EXDATE instant removes that run only, a local wall time
        # both readings.
        (
            "DTSTART:20261101T003000\nRRULE:FREQ=HOURLY;COUNT=3\nEXDATE:20261101T063000Z",
            {},
            [utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 30)],
        ),
        (
            "DTSTART:20261101T003000\nRRULE:FREQ=HOURLY;COUNT=3\nEXDATE:20261101T013000",
            {},
            [utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7, 30)],
        ),
    ],
)
def test_values_that_name_instants_are_those_instants_in_a_repeated_hour(
    text: str, options: dict[str, str], expected: list[datetime]
) -> None:
    """RFC 5545: a UTC value (or another zone's time) is an instant; only a local wall time
    that the clock shows twice is read by the dst_repeat policy."""
    schedule = parse_schedule(text, "America/New_York", dst_repeat=options.get("dst_repeat"))
    assert schedule.between(utc(2026, 1, 1), utc(2028, 1, 1), limit=100) == expected


# --------------------------------------------------------------------------- rebasing

FREQUENCIES = {
    "YEARLY": 366 * 86400,
    "MONTHLY": 31 * 86400,
    "WEEKLY": 7 * 86400,
    "DAILY": 86400,
    "HOURLY": 3600,
    "MINUTELY": 60,
    "SECONDLY": 1,
}


def numbers(name: str, low: int, high: int, signed: bool = False) -> st.SearchStrategy[str]:
    values = st.integers(low, high)
    if signed:
        values = values | st.integers(-high, -low)
    lists = st.lists(values, min_size=1, max_size=4, unique=True)
    return st.one_of(st.just(""), lists.map(lambda v: f";{name}=" + ",".join(map(str, v))))


@st.composite
def rebasing_cases(draw: st.DrawFn) -> tuple[str, datetime, datetime]:
    frequency = draw(st.sampled_from(list(FREQUENCIES)))
    interval = draw(st.integers(1, 12))
    rule = f"FREQ={frequency};INTERVAL={interval}"
    if frequency != "SECONDLY":  # dateutil steps second by second to reach a month or hour
        rule += draw(numbers("BYMONTH", 1, 12))
        rule += draw(numbers("BYHOUR", 0, 23))
    rule += draw(numbers("BYMINUTE", 0, 59))
    rule += draw(numbers("BYSECOND", 0, 59))
    if frequency != "WEEKLY":
        rule += draw(numbers("BYMONTHDAY", 1, 31, signed=True))
    # An INTERVAL of 7 days, hours, minutes or seconds meets BYHOUR/BYMINUTE/BYSECOND
    # on one weekday only; with BYDAY such rules mostly never match, and dateutil takes
    # seconds (searching up to the year 9999) to find that out.
    if interval != 7 or frequency in ("YEARLY", "MONTHLY", "WEEKLY"):
        days = st.lists(st.sampled_from("MO TU WE TH FR SA SU".split()), min_size=1, unique=True)
        rule += draw(st.one_of(st.just(""), days.map(lambda d: ";BYDAY=" + ",".join(d))))
    if frequency in ("YEARLY", "MONTHLY", "WEEKLY"):
        rule += draw(numbers("BYSETPOS", 1, 3, signed=True))
    rule += draw(st.sampled_from(["", ";WKST=SU", ";WKST=WE"]))
    anchor = draw(st.datetimes(datetime(2000, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC)))
    # Bounded so that the un-rebased expansion (the oracle) stays cheap: a yearly or
    # monthly period can hold thousands of occurrences.
    periods = draw(st.floats(0, {"YEARLY": 30, "MONTHLY": 100}.get(frequency, 300)))
    query = anchor + timedelta(seconds=periods * interval * FREQUENCIES[frequency])
    return rule, anchor, min(query, utc(2300, 1, 1))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # dateutil applies BYSETPOS to the rest of DTSTART's week only
    case=(
        "FREQ=WEEKLY;INTERVAL=1;BYDAY=MO,TU,WE;BYSETPOS=2",
        utc(2000, 2, 1),
        utc(2000, 2, 8, 21),
    ),
    zone_name="UTC",
    exdate_index=0,
    rdate_offset=0,
    inclusive=False,
)
@given(
    case=rebasing_cases(),
    zone_name=st.sampled_from(["UTC", "Europe/Sofia", "America/New_York"]),
    exdate_index=st.integers(0, 2),
    rdate_offset=st.integers(-86400 * 40, 86400 * 40),
    inclusive=st.booleans(),
)
def test_rebasing_matches_expansion_from_dtstart(
    case: tuple[str, datetime, datetime],
    zone_name: str,
    exdate_index: int,
    rdate_offset: int,
    inclusive: bool,
) -> None:
    rule, anchor, query = case
    zone = ZoneInfo(zone_name)
    try:
        plain = parse_schedule(rule, zone_name, anchor=anchor)
    except ScheduleError:
        assume(False)
        raise
    expected = list(islice(plain._run_instants(query, inclusive=inclusive), 3))
    assume(expected)
    # Add an EXDATE on one of the expected runs and an RDATE near the query.
    excluded = expected[min(exdate_index, len(expected) - 1)].astimezone(zone)
    added = (query + timedelta(seconds=rdate_offset)).astimezone(zone)
    text = (
        f"DTSTART:{anchor.astimezone(zone):%Y%m%dT%H%M%S}\nRRULE:{rule}\n"
        f"EXDATE:{excluded:%Y%m%dT%H%M%S}\nRDATE:{added:%Y%m%dT%H%M%S}"
    )
    schedule = parse_schedule(text, zone_name)
    rebased = list(islice(schedule._run_instants(query, inclusive=inclusive), 3))
    from_dtstart = list(islice(schedule._run_instants(query, inclusive=inclusive, rebase=False), 3))
    assert rebased == from_dtstart, text
    assert_strictly_increasing(rebased)
    if zone_name == "UTC":
        # Also against dateutil itself, walking from DTSTART.
        oracle = rrulestr(text).xafter(query.replace(tzinfo=None), inc=inclusive)
        assert [run.replace(tzinfo=None) for run in rebased] == list(islice(oracle, 3)), text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(frequency="MONTHLY", interval=1, count=40, day=31, periods=20.5, zone_name="UTC", by_part="")
@example(frequency="YEARLY", interval=1, count=10, day=29, periods=5.2, zone_name="UTC", by_part="")
@example(
    frequency="DAILY", interval=3, count=500, day=14, periods=300.0, zone_name="Europe/Sofia", by_part=""
)
@given(
    frequency=st.sampled_from(list(FREQUENCIES)),
    interval=st.integers(1, 12),
    count=st.integers(0, 3000),
    day=st.integers(1, 31),
    periods=st.floats(0, 4000),
    zone_name=st.sampled_from(["UTC", "Europe/Sofia", "America/New_York"]),
    by_part=st.sampled_from(["", "", "", ";BYSECOND=0,30", ";BYMONTHDAY=1,15"]),
)
def test_a_count_rule_far_into_its_life_runs_as_walked_from_dtstart(
    frequency: str, interval: int, count: int, day: int, periods: float, zone_name: str, by_part: str
) -> None:
    """A COUNT rule queried after many of its occurrences: the occurrences before the query are
    counted (by arithmetic when each period has exactly DTSTART's one occurrence, else by a
    walk), and what runs after it is what a walk from DTSTART gives, up to the last one."""
    if by_part == ";BYMONTHDAY=1,15" and frequency == "WEEKLY":
        by_part = ""
    month = 2 if day == 29 and frequency == "YEARLY" else 1 + day % 12
    try:
        start = datetime(2000 + day % 5 * 4, month, day, 7, 45, 30)
    except ValueError:
        assume(False)
        raise
    text = f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:FREQ={frequency};INTERVAL={interval};COUNT={count}{by_part}"
    try:
        schedule = parse_schedule(text, zone_name)
    except ScheduleError:
        assume(False)
        raise
    step = FREQUENCIES[frequency] * interval
    seconds = min(periods * step, (datetime(2300, 1, 1) - start).total_seconds())
    query = (start + timedelta(seconds=seconds)).replace(tzinfo=ZoneInfo(zone_name))
    before = Walked.count
    rebased = list(islice(schedule._run_instants(query, inclusive=True), 3))
    walked = Walked.count - before
    from_dtstart = list(islice(schedule._run_instants(query, inclusive=True, rebase=False), 3))
    assert rebased == from_dtstart, text
    if not by_part and not (frequency == "MONTHLY" and day > 28) and (month, day) != (2, 29):
        assert walked <= 10, f"{text}: {walked} wall times walked to count the occurrences before {query}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frequency=st.sampled_from(["HOURLY", "MINUTELY", "SECONDLY"]),
    interval=st.integers(1, 7),
    days=st.sampled_from(
        [
            "BYMONTH=3",
            "BYMONTHDAY=13",
            "BYMONTH=2;BYMONTHDAY=29",
            "BYDAY=SU",
            "BYYEARDAY=-1",
            "BYMONTH=7;BYDAY=MO",
        ]
    ),
    times=st.sampled_from(["", ";BYHOUR=23", ";BYHOUR=5;BYMINUTE=30"]),
    ends=st.sampled_from(
        ["", "", ";COUNT=7", ";COUNT=40", ";BYSETPOS=1", ";BYSETPOS=-1", ";BYSETPOS=2;COUNT=5"]
    ),
    offset=st.integers(0, 400 * 86400),
    zone_name=st.sampled_from(["UTC", "Europe/Sofia", "America/New_York"]),
)
def test_a_sub_daily_rule_that_leaves_days_out_runs_as_walked_from_dtstart(
    frequency: str, interval: int, days: str, times: str, ends: str, offset: int, zone_name: str
) -> None:
    """A rule of hours, minutes or seconds with day parts starts its expansion at the next day
    they let through, a COUNT counted and a BYSETPOS picked along: what runs is what a walk
    from DTSTART over every left-out day gives."""
    # The walk from DTSTART passes every occurrence and, in seconds, every minute of a day
    # left out before the query: keep it short.
    offset %= {"HOURLY": 400, "MINUTELY": 60, "SECONDLY": 1}[frequency] * 86400
    if frequency == "SECONDLY" and days not in ("BYDAY=SU", "BYMONTHDAY=13"):
        days = "BYMONTHDAY=13"
    start = datetime(2027, 1, 11, 5, 30, 17)
    text = f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:FREQ={frequency};INTERVAL={interval};{days}{times}{ends}"
    try:
        schedule = parse_schedule(text, zone_name)
    except ScheduleError:  # no occurrence at all (an hour the interval never reaches)
        assume(False)
        raise
    query = (start + timedelta(seconds=offset)).replace(tzinfo=ZoneInfo(zone_name))
    rebased = list(islice(schedule._run_instants(query, inclusive=True), 3))
    from_dtstart = list(islice(schedule._run_instants(query, inclusive=True, rebase=False), 3))
    assert rebased == from_dtstart, (text, query)
    if zone_name == "UTC":
        oracle = rrulestr(text).xafter(query.replace(tzinfo=None), inc=True)
        assert [run.replace(tzinfo=None) for run in rebased] == list(islice(oracle, 3)), text


#: Rules whose every INTERVAL-th period from DTSTART (Monday 2027-01-11 05:30:17) misses the
#: days and times their BY parts allow, and so have no occurrence at all.
NEVER_LANDING = [
    # A week is 1,440 steps of 7 minutes: each step falls on the same minute of every week.
    "FREQ=MINUTELY;INTERVAL=7;BYDAY=SU;BYHOUR=5;BYMINUTE=30",
    # 7-hour steps reach 23:00 only on days 1, 8, 15, ... after DTSTART: Tuesdays.
    "FREQ=HOURLY;INTERVAL=7;BYMONTH=7;BYDAY=MO;BYHOUR=23;COUNT=7",
    "FREQ=DAILY;INTERVAL=7;BYDAY=TU",
    "FREQ=DAILY;INTERVAL=14;BYDAY=SU;BYMONTH=3",
    "FREQ=SECONDLY;INTERVAL=2;BYSECOND=18",
    "FREQ=MINUTELY;INTERVAL=1440;BYHOUR=6",
]


@pytest.mark.timeout(60)  # dateutil looks for a first one up to the year 9999: minutes, a hang
@pytest.mark.parametrize("rule", NEVER_LANDING)
def test_a_rule_whose_steps_never_land_on_its_days_and_times_is_refused_at_once(rule: str) -> None:
    with pytest.raises(ScheduleError, match="never land on a day and time its BY parts allow"):
        parse_schedule(f"DTSTART:20270111T053017\nRRULE:{rule}", "Europe/Sofia")


@pytest.mark.parametrize(
    "rule",
    [
        "FREQ=DAILY;INTERVAL=7;BYMONTH=3",  # Mondays in March
        "FREQ=HOURLY;INTERVAL=7;BYMONTH=7;BYDAY=TU;BYHOUR=23",  # the Tuesdays of the rule above
        "FREQ=MINUTELY;INTERVAL=7;BYDAY=MO;BYHOUR=5;BYMINUTE=30",
        "FREQ=HOURLY;INTERVAL=5;BYMONTH=2;BYMONTHDAY=29;BYHOUR=0",
    ],
)
def test_a_rule_whose_steps_land_on_its_days_and_times_runs_when_dateutil_says(rule: str) -> None:
    text = f"DTSTART:20270111T053017\nRRULE:{rule}"
    schedule = parse_schedule(text, "UTC")
    after = datetime(2027, 1, 12)
    walked = rrulestr(text).after(after)
    assert walked is not None
    assert schedule.next_after(after.replace(tzinfo=UTC)) == walked.replace(tzinfo=UTC), text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frequency=st.sampled_from(["DAILY", "HOURLY", "MINUTELY"]),
    interval=st.integers(1, 10),
    days=st.lists(st.sampled_from(["MO", "TU", "WE", "TH", "FR", "SA", "SU"]), max_size=3),
    hours=st.lists(st.integers(0, 23), max_size=2),
    minutes=st.lists(st.integers(0, 59), max_size=2),
    start_day=st.integers(0, 6),
    start_minute=st.integers(0, 1439),
)
def test_a_rule_is_refused_for_never_landing_exactly_when_a_walk_over_its_cycle_finds_nothing(
    frequency: str,
    interval: int,
    days: list[str],
    hours: list[int],
    minutes: list[int],
    start_day: int,
    start_minute: int,
) -> None:
    """Weekdays repeat every 7 days, and the days a step reaches every ``interval`` days at
    most: a rule with an occurrence has one within that many weeks of DTSTART, which dateutil
    walks here."""
    start = datetime(2027, 1, 11) + timedelta(days=start_day, minutes=start_minute, seconds=17)
    parts = [f"FREQ={frequency}", f"INTERVAL={interval}"]
    if days:
        parts.append("BYDAY=" + ",".join(sorted(set(days))))
    if hours and frequency != "DAILY":
        parts.append("BYHOUR=" + ",".join(map(str, sorted(set(hours)))))
    if minutes and frequency == "MINUTELY":
        parts.append("BYMINUTE=" + ",".join(map(str, sorted(set(minutes)))))
    text = f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:{';'.join(parts)}"
    try:
        parse_schedule(text, "UTC")
        refused = False
    except ScheduleError as error:
        assert "never land" in str(error), (text, str(error))
        refused = True
    try:
        rule = rrulestr(text)
        assert isinstance(rule, rrule)
        first = next(iter(rule.replace(until=start + timedelta(days=7 * interval + 1))), None)
    except ValueError:  # dateutil's own check: no time of day a step reaches passes BYHOUR
        first = None
    assert refused == (first is None), (text, first)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frequency=st.sampled_from(["YEARLY", "MONTHLY", "WEEKLY"]),
    interval=st.sampled_from([1, 1, 2, 3, 7, 12, 53]),
    days=st.lists(st.sampled_from(["MO", "FR", "1MO", "-1FR", "5SU", "2TU", "-5WE"]), max_size=2),
    monthdays=st.lists(st.sampled_from([1, 13, 29, 30, 31, -1, -31]), max_size=2),
    months=st.lists(st.integers(1, 12), max_size=2),
    setpos=st.sampled_from([None, 1, 2, -1, 3]),
    weekno=st.sampled_from([None, 1, -1, 53, -53]),
    start_day=st.integers(0, 400),
)
@example("MONTHLY", 1, [], [], [], 2, None, 0)  # the DTSTART day alone: one a month, no second
@example("MONTHLY", 1, ["MO"], [1], [], 2, None, 0)
@example("MONTHLY", 1, ["1MO"], [-1], [], None, None, 0)
@example("YEARLY", 1, [], [], [6], None, 1, 0)
@example("YEARLY", 1, [], [], [7], None, -53, 0)
@example("MONTHLY", 1, ["5SU"], [1], [], None, None, 0)
def test_a_rule_is_refused_for_parts_that_never_meet_exactly_when_dateutil_finds_nothing_before_9999(
    frequency: str,
    interval: int,
    days: list[str],
    monthdays: list[int],
    months: list[int],
    setpos: int | None,
    weekno: int | None,
    start_day: int,
) -> None:
    """A yearly, monthly or weekly rule whose BY parts never meet is refused after a search
    of at most two turns of the 400-year calendar, from DTSTART moved whole turns ahead: the refusal
    holds exactly when dateutil, walking from DTSTART to the year 9999, finds no occurrence."""
    if frequency != "YEARLY" and weekno is not None:
        weekno = None  # BYWEEKNO goes with YEARLY alone
    if frequency != "MONTHLY" and not (frequency == "YEARLY" and months):
        days = [d for d in days if d.isalpha()]  # an ordinal counts within the month or year
    if frequency == "WEEKLY":
        monthdays = []
    parts = [f"FREQ={frequency}", f"INTERVAL={interval}"]
    for name, values in (("BYDAY", days), ("BYMONTHDAY", monthdays), ("BYMONTH", months)):
        if values:
            parts.append(f"{name}=" + ",".join(map(str, dict.fromkeys(values))))
    if setpos is not None:
        parts.append(f"BYSETPOS={setpos}")
    if weekno is not None:
        parts.append(f"BYWEEKNO={weekno}")
    start = datetime(2026, 1, 1, 9, 30) + timedelta(days=start_day)
    text = f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:{';'.join(parts)}"
    try:
        parse_schedule(text, "UTC")
        refused = False
    except ScheduleError as error:
        assert "no occurrences" in str(error), (text, str(error))
        refused = True
    try:
        first = next(iter(rrulestr(text)), None)
    except (ValueError, IndexError):  # dateutil's end: no occurrence before the year 9999
        first = None
    assert refused == (first is None), (text, first)


@pytest.mark.timeout(60)  # a walk minute by minute over 28 years takes minutes: a hang, not a speed
def test_a_rule_of_seconds_on_one_day_in_28_years_is_expanded_day_by_day() -> None:
    """Every 29 February that is a Monday, each second of 23:00-23:59: dateutil would walk
    the 28 years between, minute by minute; the expansion goes from day to day instead."""
    schedule = parse_with_anchor(
        "FREQ=SECONDLY;BYHOUR=23;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO", "UTC", anchor=utc(2026, 12, 5)
    )
    [rule] = schedule._rules
    restarted = rule.expansion_from(datetime(2026, 12, 5, 2, 0), rebase=True)
    assert restarted is not None
    assert list(islice(restarted, 2)) == [datetime(2044, 2, 29, 23, 0, 0), datetime(2044, 2, 29, 23, 0, 1)]
    assert schedule.next_after(utc(2026, 12, 5, 2, 0)) == utc(2044, 2, 29, 23, 0)
    # With an UNTIL before the next such day there is none, found by the daily rule: after
    # 2044 the next is in 2072; and a rule with none at all is refused as it is read.
    until = parse_with_anchor(
        "FREQ=SECONDLY;BYHOUR=23;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;UNTIL=20600101T000000Z",
        "UTC",
        anchor=utc(2026, 12, 5),
    )
    assert until.next_after(utc(2044, 3, 1)) is None
    with pytest.raises(ScheduleError, match="no occurrences"):
        parse_with_anchor(
            "FREQ=SECONDLY;BYHOUR=23;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;UNTIL=20400101T000000Z",
            "UTC",
            anchor=utc(2026, 12, 5),
        )


@pytest.mark.timeout(60)  # walked second by second over 28 years, each took about 20 s
def test_count_and_bysetpos_rules_on_one_day_in_28_years_are_expanded_day_by_day() -> None:
    """COUNT and BYSETPOS do not send such a rule back to dateutil's walk: the occurrences are
    counted, and picked within each period, day by day."""
    anchor = utc(2026, 12, 5)
    counted = parse_with_anchor(
        "FREQ=SECONDLY;BYHOUR=23;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;COUNT=3601", "UTC", anchor=anchor
    )
    assert counted.next_after(anchor) == utc(2044, 2, 29, 23, 0)
    # 3,600 seconds in 2044's hour, counted before the query; the last one, in 2072.
    assert counted.next_after(utc(2044, 2, 29, 23, 59, 59)) == utc(2072, 2, 29, 23, 0)
    assert counted.next_after(utc(2072, 2, 29, 23, 0)) is None
    picked = parse_with_anchor(
        "FREQ=MINUTELY;BYHOUR=23;BYSECOND=0,30;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=-1",
        "UTC",
        anchor=anchor,
    )
    assert picked.between(anchor, utc(2044, 2, 29, 23, 2), limit=5) == [
        utc(2044, 2, 29, 23, 0, 30),
        utc(2044, 2, 29, 23, 1, 30),
    ]


@pytest.mark.timeout(60)  # dateutil looks for such a period up to the year 9999: hours for MINUTELY
@pytest.mark.parametrize(
    ("text", "most"),
    [
        ("FREQ=MINUTELY;BYSETPOS=2", 1),
        ("FREQ=HOURLY;BYSETPOS=-2", 1),
        ("FREQ=SECONDLY;BYSETPOS=2;BYMONTH=2", 1),
        ("FREQ=HOURLY;BYMINUTE=0,30;BYSETPOS=3,-3", 2),
        ("FREQ=DAILY;BYHOUR=9,17;BYSETPOS=3", 2),
        ("FREQ=WEEKLY;BYDAY=MO,TU;BYHOUR=8;BYSETPOS=3", 2),
    ],
)
def test_a_bysetpos_past_what_one_period_holds_is_refused_as_it_is_read(text: str, most: int) -> None:
    """BYSETPOS picks among the occurrences of one FREQ period; one past the most a period of
    the rule can hold never picks any. Refused at once, as a rule whose days never exist is,
    not after a walk to the year 9999 that would hold up a define or the scheduler's tick."""
    began = time.perf_counter()
    with pytest.raises(ScheduleError, match=f"has no occurrences .*BYSETPOS.* holds at most {most} "):
        parse_schedule(text, "Europe/Sofia")
    assert time.perf_counter() - began < 0.5, text


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("FREQ=HOURLY;BYMINUTE=0,30;BYSETPOS=2", utc(2026, 12, 5, 0, 30)),
        ("FREQ=MINUTELY;BYSECOND=0,30;BYSETPOS=-1", utc(2026, 12, 5, 0, 0, 30)),
        ("FREQ=DAILY;BYHOUR=9,17;BYSETPOS=-2,5", utc(2026, 12, 5, 9)),
        ("FREQ=WEEKLY;BYDAY=MO,FR;BYSETPOS=2", utc(2026, 12, 11)),
        ("FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1", utc(2026, 12, 31)),
    ],
)
def test_a_bysetpos_a_period_can_hold_still_runs(text: str, first: datetime) -> None:
    schedule = parse_with_anchor(text, "UTC", anchor=utc(2026, 12, 5))
    assert schedule.next_after(utc(2026, 12, 5), inclusive=True) == first


def test_next_after_far_from_the_anchor_is_fast_and_in_phase() -> None:
    query = utc(2026, 5, 17, 13, 33, 7)
    schedule = parse_schedule("FREQ=MINUTELY;INTERVAL=7", "UTC")
    run = schedule.next_after(query)
    assert run is not None
    assert timedelta(0) < run - query <= timedelta(minutes=7)
    assert (run - utc(2000, 1, 1)) % timedelta(minutes=7) == timedelta(0)

    sofia = parse_schedule("FREQ=MINUTELY;INTERVAL=7", "Europe/Sofia")
    timings = []
    for _ in range(5):
        began = time.perf_counter()
        local_run = sofia.next_after(query)
        timings.append(time.perf_counter() - began)
    assert local_run is not None
    wall = local_run.astimezone(ZoneInfo("Europe/Sofia")).replace(tzinfo=None)
    assert (wall - datetime(2000, 1, 1)) % timedelta(minutes=7) == timedelta(0)
    assert min(timings) < 0.005, timings


# --------------------------------------------------------------------------- planning

HOURLY = parse_schedule("0 * * * *", "UTC")
NINE_AM = utc(2026, 1, 1, 9)
HALF_PAST_ELEVEN = utc(2026, 1, 1, 11, 30)


def plan(
    policy: str,
    *,
    cursor: datetime = NINE_AM,
    now: datetime = HALF_PAST_ELEVEN,
    schedule: Schedule = HOURLY,
    lookahead: timedelta = timedelta(minutes=1),
    grace: timedelta = timedelta(minutes=5),
    max_runs: int = 100,
) -> Plan:
    return plan_materialization(
        schedule,
        cursor,
        now,
        misfire_policy=policy,
        lookahead=lookahead,
        misfire_grace=grace,
        max_runs=max_runs,
    )


def test_scheduler_down_three_hours() -> None:
    # Occurrences 09:00, 10:00 and 11:00 were missed; 12:00 is in the future.
    assert plan("coalesce") == Plan([utc(2026, 1, 1, 11)], utc(2026, 1, 1, 12), 3)
    assert plan("catch_up") == Plan(
        [utc(2026, 1, 1, 9), utc(2026, 1, 1, 10), utc(2026, 1, 1, 11)], utc(2026, 1, 1, 12), 3
    )
    assert plan("skip") == Plan([], utc(2026, 1, 1, 12), 3)


def test_missed_and_current_occurrences_together() -> None:
    now = utc(2026, 1, 1, 12, 0, 30)  # 12:00 is within the grace period
    hours = [utc(2026, 1, 1, hour) for hour in (9, 10, 11, 12)]
    assert plan("catch_up", now=now) == Plan(hours, utc(2026, 1, 1, 13), 3)
    assert plan("coalesce", now=now) == Plan(hours[2:], utc(2026, 1, 1, 13), 3)
    assert plan("skip", now=now) == Plan(hours[3:], utc(2026, 1, 1, 13), 3)
    assert plan("coalesce", now=now, max_runs=1) == Plan(hours[2:3], hours[3], 3)


def test_catch_up_is_bounded_by_max_runs() -> None:
    result = plan("catch_up", max_runs=2)
    assert result == Plan([utc(2026, 1, 1, 9), utc(2026, 1, 1, 10)], utc(2026, 1, 1, 11), 2)


def test_exhausted_schedule_has_no_next_cursor() -> None:
    schedule = parse_schedule("DTSTART:20260101T090000Z\nRRULE:FREQ=HOURLY;COUNT=3", "UTC")
    result = plan("catch_up", schedule=schedule, now=utc(2026, 1, 1, 12))
    assert result == Plan([utc(2026, 1, 1, h) for h in (9, 10, 11)], None, 3)


def test_lookahead_includes_an_occurrence_half_a_second_ahead() -> None:
    cursor = utc(2026, 1, 1, 10)
    now = cursor - timedelta(milliseconds=500)
    assert plan("skip", cursor=cursor, now=now, lookahead=timedelta(seconds=1)) == Plan(
        [cursor], utc(2026, 1, 1, 11), 0
    )
    nothing_due = plan("skip", cursor=cursor, now=now, lookahead=timedelta(0))
    assert nothing_due == Plan([], cursor, 0)


def test_unknown_misfire_policy() -> None:
    with pytest.raises(ValueError, match="misfire policy 'later'"):
        plan("later")


def test_first_cursor_is_the_first_occurrence_at_or_after_now() -> None:
    assert first_cursor(HOURLY, utc(2026, 1, 1, 10)) == utc(2026, 1, 1, 10)
    assert first_cursor(HOURLY, utc(2026, 1, 1, 10, 0, 1)) == utc(2026, 1, 1, 11)


# --------------------------------------------------------------------------- preview


def test_preview_and_format_preview() -> None:
    schedule = parse_schedule("0 9 * * MON", "Europe/Sofia")
    found = preview(schedule, utc(2026, 3, 21), 2)
    assert [o.at for o in found] == [utc(2026, 3, 23, 7), utc(2026, 3, 30, 6)]
    assert [o.wall for o in found] == [datetime(2026, 3, 23, 9), datetime(2026, 3, 30, 9)]
    assert all(o.dst is None for o in found)
    assert format_preview(schedule, utc(2026, 3, 21), 2) == [
        "2026-03-23 09:00 Mon EET  (+02:00)  2026-03-23T07:00:00Z",
        "2026-03-30 09:00 Mon EEST (+03:00)  2026-03-30T06:00:00Z",
    ]


@pytest.mark.parametrize(
    ("text", "after", "dst_gap"),
    [
        ("30 3 * * *", utc(2027, 3, 26), "skip"),  # EET, a skipped wall time, EEST
        ("30 3 * * *", utc(2027, 3, 26), "shift"),  # EET, moved, EEST
        ("FREQ=MINUTELY;BYSECOND=0,30", utc(2027, 3, 28, 0, 58), None),  # seconds and whole minutes
    ],
)
def test_format_preview_keeps_its_columns_in_place_across_a_dst_change(
    text: str, after: datetime, dst_gap: str | None
) -> None:
    """Where the zone's abbreviation changes length (EET to EEST), beside a wall time a gap
    skipped, and where one time has seconds and the next none, the offset, the UTC time and
    the DST note start at the same column on every line."""
    schedule = parse_schedule(text, "Europe/Sofia", dst_gap=dst_gap)
    lines = format_preview(schedule, after, 5)
    utc_at = {line.index("Z") - 19 for line in lines if "Z" in line}
    assert len(utc_at) == 1, "\n".join(lines)
    offsets = {line.index("(+") for line in lines if "(+" in line}
    assert len(offsets) == 1, "\n".join(lines)
    if any("DST" in line for line in lines):
        notes = {line.index("DST") for line in lines if "DST" in line}
        assert notes == {max(utc_at) + 22}, "\n".join(lines)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("60 * * * *", "cron field 'minute' value 60 out of range 0-59"),
        ("0 25 * * *", "cron field 'hour' value 25 out of range 0-23"),
        ("0 0 0 * *", "cron field 'day-of-month' value 0 out of range 1-31"),
        ("0 0 32 * *", "cron field 'day-of-month' value 32 out of range 1-31"),
        ("0 0 * 13 *", "cron field 'month' value 13 out of range 1-12"),
        ("0 0 * * 8", "cron field 'day-of-week' value 8 out of range 0-7"),
        ("*/0 * * * *", "cron field 'minute' step '0' in '*/0' must be 1-60"),
        ("0 */x * * *", "cron field 'hour' step 'x' in '*/x' must be 1-24"),
        ("0 0 * FOO *", "cron field 'month' unknown name 'FOO'"),
        ("0 0 * * FUNDAY", "cron field 'day-of-week' unknown name 'FUNDAY'"),
        ("0 0 * * SAT-FRI", "cron field 'day-of-week' range 'SAT-FRI' runs backwards"),
        ("0 x * * *", "cron field 'hour' invalid value 'x'"),
        ("5/15 * * * *", "cron field 'minute' step '5/15' needs '*' or a range"),
        ("1,,2 * * * *", "cron field 'minute' has an empty list item"),
        ("0 0 * * * *", "cron: expected 5 fields (minute hour day-of-month month day-of-week)"),
        ("0 0 * *", "got 4"),
        ("@reboot", "cron: unknown macro '@reboot'"),
        ("0 0 30 2 *", "has no occurrences"),
        ("FREQ=DAILYY", "RRULE: unknown FREQ 'DAILYY'"),
        ("BYHOUR=8", "RRULE: missing FREQ"),
        ("FREQ=WEEKLY;BYDAY=XX", "RRULE: invalid BYDAY value 'XX'"),
        ("FREQ=DAILY;BYDAY=1MO", "RRULE: BYDAY value '1MO' needs FREQ=MONTHLY or YEARLY"),
        # Within a month there are five of each weekday at most (dateutil raises IndexError).
        ("FREQ=MONTHLY;BYDAY=40MO", "RRULE: BYDAY value '40MO' ordinal out of range 1-5 (a month has"),
        ("FREQ=MONTHLY;BYDAY=-6FR", "RRULE: BYDAY value '-6FR' ordinal out of range 1-5"),
        ("FREQ=YEARLY;BYMONTH=12;BYDAY=40MO", "RRULE: BYDAY value '40MO' ordinal out of range 1-5"),
        ("FREQ=YEARLY;BYDAY=54MO", "RRULE: BYDAY value '54MO' ordinal out of range 1-53"),
        ("FREQ=DAILY;BYHOUR=24", "RRULE: BYHOUR value 24 out of range 0-23"),
        ("FREQ=MONTHLY;BYMONTHDAY=0", "RRULE: BYMONTHDAY value 0 out of range"),
        ("FREQ=DAILY;INTERVAL=0", "RRULE: INTERVAL must be a positive integer"),
        ("FREQ=DAILY;INTERVAL=99999999999999999999", "RRULE: INTERVAL must be at most 365,000"),
        ("FREQ=WEEKLY;INTERVAL=200000000", "RRULE: INTERVAL must be at most 52,142"),
        ("FREQ=YEARLY;INTERVAL=1001", "RRULE: INTERVAL must be at most 1,000"),
        ("FREQ=DAILY;FOO=1", "RRULE: unknown part 'FOO'"),
        ("FREQ=DAILY;;garbage", "RRULE: malformed part 'garbage'"),
        ("FREQ=DAILY;FREQ=WEEKLY", "RRULE: FREQ given more than once"),
        ("FREQ=WEEKLY;BYMONTHDAY=1", "RRULE: BYMONTHDAY cannot be used with FREQ=WEEKLY"),
        ("FREQ=DAILY;COUNT=2;UNTIL=20300101T000000Z", "RRULE: COUNT and UNTIL"),
        ("FREQ=DAILY;UNTIL=2030-01-01", "RRULE: UNTIL: invalid date-time '2030-01-01'"),
        ("FREQ=DAILY;COUNT=0", "RRULE: rule has no occurrences"),
        ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=31", "has no occurrences"),
        ("FREQ=MINUTELY;BYYEARDAY=1;BYMONTH=6", "has no occurrences"),
        ("FREQ=DAILY;BYMONTH=4,6;BYMONTHDAY=-31", "has no occurrences"),
        ("FREQ=HOURLY;INTERVAL=2;BYHOUR=1", "has no occurrences"),
        ("DTSTART:20260101T000000\nRRULE:FREQ=DAILY;UNTIL=20250101T000000Z", "no occurrences"),
        ("DTSTART:20260101T000000\nRRULE:FREQ=DAILY;COUNT=1\nEXDATE:20260101T000000", "no occ"),
        ("DTSTART:20260101T000000\nRRULE:FREQ=DAILY\nRRULE:FREQ=DAILY;COUNT=0", "rule 2 has no"),
        ("DTSTART:2026-01-01\nRRULE:FREQ=DAILY", "DTSTART: invalid date-time '2026-01-01'"),
        ("DTSTART:20260101T000000", "RRULE: no RRULE or RDATE line"),
        ("DTSTART;TZID=Mars/Base:20260101T000000\nRRULE:FREQ=DAILY", "unknown time zone"),
        ("DTSTART;TZID=Asia/Tokyo:20260101\nRRULE:FREQ=DAILY", "TZID 'Asia/Tokyo' is not 'UTC'"),
        ("X-FOO:bar\nRRULE:FREQ=DAILY", "unsupported property 'X-FOO'"),
        ("EXRULE:FREQ=DAILY\nRRULE:FREQ=DAILY", "unsupported property 'EXRULE'"),
        ("   ", "schedule text is empty"),
        ("not a schedule", "cron: expected 5 fields"),
    ],
)
def test_bad_schedules_name_the_offending_part(text: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_schedule(text, "UTC", definition="nightly")
    assert str(caught.value).startswith("definition=nightly schedule: ")
    assert message in str(caught.value)
    assert caught.value.definition == "nightly"


@pytest.mark.parametrize("zone_name", ["Mars/Base", "", "America", "../etc/passwd", "utc"])
def test_unknown_time_zone(zone_name: str) -> None:
    with pytest.raises(ScheduleError, match="unknown time zone") as caught:
        parse_schedule("0 0 * * *", zone_name)
    assert str(caught.value) == f"schedule: unknown time zone {zone_name!r}"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "zone_name", ["Europe/Sofia", "America/New_York", "Pacific/Kiritimati", "Etc/GMT+12"]
)
@pytest.mark.parametrize(
    "text",
    [
        "FREQ=DAILY;UNTIL=99991231T235959Z",
        "FREQ=WEEKLY;UNTIL=99991231T235959Z",
        "FREQ=DAILY;UNTIL=99991231",
        "0 0 * * *",
    ],
)
def test_far_future_is_exhausted_not_crashing(text: str, zone_name: str) -> None:
    schedule = parse_schedule(text, zone_name)
    last = schedule.between(utc(9999, 12, 1), utc(9999, 12, 31, 23, 59, 59), limit=100)
    assert last and last[-1].year == 9999
    assert schedule.next_after(last[-1]) is None
    assert schedule.next_after(utc(9999, 12, 31, 23, 59, 59)) is None
    assert schedule.next_after(utc(2026, 1, 1)) is not None
