"""The peers, each driven through its own public API at its idiomatic settings.

pgqueuer: ``PgQueuer`` over one asyncpg connection (its recommended driver; its docs measure
psycopg at about half the throughput), run under uvloop as its ``pgq run`` CLI does; schema
from ``Queries.install()``; an ``async`` entrypoint; completion is logged to
``pgqueuer_log`` in buffered batches by the library itself.

procrastinate: ``App(PsycopgConnector)`` (an async psycopg pool), schema from
``schema_manager.apply_schema_async()``, an ``async`` task, ``run_worker_async`` with
``concurrency`` and LISTEN/NOTIFY on (its defaults otherwise: jobs are kept, not deleted).
It fetches one job per query (no batch setting exists).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

from bench.harness import Control, Drain, asyncpg_params, report_ready, worker_process

KIND = "noop"

# -- pgqueuer -----------------------------------------------------------------------------

PGQUEUER_DRAIN = Drain(
    remaining_sql="SELECT count(*) FROM pgqueuer",
    last_finished_sql="SELECT max(created) FROM pgqueuer_log WHERE status = 'successful'",
    done_sql="SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
)

PGQUEUER_DB_LATENCY_SQL = """
SELECT extract(epoch FROM p.created - q.created)::float8
  FROM pgqueuer_log AS q JOIN pgqueuer_log AS p ON p.job_id = q.job_id AND p.status = 'picked'
 WHERE q.status = 'queued'
"""


async def _pgqueuer_queries(dsn: str) -> tuple[Any, Any]:
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(**asyncpg_params(dsn))
    return conn, Queries(AsyncpgDriver(conn))


def pgqueuer_install(dsn: str) -> None:
    async def main() -> None:
        conn, queries = await _pgqueuer_queries(dsn)
        await queries.install()
        await conn.close()

    asyncio.run(main())


def pgqueuer_fill(dsn: str, jobs: int) -> None:
    async def main() -> None:
        conn, queries = await _pgqueuer_queries(dsn)
        for start in range(0, jobs, 10000):
            n = min(10000, jobs - start)
            await queries.enqueue([KIND] * n, [None] * n, [0] * n)
        await conn.execute("ANALYZE pgqueuer")
        await conn.close()

    asyncio.run(main())


@worker_process
def pgqueuer_worker(
    control: Control,
    index: int,
    dsn: str,
    batch: int,
    max_concurrent_tasks: int | None,
    record_starts: bool = False,
) -> None:
    import uvloop

    uvloop.run(_pgqueuer_main(control, index, dsn, batch, max_concurrent_tasks, record_starts))


async def _pgqueuer_main(
    control: Control, index: int, dsn: str, batch: int, max_tasks: int | None, record_starts: bool
) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer
    from pgqueuer.models import Job

    conn = await asyncpg.connect(**asyncpg_params(dsn))
    pgq = PgQueuer(AsyncpgDriver(conn))
    starts: list[tuple[int, float, float]] = []

    @pgq.entrypoint(KIND)
    async def noop(job: Job) -> None:
        if record_starts and job.payload:
            p = json.loads(job.payload)
            starts.append((int(p["i"]), float(p["t"]), time.time()))

    loop = asyncio.get_running_loop()
    report_ready(control, index)
    await loop.run_in_executor(None, control.go.wait)

    def stop_on_signal() -> None:
        control.stop.wait()
        loop.call_soon_threadsafe(pgq.shutdown.set)

    threading.Thread(target=stop_on_signal, daemon=True).start()
    kwargs: dict[str, Any] = {"batch_size": batch}
    if max_tasks is not None:
        kwargs["max_concurrent_tasks"] = max_tasks
    await pgq.run(**kwargs)
    await conn.close()
    control.out.put({"index": index, "starts": starts})


class PgqueuerEnqueuer:
    """Open-loop enqueuer side: one ``Queries.enqueue`` call per job on its own loop."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.conn, self.queries = self.loop.run_until_complete(_pgqueuer_queries(dsn))

    def enqueue(self, i: int) -> None:
        payload = json.dumps({"i": i, "t": time.time()}).encode()
        self.loop.run_until_complete(self.queries.enqueue(KIND, payload))

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


# -- procrastinate ------------------------------------------------------------------------

PROCRASTINATE_DRAIN = Drain(
    remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    last_finished_sql="SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded'",
    done_sql="SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
)

PROCRASTINATE_DB_LATENCY_SQL = """
SELECT extract(epoch FROM s.at - d.at)::float8
  FROM procrastinate_events AS d
  JOIN procrastinate_events AS s ON s.job_id = d.job_id AND s.type = 'started'
 WHERE d.type = 'deferred'
"""


def _procrastinate_app(dsn: str, starts: list[tuple[int, float, float]] | None = None) -> Any:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn))

    @app.task(name=KIND)
    async def noop(i: int = -1, t: float = 0.0) -> None:
        if starts is not None:
            starts.append((i, t, time.time()))

    return app


def procrastinate_install(dsn: str) -> None:
    async def main() -> None:
        app = _procrastinate_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(main())


def procrastinate_fill(dsn: str, jobs: int) -> None:
    async def main() -> None:
        app = _procrastinate_app(dsn)
        async with app.open_async():
            task = app.tasks[KIND]
            for start in range(0, jobs, 5000):
                await task.batch_defer_async(*[{} for _ in range(min(5000, jobs - start))])
            await app.connector.execute_query_async("ANALYZE procrastinate_jobs")

    asyncio.run(main())


@worker_process
def procrastinate_worker(
    control: Control, index: int, dsn: str, concurrency: int, record_starts: bool = False
) -> None:
    asyncio.run(_procrastinate_main(control, index, dsn, concurrency, record_starts))


async def _procrastinate_main(
    control: Control, index: int, dsn: str, concurrency: int, record_starts: bool
) -> None:
    starts: list[tuple[int, float, float]] = []
    app = _procrastinate_app(dsn, starts if record_starts else None)
    loop = asyncio.get_running_loop()
    async with app.open_async():
        report_ready(control, index)
        await loop.run_in_executor(None, control.go.wait)
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=concurrency, install_signal_handlers=False, name=f"w{index}")
        )
        await loop.run_in_executor(None, control.stop.wait)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    control.out.put({"index": index, "starts": starts})


class ProcrastinateEnqueuer:
    """Open-loop enqueuer side: one ``defer_async`` per job."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = _procrastinate_app(dsn)
        self.loop.run_until_complete(self.app.open_async())
        self.task = self.app.tasks[KIND]

    def enqueue(self, i: int) -> None:
        self.loop.run_until_complete(self.task.defer_async(i=i, t=time.time()))

    def close(self) -> None:
        self.loop.run_until_complete(self.app.close_async())
        self.loop.close()
