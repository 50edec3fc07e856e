"""The app the chaos soak runs in three `pgtick run` processes.

Every job records its entry and exit in chaos.executions over its own
connection, committed before and after the work, so the soak can prove from
the database that no run was executed twice and how executions overlapped.

Besides the everyday kinds (quick, flaky, long, adhoc) it has the faulty ones
the soak injects: ``poison`` returns or raises a value the database refuses
(the payload's ``variant`` says which), ``hung`` blocks far beyond its timeout
without a checkpoint, and ``settle`` is the work the soak hands every replica
at the end to see that none is wedged.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgtick.app import App, Context

app = App("chaos")
_local = threading.local()

#: How long a hung job blocks (seconds): far beyond its timeout, short enough that the
#: thread it holds comes back within the soak (Python cannot kill a thread).
HANG_SECONDS = float(os.environ.get("CHAOS_HANG_SECONDS", "20"))


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(os.environ["CHAOS_DSN"], autocommit=True, connect_timeout=5)
        _local.conn = conn
    return conn


def _execute(sql: str, params: tuple[Any, ...]) -> None:
    try:
        _conn().execute(sql, params)
    except psycopg.Error:
        _local.conn = None
        raise


def _enter(ctx: Context) -> None:
    _execute(
        "INSERT INTO chaos.executions (run_id, definition_id, kind, attempt, pid)"
        " VALUES (%s, %s, %s, %s, %s)",
        (ctx.run_id, ctx.definition_id, ctx.kind, ctx.attempt, os.getpid()),
    )


def _exit(ctx: Context) -> None:
    _execute(
        "UPDATE chaos.executions SET exited = clock_timestamp() WHERE run_id = %s AND pid = %s",
        (ctx.run_id, os.getpid()),
    )


def _record(ctx: Context, seconds: float, checkpoints: int = 1) -> None:
    _enter(ctx)
    for _ in range(checkpoints):
        ctx.checkpoint()
        time.sleep(seconds / checkpoints)
    ctx.checkpoint()
    _exit(ctx)


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


@app.job("settle", never_retry=[], max_attempts=2, backoff=0.2)
def settle(ctx: Context) -> None:
    _record(ctx, 1.0, checkpoints=4)


class Unprintable(Exception):
    """An error whose message cannot even be formatted (undecodable bytes)."""

    def __str__(self) -> str:
        return b"\xff\xfe undecodable".decode("utf-8")


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _raise(exc: BaseException) -> Any:
    raise exc


#: What a poison job hands back, by the payload's variant: results the database (or
#: JSON) refuses, and errors whose message it refuses.
POISON: dict[str, Callable[[], Any]] = {
    "nan_result": lambda: {"ratio": math.nan},
    "infinite_result": lambda: [math.inf, -math.inf],
    "nul_result": lambda: {"text": "before\u0000after"},
    "surrogate_result": lambda: {"text": "lone \ud800 surrogate"},
    "unserialisable_result": lambda: {"handle": object()},
    "deep_result": lambda: _nested(5000),
    "nul_error": lambda: _raise(RuntimeError("before\x00after")),
    "surrogate_error": lambda: _raise(OSError("file " + b"caf\xe9".decode("utf-8", "surrogateescape"))),
    "unprintable_error": lambda: _raise(Unprintable()),
}
#: Variants whose value is a result (the others raise).
POISON_RESULTS = frozenset(v for v in POISON if v.endswith("_result"))


@app.job("poison", never_retry=[], max_attempts=1)
def poison(ctx: Context) -> Any:
    _record(ctx, random.uniform(0, 0.02))
    return POISON[ctx.payload["variant"]]()


@app.job("hung", never_retry=[], max_attempts=2, backoff=0.2)
def hung(ctx: Context) -> None:
    # Stuck in I/O, no checkpoint: only the server's timeout can end this run.
    _enter(ctx)
    time.sleep(HANG_SECONDS)
    _exit(ctx)
