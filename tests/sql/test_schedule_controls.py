"""Schedule controls in SQL: the DST policy columns, jitter, pause_after_failures,
backfill, overlap_policy buffer_one and cancel_other (under real claims), and bad
input for each of them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from harness import Conn, digest, expect_error, materialize_occurrences, scalar
from pgtick.schedule import anchor_for, parse_schedule
from pgtick.scheduler import materialize_backfills

INVALID = "22023"
NOT_FOUND = "P0002"


def define(conn: Conn, name: str, schedule: str | None = "0 * * * *", **kw: Any) -> dict[str, Any]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    if schedule is None:
        sql = f"SELECT * FROM jobs.define(%(name)s, 'k', run_at => now() + interval '1 day'{args})"
    else:
        sql = f"SELECT * FROM jobs.define(%(name)s, 'k', %(schedule)s{args})"
    cur = conn.execute(sql, {"name": name, "schedule": schedule, **kw})
    names = [c.name for c in cur.description or []]
    row = cur.fetchone()
    assert row is not None
    return dict(zip(names, row, strict=True))


def health(conn: Conn, name: str) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM jobs.definition_health WHERE name = %s", (name,))
    names = [c.name for c in cur.description or []]
    row = cur.fetchone()
    assert row is not None
    return dict(zip(names, row, strict=True))


def occurrence_runs(conn: Conn, definition_id: int, *occurrences: str) -> list[int]:
    """Scheduled runs of a definition at the given times (SQL expressions), QUEUED."""
    return [
        int(
            scalar(
                conn,
                f"INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for, max_attempts)"
                f" SELECT d.id, d.kind, 'schedule', {when}, d.max_attempts FROM jobs.definitions AS d"
                f" WHERE d.id = %s RETURNING id",
                (definition_id,),
            )
        )
        for when in occurrences
    ]


def statuses(conn: Conn, ids: list[int]) -> list[tuple[str, str | None, bool]]:
    rows = conn.execute(
        "SELECT status::text, failure_reason, cancel_requested FROM jobs.runs"
        " WHERE id = ANY(%s) ORDER BY array_position(%s, id)",
        (ids, ids),
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def claim(conn: Conn, worker: str, batch: int = 1) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM jobs.claim(%s, %s)", (batch, worker)).fetchall()]


# --------------------------------------------------------------------------- bad input

BAD: list[tuple[str, str, str]] = [
    ("SELECT jobs.define('d', 'k', '0 * * * *', dst_gap => 'later')", INVALID, "dst_gap"),
    ("SELECT jobs.define('d', 'k', '0 * * * *', dst_gap => '')", INVALID, "dst_gap"),
    ("SELECT jobs.define('d', 'k', '0 * * * *', dst_repeat => 'twice')", INVALID, "dst_repeat"),
    ("SELECT jobs.define('d', 'k', run_at => now(), dst_gap => 'skip')", INVALID, "dst_gap"),
    ("SELECT jobs.define('d', 'k', '0 * * * *', jitter => '-1 second')", INVALID, "jitter"),
    ("SELECT jobs.define('d', 'k', '0 * * * *', jitter => '2 days')", INVALID, "jitter"),
    ("SELECT jobs.define('d', 'k', '0 * * * *', pause_after_failures => 0)", INVALID, "pause_after_failures"),
    (
        "SELECT jobs.define('d', 'k', '0 * * * *', pause_after_failures => -3)",
        INVALID,
        "pause_after_failures",
    ),
    ("SELECT jobs.define('d', 'k', '0 * * * *', overlap_policy => 'buffer_two')", INVALID, "overlap_policy"),
    (
        "SELECT jobs.backfill('hourly', now() - interval '1 hour', now() - interval '2 hours')",
        INVALID,
        "after",
    ),
    ("SELECT jobs.backfill('hourly', now() - interval '400 days', now())", INVALID, "366 days"),
    (
        "SELECT jobs.backfill('hourly', now() - interval '1 hour', now() + interval '1 hour')",
        INVALID,
        "future",
    ),
    ("SELECT jobs.backfill('hourly', NULL, now())", INVALID, "from"),
    ("SELECT jobs.backfill('hourly', '-infinity', now())", INVALID, "from"),
    ("SELECT jobs.backfill('nope', now() - interval '1 hour', now())", NOT_FOUND, "nope"),
    ("SELECT jobs.backfill('once', now() - interval '1 hour', now())", INVALID, "one-shot"),
]


def test_bad_input_for_each_new_argument_is_refused_by_name_and_changes_nothing(conn: Conn) -> None:
    define(conn, "hourly")
    define(conn, "once", None)
    wrong: list[str] = []
    for sql, sqlstate, mention in BAD:
        before = (digest(conn), scalar(conn, "SELECT count(*) FROM jobs.backfills"))
        try:
            expect_error(conn, sql, None, sqlstate, mention)
        except AssertionError as exc:
            wrong.append(str(exc).splitlines()[0][:300])
        if (digest(conn), scalar(conn, "SELECT count(*) FROM jobs.backfills")) != before:
            wrong.append(f"{sql}: changed the database")
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------- DST policy columns


AUTO_CASES = [
    "*/15 * * * *",
    "0 * * * *",
    "@hourly",
    "@HOURLY",
    "5 */2 * * *",
    "30 2 * * *",
    "0 9-17 * * 1-5",
    "@daily",
    "@weekly",
    "FREQ=HOURLY;INTERVAL=5",
    "freq=minutely",
    "FREQ=SECONDLY;INTERVAL=30",
    "FREQ=DAILY;BYHOUR=8",
    "RRULE:FREQ=WEEKLY",
    "DTSTART:20260101T090000\nRRULE:FREQ=MINUTELY;INTERVAL=30",
    "DTSTART:20260101T090000\nRRULE:FREQ=MONTHLY",
    # Spaces around '=' and after 'RRULE:' are read by the driver as without them.
    "FREQ = HOURLY; BYMINUTE = 0",
    "FREQ= MINUTELY;INTERVAL=15",
    "RRULE: FREQ =SECONDLY;INTERVAL=30",
    "FREQ = DAILY; BYHOUR = 8",
]


@pytest.mark.parametrize("text", AUTO_CASES)
def test_sql_auto_policy_agrees_with_the_driver(conn: Conn, text: str) -> None:
    policy = parse_schedule(text, "UTC", anchor=datetime(2026, 1, 1, tzinfo=UTC)).policy
    assert scalar(conn, "SELECT jobs._dst_auto(%s)", (text,)) == [policy.gap, policy.repeat]


def test_health_shows_the_effective_policy_and_controls(conn: Conn) -> None:
    define(conn, "auto-hourly", "0 * * * *")
    define(conn, "auto-daily", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30", timezone="America/New_York")
    define(conn, "told", "30 2 * * *", dst_gap="skip", jitter=timedelta(minutes=5), pause_after_failures=3)
    define(conn, "one-shot", None)
    h = {name: health(conn, name) for name in ("auto-hourly", "auto-daily", "told", "one-shot")}
    view = {n: (r["dst_gap"], r["dst_repeat"], r["dst_auto"]) for n, r in h.items()}
    assert view == {
        "auto-hourly": ("skip", "both", True),
        "auto-daily": ("shift", "first", True),
        "told": ("skip", "first", False),
        "one-shot": (None, None, False),
    }
    assert (h["told"]["jitter"], h["told"]["pause_after_failures"]) == (timedelta(minutes=5), 3)


def test_changing_the_dst_policy_resets_the_cursor(conn: Conn) -> None:
    first = define(conn, "d", "30 2 * * *")
    cursor = datetime(2026, 6, 1, 6, 30, tzinfo=UTC)
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (cursor, first["id"]))
    again = define(conn, "d", "30 2 * * *")
    assert (again["revision"], again["next_run_at"]) == (first["revision"], cursor)
    changed = define(conn, "d", "30 2 * * *", dst_gap="skip")
    assert changed["revision"] == first["revision"] + 1
    assert changed["next_run_at"] is None


# --------------------------------------------------------------------------- jitter


def test_jitter_is_deterministic_bounded_and_spread(conn: Conn) -> None:
    rows = conn.execute(
        """
        SELECT t, jobs.jitter_offset(42, t, interval '1 hour'),
               jobs.jitter_offset(42, t, interval '1 hour'),
               jobs.jitter_offset(43, t, interval '1 hour'),
               jobs.jitter_offset(42, t, interval '10 minutes'),
               jobs.jitter_offset(42, t, interval '250 milliseconds')
          FROM generate_series(timestamptz '2026-01-01', timestamptz '2026-01-08', interval '1 hour') AS t
        """
    ).fetchall()
    offsets = [r[1] for r in rows]
    assert all(r[1] == r[2] for r in rows), "the same definition and occurrence gave two offsets"
    bounds = [(timedelta(hours=1), 1), (timedelta(minutes=10), 4), (timedelta(milliseconds=250), 5)]
    bad = [(r[0], r[i]) for r in rows for limit, i in bounds if not timedelta(0) <= r[i] < limit]
    assert not bad, bad
    assert all(r[1].microseconds == 0 and r[4].microseconds == 0 for r in rows), "not whole seconds"
    assert len({r[5] for r in rows}) > len(rows) * 0.9, "sub-second jitter is not spread"
    assert len(set(offsets)) > len(rows) * 0.9, "offsets are not spread"
    assert sum(r[1] != r[3] for r in rows) > len(rows) * 0.9, "other definitions get the same offsets"
    assert max(offsets) > timedelta(minutes=50) and min(offsets) < timedelta(minutes=10)
    zero = scalar(conn, "SELECT jobs.jitter_offset(1, now(), NULL) + jobs.jitter_offset(1, now(), '0')")
    assert zero == timedelta(0)


def test_materialize_delays_each_occurrence_by_its_jitter_and_two_leaders_agree(conn: Conn) -> None:
    d = define(conn, "jittered", "0 * * * *", jitter=timedelta(minutes=30))
    times = [datetime(2026, 6, 1, h, tzinfo=UTC) for h in range(5)]
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (times[0], d["id"]))
    created = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)",
        (d["id"], times[0], times, times[-1] + timedelta(hours=1)),
    )
    assert created == 5
    starts = [r[0] for r in conn.execute(
        "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s ORDER BY scheduled_for", (d["id"],)
    ).fetchall()]  # fmt: skip
    expected = [
        t + scalar(conn, "SELECT jobs.jitter_offset(%s, %s, interval '30 minutes')", (d["id"], t))
        for t in times
    ]
    assert starts == expected
    assert all(t <= s < t + timedelta(minutes=30) for t, s in zip(times, starts, strict=True))
    assert len({s - t for t, s in zip(times, starts, strict=True)}) > 1
    # A second leader with the same plan (the cursor already moved) adds nothing.
    again = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)",
        (d["id"], times[0], times, times[-1] + timedelta(hours=1)),
    )
    assert again == 0


# --------------------------------------------------------------------------- pause_after_failures


def _run_and_fail(conn: Conn, definition_id: int, worker: str = "w") -> int:
    (run_id,) = occurrence_runs(conn, definition_id, "now() - interval '1 second' * (random() + 1)")
    assert claim(conn, worker, 10) == [run_id]
    conn.execute("SELECT jobs.fail(%s, %s, ARRAY['RuntimeError'], 'boom')", (run_id, worker))
    return run_id


def test_pause_after_failures_pauses_after_n_final_failures_and_says_why(conn: Conn) -> None:
    d = define(conn, "flaky", "0 * * * *", pause_after_failures=2, max_attempts=1)
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused"] is False
    # A success ends the streak.
    (ok,) = occurrence_runs(conn, d["id"], "now() - interval '3 seconds'")
    assert claim(conn, "w") == [ok]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (ok,)) is True
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused"] is False
    last = _run_and_fail(conn, d["id"])
    h = health(conn, "flaky")
    assert h["paused"] is True
    assert h["paused_reason"].startswith("paused after 2 consecutive failures (pause_after_failures 2)")
    assert f"run {last}" in h["paused_reason"] and "boom" in h["paused_reason"]
    # Resuming clears the reason and starts a new streak: one more failure does not pause.
    conn.execute("SELECT jobs.resume('flaky')")
    assert health(conn, "flaky")["paused_reason"] is None
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused"] is False
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused"] is True


ENABLE_AGAIN = {
    "define": "SELECT jobs.define('flaky', 'k', '0 * * * *', enabled => true,"
    " pause_after_failures => 2, max_attempts => 1)",
    "define_many": 'SELECT jobs.define_many(\'[{"name": "flaky", "kind": "k",'
    ' "schedule": "0 * * * *", "enabled": true, "pause_after_failures": 2,'
    ' "max_attempts": 1}]\')',
}


@pytest.mark.parametrize("call", sorted(ENABLE_AGAIN))
def test_declaring_a_paused_definition_enabled_is_a_resume(conn: Conn, call: str) -> None:
    d = define(conn, "flaky", "0 * * * *", pause_after_failures=2, max_attempts=1)
    _run_and_fail(conn, d["id"])
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused_reason"] is not None
    conn.execute(ENABLE_AGAIN[call])
    h = health(conn, "flaky")
    assert (h["paused"], h["paused_reason"]) == (False, None)
    # The streak starts again: the failures before the declaration do not count.
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused"] is False
    _run_and_fail(conn, d["id"])
    assert health(conn, "flaky")["paused"] is True


def test_a_failure_that_is_retried_is_not_final(conn: Conn) -> None:
    d = define(conn, "retried", "0 * * * *", pause_after_failures=1, max_attempts=3)
    _run_and_fail(conn, d["id"])
    assert health(conn, "retried")["paused"] is False
    assert (
        scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s AND attempt = 2", (d["id"],))
        == 1
    )


def test_reaped_final_failures_count_too(conn: Conn) -> None:
    d = define(
        conn, "lost", "0 * * * *", pause_after_failures=1, max_attempts=1, heartbeat_timeout="1 second"
    )
    (run_id,) = occurrence_runs(conn, d["id"], "now() - interval '1 minute'")
    conn.execute("SELECT jobs.claim(1, 'w', heartbeat => true)")
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (run_id,))
    assert [r[0] for r in conn.execute("SELECT run_id FROM jobs.reap()").fetchall()] == [run_id]
    assert "HeartbeatLost" in health(conn, "lost")["paused_reason"]


# --------------------------------------------------------------------------- backfill


def test_backfill_materializes_a_past_window_once(conn: Conn) -> None:
    d = define(conn, "hourly", "30 * * * *", timezone="Europe/Sofia")
    now = scalar(conn, "SELECT now()")
    window = (now - timedelta(hours=6), now - timedelta(hours=1))
    request = conn.execute("SELECT id, done_at FROM jobs.backfill('hourly', %s, %s)", window).fetchone()
    assert request is not None and request[1] is None
    expected = parse_schedule(
        "30 * * * *", "Europe/Sofia", anchor=anchor_for(d["created_at"], "Europe/Sofia")
    ).between(*window, limit=100)
    assert len(expected) == 5
    assert materialize_backfills(conn) == 5
    runs = conn.execute(
        "SELECT scheduled_for, status::text, origin FROM jobs.runs WHERE definition_id = %s ORDER BY 1",
        (d["id"],),
    ).fetchall()
    assert runs == [(t, "QUEUED", "schedule") for t in expected]
    assert conn.execute(
        "SELECT runs_created, error FROM jobs.backfills WHERE id = %s", (request[0],)
    ).fetchone() == (
        5,
        None,
    )
    # Twice: the same window adds nothing; an overlapping one adds only what is new.
    before = digest(conn)["runs"]
    conn.execute("SELECT jobs.backfill('hourly', %s, %s)", window)
    assert materialize_backfills(conn) == 0
    assert digest(conn)["runs"] == before
    assert materialize_backfills(conn) == 0  # nothing pending: a finished request is not redone
    conn.execute("SELECT jobs.backfill('hourly', %s, %s)", (window[0] - timedelta(hours=2), window[1]))
    assert materialize_backfills(conn) == 2
    assert scalar(conn, "SELECT count(*) FROM jobs.backfills WHERE done_at IS NULL") == 0


def test_a_backfill_before_a_count_rules_first_occurrence_says_so(conn: Conn) -> None:
    """A COUNT rule without DTSTART counts from the day it was defined: a window before that
    holds none of its occurrences, and the backfill says why instead of finishing with 0 runs,
    as if the weekdays of the window had no 09:00."""
    weekdays = "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0"
    window = "SELECT jobs.backfill(%s, now() - interval '30 days', now() - interval '20 days')"
    define(conn, "weekday-report", weekdays + ";COUNT=5", timezone="Europe/Sofia")
    conn.execute(window, ("weekday-report",))
    assert materialize_backfills(conn) == 0
    error = scalar(conn, "SELECT error FROM jobs.backfills")
    assert error is not None and "before the schedule's first occurrence" in error, error
    assert "DTSTART" in error, error
    # With a DTSTART before the window, the same window is backfilled.
    define(conn, "weekday-report", f"DTSTART:20200101T000000\nRRULE:{weekdays}", timezone="Europe/Sofia")
    conn.execute(window, ("weekday-report",))
    assert materialize_backfills(conn) in (6, 7, 8)
    # A cron schedule has no first occurrence: its window is walked as it is.
    define(conn, "nightly", "0 2 * * *")
    conn.execute(window, ("nightly",))
    assert materialize_backfills(conn) == 10


def test_a_backfill_before_an_rrule_definition_was_created_has_its_occurrences(conn: Conn) -> None:
    """A weekday report defined today with an RRULE (no DTSTART: it starts today) backfills
    the last two weeks as cron would: every weekday at 09:00 Sofia, and a rule every other
    day keeps its phase (the days an even number of days before today). A COUNT rule counts
    from the day it was defined, so nothing before that day is one of its occurrences."""
    zone = ZoneInfo("Europe/Sofia")
    rules = {
        "weekdays": "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0",
        "every-other-day": "FREQ=DAILY;INTERVAL=2;BYHOUR=9;BYMINUTE=0",
        "three-times": "FREQ=DAILY;COUNT=3;BYHOUR=9;BYMINUTE=0",
    }
    created = {name: define(conn, name, rule, timezone="Europe/Sofia") for name, rule in rules.items()}
    now = scalar(conn, "SELECT now()")
    window = (now - timedelta(days=14), now - timedelta(minutes=1))
    for name in rules:
        conn.execute("SELECT jobs.backfill(%s, %s, %s)", (name, *window))
    materialize_backfills(conn)

    today = now.astimezone(zone).date()
    days = [today - timedelta(days=n) for n in range(15)]
    at_nine = [datetime.combine(day, time(9), tzinfo=zone).astimezone(UTC) for day in days]
    in_window = [t for t in at_nine if window[0] <= t <= window[1]]
    expected = {
        "weekdays": sorted(t for t in in_window if t.astimezone(zone).weekday() < 5),
        "every-other-day": sorted(t for t in in_window if (today - t.astimezone(zone).date()).days % 2 == 0),
        "three-times": sorted(t for t in in_window if t.astimezone(zone).date() == today),
    }
    for name, d in created.items():
        runs = [
            r[0]
            for r in conn.execute(
                "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s ORDER BY 1", (d["id"],)
            ).fetchall()
        ]
        assert runs == expected[name], name
    # From the day it was defined on, the rule is the one the scheduler walks.
    for rule in rules.values():
        schedule = parse_schedule(rule, "Europe/Sofia", anchor=anchor_for(now, "Europe/Sofia"))
        start = schedule.anchor
        assert schedule.reaching_back(window[0]).between(start, start + timedelta(days=60), limit=100) == (
            schedule.between(start, start + timedelta(days=60), limit=100)
        )


@pytest.mark.parametrize("how", ["resume", "define enabled", "define_many enabled"])
def test_a_backfill_of_a_paused_window_survives_the_resume(conn: Conn, how: str) -> None:
    """Pause, backfill the paused window, resume, before the scheduler's next tick (or while
    it is down): the resume restarts the cursor but keeps the schedule, so the backfill is
    still the schedule's and inserts its runs. A resume that changes the schedule voids it."""
    d = define(conn, "hourly", "0 * * * *", enabled=False)
    hour = scalar(conn, "SELECT date_trunc('hour', now())")
    window = (hour - timedelta(hours=6), hour - timedelta(minutes=1))  # six occurrences
    conn.execute("SELECT jobs.backfill('hourly', %s, %s)", window)
    if how == "resume":
        conn.execute("SELECT jobs.resume('hourly')")
    elif how == "define enabled":
        define(conn, "hourly", "0 * * * *", enabled=True)
    else:
        conn.execute(
            "SELECT * FROM jobs.define_many(%s::jsonb)",
            ('[{"name": "hourly", "kind": "k", "schedule": "0 * * * *", "enabled": true}]',),
        )
    assert materialize_backfills(conn) == 6
    assert conn.execute("SELECT runs_created, error FROM jobs.backfills").fetchall() == [(6, None)]
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (d["id"],)) == 6

    define(conn, "hourly", "0 * * * *", enabled=False)
    conn.execute("SELECT jobs.backfill('hourly', %s, %s)", window)
    define(conn, "hourly", "30 * * * *", enabled=True)
    assert materialize_backfills(conn) == 0
    assert scalar(conn, "SELECT error FROM jobs.backfills ORDER BY id DESC LIMIT 1") == (
        "the definition's schedule changed after the backfill was requested"
    )


def test_finishing_a_backfill_with_null_run_times_is_refused_and_keeps_it_pending(conn: Conn) -> None:
    define(conn, "hourly", "0 * * * *")
    request = scalar(conn, "SELECT id FROM jobs.backfill('hourly', now() - interval '3 hours', now())")
    expect_error(conn, "SELECT jobs.finish_backfill(%s, NULL)", (request,), "22004", "run_times")
    assert scalar(conn, "SELECT done_at IS NULL FROM jobs.backfills WHERE id = %s", (request,))
    assert materialize_backfills(conn) == 3  # still pending: the leader materializes it


def test_a_backfill_of_a_changed_schedule_is_voided(conn: Conn) -> None:
    define(conn, "hourly", "0 * * * *")
    conn.execute("SELECT jobs.backfill('hourly', now() - interval '3 hours', now())")
    define(conn, "hourly", "15 * * * *")
    assert materialize_backfills(conn) == 0
    assert "changed" in scalar(conn, "SELECT error FROM jobs.backfills")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def test_a_backfill_skips_an_occurrence_that_ran_under_another_jitter(conn: Conn) -> None:
    """The occurrences a backfill finds already run are skipped by the occurrence each run
    records, not by its start: a jitter changed since then moves the start but not the
    occurrence, and the backfill must not run it again."""
    d = define(conn, "hourly", "0 * * * *", jitter="40 minutes")
    ran = scalar(conn, "SELECT date_trunc('hour', now()) - interval '3 hours'")
    materialize_occurrences(conn, d["id"], [ran], ran + timedelta(hours=1))
    define(conn, "hourly", "0 * * * *", jitter="5 minutes")  # the same schedule, a new jitter
    conn.execute(
        "SELECT jobs.backfill('hourly', %s, %s)", (ran - timedelta(minutes=30), ran + timedelta(minutes=90))
    )
    assert materialize_backfills(conn) == 1, "only the occurrence after the one that ran is new"
    per_occurrence = conn.execute(
        "SELECT occurrence_at, count(*) FROM jobs.runs WHERE definition_id = %s GROUP BY 1 ORDER BY 1",
        (d["id"],),
    ).fetchall()
    assert per_occurrence == [(ran, 1), (ran + timedelta(hours=1), 1)], per_occurrence


# --------------------------------------------------------------------------- overlap under real claims


def test_buffer_one_keeps_one_occurrence_waiting_and_skips_the_rest(conn: Conn, db: Any) -> None:
    d = define(conn, "buffered", "0 * * * *", overlap_policy="buffer_one")
    assert d["max_concurrent_runs"] == 1  # buffer_one is about a running occurrence: cap 1 by default
    running, waiting, late, later = occurrence_runs(
        conn,
        d["id"],
        "now() - interval '4 minutes'",
        "now() - interval '3 minutes'",
        "now() - interval '2 minutes'",
        "now() - interval '1 minute'",
    )
    assert claim(conn, "w1") == [running]
    with db.connect() as other:  # a second claimer, its own session and commits
        assert claim(other, "w2", 10) == []
    assert statuses(conn, [running, waiting, late, later]) == [
        ("RUNNING", None, False),
        ("QUEUED", None, False),
        ("CANCELLED", "Skipped", False),
        ("CANCELLED", "Skipped", False),
    ]
    assert "buffer_one" in scalar(conn, "SELECT error FROM jobs.runs WHERE id = %s", (late,))
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (running,)) is True
    with db.connect() as other:
        assert claim(other, "w2", 10) == [waiting]


def test_buffer_one_with_small_batches_still_skips_beyond_one(conn: Conn) -> None:
    d = define(conn, "buffered", "0 * * * *", overlap_policy="buffer_one")
    running, *queued = occurrence_runs(
        conn, d["id"], *(f"now() - interval '{9 - n} minutes'" for n in range(6))
    )
    assert claim(conn, "w1") == [running]
    assert claim(conn, "w2") == []  # batch 1: the pool sees one row, the rule sees them all
    assert [s[0] for s in statuses(conn, queued)] == ["QUEUED"] + ["CANCELLED"] * 4


def test_queue_policy_keeps_every_occurrence_waiting(conn: Conn) -> None:
    d = define(conn, "queued", "0 * * * *", max_concurrent_runs=1)
    running, *queued = occurrence_runs(
        conn, d["id"], *(f"now() - interval '{9 - n} minutes'" for n in range(4))
    )
    assert claim(conn, "w1") == [running]
    assert claim(conn, "w2", 10) == []
    assert [s[0] for s in statuses(conn, queued)] == ["QUEUED"] * 3


def test_cancel_other_asks_the_running_one_to_cancel_then_waits_for_it(conn: Conn, db: Any) -> None:
    d = define(conn, "latest-wins", "0 * * * *", overlap_policy="cancel_other")
    assert d["max_concurrent_runs"] == 1
    running, newer = occurrence_runs(
        conn, d["id"], "now() - interval '2 minutes'", "now() - interval '1 minute'"
    )
    assert claim(conn, "w1") == [running]
    with db.connect() as other:
        assert claim(other, "w2") == []  # it waits ...
    assert statuses(conn, [running, newer]) == [("RUNNING", None, True), ("QUEUED", None, False)]
    # ... the running one's worker sees the request on its next heartbeat ...
    assert conn.execute(
        "SELECT run_id, cancel_requested FROM jobs.heartbeat(%s, 'w1')", ([running],)
    ).fetchall() == [(running, True)]
    conn.execute("SELECT jobs.acknowledge_cancel(%s, 'w1')", (running,))
    assert statuses(conn, [running])[0][0] == "CANCELLED"
    with db.connect() as other:  # ... and once it is gone the new occurrence starts.
        assert claim(other, "w2") == [newer]
    assert statuses(conn, [newer]) == [("RUNNING", None, False)]


def test_cancel_other_leaves_a_newer_running_occurrence_alone(conn: Conn) -> None:
    d = define(conn, "latest-wins", "0 * * * *", overlap_policy="cancel_other")
    older, running = occurrence_runs(
        conn, d["id"], "now() - interval '2 minutes'", "now() - interval '1 minute'"
    )
    conn.execute(
        "UPDATE jobs.runs SET status = 'RUNNING', started_at = now(), worker = 'w1' WHERE id = %s", (running,)
    )
    assert claim(conn, "w2") == []
    assert statuses(conn, [older, running]) == [("QUEUED", None, False), ("RUNNING", None, False)]


def materialized(conn: Conn, name: str, minutes_ago: list[int], **kw: Any) -> list[int]:
    """The runs of a minutely definition (defined, with a jitter, on the first call) for the
    occurrences that many minutes ago, as the scheduler materializes them (its cursor then left
    at the next one), in occurrence order."""
    d = define(conn, name, "* * * * *", jitter="20 seconds", **kw)
    base = scalar(conn, "SELECT date_trunc('minute', now())")
    occurrences = [base - timedelta(minutes=m) for m in minutes_ago]
    cursor = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (d["id"],))
    if cursor is None or cursor > occurrences[0]:  # a new definition: its cursor at the first
        conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (d["id"], occurrences[0]))
        cursor = occurrences[0]
    conn.execute(
        "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)",
        (d["id"], cursor, occurrences, occurrences[-1] + timedelta(minutes=1)),
    )
    return [
        int(r[0])
        for r in conn.execute(
            "SELECT id FROM jobs.runs WHERE definition_id = %s AND occurrence_at = ANY(%s)"
            " ORDER BY occurrence_at",
            (d["id"], occurrences),
        )
    ]


def test_buffer_one_never_skips_a_run_snoozed_since_it_began(conn: Conn) -> None:
    """buffer_one skips new occurrences beyond the one that waits; a run that began and asked to
    run later (jobs.snooze) is not a new occurrence: it waits as well, and runs."""
    snoozed, running = materialized(conn, "buffered", [10, 9], overlap_policy="buffer_one")
    assert claim(conn, "w1") == [snoozed]
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w1', '0 seconds')", (snoozed,)) is True
    assert claim(conn, "w2") == [running]
    buffered, extra = materialized(conn, "buffered", [8, 7], overlap_policy="buffer_one")
    assert claim(conn, "w3", 10) == []
    assert statuses(conn, [snoozed, running, buffered, extra]) == [
        ("QUEUED", None, False),
        ("RUNNING", None, False),
        ("QUEUED", None, False),
        ("CANCELLED", "Skipped", False),
    ]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2')", (running,)) is True
    assert claim(conn, "w3") == [buffered]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w3')", (buffered,)) is True
    assert claim(conn, "w3") == [snoozed]


def test_cancel_other_is_not_set_off_by_a_snoozed_run(conn: Conn) -> None:
    """cancel_other cancels a running occurrence for a newer occurrence; a run snoozed since it
    began that comes due again is no newer occurrence: the running one is left alone."""
    snoozed, running = materialized(conn, "latest-wins", [10, 9], overlap_policy="cancel_other")
    assert claim(conn, "w1") == [snoozed]
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w1', '0 seconds')", (snoozed,)) is True
    assert claim(conn, "w2") == [running]
    assert claim(conn, "w3") == []
    assert statuses(conn, [snoozed, running]) == [("QUEUED", None, False), ("RUNNING", None, False)]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2')", (running,)) is True
    assert claim(conn, "w3") == [snoozed]


def test_two_final_failures_committing_at_once_both_count(conn: Conn, db: Any) -> None:
    """Each failure counts the streak at commit, after the other committed: with
    pause_after_failures 2, two failures committed at the same moment pause it."""
    d = define(conn, "racy", "0 * * * *", pause_after_failures=2, max_attempts=1)
    first, second = occurrence_runs(
        conn, d["id"], "now() - interval '2 minutes'", "now() - interval '1 minute'"
    )
    assert sorted(claim(conn, "w", 10)) == sorted([first, second])
    with db.connect() as a, db.connect() as b:
        a.autocommit = b.autocommit = False
        a.execute("SELECT jobs.fail(%s, 'w', ARRAY['RuntimeError'], 'a')", (first,))
        b.execute("SELECT jobs.fail(%s, 'w', ARRAY['RuntimeError'], 'b')", (second,))
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def commit(session: Conn) -> None:
            try:
                start.wait(timeout=30)
                session.commit()
            except BaseException as exc:  # reported below, with which session
                errors.append(exc)

        threads = [threading.Thread(target=commit, args=(s,)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
    h = health(conn, "racy")
    assert (h["paused"], h["consecutive_failures"]) == (True, 2), h
