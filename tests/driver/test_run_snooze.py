"""A job that says "not now, run me again later": ``raise pgtick.Snooze(delay)`` or
``ctx.snooze(delay)``.

The worker puts the run back to QUEUED, due ``delay`` from now, with the same attempt
(``jobs.snooze``, fenced by the worker id and claim token): no retry row, no failure, no
retry policy asked. The same in a thread, on the event loop and in a job process.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import pgtick
from harness import Database, scalar, wait_for, worker_thread
from pgtick.app import App, Context
from pgtick.definitions import sync_app
from pgtick.errors import InvalidArgument, UsageError
from pgtick.worker import Worker

#: Long enough that a snoozed run is seen QUEUED before it is due again (the test then makes it
#: due at once).
DELAY = timedelta(minutes=10)


def _first_time(ctx: Context) -> bool:
    """True the first time a run's job runs: it leaves a marker file (a job process too)."""
    marker = Path(ctx.payload["marker"])
    if marker.exists():
        return False
    marker.write_text(str(ctx.attempt))
    return True


def snoozes_in_thread(ctx: Context) -> dict[str, Any]:
    if _first_time(ctx):
        ctx.snooze(DELAY)
    return {"attempt": ctx.attempt}


async def snoozes_async(ctx: Context) -> dict[str, Any]:
    if _first_time(ctx):
        ctx.snooze(DELAY.total_seconds())
    return {"attempt": ctx.attempt}


def snoozes_in_process(ctx: Context) -> dict[str, Any]:
    """Module level: a job process imports it by name."""
    if _first_time(ctx):
        raise pgtick.Snooze(DELAY)
    return {"attempt": ctx.attempt}


@pytest.mark.parametrize(
    ("fn", "isolation"),
    [(snoozes_in_thread, "thread"), (snoozes_async, "thread"), (snoozes_in_process, "process")],
    ids=["thread", "async", "process"],
)
def test_a_snoozed_run_waits_queued_with_the_same_attempt_then_completes(
    db: Database, tmp_path: Path, fn: Any, isolation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Snoozed on its first run, the run is QUEUED again, due DELAY after the snooze, with the
    same attempt and no retry row, not failed; once due it runs again and completes."""
    app = App("snooze")
    # max_attempts=1: a snooze counted as a failure would end the run FAILED.
    app.job("snoozes", isolation=isolation, max_attempts=1)(fn)
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1)
    payload = json.dumps({"marker": str(tmp_path / "ran")})
    status = "SELECT status::text FROM jobs.runs WHERE id = %s"
    with db.connect() as conn, caplog.at_level(logging.INFO, logger="pgtick.outcome"):
        sync_app(app, conn)
        before = scalar(conn, "SELECT now()")
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('snoozes', %s::jsonb)", (payload,))
        with worker_thread(worker):
            wait_for(
                f"run {run_id} to snooze",
                lambda: (tmp_path / "ran").exists() and scalar(conn, status, (run_id,)) == "QUEUED",
                timeout=60,
            )
            after = scalar(conn, "SELECT now()")
            snoozed = conn.execute(
                "SELECT status::text, attempt, scheduled_for, worker, started_at, error, failure_reason"
                " FROM jobs.runs WHERE id = %s",
                (run_id,),
            ).fetchone()
            count = scalar(conn, "SELECT count(*) FROM jobs.runs")
            assert snoozed is not None
            assert snoozed[:2] == ("QUEUED", 1) and snoozed[3:] == (None, None, None, None), snoozed
            assert before + DELAY <= snoozed[2] <= after + DELAY, (before, after, snoozed)
            assert count == 1, "a snooze made a retry row"
            wait_for("the snooze to be counted", lambda: worker.stats.snoozed == 1 or None, timeout=60)
            # Skip the wait: the run is due now.
            conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = %s", (run_id,))
            wait_for(f"run {run_id} to complete", lambda: scalar(conn, status, (run_id,)) == "COMPLETED", 60)
        runs = conn.execute("SELECT id, attempt, status::text, result, retry_of FROM jobs.runs").fetchall()
    assert runs == [(run_id, 1, "COMPLETED", {"attempt": 1}, None)], runs
    stats = worker.stats
    assert (stats.snoozed, stats.completed, stats.failed, stats.fenced) == (1, 1, 0, 0), stats
    lines = [r.getMessage() for r in caplog.records if f"run={run_id} " in r.getMessage()]
    assert len(lines) == 2, lines
    assert "status=SNOOZED attempt=1" in lines[0] and "due_in=10m" in lines[0], lines
    assert "status=COMPLETED attempt=1" in lines[1], lines


def test_a_snooze_of_a_run_taken_away_meanwhile_is_fenced_not_counted(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The run is reaped from its worker while its job runs (an operator's ``jobs.reap_worker``)
    and the job then snoozes: ``jobs.snooze`` refuses it (fenced), the worker logs it as fenced
    and counts it neither snoozed nor failed, and the run stays as the reap left it."""
    app = App("snooze-fenced")
    reaped = threading.Event()

    @app.job("snoozes-late", max_attempts=1)
    def snoozes_late(ctx: Context) -> None:
        assert reaped.wait(60)
        ctx.snooze(30)

    # No heartbeat while the job runs: the snooze, not a heartbeat, is the first to find out.
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=600)
    status = "SELECT status::text FROM jobs.runs WHERE id = %s"
    try:
        with db.connect() as conn, caplog.at_level(logging.INFO, logger="pgtick.outcome"):
            sync_app(app, conn)
            run_id = scalar(conn, "SELECT id FROM jobs.enqueue('snoozes-late')")
            with worker_thread(worker):
                wait_for(f"run {run_id} to start", lambda: scalar(conn, status, (run_id,)) == "RUNNING", 60)
                conn.execute("SELECT * FROM jobs.reap_worker(%s)", (worker.worker_id,))
                reaped.set()
                wait_for("the snooze to be refused", lambda: worker.stats.fenced == 1 or None, timeout=60)
            runs = conn.execute("SELECT id, status::text, failure_reason FROM jobs.runs").fetchall()
    finally:
        reaped.set()
    assert runs == [(run_id, "FAILED", "HeartbeatLost")], runs
    stats = worker.stats
    assert (stats.snoozed, stats.failed, stats.fenced) == (0, 0, 1), stats
    lines = [r.getMessage() for r in caplog.records if f"run={run_id} " in r.getMessage()]
    assert len(lines) == 1 and "status=FENCED" in lines[0], lines
    assert "snooze not applied: no longer RUNNING for this worker" in lines[0], lines


def test_a_snooze_after_its_cancellation_was_requested_ends_the_run_cancelled(db: Database) -> None:
    """A cancel requested while the job runs, which the worker has not heard of yet: the
    snooze is refused for it, and the run ends CANCELLED, not left RUNNING for the reaper."""
    app = App("snooze-cancelled")
    cancelled = threading.Event()

    @app.job("snoozes-cancelled", max_attempts=1)
    def snoozes_cancelled(ctx: Context) -> None:
        assert cancelled.wait(60)
        ctx.snooze(30)

    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=600)
    status = "SELECT status::text FROM jobs.runs WHERE id = %s"
    try:
        with db.connect() as conn:
            sync_app(app, conn)
            run_id = scalar(conn, "SELECT id FROM jobs.enqueue('snoozes-cancelled')")
            with worker_thread(worker):
                wait_for(f"run {run_id} to start", lambda: scalar(conn, status, (run_id,)) == "RUNNING", 60)
                conn.execute("SELECT jobs.cancel(%s)", (run_id,))
                cancelled.set()
                wait_for(f"run {run_id} to end", lambda: scalar(conn, status, (run_id,)) == "CANCELLED", 60)
            runs = conn.execute("SELECT id, status::text, error FROM jobs.runs").fetchall()
    finally:
        cancelled.set()
    assert runs == [(run_id, "CANCELLED", "cancelled: its job snoozed after its cancellation was requested")]
    assert (worker.stats.cancelled, worker.stats.snoozed, worker.stats.fenced) == (1, 0, 0), worker.stats


@pytest.mark.parametrize(
    "delay",
    [
        0,
        -1,
        0.0,
        float("nan"),
        float("inf"),
        timedelta(0),
        timedelta(seconds=-1),
        timedelta(days=365, seconds=1),
        365 * 86400 + 1,
        True,
        "5",
        None,
    ],
)
def test_a_bad_delay_is_refused_at_construction_naming_delay(delay: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"^delay must be ") as raised:
        pgtick.Snooze(delay)
    assert raised.value.field == "delay" and raised.value.sqlstate == "22023"
    assert isinstance(raised.value, UsageError) and isinstance(raised.value, ValueError)


def test_a_good_delay_is_kept_as_a_timedelta() -> None:
    assert pgtick.Snooze(1.5).delay == timedelta(seconds=1.5)
    assert pgtick.Snooze(30).delay == timedelta(seconds=30)
    assert pgtick.Snooze(timedelta(days=365)).delay == timedelta(days=365)
    assert "Snooze" in pgtick.__all__ and pgtick.Snooze is pgtick.errors.Snooze
