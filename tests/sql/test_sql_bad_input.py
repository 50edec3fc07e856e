"""Bad input: every public call refuses it with a SQLSTATE and a message naming the field, and
never half-applies (the database is byte-for-byte the same afterwards)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sql_support import Conn, add_definition, add_runs, digest, expect_error, scalar

BIG = 1_100_000  # characters: a payload over the default 1 MiB jobs.config.max_payload_bytes
INVALID = "22023"
NOT_FOUND = "P0002"

# (call, params, SQLSTATE, word the message must contain)
CASES: list[tuple[str, tuple[Any, ...] | None, str, str]] = [
    # jobs.enqueue
    ("SELECT jobs.enqueue(NULL)", None, INVALID, "kind"),
    ("SELECT jobs.enqueue('')", None, INVALID, "kind"),
    ("SELECT jobs.enqueue(repeat('k', 201))", None, INVALID, "kind"),
    ("SELECT jobs.enqueue('k', NULL)", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', '[1, 2]')", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', '\"text\"')", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', '42')", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', 'null'::jsonb)", None, INVALID, "payload"),
    (
        "SELECT jobs.enqueue('k', jsonb_build_object('x', repeat('a', %s)))",
        (BIG,),
        INVALID,
        "max_payload_bytes",
    ),
    ("SELECT jobs.enqueue('k', run_at => 'infinity')", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue('k', run_at => '-infinity')", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue('k', run_at => NULL)", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue('k', priority => 1001)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue('k', priority => -1001)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue('k', priority => NULL)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue('k', idempotency_key => '')", None, INVALID, "idempotency_key"),
    ("SELECT jobs.enqueue('k', idempotency_key => repeat('x', 201))", None, INVALID, "idempotency_key"),
    ("SELECT jobs.enqueue('k', max_attempts => 0)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue('k', max_attempts => -1)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue('k', max_attempts => 1001)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue('k', timeout => '-1 second')", None, INVALID, "timeout"),
    ("SELECT jobs.enqueue('k', timeout => '0')", None, INVALID, "timeout"),
    ("SELECT jobs.enqueue('k', heartbeat_timeout => '-5 minutes')", None, INVALID, "heartbeat_timeout"),
    # jobs.run_now
    ("SELECT jobs.run_now(NULL)", None, INVALID, "name"),
    ("SELECT jobs.run_now('no-such-definition')", None, NOT_FOUND, "no-such-definition"),
    ("SELECT jobs.run_now('defined', '[]')", None, INVALID, "payload"),
    # jobs.claim
    ("SELECT * FROM jobs.claim(0)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(-1)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(1001)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(NULL)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(1, '')", None, INVALID, "worker"),
    ("SELECT * FROM jobs.claim(1, repeat('w', 201))", None, INVALID, "worker"),
    # jobs.heartbeat
    ("SELECT * FROM jobs.heartbeat(NULL, 'w1')", None, INVALID, "run_ids"),
    ("SELECT * FROM jobs.heartbeat('{1}', NULL)", None, INVALID, "worker"),
    ("SELECT * FROM jobs.heartbeat('{1}', '')", None, INVALID, "worker"),
    (
        "SELECT * FROM jobs.heartbeat(array(SELECT generate_series(1, 10001)::bigint), 'w1')",
        None,
        INVALID,
        "run_ids",
    ),
    # jobs.complete / complete_many
    ("SELECT jobs.complete(NULL, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.complete(0, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.complete(-7, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.complete(%s, NULL)", ("RUNNING",), INVALID, "worker"),
    ("SELECT jobs.complete(%s, '')", ("RUNNING",), INVALID, "worker"),
    (
        "SELECT jobs.complete(%s, 'w1', jsonb_build_object('x', repeat('a', %s)))",
        ("RUNNING", BIG),
        INVALID,
        "result",
    ),
    ("SELECT * FROM jobs.complete_many(NULL, 'w1')", None, INVALID, "run_ids"),
    ("SELECT * FROM jobs.complete_many(%s, NULL)", ("RUNNING[]",), INVALID, "worker"),
    # jobs.fail
    ("SELECT jobs.fail(NULL, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.fail(-1, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.fail(%s, NULL)", ("RUNNING",), INVALID, "worker"),
    ("SELECT jobs.fail(%s, 'w1', '{}', 'm', 'Bogus')", ("RUNNING",), INVALID, "reason"),
    ("SELECT jobs.fail(%s, 'w1', '{}', 'm', NULL)", ("RUNNING",), INVALID, "reason"),
    ("SELECT jobs.fail(%s, 'w1', '{}', 'm', 'HeartbeatLost')", ("RUNNING",), INVALID, "reason"),
    ("SELECT jobs.fail(%s, 'w1', ARRAY['E', NULL])", ("RUNNING",), INVALID, "error_classes"),
    ("SELECT jobs.fail(%s, 'w1', ARRAY[''])", ("RUNNING",), INVALID, "error_classes"),
    (
        "SELECT jobs.fail(%s, 'w1', array(SELECT 'E' || g FROM generate_series(1, 101) g))",
        ("RUNNING",),
        INVALID,
        "error_classes",
    ),
    # jobs.acknowledge_cancel
    ("SELECT jobs.acknowledge_cancel(NULL, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.acknowledge_cancel(%s, NULL)", ("RUNNING",), INVALID, "worker"),
    # jobs.cancel / cancel_queued
    ("SELECT jobs.cancel(NULL)", None, INVALID, "run_id"),
    ("SELECT jobs.cancel(987654321)", None, NOT_FOUND, "987654321"),
    ("SELECT jobs.cancel(-1)", None, NOT_FOUND, "-1"),
    ("SELECT jobs.cancel_queued('no-such-definition')", None, NOT_FOUND, "no-such-definition"),
    # jobs.retry
    ("SELECT jobs.retry(NULL)", None, INVALID, "run_id"),
    ("SELECT jobs.retry(987654321)", None, NOT_FOUND, "987654321"),
    ("SELECT jobs.retry(%s)", ("QUEUED",), INVALID, "QUEUED"),
    ("SELECT jobs.retry(%s)", ("RUNNING",), INVALID, "RUNNING"),
    # jobs.set_retry_policy
    ("SELECT jobs.set_retry_policy(NULL)", None, INVALID, "kind"),
    ("SELECT jobs.set_retry_policy('k', max_attempts => 0)", None, INVALID, "max_attempts"),
    ("SELECT jobs.set_retry_policy('k', max_attempts => NULL)", None, INVALID, "max_attempts"),
    ("SELECT jobs.set_retry_policy('k', backoff_initial => '-1 second')", None, INVALID, "backoff_initial"),
    ("SELECT jobs.set_retry_policy('k', backoff_max => NULL)", None, INVALID, "backoff_max"),
    ("SELECT jobs.set_retry_policy('k', backoff_factor => 0.5)", None, INVALID, "backoff_factor"),
    ("SELECT jobs.set_retry_policy('k', backoff_factor => 'NaN')", None, INVALID, "backoff_factor"),
    ("SELECT jobs.set_retry_policy('k', backoff_factor => 'Infinity')", None, INVALID, "backoff_factor"),
    ("SELECT jobs.set_retry_policy('k', jitter => 1.5)", None, INVALID, "jitter"),
    ("SELECT jobs.set_retry_policy('k', jitter => -0.1)", None, INVALID, "jitter"),
    ("SELECT jobs.set_retry_policy('k', jitter => 'NaN')", None, INVALID, "jitter"),
]


def _seed(conn: Conn) -> dict[str, Any]:
    """One run in each interesting state, a definition, a policy."""
    add_definition(conn, "defined", cap=2)
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3)")
    queued, running = add_runs(conn, 2)
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() + interval '1 day' WHERE id = %s", (queued,))
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(running,)]
    return {"QUEUED": queued, "RUNNING": running, "RUNNING[]": [running]}


def test_bad_input_is_refused_by_name_and_changes_nothing(conn: Conn) -> None:
    ids = _seed(conn)
    wrong: list[str] = []
    for sql, params, sqlstate, mention in CASES:
        bound = None if params is None else tuple(ids.get(p, p) if isinstance(p, str) else p for p in params)
        before = digest(conn)
        try:
            expect_error(conn, sql, bound, sqlstate, mention)
        except AssertionError as exc:  # collect them all: one run shows every gap
            wrong.append(str(exc).splitlines()[0][:300])
        except pytest.fail.Exception as exc:
            wrong.append(f"{sql}: did not raise ({exc})"[:300])
        if digest(conn) != before:
            wrong.append(f"{sql}: changed the database")
    assert not wrong, "\n".join(wrong)


def test_payload_limit_follows_config(conn: Conn) -> None:
    """max_payload_bytes is read at call time: lower it and a modest payload is refused."""
    conn.execute("UPDATE jobs.config SET max_payload_bytes = 100")
    before = digest(conn)
    expect_error(
        conn, "SELECT jobs.enqueue('k', jsonb_build_object('x', repeat('a', 200)))", None, INVALID, "payload"
    )
    assert digest(conn) == before
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', '{\"x\": 1}')") is not None


def test_wrong_worker_and_unknown_ids_are_no_ops(conn: Conn) -> None:
    """Not errors: fencing answers. complete/fail/acknowledge with the wrong worker or an unknown
    id say no (false / NULL / empty) and change nothing."""
    ids = _seed(conn)
    running = ids["RUNNING"]
    before = digest(conn)
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2')", (running,)) is False
    assert scalar(conn, "SELECT jobs.complete(987654321, 'w1')") is False
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (ids["QUEUED"],)) is False
    assert scalar(conn, "SELECT (jobs.fail(%s, 'w2')).id IS NULL", (running,)) is True
    assert scalar(conn, "SELECT (jobs.fail(987654321, 'w1')).id IS NULL") is True
    assert conn.execute("SELECT * FROM jobs.heartbeat(%s, 'w2')", ([running],)).fetchall() == []
    assert conn.execute("SELECT * FROM jobs.heartbeat('{987654321}', 'w1')").fetchall() == []
    assert conn.execute("SELECT * FROM jobs.heartbeat('{}', 'w1')").fetchall() == []
    assert conn.execute("SELECT * FROM jobs.complete_many(%s, 'w2')", ([running],)).fetchall() == []
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w2')", (running,)) is False
    assert digest(conn) == before


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_claim_refuses_snapshot_isolation(conn: Conn, isolation: str) -> None:
    """claim needs a fresh snapshot per step: under REPEATABLE READ / SERIALIZABLE it raises
    25000 instead of silently counting RUNNING rows from a stale snapshot."""
    add_runs(conn, 3)
    before = digest(conn)
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        conn.execute("SELECT * FROM jobs.claim(1, 'w1')")
    assert info.value.sqlstate == "25000", info.value
    assert "READ COMMITTED" in str(info.value)
    assert digest(conn) == before
