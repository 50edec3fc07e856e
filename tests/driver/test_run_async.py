"""``async def`` jobs under `pgtick run`: one event loop per worker process.

* Many async runs execute at the same time on one loop (one loop id, one thread, one
  process), next to a plain thread job of the same app.
* A cancel from psql stops an async job at its ``await ctx.checkpoint()``: the
  compensation commits its row before the run is stamped CANCELLED.
* An async job past its timeout is interrupted at whatever it awaits (here a one-hour
  ``asyncio.sleep``) and fails with reason 'Timeout'.
* A worker cut off from the database cancels an async job that awaits without a checkpoint
  once no heartbeat has confirmed its run within its heartbeat timeout, and reports nothing:
  the job does not run on beside the retry another worker starts after reaping the run.
* A run whose task cannot be made (a job installed a task factory that raises) fails with
  the error; the other runs of its batch run, and the worker goes on claiming.
* An ``async def`` job behind a plain decorator, and an object whose ``__call__`` is
  ``async def``, run their bodies (calling them only makes a coroutine).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness import (
    Conn,
    Database,
    Processes,
    cancel_a_running_job,
    cut_off_mid_job,
    executions,
    scalar,
    task_factory_breaking_app,
    wait_finished,
    wait_for,
    worker_thread,
)
from pgtick import aio
from pgtick.app import App, Context
from pgtick.worker import Worker


def test_many_async_jobs_run_at_once_on_one_event_loop_next_to_a_thread_job(
    procs: Processes, conn: Conn
) -> None:
    count = 8
    replica = procs.replica("async_app.py", "replica", "--concurrency", str(count + 1))
    worker = replica.worker_id
    ids = [
        scalar(conn, "SELECT id FROM jobs.enqueue('together', %s)", (f'{{"expect": {count}}}',))
        for _ in range(count)
    ]
    plain = scalar(conn, "SELECT id FROM jobs.enqueue('plain')")
    wait_for(
        "every run to finish",
        lambda: scalar(
            conn,
            "SELECT count(*) = %s FROM jobs.runs WHERE finished_at IS NOT NULL",
            (count + 1,),
        ),
        timeout=60,
    )
    runs = conn.execute("SELECT id, status::text, worker, result FROM jobs.runs ORDER BY id").fetchall()
    loops = conn.execute("SELECT DISTINCT loop_id, thread_id, pid FROM public.loops").fetchall()
    log = replica.log()

    context = f"runs {runs}; loops {loops}\n{log}"
    statuses = {r[0]: r[1] for r in runs}
    assert all(statuses[i] == "COMPLETED" for i in ids), f"async runs did not all run at once: {context}"
    assert statuses[plain] == "COMPLETED", context
    assert all(r[2] == worker for r in runs), context
    assert len(loops) == 1, f"async jobs ran on {len(loops)} loops/threads: {context}"
    assert loops[0][2] == replica.pid, context
    plain_result = next(r[3] for r in runs if r[0] == plain)
    assert plain_result["thread"].startswith("pgtick-job-"), f"the plain job left its thread: {context}"


def test_cancel_from_psql_stops_an_async_job_at_its_await_checkpoint_after_compensation(
    db: Database, procs: Processes, conn: Conn
) -> None:
    replica, cancelled = cancel_a_running_job(
        procs, db, conn, "async_app.py", "async-mutating", '{"seconds": 60}'
    )
    executed = executions(conn)
    context = f"{cancelled}; executions {executed}\n{replica.log()}"
    cancelled.check_compensated_first(replica, context)
    assert len(executed) == 1 and executed[0][1] in ("Cancelled", "CancelledError"), context


def test_an_async_job_past_its_timeout_is_interrupted_at_its_await(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("async_app.py", "replica")
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('async-sleeps')")
    status = wait_finished(conn, run_id)
    run = conn.execute(
        "SELECT failure_reason, error, finished_at - started_at FROM jobs.runs WHERE id = %s", (run_id,)
    ).fetchone()
    executed = executions(conn)
    log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; executions {executed}\n{log}"
    assert status == "FAILED" and run[0] == "Timeout", context
    assert run[2] >= timedelta(seconds=1), f"stopped before its 1 s timeout: {context}"
    assert executed == [(run_id, "CancelledError")], context


def test_an_async_job_of_a_worker_cut_off_from_the_database_is_cancelled_before_its_retry_completes(
    db: Database, procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """The victim's login is refused and its sessions ended while its async job appends to a
    file every 50 ms, awaiting between lines but never checkpointing. Once no heartbeat has
    confirmed the run within its heartbeat timeout, the victim cancels the job's task and
    reports nothing; the survivor's leader reaps the run (HeartbeatLost) and runs its retry. The
    first attempt's lines end before the retry completes; the victim runs the next job."""

    def stopped(run_id: int, pid: int) -> bool:
        return bool(
            scalar(
                conn,
                "SELECT count(*) FROM public.executions WHERE run_id = %s AND exited IS NOT NULL",
                (run_id,),
            )
        )

    cut = cut_off_mid_job(
        db, procs, conn, tmp_path / "appended", "async_app.py", "async-appends", "plain", stopped
    )
    context, log = cut.context, cut.victim.log()
    firsts = [t for a, t in cut.appended if a == 1]
    exits = executions(conn, "run_id, attempt, outcome")
    assert firsts, f"the first attempt appended nothing: {context}"
    assert max(firsts) < cut.retry_finished, f"the cut-off job ran on past its retry: {context}"
    assert (cut.run_id, 1, "CancelledError") in exits, f"executions {exits}: {context}"
    assert cut.first == ("FAILED", "HeartbeatLost", cut.victim_worker), f"not left to the reaper: {context}"
    cancelled = f"run={cut.run_id} kind=async-appends worker={cut.victim_worker} job cancelled"
    assert log.count(cancelled) == 1, context
    assert "Traceback" not in log, context
    assert cut.alive, f"the victim exited: {context}"
    assert cut.after_worker == cut.victim_worker, f"the next run ran on {cut.after_worker}: {context}"


def test_a_run_whose_task_cannot_be_made_fails_and_the_worker_goes_on(db: Database, conn: Conn) -> None:
    """One job installs a task factory that raises once; the next async run handed to the
    loop fails with that error. Every other run (of that batch, and of the batch claimed
    after) completes: none is left RUNNING with live heartbeats, and the worker still claims."""
    app = task_factory_breaking_app()

    def ended(ids: list[int]) -> bool:
        sql = "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s) AND finished_at IS NOT NULL"
        return bool(scalar(conn, sql, (ids,)) == len(ids))

    worker = Worker(app, db.dsn, concurrency=5, poll_interval=0.1)
    with worker_thread(worker):
        breaks = scalar(conn, "SELECT id FROM jobs.enqueue('breaks-the-next-task')")
        wait_for(f"run {breaks} to end", lambda: ended([breaks]) or None, timeout=60)
        batch = [r[0] for r in conn.execute("SELECT id FROM jobs.enqueue_many('answer', '[{}, {}, {}, {}]')")]
        wait_for(f"runs {batch} to end", lambda: ended(batch) or None, timeout=60)
        after = scalar(conn, "SELECT id FROM jobs.enqueue('answer')")
        wait_for(f"run {after} to end", lambda: ended([after]) or None, timeout=60)
    runs = conn.execute("SELECT id, status::text, error, result FROM jobs.runs ORDER BY id").fetchall()
    failed = [r for r in runs if r[1] == "FAILED"]
    assert runs[0][:2] == (breaks, "COMPLETED"), runs
    assert len(failed) == 1 and failed[0][0] in batch, f"not one run of the batch failed: {runs}"
    assert failed[0][2] == "the worker could not start the job's task: RuntimeError: no task today", runs
    assert all(r[1] == "COMPLETED" and r[3] == r[0] for r in runs[1:] if r is not failed[0]), runs


def _plainly_decorated(fn: Callable[[Context], Any]) -> Callable[[Context], Any]:
    """A decorator as many are written: a plain function that calls the job and returns what
    it returns (for an ``async def`` job, its coroutine)."""

    @functools.wraps(fn)
    def job(ctx: Context) -> Any:
        return fn(ctx)

    return job


@_plainly_decorated
async def decorated_job(ctx: Context) -> dict[str, str]:
    await asyncio.sleep(0)
    return {"ran": "decorated", "thread": threading.current_thread().name}


class CallableJob:
    """A job that is an object whose ``__call__`` is ``async def``."""

    async def __call__(self, ctx: Context) -> dict[str, str]:
        await asyncio.sleep(0)
        return {"ran": "object", "thread": threading.current_thread().name}


def test_an_async_job_behind_a_plain_decorator_or_an_async_call_method_runs_its_body(
    db: Database, conn: Conn
) -> None:
    """Calling either returns a coroutine, not the job's result: the body runs (the object's
    on the worker's event loop, as an ``async def`` job does; the decorated one, which looks
    like a plain function, on a loop of its own in a job thread, and in a job process), and
    the result is what the body returned, not a failure to store a coroutine."""
    app = App("async-shapes")
    app.job("decorated")(decorated_job)
    app.job("decorated-in-a-process", isolation="process")(decorated_job)
    app.job("object")(CallableJob())
    worker = Worker(app, db.dsn, concurrency=3, poll_interval=0.1)
    with worker_thread(worker):
        ids = [scalar(conn, "SELECT id FROM jobs.enqueue(%s)", (k,)) for k in app.jobs]
        ended = [wait_finished(conn, run_id) for run_id in ids]
    runs = conn.execute("SELECT kind, status::text, error, result FROM jobs.runs ORDER BY id").fetchall()
    assert ended == ["COMPLETED"] * 3, runs
    results = {kind: result for kind, _, _, result in runs}
    assert results["decorated"]["ran"] == "decorated", runs
    assert results["decorated-in-a-process"]["ran"] == "decorated", runs
    assert results["object"] == {"ran": "object", "thread": "pgtick-loop"}, runs


def test_an_async_job_that_blocks_the_event_loop_is_named_and_its_heartbeats_go_on(
    db: Database, conn: Conn, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that blocks the loop (a call that does not await) holds up every other async job:
    the worker says which run does it, while the heartbeats of its run go on (they run on a
    thread of their own, so the reaper does not take it); once it returns, the loop goes on."""
    monkeypatch.setattr(aio, "LOOP_BLOCKED_AFTER", 1.0)
    release = threading.Event()
    app = App("blocking")

    @app.job("blocks")
    async def blocks(ctx: Context) -> str:
        release.wait(300)  # no await: the loop runs nothing else meanwhile
        return "released"

    @app.job("awaits")
    async def awaits(ctx: Context) -> str:
        await asyncio.sleep(0)
        return "ran"

    said = "blocks the worker's event loop"
    worker = Worker(app, db.dsn, concurrency=2, poll_interval=0.1, heartbeat_interval=0.2)
    caplog.set_level(logging.WARNING, logger="pgtick.worker")
    with worker_thread(worker):
        blocked = scalar(conn, "SELECT id FROM jobs.enqueue('blocks')")
        wait_for(
            f"run {blocked} to start",
            lambda: (
                scalar(conn, "SELECT status = 'RUNNING' FROM jobs.runs WHERE id = %s", (blocked,)) or None
            ),
            timeout=60,
        )
        first = scalar(conn, "SELECT heartbeat_at FROM jobs.runs WHERE id = %s", (blocked,))
        other = scalar(conn, "SELECT id FROM jobs.enqueue('awaits')")
        wait_for(
            "the warning", lambda: any(said in r.getMessage() for r in caplog.records) or None, timeout=60
        )
        wait_for(
            f"a heartbeat of run {blocked} while it blocks the loop",
            lambda: (
                scalar(conn, "SELECT heartbeat_at > %s FROM jobs.runs WHERE id = %s", (first, blocked))
                or None
            ),
            timeout=60,
        )
        release.set()
        ended = [wait_finished(conn, run_id) for run_id in (blocked, other)]
    warnings = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert ended == ["COMPLETED", "COMPLETED"], ended
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"run={blocked} kind=blocks worker={worker.worker_id} {said}"), warnings
