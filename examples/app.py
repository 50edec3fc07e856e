"""A small pgtick app to run first: `pgtick run examples/app.py`.

It declares a weekday 09:00 Europe/Sofia report (RRULE), a cron job, a
10-second heartbeat job, a one-shot, a flaky job that is retried, and a long
job that checks for cancellation at checkpoints.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

from pgtick.app import App, Context

app = App("example")


@app.job("report")
def report(ctx: Context) -> dict[str, str]:
    ctx.logger.info("report for %s", ctx.scheduled_for.isoformat())
    return {"report": f"generated for {ctx.payload.get('team', 'everyone')}"}


@app.job("tick")
def tick(ctx: Context) -> None:
    ctx.logger.info("tick scheduled_for=%s", ctx.scheduled_for.isoformat())


@app.job("flaky", retry_on=[ConnectionError], max_attempts=4, backoff=2.0)
def flaky(ctx: Context) -> str:
    if random.random() < 0.5:
        raise ConnectionError("upstream did not answer")
    return "ok"


def undo_partial_import(ctx: Context) -> None:
    ctx.logger.info("compensating: rolling back the rows imported so far")


@app.job("long-import", mutating=True, compensate=undo_partial_import, timeout=600)
def long_import(ctx: Context) -> dict[str, int]:
    steps = int(ctx.payload.get("steps", 20))
    for _ in range(steps):
        ctx.checkpoint()  # cancellation (pgtick cancel RUN) and the timeout stop it here
        time.sleep(1)
    return {"imported": steps}


app.schedule(
    "weekday-report",
    "report",
    "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0",
    tz="Europe/Sofia",
    payload={"team": "sofia"},
    max_concurrent_runs=1,
)
app.schedule("every-minute", "tick", "* * * * *", tz="UTC")
app.schedule(
    "every-10s", "tick", "FREQ=SECONDLY;INTERVAL=10", tz="UTC", overlap_policy="skip", max_concurrent_runs=1
)
app.schedule("flaky-hourly", "flaky", "0 * * * *", tz="UTC")
app.schedule(
    "nightly-import",
    "long-import",
    "30 2 * * *",
    tz="America/New_York",
    payload={"steps": 20},
    max_concurrent_runs=1,
)
# A one-shot a few seconds after start (a changed run_at makes it due again).
app.schedule("hello-once", "tick", run_at=datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=5))
