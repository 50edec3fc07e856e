"""Test app: ``async def`` kinds on the worker's event loop, next to a plain one.

Every async execution also records the event loop and thread it ran on
(``public.loops``), so tests can see that all async jobs of a worker share one loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from recording import _connection, arecorded, create_tables, record_compensation, recorded

from pgtick.app import App, Context

create_tables()
_connection().execute(
    "CREATE TABLE IF NOT EXISTS public.loops"
    " (run_id bigint PRIMARY KEY, loop_id bigint NOT NULL, thread_id bigint NOT NULL, pid integer NOT NULL)"
)
app = App("test-async")


def _record_loop(ctx: Context) -> None:
    _connection().execute(
        "INSERT INTO public.loops (run_id, loop_id, thread_id, pid) VALUES (%s, %s, %s, %s)",
        (ctx.run_id, id(asyncio.get_running_loop()), threading.get_ident(), os.getpid()),
    )


@app.job("together")
@arecorded
async def together(ctx: Context) -> int:
    """Enters, then waits (awaiting) until ``expect`` runs of this kind have entered: only
    runs that are running at the same time can all finish before ``seconds``."""
    _record_loop(ctx)
    expect = int(ctx.payload["expect"])
    deadline = time.monotonic() + float(ctx.payload.get("seconds", 30))
    while time.monotonic() < deadline:
        row = _connection().execute("SELECT count(*) FROM public.loops").fetchone()
        assert row is not None
        if row[0] >= expect:
            return int(row[0])
        await asyncio.sleep(0.05)
    raise TimeoutError(f"only some of {expect} runs were running at once")


@app.job("async-mutating", mutating=True, compensate=record_compensation)
@arecorded
async def async_mutating(ctx: Context) -> float:
    """Works ``seconds`` in steps, each after ``await ctx.checkpoint()``."""
    deadline = time.monotonic() + float(ctx.payload.get("seconds", 30))
    while time.monotonic() < deadline:
        await ctx.checkpoint()
        await asyncio.sleep(0.05)
    return float(ctx.payload.get("seconds", 30))


@app.job("async-sleeps", timeout=1)
@arecorded
async def async_sleeps(ctx: Context) -> None:
    """Never reaches a checkpoint: only an interrupted await stops it."""
    await asyncio.sleep(3600)


@app.job("async-appends", never_retry=[], max_attempts=2, backoff=0.2, jitter=0.0)
@arecorded
async def async_appends(ctx: Context) -> None:
    """Never reaches a checkpoint: appends "attempt epoch-seconds" to the file at ``path`` every
    50 ms for ``seconds`` (a retry: ``retry_seconds``), awaiting between lines."""
    key = "seconds" if ctx.attempt == 1 else "retry_seconds"
    deadline = time.monotonic() + float(ctx.payload.get(key, 1))
    with open(ctx.payload["path"], "a") as out:
        while time.monotonic() < deadline:
            out.write(f"{ctx.attempt} {time.time()}\n")
            out.flush()
            await asyncio.sleep(0.05)


@app.job("plain")
@recorded
def plain(ctx: Context) -> dict[str, Any]:
    return {"thread": threading.current_thread().name}
