"""Helpers shared by the operations tests in tests/ops.

State is set up through the public ``jobs.*`` functions where they can produce
it (claim, heartbeat, complete, fail, materialize) and straight into the tables
only for what no function can do on demand: a run that finished three weeks ago.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from harness import wait_for as wait_for  # shared poller, re-exported for these tests

Conn = psycopg.Connection[Any]
T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
PGTICK = [sys.executable, "-m", "pgtick.cli"]


def scalar(conn: Conn, sql: str, params: Sequence[Any] | None = None) -> Any:
    """First column of the first row."""
    row = conn.execute(sql, params).fetchone()
    assert row is not None, f"no row from {sql!r}"
    return row[0]


def rows(conn: Conn, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """All rows as dicts."""
    cur = conn.execute(sql, params)
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def one(conn: Conn, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> dict[str, Any]:
    """Exactly one row as a dict."""
    got = rows(conn, sql, params)
    assert len(got) == 1, f"{sql!r} returned {len(got)} rows: {got!r}"
    return got[0]


def run_row(conn: Conn, run_id: int) -> dict[str, Any]:
    return one(conn, "SELECT * FROM jobs.runs WHERE id = %s", (run_id,))


def enqueue(conn: Conn, kind: str = "k", payload: str = "{}", run_at: str = "now()") -> int:
    return int(scalar(conn, f"SELECT id FROM jobs.enqueue(%s, %s::jsonb, {run_at})", (kind, payload)))


def claim(conn: Conn, worker: str = "w", batch: int = 1, kinds: list[str] | None = None) -> list[int]:
    got = conn.execute("SELECT id FROM jobs.claim(%s, %s, %s)", (batch, worker, kinds)).fetchall()
    return [int(r[0]) for r in got]


def finish_old(
    conn: Conn,
    count: int,
    *,
    age: str,
    status: str = "COMPLETED",
    kind: str = "k",
    definition_id: int | None = None,
) -> list[int]:
    """Insert ``count`` runs that reached ``status`` ``age`` ago (oldest first, 1 s apart)."""
    reason = "'Error'" if status == "FAILED" else "NULL"
    got = conn.execute(
        f"""
        INSERT INTO jobs.runs (definition_id, kind, status, scheduled_for, created_at, started_at,
                               finished_at, worker, failure_reason)
        SELECT %s, %s, %s::jobs.run_status, t - interval '1 minute', t - interval '1 minute',
               t - interval '30 seconds', t, 'old-worker', {reason}
          FROM (SELECT now() - %s::interval - (%s - g) * interval '1 second' AS t, g
                  FROM generate_series(1, %s) AS g) AS s
         ORDER BY g
        RETURNING id
        """,
        (definition_id, kind, status, age, count, count),
    ).fetchall()
    return sorted(int(r[0]) for r in got)


def expect_error(
    conn: Conn, sql: str, params: Sequence[Any] | None, sqlstate: str, *mentions: str
) -> psycopg.Error:
    """Run sql, expect SQLSTATE ``sqlstate`` and a message naming each of ``mentions``."""
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, params)
    err = info.value
    message = err.diag.message_primary or str(err)
    assert err.sqlstate == sqlstate, f"{sql} {params!r}: expected {sqlstate}, got {err.sqlstate}: {message}"
    for word in mentions:
        assert word in message, f"{sql} {params!r}: message {message!r} does not name {word!r}"
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """Kill a test's child process (and its process group) if it is still alive."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
