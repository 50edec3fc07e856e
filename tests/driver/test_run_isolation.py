"""``isolation="process"`` under `pgtick run`: the job runs in a child process.

* A job stuck in ``time.sleep(3600)`` (no checkpoint) is killed at its timeout: the run
  fails with reason 'Timeout' and the job's process is gone.
* A cancel from psql kills the job's process; the kind's compensation runs in the
  worker process, and commits before the run is stamped CANCELLED.
* An exception's class chain reaches the retry policy, its traceback the run's error.
* Results come back; consecutive jobs reuse the pool's child process.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

from harness import Database, processes, scalar, wait_for

#: A stopped job ends long before this; a job left to its time.sleep(3600) would not.
SLACK = timedelta(seconds=15)


def _finished(conn: object, run_id: int) -> object:
    return scalar(
        conn,  # type: ignore[arg-type]
        "SELECT status::text FROM jobs.runs WHERE id = %s AND finished_at IS NOT NULL",
        (run_id,),
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_process_job_stuck_in_sleep_is_killed_at_its_timeout(db: Database, tmp_path: Path) -> None:
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        replica = procs.replica("isolated_app.py", "replica")
        worker = replica.worker_id
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('stuck')")
        child = wait_for(
            f"run {run_id} to start",
            lambda: scalar(conn, "SELECT pid FROM public.executions WHERE run_id = %s", (run_id,)),
            timeout=60,
        )
        status = wait_for(f"run {run_id} to end", lambda: _finished(conn, run_id), timeout=60)
        run = conn.execute(
            "SELECT failure_reason, error, finished_at - started_at, worker FROM jobs.runs WHERE id = %s",
            (run_id,),
        ).fetchone()
        gone = wait_for(f"job process {child} to be gone", lambda: not _alive(child) or None, timeout=60)
        log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; job pid {child}, worker pid {replica.pid}\n{log}"
    assert child != replica.pid, f"the job ran in the worker process: {context}"
    assert status == "FAILED" and run[0] == "Timeout" and run[3] == worker, context
    assert "killed" in run[1], context
    assert timedelta(seconds=2) <= run[2] < timedelta(seconds=2) + SLACK, context
    assert gone


def test_cancel_from_psql_kills_a_process_job_and_compensation_runs_in_the_worker(
    db: Database, tmp_path: Path
) -> None:
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        replica = procs.replica("isolated_app.py", "replica")
        worker = replica.worker_id
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('stuck-mutating')")
        child = wait_for(
            f"run {run_id} to start",
            lambda: scalar(conn, "SELECT pid FROM public.executions WHERE run_id = %s", (run_id,)),
            timeout=60,
        )
        answer = db.psql(f"SELECT jobs.cancel({run_id})")
        status = wait_for(f"run {run_id} to end", lambda: _finished(conn, run_id), timeout=60)
        run = conn.execute("SELECT worker, finished_at FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
        compensations = conn.execute(
            "SELECT pid, worker, at FROM public.compensations WHERE run_id = %s", (run_id,)
        ).fetchall()
        executions = conn.execute("SELECT run_id, pid, exited FROM public.executions").fetchall()
        gone = wait_for(f"job process {child} to be gone", lambda: not _alive(child) or None, timeout=60)
        log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; compensations {compensations}; executions {executions}\n{log}"
    assert answer == "RUNNING", f"jobs.cancel said {answer!r}: {context}"
    assert status == "CANCELLED" and run[0] == worker, context
    assert len(compensations) == 1, f"compensation must run exactly once: {context}"
    assert compensations[0][:2] == (replica.pid, worker), f"compensation not in the worker: {context}"
    assert compensations[0][2] <= run[1], f"stamped CANCELLED before compensation ran: {context}"
    assert executions == [(run_id, child, None)], f"the job was not killed mid-sleep: {context}"
    assert gone


def test_a_process_job_error_keeps_its_class_chain_for_retries_and_its_traceback(
    db: Database, tmp_path: Path
) -> None:
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        replica = procs.replica("isolated_app.py", "replica")
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('isolated-fails')")
        wait_for(
            f"run {run_id} and its retry to fail",
            lambda: scalar(conn, "SELECT count(*) = 2 FROM jobs.runs WHERE status = 'FAILED'") or None,
            timeout=60,
        )
        runs = conn.execute(
            "SELECT id, retry_of, attempt, failure_reason, error FROM jobs.runs ORDER BY id"
        ).fetchall()
        log = replica.log()

    context = f"runs {runs}\n{log}"
    assert [r[2] for r in runs] == [1, 2] and runs[1][1] == run_id, f"RuntimeError not retried: {context}"
    for r in runs:
        assert r[3] == "Error", context
        assert r[4].startswith(f"LedgerLocked: ledger locked for run {r[0]}"), context
        assert "Traceback (most recent call last)" in r[4] and "isolated_fails" in r[4], context


def test_process_jobs_return_results_and_reuse_their_child_process(db: Database, tmp_path: Path) -> None:
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        replica = procs.replica("isolated_app.py", "replica", "--concurrency", "1")
        ids = [
            scalar(conn, "SELECT id FROM jobs.enqueue('isolated-returns', %s)", (f'{{"echo": {i}}}',))
            for i in range(3)
        ]
        wait_for(
            "the runs to complete",
            lambda: scalar(conn, "SELECT count(*) = 3 FROM jobs.runs WHERE status = 'COMPLETED'") or None,
            timeout=60,
        )
        results = [scalar(conn, "SELECT result FROM jobs.runs WHERE id = %s", (i,)) for i in ids]
        log = replica.log()

    context = f"results {results}\n{log}"
    assert [r["echo"] for r in results] == [0, 1, 2], context
    pids = {r["pid"] for r in results}
    assert replica.pid not in pids, f"a job ran in the worker process: {context}"
    assert len(pids) == 1, f"each job started a process of its own: {context}"


def test_a_job_process_killed_from_outside_fails_the_run_with_its_exit_code(
    db: Database, tmp_path: Path
) -> None:
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        replica = procs.replica("isolated_app.py", "replica")
        assert replica.worker_id  # started: its tables exist
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('stuck-mutating')")
        child = wait_for(
            f"run {run_id} to start",
            lambda: scalar(conn, "SELECT pid FROM public.executions WHERE run_id = %s", (run_id,)),
            timeout=60,
        )
        os.kill(child, signal.SIGKILL)
        status = wait_for(f"run {run_id} to end", lambda: _finished(conn, run_id), timeout=60)
        run = conn.execute("SELECT failure_reason, error FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
        compensations = scalar(conn, "SELECT count(*) FROM public.compensations")
        alive = replica.popen.poll()
        log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; compensations {compensations}\n{log}"
    assert status == "FAILED" and run[0] == "Error", context
    expected = f"JobProcessExited: job process pid {child} exited with code -9 before reporting"
    assert run[1] == expected, context
    assert compensations == 0, f"a failure is not a cancel: {context}"
    assert alive is None, f"the worker died with its job process: {context}"
