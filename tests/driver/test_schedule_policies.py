"""Each DST policy value, and what auto picks for each kind of schedule, across both
changes of the year; preview's marks and header; cron as cronie reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgtick.schedule import (
    Schedule,
    ScheduleError,
    anchor_for,
    format_preview,
    header,
    parse_schedule,
    preview,
)

NY = "America/New_York"
SPRING = datetime(2026, 3, 8, 4, tzinfo=UTC)  # 2026-03-07 23:00 EST, before the gap at 02:00
FALL = datetime(2026, 11, 1, 3, tzinfo=UTC)  # 2026-10-31 23:00 EDT, before the repeat at 01:00


def utc(month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def parse(text: str, zone: str = NY, **policy: str | None) -> Schedule:
    return parse_schedule(text, zone, anchor=datetime(2026, 1, 1, tzinfo=ZoneInfo(zone)), **policy)


def runs(schedule: Schedule, after: datetime, hours: int = 6) -> list[datetime]:
    return schedule.between(after, after + timedelta(hours=hours), limit=1000)


# --------------------------------------------------------------------------- each policy value


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        ("shift", [utc(3, 8, 7, 30)]),  # 03:30 EDT: the offset before the gap (RFC 5545)
        ("end", [utc(3, 8, 7)]),  # 03:00 EDT: the first instant after the gap
        ("skip", []),
    ],
)
@pytest.mark.parametrize("text", ["FREQ=DAILY;BYHOUR=2;BYMINUTE=30", "30 2 * * *"])
def test_each_dst_gap_value_on_the_spring_forward_day(text: str, gap: str, expected: list[datetime]) -> None:
    assert runs(parse(text, dst_gap=gap), SPRING) == expected


@pytest.mark.parametrize(
    ("repeat", "expected"),
    [
        ("first", [utc(11, 1, 5, 30)]),  # 01:30 EDT
        ("second", [utc(11, 1, 6, 30)]),  # 01:30 EST
        ("both", [utc(11, 1, 5, 30), utc(11, 1, 6, 30)]),  # one real hour apart
    ],
)
@pytest.mark.parametrize("text", ["FREQ=DAILY;BYHOUR=1;BYMINUTE=30", "30 1 * * *"])
def test_each_dst_repeat_value_on_the_fall_back_day(text: str, repeat: str, expected: list[datetime]) -> None:
    assert runs(parse(text, dst_repeat=repeat), FALL) == expected


# --------------------------------------------------------------------------- auto, per schedule type


@pytest.mark.parametrize(
    ("text", "gap", "repeat"),
    [
        ("*/15 * * * *", "skip", "both"),
        ("0 * * * *", "skip", "both"),
        ("@hourly", "skip", "both"),
        ("30 */2 * * *", "skip", "both"),
        ("30 2 * * *", "end", "first"),
        ("0 9-17 * * 1-5", "end", "first"),
        ("@daily", "end", "first"),
        ("FREQ=HOURLY", "skip", "both"),
        ("FREQ=MINUTELY;INTERVAL=15", "skip", "both"),
        ("FREQ=SECONDLY;INTERVAL=30", "skip", "both"),
        ("FREQ=DAILY;BYHOUR=8", "shift", "first"),
        ("FREQ=WEEKLY;BYDAY=MO", "shift", "first"),
        ("FREQ=MONTHLY;BYMONTHDAY=1", "shift", "first"),
    ],
)
def test_auto_picks_per_schedule_type(text: str, gap: str, repeat: str) -> None:
    policy = parse(text).policy
    assert (policy.gap, policy.repeat, policy.gap_auto, policy.repeat_auto) == (gap, repeat, True, True)
    explicit = parse(text, dst_gap="end", dst_repeat="second").policy
    assert (explicit.gap, explicit.repeat, explicit.gap_auto, explicit.repeat_auto) == (
        "end",
        "second",
        False,
        False,
    )


@pytest.mark.parametrize("text", ["0 * * * *", "@hourly", "FREQ=HOURLY"])
@pytest.mark.parametrize("around", [SPRING, FALL])
def test_hourly_runs_every_real_hour_through_both_changes(text: str, around: datetime) -> None:
    found = runs(parse(text), around - timedelta(hours=1), hours=8)
    assert found == [around + timedelta(hours=h) for h in range(-1, 8)]


@pytest.mark.parametrize("around", [SPRING, FALL])
def test_every_30_minutes_runs_every_real_half_hour_through_both_changes(around: datetime) -> None:
    found = runs(parse("*/30 * * * *"), around, hours=6)
    assert found == [around + timedelta(minutes=30 * n) for n in range(13)]


def test_fixed_time_cron_follows_vixie_and_daily_rrule_follows_the_rfc_by_default() -> None:
    assert runs(parse("30 2 * * *"), SPRING) == [utc(3, 8, 7)]
    assert runs(parse("30 1 * * *"), FALL) == [utc(11, 1, 5, 30)]
    assert runs(parse("FREQ=DAILY;BYHOUR=2;BYMINUTE=30"), SPRING) == [utc(3, 8, 7, 30)]
    assert runs(parse("FREQ=DAILY;BYHOUR=1;BYMINUTE=30"), FALL) == [utc(11, 1, 5, 30)]


def test_wall_times_that_map_to_the_same_instant_run_once() -> None:
    # 02:00 and 02:30 both end at 03:00 EDT, where 03:00 runs anyway: one run.
    schedule = parse("0,30 2-3 * * *", dst_gap="end")
    assert runs(schedule, SPRING) == [utc(3, 8, 7), utc(3, 8, 7, 30)]
    # shift puts 02:30 at 03:30 EDT, which also runs: one run, in order.
    shifted = parse("0,30 2-3 * * *", dst_gap="shift")
    assert runs(shifted, SPRING) == [utc(3, 8, 7), utc(3, 8, 7, 30)]


def at(month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("zone", "after", "gap_run", "repeat_runs"),
    [
        # Lord Howe: 02:00 +10:30 -> 02:30 +11:00 (Oct), 02:00 +11:00 -> 01:30 +10:30 (Apr)
        ("Australia/Lord_Howe", at(10, 3, 12), at(10, 3, 15, 30), [at(4, 4, 14, 45), at(4, 4, 15, 15)]),
        # Chatham: 02:45 +12:45 -> 03:45 +13:45 (Sep), 03:45 +13:45 -> 02:45 +12:45 (Apr)
        ("Pacific/Chatham", at(9, 26, 10), at(9, 26, 14), [at(4, 4, 13), at(4, 4, 14)]),
    ],
)
def test_odd_offsets_follow_each_policy(
    zone: str, after: datetime, gap_run: datetime, repeat_runs: list[datetime]
) -> None:
    wall_in_gap = {"Australia/Lord_Howe": "15 2 * * *", "Pacific/Chatham": "15 3 * * *"}[zone]
    gap_shift = {"Australia/Lord_Howe": timedelta(minutes=15), "Pacific/Chatham": timedelta(minutes=30)}[zone]
    assert runs(parse(wall_in_gap, zone, dst_gap="end"), after, hours=12) == [gap_run]
    assert runs(parse(wall_in_gap, zone, dst_gap="shift"), after, hours=12) == [gap_run + gap_shift]
    assert runs(parse(wall_in_gap, zone, dst_gap="skip"), after, hours=12) == []
    wall_repeated = {"Australia/Lord_Howe": "45 1 * * *", "Pacific/Chatham": "45 2 * * *"}[zone]
    around = repeat_runs[0] - timedelta(hours=3)
    assert runs(parse(wall_repeated, zone, dst_repeat="both"), around) == repeat_runs
    assert runs(parse(wall_repeated, zone, dst_repeat="second"), around) == repeat_runs[1:]


def test_santiago_midnight_gap_and_anchor() -> None:
    # 2026-09-06 00:00 -04:00 does not exist (clocks jump to 01:00 -03:00).
    day_start = anchor_for(datetime(2026, 9, 6, 12, tzinfo=UTC), "America/Santiago")
    assert day_start.replace(tzinfo=None) == datetime(2026, 9, 6)
    # The gap starts at midnight, so reading 00:00 with the old offset (RFC 5545) and the
    # end of the gap (Vixie) are the same instant: 01:00 -03:00; skip drops the day's run.
    daily = parse_schedule("FREQ=DAILY", "America/Santiago", anchor=day_start)
    assert daily.next_after(datetime(2026, 9, 6, 0, tzinfo=UTC)) == datetime(2026, 9, 6, 4, tzinfo=UTC)
    cron = parse("0 0 * * *", "America/Santiago")
    assert cron.next_after(datetime(2026, 9, 6, 0, tzinfo=UTC)) == datetime(2026, 9, 6, 4, tzinfo=UTC)
    skipping = parse("0 0 * * *", "America/Santiago", dst_gap="skip")
    assert skipping.next_after(datetime(2026, 9, 6, 0, tzinfo=UTC)) == datetime(2026, 9, 7, 3, tzinfo=UTC)
    # Fall back (2026-04-05 00:00 -03:00 -> 23:00 -04:00): 23:30 on the 4th exists twice.
    both = parse("30 23 * * *", "America/Santiago", dst_repeat="both")
    assert both.between(
        datetime(2026, 4, 4, 12, tzinfo=UTC), datetime(2026, 4, 5, 12, tzinfo=UTC), limit=9
    ) == [
        datetime(2026, 4, 5, 2, 30, tzinfo=UTC),
        datetime(2026, 4, 5, 3, 30, tzinfo=UTC),
    ]


def test_unknown_policy_values_are_refused() -> None:
    with pytest.raises(ScheduleError, match="dst_gap must be shift, end or skip, got 'later'"):
        parse("0 9 * * *", dst_gap="later")
    with pytest.raises(ScheduleError, match="dst_repeat must be first, second or both, got 'twice'"):
        parse("0 9 * * *", dst_repeat="twice")


def test_the_anchor_is_required() -> None:
    with pytest.raises(TypeError):
        parse_schedule("FREQ=DAILY", "UTC")  # type: ignore[call-arg]
    with pytest.raises(ScheduleError, match="anchor must be timezone-aware"):
        parse_schedule("FREQ=DAILY", "UTC", anchor=datetime(2026, 1, 1))


# --------------------------------------------------------------------------- preview


def test_preview_marks_the_doubled_hour_and_runs_one_real_hour_apart() -> None:
    schedule = parse("0 * * * *")
    lines = format_preview(schedule, datetime(2026, 11, 1, 3, tzinfo=UTC), 6)
    assert lines == [
        "2026-11-01 00:00 Sun EDT (-04:00)  2026-11-01T04:00:00Z",
        "2026-11-01 01:00 Sun EDT (-04:00)  2026-11-01T05:00:00Z  DST repeat: doubled",
        "2026-11-01 01:00 Sun EST (-05:00)  2026-11-01T06:00:00Z  DST repeat: doubled",
        "2026-11-01 02:00 Sun EST (-05:00)  2026-11-01T07:00:00Z",
        "2026-11-01 03:00 Sun EST (-05:00)  2026-11-01T08:00:00Z",
        "2026-11-01 04:00 Sun EST (-05:00)  2026-11-01T09:00:00Z",
    ]
    assert header(schedule, anchor_note="unused for cron") == [
        "dst: dst_gap=skip (auto) dst_repeat=both (auto)"
    ]


@pytest.mark.parametrize(
    ("drops", "runs"),
    [
        # A UTC UNTIL between the two readings ends the rule after the first.
        ("UNTIL=20261101T055959Z", [(utc(11, 1, 5, 30), "first of two")]),
        # An EXDATE instant removes one reading only: the other runs alone.
        ("COUNT=3\nEXDATE:20261101T063000Z", [(utc(11, 1, 5, 30), "first of two")]),
        ("COUNT=3\nEXDATE:20261101T053000Z", [(utc(11, 1, 6, 30), "second of two")]),
        # Nothing drops either reading: both run, doubled.
        ("UNTIL=20261101T063000Z", [(utc(11, 1, 5, 30), "doubled"), (utc(11, 1, 6, 30), "doubled")]),
    ],
)
def test_a_reading_of_a_repeated_hour_whose_twin_the_rule_drops_is_not_marked_doubled(
    drops: str, runs: list[tuple[datetime, str]]
) -> None:
    """dst_repeat=both on a daily 01:30 in New York: when the rule itself drops one reading
    of the fall-back day's 01:30, the other runs alone and preview says which one it is."""
    rule, _, exdate = drops.partition("\n")
    text = f"DTSTART:20261030T013000\nRRULE:FREQ=DAILY;{rule}" + (f"\n{exdate}" if exdate else "")
    schedule = parse(text, dst_repeat="both")
    found = [(o.at, o.dst) for o in schedule.occurrences(FALL, inclusive=True) if o.at and o.at.day == 1]
    assert found == runs, found
    mark = {"first of two": "DST repeat: first of two", "second of two": "DST repeat: second of two"}
    lines = [line for line in format_preview(schedule, FALL, 4) if line.startswith("2026-11-01")]
    assert [line.split("Z  ")[-1] for line in lines] == [mark.get(m, "DST repeat: doubled") for _, m in runs]


@pytest.mark.parametrize(
    ("start", "runs"),
    [
        # DTSTART at the first reading: both run, each doubled.
        ("20261101T053000Z", [(utc(11, 1, 5, 30), "doubled"), (utc(11, 1, 6, 30), "doubled")]),
        # DTSTART at the second reading: the first is before the rule starts, the second runs alone.
        ("20261101T063000Z", [(utc(11, 1, 6, 30), "second of two")]),
    ],
)
def test_a_dtstart_instant_in_a_repeated_hour_is_marked_as_the_readings_that_run(
    start: str, runs: list[tuple[datetime, str]]
) -> None:
    """dst_repeat=both with a DTSTART that names an instant of the fall-back day's 01:30: when
    the later reading runs too, both are marked doubled, not one first of two and one doubled."""
    schedule = parse(f"DTSTART:{start}\nRRULE:FREQ=DAILY;COUNT=3", dst_repeat="both")
    found = [(o.at, o.dst) for o in schedule.occurrences(FALL, inclusive=True) if o.at and o.at.day == 1]
    assert found == runs, found


def test_preview_marks_a_run_moved_by_the_gap_and_one_skipped_in_it() -> None:
    daily = parse("FREQ=DAILY;BYHOUR=2;BYMINUTE=30")
    assert format_preview(daily, datetime(2026, 3, 7, 5, tzinfo=UTC), 3)[1] == (
        "2026-03-08 03:30 Sun EDT (-04:00)  2026-03-08T07:30:00Z  DST gap: moved (shift)"
    )
    assert header(daily, anchor_note="given") == [
        "anchor: 2026-01-01T00:00:00-05:00 (given)",
        "dst: dst_gap=shift (auto) dst_repeat=first (auto)",
    ]
    skipped = parse("30 2 * * *", dst_gap="skip", dst_repeat="second")
    found = preview(skipped, datetime(2026, 3, 7, 5, tzinfo=UTC), 2)
    assert [(o.wall, o.at, o.dst) for o in found] == [
        (datetime(2026, 3, 7, 2, 30), utc(3, 7, 7, 30), None),
        (datetime(2026, 3, 8, 2, 30), None, "skipped"),
        (datetime(2026, 3, 9, 2, 30), utc(3, 9, 6, 30), None),
    ]
    assert "DST gap: skipped" in format_preview(skipped, datetime(2026, 3, 7, 5, tzinfo=UTC), 2)[1]
    assert header(skipped, anchor_note="x") == ["dst: dst_gap=skip dst_repeat=second"]


# --------------------------------------------------------------------------- cron as cronie reads it


@pytest.mark.parametrize(
    ("field", "weekdays"),
    [
        ("fri-sun", {4, 5, 6}),  # Python weekday(): Monday is 0
        ("sat-sun", {5, 6}),
        ("5-0", {4, 5, 6}),
        ("5-7", {4, 5, 6}),
        ("0-6", set(range(7))),
        ("mon-sun", set(range(7))),
        ("1-0/2", {0, 2, 4, 6}),  # 1-7 step 2: Mon, Wed, Fri, Sun
    ],
)
def test_a_day_of_week_range_that_ends_in_sunday_ends_at_7(field: str, weekdays: set[int]) -> None:
    found = parse(f"0 9 * * {field}", "UTC").between(utc(3, 2, 0), utc(3, 15, 23), limit=100)
    assert {run.weekday() for run in found} == weekdays
    assert len(found) == 2 * len(weekdays)


@pytest.mark.parametrize(
    ("text", "rrule"),
    [
        ("*/90 * * * *", "FREQ=MINUTELY;INTERVAL=90"),
        ("0 */36 * * *", "FREQ=HOURLY;INTERVAL=36"),
        ("0 0 */45 * *", "FREQ=DAILY;INTERVAL=45"),
    ],
)
def test_a_step_larger_than_its_field_names_the_rrule_to_write(text: str, rrule: str) -> None:
    with pytest.raises(ScheduleError, match="write an RRULE such as " + rrule.replace(";", ";")) as info:
        parse(text, "UTC")
    assert "restart" in str(info.value)
    # ... and the RRULE it names does what the cron line meant.
    start = datetime(2026, 1, 1, tzinfo=UTC)
    every = parse_schedule(rrule, "UTC", anchor=start).between(start, start + timedelta(days=200), limit=3)
    assert every[1] - every[0] == every[2] - every[1] > timedelta(0)


def test_preview_shows_a_run_of_skipped_wall_times_as_one_range() -> None:
    """A rule of minutes across the spring-forward hour skips sixty wall times: the text shows
    them as one line from the first to the last, with how many; two in a row stay two lines;
    a day that a zone skipped whole (Apia, 2011-12-30) is one line too."""
    minutely = parse("* * * * *", dst_gap="skip")
    lines = format_preview(minutely, datetime(2026, 3, 8, 6, 58, tzinfo=UTC), 3)
    assert lines == [
        "2026-03-08 01:59 Sun EST (-05:00)              2026-03-08T06:59:00Z",
        "2026-03-08 02:00 Sun to 02:59 (60 wall times)  -                     DST gap: skipped",
        "2026-03-08 03:00 Sun EDT (-04:00)              2026-03-08T07:00:00Z",
        "2026-03-08 03:01 Sun EDT (-04:00)              2026-03-08T07:01:00Z",
    ], lines
    half_hourly = parse("*/30 * * * *", dst_gap="skip")
    lines = format_preview(half_hourly, datetime(2026, 3, 8, 6, 0, tzinfo=UTC), 2)
    assert [line.split("  ")[0] for line in lines if "skipped" in line] == [
        "2026-03-08 02:00 Sun (wall time)",
        "2026-03-08 02:30 Sun (wall time)",
    ], lines
    apia = parse_schedule("FREQ=HOURLY", "Pacific/Apia", anchor=datetime(2011, 12, 29, 10, tzinfo=UTC))
    lines = format_preview(apia, datetime(2011, 12, 30, 8, 30, tzinfo=UTC), 2)
    assert [line for line in lines if "skipped" in line] == [
        "2011-12-30 00:00 Fri to 23:00 (24 wall times)  -                     DST gap: skipped"
    ], lines
    listed = preview(apia, datetime(2011, 12, 30, 8, 30, tzinfo=UTC), 2)
    assert len(listed) == 26, "preview itself lists them all"
