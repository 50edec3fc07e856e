"""The operator views: jobs.leader, jobs.running, jobs.queue_stats, jobs.definition_health."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from harness import (
    Conn,
    Database,
    claim,
    enqueue,
    expect_error,
    finish_old,
    one,
    rows,
    run_row,
    scalar,
    wait_for,
)
from measure_prune import measure

READER = "pgtick_t_reader"


# -- jobs.leader ---------------------------------------------------------------------------


def test_leader_is_empty_when_nobody_leads(conn: Conn) -> None:
    assert rows(conn, "SELECT * FROM jobs.leader") == []


def test_leader_shows_owner_and_since_until_resign(db: Database, conn: Conn) -> None:
    with db.connect() as leader:
        pid = scalar(leader, "SELECT pg_backend_pid()")
        before = scalar(conn, "SELECT clock_timestamp()")
        assert scalar(leader, "SELECT jobs.try_lead('me')") is True
        row = one(conn, "SELECT pid, owner, since, leading_for FROM jobs.leader")
        assert (row["pid"], row["owner"]) == (pid, "me")
        assert before <= row["since"] <= scalar(conn, "SELECT clock_timestamp()")
        assert row["leading_for"] >= timedelta(0)
        # Asking again while leading changes nothing: still one row, same since.
        assert scalar(leader, "SELECT jobs.try_lead('me')") is True
        assert one(conn, "SELECT since FROM jobs.leader")["since"] == row["since"]
        # Another session cannot lead meanwhile.
        assert scalar(conn, "SELECT jobs.try_lead('other')") is False
        assert scalar(conn, "SELECT owner FROM jobs.leader") == "me"

        assert scalar(leader, "SELECT jobs.resign()") is True
        assert rows(conn, "SELECT * FROM jobs.leader") == []
        assert scalar(leader, "SELECT jobs.resign()") is False, "resigning twice is a no-op"


def test_a_leader_that_gives_no_owner_is_named_by_its_application_or_its_pid(
    db: Database, conn: Conn
) -> None:
    """jobs.try_lead() takes no owner from psql or another language: jobs.leader still names
    the leader (its application_name, else its backend pid), never an owner NULL that
    every reader of the view would have to guess about."""
    with psycopg.connect(db.dsn, autocommit=True, application_name="nightly-go") as leader:
        assert scalar(leader, "SELECT jobs.try_lead()") is True
        assert scalar(conn, "SELECT owner FROM jobs.leader") == "nightly-go"
        assert scalar(leader, "SELECT jobs.resign()") is True
    with psycopg.connect(db.dsn, autocommit=True, application_name="") as leader:
        pid = scalar(leader, "SELECT pg_backend_pid()")
        assert scalar(leader, "SELECT jobs.try_lead(NULL)") is True
        assert scalar(conn, "SELECT owner FROM jobs.leader") == f"pid {pid}"
        assert scalar(leader, "SELECT jobs.resign()") is True


def test_a_leader_whose_first_try_lead_rolled_back_shows_once_it_asks_again(db: Database, conn: Conn) -> None:
    """The leader lock is the session's, its leadership row the transaction's: a caller that
    took the lead inside a transaction that rolled back (another language's tick that failed
    after jobs.try_lead) still holds the lock. Its next jobs.try_lead writes the row again,
    so jobs.leader (status, alerts, metrics) never hides a session that leads."""
    with psycopg.connect(db.dsn) as leader:
        assert scalar(leader, "SELECT jobs.try_lead('rolled-back')") is True
        leader.rollback()
        assert rows(conn, "SELECT * FROM jobs.leader") == []
        assert scalar(conn, "SELECT jobs.try_lead('other')") is False, "the lock outlived the rollback"
        assert scalar(leader, "SELECT jobs.try_lead('rolled-back')") is True
        leader.commit()
        pid = scalar(leader, "SELECT pg_backend_pid()")
        assert rows(conn, "SELECT pid, owner FROM jobs.leader") == [{"pid": pid, "owner": "rolled-back"}]
        since = scalar(conn, "SELECT since FROM jobs.leader")
        assert scalar(leader, "SELECT jobs.try_lead('rolled-back')") is True
        leader.commit()
        assert scalar(conn, "SELECT since FROM jobs.leader") == since, "a leader asking again keeps its since"
        assert scalar(leader, "SELECT jobs.resign()") is True
        leader.commit()


def test_leader_row_goes_when_its_connection_closes(db: Database, conn: Conn) -> None:
    leader = db.connect()
    assert scalar(leader, "SELECT jobs.try_lead('short-lived')") is True
    assert scalar(conn, "SELECT owner FROM jobs.leader") == "short-lived"
    leader.close()
    wait_for(
        "the leader row to vanish after its connection closed",
        lambda: scalar(conn, "SELECT count(*) = 0 FROM jobs.leader"),
        timeout=60,
    )
    # ... and the next leader shows with its own owner and a later since.
    assert scalar(conn, "SELECT jobs.try_lead('next')") is True
    assert one(conn, "SELECT owner FROM jobs.leader")["owner"] == "next"


def test_leader_shows_only_once_its_leadership_row_is_committed(db: Database, conn: Conn) -> None:
    """The advisory lock is visible in pg_locks as soon as it is taken, the leadership row only
    when try_lead's transaction commits: in between, the view shows nobody rather than a
    half-made leader (no owner, or a dead predecessor's row)."""
    with db.connect() as first:
        assert scalar(first, "SELECT jobs.try_lead('first')") is True
    # 'first' died without resigning: its row stays behind, its lock went with its session.
    wait_for("the dead leader's lock to go", lambda: not rows(conn, "SELECT * FROM jobs.leader"), timeout=60)
    with db.connect(autocommit=False) as second:
        assert scalar(second, "SELECT jobs.try_lead('second')") is True  # lock held, row not committed
        seen = rows(conn, "SELECT pid, owner FROM jobs.leader")
        assert seen == [], f"the view shows a leader whose leadership row is not committed: {seen}"
        second.commit()
        pid = scalar(second, "SELECT pg_backend_pid()")
        assert rows(conn, "SELECT pid, owner FROM jobs.leader") == [{"pid": pid, "owner": "second"}]
        second.commit()


def test_every_view_is_readable_by_the_reader_role(db: Database, conn: Conn) -> None:
    """jobs_reader is the psql console role: each view must work for it, the leader view too
    (a view that called the private jobs._leader_key(), which no role may execute, would raise 42501)."""
    assert scalar(conn, "SELECT jobs.try_lead('me')") is True
    enqueue(conn)
    with psycopg.connect(db.dsn_as(READER), autocommit=True) as reader:
        assert scalar(reader, "SELECT owner FROM jobs.leader") == "me"
        for view in ("jobs.running", "jobs.queue_stats", "jobs.definition_health"):
            reader.execute(f"SELECT * FROM {view}").fetchall()
        assert scalar(reader, "SELECT queued FROM jobs.queue_stats WHERE kind = 'k'") == 1


# -- jobs.running --------------------------------------------------------------------------


def test_running_shows_heartbeat_age_only_after_a_heartbeat(conn: Conn) -> None:
    conn.execute("SELECT jobs.define('nightly', 'report', run_at => now() + interval '1 day')")
    run_id = int(scalar(conn, "SELECT id FROM jobs.run_now('nightly')"))
    other = enqueue(conn, "k")
    assert rows(conn, "SELECT * FROM jobs.running") == [], "nothing RUNNING yet"
    assert claim(conn, "w1", batch=2) == [run_id, other]

    row = one(conn, "SELECT * FROM jobs.running WHERE id = %s", (run_id,))
    assert (row["definition"], row["kind"], row["worker"], row["attempt"]) == ("nightly", "report", "w1", 1)
    assert row["heartbeat_at"] is None and row["heartbeat_age"] is None, "never heartbeated: NULL"
    assert row["runtime"] >= timedelta(0) and row["cancel_requested"] is False

    conn.execute("SELECT jobs.heartbeat(ARRAY[%s]::bigint[], 'w1')", (run_id,))
    row = one(conn, "SELECT * FROM jobs.running WHERE id = %s", (run_id,))
    assert row["heartbeat_at"] is not None
    assert timedelta(0) <= row["heartbeat_age"] < timedelta(minutes=1)
    assert scalar(conn, "SELECT heartbeat_age FROM jobs.running WHERE id = %s", (other,)) is None

    # heartbeat_timeout: when the reaper fails it, the run's own timeout, else jobs.config's.
    assert row["heartbeat_timeout"] == timedelta(minutes=1)
    own = int(scalar(conn, "SELECT id FROM jobs.enqueue('k', heartbeat_timeout => '15 seconds')"))
    assert claim(conn, "w2") == [own]
    assert scalar(conn, "SELECT heartbeat_timeout FROM jobs.running WHERE id = %s", (own,)) == timedelta(
        seconds=15
    )
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '2 minutes'")
    assert scalar(conn, "SELECT heartbeat_timeout FROM jobs.running WHERE id = %s", (run_id,)) == timedelta(
        minutes=2
    )
    conn.execute("SELECT jobs.complete(%s, 'w2')", (own,))

    conn.execute("SELECT jobs.cancel(%s)", (run_id,))
    assert scalar(conn, "SELECT cancel_requested FROM jobs.running WHERE id = %s", (run_id,)) is True
    conn.execute("SELECT jobs.complete(%s, 'w1')", (other,))
    assert [r["id"] for r in rows(conn, "SELECT id FROM jobs.running")] == [run_id], "finished runs leave"


# -- jobs.queue_stats ----------------------------------------------------------------------


def test_queue_stats_counts_per_kind(conn: Conn) -> None:
    # kind a: two due QUEUED (the oldest due 10 minutes ago), one QUEUED for later, one RUNNING,
    # one COMPLETED and one FAILED in the last hour, one COMPLETED two hours ago.
    enqueue(conn, "a", run_at="now() - interval '10 minutes'")
    enqueue(conn, "a", run_at="now() - interval '1 minute'")
    enqueue(conn, "a", run_at="now() + interval '1 hour'")
    for _ in range(3):
        enqueue(conn, "a", run_at="now() - interval '20 minutes'")
    done, failed, running = claim(conn, "w", batch=3, kinds=["a"])
    conn.execute("SELECT jobs.complete(%s, 'w')", (done,))
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'boom')", (failed,))
    finish_old(conn, 1, age="2 hours", kind="a")
    # kind b: only history (a run reaped as lost, a skipped occurrence); kind c: only future.
    finish_old(conn, 1, age="5 minutes", kind="b", status="FAILED")
    conn.execute("UPDATE jobs.runs SET failure_reason = 'HeartbeatLost' WHERE kind = 'b'")
    finish_old(conn, 1, age="5 minutes", kind="b", status="CANCELLED")
    conn.execute("UPDATE jobs.runs SET failure_reason = 'Skipped' WHERE kind = 'b' AND status = 'CANCELLED'")
    enqueue(conn, "c", run_at="now() + interval '1 day'")

    stats = {r["kind"]: r for r in rows(conn, "SELECT * FROM jobs.queue_stats")}
    assert sorted(stats) == ["a", "b", "c"]
    a = stats["a"]
    assert (a["queued"], a["scheduled"], a["running"]) == (2, 1, 1)
    assert (a["completed_1h"], a["failed_1h"], a["cancelled_1h"]) == (1, 1, 0)
    assert timedelta(minutes=10) <= a["oldest_queued_age"] < timedelta(minutes=11)
    assert (a["skipped_1h"], a["lost_1h"]) == (0, 0)
    assert scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (running,)) == "RUNNING"

    b = stats["b"]
    assert (b["queued"], b["scheduled"], b["running"], b["oldest_queued_age"]) == (0, 0, 0, None)
    assert (b["failed_1h"], b["cancelled_1h"], b["skipped_1h"], b["lost_1h"]) == (1, 1, 1, 1)
    c = stats["c"]
    assert (c["queued"], c["scheduled"], c["oldest_queued_age"]) == (0, 1, None), "future is not due"


def test_queue_stats_is_empty_without_runs(conn: Conn) -> None:
    assert rows(conn, "SELECT * FROM jobs.queue_stats") == []
    finish_old(conn, 3, age="2 hours")
    assert rows(conn, "SELECT * FROM jobs.queue_stats") == [], "only older history: nothing to show"


def test_queue_stats_reads_the_live_runs_through_their_indexes_not_the_finished_ones(conn: Conn) -> None:
    """jobs.runs keeps the finished runs of the last archive_after (a day by default): the live
    counts read the QUEUED and RUNNING partial indexes, and the last hour's outcomes the
    finished_at index, never every row."""
    finish_old(conn, 5000, age="3 hours")
    enqueue(conn, "only-running")
    assert len(claim(conn, "w", batch=1, kinds=["only-running"])) == 1
    enqueue(conn, "only-queued")
    conn.execute("ANALYZE jobs.runs")
    with conn.transaction():
        stats = {
            r["kind"]: (r["queued"], r["running"])
            for r in rows(conn, "SELECT kind, queued, running FROM jobs.queue_stats")
        }
        seq_scans = scalar(conn, "SELECT pg_stat_get_xact_numscans('jobs.runs'::regclass)")
    assert stats == {"only-running": (0, 1), "only-queued": (1, 0)}
    assert seq_scans == 0, f"jobs.queue_stats read jobs.runs sequentially {seq_scans} time(s)"


# -- jobs.definition_health ----------------------------------------------------------------


def _recurring(conn: Conn, name: str, **extra: str) -> int:
    args = "".join(f", {k} => {v}" for k, v in extra.items())
    return int(
        scalar(
            conn,
            f"SELECT id FROM jobs.define(%s, 'report', schedule => 'FREQ=DAILY;BYHOUR=8'{args})",
            (name,),
        )
    )


def _occurrences(conn: Conn, def_id: int, count: int) -> list[int]:
    """Materialize ``count`` past daily occurrences through jobs.materialize (the leader's call)."""
    cursor = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (def_id,))
    if cursor is None:
        first = datetime.now(UTC).replace(microsecond=0) - timedelta(days=count + 1)
        assert scalar(conn, "SELECT jobs.materialize(%s, NULL, '{}', %s)", (def_id, first)) == 0
        cursor = first
    times = [cursor + timedelta(days=i) for i in range(count)]
    new_cursor = times[-1] + timedelta(days=1)
    created = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)",
        (def_id, cursor, times, new_cursor),
    )
    assert created == count
    ids = conn.execute(
        "SELECT id FROM jobs.runs WHERE definition_id = %s AND scheduled_for = ANY (%s) ORDER BY id",
        (def_id, times),
    ).fetchall()
    return [int(r[0]) for r in ids]


def test_definition_health_next_run_local_is_the_cursor_in_the_zone(conn: Conn) -> None:
    def_id = _recurring(conn, "sofia", timezone="'Europe/Sofia'")
    health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (def_id,))
    assert (health["next_run_at"], health["next_run_local"]) == (None, None), "cursor not set yet"
    for utc, local in [
        (datetime(2031, 7, 1, 5, 0, tzinfo=UTC), datetime(2031, 7, 1, 8, 0)),  # EEST, UTC+3
        (datetime(2031, 12, 1, 6, 0, tzinfo=UTC), datetime(2031, 12, 1, 8, 0)),  # EET, UTC+2
    ]:
        conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (utc, def_id))
        health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (def_id,))
        assert health["next_run_at"] == utc
        assert health["next_run_local"] == local, "08:00 in Sofia, summer and winter"
        assert (health["timezone"], health["schedule"]) == ("Europe/Sofia", "FREQ=DAILY;BYHOUR=8")
    # The view agrees with PostgreSQL's own conversion for every zone in use.
    assert scalar(
        conn,
        "SELECT bool_and(next_run_local = next_run_at AT TIME ZONE timezone) FROM jobs.definition_health",
    )


def test_definition_health_tells_apart_the_two_instants_of_a_repeated_wall_time(conn: Conn) -> None:
    """New York falls back on 2031-11-02: 01:30 comes twice, at 05:30 UTC (EDT) and 06:30 UTC
    (EST). next_run_local is 01:30 both times; next_run_utc_offset says which (as
    next_start_utc_offset does for next_start_local); in summer and winter it is the zone's."""
    def_id = _recurring(conn, "new-york", timezone="'America/New_York'")
    query = (
        "SELECT next_run_local, next_run_utc_offset, next_start_local, next_start_utc_offset"
        " FROM jobs.definition_health WHERE id = %s"
    )
    assert one(conn, query, (def_id,))["next_run_utc_offset"] is None, "cursor not set yet"
    for utc, offset in [
        (datetime(2031, 11, 2, 5, 30, tzinfo=UTC), timedelta(hours=-4)),  # 01:30 EDT
        (datetime(2031, 11, 2, 6, 30, tzinfo=UTC), timedelta(hours=-5)),  # 01:30 EST
    ]:
        conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (utc, def_id))
        health = one(conn, query, (def_id,))
        assert (health["next_run_local"], health["next_run_utc_offset"]) == (
            datetime(2031, 11, 2, 1, 30),
            offset,
        )
        assert (health["next_start_local"], health["next_start_utc_offset"]) == (
            datetime(2031, 11, 2, 1, 30),
            offset,
        ), "with no jitter and no queued run the next start is the cursor"
    kolkata = _recurring(conn, "kolkata", timezone="'Asia/Kolkata'")
    conn.execute("UPDATE jobs.definitions SET next_run_at = '2031-07-01 00:00+00' WHERE id = %s", (kolkata,))
    assert one(conn, query, (kolkata,))["next_run_utc_offset"] == timedelta(hours=5, minutes=30)


def test_definition_health_outcomes_and_failure_streak(conn: Conn) -> None:
    """consecutive_failures counts FAILED runs since the last COMPLETED one."""
    def_id = _recurring(conn, "streaky")
    ids = _occurrences(conn, def_id, 5)
    health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (def_id,))
    assert (health["queued"], health["running"], health["last_status"]) == (5, 0, None)
    assert (health["last_success_at"], health["last_failure_at"], health["consecutive_failures"]) == (
        None,
        None,
        0,
    )

    outcomes = ["fail", "complete", "fail", "fail"]
    for run_id, outcome in zip(ids, outcomes, strict=False):
        assert claim(conn, "w") == [run_id]
        if outcome == "fail":
            conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'boom')", (run_id,))
        else:
            conn.execute("SELECT jobs.complete(%s, 'w')", (run_id,))
    health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (def_id,))
    assert health["consecutive_failures"] == 2, "two failures since the success"
    assert health["last_success_at"] == run_row(conn, ids[1])["finished_at"]
    assert health["last_failure_at"] == run_row(conn, ids[3])["finished_at"]
    assert (health["last_status"], health["queued"]) == ("FAILED", 1)

    assert claim(conn, "w") == [ids[4]]
    assert one(conn, "SELECT running FROM jobs.definition_health WHERE id = %s", (def_id,))["running"] == 1
    conn.execute("SELECT jobs.complete(%s, 'w')", (ids[4],))
    health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (def_id,))
    assert (health["consecutive_failures"], health["last_status"], health["running"]) == (0, "COMPLETED", 0)
    assert health["last_success_at"] == run_row(conn, ids[4])["finished_at"]


def test_definition_health_counts_skips_since_the_last_start(conn: Conn) -> None:
    """overlap_policy skip at cap 1: while one run is RUNNING, a claimer records the other due
    occurrences as Skipped; consecutive_skips counts them until a run starts again."""
    def_id = _recurring(conn, "skippy", max_concurrent_runs="1", overlap_policy="'skip'")
    ids = _occurrences(conn, def_id, 3)
    assert claim(conn, "w", batch=3) == [ids[0]]
    assert claim(conn, "w", batch=3) == [], "at its cap: the next claim skips the others"
    skipped = conn.execute(
        "SELECT id FROM jobs.runs WHERE definition_id = %s AND failure_reason = 'Skipped' ORDER BY id",
        (def_id,),
    ).fetchall()
    assert [r[0] for r in skipped] == ids[1:]
    health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (def_id,))
    assert (health["consecutive_skips"], health["running"], health["consecutive_failures"]) == (2, 1, 0)

    conn.execute("SELECT jobs.complete(%s, 'w')", (ids[0],))
    assert scalar(conn, "SELECT consecutive_skips FROM jobs.definition_health WHERE id = %s", (def_id,)) == 2
    (later,) = _occurrences(conn, def_id, 1)
    assert claim(conn, "w") == [later]
    assert scalar(conn, "SELECT consecutive_skips FROM jobs.definition_health WHERE id = %s", (def_id,)) == 0


def test_definition_health_paused_finished_and_schedule_error(conn: Conn) -> None:
    rec = _recurring(conn, "rec")
    once = int(scalar(conn, "SELECT id FROM jobs.define('once', 'k', run_at => now() - interval '1 second')"))
    health = {r["name"]: r for r in rows(conn, "SELECT * FROM jobs.definition_health")}
    assert (health["rec"]["paused"], health["rec"]["finished"], health["rec"]["schedule_error"]) == (
        False,
        False,
        None,
    )
    assert health["once"]["finished"] is False

    conn.execute("SELECT jobs.pause('rec')")
    assert scalar(conn, "SELECT paused FROM jobs.definition_health WHERE id = %s", (rec,)) is True
    conn.execute("SELECT jobs.resume('rec')")
    assert scalar(conn, "SELECT paused FROM jobs.definition_health WHERE id = %s", (rec,)) is False

    assert scalar(conn, "SELECT jobs.materialize_one_shots()") == 1
    once_health = one(conn, "SELECT * FROM jobs.definition_health WHERE id = %s", (once,))
    assert (once_health["finished"], once_health["queued"], once_health["next_run_at"]) == (True, 1, None)

    revision = scalar(conn, "SELECT revision FROM jobs.definitions WHERE id = %s", (rec,))
    conn.execute("SELECT jobs.mark_schedule_error(%s, %s, 'BYHOUR out of range')", (rec, revision))
    assert (
        scalar(conn, "SELECT schedule_error FROM jobs.definition_health WHERE id = %s", (rec,))
        == "BYHOUR out of range"
    )
    _recurring(conn, "rec")  # defining it again clears the error
    assert scalar(conn, "SELECT schedule_error FROM jobs.definition_health WHERE id = %s", (rec,)) is None


def test_definition_health_next_start_is_the_first_waiting_run_not_the_cursor(conn: Conn) -> None:
    """Occurrences are materialized ahead (the scheduler's lookahead): the cursor, next_run_at,
    is then past runs already waiting, and next_start_at is the one an operator asks for:
    the first QUEUED run of the definition, else the cursor."""
    def_id = int(
        scalar(
            conn,
            "SELECT id FROM jobs.define('every-2m', 'k', schedule => '*/2 * * * *',"
            " timezone => 'Europe/Sofia')",
        )
    )
    query = "SELECT next_run_at, next_start_at, next_start_local FROM jobs.definition_health WHERE id = %s"
    assert one(conn, query, (def_id,)) == {
        "next_run_at": None,
        "next_start_at": None,
        "next_start_local": None,
    }
    start = scalar(conn, "SELECT date_trunc('hour', now()) + interval '1 day'")
    assert scalar(conn, "SELECT jobs.materialize(%s, NULL, '{}', %s)", (def_id, start)) == 0
    health = one(conn, query, (def_id,))
    assert health["next_start_at"] == health["next_run_at"] == start, "nothing queued: the cursor"
    times = [start + timedelta(minutes=m) for m in (0, 2, 4)]
    cursor = start + timedelta(minutes=6)
    assert (
        scalar(conn, "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)", (def_id, start, times, cursor))
        == 3
    )
    run_ids = {
        r["scheduled_for"]: r["id"]
        for r in rows(conn, "SELECT id, scheduled_for FROM jobs.runs WHERE definition_id = %s", (def_id,))
    }
    health = one(conn, query, (def_id,))
    assert health["next_run_at"] == cursor, "next_run_at stays the cursor"
    assert health["next_start_at"] == times[0], "the first waiting run, not the cursor"
    sofia = scalar(conn, "SELECT %s::timestamptz AT TIME ZONE 'Europe/Sofia'", (times[0],))
    assert health["next_start_local"] == sofia

    conn.execute("SELECT jobs.cancel(%s)", (run_ids[times[0]],))
    assert one(conn, query, (def_id,))["next_start_at"] == times[1], "a cancelled run starts nothing"
    conn.execute("UPDATE jobs.runs SET blocked = TRUE WHERE id = %s", (run_ids[times[1]],))
    assert one(conn, query, (def_id,))["next_start_at"] == times[2], (
        "a run waiting on others starts when they complete, not at its time"
    )
    now_run = int(scalar(conn, "SELECT id FROM jobs.run_now('every-2m')"))
    now_at = scalar(conn, "SELECT scheduled_for FROM jobs.runs WHERE id = %s", (now_run,))
    assert one(conn, query, (def_id,))["next_start_at"] == now_at, "a run queued by hand starts first"
    conn.execute("SELECT jobs.cancel(%s)", (now_run,))

    conn.execute("SELECT jobs.pause('every-2m')")
    health = one(conn, query, (def_id,))
    assert (health["next_run_at"], health["next_start_at"]) == (cursor, times[2]), (
        "the runs queued before a pause still start"
    )
    conn.execute("SELECT jobs.cancel(%s)", (run_ids[times[2]],))
    conn.execute("UPDATE jobs.runs SET blocked = FALSE WHERE id = %s", (run_ids[times[1]],))
    conn.execute("SELECT jobs.cancel(%s)", (run_ids[times[1]],))
    health = one(conn, query, (def_id,))
    assert (health["next_run_at"], health["next_start_at"]) == (cursor, None), (
        "paused with nothing queued: nothing starts, whatever the cursor says"
    )

    once = int(scalar(conn, "SELECT id FROM jobs.define('once', 'k', run_at => now() + interval '1 minute')"))
    run_at = scalar(conn, "SELECT run_at FROM jobs.definitions WHERE id = %s", (once,))
    assert one(conn, query, (once,))["next_start_at"] == run_at, "a one-shot not materialized yet"
    assert scalar(conn, "SELECT jobs.materialize_one_shots(interval '5 minutes')") == 1
    health = one(conn, query, (once,))
    assert (health["next_run_at"], health["next_start_at"]) == (None, run_at), (
        "a one-shot materialized ahead is finished but its run has not started"
    )


def test_the_next_start_of_a_jittered_cursor_is_its_run_s_start(conn: Conn) -> None:
    """With nothing queued the next start is the cursor's occurrence delayed by its jitter, the
    scheduled_for the scheduler will give its run, in jobs.definition_health (pgtick status,
    the dashboard) and in jobs.definition_list (pgtick definitions)."""
    def_id = int(
        scalar(
            conn,
            "SELECT id FROM jobs.define('jittered', 'k', schedule => '0 * * * *',"
            " jitter => interval '30 minutes')",
        )
    )
    start = scalar(conn, "SELECT date_trunc('hour', now()) + interval '1 day'")
    conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (def_id, start))
    starts = {
        view: scalar(conn, f"SELECT next_start_at FROM jobs.{view} WHERE id = %s", (def_id,))
        for view in ("definition_health", "definition_list")
    }
    conn.execute("SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)", (def_id, start, [start], None))
    queued = scalar(conn, "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s", (def_id,))
    assert queued > start, "the jitter of this occurrence is not 0: the case shows nothing"
    assert starts == {"definition_health": queued, "definition_list": queued}, (
        f"cursor {start}: the views said {starts}, its run starts at {queued}"
    )


def test_the_next_start_is_read_per_definition_through_its_runs_index(conn: Conn) -> None:
    """A page of jobs.definition_health and of jobs.definition_list reads each listed
    definition's runs through the (definition_id, id) index for its first queued run: never
    every run, which grows with the history and the backlog of other definitions."""
    conn.execute(
        """
        INSERT INTO jobs.definitions (name, kind, schedule, next_run_at)
        SELECT 'd' || g, 'k', '*/2 * * * *', now() + interval '10 minutes' FROM generate_series(1, 2000) AS g;
        INSERT INTO jobs.runs (definition_id, kind, status, origin, scheduled_for, occurrence_at,
                               started_at, finished_at)
        SELECT d.id, 'k', s.status::jobs.run_status, 'schedule', s.at, s.at,
               CASE WHEN s.status = 'COMPLETED' THEN s.at END, CASE WHEN s.status = 'COMPLETED' THEN s.at END
          FROM jobs.definitions AS d,
               LATERAL (SELECT CASE WHEN g > 8 THEN 'QUEUED' ELSE 'COMPLETED' END AS status,
                               now() + (g - 8) * interval '2 minutes' AS at
                          FROM generate_series(1, 10) AS g) AS s;
        ANALYZE jobs.definitions;
        ANALYZE jobs.runs;
        """
    )

    def scans_of_runs(query: str) -> list[str]:
        plan = scalar(conn, "EXPLAIN (FORMAT JSON) " + query)
        found: list[str] = []

        def walk(node: dict[str, Any]) -> None:
            if node.get("Relation Name") == "runs":
                found.append(" ".join(filter(None, (node["Node Type"], node.get("Index Name")))))
            for child in node.get("Plans", []):
                walk(child)

        walk(plan[0]["Plan"])
        return found

    for query in (
        "SELECT name, next_start_at FROM jobs.definition_health ORDER BY name LIMIT 50",
        "SELECT * FROM jobs.definition_health ORDER BY name LIMIT 50",
        "SELECT * FROM jobs.definition_list WHERE NOT paused AND NOT finished ORDER BY name LIMIT 1000",
    ):
        scans = scans_of_runs(query)
        assert scans and not [s for s in scans if s.startswith("Seq Scan")], f"{query}: {scans}"
    first = scalar(conn, "SELECT min(scheduled_for) FROM jobs.runs WHERE status = 'QUEUED'")
    assert (
        scalar(conn, "SELECT count(*) FROM jobs.definition_list WHERE next_start_at = %s", (first,)) == 2000
    )


def test_definition_health_last_finished_at_is_the_last_outcomes_finish(conn: Conn) -> None:
    """An overlap skip after a success: last_status is the skip's (CANCELLED), and
    last_finished_at is when it was skipped, not the older success."""
    def_id = _recurring(conn, "skippy", max_concurrent_runs="1", overlap_policy="'skip'")
    (first,) = _occurrences(conn, def_id, 1)
    assert claim(conn, "w") == [first]
    conn.execute("SELECT jobs.complete(%s, 'w')", (first,))
    ids = _occurrences(conn, def_id, 3)
    assert claim(conn, "w", batch=3) == [ids[0]]
    assert claim(conn, "w", batch=3) == [], "at its cap: the next claim skips the others"
    finished = {
        r["id"]: r["finished_at"]
        for r in rows(
            conn,
            "SELECT id, finished_at FROM jobs.runs WHERE definition_id = %s AND finished_at IS NOT NULL",
            (def_id,),
        )
    }
    skip = max(finished)  # the newest finished run: an overlap skip
    assert run_row(conn, skip)["failure_reason"] == "Skipped"
    health = one(
        conn,
        "SELECT last_status::text, last_success_at, last_finished_at"
        " FROM jobs.definition_health WHERE id = %s",
        (def_id,),
    )
    assert health == {
        "last_status": "CANCELLED",
        "last_success_at": finished[first],
        "last_finished_at": finished[skip],
    }
    assert skip in ids and finished[skip] > finished[first]


def _statuses(conn: Conn) -> dict[str, int]:
    got = conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall()
    return {status: int(n) for status, n in got}


def test_prune_deletes_only_finished_runs_older_than_the_cutoff(conn: Conn) -> None:
    old = (
        finish_old(conn, 2, age="20 days")
        + finish_old(conn, 2, age="20 days", status="FAILED")
        + finish_old(conn, 2, age="20 days", status="CANCELLED")
    )
    recent = finish_old(conn, 3, age="1 day")
    # Live runs that have waited or worked for a month are never history.
    stale_queued = enqueue(conn, run_at="now() - interval '30 days'")
    stale_running = enqueue(conn, run_at="now() - interval '30 days'")
    assert claim(conn, "w") == [stale_queued]
    conn.execute(
        "UPDATE jobs.runs SET created_at = now() - interval '30 days',"
        " started_at = now() - interval '30 days' WHERE id IN (%s, %s)",
        (stale_queued, stale_running),
    )

    assert scalar(conn, "SELECT jobs.prune('7 days')") == len(old)
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE id = ANY (%s)", (old,)) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE id = ANY (%s)", (recent,)) == 3
    assert _statuses(conn) == {"COMPLETED": 3, "QUEUED": 1, "RUNNING": 1}
    assert scalar(conn, "SELECT jobs.prune('7 days')") == 0, "nothing older left"

    assert scalar(conn, "SELECT jobs.prune('0 seconds')") == 3, "cutoff now: all finished history"
    assert _statuses(conn) == {"QUEUED": 1, "RUNNING": 1}, "QUEUED and RUNNING are never pruned"


def test_prune_takes_at_most_batch_size_oldest_first(conn: Conn) -> None:
    ids = finish_old(conn, 25, age="30 days")
    assert scalar(conn, "SELECT jobs.prune('7 days', 10)") == 10
    left = [r[0] for r in conn.execute("SELECT id FROM jobs.runs ORDER BY id").fetchall()]
    assert left == ids[10:], "the oldest ten went first"
    assert [scalar(conn, "SELECT jobs.prune('7 days', 10)") for _ in range(3)] == [10, 5, 0]


def test_prune_defaults_to_the_configured_retention(conn: Conn) -> None:
    assert scalar(conn, "SELECT retention FROM jobs.config") == timedelta(days=14)
    finish_old(conn, 2, age="15 days")
    kept = finish_old(conn, 2, age="10 days")
    assert scalar(conn, "SELECT jobs.prune()") == 2
    assert scalar(conn, "SELECT jobs.prune(NULL, 100)") == 0
    assert sorted(r[0] for r in conn.execute("SELECT id FROM jobs.runs")) == kept

    conn.execute("UPDATE jobs.config SET retention = '7 days'")
    assert scalar(conn, "SELECT jobs.prune()") == 2
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def test_prune_rejects_bad_arguments(conn: Conn) -> None:
    finish_old(conn, 1, age="30 days")
    expect_error(conn, "SELECT jobs.prune('-1 day')", None, "22023", "older_than")
    expect_error(conn, "SELECT jobs.prune('1000000 years')", None, "22023", "older_than", "100 years")
    expect_error(conn, "SELECT jobs.prune('1 day', 0)", None, "22023", "batch_size")
    expect_error(conn, "SELECT jobs.prune('1 day', NULL)", None, "22023", "batch_size")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1


def test_prune_measurement_script_prunes_exactly_the_old_history(db: Database, conn: Conn) -> None:
    steps: list[str] = []

    def emit(step: str, data: dict[str, Any]) -> None:
        steps.append(step)

    out = measure(db.dsn, old=3000, recent=500, batch=1000, queued=2000, idle_seconds=0.2, emit=emit)
    assert out["before"]["rows"] == 3000 + 500 + 2000
    assert out["prune"]["pruned"] == 3000
    assert out["prune"]["calls"] == 4, "three full batches, then a short one"
    assert out["after_prune"]["rows"] == 500 + 2000, "recent history and the live queue stay"
    assert out["after_refill"]["rows"] == 3000 + 500 + 2000
    assert steps[0] == "seeded" and steps[-1] == "after refilling as many runs"
    # The claim loop ran against the same table throughout: its runs finished, none was lost.
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'work' AND status = 'RUNNING'") == 0
