"""Helpers for testing an application's jobs with pytest, without a running worker.

Opt in from your ``conftest.py``::

    pytest_plugins = ["pgtick.testing"]

and use the ``pgtick_jobs`` fixture::

    def test_receipt_is_sent(pgtick_jobs):
        pgtick_jobs.enqueue("send-receipt", {"order": 42})
        [outcome] = pgtick_jobs.run_due(app)
        assert outcome.status == "COMPLETED"

The database: ``$PGTICK_TESTING_DSN`` when set (a database the tests may empty: its
``jobs`` tables are truncated around every test), else an embedded PostgreSQL (the
``pgserver`` wheel) started once per test session in a temporary directory. Either
way it is migrated first. Override the session fixture ``pgtick_dsn`` to use your own.
The database may sit behind a transaction pooler (PgBouncer in transaction mode): the
tester's connections then prepare no statements, as the driver's do (``pgtick.db``).

``run_due(app)`` executes the due runs of the app's kinds inline, one after the other
in the test's thread (an ``async def`` job on one event loop for the whole test process, a
thread of its own, as a worker runs all its async jobs on one loop): it claims them through
``jobs.claim``, calls the job function with
a real ``Context``, and reports through ``jobs.complete`` / ``jobs.fail`` /
``jobs.acknowledge_cancel`` (``jobs.snooze`` for a job that raises ``pgtick.Snooze``) with a
claim token, as a worker does, so retry policies,
backoff and fencing are the database's own, and a result that is not JSON (or that the
database refuses) fails the run saying why, as it would in production. Each
``ctx.checkpoint()`` first asks the database what a worker's heartbeat would tell the job
(``jobs.heartbeat``): a cancel requested while the job runs (``client.cancel``) stops it
there, and the run ends CANCELLED after the kind's compensation. Runs that the
jobs enqueue and that are due at once run in the same call. A retry is scheduled after
its backoff, so it is not due at once: ``run_due(app, include_future=True)`` runs it
anyway.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Unpack

import psycopg
import pytest

from pgtick import calls, migrate
from pgtick.aio import EventLoop
from pgtick.app import App, Context, error_classes
from pgtick.client import Client, EnqueueWithConnOptions, Run
from pgtick.db import connect, connect_dicts
from pgtick.errors import Abandoned, Cancelled, JobTimeout, Snooze, translate_errors
from pgtick.execution import describe, message_of
from pgtick.reporter import (
    MAX_REFUSAL,
    SNOOZED_WHILE_CANCELLED,
    refusal_text,
    refused,
    result_json,
    storable,
)

__all__ = ["JobsTester", "Outcome", "database", "pgtick_dsn", "pgtick_jobs"]

DSN_VARIABLE = "PGTICK_TESTING_DSN"
WORKER = "pgtick-testing"
APPLICATION = "pgtick-testing"
#: Every table that holds an application's state. The schema's own stay: jobs.config, the
#: migration ledger, the zone names it knows, and who leads.
KEPT_TABLES = ("jobs.config", "jobs.schema_migrations", "jobs._zones", "jobs._leadership")
STATE_TABLES = (
    "jobs.runs",
    "jobs.run_history",
    "jobs.run_history_keys",
    "jobs.definitions",
    "jobs.retry_policies",
    "jobs.leases",
    "jobs.catch_ups",
    "jobs.worker_registry",
    "jobs.known_kinds",
    "jobs.paused_queues",
    "jobs.limits",
    "jobs._rate_starts",
    "jobs.worker_scopes",
    "jobs.backfills",
    "jobs.audit_log",
)


@dataclass(frozen=True)
class Outcome:
    """How one run ended in ``run_due``: the run as the database has it now, the retry
    the failure queued (if any), what the job returned or raised."""

    run: Run
    retry: Run | None = None
    result: Any = None
    exception: BaseException | None = None

    @property
    def status(self) -> str:
        return self.run.status

    @property
    def error(self) -> str | None:
        return self.run.error

    @property
    def failure_reason(self) -> str | None:
        return self.run.failure_reason


@contextmanager
def database() -> Iterator[str]:
    """A migrated database for tests: ``$PGTICK_TESTING_DSN``, else an embedded PostgreSQL
    in a temporary directory (stopped and deleted at the end). Yields its DSN."""
    dsn = os.environ.get(DSN_VARIABLE)
    embedded = None
    if not dsn:
        from pgtick.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(ephemeral=True, fast=True)
        dsn = embedded.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.apply(conn)
        yield dsn
    finally:
        if embedded is not None:
            embedded.stop()


class JobsTester:
    """Enqueue runs and execute the due ones inline. ``client`` is a ``pgtick.Client``
    on the test database for everything else (define, run_now, cancel, get_run, ...)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.client = Client(dsn, application_name=APPLICATION)
        self._token = secrets.token_urlsafe(24)  # claims are fenced by it, as a worker's are

    def close(self) -> None:
        self.client.close()

    def enqueue(
        self, kind: str, payload: Mapping[str, Any] | None = None, **options: Unpack[EnqueueWithConnOptions]
    ) -> Run:
        """``Client.enqueue``: the same arguments."""
        return self.client.enqueue(kind, payload, **options)

    def runs(self, kind: str | None = None) -> list[Run]:
        """Every run (of ``kind``), oldest first."""
        with connect_dicts(self.dsn, application_name=APPLICATION) as conn:
            rows = conn.execute(
                "SELECT * FROM jobs.runs WHERE %(kind)s::text IS NULL OR kind = %(kind)s ORDER BY id",
                {"kind": kind},
            ).fetchall()
        return [Run.from_row(r) for r in rows]

    def run_due(self, app: App, *, include_future: bool = False, limit: int = 1000) -> list[Outcome]:
        """Execute the due QUEUED runs of ``app``'s kinds inline until none is left, and
        return their outcomes in the order they ran. The app's retry policies and declared
        schedules are synced first, as ``pgtick run`` does; while it runs, ``app.enqueue``
        writes to the test database. ``include_future`` makes runs scheduled for later
        (retries after their backoff included) due now: their ``scheduled_for`` becomes now."""

        kinds = sorted(app.jobs)
        outcomes: list[Outcome] = []
        saved = (app._client, app.dsn)
        app.use(self.client)  # app.enqueue inside job code writes to the test database
        try:
            self._run_due(app, kinds, outcomes, include_future, limit)
        finally:
            app._client, app.dsn = saved
        return outcomes

    def _run_due(
        self, app: App, kinds: list[str], outcomes: list[Outcome], include_future: bool, limit: int
    ) -> None:
        from pgtick.definitions import sync_app

        with connect_dicts(self.dsn, application_name=APPLICATION) as conn, translate_errors():
            sync_app(app, conn)
            while len(outcomes) < limit:
                if include_future:
                    conn.execute(
                        "UPDATE jobs.runs SET scheduled_for = now()"
                        " WHERE status = 'QUEUED' AND kind = ANY(%s) AND scheduled_for > now()",
                        (kinds,),
                    )
                run = conn.execute(
                    "SELECT * FROM jobs.claim(batch_size => 1, worker => %s, kinds => %s, heartbeat => true,"
                    " claim_token => %s)",
                    (WORKER, kinds, self._token),
                ).fetchone()
                if run is None:
                    break
                outcomes.append(self._execute(conn, app, run))

    def _execute(self, conn: psycopg.Connection[dict[str, Any]], app: App, run: dict[str, Any]) -> Outcome:
        spec = app.jobs[run["kind"]]
        timeout = run["timeout"].total_seconds() if isinstance(run["timeout"], timedelta) else spec.timeout
        ctx = _InlineContext(run, spec, WORKER, timeout)
        ctx.heartbeat = lambda: self._heartbeat(conn, ctx)
        result: Any = None
        exception: BaseException | None = None
        retry: dict[str, Any] | None = None
        try:
            result = _call(spec.fn, ctx)
        except (Exception, SystemExit, asyncio.CancelledError, Abandoned, Cancelled) as exc:
            # What a worker fails the run for (KeyboardInterrupt, Ctrl-C in the test, stops it).
            exception = exc
            # As the worker reads them: a cancel only when one was asked for, a run let go only
            # when it was lost; raised by job code on its own, either is a failure.
            if isinstance(exc, Snooze):
                # Back to QUEUED for later, same attempt; asked to cancel meanwhile, CANCELLED.
                if not calls.snooze(conn, ctx.run_id, WORKER, exc.delay, self._token):
                    why = SNOOZED_WHILE_CANCELLED
                    calls.acknowledge_cancel(conn, ctx.run_id, WORKER, why, self._token)
            elif isinstance(exc, Cancelled) and ctx.cancel_requested:
                calls.acknowledge_cancel(conn, ctx.run_id, WORKER, storable(message_of(exc)), self._token)
            elif not (isinstance(exc, Abandoned) and ctx.abandoned):
                reason = "Timeout" if isinstance(exc, JobTimeout) else "Error"
                # As the worker words it, also for an error whose __str__ raises (execution).
                message = message_of(exc) if isinstance(exc, JobTimeout) else describe(exc)
                retry = self._fail(conn, ctx, error_classes(exc), storable(message), reason)
        else:
            # As the worker reports it: a result that is not JSON, or that the database
            # refuses, fails the run saying why (the test sees what production would).
            try:
                with conn.transaction():
                    calls.complete(conn, ctx.run_id, WORKER, result_json(result), self._token)
            except Exception as refusal:
                if not refused(refusal):
                    raise
                why = storable(f"the result could not be stored: {refusal_text(refusal)}", MAX_REFUSAL)
                retry = self._fail(conn, ctx, None, why, "Error")
        final = conn.execute("SELECT * FROM jobs.runs WHERE id = %s", (ctx.run_id,)).fetchone()
        assert final is not None
        return Outcome(
            run=Run.from_row(final),
            retry=None if retry is None else Run.from_row(retry),
            result=result,
            exception=exception,
        )

    def _heartbeat(self, conn: psycopg.Connection[dict[str, Any]], ctx: Context) -> None:
        """What a worker's heartbeat tells a running job (``jobs.heartbeat``): its cancel was
        requested, or the run is no longer this tester's (nothing is then reported)."""
        if ctx.cancel_requested or ctx.abandoned:
            return
        rows = conn.execute(calls.HEARTBEAT, ([ctx.run_id], WORKER, self._token)).fetchall()
        if not rows:
            ctx.abandon()
        elif rows[0]["cancel_requested"]:
            ctx.request_cancel()

    def _fail(
        self,
        conn: psycopg.Connection[dict[str, Any]],
        ctx: Context,
        classes: list[str] | None,
        message: str,
        reason: str,
    ) -> dict[str, Any] | None:
        """jobs.fail for the run; the retry it queued, if any."""
        failed = calls.fail(conn, ctx.run_id, WORKER, classes, message, reason, self._token)
        if failed is None or failed[1] != "QUEUED":
            return None
        return conn.execute("SELECT * FROM jobs.runs WHERE id = %s", (failed[0],)).fetchone()

    def reset(self) -> None:
        """Empty the jobs tables that hold an application's state (``STATE_TABLES``: runs and
        their history, definitions, retry policies, leases, paused queues, limits, ...)."""
        with connect(self.dsn, application_name=APPLICATION) as conn:
            # Those this schema has (one installed by an older pgtick lacks jobs.run_history).
            row = conn.execute(
                "SELECT array_agg(t ORDER BY o) FROM unnest(%s::text[]) WITH ORDINALITY AS x (t, o)"
                " WHERE to_regclass(t) IS NOT NULL",
                (list(STATE_TABLES),),
            ).fetchone()
            present = row[0] if row and row[0] else []
            conn.execute(f"TRUNCATE {', '.join(present)} RESTART IDENTITY CASCADE")


class _InlineContext(Context):
    """The Context ``run_due`` gives a job: each checkpoint first hears what a worker's
    heartbeat would have told the job by then (``JobsTester._heartbeat``), so a cancel
    requested while the job runs stops it there as it would in production."""

    heartbeat: Callable[[], None] | None = None

    def checkpoint(self) -> Awaitable[None]:
        if self.heartbeat is not None:
            self.heartbeat()
        return super().checkpoint()


def _call(fn: Any, ctx: Context) -> Any:
    """Call a job function; a coroutine function (or a plain function that returns a
    coroutine: an ``async def`` job behind a plain decorator) runs to completion on the
    tester's one event loop (``_job_loop``)."""
    job = fn(ctx)
    if not inspect.iscoroutine(job):
        return job

    async def ended() -> tuple[bool, Any]:
        try:
            return True, await job
        except BaseException as exc:  # raised in the test's thread as the job raised it
            return False, exc

    done, value = asyncio.run_coroutine_threadsafe(ended(), _job_loop()).result()
    if not done:
        raise value
    return value


_loop: EventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _job_loop() -> asyncio.AbstractEventLoop:
    """The event loop every async job ``run_due`` runs goes on: one per test process, on a
    thread of its own (started at the first async job), as a worker runs all its async jobs
    on one loop per process. What job code keeps bound to the loop (a client library's
    connection, a lock) stays usable from one run, and one test, to the next."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or not _loop.thread.is_alive():
            if _loop is None:
                atexit.register(_stop_job_loop)
            _loop = EventLoop(name="pgtick-testing-loop")
            _loop.start()
            _loop_pid = os.getpid()
        return _loop.loop


def _stop_job_loop() -> None:
    """At exit: cancel what async jobs left running on the loop, and close it."""
    with _loop_lock:
        if _loop is not None and _loop_pid == os.getpid():
            _loop.stop()


# -- the pytest plugin ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def pgtick_dsn() -> Iterator[str]:
    """The migrated test database's DSN, for the whole session (see ``database``)."""
    with database() as dsn:
        yield dsn


@pytest.fixture
def pgtick_jobs(pgtick_dsn: str) -> Iterator[JobsTester]:
    """A ``JobsTester`` on the test database; the jobs tables are emptied before and after
    the test."""
    tester = JobsTester(pgtick_dsn)
    tester.reset()
    try:
        yield tester
    finally:
        tester.close()
        tester.reset()
