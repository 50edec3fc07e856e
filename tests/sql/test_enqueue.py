"""jobs.enqueue: idempotency keys (also under concurrency) and one NOTIFY per transaction."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from harness import (
    Conn,
    Database,
    expect_error,
    notifications_until_sentinel,
    race,
    run_row,
    scalar,
    wait_at_gate,
)


def _enqueue_with_key(dsn: str, key: str, hold: float) -> dict[str, Any]:
    """Enqueue with key inside a transaction that stays open a little, so callers overlap."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = scalar(conn, "SELECT pg_backend_pid()")
        wait_at_gate(conn)
        with conn.transaction():
            run_id = scalar(
                conn,
                "SELECT id FROM jobs.enqueue('once', jsonb_build_object('pid', %s::int),"
                " idempotency_key => %s)",
                (pid, key),
            )
            time.sleep(hold)
    return {"pid": pid, "run_id": run_id}


def test_same_key_twice_returns_the_same_run(conn: Conn) -> None:
    first = run_row(conn, scalar(conn, "SELECT id FROM jobs.enqueue('k', idempotency_key => 'a')"))
    again = scalar(conn, "SELECT id FROM jobs.enqueue('k', '{\"other\": 1}', idempotency_key => 'a')")
    assert again == first["id"]
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1
    assert run_row(conn, first["id"])["payload"] == {}, "the repeat does not rewrite the run"
    other = scalar(conn, "SELECT id FROM jobs.enqueue('k', idempotency_key => 'b')")
    assert other != first["id"]
    # No key: every call is a new run.
    conn.execute("SELECT jobs.enqueue('k')")
    conn.execute("SELECT jobs.enqueue('k')")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 4


def test_same_key_returns_the_run_even_after_it_finished(conn: Conn) -> None:
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('k', idempotency_key => 'done')")
    conn.execute("SELECT jobs.claim(1, 'w')")
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (run_id,)) is True
    again = conn.execute(
        "SELECT id, status::text FROM jobs.enqueue('k', idempotency_key => 'done')"
    ).fetchone()
    assert again == (run_id, "COMPLETED")


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_an_idempotent_enqueue_needs_read_committed(db: Database, conn: Conn, level: str) -> None:
    """The key's run may move to history (jobs.archive) after the caller's snapshot was taken:
    that snapshot sees it in neither table, so the enqueue would add a second run of the key.
    It is refused (25000), and nothing is added."""
    first = scalar(conn, "SELECT id FROM jobs.enqueue('charge', idempotency_key => 'order-1')")
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now() - interval '3 days',"
        " finished_at = now() - interval '3 days' WHERE id = %s",
        (first,),
    )
    with psycopg.connect(db.dsn, autocommit=True) as caller:
        caller.execute(f"BEGIN ISOLATION LEVEL {level}")
        caller.execute("SELECT count(*) FROM jobs.runs")  # the snapshot is taken
        assert scalar(conn, "SELECT jobs.archive()") == 1, "the leader moves the run meanwhile"
        expect_error(
            caller,
            "SELECT jobs.enqueue('charge', idempotency_key => 'order-1')",
            None,
            "25000",
            "idempotency_key",
            "needs READ COMMITTED",
        )
        caller.execute("ROLLBACK")
    assert scalar(conn, "SELECT array_agg(id) FROM jobs.runs_all WHERE idempotency_key = 'order-1'") == [
        first
    ]
    again = scalar(conn, "SELECT id FROM jobs.enqueue('charge', idempotency_key => 'order-1')")
    assert again == first, "under READ COMMITTED the moved run is returned"


def test_concurrent_enqueues_with_one_key_create_one_row(db: Database, conn: Conn) -> None:
    """Invariant: N processes enqueueing with the same idempotency key at the same moment (each
    in a transaction held open briefly) create exactly one row, and every caller gets its id."""
    callers = 6
    results = race(db.dsn, _enqueue_with_key, [(db.dsn, "k-1", 0.2)] * callers)
    rows = conn.execute("SELECT id, payload FROM jobs.runs WHERE idempotency_key = 'k-1'").fetchall()
    assert len(rows) == 1, f"one key, {len(rows)} rows: {rows}"
    got = {(r["pid"], r["run_id"]) for r in results}
    wrong = [(pid, run_id) for pid, run_id in got if run_id != rows[0][0]]
    assert not wrong, f"(backend pid, run id returned) differing from run {rows[0][0]}: {wrong}"
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1


def _drain(listener: psycopg.Connection[Any], expect: int) -> list[psycopg.Notify]:
    """The notifications that arrive: wait for ``expect`` of them, then briefly for any extra."""
    got = list(listener.notifies(timeout=2.0, stop_after=expect)) if expect else []
    got += list(listener.notifies(timeout=0.2))
    return got


def test_one_notify_per_transaction(db: Database, conn: Conn) -> None:
    """50 enqueues in one transaction wake listeners once; separate transactions once each."""
    with db.connect() as listener:
        listener.execute("LISTEN jobs")
        with conn.transaction():
            for i in range(50):
                conn.execute("SELECT jobs.enqueue('k', jsonb_build_object('i', %s::int))", (i,))
        got = _drain(listener, 1)
        assert [n.channel for n in got] == ["jobs"], f"expected one NOTIFY, got {got}"

        conn.execute("SELECT jobs.enqueue('k')")
        conn.execute("SELECT jobs.enqueue('k')")
        got = _drain(listener, 2)
        assert len(got) == 2, f"two transactions, {len(got)} notifications"

        # An idempotent repeat queues nothing and wakes nobody.
        conn.execute("SELECT jobs.enqueue('k', idempotency_key => 'x')")
        assert len(_drain(listener, 1)) == 1
        conn.execute("SELECT jobs.enqueue('k', idempotency_key => 'x')")
        assert _drain(listener, 0) == []


def test_a_transaction_that_defers_its_wake_queues_without_a_notify(db: Database, conn: Conn) -> None:
    """With pgtick.defer_wake on, every function that queues runs leaves the NOTIFY to its
    caller, who sends it after the commit; without it, the transaction notifies itself."""
    with db.connect() as listener:
        listener.execute("LISTEN jobs")
        with conn.transaction():
            conn.execute("SELECT set_config('pgtick.defer_wake', 'on', true)")
            conn.execute("SELECT jobs.enqueue('k')")
            conn.execute("SELECT jobs.enqueue_many('k', '[{}, {}]')")
        conn.execute("SELECT pg_notify('jobs', 'sentinel')")
        assert notifications_until_sentinel(listener) == [], "a deferred enqueue notified"
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'QUEUED'") == 3

        conn.execute("SELECT set_config('synchronous_commit', 'off', true), pg_notify('jobs', '')")
        conn.execute("SELECT jobs.enqueue('k')")  # the setting was the transaction's alone
        conn.execute("SELECT pg_notify('jobs', 'sentinel')")
        assert notifications_until_sentinel(listener) == ["", ""]


@pytest.mark.parametrize("value", ["not json", '"a string"', "[1, 2]", '{"traceparent": '])
def test_a_trace_context_that_is_not_a_json_object_is_refused_naming_its_setting(
    conn: Conn, value: str
) -> None:
    with conn.transaction():
        conn.execute("SELECT set_config('pgtick.trace_context', %s, true)", (value,))
        expect_error(conn, "SELECT jobs.enqueue('k')", None, "22023", "pgtick.trace_context")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def test_a_trace_context_is_stored_with_the_run_and_an_empty_one_is_none(conn: Conn) -> None:
    trace = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    with conn.transaction():
        conn.execute("SELECT set_config('pgtick.trace_context', %s, true)", (trace,))
        traced = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
    with conn.transaction():
        conn.execute("SELECT set_config('pgtick.trace_context', '', true)")
        plain = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
    untraced = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
    stored = dict(conn.execute("SELECT id, trace_context FROM jobs.runs").fetchall())
    assert stored == {
        traced: {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        plain: None,
        untraced: None,
    }, stored
