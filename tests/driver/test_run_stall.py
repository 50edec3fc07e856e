"""The database stalls behind a long table lock while a healthy worker runs a job.

An operator's ``LOCK TABLE jobs.runs``, an ``ALTER TABLE``, a non-concurrent ``CREATE INDEX``
or an upgrade's migration blocks every statement on jobs.runs: the worker's heartbeats, and
the reaper. Invariant (DESIGN 1): a stall longer than the run's heartbeat timeout takes
nothing from a live, healthy worker: once the lock is released its run is not reaped, no
retry starts, and the run completes once, on its first attempt.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from harness import (
    SHORT_HEARTBEAT,
    Conn,
    Database,
    Processes,
    attempts,
    executions,
    scalar,
    start_sleepy_run,
    wait_finished,
    wait_for,
)

#: How long the lock is held: well past the run's heartbeat timeout.
STALL_SECONDS = 4 * SHORT_HEARTBEAT


def _heartbeat_waits(conn: Conn) -> bool:
    """Whether the worker's heartbeat connection is waiting for a lock right now."""
    return bool(
        scalar(
            conn,
            "SELECT count(*) > 0 FROM pg_stat_activity"
            " WHERE application_name LIKE 'pgtick-heartbeat %%' AND wait_event_type = 'Lock'",
        )
    )


def _reap_in_background(dsn: str, reaped: list[Any]) -> threading.Thread:
    """``SELECT * FROM jobs.reap()`` from a psql-like session of its own, on a thread."""

    def reap() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            reaped.extend(own.execute("SELECT run_id, reason FROM jobs.reap()").fetchall())

    thread = threading.Thread(target=reap, daemon=True)
    thread.start()
    return thread


#: What the stall holds locked: the runs, the worker registry (a heartbeat also stamps its
#: worker seen there; the reaper does not wait for it), or both, as one migration would.
LOCKED = ["jobs.runs", "jobs.worker_registry", "jobs.worker_registry, jobs.runs"]


@pytest.mark.parametrize("tables", LOCKED)
def test_a_table_lock_longer_than_the_heartbeat_timeout_takes_no_run_from_a_live_worker(
    procs: Processes, db: Database, conn: Conn, tables: str
) -> None:
    worker = procs.replica("work_app.py", "worker")
    assert worker.worker_id  # started, its tables made
    run_id, pid = start_sleepy_run(conn, STALL_SECONDS + 6)
    wait_for(
        f"run {run_id} to heartbeat",
        lambda: scalar(conn, "SELECT heartbeat_at > started_at FROM jobs.runs WHERE id = %s", (run_id,)),
        timeout=60,
    )
    reaped: list[Any] = []
    with db.connect(autocommit=False) as locker:
        locker.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
        locked = time.monotonic()
        status = scalar(locker, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,))
        assert status == "RUNNING", f"run {run_id} was {status} before the stall began"
        # The worker's heartbeat (and, behind a lock on the runs, the leader's reap) waits.
        wait_for("the heartbeat to wait for the lock", lambda: _heartbeat_waits(conn), 60)
        # A reap from psql that begins once the heartbeat timeout has passed in the stall.
        time.sleep(max(0.0, locked + 1.5 * SHORT_HEARTBEAT - time.monotonic()))
        late_reaper = _reap_in_background(db.dsn, reaped)
        time.sleep(max(0.0, locked + STALL_SECONDS - time.monotonic()))
        locker.commit()
    late_reaper.join(60)
    # Right after the release, reaps keep coming (the leader's ticks and these) while the
    # heartbeats that waited are still being written.
    deadline = time.monotonic() + 2 * SHORT_HEARTBEAT
    while time.monotonic() < deadline:
        reaped.extend(conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall())
    status = wait_finished(conn, run_id, timeout=90)
    tries = attempts(conn, run_id)
    ran = executions(conn, "run_id, attempt, pid, outcome")
    detail = f"attempts={tries} executions={ran} reaped by psql={reaped}\n{procs.tails()}"
    assert not reaped, f"a live worker's run was reaped after a stall: {detail}"
    assert status == "COMPLETED", detail
    assert len(tries) == 1, f"a retry of a live worker's run was queued: {detail}"
    assert [(e[0], e[2]) for e in ran] == [(run_id, pid)], detail
