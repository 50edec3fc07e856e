"""Test app for the metrics endpoint: one kind that succeeds, one that fails (never retried),
one that blocks past its kind's timeout where no checkpoint can reach it."""

from __future__ import annotations

import time

from pgtick.app import App, Context

app = App("ops-metrics")


@app.job("ops-ok")
def ok(ctx: Context) -> dict[str, int]:
    return {"run": ctx.run_id}


@app.job("ops-fail")
def fail(ctx: Context) -> None:
    raise ValueError(f"run {ctx.run_id} fails on purpose")


@app.job("ops-hang", timeout=1)
def hang(ctx: Context) -> None:
    """Sleeps the payload's ``seconds`` without a checkpoint: its worker fails it as Timeout."""
    time.sleep(float(ctx.payload.get("seconds", 3)))
