"""Helpers shared by the SQL core tests in tests/sql.

Seeding goes straight into the tables as the superuser (the fixtures' DSN), so
a test sets up exactly the state it needs; everything under test goes through
the public ``jobs.*`` functions. Processes started with
``harness.run_in_processes`` meet at a start gate (an advisory lock) so the
race really is a race and does not depend on how fast each child spawns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

Conn = psycopg.Connection[Any]

#: Advisory lock key of the start gate (any key the SQL core does not use).
GATE_KEY = 740_011

#: Far-future run_at for definitions that only exist to carry a cap or a policy.
NEVER = "2999-01-01 00:00:00+00"


def scalar(conn: Conn, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
    """First column of the first row."""
    row = conn.execute(sql, params).fetchone()
    assert row is not None, f"no row from {sql!r}"
    return row[0]


def add_definition(
    conn: Conn,
    name: str,
    *,
    kind: str | None = None,
    cap: int | None = None,
    overlap: str = "queue",
    priority: int = 0,
) -> int:
    """A disabled one-shot definition far in the future: a holder for a cap and a policy."""
    return int(
        scalar(
            conn,
            """
            INSERT INTO jobs.definitions
                (name, kind, run_at, enabled, max_concurrent_runs, overlap_policy, priority)
            VALUES (%s, %s, %s, false, %s, %s, %s)
            RETURNING id
            """,
            (name, kind or name, NEVER, cap, overlap, priority),
        )
    )


def add_runs(
    conn: Conn,
    count: int,
    *,
    kind: str = "k",
    definition_id: int | None = None,
    priority: int = 0,
    origin: str = "manual",
    start: str = "1 hour",
) -> list[int]:
    """Insert ``count`` due QUEUED runs; scheduled_for rises with the id (now() - start + n ms)."""
    rows = conn.execute(
        """
        INSERT INTO jobs.runs (definition_id, kind, priority, origin, scheduled_for)
        SELECT %s, %s, %s, %s, now() - %s::interval + g * interval '1 millisecond'
          FROM generate_series(1, %s) AS g
        ORDER BY g
        RETURNING id
        """,
        (definition_id, kind, priority, origin, start, count),
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


def run_row(conn: Conn, run_id: int) -> dict[str, Any]:
    """One jobs.runs row as a dict (column name -> value)."""
    cur = conn.execute("SELECT * FROM jobs.runs WHERE id = %s", (run_id,))
    row = cur.fetchone()
    assert row is not None, f"run {run_id} does not exist"
    assert cur.description is not None
    return {col.name: value for col, value in zip(cur.description, row, strict=True)}


def digest(conn: Conn) -> dict[str, Any]:
    """Row counts and content hashes of every jobs table: equal digests mean nothing changed."""
    out: dict[str, Any] = {}
    for table in ("runs", "definitions", "retry_policies", "config", "leases"):
        count, md5 = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM jobs.{table} AS t"
        ).fetchone() or (None, None)
        out[table] = (count, md5)
    return out


def sqlstate_of(exc: BaseException) -> str | None:
    return exc.sqlstate if isinstance(exc, psycopg.Error) else None


def expect_error(
    conn: Conn,
    sql: str,
    params: Sequence[Any] | None,
    sqlstate: str,
    *mentions: str,
) -> psycopg.Error:
    """Run sql, expect it to fail with sqlstate and a message naming each of ``mentions``."""
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, params)
    err = info.value
    message = err.diag.message_primary or str(err)
    assert err.sqlstate == sqlstate, (
        f"{sql} {params!r}: expected SQLSTATE {sqlstate}, got {err.sqlstate}: {message}"
    )
    for word in mentions:
        assert word in message, f"{sql} {params!r}: message {message!r} does not name {word!r}"
    return err


@contextmanager
def start_gate(dsn: str, parties: int, timeout: float = 90) -> Iterator[None]:
    """Hold the gate shut until ``parties`` sessions wait at it (see ``wait_at_gate``).

    Children take a shared lock on GATE_KEY, which blocks while we hold it
    exclusively; a watcher thread opens the gate once all of them are queued.
    """
    holder = psycopg.connect(dsn, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))

    def open_when_all_wait() -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as watch:
            while time.monotonic() < deadline:
                waiting = scalar(
                    watch,
                    """
                    SELECT count(*) FROM pg_locks AS l
                     WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = %s
                       AND l.database = (SELECT oid FROM pg_database
                                          WHERE datname = current_database())
                    """,
                    (GATE_KEY,),
                )
                if waiting >= parties:
                    break
                time.sleep(0.01)
        holder.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))

    opener = threading.Thread(target=open_when_all_wait, name="start-gate", daemon=True)
    opener.start()
    try:
        yield
    finally:
        opener.join(timeout)
        holder.close()


def wait_at_gate(conn: Conn) -> None:
    """Block until the test's start gate opens (returns at once if there is none)."""
    conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE_KEY,))
    conn.execute("SELECT pg_advisory_unlock_shared(%s)", (GATE_KEY,))


#: Every definition above its cap right now, with the offending runs and their workers.
OVER_CAP_SQL = """
SELECT d.id, d.max_concurrent_runs, count(*),
       array_agg(r.id ORDER BY r.id), array_agg(r.worker ORDER BY r.id)
  FROM jobs.runs AS r
  JOIN jobs.definitions AS d ON d.id = r.definition_id
 WHERE r.status = 'RUNNING' AND d.max_concurrent_runs IS NOT NULL
   AND (%(defs)s::bigint[] IS NULL OR d.id = ANY (%(defs)s::bigint[]))
 GROUP BY d.id
HAVING count(*) > d.max_concurrent_runs
"""
