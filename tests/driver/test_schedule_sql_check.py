"""What SQL alone checks of schedule text (jobs.define from psql, jobs.define_many) agrees with
the driver's full parse: SQL never refuses a schedule the driver takes, and where it refuses
one it says what the driver says. The driver may refuse more (a rule with no occurrence)."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from pgtick.definitions import validate_schedule
from pgtick.errors import InvalidArgument

#: Cron field values the field takes (names, the ends of its range), per field, and values
#: none takes or only some do; steps right, too large, zero or not numbers.
GOOD = [
    ["0", "5", "30", "59"],
    ["0", "9", "17", "23"],
    ["1", "15", "29", "31"],
    ["1", "2", "12", "jan", "dec"],
    ["0", "5", "7", "sun", "fri", "sat"],
]
BAD = ["60", "24", "32", "13", "8", "99", "foo", "x", "", "-"]
STEPS = ["", "", "/1", "/2", "/15", "/0", "/24", "/61", "/x"]

#: RRULE texts the shape check passes: good and bad FREQ and BY values, with other lines.
RRULES = [
    "FREQ=DAILY", "FREQ=daily;byhour=5", "FREQ=BOGUS", "FREQ=DAILY;BYHOUR=99", "FREQ=DAILY;BYHOUR=-1",
    "FREQ=DAILY;BYHOUR=23;BYMINUTE=59;BYSECOND=59", "FREQ=DAILY;BYSECOND=60", "FREQ=YEARLY;BYMONTH=13",
    "FREQ=YEARLY;BYMONTH=12;BYMONTHDAY=25", "FREQ=HOURLY;INTERVAL=5", "FREQ=WEEKLY;BYDAY=MO,FR;BYHOUR=8,17",
    "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;COUNT=3", "FREQ=MONTHLY;BYHOUR=a",
    "DTSTART:20260101T090000Z\nRRULE:FREQ=DAILY;BYMINUTE=61",
    "RRULE:FREQ=MINUTELY;INTERVAL=90\nEXDATE:20260101T000000",
    "FREQ = HOURLY; BYMINUTE = 0", "RRULE: FREQ =DAILY;BYHOUR = 99", "FREQ =BOGUS",
    *"""FREQ=DAILY;BYMONTHDAY=32 FREQ=DAILY;INTERVAL=0 FREQ=DAILY;COUNT=-1 FREQ=DAILY;UNTIL=garbage
    FREQ=DAILY;BYDAY=XX RDATE:garbage FREQ=MONTHLY;BYMONTHDAY=-31,0 FREQ=MONTHLY;BYMONTHDAY=-31,1
    FREQ=YEARLY;BYWEEKNO=54 FREQ=YEARLY;BYWEEKNO=-53 FREQ=MONTHLY;BYWEEKNO=1 FREQ=WEEKLY;BYMONTHDAY=1
    FREQ=DAILY;BYYEARDAY=1 FREQ=HOURLY;BYYEARDAY=1 FREQ=YEARLY;BYYEARDAY=-367 FREQ=YEARLY;BYYEARDAY=+366
    FREQ=MONTHLY;BYSETPOS=0;BYDAY=MO FREQ=MONTHLY;BYSETPOS=-1;BYDAY=MO,FR FREQ=WEEKLY;INTERVAL=52142
    FREQ=WEEKLY;INTERVAL=52143 FREQ=SECONDLY;INTERVAL=31536000001 FREQ=YEARLY;INTERVAL=1001
    FREQ=DAILY;COUNT=3;UNTIL=20270101 FREQ=DAILY;COUNT=0 FREQ=DAILY;COUNT=x FREQ=DAILY;WKST=XX
    FREQ=WEEKLY;WKST=SU;BYDAY=SA,SU FREQ=DAILY;BYDAY=1MO FREQ=MONTHLY;BYDAY=54MO FREQ=MONTHLY;BYDAY=-1FR
    FREQ=YEARLY;BYDAY=+0MO FREQ=MONTHLY;BYDAY=1XX FREQ=DAILY;FOO=1 FREQ=DAILY;;BYHOUR=5 FREQ=DAILY;BYHOUR
    FREQ=DAILY;=5 FREQ=DAILY;FREQ=WEEKLY FREQ=DAILY;BYHOUR=1;byhour=2 FREQ=DAILY;INTERVAL=+1
    FREQ=DAILY;BYHOUR=007 FREQ=DAILY;UNTIL=20261231T235959Z FREQ=DAILY;UNTIL=20261231T240000
    FREQ=DAILY;UNTIL=00001231 FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30 FREQ=DAILY;BYSECOND=+5
    FREQ=MONTHLY;BYDAY=40MO FREQ=MONTHLY;BYDAY=-6FR FREQ=MONTHLY;BYDAY=5SU,-5MO FREQ=YEARLY;BYDAY=40MO
    FREQ=YEARLY;BYDAY=-53FR FREQ=YEARLY;BYDAY=6MO;BYMONTH=3 BYMONTH=3;FREQ=YEARLY;BYDAY=20TU""".split(),
    "BYHOUR=5;INTERVAL=2", "RDATE:", "RDATE:20260101T090000,20260102T090000", "RDATE:20260101T090000,",
    "DTSTART:20260230T090000\nRRULE:FREQ=DAILY", "DTSTART:20260101T240000\nRRULE:FREQ=DAILY",
    "DTSTART:20260101,20260102\nRRULE:FREQ=DAILY",
    "DTSTART:20260101T090000\nDTSTART:20260101T090000\nFREQ=DAILY",
    "DTSTART;X=1:20260101T090000\nRRULE:FREQ=DAILY", "DTSTART;VALUE=DATE:20260101\nRRULE:FREQ=DAILY",
    "DTSTART;VALUE=PERIOD:20260101\nRRULE:FREQ=DAILY", "DTSTART;VALUE:20260101\nRRULE:FREQ=DAILY",
    "RRULE;X=1:FREQ=DAILY", "FOO:bar\nRRULE:FREQ=DAILY", "EXDATE:20261301T000000\nRRULE:FREQ=DAILY",
    "DTSTART;TZID=Europe/Paris:20260101T090000\nRRULE:FREQ=DAILY", "DTSTART:\nRRULE:FREQ=DAILY",
    "RRULE:FREQ=DAILY;BYHOUR=5\nRRULE:FREQ=WEEKLY;BYMONTHDAY=3", "DTSTART:20260101t090000z\nFREQ=DAILY",
    "RRULE:FREQ=DAILY\n:x", "RRULE:FREQ=DAILY\r\nEXDATE:2026",
    "EXDATE:20260101T000000\nRRULE:FREQ=DAILY;BYDAY=XX",
]  # fmt: skip


#: Cron days of the month that the months never have, and near misses that do occur (February
#: 29th, a step that reaches a long month, a day of the week beside the day of the month).
NEVER = [
    "0 0 31 2 *", "0 0 30,31 feb *", "0 0 31 4,6,9,11 *", "0 0 31 2-6/2 *", "0 0 31 apr-jun/2 *",
    "0 0 29 2 *", "0 0 31 */2 *", "0 0 31 2 mon", "0 0 31 2 */2", "0 0 */31 2 *", "0 0 30-31/5 2,4 *",
]  # fmt: skip


#: Schedules with a control character: refused by both (an escape sequence in one would reach
#: every terminal that shows it), but for line breaks and tabs.
CONTROLS = [
    "0\x0c9 * * * *", "0 9 * * *\x1f", "FREQ=DAILY;X-A=\x1b[2J", "FREQ=DAILY\x9b2J", "FREQ=DAILY\x07",
    "DTSTART:20260101T090000\r\nRRULE:FREQ=DAILY", "0\t9 * * *\t",
]  # fmt: skip


def _value(rng: random.Random, field: int) -> str:
    return rng.choice(GOOD[field]) if rng.random() < 0.93 else rng.choice(BAD)


def _item(rng: random.Random, field: int) -> str:
    roll = rng.random()
    if roll < 0.25:
        return "*" + (rng.choice(STEPS) if rng.random() < 0.3 else "")
    span = _value(rng, field) if roll < 0.75 else f"{_value(rng, field)}-{_value(rng, field)}"
    return span + (rng.choice(STEPS) if rng.random() < 0.2 else "")


def _cron(rng: random.Random) -> str:
    return " ".join(",".join(_item(rng, f) for _ in range(rng.choice((1, 1, 2)))) for f in range(5))


def _driver_problem(text: str) -> str | None:
    try:
        validate_schedule(text, "UTC", "x")
    except InvalidArgument as exc:
        return str(exc).removeprefix("definition=x ")
    return None


def test_sql_refuses_only_what_the_driver_refuses_and_says_it_the_same_way(
    conn: psycopg.Connection[Any],
) -> None:
    rng = random.Random(20261204)
    texts = [*RRULES, *NEVER, *CONTROLS, "0 0 30 2 *", "@hourly", "0 0 * * fri-sun", "0 0 * * 5-0"]
    texts += [_cron(rng) for _ in range(1500)]
    sql = conn.execute(
        "SELECT t, jobs._schedule_problem(t) FROM unnest(%s::text[]) WITH ORDINALITY AS x (t, o) ORDER BY o",
        (texts,),
    ).fetchall()
    refused_by_sql = 0
    for text, problem in sql:
        driver = _driver_problem(text)
        if problem is None:
            continue
        refused_by_sql += 1
        if problem.startswith("schedule '"):  # the shape: a cron field the driver reads as garbage
            assert driver is not None, f"{text!r}: SQL refused what the driver takes: {problem}"
            continue
        assert driver == problem, f"{text!r}: SQL says {problem!r}, the driver {driver!r}"
    assert refused_by_sql > 300, f"the cases barely reach SQL's checks ({refused_by_sql} refused)"
    accepted = sum(1 for _, problem in sql if problem is None)
    assert accepted > 150, f"the cases barely reach accepted schedules ({accepted})"
    never = {text: problem for text, problem in sql if text in NEVER}
    refused = {text for text, problem in never.items() if problem is not None}
    expected = {text for text in NEVER if _driver_problem(text) is not None}
    assert refused == expected, f"a day no month has: SQL refused {refused}, the driver {expected}"
    controls = {text for text, problem in sql if text in CONTROLS and problem is not None}
    assert controls == set(CONTROLS[:5]), f"control characters: SQL refused {controls}"


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("99 99 99 99 99", "schedule: cron field 'minute' value 99 out of range 0-59"),
        ("*/90 * * * *", "write an RRULE such as FREQ=MINUTELY;INTERVAL=90"),
        ("FREQ=BOGUS", "schedule: RRULE: unknown FREQ 'BOGUS'"),
        ("FREQ=DAILY;BYHOUR=99", "schedule: RRULE: BYHOUR value 99 out of range 0-23"),
        ("FREQ=DAILY;BYMONTHDAY=32", "schedule: RRULE: BYMONTHDAY value 32 out of range 1-31 or -31--1"),
        ("FREQ=DAILY;INTERVAL=0", "schedule: RRULE: INTERVAL must be a positive integer, got '0'"),
        ("FREQ=DAILY;COUNT=-1", "schedule: RRULE: COUNT must be a non-negative integer, got '-1'"),
        ("FREQ=DAILY;UNTIL=garbage", "schedule: RRULE: UNTIL: invalid date-time 'GARBAGE'"),
        ("FREQ=DAILY;BYDAY=XX", "schedule: RRULE: invalid BYDAY value 'XX'"),
        ("RDATE:garbage", "schedule: RDATE: invalid date-time 'garbage'"),
        ("FREQ=WEEKLY;INTERVAL=60000", "schedule: RRULE: INTERVAL must be at most 52,142, got 60000"),
        ("0 0 31 2 *", "schedule: cron: schedule has no occurrences (day-of-month '31' never occurs"),
        ("0 9 31 apr,jun *", "(day-of-month '31' never occurs in month 'apr,jun')"),
    ],
)
def test_jobs_define_and_define_many_refuse_a_bad_schedule_from_psql(
    conn: psycopg.Connection[Any], schedule: str, message: str
) -> None:
    for sql, params in (
        ("SELECT jobs.define('d', 'k', schedule => %s)", (schedule,)),
        ("SELECT * FROM jobs.define_many(jsonb_build_array(jsonb_build_object("
         "'name', 'd', 'kind', 'k', 'schedule', %s::text)))", (schedule,)),
    ):  # fmt: skip
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute(sql, params)
        assert message in str(caught.value), f"{sql}: {caught.value}"
    assert conn.execute("SELECT count(*) FROM jobs.definitions").fetchone() == (0,)
