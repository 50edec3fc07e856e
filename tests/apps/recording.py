"""Job code in the test apps records its own entry and exit in the test database.

Tests then check the driver's invariants from the database: which run was
executed by which worker (process), how often, and how it ended. The DSN comes
from ``PGTICK_APP_DSN`` (harness.Processes sets it for every replica).

    executions(id, run_id, definition_id, scheduled_for, attempt, kind, worker, pid,
               entered, exited, outcome)   -- outcome: 'returned' or the exception class
    compensations(run_id, worker, pid, at) -- one row per compensation hook call
    steps(run_id, at)                      -- one row per checkpoint a `steps` job passed
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from pgtick.app import Context

DSN = os.environ["PGTICK_APP_DSN"]

TABLES = """
CREATE TABLE IF NOT EXISTS public.executions (
    id bigserial PRIMARY KEY,
    run_id bigint NOT NULL,
    definition_id bigint,
    scheduled_for timestamptz,
    attempt integer NOT NULL,
    kind text NOT NULL,
    worker text NOT NULL,
    pid integer NOT NULL,
    entered timestamptz NOT NULL DEFAULT clock_timestamp(),
    exited timestamptz,
    outcome text
);
CREATE TABLE IF NOT EXISTS public.steps (
    run_id bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS public.compensations (
    run_id bigint NOT NULL,
    worker text NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

_local = threading.local()


def _connection() -> psycopg.Connection[Any]:
    """One connection per job thread (executor threads live as long as the worker)."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(DSN, autocommit=True, application_name=f"pgtick-test-job {os.getpid()}")
        _local.conn = conn
    return conn


def create_tables() -> None:
    """Idempotent; replicas start at once, so serialize the CREATEs with an advisory lock."""
    with psycopg.connect(DSN) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(7400222)")
        conn.execute(TABLES)


def _entered(ctx: Context) -> int:
    """Insert the executions row for this attempt (committed at once); its id."""
    row = (
        _connection()
        .execute(
            "INSERT INTO public.executions"
            " (run_id, definition_id, scheduled_for, attempt, kind, worker, pid)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (
                ctx.run_id,
                ctx.definition_id,
                ctx.scheduled_for,
                ctx.attempt,
                ctx.kind,
                ctx.worker_id,
                os.getpid(),
            ),
        )
        .fetchone()
    )
    assert row is not None
    return int(row[0])


@contextmanager
def _execution(ctx: Context) -> Iterator[None]:
    """The executions row of the block: entered before it, exited with how it ended
    ('returned' or the exception class)."""
    execution = _entered(ctx)
    outcome = "returned"
    try:
        yield
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        _connection().execute(
            "UPDATE public.executions SET exited = clock_timestamp(), outcome = %s WHERE id = %s",
            (outcome, execution),
        )


def recorded(fn: Callable[[Context], Any]) -> Callable[[Context], Any]:
    """Wrap job code: a row on entry (committed before the job body runs), exit stamped after."""

    @functools.wraps(fn)
    def job(ctx: Context) -> Any:
        with _execution(ctx):
            return fn(ctx)

    return job


def record_compensation(ctx: Context) -> None:
    _connection().execute(
        "INSERT INTO public.compensations (run_id, worker, pid) VALUES (%s, %s, %s)",
        (ctx.run_id, ctx.worker_id, os.getpid()),
    )


def busy(ctx: Context, seconds: float, step: float = 0.05) -> float:
    """Work for ``seconds`` in small steps, calling ctx.checkpoint() before each."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.checkpoint()
        time.sleep(step)
    ctx.checkpoint()
    return seconds


def record_step(ctx: Context) -> None:
    _connection().execute("INSERT INTO public.steps (run_id) VALUES (%s)", (ctx.run_id,))


def arecorded(fn: Callable[[Context], Awaitable[Any]]) -> Callable[[Context], Awaitable[Any]]:
    """``recorded`` for ``async def`` job code (its rows are written from the loop thread)."""

    @functools.wraps(fn)
    async def job(ctx: Context) -> Any:
        with _execution(ctx):
            return await fn(ctx)

    return job
