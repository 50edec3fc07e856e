"""Stopping a running job from outside (jobs.cancel from psql) and from inside (its timeout).

* Cancellation reaches job code at its next checkpoint through the heartbeat; for a
  mutating kind the compensation runs (and commits its row) before the runner stamps
  the run CANCELLED.
* A job past its timeout fails at its next checkpoint with failure_reason 'Timeout'.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from harness import (
    Conn,
    Database,
    Processes,
    cancel_a_running_job,
    executions,
    scalar,
    wait_finished,
    wait_for,
    wait_retry_completed,
    worker_thread,
)
from pgtick.app import App, Context
from pgtick.worker import Worker


def test_cancel_from_psql_reaches_a_running_job_and_compensation_runs_first(
    db: Database, procs: Processes, conn: Conn
) -> None:
    replica, cancelled = cancel_a_running_job(procs, db, conn, "work_app.py", "mutating", '{"seconds": 30}')
    executed = executions(conn, "run_id, outcome, exited - entered")
    context = f"{cancelled}; executions {executed}\n{replica.log()}"
    cancelled.check_compensated_first(replica, context)
    took = cancelled.finished_at - cancelled.asked_at
    assert took < timedelta(seconds=3), f"cancellation took too long: {context}"
    assert len(executed) == 1 and executed[0][:2] == (cancelled.run_id, "Cancelled"), context
    assert executed[0][2] < timedelta(seconds=10), f"the job was not stopped at a checkpoint: {context}"


def test_timeout_fails_the_run_with_reason_timeout(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("work_app.py", "replica")
    worker = replica.worker_id
    run_id = scalar(conn, """SELECT id FROM jobs.enqueue('timeboxed', '{"seconds": 30}')""")
    status = wait_finished(conn, run_id)
    run = conn.execute(
        "SELECT failure_reason, error, finished_at - started_at, worker FROM jobs.runs WHERE id = %s",
        (run_id,),
    ).fetchone()
    retries = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (run_id,))
    executed = executions(conn)
    log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; retries {retries}; executions {executed}\n{log}"
    assert status == "FAILED" and run[0] == "Timeout" and run[3] == worker, context
    assert "timeout" in run[1].lower(), context
    assert timedelta(seconds=1) <= run[2] < timedelta(seconds=4), f"not stopped at its 1 s timeout: {context}"
    assert retries == 0, f"a kind with max_attempts 1 was retried: {context}"
    assert executed == [(run_id, "JobTimeout")], context


def _hung_attempt_returned(conn: Conn, run_id: int, timeout: float) -> Any:
    """Wait for the job code of ``run_id``'s hung attempt to return; its recorded outcome."""
    return wait_for(
        f"the hung attempt of run {run_id} to return",
        lambda: scalar(
            conn, "SELECT outcome FROM public.executions WHERE run_id = %s AND exited IS NOT NULL", (run_id,)
        ),
        timeout=timeout,
    )


def test_a_job_hung_without_a_checkpoint_is_failed_by_the_server_timeout_and_retried(
    procs: Processes, conn: Conn
) -> None:
    """A job blocked in time.sleep (no checkpoint) on a run with a 2 s timeout keeps
    heartbeating, yet the scheduler's reap fails it as Timeout long before the sleep ends; the
    worker sees the run as no longer its own, the retry runs and completes, and the hung
    attempt's late return changes nothing (the worker does not report it)."""
    hang = 12.0  # seconds: the run must be failed well before this
    replica = procs.replica("hang_app.py", "replica")
    run_id = scalar(
        conn,
        "SELECT id FROM jobs.enqueue('hangs', jsonb_build_object('seconds', %s::float8),"
        " timeout => '2 seconds')",
        (hang,),
    )
    (retry_id,) = wait_retry_completed(conn, run_id, timeout=hang + 30)
    facts = (
        "SELECT status::text, failure_reason, error, heartbeat_at - started_at,"
        " finished_at - started_at, result, worker FROM jobs.runs WHERE id = %s"
    )
    failed = conn.execute(facts, (run_id,)).fetchone()
    retry = conn.execute("SELECT attempt, result FROM jobs.runs WHERE id = %s", (retry_id,)).fetchone()
    returned = _hung_attempt_returned(conn, run_id, hang + 30)
    # Its late return is one outcome line, ABANDONED (the run is no longer this worker's).
    replica.wait_log(
        rf"pgtick.outcome run={run_id} kind=hangs definition=- status=ABANDONED attempt=1 duration=\S+"
        " error=result not reported: the run is no longer this worker's",
        timeout=15,
    )
    after = conn.execute(facts, (run_id,)).fetchone()
    log = replica.log()

    assert failed is not None and retry is not None
    context = f"run {run_id}: {failed}; retry {retry_id}: {retry}\n{log}"
    status, reason, error, beating, lasted, result, worker = failed
    assert (status, reason) == ("FAILED", "Timeout"), context
    assert "timeout" in error and worker == replica.worker_id and result is None, context
    assert beating > timedelta(seconds=1), f"heartbeats stopped while the job hung: {context}"
    assert timedelta(seconds=2) <= lasted < timedelta(seconds=hang), f"not ended by the server: {context}"
    assert retry == (2, {"attempt": 2}), context
    assert returned == "returned", context
    assert after == failed, f"the hung attempt's late return changed its run: {after} != {failed}\n{log}"
    assert f"run={run_id} kind=hangs worker={worker} abandoned: no longer ours" in log, (
        f"the worker's heartbeat never saw the run as lost: {log}"
    )


def test_a_job_hung_past_its_kinds_timeout_is_failed_by_its_worker_and_retried(
    procs: Processes, conn: Conn
) -> None:
    """The timeout declared only on the kind (``@app.job(timeout=2)``; the run has none, so the
    server cannot enforce it) still ends a job blocked in time.sleep: its worker fails the run as
    Timeout soon after the deadline, with no scheduler running to reap it, the retry completes,
    and the hung attempt's late return changes nothing."""
    hang = 15.0
    replica = procs.replica("hang_app.py", "worker", "--no-scheduler")
    run_id = scalar(
        conn,
        "SELECT id FROM jobs.enqueue('hangs-past-its-kind-timeout',"
        " jsonb_build_object('seconds', %s::float8))",
        (hang,),
    )
    wait_retry_completed(conn, run_id, timeout=hang + 30)
    facts = (
        "SELECT status::text, failure_reason, error, finished_at - started_at, timeout"
        " FROM jobs.runs WHERE id = %s"
    )
    failed = conn.execute(facts, (run_id,)).fetchone()
    _hung_attempt_returned(conn, run_id, hang + 30)
    replica.wait_log(
        rf"run={run_id} kind=hangs-past-its-kind-timeout worker=\S+ returned after its timeout:"
        " result not reported",
        timeout=15,
    )
    after = conn.execute(facts, (run_id,)).fetchone()
    log = replica.log()

    assert failed is not None
    context = f"run {run_id}: {failed}\n{log}"
    status, reason, error, lasted, run_timeout = failed
    assert run_timeout is None, f"the run itself carried a timeout, so the server could know it: {context}"
    assert (status, reason) == ("FAILED", "Timeout"), context
    assert "exceeded its timeout of 2s" in error, context
    assert timedelta(seconds=2) <= lasted < timedelta(seconds=hang), f"not ended by its worker: {context}"
    assert after == failed, f"the hung attempt's late return changed its run: {after} != {failed}\n{log}"
    outcome = rf"run={run_id} kind=hangs-past-its-kind-timeout definition=- status=FAILED attempt=1 "
    outcome += r".*error=Timeout:"
    assert re.search(outcome, log), f"no outcome line for the run its worker failed: {context}"


def test_a_worker_whose_every_thread_is_held_by_a_hung_job_says_so_and_claims_again_when_it_returns(
    procs: Processes, conn: Conn
) -> None:
    """With one job thread, held by a job past its kind's timeout that has not returned, the
    worker claims nothing (the retry waits in the queue for another worker) and says so once;
    when the code returns, it says it claims again, and runs the retry."""
    hang = 12.0
    replica = procs.replica("hang_app.py", "worker", "--no-scheduler", "--concurrency", "1")
    run_id = scalar(
        conn,
        "SELECT id FROM jobs.enqueue('hangs-past-its-kind-timeout',"
        " jsonb_build_object('seconds', %s::float8))",
        (hang,),
    )
    replica.wait_log(
        r"every job thread \(1\) is held by jobs let go .* claiming nothing until one returns", 60
    )
    retry = scalar(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", (run_id,))
    assert retry is not None, replica.log()
    replica.wait_log(r"a job thread has returned: claiming again", hang + 60)
    wait_retry_completed(conn, run_id, timeout=60)
    log = replica.log()
    assert log.count("is held by jobs let go") == 1, f"said more than once:\n{log}"


def test_a_compensation_that_raises_does_not_skip_the_others(db: Database, conn: Conn) -> None:
    """Each hook undoes its own part: one that raises is logged, and the hooks after it (the
    kind's ``compensate`` too) still run; the run fails with that error, not retried (its
    cancel was requested)."""
    ran: list[str] = []

    def refund(ctx: Context) -> None:
        ran.append("refund")

    def release_seat(ctx: Context) -> None:
        ran.append("release-seat")
        raise RuntimeError("seat service down")

    def unreserve(ctx: Context) -> None:
        ran.append("unreserve")

    app = App("compensating")

    @app.job("book", mutating=True, compensate=refund, retry_on=[RuntimeError], max_attempts=3, backoff=0)
    def book(ctx: Context) -> None:
        ctx.on_cancel(unreserve)
        ctx.on_cancel(release_seat)
        give_up = time.monotonic() + 300
        while time.monotonic() < give_up:
            ctx.checkpoint()
            time.sleep(0.05)

    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=0.2)
    with worker_thread(worker):
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('book')")
        wait_for(
            f"run {run_id} to start",
            lambda: scalar(conn, "SELECT status = 'RUNNING' FROM jobs.runs WHERE id = %s", (run_id,)) or None,
            timeout=60,
        )
        conn.execute("SELECT jobs.cancel(%s)", (run_id,))
        status = wait_finished(conn, run_id)
    error = scalar(conn, "SELECT error FROM jobs.runs WHERE id = %s", (run_id,))
    retries = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (run_id,))
    assert ran == ["release-seat", "unreserve", "refund"], ran
    assert (status, error, retries) == ("FAILED", "RuntimeError: seat service down", 0)
