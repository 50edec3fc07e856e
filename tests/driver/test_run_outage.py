"""Database outages: the database gone for 30 s while jobs run.

Heartbeat write failures never kill the work; a job that finishes while the
database is down keeps its outcome and reports it when the database returns
(counted once), unless the reaper got there first, in which case the report is
fenced and the retry carries on: never counted twice.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import psycopg
import pytest

from harness import migrated_server, wait_for
from pgtick.app import App, Context
from pgtick.worker import Worker

OUTAGE_SECONDS = float(os.environ.get("PGTICK_OUTAGE_SECONDS", "30"))


@pytest.fixture
def private_server() -> Any:
    """A server of this test's own, since it is stopped and started."""
    with migrated_server() as own:
        yield own


def test_database_gone_for_30s_mid_job(private_server: Any) -> None:
    server, dsn = private_server
    started: dict[int, threading.Event] = {}
    halted = threading.Event()
    app = App()

    @app.job("slow", never_retry=[], max_attempts=2, backoff=0.0)
    def slow(ctx: Context) -> dict[str, int]:
        started.setdefault(ctx.run_id, threading.Event()).set()
        halted.wait(120)  # finishes while the database is down; no checkpoint needed
        time.sleep(0.5)
        return {"attempt": ctx.attempt}

    with psycopg.connect(dsn, autocommit=True) as conn:
        patient = conn.execute("SELECT id FROM jobs.enqueue('slow', heartbeat_timeout => '10 minutes')")
        hasty = conn.execute("SELECT id FROM jobs.enqueue('slow', heartbeat_timeout => '2 seconds')")
        patient_id = patient.fetchone()[0]  # type: ignore[index]
        hasty_id = hasty.fetchone()[0]  # type: ignore[index]
        conn.execute("SELECT jobs.set_retry_policy('slow', max_attempts => 2, backoff_initial => '0')")

    worker = Worker(app, dsn, concurrency=4, poll_interval=0.2, heartbeat_interval=0.3)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        wait_for("both runs to start", lambda: patient_id in started and hasty_id in started, 60)

        def heartbeated() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM jobs.runs WHERE id = ANY (%s) AND heartbeat_at > started_at",
                    ([patient_id, hasty_id],),
                ).fetchone()
            return row == (2,)

        wait_for("both runs to heartbeat at least once", heartbeated, 60)
        server.halt()
        halted.set()
        time.sleep(OUTAGE_SECONDS)
        assert thread.is_alive(), "the worker died during the outage"
        server.start()
        # A leader's reaper races the worker's reconnect: whichever wins, the
        # hasty run (2 s heartbeat timeout) is completed exactly once.
        reaped: list[Any] = []

        def reap_until_settled() -> bool:
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    reaped.extend(conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall())
                    rows = conn.execute(
                        "SELECT count(*) FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING')"
                    )
                    return rows.fetchone() == (0,)
            except psycopg.OperationalError:  # the server is still coming back
                return False

        wait_for("all runs to finish after the outage", reap_until_settled, 40)
    finally:
        halted.set()
        stop.set()
        thread.join(timeout=30)

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, status::text, failure_reason, attempt, retry_of, result FROM jobs.runs ORDER BY id"
        ).fetchall()
    by_id = {r[0]: r for r in rows}
    # The patient run finished during the outage and was reported once, afterwards.
    assert by_id[patient_id][1:3] == ("COMPLETED", None), rows
    assert by_id[patient_id][5] == {"attempt": 1}
    # The hasty run: either its late report landed, or it was reaped, the report
    # was fenced and its retry completed. Completed once in every case.
    lineage = [r for r in rows if r[0] == hasty_id or r[4] == hasty_id]
    completed = [r for r in lineage if r[1] == "COMPLETED"]
    assert len(completed) == 1, f"hasty run completed {len(completed)} times: {lineage}"
    if reaped:
        assert [tuple(r) for r in reaped] == [(hasty_id, "HeartbeatLost")], reaped
        assert by_id[hasty_id][1:3] == ("FAILED", "HeartbeatLost"), rows
        assert worker.stats.fenced == 1, worker.stats
    else:
        assert by_id[hasty_id][1] == "COMPLETED" and len(lineage) == 1, rows
        assert worker.stats.fenced == 0, worker.stats
    print(f"hasty run path: {'reaped, report fenced, retry completed' if reaped else 'late report landed'}")
    assert worker.stats.heartbeat_failures >= 1
    assert worker.stats.completed == 2, worker.stats  # patient + the hasty lineage, once


def test_a_run_let_go_in_doubt_is_not_handed_back_with_a_claim_lost_in_the_same_outage(
    private_server: Any,
) -> None:
    """The database goes away while an async job runs without reaching a checkpoint: past its
    heartbeat timeout the job is cancelled and the run let go, left to the reaper; the claim
    loop's claim fails in the same outage, without an answer. When the database returns, the
    worker hands back what that claim may have taken, but not the run it let go: that run
    began, so it is not queued again as if it never had (same attempt, beyond its retry
    policy); the reaper fails it as HeartbeatLost."""
    server, dsn = private_server
    began: list[int] = []
    cancelled: list[int] = []
    app = App()

    @app.job("endless", max_attempts=1)
    async def endless(ctx: Context) -> None:
        began.append(ctx.run_id)
        try:
            await asyncio.sleep(300)  # no checkpoint
        except asyncio.CancelledError:
            cancelled.append(ctx.run_id)
            raise

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT id FROM jobs.enqueue('endless', max_attempts => 1, heartbeat_timeout => '2 seconds')"
        ).fetchone()
        assert row is not None
        run_id = row[0]

    worker = Worker(app, dsn, poll_interval=0.1, heartbeat_interval=0.3)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        wait_for("the job to begin", lambda: began == [run_id], 60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            claimed = conn.execute("SELECT started_at FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
        server.halt()
        # The claim loop's claim fails on the lost connection, and the job is cancelled once
        # its heartbeat timeout has passed without a heartbeat answered: the run is let go.
        wait_for("the job to be cancelled", lambda: cancelled == [run_id], 60)
        wait_for("a claim to fail without an answer", lambda: worker._claim_unsure, 60)
        server.start()

        def settled() -> bool:
            return not worker._claim_unsure

        wait_for("the worker to settle what the lost claim took", settled, 60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Settled means the hand back has committed: a run handed back is QUEUED, or claimed
            # again with another started_at, by now.
            state = conn.execute(
                "SELECT status::text, attempt, worker, started_at FROM jobs.runs WHERE id = %s", (run_id,)
            ).fetchone()
            assert claimed is not None and state == ("RUNNING", 1, worker.worker_id, claimed[0]), (
                f"run {state}, claimed at {claimed}; job began {began}"
            )
            assert began == [run_id], f"the job began again: {began}"
            # Its heartbeat timeout after the last heartbeat, the reaper ends it, once.
            reaped = wait_for(
                "the reaper to end the run",
                lambda: conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall(),
                60,
            )
            assert reaped == [(run_id, "HeartbeatLost")]
            assert began == [run_id], f"the job began again: {began}"
    finally:
        stop.set()
        thread.join(timeout=30)
