"""Run pgtick with an ASGI app: a worker (and optionally the scheduler) in this process,
started and stopped by the app's lifespan, and an ``AsyncClient`` for request handlers.

    jobs = pgtick.App("shop")
    tick = Pgtick(jobs, dsn, scheduler=True)
    api = FastAPI(lifespan=tick.lifespan)

    @api.post("/orders")
    async def create(conn: Transaction, client=Depends(client)):
        await conn.execute("INSERT INTO orders ...")
        await client.enqueue("send-receipt", {...}, conn=conn)  # commits with the order

``Transaction`` (FastAPI 0.121 or later) is ``transaction`` as a FastAPI dependency that ends
before the response is sent: the handler's transaction has committed when the client reads
the response, and a commit that fails is the request's error (500), not a success already
sent. A plain ``Depends(transaction)`` ends after the response (FastAPI's default for a
dependency that yields, since 0.118): write ``Depends(transaction, scope="function")``.

``Pgtick.lifespan`` follows the Starlette/FastAPI lifespan protocol (a callable taking
the app and returning an async context manager whose yielded mapping becomes the
lifespan state, ``request.state.pgtick``). Any other framework can use
``async with tick.running():`` from its own startup and shutdown hooks.

The worker is the one ``pgtick run`` uses (``pgtick.worker.Worker``), in background
threads: job code runs in its executor threads, never on the event loop; ``async def``
jobs get their own loop there. The scheduler thread contests leadership like any other
replica, so several app processes with ``scheduler=True`` elect one leader.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgtick.app import App
from pgtick.client import AsyncClient
from pgtick.db import connect, prepare_async
from pgtick.definitions import sync_app
from pgtick.execution import describe
from pgtick.identity import new_worker_id
from pgtick.runner import check_schema
from pgtick.scheduler import Scheduler
from pgtick.worker import Worker

try:  # FastAPI injects a parameter annotated with Starlette's Request
    from starlette.requests import Request
except ImportError:  # any other ASGI framework: anything with .state
    Request = Any  # type: ignore[misc,assignment]

__all__ = ["Pgtick", "Transaction", "client", "get_pgtick", "transaction"]

log = logging.getLogger("pgtick.asgi")


class Pgtick:
    """pgtick for one ASGI app: in-process worker and scheduler, a pool and a client."""

    def __init__(
        self,
        app: App,
        dsn: str,
        *,
        worker: bool = True,
        scheduler: bool = False,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        tick_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        shutdown_grace: float = 10.0,
        pool_size: int = 10,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.dsn = dsn
        self.shutdown_grace = shutdown_grace
        self.pool_size = pool_size
        self._worker_settings: dict[str, Any] | None = (
            {
                "concurrency": concurrency,
                "poll_interval": poll_interval,
                "heartbeat_interval": heartbeat_interval,
                "shutdown_grace": shutdown_grace,
                **dict(worker_options or {}),
            }
            if worker
            else None
        )
        self._tick_interval = tick_interval if scheduler else None
        self._started = False
        self._build()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._client: AsyncClient | None = None

    def _build(self) -> None:
        """A new worker id, and the worker and scheduler that run under it."""
        self.worker_id = new_worker_id()
        settings = self._worker_settings
        self.worker = (
            None if settings is None else Worker(self.app, self.dsn, worker_id=self.worker_id, **settings)
        )
        self.scheduler = (
            None
            if self._tick_interval is None
            else Scheduler(self.dsn, owner=self.worker_id, tick_interval=self._tick_interval)
        )

    # -- background threads ------------------------------------------------------
    def start(self) -> None:
        """Sync the app's schedules and policies, then start the worker and scheduler threads."""
        with connect(self.dsn, application_name="pgtick-sync") as conn:
            check_schema(conn)
            sync_app(self.app, conn)
        if not self.app.has_database:
            self.app.use(self.dsn)  # app.enqueue in job code writes where this process works
        if self._started:  # a worker and a scheduler run once: an app started again gets new ones
            self._build()
        self._started = True
        self._stop.clear()
        for name, target in (("pgtick-worker", self.worker), ("pgtick-scheduler", self.scheduler)):
            if target is not None:
                thread = threading.Thread(
                    target=_logging_failure, args=(name, target.run, self._stop), name=name, daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """Stop claiming, let running jobs finish within the grace period, and join."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.shutdown_grace + 10)
        self._threads.clear()

    # -- the app's side ----------------------------------------------------------
    @property
    def pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise RuntimeError("pgtick is not running: use Pgtick.lifespan or Pgtick.running()")
        return self._pool

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            raise RuntimeError("pgtick is not running: use Pgtick.lifespan or Pgtick.running()")
        return self._client

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Pgtick]:
        """Start the threads, then open the pool; stop and close on exit. A startup that fails
        at any step (a bad ``pool_size``, no schema, no database) leaves no thread running."""
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True, "application_name": "pgtick-asgi"},
            configure=_configure,
            open=False,
        )  # checks the sizes before anything starts
        starting: asyncio.Future[None] | None = None
        try:
            # The startup first: its one connection says at once why the database cannot be
            # reached (the pool would retry for its whole timeout, then say only that).
            # A cancelled startup (the server stopped meanwhile) does not stop its thread:
            # the threads it starts are only stopped once it has started them (below).
            starting = asyncio.ensure_future(asyncio.to_thread(self.start))
            await asyncio.shield(starting)
            await pool.open(wait=True)
            self._pool, self._client = pool, AsyncClient(pool)
            yield self
        finally:
            self._pool = self._client = None
            await pool.close()
            if starting is not None:
                await asyncio.wait([starting])
                if not starting.cancelled():
                    starting.exception()  # retrieved: a cancelled startup that failed started nothing
            await asyncio.to_thread(self.stop)

    @asynccontextmanager
    async def lifespan(self, asgi_app: object = None) -> AsyncIterator[dict[str, Any]]:
        """Starlette/FastAPI ``lifespan=``: the state has ``pgtick`` (this object)."""
        async with self.running():
            yield {"pgtick": self}


def _logging_failure(name: str, run: Callable[[threading.Event], None], stop: threading.Event) -> None:
    """``run(stop)`` in a thread of the app: an error it stops on (having stopped the other
    thread and logged its traceback) is told on ``pgtick.asgi`` in one line, not left to the
    thread, whose unhandled exception would go to stderr past the app's logging. The app goes
    on serving requests; its enqueued runs wait for another worker or a restart."""
    try:
        run(stop)
    except Exception as exc:
        stop.set()
        log.error(
            "%s stopped: %s; pgtick runs and schedules nothing in this process until it restarts",
            name,
            describe(exc),
        )


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await prepare_async(conn)


# -- request dependencies (FastAPI ``Depends``; or call them with the request) ----------


def get_pgtick(request: Request) -> Pgtick:
    """The ``Pgtick`` of the app serving ``request`` (from the lifespan state)."""
    found = getattr(request.state, "pgtick", None)
    if not isinstance(found, Pgtick):
        raise RuntimeError("no pgtick in the request state: give the app lifespan=Pgtick(...).lifespan")
    return found


async def client(request: Request) -> AsyncClient:
    """The app's ``AsyncClient`` (over the pool). Use ``conn=`` to enqueue inside a transaction."""
    return get_pgtick(request).client


async def transaction(request: Request) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A pooled connection inside a transaction that commits when the handler returns and
    rolls back when it raises: runs enqueued with ``conn=`` share the outcome. Under FastAPI,
    take it as ``Transaction`` (or ``Depends(transaction, scope="function")``), so that it
    commits before the response is sent (see the module docstring)."""
    async with get_pgtick(request).pool.connection() as conn, conn.transaction():
        yield conn


try:
    from fastapi import Depends
except ImportError:  # another ASGI framework: call ``transaction`` from its own hooks
    pass
else:
    #: ``transaction`` as a FastAPI parameter type, ended (committed or rolled back) before
    #: the response is sent.
    Transaction = Annotated[psycopg.AsyncConnection[Any], Depends(transaction, scope="function")]
