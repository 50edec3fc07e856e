"""Test app for the metrics endpoint: one kind that succeeds, one that fails (never retried)."""

from __future__ import annotations

from pgtick.app import App, Context

app = App("ops-metrics")


@app.job("ops-ok")
def ok(ctx: Context) -> dict[str, int]:
    return {"run": ctx.run_id}


@app.job("ops-fail")
def fail(ctx: Context) -> None:
    raise ValueError(f"run {ctx.run_id} fails on purpose")
