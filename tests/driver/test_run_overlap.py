"""overlap_policy under a real overlap: a `pgtick run` replica works a long occurrence
while newer ones come due.

* cancel_other: the newer occurrence asks the running one to cancel; the worker sees it
  at its next heartbeat, the job stops at a checkpoint, and only then the newer one starts.
* buffer_one: while one runs, one newer occurrence waits and the rest are Skipped.
"""

from __future__ import annotations

from typing import Any

from harness import Conn, Processes, finished_status, scalar, wait_finished, wait_for


def occurrence(conn: Any, definition_id: int, seconds: float, due: str) -> int:
    """A scheduled occurrence of the definition, due `due` ago, working `seconds`."""
    return int(
        scalar(
            conn,
            "INSERT INTO jobs.runs (definition_id, kind, payload, origin, scheduled_for)"
            " VALUES (%s, 'mutating', jsonb_build_object('seconds', %s::float8), 'schedule',"
            " now() - %s::interval) RETURNING id",
            (definition_id, seconds, due),
        )
    )


def define(conn: Any, name: str, overlap: str) -> int:
    # A yearly schedule: the scheduler itself adds nothing during the test.
    return int(
        scalar(
            conn,
            "SELECT id FROM jobs.define(%s, 'mutating', '0 0 1 1 *', overlap_policy => %s)",
            (name, overlap),
        )
    )


def long_running_occurrence(conn: Any, definition_id: int, due: str) -> int:
    """An occurrence due `due` ago that works for a minute, once a worker has it RUNNING."""
    run_id = occurrence(conn, definition_id, 60, due)
    wait_for(
        f"run {run_id} to start",
        lambda: scalar(conn, "SELECT 1 FROM jobs.runs WHERE id = %s AND status = 'RUNNING'", (run_id,)),
        timeout=60,
    )
    return run_id


def test_cancel_other_stops_the_running_occurrence_then_starts_the_new_one(
    procs: Processes, conn: Conn
) -> None:
    replica = procs.replica("work_app.py", "replica", "--concurrency", "4")
    definition = define(conn, "latest-wins", "cancel_other")
    old = long_running_occurrence(conn, definition, "2 minutes")
    new = occurrence(conn, definition, 0.1, "1 minute")
    wait_finished(conn, new)
    rows = conn.execute(
        "SELECT id, status::text, cancel_requested, started_at, finished_at FROM jobs.runs"
        " WHERE id = ANY(%s) ORDER BY id",
        ([old, new],),
    ).fetchall()
    log = replica.log()
    context = f"{rows}\n{log}"
    (_, old_status, old_asked, _, old_end), (_, new_status, _, new_start, _) = rows
    assert (old_status, old_asked) == ("CANCELLED", True), context
    assert new_status == "COMPLETED", context
    assert new_start >= old_end, f"the new occurrence started before the old one ended: {context}"


def test_buffer_one_lets_one_wait_and_skips_the_rest(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("work_app.py", "replica", "--concurrency", "4")
    definition = define(conn, "buffered", "buffer_one")
    running = long_running_occurrence(conn, definition, "5 minutes")
    waiting, *extra = (occurrence(conn, definition, 0.1, f"{4 - n} minutes") for n in range(4))
    for run_id in extra:
        wait_finished(conn, run_id)
    assert finished_status(conn, waiting) is None, "the one buffered occurrence must still wait"
    conn.execute("SELECT jobs.cancel(%s)", (running,))
    wait_finished(conn, waiting)
    rows = conn.execute(
        "SELECT id, status::text, failure_reason FROM jobs.runs WHERE id = ANY(%s) ORDER BY id",
        ([running, waiting, *extra],),
    ).fetchall()
    log = replica.log()
    assert rows == [
        (running, "CANCELLED", None),
        (waiting, "COMPLETED", None),
        *((run_id, "CANCELLED", "Skipped") for run_id in extra),
    ], f"{rows}\n{log}"
