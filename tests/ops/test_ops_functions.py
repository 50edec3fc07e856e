"""Operator functions: jobs.cancel_queued, jobs.retry, jobs.prune, jobs.pause / jobs.resume,
and pruning by the leader's tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ops_support import Conn, claim, enqueue, expect_error, finish_old, one, rows, run_row, scalar

from harness import Database
from pgtick.scheduler import Scheduler

# -- jobs.cancel_queued --------------------------------------------------------------------


def test_cancel_queued_cancels_only_the_definitions_queued_runs(conn: Conn) -> None:
    conn.execute("SELECT jobs.define('target', 'k', run_at => now() + interval '1 day')")
    conn.execute("SELECT jobs.define('bystander', 'k', run_at => now() + interval '1 day')")
    target = [int(scalar(conn, "SELECT id FROM jobs.run_now('target')")) for _ in range(5)]
    bystander = int(scalar(conn, "SELECT id FROM jobs.run_now('bystander')"))
    adhoc = enqueue(conn, "k")
    running, done = claim(conn, "w", batch=2)  # the two oldest target runs
    assert (running, done) == (target[0], target[1])
    conn.execute("SELECT jobs.complete(%s, 'w')", (done,))

    assert scalar(conn, "SELECT jobs.cancel_queued('target')") == 3
    for run_id in target[2:]:
        row = run_row(conn, run_id)
        assert (row["status"], row["cancel_requested"]) == ("CANCELLED", True)
        assert row["finished_at"] is not None and row["worker"] is None
    assert run_row(conn, running)["status"] == "RUNNING", "a running run is not touched"
    assert run_row(conn, running)["cancel_requested"] is False
    assert run_row(conn, done)["status"] == "COMPLETED"
    assert run_row(conn, bystander)["status"] == "QUEUED"
    assert run_row(conn, adhoc)["status"] == "QUEUED"
    assert scalar(conn, "SELECT jobs.cancel_queued('target')") == 0, "nothing left: 0, no error"


def test_cancel_queued_unknown_definition_is_not_found(conn: Conn) -> None:
    expect_error(conn, "SELECT jobs.cancel_queued('nope')", None, "P0002", "nope")
    expect_error(conn, "SELECT jobs.cancel_queued(NULL)", None, "P0002")


# -- jobs.retry ----------------------------------------------------------------------------


def _failed(conn: Conn, kind: str = "k") -> int:
    run_id = enqueue(conn, kind, payload='{"n": 7}')
    assert claim(conn, "w", kinds=[kind]) == [run_id]
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'it broke')", (run_id,))
    assert run_row(conn, run_id)["status"] == "FAILED"
    return run_id


def test_retry_queues_a_new_attempt_row_now(conn: Conn) -> None:
    failed = _failed(conn)
    before = run_row(conn, failed)
    new = one(conn, "SELECT * FROM jobs.retry(%s)", (failed,))
    assert new["id"] != failed
    assert (new["status"], new["attempt"], new["retry_of"], new["origin"]) == ("QUEUED", 2, failed, "retry")
    assert (new["kind"], new["payload"]) == ("k", {"n": 7})
    assert new["scheduled_for"] <= scalar(conn, "SELECT now()"), "due at once, no backoff"
    assert run_row(conn, failed) == before, "the failed attempt keeps its row, error and reason"
    assert claim(conn, "w2") == [new["id"]]
    conn.execute("SELECT jobs.fail(%s, 'w2', '{Boom}', 'again')", (new["id"],))
    third = one(conn, "SELECT * FROM jobs.retry(%s)", (new["id"],))
    assert (third["attempt"], third["retry_of"]) == (3, new["id"])


def test_retry_of_a_cancelled_run(conn: Conn) -> None:
    run_id = enqueue(conn)
    conn.execute("SELECT jobs.cancel(%s)", (run_id,))
    new = one(conn, "SELECT * FROM jobs.retry(%s)", (run_id,))
    assert (new["status"], new["attempt"], new["retry_of"]) == ("QUEUED", 2, run_id)


def test_retry_refuses_live_and_completed_runs(conn: Conn) -> None:
    running = enqueue(conn)
    completed = enqueue(conn)
    assert claim(conn, "w", batch=2) == [running, completed]
    conn.execute("SELECT jobs.complete(%s, 'w')", (completed,))
    queued = enqueue(conn)
    count = scalar(conn, "SELECT count(*) FROM jobs.runs")
    for run_id, status in [(queued, "QUEUED"), (running, "RUNNING"), (completed, "COMPLETED")]:
        assert run_row(conn, run_id)["status"] == status
        expect_error(conn, "SELECT jobs.retry(%s)", (run_id,), "22023", status, str(run_id))
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == count, "a refused retry inserts nothing"
    expect_error(conn, "SELECT jobs.retry(%s)", (987654,), "P0002", "987654")
    expect_error(conn, "SELECT jobs.retry(NULL)", None, "22023")


def test_retry_twice_is_refused(conn: Conn) -> None:
    failed = _failed(conn)
    first = scalar(conn, "SELECT id FROM jobs.retry(%s)", (failed,))
    expect_error(conn, "SELECT jobs.retry(%s)", (failed,), "22023", "already retried", str(first))
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (failed,)) == 1


def test_retry_is_refused_when_the_policy_already_retried(conn: Conn) -> None:
    conn.execute("SELECT jobs.set_retry_policy('auto', max_attempts => 3, backoff_initial => '1 hour')")
    failed = _failed(conn, "auto")
    auto = scalar(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", (failed,))
    assert auto is not None, "the policy queued attempt 2"
    expect_error(conn, "SELECT jobs.retry(%s)", (failed,), "22023", "already retried", str(auto))


# -- jobs.prune ----------------------------------------------------------------------------


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
    expect_error(conn, "SELECT jobs.prune('-1 day')", None, "22023", "negative")
    expect_error(conn, "SELECT jobs.prune('1 day', 0)", None, "22023", "batch_size")
    expect_error(conn, "SELECT jobs.prune('1 day', NULL)", None, "22023", "batch_size")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1


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
