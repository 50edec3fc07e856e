"""pgtick.contrib.asgi: the example FastAPI app (examples/fastapi_app.py) under httpx.

The lifespan starts an in-process worker and scheduler; a request inserts an order
and enqueues its receipt in one transaction; the worker runs the job. A request that
fails rolls back both: no order, no run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from types import ModuleType
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from harness import ROOT, Database, rows, scalar, wait_for


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_app_example", ROOT / "examples" / "fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.asyncio
async def test_a_request_enqueues_in_its_transaction_and_the_in_process_worker_runs_it(db: Database) -> None:
    api = _example().create_app(db.dsn)
    async with LifespanManager(api) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            ok = await http.post("/orders", json={"item": "book"})
            assert ok.status_code == 200, ok.text
            bad = await http.post("/orders", json={"item": "  "})
            assert bad.status_code == 422, bad.text
        with db.connect() as conn:
            body: dict[str, Any] = ok.json()

            def done() -> bool:
                sent = scalar(
                    conn, "SELECT receipt_sent_at IS NOT NULL FROM orders WHERE id = %s", (body["order"],)
                )
                status = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (body["run"],))
                return bool(sent) and status == "COMPLETED"

            wait_for("the in-process worker to run the job and report it", done, timeout=60)
            runs = rows(conn, "SELECT id, status::text AS status, worker, payload FROM jobs.runs ORDER BY id")
            orders = rows(conn, "SELECT id, item FROM orders ORDER BY id")
    assert orders == [{"id": body["order"], "item": "book"}], "the failed request's order was not rolled back"
    assert [(r["id"], r["payload"]) for r in runs] == [(body["run"], {"order": body["order"]})], (
        f"the failed request's run was not rolled back, or the good one is missing: {runs}"
    )
    assert runs[0]["status"] == "COMPLETED"
    with db.connect() as conn:
        # The listener thread notices the stop within its one-second wait for notifications.
        def gone() -> bool:
            left = rows(
                conn,
                "SELECT application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'pgtick%'",
            )
            return not left

        wait_for("the lifespan's pgtick connections to close after shutdown", gone, timeout=60)


@pytest.mark.asyncio
async def test_a_request_whose_commit_fails_is_answered_as_failed_and_leaves_no_run(db: Database) -> None:
    """The request's transaction commits before its response is sent: a commit refused at the
    end (here by a deferred constraint) is the request's error. Ended after the response, the
    client was told 200 with the id of a run that never existed."""
    api = _example().create_app(db.dsn)
    with db.connect() as conn:
        conn.execute(
            "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'order % refused at commit', NEW.id; END $$"
        )
        conn.execute(
            "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON orders DEFERRABLE INITIALLY"
            " DEFERRED FOR EACH ROW WHEN (NEW.item = 'refused') EXECUTE FUNCTION refuse_at_commit()"
        )
    async with LifespanManager(api) as manager:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            refused = await http.post("/orders", json={"item": "refused"})
            ok = await http.post("/orders", json={"item": "book"})
            with db.connect() as conn:  # at once: the response came after the commit
                runs = rows(conn, "SELECT id, payload FROM jobs.runs ORDER BY id")
                orders = rows(conn, "SELECT id, item FROM orders ORDER BY id")
    assert refused.status_code == 500, (
        f"a request whose commit failed was answered {refused.status_code}: {refused.text}"
    )
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert orders == [{"id": body["order"], "item": "book"}]
    assert [r["id"] for r in runs] == [body["run"]], f"runs after the refused and the good request: {runs}"


@pytest.mark.asyncio
async def test_an_app_started_again_runs_jobs_again_and_leaves_no_threads(db: Database) -> None:
    """One app object through two lifespans, as a test suite with a client per test does:
    each start gets a worker of its own (a worker's threads start once)."""
    api = _example().create_app(db.dsn)
    for round_ in (1, 2):
        async with LifespanManager(api) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                ok = await http.post("/orders", json={"item": f"book {round_}"})
                assert ok.status_code == 200, ok.text
            run = ok.json()["run"]
            with db.connect() as conn:

                def done(run: int = run) -> bool:
                    return bool(
                        scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run,))
                        == "COMPLETED"
                    )

                wait_for(f"start {round_}'s worker to run its job", done, timeout=60)
        # The listener notices the stop within its one-second wait for notifications.
        wait_for(
            f"pgtick's threads to end after shutdown {round_}",
            lambda: not [t.name for t in threading.enumerate() if t.name.startswith("pgtick")],
            timeout=60,
        )


def _pgtick_threads(before: set[threading.Thread]) -> list[str]:
    """The pgtick threads alive now that were not in ``before``."""
    return sorted(
        t.name
        for t in threading.enumerate()
        if t.name.startswith("pgtick") and t.is_alive() and t not in before
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("failure", ["bad-pool-size", "after-the-threads-started"])
async def test_a_failed_startup_leaves_no_worker_claiming_runs(
    db: Database, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever step of the lifespan startup fails, the app never started: every pgtick
    thread it began ends, and a run enqueued afterwards stays QUEUED for a real worker."""
    import pgtick
    from pgtick.contrib import asgi

    jobs = pgtick.App("failed-startup")

    @jobs.job("after-failed-startup")
    def work(ctx: pgtick.Context) -> dict[str, str]:
        return {"ran": "in a worker whose app failed to start"}

    pool_size = 10
    if failure == "bad-pool-size":
        pool_size = 0
    else:

        def refuse(pool: object) -> None:
            raise RuntimeError("the client could not be made")

        monkeypatch.setattr(asgi, "AsyncClient", refuse)
    before = set(threading.enumerate())
    tick = asgi.Pgtick(jobs, db.dsn, scheduler=True, poll_interval=0.1, pool_size=pool_size)
    with pytest.raises((ValueError, RuntimeError)):
        async with tick.lifespan(None):
            pytest.fail("the lifespan started")
    # Stopped, they end: the listener within its next wait for a notification (a second).
    wait_for(
        "no pgtick thread left running after the failed startup",
        lambda: _pgtick_threads(before) == [],
        timeout=60,
    )
    with db.connect() as conn:
        run = scalar(conn, "SELECT id FROM jobs.enqueue('after-failed-startup')")
        time.sleep(1.0)  # ten poll intervals of the worker that must not be running
        status = rows(conn, "SELECT status::text AS status, worker FROM jobs.runs WHERE id = %s", (run,))
    assert status == [{"status": "QUEUED", "worker": None}], f"run {run} was claimed: {status}"


@pytest.mark.asyncio
async def test_startup_on_an_older_schema_fails_saying_to_migrate(db: Database) -> None:
    """A schema that lacks a migration this driver needs (here: the latest one is not
    recorded) fails the lifespan startup with the line that says to run `pgtick migrate`,
    and leaves no thread running, rather than a worker retrying calls the schema lacks."""
    import pgtick
    from pgtick import migrate
    from pgtick.contrib import asgi
    from pgtick.errors import SchemaMismatch

    latest = migrate.migrations()[-1]
    with db.connect() as conn:
        conn.execute("DELETE FROM jobs.schema_migrations WHERE version = %s", (latest.version,))
    before = set(threading.enumerate())
    app = pgtick.App("older-schema")
    app.job("k")(lambda ctx: None)
    tick = asgi.Pgtick(app, db.dsn, scheduler=True, poll_interval=0.1)
    with pytest.raises(
        SchemaMismatch, match=rf"lacks migration {latest.version}_{latest.name}; run `pgtick migrate`"
    ):
        async with tick.lifespan(None):
            pytest.fail("the lifespan started")
    left = _pgtick_threads(before)
    assert left == [], f"threads left running after a failed startup: {left}"


def test_the_readmes_fastapi_snippet_defines_its_app_as_written(db: Database) -> None:
    """The README's FastAPI example, given only what its comment says it needs (``jobs``, an
    App, and ``dsn``): its imports are all there, and FastAPI accepts its dependencies."""
    import re

    import pgtick

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### FastAPI") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "no python block in the README's FastAPI section"
    jobs = pgtick.App("readme")
    jobs.job("send-receipt")(lambda ctx: None)
    scope: dict[str, Any] = {"jobs": jobs, "dsn": db.dsn, "__name__": "readme_fastapi"}
    exec(
        compile(match.group(1), "README.md (FastAPI)", "exec", dont_inherit=True), scope
    )  # as a file runs it
    routes = [getattr(route, "path", None) for route in scope["api"].routes]
    assert "/orders" in routes, routes


@pytest.mark.asyncio
async def test_a_startup_cancelled_while_it_syncs_the_app_leaves_no_worker_claiming_runs(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopped during the lifespan startup (Ctrl-C while the app's schedules are
    written, say) cancels it while the startup goes on in its thread: once that thread is
    done, no pgtick thread runs, and a run enqueued afterwards stays QUEUED."""
    import pgtick
    from pgtick.contrib import asgi

    jobs = pgtick.App("cancelled-startup")

    @jobs.job("after-cancelled-startup")
    def work(ctx: pgtick.Context) -> None:
        return None

    syncing, go_on, synced = threading.Event(), threading.Event(), threading.Event()
    from pgtick.definitions import sync_app as real_sync

    def slow_sync(app: pgtick.App, conn: Any) -> None:
        syncing.set()
        try:
            assert go_on.wait(60), "the test never let the startup go on"
            real_sync(app, conn)
        finally:
            synced.set()

    monkeypatch.setattr(asgi, "sync_app", slow_sync)
    before = set(threading.enumerate())
    tick = asgi.Pgtick(jobs, db.dsn, scheduler=True, poll_interval=0.1)

    async def serve() -> None:
        async with tick.lifespan(None):
            pytest.fail("the lifespan started")

    task = asyncio.create_task(serve())
    assert await asyncio.to_thread(syncing.wait, 60), "the startup never reached the sync"
    task.cancel()
    await asyncio.sleep(0)  # the lifespan's shutdown begins while the sync still waits
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(synced.wait, 60), "the startup's sync never ended"
    wait_for(
        "no pgtick thread left running after the cancelled startup",
        lambda: _pgtick_threads(before) == [],
        timeout=60,
    )
    with db.connect() as conn:
        run = scalar(conn, "SELECT id FROM jobs.enqueue('after-cancelled-startup')")
        time.sleep(1.0)  # ten poll intervals of the worker that must not be running
        status = rows(conn, "SELECT status::text AS status, worker FROM jobs.runs WHERE id = %s", (run,))
    assert status == [{"status": "QUEUED", "worker": None}], f"run {run} was claimed: {status}"


@pytest.mark.asyncio
async def test_a_startup_that_cannot_reach_the_database_says_why(db: Database) -> None:
    """A lifespan whose DSN reaches no server (a wrong port, the database down) fails with the
    connection's own error, which names the server and says what went wrong, not with the
    pool's "initialization incomplete" after retrying for its timeout; and no thread runs."""
    import pgtick
    from pgtick.contrib import asgi
    from pgtick.errors import PgtickError

    jobs = pgtick.App("unreachable")
    jobs.job("k")(lambda ctx: None)
    before = set(threading.enumerate())
    tick = asgi.Pgtick(jobs, "postgresql://postgres@127.0.0.1:1/none", scheduler=True)
    with pytest.raises(PgtickError, match=r"cannot connect to PostgreSQL: .*port 1 failed"):
        async with tick.lifespan(None):
            pytest.fail("the lifespan started")
    left = _pgtick_threads(before)
    assert left == [], f"threads left running after a failed startup: {left}"


@pytest.mark.asyncio
async def test_a_worker_that_stops_on_an_error_is_logged_once_and_not_left_to_the_thread(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that stops on an error it cannot go on from (here the database refuses its
    queues) while the app serves: the app's log says, on ``pgtick.asgi``, that pgtick stopped in
    this process and why, and the thread ends without an unhandled exception (whose
    traceback would reach stderr past the app's logging)."""
    import pgtick
    from pgtick.contrib import asgi

    unhandled: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(repr(args.exc_value)))
    jobs = pgtick.App("worker-stops")
    jobs.job("k")(lambda ctx: None)
    before = set(threading.enumerate())
    tick = asgi.Pgtick(jobs, db.dsn, poll_interval=0.1, worker_options={"queues": ["q" * 300]})
    async with tick.lifespan(None):
        await asyncio.to_thread(
            wait_for,
            "the worker to stop on the refused queues",
            lambda: "pgtick-worker" not in _pgtick_threads(before),
            60,
        )
    assert unhandled == [], f"the worker thread ended on an unhandled exception: {unhandled}"
    said = [r.getMessage() for r in caplog.records if r.name == "pgtick.asgi" and r.levelname == "ERROR"]
    assert len(said) == 1 and "until it restarts" in said[0] and "queues" in said[0], said
