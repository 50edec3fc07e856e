"""jobs.audit, jobs.retry_many and jobs.discard: the dashboard's operator functions."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from harness import Database

Conn = psycopg.Connection[Any]


def _failed_runs(conn: Conn, n: int) -> list[int]:
    ids = []
    for i in range(n):
        row = conn.execute("SELECT id FROM jobs.enqueue('k', %s)", (Jsonb({"i": i}),)).fetchone()
        assert row is not None
        conn.execute("SELECT jobs.claim(1, 'w', ARRAY['k'])")
        conn.execute("SELECT jobs.fail(%s, 'w', ARRAY['Exception'], 'boom')", (row[0],))
        ids.append(int(row[0]))
    return ids


def test_retry_many_retries_each_unretried_failed_run_once_and_passes_over_the_rest(conn: Conn) -> None:
    failed = _failed_runs(conn, 3)
    done = conn.execute("SELECT id FROM jobs.enqueue('done')").fetchone()
    assert done is not None
    conn.execute("SELECT jobs.retry(%s)", (failed[0],))
    new = conn.execute(
        "SELECT retry_of FROM jobs.retry_many(%s) ORDER BY retry_of", ([*failed, done[0], 999999],)
    )
    assert [r[0] for r in new.fetchall()] == failed[1:]
    again = conn.execute("SELECT count(*) FROM jobs.retry_many(%s)", (failed,)).fetchone()
    assert again == (0,)
    per_run = conn.execute(
        "SELECT retry_of, count(*) FROM jobs.runs WHERE retry_of = ANY(%s) GROUP BY retry_of ORDER BY 1",
        (failed,),
    ).fetchall()
    assert per_run == [(run_id, 1) for run_id in failed]


def test_retry_many_of_runs_of_many_unique_keys_holds_at_most_a_thousand_keys_and_passes_over_the_rest(
    db: Database, conn: Conn
) -> None:
    """A bulk retry of the dashboard (up to 10,000 runs) of runs of distinct unique keys holds
    each key's lock until it commits, one slot of the server's shared lock table each (about
    6,400 by default): all of them at once ended in 53200 and starved other sessions. One call
    retries the runs of at most 1,000 keys and passes over the rest; the next calls take them."""
    failed = [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO jobs.runs (kind, status, worker, started_at, finished_at, failure_reason, error,"
            " unique_key)"
            " SELECT 'keyed', 'FAILED', 'w', now() - interval '1 minute', now(), 'Error', 'boom', 'u-' || g"
            "   FROM generate_series(1, 2500) AS g ORDER BY g RETURNING id"
        )
    ]
    calls: list[int] = []
    with db.connect(autocommit=False) as operator:
        calls.append(len(operator.execute("SELECT retry_of FROM jobs.retry_many(%s)", (failed,)).fetchall()))
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
            (operator.info.backend_pid,),
        ).fetchone()
        operator.commit()
    held = row[0] if row else None
    assert held is not None and held <= 1100, f"a retry of {calls[0]} runs held {held} advisory locks"
    while len(calls) < 5 and sum(calls) < len(failed):
        calls.append(len(conn.execute("SELECT retry_of FROM jobs.retry_many(%s)", (failed,)).fetchall()))
    assert calls == [1000, 1000, 500], calls
    retried = conn.execute(
        "SELECT count(DISTINCT retry_of), count(*) FROM jobs.runs WHERE retry_of = ANY(%s)", (failed,)
    ).fetchone()
    assert retried == (2500, 2500), retried


def test_discard_deletes_only_failed_runs(conn: Conn) -> None:
    failed = _failed_runs(conn, 2)
    queued = conn.execute("SELECT id FROM jobs.enqueue('k')").fetchone()
    assert queued is not None
    assert conn.execute("SELECT jobs.discard(%s)", ([*failed, queued[0]],)).fetchone() == (2,)
    left = conn.execute("SELECT id FROM jobs.runs WHERE id = ANY(%s)", ([*failed, queued[0]],)).fetchall()
    assert left == [(queued[0],)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("SELECT jobs.retry_many(NULL)", "run_ids must not be NULL"),
        ("SELECT jobs.discard(NULL)", "run_ids must not be NULL"),
        ("SELECT jobs.audit(NULL, 'x')", "actor must be a non-empty text"),
        ("SELECT jobs.audit('a', '')", "action must be a non-empty text"),
        ("SELECT jobs.audit('a', 'x', repeat('t', 1001))", "target is 1001 characters long"),
        ("SELECT jobs.audit('a', 'x', NULL, '[]')", "detail must be a JSON object"),
    ],
)
def test_bad_input_raises_22023_naming_the_field(conn: Conn, call: str, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(call)
    assert conn.execute("SELECT count(*) FROM jobs.audit_log").fetchone() == (0,)


def test_only_operators_act_and_readers_see_the_audit_log(db: Database, conn: Conn) -> None:
    failed = _failed_runs(conn, 1)
    with psycopg.connect(db.dsn_as("pgtick_t_operator"), autocommit=True) as operator:
        entry = operator.execute("SELECT jobs.audit('alice', 'retry', 'run 1', '{\"n\": 1}')").fetchone()
        assert entry is not None
        operator.execute("SELECT jobs.retry_many(%s)", (failed,))
    with psycopg.connect(db.dsn_as("pgtick_t_reader"), autocommit=True) as reader:
        row = reader.execute("SELECT actor, action, target, detail, db_user FROM jobs.audit_log").fetchone()
        assert row == ("alice", "retry", "run 1", {"n": 1}, "pgtick_t_operator")
        for call in (
            "SELECT jobs.audit('x', 'y')",
            "SELECT jobs.discard('{1}')",
            "SELECT jobs.retry_many('{1}')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute(call)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("INSERT INTO jobs.audit_log (actor, action) VALUES ('forged', 'x')")
