"""Job code that ends badly still ends its run: a failure is reported, the slot comes back.

`sys.exit()` in job code raises SystemExit, a BaseException: the run must end FAILED
with the class in its error, not leave its executor thread dead and the run RUNNING
with live heartbeats (which the reaper would never take; DESIGN invariant 4).
"""

from __future__ import annotations

from harness import Conn, Processes, scalar, wait_for


def test_sys_exit_in_job_code_fails_the_run_and_frees_its_slot(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("work_app.py", "replica", "--concurrency", "1")
    worker = replica.worker_id
    exits = scalar(conn, """SELECT id FROM jobs.enqueue('exits', '{"code": 3}')""")
    after = scalar(conn, "SELECT id FROM jobs.enqueue('quick')")
    wait_for(
        f"runs {exits} and {after} to end",
        lambda: scalar(
            conn,
            "SELECT bool_and(finished_at IS NOT NULL) FROM jobs.runs WHERE id = ANY(%s)",
            ([exits, after],),
        ),
        timeout=60,
    )
    runs = conn.execute(
        "SELECT id, status::text, failure_reason, error, worker FROM jobs.runs ORDER BY id"
    ).fetchall()
    alive = replica.popen.poll() is None
    log = replica.log()

    context = f"runs {runs}\n{log}"
    assert runs == [
        (exits, "FAILED", "Error", "SystemExit: 3", worker),
        (after, "COMPLETED", None, None, worker),  # the one slot was given back
    ], context
    assert alive, f"the worker process died with its job: {context}"
