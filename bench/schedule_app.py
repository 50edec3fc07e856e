"""The app the schedule benchmark runs: one no-op job kind."""

from __future__ import annotations

from pgtick.app import App, Context

app = App()


@app.job("noop")
def noop(ctx: Context) -> None:
    """Does nothing: the benchmark measures when it starts."""
