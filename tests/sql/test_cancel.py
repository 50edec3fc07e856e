"""jobs.cancel / acknowledge_cancel / cancel_queued: stopping queued and running work."""

from __future__ import annotations

import threading
import time
from typing import Any

from harness import (
    Conn,
    Database,
    add_definition,
    add_runs,
    claim,
    digest,
    enqueue,
    expect_error,
    run_row,
    scalar,
)


def test_cancel_queued_run_is_cancelled_at_once(conn: Conn) -> None:
    run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('k')"))
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "CANCELLED"
    row = run_row(conn, run_id)
    assert row["status"] == "CANCELLED" and row["finished_at"] is not None
    assert row["failure_reason"] is None and row["worker"] is None
    assert conn.execute("SELECT * FROM jobs.claim(10, 'w')").fetchall() == [], "never claimed"


def test_a_cancelled_run_waits_on_nothing(conn: Conn) -> None:
    """A blocked run cancelled before its dependency ends is no longer counted as waiting
    (completions skip the dependency work when nothing is blocked)."""
    dependency = int(scalar(conn, "SELECT id FROM jobs.enqueue('k')"))
    waiting = int(scalar(conn, "SELECT id FROM jobs.enqueue('w', depends_on => %s)", ([dependency],)))
    assert run_row(conn, waiting)["blocked"] is True
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (waiting,)) == "CANCELLED"
    assert run_row(conn, waiting)["blocked"] is False
    assert scalar(conn, "SELECT count(*) FROM jobs.blocked") == 0


def test_cancel_running_run_is_cooperative(conn: Conn) -> None:
    """RUNNING -> cancel_requested, delivered in the heartbeat answer; the owner acknowledges at
    a checkpoint and the run becomes CANCELLED. Only the owner can acknowledge."""
    run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('k')"))
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(run_id,)]
    beat = conn.execute("SELECT * FROM jobs.heartbeat(ARRAY[%s]::bigint[], 'w1')", (run_id,))
    assert beat.fetchall() == [(run_id, False)]

    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "RUNNING"
    row = run_row(conn, run_id)
    assert (row["status"], row["cancel_requested"], row["finished_at"]) == ("RUNNING", True, None)
    beat = conn.execute("SELECT * FROM jobs.heartbeat(ARRAY[%s]::bigint[], 'w1')", (run_id,))
    assert beat.fetchall() == [(run_id, True)], "the worker learns of it from its heartbeat"
    # Cancelling again is harmless and says where things stand.
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "RUNNING"

    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w2')", (run_id,)) is False
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w1', 'stopped')", (run_id,)) is True
    row = run_row(conn, run_id)
    assert (row["status"], row["error"]) == ("CANCELLED", "stopped")
    assert row["finished_at"] is not None
    # Sent again (its answer lost with the connection): acknowledged, nothing changes.
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w1', 'again')", (run_id,)) is True
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w2')", (run_id,)) is False
    assert run_row(conn, run_id) == row
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (run_id,)) is False, "now fenced"
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "CANCELLED"


def test_acknowledge_without_a_request_is_refused(conn: Conn) -> None:
    run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('k')"))
    conn.execute("SELECT jobs.claim(1, 'w1')")
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w1')", (run_id,)) is False
    assert run_row(conn, run_id)["status"] == "RUNNING"


def test_cancel_finished_run_changes_nothing(conn: Conn) -> None:
    run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('k')"))
    conn.execute("SELECT jobs.claim(1, 'w1')")
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (run_id,)) is True
    before = digest(conn)
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "COMPLETED"
    assert digest(conn) == before


def test_cancel_unknown_run_is_not_found(conn: Conn) -> None:
    before = digest(conn)
    expect_error(conn, "SELECT jobs.cancel(%s)", (424242,), "P0002", "424242")
    expect_error(conn, "SELECT jobs.cancel(NULL)", None, "22023", "run_id")
    assert digest(conn) == before


def test_cancel_queued_of_a_definition(conn: Conn) -> None:
    def_id = add_definition(conn, "nightly")
    ids = add_runs(conn, 4, kind="nightly", definition_id=def_id)
    other = add_runs(conn, 1, kind="other")
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(ids[0],)]
    assert scalar(conn, "SELECT jobs.cancel_queued('nightly')") == 3
    states = dict(conn.execute("SELECT id, status::text FROM jobs.runs").fetchall())
    assert [states[i] for i in ids] == ["RUNNING", "CANCELLED", "CANCELLED", "CANCELLED"]
    assert states[other[0]] == "QUEUED"
    expect_error(conn, "SELECT jobs.cancel_queued('nope')", None, "P0002", "nope")


def _wait_until_blocked(conn: Conn, thread: threading.Thread) -> None:
    """Until some session of this database waits on a lock (or the thread is done; 5 s max)."""
    deadline = time.monotonic() + 5
    while thread.is_alive() and time.monotonic() < deadline:
        waiting = scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        if waiting:
            return
        time.sleep(0.01)


def test_cancel_queued_does_not_miss_rows_a_claimer_is_looking_at(db: Database, conn: Conn) -> None:
    """A claimer locks a pool of QUEUED rows while it decides; rows of a definition at its cap
    stay QUEUED. cancel_queued (and so undefine) must still cancel them once the claimer is
    done, not skip them and leave runs of a deleted definition queued (and then uncapped)."""
    def_id = add_definition(conn, "busy", cap=1)
    ids = add_runs(conn, 5, kind="busy", definition_id=def_id)
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w0')").fetchall() == [(ids[0],)]
    result: dict[str, Any] = {}

    def cancel_queued() -> None:
        with db.connect() as operator:
            result["n"] = scalar(operator, "SELECT jobs.cancel_queued('busy')")

    with db.connect(autocommit=False) as claimer:
        assert claimer.execute("SELECT * FROM jobs.claim(10, 'w1')").fetchall() == [], "at cap"
        locked = scalar(
            conn,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND pid = %s",
            (claimer.info.backend_pid,),
        )
        assert locked >= 1, "the claimer's transaction should still be open"
        operator = threading.Thread(target=cancel_queued)
        operator.start()
        _wait_until_blocked(conn, operator)
        claimer.commit()
    operator.join(10)
    states = [run_row(conn, i)["status"] for i in ids]
    assert states == ["RUNNING", "CANCELLED", "CANCELLED", "CANCELLED", "CANCELLED"], (
        f"cancel_queued returned {result.get('n')}; states {list(zip(ids, states, strict=True))}"
    )
    assert result["n"] == 4


def test_cancel_queued_leaves_a_run_that_is_being_started(db: Database, conn: Conn) -> None:
    """The other side of the same race: a row the claimer does start stays RUNNING."""
    def_id = add_definition(conn, "free")
    ids = add_runs(conn, 3, kind="free", definition_id=def_id)
    with db.connect(autocommit=False) as claimer:
        got = [r[0] for r in claimer.execute("SELECT id FROM jobs.claim(1, 'w1')")]
        assert got == ids[:1]
        result: dict[str, Any] = {}

        def cancel_queued() -> None:
            with db.connect() as operator:
                result["n"] = scalar(operator, "SELECT jobs.cancel_queued('free')")

        operator = threading.Thread(target=cancel_queued)
        operator.start()
        _wait_until_blocked(conn, operator)
        claimer.commit()
    operator.join(10)
    assert [run_row(conn, i)["status"] for i in ids] == ["RUNNING", "CANCELLED", "CANCELLED"]
    assert result["n"] == 2


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
    expect_error(conn, "SELECT jobs.cancel_queued(NULL)", None, "22023", "name must be a non-empty text")
