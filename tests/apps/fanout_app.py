"""Test app: a job that enqueues follow-up runs with app.enqueue (the app is given no DSN:
``pgtick run`` gives it its own)."""

from __future__ import annotations

from pgtick import App, Context

app = App("test-fanout")


@app.job("fan-out")
def fan_out(ctx: Context) -> list[int]:
    return [app.enqueue("leaf", {"i": i}).id for i in range(int(ctx.payload["n"]))]


@app.job("leaf")
def leaf(ctx: Context) -> int:
    return int(ctx.payload["i"])
