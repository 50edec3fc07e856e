"""Job code that ends badly still ends its run: a failure is reported, the slot comes back.

`sys.exit()` in job code raises SystemExit, a BaseException: the run must end FAILED
with the class in its error, not leave its executor thread dead and the run RUNNING
with live heartbeats (which the reaper would never take; DESIGN invariant 4).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harness import Conn, Database, Processes, runs_in, scalar, wait_for, worker_thread
from pgtick.app import App, Context
from pgtick.definitions import sync_app
from pgtick.errors import Abandoned, Cancelled, JobStopped
from pgtick.reporter import MAX_MESSAGE
from pgtick.worker import Worker


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


class _LazyMapping(dict[str, int]):
    """A mapping whose items come from somewhere that fails (a lazy loader)."""

    def items(self) -> Any:
        raise KeyError("lazy field not loaded")


class _Huge(dict[str, int]):
    """A mapping too large to encode."""

    def items(self) -> Any:
        raise MemoryError


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (_LazyMapping(a=1), "the result could not be stored: KeyError: 'lazy field not loaded'"),
        (_Huge(a=1), "the result could not be stored: MemoryError: "),
        (
            {True: 1, "true": 2},
            "the result could not be stored: ValueError: two keys that JSON writes alike"
            " (True and 'true', 1 and '1'): one would be lost",
        ),
    ],
)
def test_a_result_whose_encoding_raises_fails_only_its_run(db: Database, result: Any, error: str) -> None:
    """Whatever encoding a job's result as JSON raises is about that result: its run fails
    saying why, a neighbour running beside it completes, and the worker goes on claiming."""
    app = App()
    release = threading.Event()

    @app.job("poison")
    def poison(ctx: Context) -> Any:
        return result

    @app.job("neighbour")
    def neighbour(ctx: Context) -> Any:
        assert release.wait(60)
        return {"ok": True}

    worker = Worker(app, db.dsn, concurrency=2, poll_interval=0.1)
    with worker_thread(worker), db.connect() as conn:
        beside = scalar(conn, "SELECT id FROM jobs.enqueue('neighbour')")
        wait_for("the neighbour to start", lambda: runs_in(conn, "RUNNING") == 1, timeout=60)
        bad = scalar(conn, "SELECT id FROM jobs.enqueue('poison')")
        status = "SELECT status::text FROM jobs.runs WHERE id = %s"
        wait_for(f"run {bad} to fail", lambda: scalar(conn, status, (bad,)) == "FAILED", timeout=60)
        release.set()
        after = scalar(conn, "SELECT id FROM jobs.enqueue('neighbour')")
        wait_for("the later run to complete", lambda: scalar(conn, status, (after,)) == "COMPLETED", 60)
        runs = conn.execute(
            "SELECT id, status::text, error FROM jobs.runs WHERE id = ANY(%s) ORDER BY id", ([beside, bad],)
        ).fetchall()
    assert runs == [(beside, "COMPLETED", None), (bad, "FAILED", error)], runs


@pytest.mark.parametrize("stopped", [Cancelled, Abandoned])
def test_job_code_raising_cancelled_or_abandoned_on_its_own_fails_its_run_by_policy(
    db: Database, stopped: type[JobStopped]
) -> None:
    """pgtick's own Cancelled and Abandoned end a run CANCELLED, or let it go unreported, only
    when the worker has seen its cancel requested or lost it. Raised by job code on its own,
    either is an error like any other: the run fails with it and is retried by its policy,
    not left RUNNING (refused as a cancellation; or let go, for the reaper to fail it as
    HeartbeatLost a heartbeat timeout later)."""
    app = App()

    @app.job("stops-itself", retry_on=[stopped], max_attempts=2, backoff=0, jitter=0)
    def stops_itself(ctx: Context) -> None:
        raise stopped(f"raised by run {ctx.run_id} itself")

    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1)
    with db.connect() as conn:
        sync_app(app, conn)
        first = scalar(conn, "SELECT id FROM jobs.enqueue('stops-itself')")
        ended = "SELECT count(*) FROM jobs.runs WHERE status NOT IN ('QUEUED', 'RUNNING')"
        with worker_thread(worker):
            wait_for("the run and its retry to end", lambda: scalar(conn, ended) == 2 or None, timeout=60)
        runs = conn.execute(
            "SELECT id, attempt, retry_of, status::text, failure_reason, error FROM jobs.runs ORDER BY id"
        ).fetchall()
    name = stopped.__name__
    assert [r[1:5] for r in runs] == [
        (1, None, "FAILED", "Error"),
        (2, first, "FAILED", "Error"),
    ], runs
    assert [r[5] for r in runs] == [f"{name}: raised by run {r[0]} itself" for r in runs], runs


#: Far longer than a run's error keeps.
HUGE = 1_000_000


def raises_a_huge_message(ctx: Context) -> None:
    """Module level: a job process imports it by name."""
    raise ValueError("x" * HUGE)


async def raises_a_huge_message_async(ctx: Context) -> None:
    raise ValueError("x" * HUGE)


def test_an_error_with_a_huge_message_keeps_its_head_said_shortened_and_a_process_jobs_traceback(
    db: Database,
) -> None:
    """An error whose message is far longer than a run's error keeps is stored as the head of
    its message, saying the message was shortened, the same in a thread, on the event loop and
    in a job process; a process job's traceback follows the head, its innermost frame and its
    error's line there, and the whole fits the run's error."""
    app = App()
    app.job("in-thread", max_attempts=1)(raises_a_huge_message)
    app.job("in-async", max_attempts=1)(raises_a_huge_message_async)
    app.job("in-process", isolation="process", max_attempts=1)(raises_a_huge_message)
    kinds = ["in-thread", "in-async", "in-process"]
    worker = Worker(app, db.dsn, concurrency=3, poll_interval=0.1)
    with worker_thread(worker), db.connect() as conn:
        ids = [scalar(conn, "SELECT id FROM jobs.enqueue(%s)", (kind,)) for kind in kinds]
        ended = "SELECT count(*) FROM jobs.runs WHERE status = 'FAILED'"
        wait_for("the three runs to fail", lambda: scalar(conn, ended) == 3 or None, timeout=60)
        errors = dict(conn.execute("SELECT kind, error FROM jobs.runs WHERE id = ANY(%s)", (ids,)).fetchall())
    context = "\n".join(f"{k}: {len(e)} characters, {e[:80]!r} ... {e[-400:]!r}" for k, e in errors.items())
    heads = {kind: error.split("\n\n", 1)[0] for kind, error in errors.items()}
    head = heads["in-thread"]
    assert head.startswith("ValueError: xxxx") and len(head) < MAX_MESSAGE // 2, context
    assert "message shortened" in head and f"{HUGE}" not in head, context
    assert heads == {kind: head for kind in kinds}, f"the engines store the message unlike: {context}"
    assert errors["in-thread"] == head and errors["in-async"] == head, context
    process = errors["in-process"]
    trace = process[len(head) :]
    assert len(process) <= MAX_MESSAGE, context
    assert "job process pid" in trace and "Traceback (most recent call last)" in trace, context
    assert "in raises_a_huge_message" in trace, f"the traceback lost its frames: {context}"
    assert trace.rstrip().splitlines()[-1].startswith("ValueError: xxxx"), context
