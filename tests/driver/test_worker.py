"""The worker heartbeats each run often enough for that run's own heartbeat timeout,
even when the loop was idling on the default cadence when the run arrived."""

from __future__ import annotations

import threading
import time

from harness import Database, wait_for
from pgtick.app import App, Context
from pgtick.worker import Worker


def test_short_per_run_heartbeat_timeout_is_honoured(db: Database) -> None:
    app = App()
    started = threading.Event()

    @app.job("slow")
    def slow(ctx: Context) -> None:
        started.set()
        time.sleep(3.0)

    worker = Worker(app, db.dsn, poll_interval=0.1, heartbeat_interval=5.0)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    reaped = []
    try:
        time.sleep(0.5)  # the heartbeat loop is now in a 5 s wait (jobs.config: 60 s timeout)
        with db.connect() as conn:
            run = conn.execute(
                "SELECT id FROM jobs.enqueue('slow', heartbeat_timeout => '1 second')"
            ).fetchone()
            assert run is not None and started.wait(10)
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:  # a leader's reaper, as eager as can be
                reaped += conn.execute("SELECT run_id FROM jobs.reap()").fetchall()
                time.sleep(0.1)

            def done() -> bool:
                row = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", run).fetchone()
                return row == ("COMPLETED",)

            wait_for("the run to complete", done, timeout=10)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert reaped == [], f"reaped while its worker was alive: {reaped}"
    assert worker.stats.completed == 1 and worker.stats.fenced == 0, worker.stats


def test_unknown_kind_waits_visibly_and_crashes_nothing(db: Database) -> None:
    """A run whose kind no worker knows stays QUEUED (no worker claims kinds it
    does not have) and shows in jobs.queue_stats with a growing oldest age."""
    app = App()
    done = threading.Event()

    @app.job("known")
    def known(ctx: Context) -> None:
        done.set()

    with db.connect() as conn:
        orphan = conn.execute("SELECT id FROM jobs.enqueue('nobody-knows-me')").fetchone()
        conn.execute("SELECT jobs.enqueue('known')")
    worker = Worker(app, db.dsn, poll_interval=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        assert done.wait(10)
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=10)
    with db.connect() as conn:
        status = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", orphan).fetchone()
        stats = conn.execute(
            "SELECT queued, oldest_queued_age > interval '0' FROM jobs.queue_stats"
            " WHERE kind = 'nobody-knows-me'"
        ).fetchone()
    assert status == ("QUEUED",)
    assert stats == (1, True)
