"""Test app: a per-second schedule whose job records each execution.

pgtick run tests/apps/ticker_app.py --dsn ... (PGTICK_APP_DSN set)
"""

from __future__ import annotations

import time

from recording import create_tables, recorded

from pgtick.app import App, Context

create_tables()
app = App("test-ticker")


@app.job("tick")
@recorded
def tick(ctx: Context) -> None:
    time.sleep(0.05)  # long enough that a second execution would overlap visibly


app.schedule("every-second", "tick", "FREQ=SECONDLY;INTERVAL=1", tz="UTC")
