"""Materialization against a real database: exactly once, misfire policies, DST,
cursors of definitions made in psql, finished schedules, broken schedules."""

from __future__ import annotations

import itertools
import re
import threading
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from harness import (
    Clock,
    Conn,
    Database,
    claim,
    define,
    enqueue,
    finish_old,
    one,
    refuse_runs_of,
    run_in_processes,
    scalar,
    wait_for,
)
from pgtick import calls
from pgtick.scheduler import MAX_LEASE_TTL, Scheduler


def run_times(conn: psycopg.Connection[Any], definition_id: int) -> list[datetime]:
    rows = conn.execute(
        "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s AND origin = 'schedule'"
        " ORDER BY scheduled_for",
        (definition_id,),
    ).fetchall()
    return [r[0] for r in rows]


def cursor_of(conn: psycopg.Connection[Any], definition_id: int) -> datetime | None:
    row = conn.execute("SELECT next_run_at FROM jobs.definitions WHERE id = %s", (definition_id,)).fetchone()
    assert row is not None
    value: datetime | None = row[0]
    return value


def revision_of(conn: psycopg.Connection[Any], definition_id: int) -> int:
    row = conn.execute("SELECT revision FROM jobs.definitions WHERE id = %s", (definition_id,)).fetchone()
    assert row is not None
    return int(row[0])


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# -- two leaders --------------------------------------------------------------------


def materialize_loop(dsn: str, seconds: float) -> tuple[int, int]:
    """A would-be leader that skips the lock and materializes in a tight loop."""
    # The same fixed horizon in both processes, so they compete for the same cursors.
    scheduler = Scheduler(dsn, owner=f"rogue-{time.monotonic_ns()}", tick_interval=0.05, lookahead=0.1)
    created = stale = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            report = scheduler.materialize_due()
            created += report.runs_created
            stale += report.stale
    finally:
        scheduler.close()
    return created, stale


def test_two_leaders_materialize_each_occurrence_exactly_once(db: Database) -> None:
    """Invariant 3: two processes materializing the same per-second definitions at
    once create every occurrence exactly once, with no gap between first and last."""
    with db.connect() as conn:
        ids = [define(conn, f"every-second-{i}", "FREQ=SECONDLY;INTERVAL=1") for i in range(20)]
    results = run_in_processes(materialize_loop, [(db.dsn, 6.0), (db.dsn, 6.0)])
    with db.connect() as conn:
        dupes = conn.execute(
            "SELECT definition_id, coalesce(occurrence_at, scheduled_for), count(*) FROM jobs.runs"
            " WHERE origin = 'schedule' GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
        assert dupes == [], f"occurrences materialized twice: {dupes[:10]}"
        total = 0
        for definition_id in ids:
            times = run_times(conn, definition_id)
            assert len(times) >= 4, f"definition {definition_id} got only {times}"
            gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=1)]
            assert gaps == [], f"definition {definition_id} lost occurrences between {gaps[:5]}"
            assert cursor_of(conn, definition_id) == times[-1] + timedelta(seconds=1)
            total += len(times)
    created = sum(r[0] for r in results)
    assert created == total, f"processes reported {created} runs but {total} exist"
    # The processes really competed for the same cursors: some compare-and-sets lost.
    assert sum(r[1] for r in results) > 0, f"no contention observed: {results}"


# -- misfire ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("coalesce", [utc(2026, 5, 4, 13)]),
        ("catch_up", [utc(2026, 5, 4, 11), utc(2026, 5, 4, 12), utc(2026, 5, 4, 13)]),
        ("skip", []),
    ],
)
def test_scheduler_down_three_hours_over_hourly_job(
    db: Database, policy: str, expected: list[datetime]
) -> None:
    clock = Clock(utc(2026, 5, 4, 10, 59, 30))
    scheduler = Scheduler(db.dsn, owner="t", tick_interval=1.0, misfire_grace=60, clock=clock)
    with db.connect() as conn:
        definition_id = define(conn, "hourly", "0 * * * *", misfire_policy=policy)
        scheduler.materialize_due()  # cursor initialized: 11:00
        assert cursor_of(conn, definition_id) == utc(2026, 5, 4, 11)
        clock.now = utc(2026, 5, 4, 13, 59, 30)  # down for three hours
        scheduler.materialize_due()
        assert run_times(conn, definition_id) == expected
        assert cursor_of(conn, definition_id) == utc(2026, 5, 4, 14)
        scheduler.materialize_due()  # nothing new until 14:00 comes
        assert run_times(conn, definition_id) == expected
    scheduler.close()


def test_occurrences_late_while_the_leader_led_all_run_whatever_the_misfire_policy(db: Database) -> None:
    """A leader that ticks without a break but cannot move one definition (another
    transaction holds its row, so the leader passes over it) has not been down: when the row
    is free again, every occurrence it fell behind on runs, late, instead of coalescing into
    one as after a downtime. The definition beside it, never held, keeps its own times."""
    clock = Clock(utc(2026, 5, 4, 10, 0, 30))
    scheduler = Scheduler(db.dsn, owner="t", tick_interval=1.0, misfire_grace=60, clock=clock)
    with db.connect() as conn, db.connect() as holder:
        held = define(conn, "held", "* * * * *", misfire_policy="coalesce")
        free = define(conn, "free", "* * * * *", misfire_policy="coalesce")
        scheduler.materialize_due()  # cursors at 10:01
        with holder.transaction():
            holder.execute("SELECT 1 FROM jobs.definitions WHERE id = %s FOR UPDATE", (held,))
            for _ in range(10):  # five minutes of ticks, 30 s apart
                clock.now += timedelta(seconds=30)
                scheduler.materialize_due()
            assert run_times(conn, held) == []
        scheduler.materialize_due()
        expected = [utc(2026, 5, 4, 10, m) for m in range(1, 6)]
        assert run_times(conn, held) == expected, "each late occurrence runs, none coalesced"
        assert run_times(conn, free) == expected
        assert scalar(conn, "SELECT count(*) FROM jobs.catch_ups") == 0, "no downtime is recorded"
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'CANCELLED'") == 0
    scheduler.close()


def test_a_tick_longer_than_the_lease_renews_it_and_leads_to_the_end_without_a_break(db: Database) -> None:
    """Lease leadership: a tick that outlasts the lease (here each cursor's statement takes
    0.3 s, for thirty new definitions one at a time: 9 s, against a 3 s lease) renews the lease
    between its statements, so it initializes every definition, still reaps in the same tick
    and keeps leading; the lease never lapses meanwhile (a rival trying to take it all along
    never gets it). Stopping instead would leave the reaper behind every long tick and make
    the next tick meet its own late occurrences as a downtime."""
    ttl = 3.0  # renewed once half of it has passed: a statement would have to take 1.5 s to miss that
    with db.connect() as conn:
        for i in range(30):
            define(conn, f"slow-{i:02}", "0 0 1 1 *")
        stale = enqueue(conn, kind="stale")
        assert claim(conn, "gone", kinds=["stale"]) == [stale]
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (stale,))
        conn.execute(
            "CREATE FUNCTION public.slow_cursor() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER slow_cursor BEFORE UPDATE OF next_run_at ON jobs.definitions"
            " FOR EACH ROW EXECUTE FUNCTION public.slow_cursor()"
        )
    scheduler = Scheduler(
        db.dsn,
        owner="long-tick",
        tick_interval=0.2,
        leadership="lease",
        lease_ttl=ttl,
        batch=1,
        batches_per_tick=50,
    )
    rival_took: list[str] = []
    done = threading.Event()

    def rival() -> None:
        """Tries to take the lease from the moment the scheduler holds it."""
        held = "SELECT owner FROM jobs.leases WHERE name = 'pgtick:leader'"
        take = "SELECT jobs.acquire_lease('pgtick:leader', 'rival', interval '1 minute')"
        with db.connect() as conn:
            while not done.is_set() and scalar(conn, held) != "long-tick":
                time.sleep(0.01)
            while not done.is_set():
                if scalar(conn, take):
                    rival_took.append(str(scalar(conn, "SELECT clock_timestamp()")))
                    return
                time.sleep(0.05)

    watcher = threading.Thread(target=rival)
    watcher.start()
    try:
        report = scheduler.tick()
        done.set()
        watcher.join(30)
        with db.connect() as conn:
            moved = scalar(conn, "SELECT count(*) FROM jobs.definitions WHERE next_run_at IS NOT NULL")
            status = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (stale,))
        assert not rival_took, f"the lease lapsed mid-tick and a rival took it at {rival_took}"
        assert report.initialized == 30 and moved == 30, (report, moved)
        assert [r["run_id"] for r in report.reaped] == [stale] and status == "FAILED", (report, status)
        assert scheduler.leading and not report.phase_errors, report
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join(30)
        scheduler.close()


@pytest.mark.parametrize(("policy", "late_runs"), [("coalesce", 1), ("skip", 1), ("catch_up", 3)])
def test_a_leader_whose_lease_lapsed_and_that_takes_it_again_keeps_the_misfire_promise(
    db: Database, policy: str, late_runs: int
) -> None:
    """Lease leadership: a leader frozen past its lease (nobody took it over meanwhile) that
    takes the lease again has had a break in its leading: the occurrences of an
    every-10-seconds job that fell due while nobody led are a downtime, settled by the
    misfire policy (coalesce and skip: one run, the latest; catch_up: each), not run one by
    one as if this leader had ticked through them."""
    base = utc(2026, 5, 4, 10, 0, 0)
    clock = Clock(base - timedelta(seconds=1))
    scheduler = Scheduler(
        db.dsn,
        owner="frozen",
        tick_interval=1.0,
        misfire_grace=60,
        clock=clock,
        leadership="lease",
        lease_ttl=600,
    )
    try:
        with db.connect() as conn:
            definition_id = define(
                conn,
                "every-10s",
                "DTSTART:20260504T000000Z\nRRULE:FREQ=SECONDLY;INTERVAL=10",
                misfire_policy=policy,
            )
            assert scheduler.tick().leading  # cursor: base
            assert scheduler.tick().leading  # base within the lookahead: materialized
            assert run_times(conn, definition_id) == [base]
            # Frozen 35 s: its lease lapsed and nobody led meanwhile.
            conn.execute(
                "UPDATE jobs.leases SET expires_at = clock_timestamp() - interval '1 second'"
                " WHERE name = 'pgtick:leader'"
            )
            clock.now = base + timedelta(seconds=35)
            assert scheduler.tick().leading  # renewal refused, the lease taken again
            late = [base + timedelta(seconds=10 * k) for k in range(1, 4)]  # +10s .. +30s
            expected = [base, *late] if late_runs == 3 else [base, late[-1]]
            assert run_times(conn, definition_id) == expected
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"tick_interval": 0.0}, "tick_interval"),
        ({"tick_interval": 30 * 86400.0}, "tick_interval"),
        ({"tick_interval": float("nan")}, "tick_interval"),
        ({"lease_ttl": 0.0}, "lease_ttl"),
        ({"lease_ttl": 400 * 86400.0}, "lease_ttl"),
    ],
)
def test_a_scheduler_given_a_tick_or_lease_it_cannot_lead_by_is_refused_naming_the_field(
    db: Database, options: dict[str, Any], field: str
) -> None:
    """A tick or lease the leader could never work with (an idle_session_timeout past
    PostgreSQL's range, a lease TTL jobs.acquire_lease refuses) is refused when the scheduler
    is made, naming the field, instead of a tick that fails every time and never leads."""
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        Scheduler(db.dsn, owner="t", **options)


def test_the_longest_lease_the_scheduler_and_pgtick_lock_accept_is_one_the_database_grants(
    db: Database,
) -> None:
    """The driver takes lease TTLs up to 365 days (``Scheduler(lease_ttl=...)``, ``pgtick run
    --lease-ttl``, ``pgtick lock --ttl``): the database grants and renews such a lease, and
    still refuses a longer one naming the ttl, so a leader given the longest TTL leads instead
    of failing every tick."""
    scheduler = Scheduler(db.dsn, owner="yearly", leadership="lease", lease_ttl=MAX_LEASE_TTL)
    try:
        assert scheduler.tick().leading, "a leader given the longest accepted lease TTL does not lead"
        assert scheduler.tick().leading, "renewing the longest accepted lease TTL fails"
    finally:
        scheduler.close()
    with db.connect() as conn:
        assert scalar(conn, "SELECT jobs.acquire_lease('yearly', 'o', interval '365 days')") is True
        assert scalar(conn, "SELECT jobs.renew_lease('yearly', 'o', interval '1 year')") is True
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="ttl must be"):
            conn.execute("SELECT jobs.renew_lease('yearly', 'o', interval '367 days')")


def test_a_leader_whose_lease_lapses_while_it_plans_writes_none_of_that_plan(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease leadership: a leader held up between reading the due definitions and writing
    their runs (frozen, swapping; here the read answers after the lease has run out) writes
    nothing of what it planned: the lease may be another leader's by then."""
    ttl = 1.0
    clock = Clock(utc(2026, 5, 4, 10, 0, 30))
    scheduler = Scheduler(
        db.dsn, owner="planning", tick_interval=0.2, clock=clock, leadership="lease", lease_ttl=ttl
    )
    try:
        with db.connect() as conn:
            definition_id = define(conn, "minutely", "* * * * *")
            assert scheduler.tick().leading  # cursor: 10:01
            assert cursor_of(conn, definition_id) == utc(2026, 5, 4, 10, 1)
            read = calls.due_definitions

            def held_up(*args: Any) -> Any:
                rows = read(*args)
                time.sleep(ttl * 1.5)  # past the lease renewed at the start of the tick
                return rows

            monkeypatch.setattr(calls, "due_definitions", held_up)
            clock.now = utc(2026, 5, 4, 10, 1, 0)
            scheduler.tick()
            assert run_times(conn, definition_id) == [], "a deposed leader wrote runs"
            assert cursor_of(conn, definition_id) == utc(2026, 5, 4, 10, 1)
            assert not scheduler.leading
    finally:
        scheduler.close()


def test_catch_up_is_bounded_per_tick(db: Database) -> None:
    clock = Clock(utc(2026, 5, 4, 0, 0, 30))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock, max_catch_up=5)
    with db.connect() as conn:
        definition_id = define(conn, "minutely", "* * * * *", misfire_policy="catch_up")
        scheduler.materialize_due()
        clock.now = utc(2026, 5, 4, 0, 30, 30)
        scheduler.materialize_due()
        first = run_times(conn, definition_id)
        assert first[0] == utc(2026, 5, 4, 0, 1)
        # The leader loops over batches, but each definition gets at most 5 per pass;
        # everything arrives over the next ticks, in order, once.
        for _ in range(10):
            scheduler.materialize_due()
        times = run_times(conn, definition_id)
    assert times == [utc(2026, 5, 4, 0, m) for m in range(1, 31)]
    scheduler.close()


# -- DST through the database --------------------------------------------------------


def test_daily_0800_sofia_across_both_changes(db: Database) -> None:
    """08:00 Europe/Sofia every day: 06:00Z in winter, 05:00Z in summer, once a day,
    through the whole pipeline (driver math, jobs.materialize, the table)."""
    # 2027 so that the RRULE anchor (the day the definition is created) lies before.
    clock = Clock(utc(2027, 3, 26, 0))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock, misfire_grace=3600 * 24 * 400, max_catch_up=1000)
    with db.connect() as conn:
        definition_id = define(
            conn,
            "sofia",
            "FREQ=DAILY;BYHOUR=8;BYMINUTE=0",
            timezone="Europe/Sofia",
            misfire_policy="catch_up",
        )
        # Created at the clock's instant, not at the database's (months before it): a new
        # definition's occurrences start at its creation.
        conn.execute("UPDATE jobs.definitions SET cursor_from = %s WHERE id = %s", (clock.now, definition_id))
        scheduler.materialize_due()
        for moment in (utc(2027, 3, 30, 0), utc(2027, 10, 29, 0), utc(2027, 11, 2, 0)):
            clock.now = moment
            scheduler.materialize_due()
        times = run_times(conn, definition_id)
    sofia = ZoneInfo("Europe/Sofia")
    by_day = {t.astimezone(sofia).date(): t for t in times}
    assert len(times) == len(by_day), "two runs on one day"
    assert by_day[date(2027, 3, 27)] == utc(2027, 3, 27, 6)  # EET, +02:00
    assert by_day[date(2027, 3, 28)] == utc(2027, 3, 28, 5)  # EEST from 03:00 that day
    assert by_day[date(2027, 10, 30)] == utc(2027, 10, 30, 5)
    assert by_day[date(2027, 10, 31)] == utc(2027, 10, 31, 6)  # back to EET at 04:00
    assert sorted(by_day) == [date(2027, 3, 26) + timedelta(days=n) for n in range(len(by_day))]
    assert all(t.astimezone(sofia).hour == 8 and t.astimezone(sofia).minute == 0 for t in times)
    scheduler.close()


def test_a_schedule_of_dates_alone_runs_each_date_once_then_finishes(db: Database) -> None:
    """RDATE lines without a rule (an RFC 5545 recurrence set of dates), defined from SQL:
    each date runs once, at its wall time in the zone, and then the schedule is finished."""
    clock = Clock(utc(2027, 1, 1, 0))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock)
    with db.connect() as conn:
        definition_id = define(
            conn, "dates", "RDATE:20270102T090000,20270705T090000", timezone="Europe/Sofia"
        )
        conn.execute("UPDATE jobs.definitions SET cursor_from = %s WHERE id = %s", (clock.now, definition_id))
        for moment in (utc(2027, 1, 1, 0), utc(2027, 1, 2, 7, 1), utc(2027, 7, 5, 6, 1), utc(2027, 8, 1)):
            clock.now = moment
            scheduler.materialize_due()
        assert run_times(conn, definition_id) == [utc(2027, 1, 2, 7), utc(2027, 7, 5, 6)]
        finished = scalar(conn, "SELECT finished FROM jobs.definition_health WHERE name = 'dates'")
    assert finished is True
    scheduler.close()


def test_dtstart_with_dates_alone_is_the_first_run(db: Database) -> None:
    """RFC 5545: DTSTART is the first instance of a recurrence set, also when only RDATE lines
    follow it; the schedule runs it, then each date, then is finished."""
    clock = Clock(utc(2030, 1, 1, 0, 0, 0))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock)
    with db.connect() as conn:
        definition_id = define(
            conn, "start-and-dates", "DTSTART:20300101T000010Z\nRDATE:20300101T000011Z,20300101T000012Z"
        )
        for second in (0, 10, 11, 12, 13):
            clock.now = utc(2030, 1, 1, 0, 0, second)
            scheduler.materialize_due()
        times = run_times(conn, definition_id)
        finished = scalar(conn, "SELECT finished FROM jobs.definition_health WHERE name = 'start-and-dates'")
    assert times == [utc(2030, 1, 1, 0, 0, 10), utc(2030, 1, 1, 0, 0, 11), utc(2030, 1, 1, 0, 0, 12)]
    assert finished is True
    scheduler.close()


# -- cursors, finished schedules, broken schedules ------------------------------------


def test_definition_from_psql_gets_a_cursor_within_one_tick(db: Database) -> None:
    db.psql("SELECT jobs.define('from-psql', 'k', '*/5 * * * *', 'Asia/Tokyo')")
    scheduler = Scheduler(db.dsn, owner="t")
    report = scheduler.tick()
    assert report.leading and report.initialized == 1
    with db.connect() as conn:
        row = conn.execute(
            "SELECT next_run_at, next_run_local FROM jobs.definition_health WHERE name = 'from-psql'"
        ).fetchone()
    assert row is not None and row[0] is not None
    assert row[0].minute % 5 == 0 and row[0].second == 0
    assert row[0] > datetime.now(UTC) - timedelta(seconds=5)
    scheduler.close()


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_an_occurrence_between_a_definitions_creation_and_the_next_tick_runs(db: Database, how: str) -> None:
    """Created a moment before a minute T, with the scheduler's next tick after T: the run of T
    is made (late), not lost because the new cursor started at the tick."""
    with db.connect() as conn:
        if how == "define":
            conn.execute("SELECT jobs.define('new', 'k', schedule => '* * * * *')")
        else:
            conn.execute(
                'SELECT * FROM jobs.define_many(\'[{"name": "new", "kind": "k", "schedule": "* * * * *"}]\')'
            )
        row = conn.execute("SELECT id, created_at FROM jobs.definitions WHERE name = 'new'").fetchone()
        assert row is not None
        definition_id, created = int(row[0]), row[1]
        minute = created.replace(second=0, microsecond=0) + timedelta(minutes=1)
        scheduler = Scheduler(db.dsn, owner="t", clock=Clock(minute + timedelta(seconds=5)), lookahead=30)
        try:
            scheduler.materialize_due()
            scheduler.materialize_due()
        finally:
            scheduler.close()
        times = run_times(conn, definition_id)
    assert times[:1] == [minute], f"{how}: created {created}, first tick at {minute} + 5 s, runs {times}"


@pytest.mark.parametrize("policy", ["skip", "coalesce"])
def test_a_definition_created_between_two_ticks_runs_each_occurrence_in_between(
    db: Database, policy: str
) -> None:
    """A scheduler that ticks every 10 s leads on; an every-3-seconds definition created just
    after a tick has three or four occurrences before the next one. They are late only by the
    tick, not missed in a downtime: each runs, whatever the misfire policy, and no catch-up is
    recorded (one past its period's grace was skipped or coalesced, with a "downtime")."""
    with db.connect() as conn:
        now_row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert now_row is not None
        clock = Clock(now_row[0])
        scheduler = Scheduler(db.dsn, owner="t", clock=clock, tick_interval=10, lookahead=0)
        try:
            scheduler.materialize_due()  # the tick before the definition exists
            row = conn.execute(
                "SELECT id, created_at FROM jobs.define('new', 'k', schedule => 'FREQ=SECONDLY;INTERVAL=3',"
                " misfire_policy => %s)",
                (policy,),
            ).fetchone()
            assert row is not None
            definition_id, created = int(row[0]), row[1]
            clock.now = created + timedelta(seconds=10)  # the next tick
            scheduler.materialize_due()
        finally:
            scheduler.close()
        times = run_times(conn, definition_id)
        catch_ups = conn.execute(
            "SELECT count(*) FROM jobs.catch_ups WHERE definition_id = %s", (definition_id,)
        ).fetchone()
    floor = created.replace(microsecond=0) - timedelta(seconds=created.second % 3)
    every = [floor + timedelta(seconds=3 * n) for n in range(6)]
    assert times == [t for t in every if created <= t <= clock.now], f"created {created}, tick at {clock.now}"
    assert catch_ups == (0,)


def test_exhausted_count_finishes_cleanly(db: Database) -> None:
    clock = Clock(utc(2026, 1, 1, 0, 0, 0))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock)
    with db.connect() as conn:
        definition_id = define(conn, "thrice", "DTSTART:20260101T000010Z\nRRULE:FREQ=SECONDLY;COUNT=3")
        for second in range(0, 30, 2):
            clock.now = utc(2026, 1, 1, 0, 0, second)
            scheduler.materialize_due()
        times = run_times(conn, definition_id)
        row = conn.execute(
            "SELECT finished, next_run_at FROM jobs.definition_health WHERE id = %s", (definition_id,)
        ).fetchone()
    assert times == [utc(2026, 1, 1, 0, 0, 10), utc(2026, 1, 1, 0, 0, 11), utc(2026, 1, 1, 0, 0, 12)]
    assert row == (True, None)
    scheduler.close()


def test_broken_schedule_never_crashes_the_tick(db: Database) -> None:
    with db.connect() as conn:
        # Only the driver's parse finds this wrong (30 February never comes): SQL takes it.
        conn.execute("SELECT jobs.define('broken', 'k', 'FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30')")
        conn.execute("SELECT jobs.define('fine', 'k', 'FREQ=SECONDLY')")
    scheduler = Scheduler(db.dsn, owner="t")
    report = scheduler.tick()
    assert report.schedule_errors == 1
    time.sleep(1.1)
    report = scheduler.tick()
    assert report.runs_created >= 1 and report.schedule_errors == 0
    with db.connect() as conn:
        err = conn.execute("SELECT schedule_error FROM jobs.definitions WHERE name = 'broken'").fetchone()
        assert err is not None and "no occurrences" in err[0] and "broken" in err[0]
        # Redefining it clears the error and it gets a cursor.
        conn.execute("SELECT jobs.define('broken', 'k', 'FREQ=DAILY;BYHOUR=23')")
    report = scheduler.tick()
    assert report.initialized == 1
    scheduler.close()


@pytest.mark.timeout(120)  # the walk to the year 9999 it once made took hours: a hang, not a speed
@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ("FREQ=MINUTELY;BYSETPOS=2", "BYSETPOS"),
        # Steps of 7 minutes from a Monday 05:30 fall on the same minute of every week.
        (
            "DTSTART:20270111T053000\nRRULE:FREQ=MINUTELY;INTERVAL=7;BYDAY=SU;BYHOUR=5;BYMINUTE=30",
            "never land",
        ),
    ],
)
def test_a_rule_no_period_can_satisfy_is_recorded_within_one_tick(db: Database, rule: str, why: str) -> None:
    """BYSETPOS=2 of a rule whose minutes hold one occurrence never picks any, and steps that
    never reach an allowed day and time never make one: from psql such a rule is taken, and the
    leader's tick records it at once while the other definition gets its cursor, instead of
    looking for an occurrence until the year 9999 (minutes or hours in which no other
    definition's runs are made)."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('never', 'k', %s)", (rule,))
        conn.execute("SELECT jobs.define('fine', 'k', '* * * * *')")
    scheduler = Scheduler(db.dsn, owner="t")
    try:
        report = scheduler.materialize_due()
    finally:
        scheduler.close()
    assert report.schedule_errors == 1 and report.initialized == 1, report
    with db.connect() as conn:
        found = conn.execute("SELECT name, coalesce(schedule_error, '') FROM jobs.definitions").fetchall()
    rows = dict(found)
    assert why in rows["never"] and rows["fine"] == "", rows


# -- define ---------------------------------------------------------------------------


def test_changing_the_schedule_resets_cursor_and_drops_future_runs(db: Database) -> None:
    clock = Clock(utc(2027, 6, 1, 12, 0, 0))  # ahead of the database clock
    scheduler = Scheduler(db.dsn, owner="t", clock=clock, lookahead=3600)
    with db.connect() as conn:
        definition_id = define(conn, "d", "*/10 * * * *")

        def queued_after_a_tick() -> int:
            # The clock is months ahead: the leader catches up first, within a time budget
            # per tick, so a busy machine takes more ticks before the lookahead's runs.
            scheduler.materialize_due()
            row = conn.execute(
                "SELECT count(*) FROM jobs.runs WHERE definition_id = %s AND status = 'QUEUED'",
                (definition_id,),
            ).fetchone()
            return int(row[0]) if row else 0

        wait_for("an hour of lookahead's runs", lambda: queued_after_a_tick() >= 5, 120)
        before = revision_of(conn, definition_id)
        define(conn, "d", "*/15 * * * *")
        row = conn.execute(
            "SELECT revision, next_run_at FROM jobs.definitions WHERE id = %s", (definition_id,)
        ).fetchone()
        assert row == (before + 1, None)
        states = conn.execute(
            "SELECT status::text, count(*) FROM jobs.runs WHERE definition_id = %s"
            " AND scheduled_for > now() GROUP BY 1",
            (definition_id,),
        ).fetchall()
        assert dict(states) == {}, states  # never started: deleted, the new cursor re-creates
        # Same schedule again: nothing resets.
        define(conn, "d", "*/15 * * * *", priority=5)
        assert revision_of(conn, definition_id) == row[0]
    scheduler.close()


def test_stale_materialize_changes_nothing(conn: psycopg.Connection[Any]) -> None:
    definition_id = define(conn, "cas", "* * * * *")
    t0 = utc(2030, 1, 1, 0, 0)
    assert conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (definition_id, t0)).fetchone() == (0,)
    assert cursor_of(conn, definition_id) == t0
    # A stale expected cursor: nothing inserted, cursor unchanged.
    stale = conn.execute(
        "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
        (definition_id, t0 - timedelta(minutes=1), t0 - timedelta(minutes=1), t0 + timedelta(minutes=1)),
    ).fetchone()
    assert stale == (0,)
    assert cursor_of(conn, definition_id) == t0
    assert run_times(conn, definition_id) == []
    # Run times outside [expected, new) are refused with 22023, nothing applied.
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="run_times"):
        conn.execute(
            "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
            (definition_id, t0, t0 + timedelta(minutes=5), t0 + timedelta(minutes=1)),
        )
    assert cursor_of(conn, definition_id) == t0


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"schedule": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"schedule": "* * * * *", "run_at": "2030-01-01"}, "exactly one"),
        ({}, "exactly one"),
        ({"schedule": "every day at noon"}, "schedule"),
        ({"schedule": "* * * * *", "max_concurrent_runs": 0}, "max_concurrent_runs"),
        ({"schedule": "* * * * *", "priority": 5000}, "priority"),
        ({"schedule": "* * * * *", "misfire_policy": "later"}, "misfire_policy"),
        ({"schedule": "* * * * *", "overlap_policy": "maybe"}, "overlap_policy"),
        ({"schedule": "* * * * *", "payload": "[1]"}, "payload"),
        ({"run_at": "infinity"}, "run_at"),
        ({"schedule": "* * * * *", "timeout": "-5 minutes"}, "timeout"),
    ],
)
def test_define_rejects_bad_input(
    conn: psycopg.Connection[Any], kwargs: dict[str, Any], fragment: str
) -> None:
    args = ", ".join(f"{k} => %({k})s" for k in kwargs)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        conn.execute(f"SELECT jobs.define('bad', 'k'{', ' if kwargs else ''}{args})", kwargs)
    assert fragment in str(info.value)
    assert conn.execute("SELECT count(*) FROM jobs.definitions").fetchone() == (0,)


def test_pause_and_resume(db: Database) -> None:
    clock = Clock(utc(2026, 6, 1, 12, 0, 30))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock)
    with db.connect() as conn:
        definition_id = define(conn, "p", "* * * * *")
        scheduler.materialize_due()
        conn.execute("SELECT jobs.pause('p')")
        clock.now = utc(2026, 6, 1, 12, 10, 30)
        scheduler.materialize_due()
        assert run_times(conn, definition_id) == []
        paused = conn.execute("SELECT paused FROM jobs.definition_health WHERE id = %s", (definition_id,))
        assert paused.fetchone() == (True,)
        conn.execute("SELECT jobs.resume('p')")
        scheduler.materialize_due()
        # Resumed from the next occurrence after now: the paused window is not caught up.
        assert run_times(conn, definition_id) == []
        assert cursor_of(conn, definition_id) == utc(2026, 6, 1, 12, 11)
        with pytest.raises(psycopg.errors.NoDataFound):
            conn.execute("SELECT jobs.pause('nope')")
    scheduler.close()


@pytest.mark.parametrize("how", ["resume", "define", "define_many"])
def test_enabling_again_keeps_the_runs_made_before_the_pause_and_what_waits_on_them(
    conn: psycopg.Connection[Any], how: str
) -> None:
    """Enabled again by jobs.define or jobs.define_many, a definition resumes as jobs.resume
    resumes it: its occurrences are the same, so the run made ahead for tomorrow stays, and
    a run that depends on it still waits."""
    definition_id = define(conn, "nightly", "0 3 * * *")
    tomorrow = scalar(conn, "SELECT date_trunc('day', now()) + interval '1 day 3 hours'")
    conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (definition_id, tomorrow))
    conn.execute(
        "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
        (definition_id, tomorrow, tomorrow, tomorrow + timedelta(days=1)),
    )
    scheduled = scalar(conn, "SELECT id FROM jobs.runs WHERE definition_id = %s", (definition_id,))
    conn.execute("SELECT jobs.enqueue('after', depends_on => ARRAY[%s]::bigint[])", (scheduled,))
    conn.execute("SELECT jobs.pause('nightly')")
    if how == "resume":
        conn.execute("SELECT jobs.resume('nightly')")
    elif how == "define":
        define(conn, "nightly", "0 3 * * *", enabled=True)
    else:
        conn.execute(
            "SELECT * FROM jobs.define_many(%s::jsonb)",
            ('[{"name": "nightly", "kind": "k", "schedule": "0 3 * * *", "enabled": true}]',),
        )
    runs = conn.execute("SELECT id, kind, status::text FROM jobs.runs ORDER BY id").fetchall()
    assert [(r[1], r[2]) for r in runs] == [("k", "QUEUED"), ("after", "QUEUED")], f"{how}: {runs}"
    assert runs[0][0] == scheduled, f"{how}: the run for {tomorrow} was made again"


def test_one_shot_runs_once_even_with_concurrent_leaders(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('once', 'k', run_at => now() - interval '1 second')")
    results = run_in_processes(materialize_loop, [(db.dsn, 1.0), (db.dsn, 1.0)])
    assert sum(r[0] for r in results) == 0  # one-shots are counted apart from recurring runs
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT r.status::text, d.finished_at IS NOT NULL FROM jobs.runs r"
            " JOIN jobs.definitions d ON d.id = r.definition_id WHERE d.name = 'once'"
        ).fetchall()
    assert rows == [("QUEUED", True)]


def test_a_one_shot_moved_back_to_a_time_whose_run_is_in_history_runs_no_second_time(
    conn: psycopg.Connection[Any],
) -> None:
    """Its run at that time has finished and moved to history: as when it is still in
    jobs.runs, the occurrence has its run, and jobs.runs_all keeps one per occurrence."""
    conn.execute("UPDATE jobs.config SET archive_after = '1 hour'")
    at = scalar(conn, "SELECT date_trunc('second', now()) - interval '3 hours'")
    conn.execute("SELECT jobs.define('once', 'k', run_at => %s)", (at,))
    assert scalar(conn, "SELECT jobs.materialize_one_shots()") == 1
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', attempt = 1, worker = 'w',"
        " started_at = now() - interval '170 minutes', finished_at = now() - interval '2 hours'"
    )
    assert scalar(conn, "SELECT jobs.archive()") == 1
    conn.execute("SELECT jobs.define('once', 'k', run_at => now() + interval '1 hour')")
    conn.execute("SELECT jobs.define('once', 'k', run_at => %s)", (at,))
    conn.execute("SELECT jobs.materialize_one_shots()")
    runs = conn.execute(
        "SELECT occurrence_at, status::text FROM jobs.runs_all WHERE origin = 'schedule' ORDER BY id"
    ).fetchall()
    assert runs == [(at, "COMPLETED")], f"moved away from {at} and back, got {runs}"


def test_one_shot_missed_with_skip_policy_is_recorded_as_skipped(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "SELECT jobs.define('late', 'k', run_at => now() - interval '1 hour', misfire_policy => 'skip')"
    )
    assert conn.execute("SELECT jobs.materialize_one_shots()").fetchone() == (1,)
    row = conn.execute("SELECT status::text, failure_reason FROM jobs.runs").fetchone()
    assert row == ("CANCELLED", "Skipped")
    assert conn.execute("SELECT jobs.materialize_one_shots()").fetchone() == (0,)


def test_leader_tick_prunes_with_the_configured_retention(db: Database, conn: Conn) -> None:
    """The scheduler's tick calls jobs.prune (in batches, until a short one) while it leads."""
    conn.execute("UPDATE jobs.config SET retention = '1 day'")
    finish_old(conn, 30, age="2 days")
    kept = finish_old(conn, 2, age="1 hour")
    scheduler = Scheduler(db.dsn, owner="pruner", prune_every=0)
    try:
        assert scheduler.prune(batch=7) == 30, "five batches of at most 7"
        finish_old(conn, 4, age="3 days")
        report = scheduler.tick()
        assert report.leading and report.pruned == 4
    finally:
        scheduler.close()
    assert sorted(r[0] for r in conn.execute("SELECT id FROM jobs.runs")) == kept


def test_leader_tick_moves_old_finished_runs_to_history(db: Database, conn: Conn) -> None:
    """The tick calls jobs.archive (in batches, until a short one) on its own cadence, and
    prune then drops the days of history past the retention."""
    moved = finish_old(conn, 12, age="2 days")
    kept = finish_old(conn, 2, age="1 hour")
    scheduler = Scheduler(db.dsn, owner="archiver", archive_every=0, prune_every=3600)
    try:
        assert scheduler.archive(batch=5) == 12, "three batches of at most 5"
        later = finish_old(conn, 3, age="3 days")
        report = scheduler.tick()
        assert report.leading and report.archived == 3
    finally:
        scheduler.close()
    history = sorted(r[0] for r in conn.execute("SELECT id FROM jobs.run_history"))
    assert history == sorted(moved + later)
    assert sorted(r[0] for r in conn.execute("SELECT id FROM jobs.runs")) == kept


# -- one definition never stops the others -----------------------------------------


@pytest.mark.parametrize("cause", ["trigger", "constraint"])
def test_a_poisoned_definition_never_stops_the_others_nor_costs_the_lead(
    db: Database, cause: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Forty every-second definitions; the database refuses the runs of one of them. For
    several seconds of real ticks the 39 others get every occurrence, the leader keeps its
    session (same backend, still leading), and the poisoned one is logged by name and
    shown in jobs.definition_health."""
    with db.connect() as conn:
        ids = [define(conn, f"every-second-{i:02}", "FREQ=SECONDLY") for i in range(40)]
        poisoned = ids[7]
        if cause == "trigger":
            refuse_runs_of(conn, poisoned, "quota", "no more runs for this definition")
        else:
            conn.execute(
                f"ALTER TABLE jobs.runs ADD CONSTRAINT operator_rule CHECK (definition_id <> {poisoned})"
            )
    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.2)
    pids = set()
    caplog.set_level("ERROR", logger="pgtick.scheduler")
    try:

        def retried() -> bool:
            with db.connect() as conn:
                row = conn.execute(
                    "SELECT materialize_failures FROM jobs.definitions WHERE id = %s", (poisoned,)
                ).fetchone()
            return bool(row and row[0] and row[0] >= 2)

        # At least 6 s of real ticks, and on until the poisoned one was retried once more
        # (its backoff starts at 1 s; a loaded machine ticks late).
        started = time.monotonic()
        while time.monotonic() < started + 6 or not retried():
            assert time.monotonic() < started + 120, "the poisoned definition was never retried"
            report = scheduler.tick()
            assert report.leading, "the leader lost its lead"
            assert scheduler._pid is not None
            pids.add(scheduler._pid)
            time.sleep(0.2)
    finally:
        scheduler.close()
    assert len(pids) == 1, f"the leader session was replaced: {pids}"
    with db.connect() as conn:
        for definition_id in ids:
            times = run_times(conn, definition_id)
            if definition_id == poisoned:
                assert times == []
                continue
            assert len(times) >= 5, f"definition {definition_id} got only {times}"
            gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=1)]
            assert gaps == [], (
                f"definition {definition_id} lost occurrences beside the poisoned one: {gaps[:3]}"
            )
        health = conn.execute(
            "SELECT name, materialize_error, materialize_failures FROM jobs.definition_health"
            " WHERE materialize_error IS NOT NULL"
        ).fetchall()
    assert [h[0] for h in health] == ["every-second-07"], health
    assert health[0][2] >= 2, "the poisoned definition must be retried (with backoff)"
    logged = [r.getMessage() for r in caplog.records if "every-second-07" in r.getMessage()]
    assert logged and ("quota" in logged[0] or "operator_rule" in logged[0]), logged


def test_a_refused_catch_up_is_recorded_and_backed_off(db: Database) -> None:
    """A definition back from downtime whose runs the database refuses is recorded and backed
    off like one on time (a late tick on a busy machine is such a catch-up): it must not be
    retried on every tick with nothing in jobs.definition_health."""
    clock = Clock(utc(2026, 5, 4, 10, 59, 30))
    scheduler = Scheduler(db.dsn, owner="t", tick_interval=1.0, misfire_grace=60, clock=clock)
    with db.connect() as conn:
        definition_id = define(conn, "hourly", "0 * * * *")
        scheduler.materialize_due()  # cursor initialized: 11:00
        conn.execute(
            f"ALTER TABLE jobs.runs ADD CONSTRAINT operator_rule CHECK (definition_id <> {definition_id})"
        )
        clock.now = utc(2026, 5, 4, 13, 59, 30)  # down for three hours: a catch-up
        for _ in range(3):
            report = scheduler.materialize_due()
            assert report.materialize_errors <= 1, report
        row = conn.execute(
            "SELECT materialize_failures, materialize_retry_at IS NOT NULL, materialize_error"
            " FROM jobs.definitions WHERE id = %s",
            (definition_id,),
        ).fetchone()
    scheduler.close()
    assert row is not None
    failures, backing_off, error = row
    assert (failures, backing_off) == (1, True), (
        f"refused catch-up: failures={failures}, backing off={backing_off}, error={error!r}"
    )
    assert "operator_rule" in error, error


def test_the_horizon_grows_with_the_burst_at_one_instant_across_batches() -> None:
    """100,000 definitions due at one minute arrive over many batches and ticks: the horizon
    counts them together and grows to cover materializing them all; a fixed one never moves."""
    from pgtick.scheduler import Horizon

    base = timedelta(seconds=2)
    adaptive = Horizon(base, tick_interval=1.0, per_tick=20_000, maximum=timedelta(minutes=2), fixed=False)
    fixed = Horizon(base, tick_interval=1.0, per_tick=20_000, maximum=timedelta(minutes=2), fixed=True)
    minute = utc(2030, 1, 1, 0, 1)
    assert adaptive.lookahead == base
    for _ in range(100):  # 100 batches of 1,000 cursors moved to the same minute
        adaptive.observe_batch(1000, 0.05)
        adaptive.observe_cursors([minute] * 1000)
        fixed.observe_cursors([minute] * 1000)
    assert adaptive.burst == 100_000
    # 100,000 x 50 us = 5 s of work over 5 ticks of 20,000: at least 3 x 10 s ahead.
    assert adaptive.lookahead >= timedelta(seconds=30), adaptive.lookahead
    assert adaptive.lookahead <= timedelta(minutes=2)
    assert fixed.lookahead == base


# -- honest catch-up after downtime ----------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "runs", "sentence", "stale_status", "stale_error"),
    [
        (
            "coalesce",
            1,
            "15 occurrences coalesced into 1",
            "CANCELLED",
            "skipped: superseded by coalescing (a later occurrence runs instead)",
        ),
        ("catch_up", 14, "14 occurrences run late (14 runs)", "COMPLETED", None),
        (
            "skip",
            1,
            "15 occurrences: 14 skipped, 1 run (past the misfire grace)",
            "CANCELLED",
            "skipped: past the misfire grace (misfire_policy skip)",
        ),
    ],
)
def test_every_10s_job_after_150s_of_downtime_keeps_its_misfire_promise(
    db: Database, policy: str, runs: int, sentence: str, stale_status: str, stale_error: str | None
) -> None:
    """The scheduler (and every worker) stops for 150 s over an every-10-seconds job (cap 1,
    overlap skip), leaving one run it had materialized ahead unstarted, and comes back. The
    misfire grace shrinks to one period, so coalesce makes exactly one run for all late
    occurrences and supersedes the stale one (not one run per occurrence of the last minute,
    which the cap then recorded as skipped "at max_concurrent_runs" although nothing ran);
    every skipped occurrence says why, and health says what happened."""
    # The clock stays near the database's, so the runs are really due and claimable.
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=170)
    base -= timedelta(seconds=base.second % 10)  # hh:mm:x0, an occurrence
    clock = Clock(base - timedelta(seconds=1))
    scheduler = Scheduler(db.dsn, owner="t", misfire_grace=60, clock=clock)
    with db.connect() as conn:
        # Anchored an hour back: without DTSTART a rule starts at midnight of its creation day,
        # which a run in the first minutes after midnight UTC would put after base.
        anchor = base - timedelta(hours=1)
        definition_id = define(
            conn,
            "every-10s",
            f"DTSTART:{anchor:%Y%m%dT%H%M%SZ}\nRRULE:FREQ=SECONDLY;INTERVAL=10",
            misfire_policy=policy,
            overlap_policy="skip",
            max_concurrent_runs=1,
        )
        scheduler.materialize_due()  # cursor: base
        scheduler.materialize_due()  # base is within the lookahead: materialized, never started
        assert run_times(conn, definition_id) == [base]
        stale = one(conn, "SELECT id FROM jobs.runs WHERE definition_id = %s", (definition_id,))["id"]
        clock.now = base + timedelta(seconds=147)  # everything was down meanwhile
        scheduler.materialize_due()
        late = [base + timedelta(seconds=10 * k) for k in range(1, 15)]  # +10s .. +140s
        expected = {"coalesce": [base, late[-1]], "catch_up": [base, *late], "skip": [base, late[-1]]}[policy]
        assert run_times(conn, definition_id) == expected
        scheduler.materialize_due()  # a second tick at the same moment adds nothing
        assert run_times(conn, definition_id) == expected

        catch_ups = conn.execute(
            "SELECT last_late, occurrences, runs FROM jobs.catch_ups WHERE definition_id = %s",
            (definition_id,),
        ).fetchall()
        assert catch_ups == [(late[-1], 15 if policy != "catch_up" else 14, runs)], catch_ups
        health = conn.execute(
            "SELECT last_catch_up FROM jobs.definition_health WHERE id = %s", (definition_id,)
        ).fetchone()
        assert health is not None
        # The downtime counts up to the database's now() (later on a loaded machine).
        pattern = rf"caught up after [0-9]+m([0-9]{{2}}s)? of downtime: {re.escape(sentence)}"
        assert re.fullmatch(pattern, health[0]), health

        # Work every due run off with one cap-1 claimer: nothing is skipped "at max_concurrent_runs".
        while claimed := conn.execute("SELECT id FROM jobs.claim(1, 'w')").fetchall():
            conn.execute("SELECT jobs.complete(%s, 'w')", (claimed[0][0],))
        outcomes = conn.execute(
            "SELECT id, status::text, error FROM jobs.runs WHERE definition_id = %s ORDER BY id",
            (definition_id,),
        ).fetchall()
        assert (stale, stale_status, stale_error) in outcomes, outcomes
        assert [o for o in outcomes if o[0] != stale and o[1] != "COMPLETED"] == [], outcomes
        assert len([o for o in outcomes if o[1] == "COMPLETED"]) == runs + (policy == "catch_up"), outcomes
    scheduler.close()


@pytest.mark.parametrize("policy", ["coalesce", "skip"])
def test_a_backfilled_window_still_waiting_runs_after_a_scheduler_restart(db: Database, policy: str) -> None:
    """An operator backfills the last half hour of an every-minute job; its runs wait for a
    worker (a cap of 1 drains them one by one) when the scheduler restarts after three
    minutes down. The catch-up coalesces or skips the occurrences of the downtime only: every
    backfilled occurrence still runs, and the catch-up counts only the late ones."""
    # Which definitions are due is read on the database's clock: started in a minute's last
    # seconds, its lookahead (2 s) reaches the next occurrence before the test's own steps
    # are done, and started on the minute, that minute's occurrence is the new definition's
    # first. Start a few seconds into a minute (the steps take well under 20 s, even loaded).
    wait_for(
        "the early part of a minute",
        lambda: 5 <= datetime.now(UTC).second < 40 or None,
        timeout=60,
        interval=0.2,
    )
    now = datetime.now(UTC).replace(microsecond=0)
    clock = Clock(now)
    scheduler = Scheduler(db.dsn, owner="t", misfire_grace=60, lookahead=2, clock=clock)
    with db.connect() as conn:
        definition_id = define(conn, "minutely", "* * * * *", misfire_policy=policy, max_concurrent_runs=1)
        scheduler.materialize_due()  # cursor: the next minute
        first_late = cursor_of(conn, definition_id)
        assert first_late is not None
        start = now.replace(second=0) - timedelta(minutes=30)
        conn.execute("SELECT jobs.backfill('minutely', %s, %s)", (start, start + timedelta(minutes=9)))
        scheduler.materialize_due()  # the backfill's ten runs, due at once
        backfilled = [start + timedelta(minutes=m) for m in range(10)]
        assert run_times(conn, definition_id) == backfilled

        clock.now = first_late + timedelta(minutes=3, seconds=30)  # down for three minutes
        scheduler.materialize_due()
        states = conn.execute(
            "SELECT scheduled_for, status::text FROM jobs.runs WHERE definition_id = %s"
            " AND scheduled_for < %s ORDER BY 1",
            (definition_id, first_late),
        ).fetchall()
        assert states == [(t, "QUEUED") for t in backfilled], states
        caught = conn.execute(
            "SELECT first_late, occurrences, superseded FROM jobs.catch_ups WHERE definition_id = %s",
            (definition_id,),
        ).fetchall()
        assert caught == [(first_late, 4, 0)], caught
    scheduler.close()


def test_a_zone_the_server_reads_otherwise_than_the_driver_is_warned_about_once(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs follow the driver's time zone database; SQL's local times (next_run_local, the
    dashboard) follow the server's. When the two read a zone differently (one of them
    predates a change of its rules), the leader says so once per zone, naming the zone and
    the first instant they disagree on; zones they agree on are not mentioned."""
    from pgtick.schedule.zones import load_zone

    # The driver's database, as if Sofia had given up DST at +03:00 (Istanbul's rules).
    istanbul = {"Europe/Sofia": "Europe/Istanbul"}

    def drivers_reading(name: str) -> Any:
        return load_zone(istanbul.get(name, name))

    monkeypatch.setattr("pgtick.scheduler.load_zone", drivers_reading)
    clock = Clock(utc(2027, 1, 10, 12))
    scheduler = Scheduler(db.dsn, owner="t", clock=clock)
    with db.connect() as conn:
        define(conn, "sofia-a", "0 9 * * *", timezone="Europe/Sofia")
        define(conn, "sofia-b", "0 10 * * *", timezone="Europe/Sofia")
        define(conn, "tokyo", "0 9 * * *", timezone="Asia/Tokyo")
    with caplog.at_level("WARNING", logger="pgtick.scheduler"):
        scheduler.materialize_due()
        scheduler.materialize_due()
    scheduler.close()
    warned = [r.getMessage() for r in caplog.records if "time zone database" in r.getMessage()]
    assert warned == [
        "time zone Europe/Sofia: the server's time zone database reads 2027-01-10 12:00Z as "
        "2027-01-10 14:00 local, the driver's as 2027-01-10 15:00: runs follow the driver's, while "
        "jobs.definition_health.next_run_local and the dashboard show the server's; bring the older "
        "one up to date (PostgreSQL's, or the system's tz database or the tzdata package)"
    ], warned


def test_the_reap_line_names_the_kind_and_the_worker_the_run_was_taken_from(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader's line for a reaped run says which kind it was and which worker went silent,
    so an operator reading the log knows which host to look at without querying jobs.runs."""
    with db.connect() as conn:
        run_id = enqueue(conn, "thumbnail")
        assert claim(conn, worker="web-7-4242-dead") == [run_id]
        conn.execute(
            "UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour', heartbeat_timeout = '1 second'"
            " WHERE id = %s",
            (run_id,),
        )
    scheduler = Scheduler(db.dsn, owner="t")
    with caplog.at_level("WARNING", logger="pgtick.scheduler"):
        report = scheduler.tick()
    scheduler.close()
    assert [r["run_id"] for r in report.reaped] == [run_id], report
    lines = [r.getMessage() for r in caplog.records if "reaped" in r.getMessage()]
    assert lines == [f"run={run_id} kind=thumbnail worker=web-7-4242-dead reaped reason=HeartbeatLost"], lines


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_the_reap_warning_names_a_retry_only_when_one_was_queued(
    db: Database, caplog: pytest.LogCaptureFixture, max_attempts: int
) -> None:
    """A run whose worker went silent is reaped with a warning; it says which run retries it,
    and says nothing of a retry when none was queued (no Python None in a log line)."""
    with db.connect() as conn:
        run_id = enqueue(conn, "k", max_attempts=str(max_attempts))
        assert claim(conn, "gone-worker", kinds=["k"]) == [run_id]
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (run_id,))
    scheduler = Scheduler(db.dsn, owner="reaper", tick_interval=0.2)
    try:
        with caplog.at_level("WARNING", logger="pgtick.scheduler"):
            assert scheduler.tick().leading
    finally:
        scheduler.close()
    with db.connect() as conn:
        retry = scalar(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", (run_id,))
    reaped = [r.getMessage() for r in caplog.records if "reaped" in r.getMessage()]
    reaped_from = f"run={run_id} kind=k worker=gone-worker reaped reason=HeartbeatLost"
    expected = reaped_from + ("" if retry is None else f" retry={retry}")
    assert (retry is None) == (max_attempts == 1), retry
    assert reaped == [expected], reaped
