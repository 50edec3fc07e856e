"""The app the chaos soak runs in three `pgtick run` processes.

Every job records its entry and exit in chaos.executions over its own
connection, committed before and after the work, so the soak can prove from
the database that no run was executed twice and how executions overlapped.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import psycopg

from pgtick.app import App, Context

app = App("chaos")
_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(os.environ["CHAOS_DSN"], autocommit=True, connect_timeout=5)
        _local.conn = conn
    return conn


def _record(ctx: Context, seconds: float, checkpoints: int = 1) -> None:
    conn = _conn()
    try:
        conn.execute(
            "INSERT INTO chaos.executions (run_id, definition_id, kind, attempt, pid)"
            " VALUES (%s, %s, %s, %s, %s)",
            (ctx.run_id, ctx.definition_id, ctx.kind, ctx.attempt, os.getpid()),
        )
    except psycopg.Error:
        _local.conn = None
        raise
    for _ in range(checkpoints):
        ctx.checkpoint()
        time.sleep(seconds / checkpoints)
    ctx.checkpoint()
    try:
        conn.execute(
            "UPDATE chaos.executions SET exited = clock_timestamp() WHERE run_id = %s AND pid = %s",
            (ctx.run_id, os.getpid()),
        )
    except psycopg.Error:
        _local.conn = None
        raise


@app.job("quick", never_retry=[], max_attempts=2, backoff=0.2)
def quick(ctx: Context) -> None:
    _record(ctx, random.uniform(0, 0.05))


@app.job("flaky", retry_on=[ConnectionError, "Error"], max_attempts=3, backoff=0.2, backoff_max=1.0)
def flaky(ctx: Context) -> None:
    _record(ctx, random.uniform(0, 0.05))
    if random.random() < 0.3:
        raise ConnectionError("simulated upstream failure")


@app.job("long", never_retry=[], max_attempts=3, backoff=0.2, mutating=True, compensate=lambda ctx: None)
def long(ctx: Context) -> None:
    _record(ctx, random.uniform(0.5, 2.0), checkpoints=10)


@app.job("adhoc", never_retry=[], max_attempts=2, backoff=0.2)
def adhoc(ctx: Context) -> None:
    _record(ctx, random.uniform(0, 0.02))
