"""Test app: a job that hangs where no checkpoint can reach it (time.sleep), so only the
server's timeout (jobs.reap) can end its run. Its retry returns at once. Both kinds retry
``Exception``, as a timeout seen at a checkpoint (JobTimeout) is: a timeout the server or the
worker fails them for must be retried the same way."""

from __future__ import annotations

import time
from typing import Any

from recording import create_tables, recorded

from pgtick.app import App, Context

create_tables()
app = App("test-hang")


@app.job("hangs", retry_on=[Exception], max_attempts=2, backoff=0.2, jitter=0.0)
@recorded
def hangs(ctx: Context) -> dict[str, Any]:
    """Attempt 1 blocks in time.sleep for the payload's ``seconds``, without a checkpoint."""
    if ctx.attempt == 1:
        time.sleep(float(ctx.payload.get("seconds", 30)))
    return {"attempt": ctx.attempt}


@app.job(
    "hangs-past-its-kind-timeout", timeout=2, retry_on=[Exception], max_attempts=2, backoff=0.2, jitter=0.0
)
@recorded
def hangs_past_its_kind_timeout(ctx: Context) -> dict[str, Any]:
    """The same, with the timeout declared on the kind only: the server does not know it."""
    if ctx.attempt == 1:
        time.sleep(float(ctx.payload.get("seconds", 30)))
    return {"attempt": ctx.attempt}
