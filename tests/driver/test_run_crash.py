"""kill -9 of a worker in the middle of a job: the run is reaped and retried elsewhere.

Invariants (DESIGN 1 and 4): the dead worker's run ends FAILED with reason
HeartbeatLost once its heartbeat is older than the run's heartbeat timeout; the
leader among the survivors reaps it and queues attempt 2 (retry_of), which
another worker runs to COMPLETED; nothing is executed twice at the same time.
"""

from __future__ import annotations

import signal
from datetime import timedelta

from harness import (
    SHORT_HEARTBEAT,
    Conn,
    Processes,
    pid_of_owner,
    scalar,
    start_sleepy_run,
    wait_for,
    wait_retry_completed,
)


def test_worker_killed_mid_job_is_reaped_and_retried_on_another_worker(procs: Processes, conn: Conn) -> None:
    replicas = [procs.replica("work_app.py", f"replica{i}") for i in range(2)]
    workers = {r.pid: r.worker_id for r in replicas}
    run_id, victim_pid = start_sleepy_run(conn, 30)
    wait_for(
        f"run {run_id} to heartbeat",
        lambda: scalar(conn, "SELECT heartbeat_at FROM jobs.runs WHERE id = %s", (run_id,)),
        timeout=60,
    )
    victim = procs.by_pid(victim_pid)
    survivor = next(r for r in replicas if r is not victim)
    assert victim is not None, f"run {run_id} executed by pid {victim_pid}, no replica: {workers}"

    victim.send(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    retry = wait_retry_completed(conn, run_id, "id, attempt, status::text, worker, origin")
    first = conn.execute(
        "SELECT status::text, failure_reason, worker, error, finished_at - heartbeat_at"
        " FROM jobs.runs WHERE id = %s",
        (run_id,),
    ).fetchone()
    executions = conn.execute(
        "SELECT run_id, attempt, pid, worker, exited IS NOT NULL, outcome FROM public.executions ORDER BY id"
    ).fetchall()
    survivor_log = survivor.log()
    logs = procs.tails()

    assert first is not None
    status, reason, worker, error, silent_for = first
    context = f"run {run_id}: {first}; retry {retry}; executions {executions}\n{logs}"
    assert (status, reason) == ("FAILED", "HeartbeatLost"), context
    assert worker == workers[victim.pid] and worker in error, context
    assert silent_for >= timedelta(seconds=SHORT_HEARTBEAT), f"reaped before its heartbeat timeout: {context}"
    retry_id, attempt, _, retry_worker, origin = retry
    assert (attempt, origin) == (2, "retry"), context
    assert pid_of_owner(retry_worker) == survivor.pid, f"retry not on the survivor {survivor.pid}: {context}"
    assert f"run={run_id} reaped reason=HeartbeatLost retry={retry_id}" in survivor_log, (
        f"the survivor's leader did not reap run {run_id}: {context}"
    )
    assert executions == [
        (run_id, 1, victim.pid, workers[victim.pid], False, None),
        (retry_id, 2, survivor.pid, workers[survivor.pid], True, "returned"),
    ], context
