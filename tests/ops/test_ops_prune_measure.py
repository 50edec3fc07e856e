"""The prune measurement of docs/operations.md, run small so the script cannot rot.

Counts only: the timings it prints are for the docs, never asserted here."""

from __future__ import annotations

from typing import Any

from measure_prune import measure
from ops_support import Conn, scalar

from harness import Database


def test_prune_measurement_script_prunes_exactly_the_old_history(db: Database, conn: Conn) -> None:
    steps: list[str] = []

    def emit(step: str, data: dict[str, Any]) -> None:
        steps.append(step)

    out = measure(db.dsn, old=3000, recent=500, batch=1000, queued=2000, idle_seconds=0.2, emit=emit)
    assert out["before"]["rows"] == 3000 + 500 + 2000
    assert out["prune"]["pruned"] == 3000
    assert out["prune"]["calls"] == 4, "three full batches, then a short one"
    assert out["after_prune"]["rows"] == 500 + 2000, "recent history and the live queue stay"
    assert out["after_refill"]["rows"] == 3000 + 500 + 2000
    assert steps[0] == "seeded" and steps[-1] == "after refilling as many runs"
    # The claim loop ran against the same table throughout: its runs finished, none was lost.
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'work' AND status = 'RUNNING'") == 0
