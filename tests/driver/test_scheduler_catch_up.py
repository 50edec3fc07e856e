"""The scheduler after long downtime: catch-up is bounded per tick, the leader's session
never idles long enough to be ended while it computes, reaping and the on-time
definitions go on meanwhile, and the caught-up definition ends exactly as its misfire
policy says. COUNT rules far into their life cost the same per tick as young ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from harness import Clock, Database, claim, define, enqueue, finish_old, one, refuse_runs_of, scalar
from pgtick.schedule.rrule import Walked
from pgtick.scheduler import Scheduler, TickReport


def scheduled(conn: psycopg.Connection[Any], definition_id: int, where: str, at: datetime) -> list[datetime]:
    """The scheduled times of the definition's runs with scheduled_for `where` (an operator) `at`."""
    rows = conn.execute(
        f"SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s AND scheduled_for {where} %s"
        " ORDER BY 1",
        (definition_id, at),
    ).fetchall()
    return [r[0] for r in rows]


@contextmanager
def idle_sessions_ended(db: Database, after: float) -> Iterator[list[int]]:
    """What a pooler's (or idle_session_timeout's) limit does to the leader: its session is
    terminated once idle for `after` seconds. Yields the pids ended so far."""
    ended: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        with db.connect() as conn:
            while not stop.wait(0.1):
                rows = conn.execute(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database()"
                    " AND application_name LIKE 'pgtick-leader%%' AND state = 'idle'"
                    " AND state_change < clock_timestamp() - make_interval(secs => %s)",
                    (after,),
                ).fetchall()
                ended.extend(int(r[0]) for r in rows)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield ended
    finally:
        stop.set()
        thread.join(10)


def tick_like_run(scheduler: Scheduler) -> TickReport | None:
    """One iteration of Scheduler.run: a failed tick is logged there, and a session that
    did not survive it is dropped (the next tick reconnects)."""
    try:
        return scheduler.tick()
    except Exception:
        if not scheduler._session_healthy():
            scheduler._drop_connection()
        return None


@pytest.mark.parametrize("policy", ["coalesce", "skip"])
def test_days_of_missed_per_second_occurrences_never_stall_the_leader(db: Database, policy: str) -> None:
    """An every-second definition whose scheduler was down for four days (345,600 missed
    occurrences) while the leader's session is ended after 3 s idle (a pooler's limit).
    Within three ticks the other definitions are materialized and an expired run is reaped;
    the catch-up advances over the following ticks and ends as one unbounded walk would:
    one record of every late occurrence, and the runs the policy makes of them."""
    down = timedelta(days=4)
    with db.connect() as conn:
        late_id = define(conn, "down-for-days", "FREQ=SECONDLY", misfire_policy=policy)
        others = [define(conn, f"on-time-{i}", "FREQ=SECONDLY") for i in range(5)]
        start = scalar(conn, "SELECT date_trunc('second', now()) - %s", (down,))
        conn.execute(
            "UPDATE jobs.definitions SET next_run_at = %s, created_at = %s WHERE id = %s",
            (start, start - timedelta(days=1), late_id),
        )
        lost = enqueue(conn, "lost")
        assert claim(conn, "gone-worker", kinds=["lost"]) == [lost]
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (lost,))

    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.5)
    with idle_sessions_ended(db, after=3.0) as ended, db.connect() as conn:

        def reaped() -> bool:
            return bool(
                scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (lost,)) != "RUNNING"
            )

        def others_materialized() -> bool:
            return all(
                scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (i,)) > 0
                for i in others
            )

        for _ in range(3):
            tick_like_run(scheduler)
            time.sleep(0.2)
        assert reaped(), f"the expired run was not reaped in three ticks (sessions ended: {ended})"
        assert others_materialized(), (
            f"on-time definitions got no runs in three ticks (sessions ended: {ended})"
        )

        deadline = time.monotonic() + 600
        while scalar(conn, "SELECT count(*) FROM jobs.catch_ups WHERE definition_id = %s", (late_id,)) == 0:
            cursor = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (late_id,))
            assert time.monotonic() < deadline, f"the catch-up never finished: cursor {cursor}, ended {ended}"
            report = tick_like_run(scheduler)
            assert report is not None and report.leading, f"a tick failed (sessions ended: {ended})"
            time.sleep(0.05)
        scheduler.close()
        assert ended == [], f"the leader's session sat idle for 3 s mid-tick: {ended}"

        record = one(
            conn,
            "SELECT first_late, last_late, occurrences, runs FROM jobs.catch_ups WHERE definition_id = %s",
            (late_id,),
        )
        assert record["first_late"] == start, record
        expected_occurrences = int((record["last_late"] - start).total_seconds()) + 1
        assert record["occurrences"] == expected_occurrences, (record, expected_occurrences)
        late_runs = scheduled(conn, late_id, "<=", record["last_late"])
        if policy == "coalesce":
            assert late_runs == [record["last_late"]], late_runs
        else:  # skip: only what was still within the grace (one period: 1 s) when it settled
            assert late_runs and late_runs[-1] == record["last_late"], late_runs
            assert late_runs[0] >= record["last_late"] - timedelta(seconds=1), late_runs
        assert record["runs"] == len(late_runs), (record, late_runs)
        after = scheduled(conn, late_id, ">", record["last_late"])
        cursor = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (late_id,))
        expected_after = [record["last_late"] + timedelta(seconds=k + 1) for k in range(len(after))]
        assert after == expected_after and cursor == record["last_late"] + timedelta(
            seconds=len(after) + 1
        ), (
            after,
            cursor,
        )


@pytest.mark.parametrize(
    ("rule", "seconds", "first_tick"),
    [
        # One occurrence per second: the occurrences behind it are counted by arithmetic, so
        # even the first tick after a start walks only what it materializes.
        ("FREQ=SECONDLY;COUNT=100000000", 1, 50),
        # Two a minute (a part of its own): walked once, on the first tick, then remembered.
        ("FREQ=SECONDLY;BYSECOND=0,30;COUNT=100000000", 30, None),
    ],
)
def test_a_count_rule_far_into_its_life_costs_the_same_per_tick(
    db: Database, rule: str, seconds: int, first_tick: int | None
) -> None:
    """A COUNT rule that started twenty days ago (up to 1.7 million occurrences behind it):
    each tick walks only the occurrences it materializes, not the rule again from its
    DTSTART."""
    now = datetime.now(UTC).replace(microsecond=0)
    clock = Clock(now)
    with db.connect() as conn:
        definition_id = define(conn, "counted", rule)
        conn.execute(
            "UPDATE jobs.definitions SET created_at = %s WHERE id = %s",
            (now - timedelta(days=20), definition_id),
        )
    scheduler = Scheduler(db.dsn, owner="t", clock=clock, lookahead=2)
    try:
        before = Walked.count
        scheduler.materialize_due()  # the cursor: first occurrence at or after now
        scheduler.materialize_due()
        first = Walked.count - before
        walked = []
        for _ in range(5):
            clock.now += timedelta(seconds=seconds)
            before = Walked.count
            report = scheduler.materialize_due()
            walked.append(Walked.count - before)
            assert report.runs_created == 1, report
    finally:
        scheduler.close()
    assert max(walked) <= 50, f"wall times expanded per tick: {walked} (the rule walked from its start again)"
    if first_tick is not None:
        assert first <= first_tick, f"the first ticks walked {first} wall times (the rule's past)"
    with db.connect() as conn:
        times = [
            r[0]
            for r in conn.execute(
                "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s ORDER BY 1", (definition_id,)
            ).fetchall()
        ]
    assert times == [times[0] + timedelta(seconds=seconds * k) for k in range(len(times))], times


def test_a_long_count_walk_keeps_the_leader_session_alive(db: Database) -> None:
    """A COUNT rule with parts of its own, four months into its life, is counted from its
    DTSTART on the leader's first tick: a walk of several seconds, longer than the
    operator's idle_session_timeout (2 s here). The session is pinged while it walks, so the
    tick is not ended mid-walk (and redone from the start on every tick after)."""
    with db.connect() as conn:
        conn.execute(f"ALTER DATABASE {db.name} SET idle_session_timeout = '2s'")
        definition_id = define(conn, "counted", "FREQ=SECONDLY;BYSECOND=0,30;COUNT=100000000")
        conn.execute(
            "UPDATE jobs.definitions SET created_at = now() - interval '120 days' WHERE id = %s",
            (definition_id,),
        )
    scheduler = Scheduler(db.dsn, owner="t", lookahead=60)
    try:
        before, began = Walked.count, time.monotonic()
        reports = [scheduler.materialize_due(), scheduler.materialize_due()]
        walked, seconds = Walked.count - before, time.monotonic() - began
    finally:
        scheduler.close()
    assert walked > 300_000, f"the rule's past was not walked ({walked} wall times): nothing to show"
    errors = [e for r in reports for e in r.phase_errors]
    assert errors == [], f"the tick failed during a {seconds:.1f} s walk: {errors}"
    with db.connect() as conn:
        created = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (definition_id,))
    assert created >= 1, f"no run materialized after a {seconds:.1f} s walk: {reports}"


def test_a_walk_longer_than_the_leader_lease_renews_it_and_materializes(db: Database) -> None:
    """Lease leadership: the same walk of several seconds under a 1 s lease. The lease is
    renewed while the rule is walked, so the one tick materializes the definition and keeps
    leading; a lease left to lapse mid-walk would stop the tick before its write and break
    the leading (the next tick's late occurrences would count as a downtime)."""
    with db.connect() as conn:
        definition_id = define(conn, "counted", "FREQ=SECONDLY;BYSECOND=0,30;COUNT=100000000")
        conn.execute(
            "UPDATE jobs.definitions SET created_at = now() - interval '120 days' WHERE id = %s",
            (definition_id,),
        )
    scheduler = Scheduler(db.dsn, owner="t", lookahead=60, leadership="lease", lease_ttl=1.0)
    try:
        before, began = Walked.count, time.monotonic()
        reports = [scheduler.tick()]
        walked, seconds = Walked.count - before, time.monotonic() - began
        leading = scheduler.leading
    finally:
        scheduler.close()
    assert walked > 300_000, f"the rule's past was not walked ({walked} wall times): nothing to show"
    assert all(r.leading for r in reports) and leading, reports
    with db.connect() as conn:
        created = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (definition_id,))
    assert created >= 1, f"no run materialized after a {seconds:.1f} s walk under a 1 s lease: {reports}"


# -- every phase of the tick goes on when another one fails ---------------------------------


def test_a_one_shot_the_database_refuses_never_stops_reaping(db: Database) -> None:
    """A one-shot whose run an operator's trigger rejects makes every one-shot
    materialization fail; the reaper, the recurring definitions and the other phases of
    the tick still run, on the same session, and the failure is reported by phase."""
    with db.connect() as conn:
        refused = int(scalar(conn, "SELECT id FROM jobs.define('refused-once', 'k', run_at => now())"))
        every_second = define(conn, "every-second", "FREQ=SECONDLY")
        refuse_runs_of(conn, refused, "audit", "this run is not allowed")
        lost = enqueue(conn, "lost")
        assert claim(conn, "gone-worker", kinds=["lost"]) == [lost]
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (lost,))
    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.5)
    try:
        first = scheduler.tick()
        pid = scheduler._pid
        time.sleep(1.2)
        second = scheduler.tick()
        assert scheduler._pid == pid and second.leading, "the leader lost its session over a refused insert"
    finally:
        scheduler.close()
    assert [r["run_id"] for r in first.reaped] == [lost], f"not reaped: {first}"
    assert any(e.startswith("one-shots:") and "audit" in e for e in first.phase_errors), first.phase_errors
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (every_second,)) > 0
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (refused,)) == 0


@pytest.mark.parametrize("cursor", [None, "0001-01-02 00:00:00+00"])
def test_a_definition_whose_schedule_cannot_be_computed_is_skipped_with_its_error(
    db: Database, cursor: str | None
) -> None:
    """A definition edited in psql to a creation time at the edge of the calendar: its anchor
    (local midnight of that day in New York) lies before the year 1, so reading its schedule
    raises an overflow, not a schedule error. Only that definition stops, with the reason in
    jobs.definition_health; the others are materialized on the same tick."""
    with db.connect() as conn:
        broken = define(conn, "edge-of-time", "FREQ=HOURLY", timezone="America/New_York")
        fine = [define(conn, f"fine-{i}", "FREQ=SECONDLY") for i in range(3)]
        conn.execute(
            "UPDATE jobs.definitions SET created_at = '0001-01-01 00:00:00+00', next_run_at = %s"
            " WHERE id = %s",
            (cursor, broken),
        )
    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.5)
    try:
        scheduler.tick()
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert report.phase_errors == [], report.phase_errors
    with db.connect() as conn:
        for definition_id in fine:
            n = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (definition_id,))
            assert n > 0, f"definition {definition_id} got no runs beside the broken one"
        error = scalar(conn, "SELECT schedule_error FROM jobs.definition_health WHERE id = %s", (broken,))
    assert error and "out of range" in error, error


def test_the_operators_shorter_idle_session_timeout_is_kept_and_the_leader_lives_with_it(
    db: Database,
) -> None:
    """The leader's role (here: its connection options) ends sessions idle for 4 s. The
    leader keeps that limit (it set 30 s over it before) and, with a definition a day behind
    to catch up on, never idles that long: one session through every tick."""
    with db.connect() as conn:
        late_id = define(conn, "a-day-behind", "FREQ=SECONDLY")
        start = scalar(conn, "SELECT date_trunc('second', now()) - interval '1 day'")
        conn.execute(
            "UPDATE jobs.definitions SET next_run_at = %s, created_at = %s WHERE id = %s",
            (start, start, late_id),
        )
    dsn = make_conninfo(db.dsn, options="-c idle_session_timeout=4000")
    scheduler = Scheduler(dsn, owner="leader", tick_interval=0.5)
    pids = set()
    try:
        with db.connect() as conn:
            deadline = time.monotonic() + 300
            while not scalar(
                conn, "SELECT count(*) FROM jobs.catch_ups WHERE definition_id = %s", (late_id,)
            ):
                assert time.monotonic() < deadline, "the catch-up never finished"
                report = scheduler.tick()
                assert report.leading, report
                pids.add(scheduler._pid)
                assert scheduler._conn is not None
                kept = scheduler._conn.execute("SHOW idle_session_timeout").fetchone()
                assert kept == {"idle_session_timeout": "4s"}, kept
                time.sleep(0.3)
    finally:
        scheduler.close()
    assert len(pids) == 1, f"the leader's session was ended: {pids}"


def test_a_catch_up_whose_runs_are_refused_is_recorded_and_backed_off(db: Database) -> None:
    """A definition back from downtime whose runs an operator's trigger rejects: like an
    on-time one, its error is recorded where operators look (jobs.definition_health) and it
    is retried with backoff, not tried again every tick unseen."""
    with db.connect() as conn:
        refused = define(conn, "refused-after-downtime", "FREQ=SECONDLY")
        fine = define(conn, "fine-after-downtime", "FREQ=SECONDLY")
        conn.execute(
            "UPDATE jobs.definitions SET next_run_at = date_trunc('second', now()) - interval '10 minutes'"
            " WHERE id = ANY(%s)",
            ([refused, fine],),
        )
        refuse_runs_of(conn, refused, "quota", "no more runs for this definition")
    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.5)
    try:
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert report.materialize_errors == 1, report
    with db.connect() as conn:
        health = one(
            conn,
            "SELECT h.materialize_error, h.materialize_failures, d.materialize_retry_at > now() AS back_off"
            " FROM jobs.definition_health AS h JOIN jobs.definitions AS d USING (id) WHERE id = %s",
            (refused,),
        )
        assert health["materialize_failures"] == 1 and "quota" in health["materialize_error"], health
        assert health["back_off"], health
        assert scalar(conn, "SELECT count(*) FROM jobs.catch_ups WHERE definition_id = %s", (fine,)) == 1


def test_a_backlog_of_finished_runs_is_pruned_over_several_ticks(db: Database) -> None:
    """Fifty prunable runs kept in jobs.runs (archive_after NULL: deleted row by row), batches
    of 10, two batches a tick: each tick prunes 20 and goes on materializing; the backlog is
    gone after three ticks, without waiting for prune_every."""
    with db.connect() as conn:
        conn.execute("UPDATE jobs.config SET retention = '1 day', archive_after = NULL")
        finish_old(conn, 50, age="2 days")
        every_second = define(conn, "every-second", "FREQ=SECONDLY")
    scheduler = Scheduler(db.dsn, owner="pruner", prune_every=3600, prune_batch=10, prune_batches_per_tick=2)
    pruned = []
    try:
        for _ in range(4):
            report = scheduler.tick()
            assert report.leading and report.phase_errors == [], report
            pruned.append(report.pruned)
    finally:
        scheduler.close()
    assert pruned == [20, 20, 10, 0], pruned
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE definition_id = %s", (every_second,)) > 0


@pytest.mark.parametrize("cursor", ["-infinity", "4713-01-01 00:00:00+00 BC"])
def test_a_cursor_python_cannot_hold_stops_only_its_definition(db: Database, cursor: str) -> None:
    """A cursor set in psql to a time Python cannot hold made every read of the due
    definitions fail, so no recurring definition got a run. Now only that definition stops,
    with its schedule error; the others go on being materialized."""
    with db.connect() as conn:
        broken = define(conn, "cursor-out-of-time", "FREQ=SECONDLY")
        define(conn, "fine", "FREQ=SECONDLY")
    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.5)
    try:
        scheduler.tick()
        with db.connect() as conn:
            conn.execute(
                "UPDATE jobs.definitions SET next_run_at = %s::timestamptz WHERE id = %s", (cursor, broken)
            )
        created = 0
        deadline = time.monotonic() + 60
        while created == 0:  # until the next occurrence of the others comes within the horizon
            assert time.monotonic() < deadline, "no run materialized beside the broken cursor"
            time.sleep(0.3)
            report = scheduler.tick()
            assert report.phase_errors == [], report.phase_errors
            created = report.runs_created
    finally:
        scheduler.close()
    with db.connect() as conn:
        error = scalar(conn, "SELECT schedule_error FROM jobs.definition_health WHERE id = %s", (broken,))
    assert error and "next_run_at" in error, error


def test_a_catch_up_over_several_ticks_logs_where_it_stands_after_each(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """An every-second definition down for two hours, walked 1,000 missed occurrences per
    tick: each tick that leaves it unfinished logs one line of how far it got, and the tick
    that settles it logs the catch-up as one sentence."""
    with db.connect() as conn:
        late_id = define(conn, "down-for-hours", "FREQ=SECONDLY")
        start = scalar(conn, "SELECT date_trunc('second', now()) - interval '2 hours'")
        conn.execute(
            "UPDATE jobs.definitions SET next_run_at = %s, created_at = %s WHERE id = %s",
            (start, start - timedelta(days=1), late_id),
        )
    scheduler = Scheduler(db.dsn, owner="leader", tick_interval=0.5, catch_up_budget=1000)
    caplog.set_level("INFO", logger="pgtick.scheduler")
    with db.connect() as conn:
        deadline = time.monotonic() + 600
        while scalar(conn, "SELECT count(*) FROM jobs.catch_ups WHERE definition_id = %s", (late_id,)) == 0:
            assert time.monotonic() < deadline, "the catch-up never finished"
            report = tick_like_run(scheduler)
            assert report is not None and report.leading, "a tick failed"
    scheduler.close()
    lines = [r.getMessage() for r in caplog.records if "definition=down-for-hours" in r.getMessage()]
    going = [line for line in lines if "catching up (coalesce):" in line]
    assert len(going) >= 5, f"one line per unfinished tick of a 7,200-occurrence catch-up: {lines}"
    walked = [int(line.split(": ")[1].split()[0]) for line in going]
    assert walked == sorted(walked) and walked[0] >= 1000, f"late occurrences walked grow: {walked}"
    assert all(" behind" in line for line in going), going
    assert "coalesced into 1" in lines[-1], f"the last line settles the catch-up: {lines[-1]}"
