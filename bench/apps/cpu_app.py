"""The app ``pgtick run`` drains in the ``processes`` scenario: one kind, ``noop``, whose
job burns ``$PGTICK_BENCH_CPU_MS`` milliseconds of Python CPU (0: a no-op)."""

from __future__ import annotations

import os
import time

from pgtick.app import App, Context

CPU_SECONDS = float(os.environ.get("PGTICK_BENCH_CPU_MS", "0")) / 1000
app = App("bench-cpu")


@app.job("noop")
def noop(ctx: Context) -> None:
    if CPU_SECONDS:
        end = time.thread_time() + CPU_SECONDS
        while time.thread_time() < end:
            pass
