"""SIGTERM to `pgtick run`: claim nothing more, drain within the grace period, exit 0.

A run in flight that finishes within the grace is COMPLETED and reported; one that
does not is left RUNNING, stops heartbeating, and the reaper fails it HeartbeatLost
after its heartbeat timeout (DESIGN invariant 4: a stop at any point is repaired). Runs
claimed ahead (``--batch`` above ``--concurrency``) that had not begun go back to the queue
at once, as they were: same attempt, same ``scheduled_for``. A kind's timeout counts from
when its job began, not from the claim.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

from harness import Conn, Proc, Processes, enqueue, executions, scalar, wait_finished, wait_for, wait_started
from pgtick.supervisor import REPEAT_WINDOW


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: neither gone nor a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def signal_and_wait_for_drain(replica: Proc) -> float:
    replica.send(signal.SIGTERM)
    signalled = time.monotonic()
    # Once the worker logs this its claim loop is over: anything queued from now on stays queued.
    replica.wait_log(r"worker=\S+ stopping: 1 run in flight", timeout=60)
    return signalled


def test_sigterm_finishes_the_run_in_flight_and_claims_nothing_more(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("work_app.py", "replica", grace="5s")
    worker = replica.worker_id
    run_id = enqueue(conn, "sleepy", '{"seconds": 2}')
    wait_started(conn, run_id)
    signalled = signal_and_wait_for_drain(replica)
    later = [enqueue(conn, "quick", "{}") for _ in range(3)]
    code = replica.wait(10)
    took = time.monotonic() - signalled
    run = conn.execute(
        "SELECT status::text, worker, result FROM jobs.runs WHERE id = %s", (run_id,)
    ).fetchone()
    queued = conn.execute(
        "SELECT id, status::text, worker FROM jobs.runs WHERE id = ANY(%s) ORDER BY id", (later,)
    ).fetchall()
    executed = executions(conn)
    log = replica.log()

    context = f"run {run_id}: {run}; later {queued}; executions {executed}; took {took:.2f}s\n{log}"
    assert code == 0, context
    assert run == ("COMPLETED", worker, {"slept": 2.0, "attempt": 1}), context
    assert took < 5, f"drain exceeded the grace period: {context}"
    assert executed == [(run_id, "returned")], f"something ran after SIGTERM: {context}"
    assert queued == [(i, "QUEUED", None) for i in later], f"claimed after SIGTERM: {context}"
    assert "grace over" not in log, context


def test_sigterm_with_a_job_longer_than_the_grace_leaves_it_to_the_reaper(
    procs: Processes, conn: Conn
) -> None:
    replica = procs.replica("work_app.py", "replica", grace="1s")
    worker = replica.worker_id
    run_id = enqueue(conn, "sleepy", '{"seconds": 30}', max_attempts="1", heartbeat_timeout="'2 seconds'")
    wait_started(conn, run_id)
    signalled = signal_and_wait_for_drain(replica)
    code = replica.wait(6)
    took = time.monotonic() - signalled
    left = conn.execute("SELECT status::text, worker FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
    reaped = wait_for(
        f"jobs.reap() to take run {run_id}",
        lambda: conn.execute("SELECT run_id, reason, retry_run_id FROM jobs.reap()").fetchall(),
        timeout=60,
        interval=0.2,
    )
    run = conn.execute(
        "SELECT status::text, failure_reason, finished_at - heartbeat_at FROM jobs.runs WHERE id = %s",
        (run_id,),
    ).fetchone()
    executed = executions(conn, "run_id, exited IS NOT NULL, outcome")
    log = replica.log()

    context = f"run {run_id}: left {left}, then {run}; reaped {reaped}; took {took:.2f}s\n{log}"
    assert code == 0, context
    assert 0.9 <= took < 5, f"did not wait for the 1 s grace, or overran it: {context}"
    assert f"grace over; leaving runs={run_id} to the reaper" in log, context
    assert left == ("RUNNING", worker), f"the run left behind is not RUNNING as its worker's: {context}"
    assert reaped == [(run_id, "HeartbeatLost", None)], context
    assert run is not None and run[:2] == ("FAILED", "HeartbeatLost"), context
    assert run[2] >= timedelta(seconds=2), f"reaped before its heartbeat timeout: {context}"
    assert executed == [(run_id, False, None)], f"the job should have died mid-run: {context}"


def test_sigterm_hands_back_at_once_the_runs_claimed_ahead_that_had_not_begun(
    procs: Processes, conn: Conn
) -> None:
    replica = procs.replica("work_app.py", "replica", "--concurrency", "1", "--batch", "4", grace="10s")
    assert replica.worker_id  # started: its tables exist
    # One statement: the four commit together, so the worker's first claim takes them all. Due
    # an hour ago: a run given back keeps that, its lateness and its place in the claim order.
    due = dict(
        conn.execute(
            "SELECT (r).id, (r).scheduled_for FROM (SELECT jobs.enqueue('sleepy', '{\"seconds\": 2}',"
            " run_at => now() - interval '1 hour') AS r FROM generate_series(1, 4)) AS e ORDER BY 1"
        ).fetchall()
    )
    runs = sorted(due)
    first = wait_started(conn, runs[0])
    assert first
    replica.send(signal.SIGTERM)
    code = replica.wait(30)
    states = conn.execute(
        "SELECT id, status::text, attempt, worker, scheduled_for FROM jobs.runs"
        " WHERE id = ANY(%s) ORDER BY id",
        (runs,),
    ).fetchall()
    executed = [r[0] for r in executions(conn)]
    log = replica.log()

    context = f"runs {states}; executed {executed}\n{log}"
    assert code == 0, context
    begun = set(executed)
    assert begun and begun <= set(runs), context
    for run_id, status, attempt, worker, scheduled_for in states:
        if run_id in begun:
            assert status == "COMPLETED", context
        else:  # claimed ahead, never begun: back in the queue as it was, no attempt spent, no owner
            assert (status, attempt, worker, scheduled_for) == ("QUEUED", 1, None, due[run_id]), context
    assert len(begun) < len(runs), f"every run began before the stop: nothing was tested\n{context}"
    assert "handed back runs=" in log and "grace over" not in log, context


def test_a_kinds_timeout_counts_from_when_its_job_began_not_from_the_claim(
    procs: Processes, conn: Conn
) -> None:
    """Three runs of a kind with a 1 s timeout, claimed together by a worker that runs one at
    a time, each working 0.6 s: each is within its timeout, though the last begins 1.2 s after
    the claim."""
    assert procs.replica("work_app.py", "replica", "--concurrency", "1", "--batch", "3").worker_id
    runs = [  # committed together: claimed in one batch
        r[0]
        for r in conn.execute(
            "SELECT (jobs.enqueue('timeboxed', '{\"seconds\": 0.6}')).id"
            " FROM generate_series(1, 3) ORDER BY 1"
        ).fetchall()
    ]
    finished = wait_for(
        "the three runs to finish",
        lambda: (
            conn.execute(
                "SELECT id, status::text, failure_reason FROM jobs.runs WHERE id = ANY(%s)"
                " AND status <> 'RUNNING' AND status <> 'QUEUED' ORDER BY id",
                (runs,),
            ).fetchall()
            if scalar(
                conn, "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s) AND finished_at IS NOT NULL", (runs,)
            )
            == 3
            else None
        ),
        timeout=60,
    )
    assert finished == [(r, "COMPLETED", None) for r in runs], finished


def test_a_job_that_closes_stderr_stops_neither_the_worker_nor_its_shutdown(
    procs: Processes, conn: Conn
) -> None:
    """The worker logs to stderr: once job code closed it, a log line is dropped, not raised
    in the worker's threads, which go on claiming and exit 0 on SIGTERM."""
    replica = procs.replica("work_app.py", "replica", grace="5s")
    closer = enqueue(conn, "closes-stderr", "{}")
    assert wait_finished(conn, closer) == "COMPLETED"
    later = [enqueue(conn, "quick", "{}") for _ in range(3)]
    assert [wait_finished(conn, run_id) for run_id in later] == ["COMPLETED"] * 3
    replica.send(signal.SIGTERM)
    code = replica.wait(60)
    statuses = conn.execute("SELECT id, status::text FROM jobs.runs ORDER BY id").fetchall()
    assert code == 0, f"exit {code}; runs {statuses}\n{replica.log()}"
    assert {s for _, s in statuses} == {"COMPLETED"}, statuses


def test_a_job_that_leaves_a_thread_running_does_not_keep_the_process_after_sigterm(
    procs: Processes, conn: Conn
) -> None:
    replica = procs.replica("work_app.py", "replica", grace="2s")
    run_id = enqueue(conn, "leaves-a-thread", "{}")
    assert wait_finished(conn, run_id) == "COMPLETED"
    replica.send(signal.SIGTERM)
    code = replica.wait(60)  # the thread sleeps 600 s
    log = replica.log()
    assert code == 0, f"exit {code}\n{log}"
    assert "threads job code started still running: job-sleeper" in log, log


def test_a_second_sigterm_while_draining_exits_at_once_and_leaves_the_run_to_the_reaper(
    procs: Processes, conn: Conn
) -> None:
    """The first SIGTERM drains within a 60 s grace; a second one says "exiting now": the
    process ends within seconds, exit code 1, with no traceback, even with a job in a job
    process of its own (which ignores SIGTERM, and Python's exit waits for), and the run in
    flight is left RUNNING to the reaper, as at the end of a grace; its job process is gone."""
    replica = procs.replica("isolated_app.py", "replica", grace="60s")
    worker = replica.worker_id
    run_id = enqueue(conn, "stuck-mutating", "{}", max_attempts="1")
    wait_started(conn, run_id)
    job_pid = int(wait_for("the job to begin", lambda: scalar(conn, "SELECT max(pid) FROM executions"), 60))
    signalled = signal_and_wait_for_drain(replica)
    # A second signal is one sent after the first's repeat window (a lower bound, not a guess
    # at speed): within it, the same signal is the first one delivered twice.
    time.sleep(max(0.0, signalled + REPEAT_WINDOW + 0.1 - time.monotonic()))
    replica.send(signal.SIGTERM)
    second = time.monotonic()
    replica.wait_log(r"second signal: exiting now", timeout=60)
    code = replica.wait(60)
    took = time.monotonic() - second
    left = conn.execute("SELECT status::text, worker FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
    log = replica.log()

    context = f"run {run_id}: {left}; took {took:.2f}s, exit {code}\n{log}"
    assert took < 20, f"a second signal must not wait out the 60 s grace: {context}"
    assert code == 1, context
    assert "Traceback" not in log, context
    assert left == ("RUNNING", worker), f"the run in flight is the reaper's: {context}"
    wait_for(f"the job process (pid {job_pid}) to end", lambda: not _running(job_pid) or None, 30)
