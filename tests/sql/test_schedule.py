"""Operator functions: jobs.cancel_queued, jobs.retry, jobs.prune, jobs.pause / jobs.resume,
and pruning by the leader's tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from harness import Conn, claim, expect_error, one, rows, scalar

# -- jobs.cancel_queued --------------------------------------------------------------------


# -- jobs.retry ----------------------------------------------------------------------------


# -- jobs.prune ----------------------------------------------------------------------------


# -- jobs.pause / jobs.resume --------------------------------------------------------------


def test_pause_stops_materialization_and_resume_restarts_after_now(conn: Conn) -> None:
    def_id = int(scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => 'FREQ=HOURLY')"))
    cursor = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    assert scalar(conn, "SELECT jobs.materialize(%s, NULL, '{}', %s)", (def_id, cursor)) == 0
    first = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
        (def_id, cursor, cursor, cursor + timedelta(hours=1)),
    )
    assert first == 1
    cursor += timedelta(hours=1)
    queued = scalar(conn, "SELECT id FROM jobs.runs WHERE definition_id = %s", (def_id,))

    paused = one(conn, "SELECT * FROM jobs.pause('hourly')")
    assert paused["enabled"] is False and paused["next_run_at"] == cursor
    assert scalar(conn, "SELECT paused FROM jobs.definition_health WHERE id = %s", (def_id,)) is True
    missed = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
        (def_id, cursor, cursor, cursor + timedelta(hours=1)),
    )
    assert missed == 0, "a paused definition materializes nothing"
    assert claim(conn, "w") == [queued], "runs queued before the pause still run"
    assert one(conn, "SELECT * FROM jobs.pause('hourly')")["enabled"] is False, "pausing twice is fine"

    revision = scalar(conn, "SELECT revision FROM jobs.definitions WHERE id = %s", (def_id,))
    resumed = one(conn, "SELECT * FROM jobs.resume('hourly')")
    assert resumed["enabled"] is True
    assert resumed["next_run_at"] is None, "the paused window is not caught up: the cursor restarts"
    assert resumed["revision"] == revision + 1, "a stale leader's compare-and-set now fails"
    again = one(conn, "SELECT * FROM jobs.resume('hourly')")
    assert (again["revision"], again["next_run_at"]) == (revision + 1, None), "resuming twice is a no-op"


def test_resume_keeps_a_one_shots_time(conn: Conn) -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    conn.execute("SELECT jobs.define('later', 'k', run_at => %s)", (at,))
    conn.execute("SELECT jobs.pause('later')")
    assert one(conn, "SELECT * FROM jobs.resume('later')")["next_run_at"] == at


def test_pause_and_resume_unknown_definition(conn: Conn) -> None:
    expect_error(conn, "SELECT jobs.pause('ghost')", None, "P0002", "ghost")
    expect_error(conn, "SELECT jobs.resume('ghost')", None, "P0002", "ghost")
    assert rows(conn, "SELECT * FROM jobs.definitions") == []
