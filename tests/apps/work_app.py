"""Test app: job kinds for crash, shutdown, cancellation and timeout tests. No schedules;
tests enqueue runs. Every job records its entry and exit (recording.py); the payload's
``seconds`` says how long it works, in checkpointed steps.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from recording import busy, create_tables, record_compensation, record_step, recorded

from pgtick.app import App, Context

create_tables()
app = App("test-work")


@app.job("quick")
@recorded
def quick(ctx: Context) -> None:
    pass


@app.job("sleepy", never_retry=[], max_attempts=2, backoff=0.2, jitter=0.0)
@recorded
def sleepy(ctx: Context) -> dict[str, Any]:
    """Retried once on any failure (HeartbeatLost included); a retry works ``retry_seconds``."""
    key = "seconds" if ctx.attempt == 1 else "retry_seconds"
    return {"slept": busy(ctx, float(ctx.payload.get(key, 0.1))), "attempt": ctx.attempt}


@app.job("steps", never_retry=[], max_attempts=2, backoff=0.2, jitter=0.0)
@recorded
def steps(ctx: Context) -> None:
    """Work in steps of 0.1 s for ``seconds`` (a retry: ``retry_seconds``), recording each
    checkpoint passed (public.steps) as the work done after it."""
    key = "seconds" if ctx.attempt == 1 else "retry_seconds"
    deadline = time.monotonic() + float(ctx.payload.get(key, 1))
    while time.monotonic() < deadline:
        ctx.checkpoint()
        record_step(ctx)
        time.sleep(0.1)


@app.job("mutating", mutating=True, compensate=record_compensation)
@recorded
def mutating(ctx: Context) -> float:
    return busy(ctx, float(ctx.payload.get("seconds", 30)))


@app.job("timeboxed", timeout=1)
@recorded
def timeboxed(ctx: Context) -> float:
    return busy(ctx, float(ctx.payload.get("seconds", 30)))


@app.job("exits")
@recorded
def exits(ctx: Context) -> None:
    """Job code that calls sys.exit(): a BaseException, not an Exception."""
    sys.exit(int(ctx.payload.get("code", 3)))


@app.job("closes-stderr")
@recorded
def closes_stderr(ctx: Context) -> None:
    """Job code that closes the process's stderr, where the worker logs."""
    sys.stderr.close()


@app.job("leaves-a-thread")
@recorded
def leaves_a_thread(ctx: Context) -> None:
    """Job code that starts a thread of its own, not a daemon (a thread inherits that from
    the one that starts it: say so), and returns without it."""
    threading.Thread(target=time.sleep, args=(600,), name="job-sleeper", daemon=False).start()
