"""Test app of the rolling upgrade: the same job code under the previous release's driver and
this one's, a steady mix of per-second schedules and ad-hoc runs.

Every job records its execution (recording.py) over its own committed connection, so the test
proves from the database that no run was executed twice and every run ended once.
"""

from __future__ import annotations

import time

from recording import busy, create_tables, recorded

from pgtick.app import App, Context

create_tables()
app = App("test-upgrade")


@app.job("tick")
@recorded
def tick(ctx: Context) -> None:
    time.sleep(0.05)  # long enough that a second execution would overlap visibly


@app.job("capped")
@recorded
def capped(ctx: Context) -> None:
    time.sleep(0.3)  # a third of its period: its cap of one is held a while each second


@app.job("retried", never_retry=[], max_attempts=2, backoff=0.2, jitter=0.0)
@recorded
def retried(ctx: Context) -> None:
    """Fails its first attempt, completes its retry."""
    if ctx.attempt == 1:
        raise ConnectionError("first attempt fails on purpose")


@app.job("adhoc")
@recorded
def adhoc(ctx: Context) -> None:
    time.sleep(0.01)


@app.job("keyed")
@recorded
def keyed(ctx: Context) -> None:
    time.sleep(0.1)  # one at a time per key (a per-key limit of the kind)


@app.job("sleepy", never_retry=[], max_attempts=2, backoff=0.2, jitter=0.0)
@recorded
def sleepy(ctx: Context) -> None:
    """Works ``seconds`` of the payload in checkpointed steps (a retry: 0.3 s)."""
    busy(ctx, float(ctx.payload.get("seconds", 0.1)) if ctx.attempt == 1 else 0.3)


app.schedule("every-second", "tick", "FREQ=SECONDLY;INTERVAL=1", tz="UTC")
app.schedule("capped-every-second", "capped", "FREQ=SECONDLY;INTERVAL=1", tz="UTC", max_concurrent_runs=1)
app.schedule("retried-every-second", "retried", "FREQ=SECONDLY;INTERVAL=1", tz="UTC")
