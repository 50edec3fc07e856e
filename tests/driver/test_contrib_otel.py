"""pgtick.contrib.otel with the SDK's in-memory exporter and metric reader: one trace from
the request that enqueued to the job that ran, retries linked, messaging metric names."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from harness import Database, rows, scalar, wait_for
from pgtick import App, Client, Context
from pgtick.contrib.otel import instrument, uninstrument
from pgtick.definitions import sync_app
from pgtick.worker import Worker


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metrics])

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def metric_names(self) -> set[str]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    instrument(t.tracer_provider, t.meter_provider)
    try:
        yield t
    finally:
        uninstrument()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _work(app: App, dsn: str, until: Any) -> None:
    """A real worker in a thread until ``until()`` holds."""
    worker = Worker(app, dsn, concurrency=2, poll_interval=0.1, heartbeat_interval=0.5, shutdown_grace=5)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for("the runs to finish", until, timeout=60)
    finally:
        stop.set()
        thread.join(30)


def test_one_trace_from_the_request_to_each_attempt_and_retries_are_linked(
    db: Database, telemetry: Telemetry
) -> None:
    app = App("otel-test")
    attempts: list[int] = []

    @app.job("charge", retry_on=[ConnectionError], max_attempts=3, backoff=0.1)
    def charge(ctx: Context) -> None:
        attempts.append(ctx.run_id)
        if len(attempts) == 1:
            raise ConnectionError("card network down")

    with db.connect() as conn:
        sync_app(app, conn)
    request_tracer = telemetry.tracer_provider.get_tracer("web")
    with request_tracer.start_as_current_span("POST /orders") as request:
        with psycopg.connect(db.dsn) as conn:  # the request's transaction, committed on exit
            kept = Client(conn).enqueue("charge", {"order": 1}, conn=conn)
        with psycopg.connect(db.dsn) as conn:
            dropped = Client(conn).enqueue("charge", {"order": 2}, conn=conn)
            conn.rollback()
    trace_id = request.get_span_context().trace_id

    with db.connect() as conn:

        def chain_done() -> bool:
            done = "SELECT count(*) FROM jobs.runs WHERE status = 'COMPLETED' AND kind = 'charge'"
            return bool(scalar(conn, done) == 1)

        _work(app, db.dsn, chain_done)
        chain = rows(
            conn,
            "SELECT id, attempt, retry_of, status::text AS status, trace_context FROM jobs.runs ORDER BY id",
        )

    assert [r["id"] for r in chain][:1] == [kept.id] and dropped.id not in [r["id"] for r in chain], chain
    assert [(r["attempt"], r["status"]) for r in chain] == [(1, "FAILED"), (2, "COMPLETED")], chain
    assert chain[1]["trace_context"] == chain[0]["trace_context"], "a retry row carries its attempt's context"
    assert f"{trace_id:032x}" in chain[0]["trace_context"]["traceparent"]

    (send, _rolled_back) = telemetry.finished("send charge")
    assert send.kind == SpanKind.PRODUCER and send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id, "enqueue is a child of the request"
    processes = sorted(telemetry.finished("process charge"), key=lambda s: attrs(s)["pgtick.run.attempt"])
    assert len(processes) == 2, [s.name for s in telemetry.spans.get_finished_spans()]
    first, second = processes
    for span in processes:
        assert span.kind == SpanKind.CONSUMER
        assert span.context.trace_id == trace_id, "the job runs in the request's trace"
        assert span.parent is not None and span.parent.span_id == send.context.span_id
    assert first.status.status_code == StatusCode.ERROR and attrs(first)["error.type"] == "ConnectionError"
    assert second.status.status_code != StatusCode.ERROR
    assert attrs(second)["pgtick.run.retry_of"] == str(chain[0]["id"])
    linked = [(link.context.span_id, dict(link.attributes or {})) for link in second.links]
    assert linked == [(first.context.span_id, {"pgtick.link": "previous_attempt"})], linked
    receives = telemetry.finished("receive")
    assert sum(int(attrs(s)["messaging.batch.message_count"]) for s in receives) == 2
    assert {
        "messaging.client.sent.messages",
        "messaging.client.consumed.messages",
        "messaging.client.operation.duration",
        "messaging.process.duration",
    } <= telemetry.metric_names()


def test_without_instrumentation_runs_carry_no_trace_context(db: Database) -> None:
    with Client(db.dsn) as client:
        run = client.enqueue("k")
    with db.connect() as conn:
        assert scalar(conn, "SELECT trace_context FROM jobs.runs WHERE id = %s", (run.id,)) is None


@pytest.mark.asyncio
async def test_each_client_kind_stores_its_send_span_with_the_runs(
    db: Database, telemetry: Telemetry
) -> None:
    """Own autocommit connections, sync and async, store the context of their own send
    span, and an empty setting stores none."""
    from pgtick import AsyncClient

    with Client(db.dsn) as client:
        one_run = client.enqueue("k")
        two_run = client.enqueue("k")
    async with AsyncClient(db.dsn) as aclient:
        async_run = await aclient.enqueue("k")
    sends = {s.context.span_id: s for s in telemetry.spans.get_finished_spans() if s.name == "send k"}
    assert len(sends) == 3, sorted(s.name for s in telemetry.spans.get_finished_spans())
    with db.connect() as conn:
        stored = {
            r["id"]: r["trace_context"]
            for r in rows(conn, "SELECT id, trace_context FROM jobs.runs ORDER BY id")
        }
        with conn.transaction():
            conn.execute("SELECT set_config('pgtick.trace_context', '', true)")
            plain = scalar(conn, "INSERT INTO jobs.runs (kind) VALUES ('k') RETURNING trace_context")
    span_ids = {int(tc["traceparent"].split("-")[2], 16) for tc in stored.values()}
    assert span_ids == set(sends), "each run carries the context of the send span that enqueued it"
    assert len({stored[r.id]["traceparent"] for r in (one_run, two_run, async_run)}) == 3
    assert plain is None, "an empty setting means no trace context"


def test_run_now_names_its_send_span_after_the_definition_and_stores_its_context(
    db: Database, telemetry: Telemetry
) -> None:
    """``run_now`` is given a definition, not a kind: its send span is ``send {definition}``
    with the definition as its destination, and the run it queues carries that span's
    context, as an enqueue's does."""
    with Client(db.dsn) as client:
        client.define("nightly-report", "report", schedule="0 3 * * *")
        run = client.run_now("nightly-report")
    (send,) = telemetry.finished("send nightly-report")
    assert attrs(send)["messaging.destination.name"] == "nightly-report"
    assert attrs(send)["messaging.operation.name"] == "run_now"
    assert send.kind == SpanKind.PRODUCER
    with db.connect() as conn:
        stored = scalar(conn, "SELECT trace_context FROM jobs.runs WHERE id = %s", (run.id,))
    assert int(stored["traceparent"].split("-")[2], 16) == send.context.span_id


def test_an_async_job_on_the_workers_loop_continues_the_trace(db: Database, telemetry: Telemetry) -> None:
    app = App("otel-async")

    @app.job("notify")
    async def notify(ctx: Context) -> None:
        await asyncio.sleep(0)

    with db.connect() as conn:
        sync_app(app, conn)
    tracer = telemetry.tracer_provider.get_tracer("web")
    with tracer.start_as_current_span("POST /notify") as request, Client(db.dsn) as client:
        run = client.enqueue("notify")
    with db.connect() as conn:
        status = "SELECT status::text FROM jobs.runs WHERE id = %s"
        _work(app, db.dsn, lambda: scalar(conn, status, (run.id,)) == "COMPLETED")
    (send,) = telemetry.finished("send notify")
    (process,) = telemetry.finished("process notify")
    assert process.context.trace_id == request.get_span_context().trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert attrs(process)["pgtick.run.outcome"] == "complete"


def test_without_opentelemetry_installed_the_import_names_the_extra() -> None:
    """Where OpenTelemetry is not installed (a blocked import stands in for it), importing the
    integration says which extra brings it."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # import opentelemetry now raises ImportError
        "try:\n"
        "    import pgtick.contrib.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install 'pgtick[otel]'" in result.stdout, result.stdout


def test_a_job_that_returns_after_its_run_was_failed_as_timeout_ends_its_span_in_error(
    db: Database, telemetry: Telemetry
) -> None:
    """A job blocked past its kind's timeout (no checkpoint) is failed as Timeout by its worker;
    when it returns at last, its result dropped, the attempt's span says it failed as the run
    did, not that it completed."""
    app = App("otel-timeout")

    @app.job("blocks", timeout=1)
    def blocks(ctx: Context) -> None:
        time.sleep(3)

    with db.connect() as conn:
        sync_app(app, conn)
    with Client(db.dsn) as client:
        run = client.enqueue("blocks")
    with db.connect() as conn:
        reason = "SELECT failure_reason FROM jobs.runs WHERE id = %s"
        _work(
            app,
            db.dsn,
            lambda: scalar(conn, reason, (run.id,)) == "Timeout" and telemetry.finished("process blocks"),
        )
    (process,) = telemetry.finished("process blocks")
    assert attrs(process)["pgtick.run.outcome"] == "fail", attrs(process)
    assert attrs(process)["error.type"] == "JobTimeout", attrs(process)
    assert process.status.status_code == StatusCode.ERROR, process.status


@pytest.mark.parametrize("whose", ["kind", "run"])
def test_a_hung_jobs_span_ends_in_error_when_its_run_is_failed_as_timeout(
    db: Database, telemetry: Telemetry, whose: str
) -> None:
    """A job blocked past its timeout (no checkpoint) that does not return: its worker fails
    the run as Timeout (the kind's timeout, which only the worker knows) or the reaper does
    (the run's own), and the attempt's span ends then, in error, saying the run timed out,
    while the job's thread is still held. Its late return ends nothing a second time."""
    app = App("otel-hung")
    release = threading.Event()

    @app.job("hangs", timeout=1 if whose == "kind" else None)
    def hangs(ctx: Context) -> None:
        release.wait(120)

    with db.connect() as conn:
        sync_app(app, conn)
    with Client(db.dsn) as client:
        run = client.enqueue("hangs", timeout=timedelta(seconds=1) if whose == "run" else None)
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=0.5, shutdown_grace=5)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with db.connect() as conn:

            def failed() -> bool:
                if whose == "run":  # the leader's reaper, here in the test
                    conn.execute("SELECT jobs.reap()")
                reason = "SELECT failure_reason FROM jobs.runs WHERE id = %s"
                return bool(scalar(conn, reason, (run.id,)) == "Timeout")

            wait_for(f"run {run.id} to fail as Timeout", failed, timeout=60)
        spans = wait_for("the attempt's span to end", lambda: telemetry.finished("process hangs"), timeout=60)
        hung = not release.is_set()
        release.set()
        wait_for("the job's thread to come back", lambda: not worker.held(), timeout=60)
    finally:
        release.set()
        stop.set()
        thread.join(30)
    (process,) = spans
    assert hung
    assert attrs(process)["pgtick.run.outcome"] == "fail", attrs(process)
    assert attrs(process)["error.type"] == "JobTimeout", attrs(process)
    assert process.status.status_code == StatusCode.ERROR, process.status
    assert "timeout" in (process.status.description or ""), process.status
    assert len(telemetry.finished("process hangs")) == 1, "the late return ended a span again"


def test_a_hung_jobs_span_ends_when_its_run_is_reaped_from_its_worker(
    db: Database, telemetry: Telemetry
) -> None:
    """A job that does not return, whose run an operator reaps (``jobs.reap_worker``, as for a
    worker gone for good): the worker sees at its next heartbeat that the run is no longer
    its own, and the attempt's span ends then, abandoned (not an error of the job's), while
    the job's thread is still held."""
    app = App("otel-reaped")
    release = threading.Event()

    @app.job("hangs")
    def hangs(ctx: Context) -> None:
        release.wait(120)

    with db.connect() as conn:
        sync_app(app, conn)
    with Client(db.dsn) as client:
        run = client.enqueue("hangs")
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=0.5, shutdown_grace=5)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with db.connect() as conn:
            status = "SELECT status::text FROM jobs.runs WHERE id = %s"
            wait_for(f"run {run.id} to start", lambda: scalar(conn, status, (run.id,)) == "RUNNING", 60)
            conn.execute("SELECT jobs.reap_worker(%s)", (worker.worker_id,))
        spans = wait_for("the attempt's span to end", lambda: telemetry.finished("process hangs"), timeout=60)
        hung = not release.is_set()
        release.set()
        wait_for("the job's thread to come back", lambda: not worker.held(), timeout=60)
    finally:
        release.set()
        stop.set()
        thread.join(30)
    (process,) = spans
    assert hung
    assert attrs(process)["pgtick.run.outcome"] == "abandon", attrs(process)
    assert process.status.status_code != StatusCode.ERROR, process.status
    assert len(telemetry.finished("process hangs")) == 1, "the late return ended a span again"
