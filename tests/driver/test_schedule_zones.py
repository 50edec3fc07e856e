"""Occurrences against independent oracles, in zones with every kind of DST change.

The oracle expands the schedule with dateutil (RRULE) or croniter (cron) on naive wall
times, then applies the DST policy with zoneinfo by its own means: existence by round
trip, the offset before a gap read six hours earlier, the end of a gap found by
scanning wall-clock minutes.  pgtick must give the same instants, in order, each once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from dateutil.rrule import rrulestr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtick.schedule import Schedule, ScheduleError, anchor_for, parse_schedule
from pgtick.schedule.rrule import Walked

ZONES = (
    "UTC",
    "America/New_York",
    "Europe/Sofia",
    "Australia/Lord_Howe",  # 30-minute shift
    "America/Santiago",  # transitions at midnight
    "Pacific/Chatham",  # 45-minute offsets
    "Asia/Kolkata",  # no DST
)
GAPS = ("shift", "end", "skip")
REPEATS = ("first", "second", "both")
COUNT = 12
MARGIN = timedelta(hours=5)  # more than any DST change moves a wall time

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- the oracle


def _exists(wall: datetime, zone: ZoneInfo, fold: int) -> datetime | None:
    instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
    return instant if instant.astimezone(zone).replace(tzinfo=None) == wall else None


def oracle_runs(wall: datetime, zone: ZoneInfo, gap: str, repeat: str) -> list[datetime]:
    """The instants one wall time runs at under (gap, repeat), computed independently."""
    readings = sorted({r for r in (_exists(wall, zone, 0), _exists(wall, zone, 1)) if r is not None})
    if len(readings) == 2:
        return {"first": readings[:1], "second": readings[1:], "both": readings}[repeat]
    if readings:
        return readings
    if gap == "skip":
        return []
    if gap == "shift":
        before = zone.utcoffset(wall - timedelta(hours=6))
        assert before is not None
        return [(wall - before).replace(tzinfo=UTC)]
    minute = wall.replace(second=0) + timedelta(minutes=1)
    while _exists(minute, zone, 0) is None:
        minute += timedelta(minutes=1)
    return [minute.replace(tzinfo=zone).astimezone(UTC)]


def oracle(
    walls: Iterator[datetime], zone: ZoneInfo, gap: str, repeat: str, after: datetime
) -> list[datetime]:
    """The first COUNT instants after `after` of the wall times (from before it), sorted, unique."""
    found: set[datetime] = set()
    for wall in walls:
        found.update(run for run in oracle_runs(wall, zone, gap, repeat) if run > after)
        if len(found) >= COUNT:
            nth = sorted(found)[COUNT - 1]
            offset = nth.astimezone(zone).utcoffset()
            assert offset is not None
            if wall.replace(tzinfo=UTC) - offset > nth + timedelta(hours=3):  # past any DST move
                break
    return sorted(found)[:COUNT]


def cron_walls(expression: str, start: datetime) -> Iterator[datetime]:
    it = croniter(expression, start - timedelta(seconds=1))
    while True:
        yield it.get_next(datetime)


def rrule_walls(rule: str, dtstart: datetime, start: datetime) -> Iterator[datetime]:
    expansion = rrulestr(rule, dtstart=dtstart)
    yield from expansion.xafter(start, inc=True)


def auto_for(text: str) -> tuple[str, str]:
    """What DESIGN.md says auto picks, read off the text independently."""
    if "FREQ=" in text:
        sub_daily = any(f"FREQ={f}" in text for f in ("HOURLY", "MINUTELY", "SECONDLY"))
        return ("skip", "both") if sub_daily else ("shift", "first")
    fields = text.split()
    return ("skip", "both") if fields[0].startswith("*") or fields[1].startswith("*") else ("end", "first")


@cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """UTC instants (to the hour) where the zone's offset changes, 2025-2027."""
    zone = ZoneInfo(zone_name)
    moment = datetime(2025, 1, 1, tzinfo=UTC)
    found = []
    previous = moment.astimezone(zone).utcoffset()
    while moment < datetime(2028, 1, 1, tzinfo=UTC):
        moment += timedelta(minutes=15)
        offset = moment.astimezone(zone).utcoffset()
        if offset != previous:
            found.append(moment)
            previous = offset
    return tuple(found)


@st.composite
def instants(draw: st.DrawFn, zone_name: str) -> datetime:
    """Start instants that straddle the zone's DST changes (any time of year without DST)."""
    near = transitions(zone_name)
    if near and draw(st.integers(0, 9)) > 0:
        base = draw(st.sampled_from(near))
        return base + timedelta(minutes=draw(st.integers(-30 * 60, 6 * 60)))
    return datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=draw(st.integers(0, 3 * 365 * 24 * 60)))


def cron_field(low: int, high: int, max_step: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        st.integers(1, max_step).map(lambda s: f"*/{s}"),
        number.map(str),
        st.tuples(number, number).filter(lambda p: p[0] != p[1]).map(lambda p: f"{min(p)}-{max(p)}"),
        st.lists(number, min_size=2, max_size=4, unique=True).map(lambda v: ",".join(map(str, sorted(v)))),
        st.tuples(number, number, st.integers(1, 5))
        .filter(lambda p: p[0] != p[1])
        .map(lambda p: f"{min(p[:2])}-{max(p[:2])}/{p[2]}"),
    )


cron_expressions = st.tuples(
    cron_field(0, 59, 30),
    cron_field(0, 23, 12),
    st.one_of(st.just("*"), st.integers(1, 28).map(str)),
    st.just("*"),
    st.one_of(st.just("*"), st.sampled_from(["1-5", "0,6", "5-0", "fri-sun", "2"])),
).map(" ".join)


@st.composite
def rrules(draw: st.DrawFn) -> str:
    freq = draw(st.sampled_from(["DAILY", "WEEKLY", "MONTHLY", "HOURLY", "MINUTELY"]))
    parts = [f"FREQ={freq}"]
    interval = draw(st.integers(1, 5))
    if freq == "MINUTELY":
        interval = draw(st.sampled_from([5, 10, 15, 20, 30, 45, 90]))
    if interval > 1:
        parts.append(f"INTERVAL={interval}")
    if freq in ("DAILY", "WEEKLY", "MONTHLY") or draw(st.booleans()):
        hours = draw(st.lists(st.integers(0, 23), min_size=1, max_size=3, unique=True))
        parts.append("BYHOUR=" + ",".join(map(str, sorted(hours))))
    if freq != "MINUTELY":
        minutes = draw(st.lists(st.sampled_from([0, 15, 30, 45, 59]), min_size=1, max_size=2, unique=True))
        parts.append("BYMINUTE=" + ",".join(map(str, sorted(minutes))))
    if freq == "WEEKLY" and draw(st.booleans()):
        parts.append("BYDAY=" + draw(st.sampled_from(["MO", "SU", "MO,WE,FR", "SA,SU"])))
    if freq == "MONTHLY":
        parts.append(f"BYMONTHDAY={draw(st.integers(1, 28))}")
    return ";".join(parts)


policies = st.tuples(st.sampled_from((None, *GAPS)), st.sampled_from((None, *REPEATS)))


def first_runs(schedule: Schedule, after: datetime) -> list[datetime]:
    runs = []
    for occurrence in schedule.occurrences(after):
        assert occurrence.at is not None
        runs.append(occurrence.at)
        if len(runs) == COUNT:
            break
    return runs


# --------------------------------------------------------------------------- properties


@PROPERTY
@given(data=st.data(), zone_name=st.sampled_from(ZONES), expression=cron_expressions, policy=policies)
def test_cron_equals_croniter_with_each_dst_policy(
    data: st.DataObject, zone_name: str, expression: str, policy: tuple[str | None, str | None]
) -> None:
    zone = ZoneInfo(zone_name)
    after = data.draw(instants(zone_name))
    gap, repeat = policy
    auto_gap, auto_repeat = auto_for(expression)
    schedule = parse_schedule(expression, zone_name, anchor=after, dst_gap=gap, dst_repeat=repeat)
    start = (after - MARGIN).astimezone(zone).replace(tzinfo=None)
    expected = oracle(cron_walls(expression, start), zone, gap or auto_gap, repeat or auto_repeat, after)
    assert first_runs(schedule, after) == expected, (expression, zone_name, after, policy)


@PROPERTY
@given(
    data=st.data(),
    zone_name=st.sampled_from(ZONES),
    rule=rrules(),
    policy=policies,
    days_before=st.integers(0, 400),
)
def test_rrule_equals_dateutil_with_each_dst_policy(
    data: st.DataObject,
    zone_name: str,
    rule: str,
    policy: tuple[str | None, str | None],
    days_before: int,
) -> None:
    zone = ZoneInfo(zone_name)
    after = data.draw(instants(zone_name))
    anchor = anchor_for(after - timedelta(days=days_before), zone_name)
    gap, repeat = policy
    auto_gap, auto_repeat = auto_for(rule)
    try:
        schedule = parse_schedule(rule, zone_name, anchor=anchor, dst_gap=gap, dst_repeat=repeat)
    except ScheduleError:  # refused as empty: dateutil must find nothing either
        with pytest.raises(ValueError, match="empty"):
            next(iter(rrulestr(rule, dtstart=anchor.replace(tzinfo=None))))
        return
    start = (after - MARGIN).astimezone(zone).replace(tzinfo=None)
    walls = rrule_walls(rule, anchor.replace(tzinfo=None), start)
    expected = oracle(walls, zone, gap or auto_gap, repeat or auto_repeat, after)
    assert first_runs(schedule, after) == expected, (rule, zone_name, after, anchor, policy)


@PROPERTY
@given(data=st.data(), zone_name=st.sampled_from(ZONES), expression=cron_expressions, policy=policies)
def test_runs_are_strictly_increasing_and_resume_where_they_stopped(
    data: st.DataObject, zone_name: str, expression: str, policy: tuple[str | None, str | None]
) -> None:
    after = data.draw(instants(zone_name))
    gap, repeat = policy
    schedule = parse_schedule(expression, zone_name, anchor=after, dst_gap=gap, dst_repeat=repeat)
    runs = first_runs(schedule, after)
    assert all(a < b for a, b in itertools.pairwise(runs)), runs
    # Asking again from any run (inclusive) continues the same sequence: what the cursor does.
    for index, run in enumerate(runs[:-1]):
        assert schedule.next_after(run, inclusive=True) == run
        assert schedule.next_after(run) == runs[index + 1], (run, runs)


def test_a_day_skipped_across_the_date_line_keeps_its_shifted_occurrence() -> None:
    """Pacific/Apia went from -10:00 to +14:00 at the end of 2011-12-29 (local): Friday the
    30th never happened there. A weekly Friday 09:00 rule shifts that run out of the gap (to
    the next wall time that exists, Saturday 09:00 = 19:00Z on the 30th), and it is found
    from any instant before it, not only from one less than a few hours before."""
    apia = ZoneInfo("Pacific/Apia")
    schedule = parse_schedule(
        "FREQ=WEEKLY;BYDAY=FR;BYHOUR=9", "Pacific/Apia", anchor=datetime(2011, 12, 1, tzinfo=apia)
    )
    shifted = datetime(2011, 12, 30, 19, tzinfo=UTC)
    for after in (datetime(2011, 12, 29, 20, tzinfo=UTC), datetime(2011, 12, 30, 14, 0, 1, tzinfo=UTC)):
        assert schedule.next_after(after) == shifted, after
    assert schedule.between(datetime(2011, 12, 30, 14, 0, 1, tzinfo=UTC), shifted, limit=5) == [shifted]


@pytest.mark.parametrize(
    ("after", "most"),
    [
        (datetime(2026, 3, 8, 7, 0, 30, tzinfo=UTC), 3700),  # just after the clocks sprang forward
        (datetime(2026, 3, 8, 7, 59, 59, tzinfo=UTC), 3700),
        (datetime(2026, 3, 8, 8, tzinfo=UTC), 10),  # an hour after: nothing runs late any more
        (datetime(2026, 3, 8, 12, tzinfo=UTC), 10),
        (datetime(2026, 3, 7, 12, tzinfo=UTC), 10),  # a day before the change
        (datetime(2026, 10, 31, 12, tzinfo=UTC), 10),
        (datetime(2026, 11, 1, 5, 30, tzinfo=UTC), 3700),  # 01:30 EDT, the first of two
        (datetime(2026, 11, 1, 6, 30, tzinfo=UTC), 3700),  # 01:30 EST, the second of two
        (datetime(2026, 11, 2, 6, tzinfo=UTC), 10),
    ],
)
def test_a_rule_of_seconds_near_a_dst_change_walks_back_only_where_a_run_can_be_late(
    after: datetime, most: int
) -> None:
    """A search backs up from its instant only as far as an earlier wall time can still run
    at or after it: an hour within an hour after a spring-forward gap or before a fall-back,
    else a second (a second reading still waits for the first readings of the repeated hour).
    It backed up a whole day (the largest change any zone made) for two days around every
    change, so each query of a rule of seconds walked 90,000 wall times, over a second: the
    leader's tick, which asks twice per definition, fell seconds behind."""
    zone = "America/New_York"
    schedule = parse_schedule("FREQ=SECONDLY", zone, anchor=datetime(2026, 1, 1, tzinfo=ZoneInfo(zone)))
    before = Walked.count
    assert schedule.next_after(after) == after + timedelta(seconds=1)
    assert Walked.count - before <= most


@pytest.mark.parametrize(
    ("zone", "gap_end"),
    [
        ("Europe/Dublin", datetime(2024, 3, 31, 1, tzinfo=UTC)),  # from GMT, an offset of zero
        ("Africa/Casablanca", datetime(2024, 4, 14, 2, tzinfo=UTC)),  # after Ramadan, from +00
        ("Australia/Lord_Howe", datetime(2024, 10, 5, 15, 30, tzinfo=UTC)),  # half an hour
    ],
)
def test_a_wall_time_moved_to_the_end_of_a_gap_is_found_from_that_instant(
    zone: str, gap_end: datetime
) -> None:
    """Searched from the first instant after a gap, the wall time the gap swallowed runs there
    (``dst_gap=end``): the search reads that instant with the offset before the gap."""
    anchor = datetime(2024, 1, 1, tzinfo=ZoneInfo(zone))
    schedule = parse_schedule("15 * * * *", zone, anchor=anchor, dst_gap="end", dst_repeat="both")
    assert schedule.next_after(gap_end, inclusive=True) == gap_end
    assert schedule.next_after(gap_end - timedelta(seconds=1)) == gap_end


@pytest.mark.parametrize("text", ["0 8 * * *", "FREQ=DAILY;BYHOUR=8"])
def test_the_first_runs_of_the_calendar_are_found_from_its_first_second(text: str) -> None:
    """From the first seconds of the year 1 a search cannot back up a second: it starts at the
    calendar's first wall time and loses nothing (a cron schedule once began at 2000)."""
    schedule = parse_schedule(text, "UTC", anchor=datetime(1, 1, 1, tzinfo=UTC))
    first = datetime(1, 1, 1, 8, tzinfo=UTC)
    assert schedule.next_after(datetime(1, 1, 1, tzinfo=UTC)) == first
    assert schedule.between(datetime(1, 1, 1, tzinfo=UTC), first + timedelta(days=1), limit=5) == [
        first,
        first + timedelta(days=1),
    ]
