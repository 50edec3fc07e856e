"""History: finished runs move from jobs.runs to jobs.run_history (one partition per UTC day)
after jobs.config.archive_after; jobs.prune drops whole days. What holds across a run's whole
life (lookups by id, retry chains, dependencies, idempotency and unique keys, backfills, the
failure streak) sees the moved runs. Concurrency tests use real processes and commits."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from harness import (
    BlockedCall,
    Conn,
    Database,
    enqueue,
    expect_error,
    finish_old,
    gated,
    one,
    race_parts,
    rows,
    scalar,
    spring_forward_zone,
)


def _where(conn: Conn, run_id: int) -> str | None:
    """'live', 'history', or None for a run in neither; fails if it is in both."""
    live = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE id = %s", (run_id,))
    moved = scalar(conn, "SELECT count(*) FROM jobs.run_history WHERE id = %s", (run_id,))
    assert live + moved <= 1, f"run {run_id} is in jobs.runs and jobs.run_history at once"
    return "live" if live else "history" if moved else None


def _partitions(conn: Conn) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'jobs.run_history'::regclass ORDER BY 1"
        )
    ]


def _archive_all(conn: Conn) -> int:
    total = 0
    while (n := scalar(conn, "SELECT jobs.archive(1000)")) > 0:
        total += n
    return int(total)


def _set_finished(conn: Conn, run_id: int, at: str) -> None:
    conn.execute("UPDATE jobs.runs SET finished_at = %s::timestamptz WHERE id = %s", (at, run_id))


# -- moving and dropping ---------------------------------------------------------------------


def test_archive_moves_only_runs_finished_before_archive_after(conn: Conn) -> None:
    assert scalar(conn, "SELECT archive_after FROM jobs.config") == timedelta(days=1)
    old = finish_old(conn, 3, age="2 days") + finish_old(conn, 2, age="3 days", status="FAILED")
    recent = finish_old(conn, 2, age="20 hours", status="CANCELLED")
    queued = enqueue(conn, run_at="now() - interval '30 days'")

    assert scalar(conn, "SELECT jobs.archive()") == len(old)
    assert {r: _where(conn, r) for r in old} == dict.fromkeys(old, "history")
    assert {r: _where(conn, r) for r in [*recent, queued]} == dict.fromkeys([*recent, queued], "live")
    assert scalar(conn, "SELECT jobs.archive()") == 0, "nothing older left"
    # The moved rows are the same rows: every column as it was.
    assert scalar(conn, "SELECT count(*) FROM jobs.runs_all") == len(old) + len(recent) + 1
    moved = one(
        conn, "SELECT status::text, worker, failure_reason FROM jobs.runs_all WHERE id = %s", (old[-1],)
    )
    assert moved == {"status": "FAILED", "worker": "old-worker", "failure_reason": "Error"}


def test_archive_takes_batch_size_oldest_first_and_one_partition_per_utc_day(conn: Conn) -> None:
    ids = finish_old(conn, 6, age="3 days")
    days = [
        "2026-01-01 23:59:59+00",
        "2026-01-02 00:00:00+00",
        "2026-01-02 23:00:00-02",
        "2025-12-31 12:00:00+00",
    ]
    for run_id, at in zip(ids, days, strict=False):
        _set_finished(conn, run_id, at)
    assert scalar(conn, "SELECT jobs.archive(2)") == 2
    assert sorted(r[0] for r in conn.execute("SELECT id FROM jobs.run_history")) == sorted(
        [ids[3], ids[0]]
    ), "the two that finished first moved first"
    assert _archive_all(conn) == 4
    three_days_ago = scalar(
        conn,
        "SELECT to_char(finished_at AT TIME ZONE 'UTC', 'YYYYMMDD') FROM jobs.runs_all WHERE id = %s",
        (ids[5],),
    )
    expected = {
        "20251231",
        "20260101",
        "20260102",
        "20260103",
        three_days_ago,
    }  # 23:00 at -02 is the 3rd in UTC
    assert _partitions(conn) == sorted(f"run_history_{d}" for d in expected)
    by_part = dict(
        conn.execute(
            "SELECT tableoid::regclass::text, count(*) FROM jobs.run_history GROUP BY 1 ORDER BY 1"
        ).fetchall()
    )
    assert by_part["jobs.run_history_20260101"] == 1
    assert by_part["jobs.run_history_20260102"] == 1
    assert by_part["jobs.run_history_20260103"] == 1
    assert by_part["jobs.run_history_20251231"] == 1


def test_a_day_is_attached_at_its_utc_bounds_whatever_the_sessions_datestyle_and_zone(conn: Conn) -> None:
    """A session that writes times as 'SQL, DMY' in Asia/Kolkata writes them with the zone
    abbreviation IST, which PostgreSQL reads back as Israel time: the archive still makes
    each day from midnight to midnight UTC."""
    conn.execute("SET timezone = 'Asia/Kolkata'")
    conn.execute("SET datestyle = 'SQL, DMY'")
    ids = finish_old(conn, 3, age="3 days")
    for run_id, at in zip(
        ids,
        ["2026-01-01 23:59:59.999999+00", "2026-01-02 00:00:00+00", "2026-01-02 03:00:00+00"],
        strict=True,
    ):
        _set_finished(conn, run_id, at)
    assert _archive_all(conn) == 3
    conn.execute("SET timezone = 'UTC'")
    conn.execute("SET datestyle = 'ISO'")
    bounds = dict(
        conn.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i"
            " JOIN pg_class AS c ON c.oid = i.inhrelid WHERE i.inhparent = 'jobs.run_history'::regclass"
        ).fetchall()
    )
    assert bounds == {
        "run_history_20260101": "FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-01-02 00:00:00+00')",
        "run_history_20260102": "FOR VALUES FROM ('2026-01-02 00:00:00+00') TO ('2026-01-03 00:00:00+00')",
    }


@pytest.mark.parametrize("finished", ["-infinity", "0044-03-15 12:00:00+00 BC"])
def test_a_run_finished_before_the_first_day_neither_stops_the_archive_nor_outlives_the_prune(
    conn: Conn, finished: str
) -> None:
    """A finish time written by hand at -infinity, or before the year 1 (a BC day would be
    filed under the AD day of the same digits, which has no room for it, and every archive
    failed), has no day of history."""
    odd, *others = finish_old(conn, 3, age="2 days")
    _set_finished(conn, odd, finished)
    assert scalar(conn, "SELECT jobs.archive()") == len(others), "the runs behind it move"
    assert {r: _where(conn, r) for r in others} == dict.fromkeys(others, "history")
    assert _where(conn, odd) == "live", "it has no day of history to go to"
    assert scalar(conn, "SELECT jobs.archive()") == 0
    conn.execute("SELECT jobs.prune(interval '8 days')")
    assert _where(conn, odd) is None, "the prune deletes it as older than any retention"


def test_archive_after_null_keeps_every_run_in_jobs_runs(conn: Conn) -> None:
    conn.execute("UPDATE jobs.config SET archive_after = NULL")
    ids = finish_old(conn, 3, age="400 days")
    assert scalar(conn, "SELECT jobs.archive()") == 0
    assert [_where(conn, r) for r in ids] == ["live"] * 3
    assert scalar(conn, "SELECT jobs.prune('7 days')") == 3, "prune still deletes them, row by row"


def test_archive_and_archive_after_refuse_bad_values(conn: Conn) -> None:
    finish_old(conn, 1, age="3 days")
    expect_error(conn, "SELECT jobs.archive(0)", None, "22023", "batch_size")
    expect_error(conn, "SELECT jobs.archive(NULL)", None, "22023", "batch_size")
    expect_error(
        conn, "UPDATE jobs.config SET archive_after = '59 minutes'", None, "22023", "archive_after", "1 hour"
    )
    expect_error(conn, "UPDATE jobs.config SET archive_after = '-1 day'", None, "22023", "archive_after")
    assert scalar(conn, "SELECT archive_after FROM jobs.config") == timedelta(days=1)
    assert scalar(conn, "SELECT count(*) FROM jobs.run_history") == 0, "nothing moved"


def test_prune_drops_whole_days_of_history_and_counts_them(conn: Conn) -> None:
    old_days = finish_old(conn, 4, age="20 days") + finish_old(conn, 3, age="16 days")
    kept = finish_old(conn, 2, age="5 days")
    assert _archive_all(conn) == 9
    parts_before = _partitions(conn)
    assert len(parts_before) == 3

    assert scalar(conn, "SELECT jobs.prune_count('14 days')") == 7
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 7
    assert [_where(conn, r) for r in old_days] == [None] * 7
    assert [_where(conn, r) for r in kept] == ["history"] * 2
    assert len(_partitions(conn)) == 1, "the two old days were dropped whole"
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 0


def test_prune_drops_a_bounded_number_of_days_per_call_and_says_when_more_are_left(conn: Conn) -> None:
    # A retention cut by months: each dropped day holds its locks until commit, so one call
    # dropping them all would fill the server's lock table. A call stops at 50 days, or once it
    # has dropped batch_size runs, and then returns at least batch_size (call again).
    for day in range(3, 123):
        finish_old(conn, 1, age=f"{day} days")
    assert _archive_all(conn) == 120
    assert len(_partitions(conn)) == 120

    conn.execute("BEGIN")
    assert scalar(conn, "SELECT jobs.prune('1 day', 10000)") == 10000, "stopped with days left"
    held = scalar(conn, "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()")
    conn.execute("COMMIT")
    assert len(_partitions(conn)) == 70, "50 days dropped"
    assert held < 1500, f"one call held {held} locks"

    assert scalar(conn, "SELECT jobs.prune('1 day', 3)") == 3, "three runs: three days, then stop"
    assert len(_partitions(conn)) == 67

    calls, total = 0, 0
    while True:
        n = scalar(conn, "SELECT jobs.prune('1 day', 10000)")
        total, calls = total + n, calls + 1
        if n < 10000:
            break
    assert (calls, total, _partitions(conn)) == (2, 10000 + 17, []), "the rest in two calls, nothing left"
    assert scalar(conn, "SELECT count(*) FROM jobs.runs_all") == 0


def test_a_prune_that_drops_one_day_locks_that_day_not_every_day_of_history(conn: Conn) -> None:
    """Locks are held to commit and the server's lock table is shared: a prune that drops a
    day locks it and the table, whatever the number of days history holds (a long retention)."""
    conn.execute(
        "INSERT INTO jobs.runs (kind, status, scheduled_for, started_at, finished_at, worker)"
        " SELECT 'k', 'COMPLETED', now(), now(), now() - g * interval '1 day', 'w'"
        " FROM generate_series(2, 301) AS g"
    )
    assert _archive_all(conn) == 300
    conn.execute("BEGIN")
    # The cutoff at noon (UTC) 299 days before today's: past the end of the oldest day, before
    # the next one's, at whatever hour the test runs.
    oldest_only = "now() - (date_trunc('day', now(), 'UTC') - interval '299 days 12 hours')"
    assert scalar(conn, f"SELECT jobs.prune({oldest_only})") == 1, "the oldest day"
    held = scalar(
        conn, "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'"
    )
    conn.execute("COMMIT")
    assert len(_partitions(conn)) == 299
    assert held < 100, f"dropping one day of 300 held {held} locks"


def test_prune_keeps_a_day_of_history_until_the_whole_day_is_past_the_cutoff(conn: Conn) -> None:
    # A run finished 36 hours ago lies in a day that ended 12 to 36 hours ago.
    run_id = finish_old(conn, 1, age="36 hours")[0]
    assert _archive_all(conn) == 1
    day_end = scalar(
        conn,
        "SELECT ((finished_at AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC' - now()"
        " FROM jobs.run_history WHERE id = %s",
        (run_id,),
    )
    before_end = -day_end + timedelta(minutes=5)  # a cutoff just before the day's end
    assert scalar(conn, "SELECT jobs.prune(%s)", (before_end,)) == 0, (
        "its day has not ended before the cutoff"
    )
    assert _where(conn, run_id) == "history"
    after_end = -day_end - timedelta(minutes=5)
    assert scalar(conn, "SELECT jobs.prune_count(%s)", (after_end,)) == 1
    assert scalar(conn, "SELECT jobs.prune(%s)", (after_end,)) == 1
    assert _where(conn, run_id) is None


def test_prune_keeps_a_day_holding_a_failed_attempt_that_a_run_still_waits_on(conn: Conn) -> None:
    """A blocked run is released by following its dependency's retry chain from the id it
    names: the day holding that id stays until the run waits no more."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)")
    first = enqueue(conn, "k")
    waiting = int(scalar(conn, "SELECT id FROM jobs.enqueue('w', depends_on => %s)", ([first],)))
    assert [r["id"] for r in rows(conn, "SELECT id FROM jobs.claim(1, 'w', '{k}')")] == [first]
    retry = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'once')", (first,)))
    _set_finished(conn, first, "2026-01-01T12:00:00Z")
    other_day = finish_old(conn, 1, age="400 days")
    assert _archive_all(conn) == 2
    assert len(_partitions(conn)) == 2

    assert scalar(conn, "SELECT jobs.prune_count('14 days')") == 1
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 1, "only the day nothing waits on"
    assert _where(conn, first) == "history" and _where(conn, other_day[0]) is None
    assert [r["id"] for r in rows(conn, "SELECT id FROM jobs.claim(1, 'w', '{k}')")] == [retry]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (retry,)) is True
    assert scalar(conn, "SELECT blocked FROM jobs.runs WHERE id = %s", (waiting,)) is False
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 1
    assert _where(conn, first) is None


def test_prune_removes_history_and_runs_not_moved_yet_in_one_call(conn: Conn) -> None:
    finish_old(conn, 3, age="30 days")
    assert _archive_all(conn) == 3
    conn.execute("UPDATE jobs.config SET archive_after = '60 days'")
    finish_old(conn, 2, age="20 days")  # older than the retention, not moved
    assert scalar(conn, "SELECT jobs.prune_count('14 days')") == 5
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 5
    assert scalar(conn, "SELECT count(*) FROM jobs.runs_all") == 0


def test_a_transaction_reading_history_neither_stops_a_new_day_nor_holds_up_prune(
    db: Database, conn: Conn
) -> None:
    """A new day's partition is attached under a lock readers pass; dropping a day needs
    every reader gone, and prune waits for that half a second, then leaves the day for the
    next prune (instead of queueing every reader of history behind its lock)."""
    finish_old(conn, 3, age="30 days")
    assert _archive_all(conn) == 3
    conn.execute("SET statement_timeout = '20s'")  # a call that waits on the reader fails here
    with db.connect() as reader:
        reader.execute("BEGIN")
        assert scalar(reader, "SELECT count(*) FROM jobs.run_history") == 3

        finish_old(conn, 2, age="3 days")  # another day: a new partition, attached meanwhile
        assert _archive_all(conn) == 2
        assert scalar(conn, "SELECT jobs.prune('14 days')") == 0, "the reader holds the old day"
        assert scalar(conn, "SHOW lock_timeout") == "0", "the caller's lock_timeout is as it was"
        assert len(_partitions(conn)) == 2
        reader.execute("COMMIT")
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 3
    assert len(_partitions(conn)) == 1


def test_an_archive_that_meets_a_prune_dropping_its_day_moves_its_runs_once_the_prune_commits(
    db: Database, conn: Conn
) -> None:
    """A backlog being moved (an upgrade's history, a retention shorter than archive_after)
    holds runs of days a prune drops. An archive that found its day's partition while the
    prune dropping it had not committed waits for the prune, then makes the day again."""
    day = "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '3 days 12 hours'"
    first = finish_old(conn, 1, age="5 days")
    conn.execute(f"UPDATE jobs.runs SET finished_at = {day} WHERE id = %s", (first[0],))
    assert _archive_all(conn) == 1  # the day's partition exists
    backlog = finish_old(conn, 2, age="5 days")  # then the same day, not moved yet
    conn.execute(
        f"UPDATE jobs.runs SET finished_at = {day} + id * interval '1 second' WHERE id = ANY(%s)", (backlog,)
    )
    with db.connect(autocommit=False) as pruner, db.connect() as archiver:
        archiver.execute("SET statement_timeout = '60s'")
        # Drops the day and deletes the older run of the backlog; not committed yet.
        assert scalar(pruner, "SELECT jobs.prune('2 days', 1)") == 2
        archiving = BlockedCall(
            conn,
            archiver,
            lambda: scalar(archiver, "SELECT jobs.archive(1000)"),
            "the archive to wait for the prune",
        )
        pruner.commit()
        outcome = archiving.join(90)
    assert outcome == [1], f"the archive failed or moved nothing: {outcome}"
    assert [_where(conn, r) for r in [*first, *backlog]] == [None, None, "history"]


def test_prune_drops_only_the_day_partitions_it_made_whatever_the_plan(conn: Conn) -> None:
    finish_old(conn, 3, age="30 days")
    assert _archive_all(conn) == 3
    conn.execute(
        "CREATE TABLE jobs.run_history_kept (LIKE jobs.run_history INCLUDING ALL);"
        " COMMENT ON TABLE jobs.run_history_kept IS 'an operator''s own partition';"
        " ALTER TABLE jobs.run_history ATTACH PARTITION jobs.run_history_kept"
        " FOR VALUES FROM ('2001-01-01') TO ('2001-02-01')"
    )
    # A plan that tests every relation's name (pg_toast_NNNN among them) before the join
    # keeps to the partitions: the day is read only from names of the form it gives them.
    for setting in ("enable_nestloop", "enable_mergejoin", "enable_indexscan", "enable_bitmapscan"):
        conn.execute(f"SET {setting} = off")
    assert scalar(conn, "SELECT jobs.prune_count('14 days')") == 3
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 3
    assert _partitions(conn) == ["run_history_kept"], "a partition of another name is never dropped"


def test_history_has_the_columns_of_jobs_runs_in_their_order(conn: Conn) -> None:
    """Compared by base type: a jobs.runs column whose bounds are a domain (checked where a
    value is written) is stored in history as that domain's base type, the value already
    checked."""

    def columns(table: str) -> list[tuple[str, str]]:
        return [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT a.attname, format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype"
                "                                   ELSE a.atttypid END, a.atttypmod)"
                "  FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid"
                " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
                " ORDER BY a.attnum",
                (table,),
            )
        ]

    assert columns("jobs.run_history") == columns("jobs.runs"), (
        "a column added to jobs.runs must be added to jobs.run_history too (jobs.archive moves rows with *)"
    )


def _plan_nodes(conn: Conn, query: str, *settings: str) -> list[str]:
    """Every node type (with its relation, if any) of the plan of query under settings."""
    with conn.transaction():
        for setting in settings:
            conn.execute(f"SET LOCAL {setting}")
        plan = scalar(conn, "EXPLAIN (FORMAT JSON) " + query)
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(
            " ".join(filter(None, (node["Node Type"], node.get("Relation Name"), node.get("Index Name"))))
        )
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return nodes


def test_every_run_is_read_through_the_indexes_of_both_tables(conn: Conn) -> None:
    """jobs.runs_all is one append of jobs.runs and the history partitions, so the newest runs
    come from the id indexes (no sort of every run), a run joined by id is an index probe on
    each side (no scan), and so are the runs that named a run in depends_on. A UNION ALL whose
    two sides differ in a column's type (the domains of jobs.runs against history's base
    types) is planned as a subquery that reads and sorts both whole tables."""
    finish_old(conn, 40, age="3 days")
    assert _archive_all(conn) == 40
    finish_old(conn, 10, age="1 hour")
    conn.execute("ANALYZE jobs.runs")
    conn.execute("ANALYZE jobs.run_history")
    newest = _plan_nodes(conn, "SELECT id FROM jobs.runs_all ORDER BY id DESC LIMIT 5", "enable_sort = off")
    assert "Sort" not in newest and "Merge Append" in newest, f"the newest runs: {newest}"
    joined = _plan_nodes(
        conn,
        "SELECT a.kind, a.queue FROM generate_series(1, 3) AS g (id) JOIN jobs.runs_all AS a ON a.id = g.id",
        "enable_seqscan = off",
        "enable_hashjoin = off",
        "enable_mergejoin = off",
        "enable_bitmapscan = off",
    )
    scans = [n for n in joined if "Scan" in n and "Function" not in n]
    assert scans and all(n.startswith(("Index Scan", "Index Only Scan")) for n in scans), (
        f"a run joined by id: {joined}"
    )
    # What waited on a run, released or moved since: the depends_on indexes of both tables.
    waited = _plan_nodes(
        conn, "SELECT id FROM jobs.runs_all WHERE depends_on @> ARRAY[1]::bigint[]", "enable_seqscan = off"
    )
    assert not any(n.startswith("Seq Scan") for n in waited), f"the runs that waited on run 1: {waited}"
    # The failures of one kind, newest first: the FAILED indexes of both tables.
    failed = _plan_nodes(
        conn,
        "SELECT id FROM jobs.runs_all WHERE status = 'FAILED' AND kind = 'k' ORDER BY id DESC LIMIT 5",
        "enable_seqscan = off",
    )
    history_indexes = [n.split()[-1] for n in failed if " run_history_" in n]
    parents = [
        scalar(
            conn,
            "SELECT p.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
            " JOIN pg_class AS p ON p.oid = i.inhparent WHERE c.relname = %s",
            (name,),
        )
        for name in history_indexes
    ]
    assert parents and set(parents) <= {"run_history_failed_idx", "run_history_failed_kind_idx"}, (
        f"the failures of kind k: {failed} (history through {parents})"
    )


# -- what holds across a run's whole life ------------------------------------------------------


def test_a_moved_run_is_found_by_id(conn: Conn) -> None:
    failed = finish_old(conn, 1, age="3 days", status="FAILED")[0]
    assert _archive_all(conn) == 1
    detail = one(conn, "SELECT id, status, attempts FROM jobs.run_detail(%s)", (failed,))
    assert (detail["id"], detail["status"], len(detail["attempts"])) == (failed, "FAILED", 1)
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (failed,)) == "FAILED", "cancel reports its status"
    expect_error(conn, "SELECT * FROM jobs.run_detail(%s)", (failed + 1000,), "P0002", f"run {failed + 1000}")


def test_retrying_a_moved_run_makes_one_new_attempt(conn: Conn) -> None:
    failed = finish_old(conn, 1, age="3 days", status="FAILED")[0]
    assert _archive_all(conn) == 1
    retry = one(conn, "SELECT id, attempt, retry_of, status::text FROM jobs.retry(%s)", (failed,))
    assert (retry["attempt"], retry["retry_of"], retry["status"]) == (2, failed, "QUEUED")
    expect_error(conn, "SELECT jobs.retry(%s)", (failed,), "22023", "already retried")
    chain = scalar(conn, "SELECT attempts FROM jobs.run_detail(%s)", (retry["id"],))
    assert [a["id"] for a in chain] == [failed, retry["id"]], "the chain spans history and live"


def test_a_retry_of_a_moved_run_carries_its_trace_context(conn: Conn) -> None:
    (run_id,) = finish_old(conn, 1, age="2 days", status="FAILED")
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    conn.execute(
        "UPDATE jobs.runs SET trace_context = %s WHERE id = %s", (psycopg.types.json.Jsonb(trace), run_id)
    )
    _archive_all(conn)
    assert _where(conn, run_id) == "history"
    retry = one(conn, "SELECT id, trace_context FROM jobs.retry(%s)", (run_id,))
    assert retry["trace_context"] == trace, f"the retry lost its run's trace: {retry}"


def test_retry_many_and_discard_reach_moved_runs(conn: Conn) -> None:
    a, b = finish_old(conn, 2, age="3 days", status="FAILED")
    live_failed = finish_old(conn, 1, age="1 hour", status="FAILED")[0]
    assert _archive_all(conn) == 2
    retried = [r[0] for r in conn.execute("SELECT retry_of FROM jobs.retry_many(%s)", ([a, live_failed],))]
    assert sorted(retried) == sorted([a, live_failed])
    assert scalar(conn, "SELECT count(*) FROM jobs.retry_many(%s)", ([a, live_failed],)) == 0, "retried once"
    assert scalar(conn, "SELECT jobs.discard(%s)", ([b, live_failed],)) == 2
    assert _where(conn, b) is None and _where(conn, live_failed) is None


def test_an_idempotency_key_holds_after_its_run_moved(conn: Conn) -> None:
    first = enqueue(conn, idempotency_key="'nightly-2026-01-01'")
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now() - interval '3 days',"
        " finished_at = now() - interval '3 days' WHERE id = %s",
        (first,),
    )
    assert _archive_all(conn) == 1
    again = enqueue(conn, idempotency_key="'nightly-2026-01-01'")
    assert again == first, "the key returns the moved run"
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0, "no second run, not even a stray row"


def test_a_unique_key_kept_ever_holds_after_its_run_moved(conn: Conn) -> None:
    def with_key(unique_while: str) -> int:
        return int(
            scalar(
                conn,
                "SELECT id FROM jobs.enqueue('k', unique_key => 'u', unique_while => %s)",
                (unique_while,),
            )
        )

    first = with_key("ever")
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now() - interval '3 days',"
        " finished_at = now() - interval '3 days' WHERE id = %s",
        (first,),
    )
    assert _archive_all(conn) == 1
    assert with_key("ever") == first, "'ever' still sees the moved run"
    assert with_key("active") != first, "'active' lets a new run in"


def _history_days_locked(conn: Conn) -> int:
    """How many day partitions of history this session's transaction holds a lock on."""
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM pg_locks AS l JOIN pg_inherits AS i ON i.inhrelid = l.relation"
            " WHERE l.pid = pg_backend_pid() AND i.inhparent = 'jobs.run_history'::regclass",
        )
    )


def test_the_keys_of_moved_runs_come_and_go_with_their_runs(conn: Conn) -> None:
    """jobs.run_history_keys holds the keys of exactly the keyed runs in history: an archive
    adds them, a prune that drops their day and a discard take them out; a key whose run is
    gone lets a new run in."""

    def keyed(age: str, key: str, status: str = "COMPLETED") -> int:
        return int(
            scalar(
                conn,
                "INSERT INTO jobs.runs (kind, status, started_at, finished_at, failure_reason,"
                " idempotency_key) VALUES ('k', %s, now() - %s::interval, now() - %s::interval,"
                " CASE WHEN %s = 'FAILED' THEN 'Error' END, %s) RETURNING id",
                (status, age, age, status, key),
            )
        )

    def keys() -> list[int]:
        return [r[0] for r in conn.execute("SELECT run_id FROM jobs.run_history_keys ORDER BY run_id")]

    old, recent = keyed("20 days", "old"), keyed("5 days", "recent")
    failed = keyed("3 days", "failed", status="FAILED")
    finish_old(conn, 2, age="20 days")  # runs without keys have none there
    assert _archive_all(conn) == 5
    assert keys() == [old, recent, failed]
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 3
    assert keys() == [recent, failed], "the dropped day's key went with it"
    assert scalar(conn, "SELECT jobs.discard(%s)", ([failed],)) == 1
    assert keys() == [recent]
    for key, gone in (("old", old), ("failed", failed)):
        again = scalar(conn, "SELECT id FROM jobs.enqueue('k', idempotency_key => %s)", (key,))
        assert again != gone and _where(conn, again) == "live", f"{key}: {again}"
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', idempotency_key => 'recent')") == recent


def test_a_key_holds_exactly_as_long_as_the_run_it_was_given_to_is_kept(conn: Conn) -> None:
    """What docs/operations.md promises of idempotency keys and unique keys kept 'ever': a key
    returns its run for as long as that run is kept, and once retention (or a shorter
    jobs.prune) deletes the run, the key adds a new run. A live run is never pruned, so its key
    never lapses; a run not moved to history is pruned row by row, and its key goes with it;
    a retry does not carry the idempotency key, so the key lapses with the attempt it was
    given to, also while a later attempt of its chain is kept."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)")

    def keyed(key: str, age: str | None, status: str = "COMPLETED") -> int:
        """A run of kind k with the idempotency key, finished ``age`` ago (None: still QUEUED)."""
        run_id = enqueue(conn, idempotency_key=f"'{key}'")
        if age is None:
            conn.execute(
                "UPDATE jobs.runs SET created_at = now() - interval '400 days' WHERE id = %s", (run_id,)
            )
        else:
            conn.execute(
                "UPDATE jobs.runs SET status = %s, started_at = now() - %s::interval,"
                " finished_at = now() - %s::interval,"
                " failure_reason = CASE WHEN %s = 'FAILED' THEN 'Error' END WHERE id = %s",
                (status, age, age, status, run_id),
            )
        return run_id

    def again(key: str) -> int:
        return enqueue(conn, idempotency_key=f"'{key}'")

    kept = keyed("kept", "12 days")  # within the retention of 14 days (and its day with it)
    lapsed = keyed("lapsed", "20 days")
    live = keyed("live", None)  # QUEUED, made 400 days ago
    ever = int(scalar(conn, "SELECT id FROM jobs.enqueue('k', unique_key => 'u', unique_while => 'ever')"))
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now() - interval '20 days',"
        " finished_at = now() - interval '20 days' WHERE id = %s",
        (ever,),
    )
    # A keyed first attempt that failed 20 days ago; its retry (without the key) completed today.
    chained = keyed("chained", "20 days", status="FAILED")
    retry = int(
        scalar(
            conn,
            "INSERT INTO jobs.runs (kind, status, attempt, retry_of, origin, started_at, finished_at)"
            " VALUES ('k', 'COMPLETED', 2, %s, 'retry', now(), now()) RETURNING id",
            (chained,),
        )
    )
    assert _archive_all(conn) == 4
    conn.execute("UPDATE jobs.config SET archive_after = NULL")  # the next one stays in jobs.runs
    unmoved = keyed("unmoved", "20 days")

    assert scalar(conn, "SELECT jobs.prune('14 days')") == 4
    assert [again(k) for k in ("kept", "live")] == [kept, live], "a kept run's key and a live run's key hold"
    for key, gone in (("lapsed", lapsed), ("unmoved", unmoved), ("chained", chained)):
        new = again(key)
        assert new != gone and _where(conn, new) == "live", f"{key}: the key of pruned run {gone} gave {new}"
    assert _where(conn, retry) == "live", "the retry that completed today is kept"
    new_ever = int(
        scalar(conn, "SELECT id FROM jobs.enqueue('k', unique_key => 'u', unique_while => 'ever')")
    )
    assert new_ever != ever, "a unique key kept 'ever' holds until its run is pruned, not after"


def test_enqueues_with_keys_read_at_most_the_one_day_of_history_their_run_lies_in(conn: Conn) -> None:
    """An enqueue with an idempotency key, or a unique key kept 'ever', finds a moved run of its
    key through jobs.run_history_keys and reads that run's day alone: in a history twenty days
    long it locks at most one day, and none for a key that never moved, in the caller's
    transaction (a lookup across history locked every day with its indexes)."""
    conn.execute(
        "INSERT INTO jobs.runs (kind, status, started_at, finished_at, idempotency_key, unique_key)"
        " SELECT 'k', 'COMPLETED', now() - g * interval '1 day', now() - g * interval '1 day',"
        "        'key-' || g, 'u-' || g FROM generate_series(2, 21) AS g"
    )
    moved = {r["idempotency_key"]: r["id"] for r in rows(conn, "SELECT id, idempotency_key FROM jobs.runs")}
    assert _archive_all(conn) == 20
    assert len(_partitions(conn)) >= 20
    cases = [
        ("SELECT id FROM jobs.enqueue('k', idempotency_key => 'key-5')", moved["key-5"], 1),
        ("SELECT id FROM jobs.enqueue('k', unique_key => 'u-7', unique_while => 'ever')", moved["key-7"], 1),
        ("SELECT id FROM jobs.enqueue('k', idempotency_key => 'new')", None, 0),
        ("SELECT id FROM jobs.enqueue('k', unique_key => 'u-new', unique_while => 'ever')", None, 0),
    ]
    for statement, found, days in cases:
        with conn.transaction(force_rollback=True):
            got = scalar(conn, statement)
            locked = _history_days_locked(conn)
        assert found is None or got == found, f"{statement}: run {got}, the moved run is {found}"
        assert found is not None or got not in moved.values(), f"{statement}: returned moved run {got}"
        assert locked <= days, f"{statement}: {locked} days of history locked, at most {days} needed"


def test_a_run_by_id_is_read_from_history_only_when_it_moved(conn: Conn) -> None:
    """jobs.get_run (what Client.get_run calls) finds a live or recent run in jobs.runs
    without opening a day of history, a moved run in history, and nothing for an unknown id."""
    moved = finish_old(conn, 1, age="3 days")[0]
    finish_old(conn, 1, age="5 days")
    assert _archive_all(conn) == 2
    live = enqueue(conn)
    with conn.transaction(force_rollback=True):
        assert scalar(conn, "SELECT id FROM jobs.get_run(%s)", (live,)) == live
        locked = _history_days_locked(conn)
    assert locked == 0, f"a live run's lookup locked {locked} days of history"
    found = one(
        conn, "SELECT id, status::text, finished_at IS NOT NULL AS done FROM jobs.get_run(%s)", (moved,)
    )
    assert found == {"id": moved, "status": "COMPLETED", "done": True}, found
    assert rows(conn, "SELECT * FROM jobs.get_run(0)") == []


def test_completing_and_failing_while_runs_are_blocked_read_history_only_for_moved_attempts(
    db: Database,
) -> None:
    """While a run is blocked, every completion and final failure follows its retry chain back
    to find what waits on it. A read of history locks each of its days (a year of them is
    thousands of locks a transaction: a few workers at once use up the lock table), so a chain
    that is all in jobs.runs is followed there; one that reaches into history still finds its
    moved attempts, and what waits on it is released or cancelled."""
    with db.connect(autocommit=False) as conn:
        finish_old(conn, 5, age="10 days")
        conn.execute("UPDATE jobs.runs SET finished_at = finished_at - (id || ' days')::interval")
        conn.execute("UPDATE jobs.runs SET started_at = finished_at")
        conn.execute(
            "SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)"
        )
        moved_failure = finish_old(conn, 1, age="3 days", status="FAILED")[0]
        conn.commit()
        while scalar(conn, "SELECT jobs.archive(1000)"):
            conn.commit()
        assert len(_partitions(conn)) == 6, "six days of history"
        first, second = enqueue(conn, "k"), enqueue(conn, "k")
        late_retry = int(scalar(conn, "SELECT id FROM jobs.retry(%s)", (moved_failure,)))
        waiting = [
            int(scalar(conn, "SELECT id FROM jobs.enqueue('w', depends_on => %s)", ([r],)))
            for r in (first, second, moved_failure)
        ]
        done, failing = enqueue(conn, "n"), enqueue(conn, "n")  # nothing waits on these
        conn.commit()
        assert len(rows(conn, "SELECT id FROM jobs.claim(10, 'w', '{k,n}')")) == 5
        conn.commit()

        assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (done,)) is True
        assert _history_days_locked(conn) == 0, "a completion read history"
        conn.commit()
        assert (
            scalar(conn, "SELECT status FROM jobs.fail(%s, 'w', '{E}', 'no retry')", (failing,)) == "FAILED"
        )
        assert _history_days_locked(conn) == 0, "a final failure read history"
        conn.commit()

        assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (first,)) is True
        retry = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'once')", (second,)))
        conn.commit()
        assert [r["id"] for r in rows(conn, "SELECT id FROM jobs.claim(1, 'w', '{k}')")] == [retry]
        assert scalar(conn, "SELECT status FROM jobs.fail(%s, 'w', '{E}', 'for good')", (retry,)) == "FAILED"
        # The late retry's chain starts in history: followed there, its waiting run is released.
        assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (late_retry,)) is True
        conn.commit()
        state = {
            r["id"]: (r["status"], r["blocked"])
            for r in rows(conn, "SELECT id, status, blocked FROM jobs.runs WHERE id = ANY(%s)", (waiting,))
        }
    assert state == {
        waiting[0]: ("QUEUED", False),
        waiting[1]: ("CANCELLED", False),
        waiting[2]: ("QUEUED", False),
    }


def test_a_run_may_depend_on_moved_runs(conn: Conn) -> None:
    done = finish_old(conn, 1, age="3 days")[0]
    failed = finish_old(conn, 1, age="3 days", status="FAILED")[0]
    retried = finish_old(conn, 1, age="3 days", status="FAILED")[0]
    assert _archive_all(conn) == 3
    retry = scalar(conn, "SELECT id FROM jobs.retry(%s)", (retried,))

    def dependent(deps: list[int]) -> dict[str, Any]:
        return one(
            conn,
            "SELECT id, status::text, blocked, failure_reason FROM jobs.enqueue('k', depends_on => %s)",
            (deps,),
        )

    ready = dependent([done])
    assert (ready["status"], ready["blocked"]) == ("QUEUED", False), "its dependency completed"
    cancelled = dependent([failed])
    assert (cancelled["status"], cancelled["failure_reason"]) == ("CANCELLED", "DependencyFailed")
    waiting = dependent([done, retried])
    assert waiting["blocked"], "the moved run's retry has not completed yet"
    # The retry completes: the dependent is released although its chain starts in history.
    claimed = sorted(r[0] for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')"))
    assert claimed == sorted([retry, ready["id"]]), "not the run still waiting"
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (retry,)) is True
    assert scalar(conn, "SELECT blocked FROM jobs.runs WHERE id = %s", (waiting["id"],)) is False
    assert rows(conn, "SELECT id FROM jobs.blocked") == []


def test_health_reads_the_last_success_and_failure_from_history_until_a_live_one_comes(
    conn: Conn,
) -> None:
    def_id = scalar(conn, "SELECT id FROM jobs.define('nightly', 'k', schedule => '0 2 * * *')")
    (success,) = finish_old(conn, 1, age="3 days", status="COMPLETED", definition_id=def_id)
    (failure,) = finish_old(conn, 1, age="2 days", status="FAILED", definition_id=def_id)
    finished = {
        r["id"]: r["finished_at"]
        for r in rows(conn, "SELECT id, finished_at FROM jobs.runs WHERE id IN (%s, %s)", (success, failure))
    }
    assert _archive_all(conn) == 2
    query = """SELECT last_success_at, last_failure_at, last_status::text, last_finished_at,
                      consecutive_failures
                 FROM jobs.definition_health WHERE id = %s"""
    assert one(conn, query, (def_id,)) == {
        "last_success_at": finished[success],
        "last_failure_at": finished[failure],
        "last_status": "FAILED",
        "last_finished_at": finished[failure],
        "consecutive_failures": 1,
    }, "all of it from history"
    (live,) = finish_old(conn, 1, age="1 hour", status="COMPLETED", definition_id=def_id)
    live_at = scalar(conn, "SELECT finished_at FROM jobs.runs WHERE id = %s", (live,))
    assert one(conn, query, (def_id,)) == {
        "last_success_at": live_at,
        "last_failure_at": finished[failure],
        "last_status": "COMPLETED",
        "last_finished_at": live_at,
        "consecutive_failures": 0,
    }, "the live success is newer than history's"


def test_health_reads_the_last_outcome_of_one_run_from_history_past_unfinished_live_runs(
    conn: Conn,
) -> None:
    """Runs still queued or running in jobs.runs are no outcome: last_status and
    last_finished_at are then both the newest moved run's, never a mix of two runs."""
    def_id = scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => '0 * * * *')")
    finish_old(conn, 1, age="3 days", status="FAILED", definition_id=def_id)
    (newest,) = finish_old(conn, 1, age="2 days", status="COMPLETED", definition_id=def_id)
    newest_at = scalar(conn, "SELECT finished_at FROM jobs.runs WHERE id = %s", (newest,))
    assert _archive_all(conn) == 2
    queued = enqueue(conn, "k")
    running = enqueue(conn, "k")
    conn.execute("UPDATE jobs.runs SET definition_id = %s WHERE id IN (%s, %s)", (def_id, queued, running))
    conn.execute(
        "UPDATE jobs.runs SET status = 'RUNNING', started_at = now(), worker = 'w' WHERE id = %s", (running,)
    )
    query = "SELECT last_status::text, last_finished_at FROM jobs.definition_health WHERE id = %s"
    assert one(conn, query, (def_id,)) == {"last_status": "COMPLETED", "last_finished_at": newest_at}


def test_a_failure_streak_that_reaches_into_history_pauses_the_definition(conn: Conn) -> None:
    def_id = scalar(
        conn,
        "SELECT id FROM jobs.define('daily', 'k', schedule => '0 3 * * *', pause_after_failures => 3)",
    )
    finish_old(conn, 2, age="3 days", status="FAILED", definition_id=def_id)
    assert _archive_all(conn) == 2
    health = one(
        conn,
        "SELECT last_status::text, consecutive_failures FROM jobs.definition_health WHERE id = %s",
        (def_id,),
    )
    assert health == {"last_status": "FAILED", "consecutive_failures": 2}, "health reads the moved runs"
    run_id = enqueue(conn, "k")
    conn.execute("UPDATE jobs.runs SET definition_id = %s, max_attempts = 1 WHERE id = %s", (def_id, run_id))
    assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')")] == [run_id]
    conn.execute("SELECT jobs.fail(%s, 'w', ARRAY['Boom'], 'third failure')", (run_id,))
    assert scalar(conn, "SELECT enabled FROM jobs.definitions WHERE id = %s", (def_id,)) is False, (
        "two failures in history and one live make three"
    )


def test_a_backfill_skips_occurrences_whose_runs_moved(conn: Conn) -> None:
    def_id = scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => '0 * * * *')")
    occurrence = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=3)
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for, occurrence_at, status,"
        " started_at, finished_at) VALUES (%s, 'k', 'schedule', %s, %s, 'COMPLETED', %s, %s)",
        (def_id, occurrence, occurrence, occurrence, occurrence + timedelta(seconds=1)),
    )
    assert _archive_all(conn) == 1
    request = scalar(
        conn,
        "SELECT id FROM jobs.backfill('hourly', %s, %s)",
        (occurrence - timedelta(hours=1), occurrence + timedelta(hours=1)),
    )
    made = scalar(
        conn,
        "SELECT jobs.finish_backfill(%s, %s)",
        (request, [occurrence - timedelta(hours=1), occurrence, occurrence + timedelta(hours=1)]),
    )
    assert made == 2, "the occurrence that ran (its run now in history) is not run again"
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM jobs.runs_all WHERE definition_id = %s AND occurrence_at = %s",
            (def_id, occurrence),
        )
        == 1
    )


def _archived_occurrence(
    conn: Conn, def_id: int, occurrence: datetime, *, cancelled_early: bool = False
) -> None:
    """A scheduled run of ``occurrence`` that finished (or, cancelled while it waited, ended
    a minute before its occurrence) and moved to history."""
    finished = occurrence - timedelta(minutes=1) if cancelled_early else occurrence + timedelta(seconds=1)
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for, occurrence_at, status,"
        " started_at, finished_at) VALUES (%s, 'k', 'schedule', %s, %s, %s, %s, %s)",
        (
            def_id,
            occurrence,
            occurrence,
            "CANCELLED" if cancelled_early else "COMPLETED",
            None if cancelled_early else occurrence,
            finished,
        ),
    )
    assert _archive_all(conn) == 1


def _assert_one_run_each(conn: Conn, def_id: int, times: list[datetime]) -> None:
    """The definition has exactly one run (live or moved) of each of these occurrences."""
    counts = rows(
        conn,
        "SELECT occurrence_at, count(*) AS n FROM jobs.runs_all WHERE definition_id = %s"
        " GROUP BY 1 ORDER BY 1",
        (def_id,),
    )
    assert [(r["occurrence_at"], r["n"]) for r in counts] == [(t, 1) for t in times], counts


@pytest.mark.parametrize("call", ["materialize_many", "materialize"])
def test_the_scheduler_does_not_make_again_an_occurrence_whose_run_moved(conn: Conn, call: str) -> None:
    """A window backfilled ahead of a cursor left behind by a downtime, run and archived before
    the scheduler came back: its catch-up walks those occurrences again, and both of the
    scheduler's statements leave out the ones whose runs are in history."""
    def_id = scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => '0 * * * *')")
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=3)
    ran, early = base + timedelta(hours=1), base + timedelta(hours=2)
    _archived_occurrence(conn, def_id, ran)
    _archived_occurrence(conn, def_id, early, cancelled_early=True)
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (base, def_id))
    times = [base + timedelta(hours=h) for h in range(4)]
    cursor = base + timedelta(hours=4)
    if call == "materialize_many":
        made = scalar(
            conn,
            "SELECT created FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
            ([def_id], [base], [cursor], [None], [def_id] * 4, times),
        )
    else:
        made = scalar(conn, "SELECT jobs.materialize(%s, %s, %s, %s)", (def_id, base, times, cursor))
    assert made == 2, "the two occurrences whose runs are in history are not made again"
    _assert_one_run_each(conn, def_id, times)
    assert scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (def_id,)) == cursor


@pytest.mark.parametrize("call", ["materialize_many", "materialize"])
def test_an_occurrence_whose_run_moves_while_the_scheduler_catches_up_is_made_once(
    db: Database, conn: Conn, call: str
) -> None:
    """An operator's jobs.archive moves the run of a backfilled occurrence while the
    scheduler's catch-up walks that occurrence again: the catch-up waits for the move to
    commit, then finds the run in history and leaves the occurrence out."""
    def_id = scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => '0 * * * *')")
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=3)
    ran = base + timedelta(hours=1)
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for, occurrence_at, status,"
        " started_at, finished_at) VALUES (%s, 'k', 'schedule', %s, %s, 'COMPLETED', %s, %s)",
        (def_id, ran, ran, ran, ran + timedelta(seconds=1)),
    )
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (base, def_id))
    times = [base + timedelta(hours=h) for h in range(3)]
    cursor = base + timedelta(hours=3)
    with db.connect(autocommit=False) as archiver, db.connect() as scheduler:
        assert scalar(archiver, "SELECT jobs.archive(1000)") == 1
        if call == "materialize_many":
            statement = "SELECT created FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)"
            args: tuple[Any, ...] = ([def_id], [base], [cursor], [None], [def_id] * 3, times)
        else:
            statement = "SELECT jobs.materialize(%s, %s, %s, %s)"
            args = (def_id, base, times, cursor)
        catch_up = BlockedCall(
            conn, scheduler, lambda: scalar(scheduler, statement, args), "the catch-up waits for the move"
        )
        archiver.commit()
        outcome = catch_up.join(timeout=60)
    assert outcome == [2], f"two occurrences made, the moved one left out: {outcome}"
    _assert_one_run_each(conn, def_id, times)


def test_only_a_past_occurrence_is_looked_up_in_history(conn: Conn) -> None:
    """The scheduler's usual runs are materialized ahead of their occurrence: those inserts read
    nothing of history. A past occurrence reads it (scans counted in this transaction)."""
    def_id = scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => '0 * * * *')")
    archived = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=3)
    _archived_occurrence(conn, def_id, archived)

    def history_scans(occurrence: datetime) -> tuple[bool, int]:
        with conn.transaction():
            count = (
                "SELECT coalesce(sum(coalesce(s.seq_scan, 0) + coalesce(s.idx_scan, 0)), 0) AS n"
                " FROM pg_stat_xact_user_tables AS s JOIN pg_inherits AS i ON i.inhrelid = s.relid"
                " WHERE i.inhparent = 'jobs.run_history'::regclass"
            )
            before = scalar(conn, count)
            found = scalar(conn, "SELECT jobs._archived_occurrence(%s, %s)", (def_id, occurrence))
            return bool(found), int(scalar(conn, count) - before)

    assert history_scans(datetime.now(UTC) + timedelta(minutes=1)) == (False, 0)
    found, scans = history_scans(archived)
    assert found and scans > 0, (found, scans)


# -- under concurrency ---------------------------------------------------------------------------

KEYS = 60


def _archiver(dsn: str, seconds: float) -> int:
    with gated(dsn) as conn:
        moved = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            moved += int(scalar(conn, "SELECT jobs.archive(7)"))
            # Age what was just completed so the next batches keep finding runs to move.
            conn.execute(
                "UPDATE jobs.runs SET finished_at = finished_at - interval '2 days'"
                " WHERE finished_at > now() - interval '1 day'"
            )
        return moved


def _backlog_archiver(dsn: str) -> tuple[int, list[str]]:
    """jobs.archive(5) until it finds nothing; what it moved and the errors it met."""
    moved, errors = 0, []
    with gated(dsn) as conn:
        while True:
            try:
                n = int(scalar(conn, "SELECT jobs.archive(5)"))
            except psycopg.Error as exc:
                errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
                continue
            if n == 0:
                return moved, errors
            moved += n


def test_archives_at_once_move_a_backlog_of_many_days_without_errors(db: Database, conn: Conn) -> None:
    """The leader and an operator (operations.md: jobs.archive by hand) move a backlog at once:
    each new day is made once, whichever session needs it first, and neither fails (a day
    made meanwhile, or two sessions each making a day and waiting for the other's)."""
    conn.execute(
        "INSERT INTO jobs.runs (kind, status, scheduled_for, created_at, started_at, finished_at, worker)"
        " SELECT 'k', 'COMPLETED', t - interval '1 minute', t - interval '1 minute', t, t, 'w'"
        "   FROM (SELECT now() - interval '2 days' - g * interval '7 hours' AS t"
        "           FROM generate_series(1, 600) AS g) AS s"
    )
    results = race_parts(db.dsn, [(_backlog_archiver, (db.dsn,)) for _ in range(3)])
    errors = [e for _, part in results for e in part]
    assert errors == [], f"{len(errors)} archive calls failed, first: {errors[:3]}"
    assert sum(moved for moved, _ in results) == 600
    assert scalar(conn, "SELECT count(*) FROM jobs.run_history") == 600
    assert len(_partitions(conn)) == scalar(
        conn, "SELECT count(DISTINCT (finished_at AT TIME ZONE 'UTC')::date) FROM jobs.run_history"
    )


#: How each keyed race enqueues: an idempotency key, or a unique key kept 'ever'.
KEYED = {
    "idempotency_key": "SELECT id FROM jobs.enqueue('k', idempotency_key => %s)",
    "unique_key": "SELECT id FROM jobs.enqueue('k', unique_key => %s, unique_while => 'ever')",
}


def _keyed_enqueuer(dsn: str, seconds: float, offset: int, column: str) -> list[tuple[str, int]]:
    got: list[tuple[str, int]] = []
    with gated(dsn) as conn:
        deadline = time.monotonic() + seconds
        i = offset
        while time.monotonic() < deadline:
            key = f"key-{i % KEYS}"
            run_id = int(scalar(conn, KEYED[column], (key,)))
            got.append((key, run_id))
            # Finish it at once, so it becomes movable while others enqueue the same key.
            conn.execute(
                "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now(), finished_at = now()"
                " WHERE id = %s AND status = 'QUEUED'",
                (run_id,),
            )
            i += 7
    return got


@pytest.mark.parametrize("column", sorted(KEYED))
def test_keys_hold_while_their_runs_move_to_history(db: Database, conn: Conn, column: str) -> None:
    """An idempotency key, and a unique key kept 'ever', give one run per key while the
    runs of those keys finish and move to history under concurrent enqueues."""
    seconds = 8.0
    results = race_parts(
        db.dsn,
        [
            (_archiver, (db.dsn, seconds)),
            (_keyed_enqueuer, (db.dsn, seconds, 0, column)),
            (_keyed_enqueuer, (db.dsn, seconds, 3, column)),
            (_keyed_enqueuer, (db.dsn, seconds, 5, column)),
        ],
    )
    moved = results[0]
    calls = [pair for part in results[1:] for pair in part]
    assert moved > 0, "the archiver moved runs while keys were enqueued"
    dupes = rows(
        conn,
        f"SELECT {column} AS key, array_agg(id ORDER BY id) AS ids FROM jobs.runs_all"
        f" GROUP BY {column} HAVING count(*) > 1",
    )
    assert dupes == [], f"keys with more than one run ({len(dupes)}), first: {dupes[:3]}"
    answer: dict[str, set[int]] = {}
    for key, run_id in calls:
        answer.setdefault(key, set()).add(run_id)
    assert {k: v for k, v in answer.items() if len(v) > 1} == {}, "every call for a key returned the same run"
    lost = [run_id for _, run_id in calls if _where(conn, run_id) is None]
    assert lost == [], f"runs returned to callers that exist nowhere: {lost[:10]}"


def _dependency_maker(dsn: str, seconds: float, seed: int) -> int:
    """Enqueue a run, enqueue a dependent on it and on an older run (most likely moved by
    now), finish a run of kind 'dep' (completed or failed for good, alternately), and one
    more dependent after that; the dependents (kind 'child') are never claimed."""
    made = 0
    with gated(dsn) as conn:
        deadline = time.monotonic() + seconds
        older: list[int] = []
        i = seed
        while time.monotonic() < deadline:
            dep = int(scalar(conn, "SELECT id FROM jobs.enqueue('dep', max_attempts => 1)"))
            deps = [dep] + ([older[(i * 7) % len(older)]] if older else [])
            conn.execute("SELECT jobs.enqueue('child', depends_on => %s)", (deps,))
            claimed = scalar(conn, "SELECT id FROM jobs.claim(1, %s, ARRAY['dep'])", (f"w{seed}",))
            if claimed is not None:
                if i % 3:
                    conn.execute("SELECT jobs.complete(%s, %s)", (claimed, f"w{seed}"))
                else:
                    conn.execute("SELECT jobs.fail(%s, %s, ARRAY['Boom'], 'no')", (claimed, f"w{seed}"))
            conn.execute("SELECT jobs.enqueue('child', depends_on => %s)", ([dep],))
            older.append(dep)
            made += 2
            i += 1
    return made


def test_dependencies_hold_while_their_runs_move_to_history(db: Database, conn: Conn) -> None:
    """Dependents enqueued, released and cancelled while the runs they wait on finish and
    move to history: from the final rows, every dependent is QUEUED and released when every
    chain it waits on completed, cancelled (DependencyFailed) when one failed, and still
    blocked otherwise."""
    seconds = 8.0
    results = race_parts(
        db.dsn,
        [
            (_archiver, (db.dsn, seconds)),
            (_dependency_maker, (db.dsn, seconds, 1)),
            (_dependency_maker, (db.dsn, seconds, 2)),
            (_dependency_maker, (db.dsn, seconds, 3)),
        ],
    )
    assert results[0] > 0, "the archiver moved runs while dependents were enqueued"
    assert sum(results[1:]) > 0
    every = {
        r["id"]: r
        for r in rows(
            conn,
            "SELECT id, kind, status::text, retry_of, blocked, failure_reason, depends_on FROM jobs.runs_all",
        )
    }
    last: dict[int, str] = {}  # chain root -> status of its last attempt (no retries here: max_attempts 1)
    for run in every.values():
        if run["kind"] == "dep":
            assert run["retry_of"] is None, f"a retry of a run with max_attempts 1: {run}"
            last[run["id"]] = run["status"]
    wrong = []
    for run in every.values():
        if run["kind"] != "child":
            continue
        states = [last[d] for d in run["depends_on"]]
        expected: tuple[str, bool, str | None]
        if "FAILED" in states or "CANCELLED" in states:
            expected = ("CANCELLED", False, "DependencyFailed")
        elif all(s == "COMPLETED" for s in states):
            expected = ("QUEUED", False, None)
        else:
            expected = ("QUEUED", True, None)
        got = (run["status"], run["blocked"], run["failure_reason"])
        if got != expected:
            wrong.append(
                {
                    "run": run["id"],
                    "depends_on": dict(zip(run["depends_on"], states, strict=True)),
                    "got": got,
                }
            )
    assert wrong == [], f"dependents in the wrong state ({len(wrong)}): {wrong[:10]}"
    assert scalar(conn, "SELECT count(*) FROM jobs.run_history WHERE kind = 'dep'") > 0, (
        "runs that dependents wait on were moved while the race went on"
    )


def test_history_is_readable_by_the_reader_role_and_archive_needs_the_operator(db: Database) -> None:
    with db.connect() as conn:
        finish_old(conn, 1, age="3 days")
        _archive_all(conn)
        conn.execute("SET ROLE jobs_reader")
        assert scalar(conn, "SELECT count(*) FROM jobs.runs_all") == 1
        assert scalar(conn, "SELECT count(*) FROM jobs.run_history") == 1
        try:
            conn.execute("SELECT jobs.archive()")
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:
            raise AssertionError("a reader could move runs")


def test_a_moved_run_holding_a_blank_key_from_before_is_refused_naming_the_key(conn: Conn) -> None:
    """History is not checked for blank keys (the upgrade left those written before as they
    were), but a run read back from it is a row of jobs.runs, whose keys refuse them: reading,
    cancelling or retrying such a run says which key of which run is blank and how to clear it
    (22023), not the domain's bare constraint; once cleared, it is read and retried."""
    (run_id,) = finish_old(conn, 1, age="3 days", status="FAILED")
    conn.execute("UPDATE jobs.runs SET idempotency_key = 'order-1' WHERE id = %s", (run_id,))
    kind = scalar(conn, "SELECT kind FROM jobs.runs WHERE id = %s", (run_id,))
    assert _archive_all(conn) == 1
    conn.execute("UPDATE jobs.run_history SET concurrency_key = '  ' WHERE id = %s", (run_id,))
    said = f"run {run_id} (in history) holds a blank concurrency_key"
    for call in (
        "SELECT * FROM jobs.get_run(%s)",
        "SELECT * FROM jobs.run_detail(%s)",
        "SELECT jobs.retry(%s)",
        "SELECT jobs.cancel(%s)",
        "SELECT * FROM jobs.retry_many(ARRAY[%s])",
    ):
        expect_error(conn, call, (run_id,), "22023", said)
    expect_error(conn, "SELECT jobs.enqueue(%s, idempotency_key => 'order-1')", (kind,), "22023", said)
    conn.execute("UPDATE jobs.run_history SET concurrency_key = NULL WHERE id = %s", (run_id,))
    assert scalar(conn, "SELECT id FROM jobs.get_run(%s)", (run_id,)) == run_id
    assert scalar(conn, "SELECT retry_of FROM jobs.retry(%s)", (run_id,)) == run_id


def test_two_prunes_at_once_each_pass_over_the_day_the_other_dropped(db: Database, conn: Conn) -> None:
    """The leader's hourly prune and an operator's `pgtick prune` list the days to drop before
    they lock them: a day that the other prune dropped and committed while this one waited for
    its lock is gone, not an error (it was named by a number, a syntax error)."""
    for attempt in range(5):
        finish_old(conn, 2, age="30 days")
        assert _archive_all(conn) == 2
        with db.connect(autocommit=False) as first, db.connect() as second:
            assert scalar(first, "SELECT jobs.prune('14 days')") == 2  # dropped, not committed
            pruning = BlockedCall(
                conn,
                second,
                lambda: scalar(second, "SELECT jobs.prune('14 days')"),
                "the second prune to wait",
            )
            first.commit()  # within the half second the second prune waits for a day
            outcome = pruning.join(90)
        assert outcome == [0], f"attempt {attempt}: the second prune failed: {outcome}"
        assert _partitions(conn) == []


def test_a_dry_run_counts_past_a_day_that_a_prune_drops_meanwhile(db: Database, conn: Conn) -> None:
    """`pgtick prune --dry-run` while the leader prunes: a day dropped while the count waited
    for it counts as nothing left, not an error."""
    finish_old(conn, 2, age="30 days")
    finish_old(conn, 1, age="20 days")
    assert _archive_all(conn) == 3
    with db.connect(autocommit=False) as pruner, db.connect() as counter:
        assert scalar(pruner, "SELECT jobs.prune('25 days')") == 2  # the oldest day, not committed
        counting = BlockedCall(
            conn, counter, lambda: scalar(counter, "SELECT jobs.prune_count('14 days')"), "the count to wait"
        )
        pruner.commit()
        outcome = counting.join(90)
    assert outcome == [1], f"the count failed or is wrong: {outcome}"


def test_retention_and_archive_after_are_elapsed_time_whatever_the_sessions_time_zone(conn: Conn) -> None:
    """A run finished 23 hours 30 minutes ago is younger than a day for every caller. In a
    session whose zone sprang forward during that day, now() - interval '1 day' is only 23
    hours back: read that way, the prune deleted the run (and freed its idempotency key, so
    the job ran again) and the archive moved it early."""
    young = enqueue(conn, "k", idempotency_key="'pay-1'")
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now() - interval '1 day',"
        " finished_at = now() - interval '23 hours 30 minutes' WHERE id = %s",
        (young,),
    )
    zone = spring_forward_zone(conn)
    conn.execute(f"SET TIME ZONE '{zone}'")
    assert scalar(conn, "SELECT jobs.archive()") == 0, (
        f"zone {zone}: the archive moved a run finished 23.5 h ago"
    )
    assert scalar(conn, "SELECT jobs.prune_count('1 day')") == 0
    assert scalar(conn, "SELECT jobs.prune('1 day')") == 0, f"zone {zone}: pruned a run finished 23.5 h ago"
    assert _where(conn, young) == "live"
    assert enqueue(conn, "k", idempotency_key="'pay-1'") == young, "its key still holds"
    # 24 hours and more back is older than a day, in any zone.
    conn.execute(
        "UPDATE jobs.runs SET finished_at = now() - interval '24 hours 1 second' WHERE id = %s", (young,)
    )
    assert scalar(conn, "SELECT jobs.prune_count('1 day')") == 1
    assert scalar(conn, "SELECT jobs.archive()") == 1
    conn.execute("SET TIME ZONE 'UTC'")
