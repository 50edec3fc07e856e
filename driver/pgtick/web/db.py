"""The dashboard's connections: one pool, a role per use, and a limit on every wait.

Pages read inside a READ ONLY transaction with ``SET LOCAL ROLE jobs_reader``;
actions run with ``SET LOCAL ROLE jobs_operator``. The login in the DSN only needs
to be a member of those roles (``GRANT jobs_operator TO dashboard_login``); a login
that is a member of jobs_reader only gets a read-only dashboard.

A request's database work (the wait for a pooled connection, the pool's check of it, the
statements, the commit) ends within ``timeout`` seconds (``pgtick web --db-timeout``),
and the client keeps that limit: a server that stopped answering (its process stopped, a
network path that drops packets) sends no error at all, so a server-side
``statement_timeout`` alone would leave the request waiting forever. At the deadline the
connection's socket is shut down, the call waiting on it fails at once with
`DatabaseTimeout`, and the pool replaces the connection; connecting is bounded too
(``connect_timeout``). Each transaction also sets ``statement_timeout`` to the limit, so a
server that is only slow stops the statement itself instead of running it for nobody.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgtick.db import prepare_async
from pgtick.web import queries
from pgtick.web.queries import Conn, Features, features

#: Seconds a request may wait for the database, unless the dashboard is told otherwise.
DEFAULT_TIMEOUT = 10.0


class ActionsUnavailable(Exception):
    """The database login cannot take the operator role, so nothing can be changed."""


class DatabaseTimeout(Exception):
    """The database did not answer a request within the dashboard's limit."""


class DatabaseLost(Exception):
    """The connection was lost during an action (a server restart, a failover, a network cut):
    whether the server committed it before the connection went is unknown."""


@dataclass(frozen=True)
class Access:
    login: str
    reader: bool
    operator: bool


#: The deadline (event loop time) of the request the current task serves: the pool checks a
#: connection before it hands it out, in the requesting task, and that check keeps it too.
_deadline: ContextVar[float | None] = ContextVar("pgtick_web_deadline", default=None)


def _cut(conn: Conn) -> None:
    """Shut the connection's socket down: the call waiting on it fails at once and the
    connection is broken for good (the pool replaces it). Nothing is sent to a server that
    may not be reading; it ends the session when it sees the socket closed."""
    if conn.closed:
        return
    with suppress(OSError, psycopg.Error):
        # A duplicate of libpq's descriptor: closing it leaves libpq's own to libpq.
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def _cut_at(conn: Conn, deadline: float) -> Iterator[None]:
    """Cut `conn` if the block is still running at `deadline` (event loop time)."""
    timer = asyncio.get_running_loop().call_at(deadline, _cut, conn)
    try:
        yield
    finally:
        timer.cancel()


def _connect_timeout(dsn: str, timeout: float) -> dict[str, Any]:
    """``connect_timeout`` of the limit (whole seconds, at least libpq's 2), unless the DSN
    sets its own."""
    try:
        if "connect_timeout" in conninfo_to_dict(dsn):
            return {}
    except psycopg.ProgrammingError:  # not a DSN: connecting says so
        return {}
    return {"connect_timeout": max(2, math.ceil(timeout))}


async def _prepare(conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
    """A new pooled connection: dates in ISO 8601, no prepared statements behind a pooler."""
    await prepare_async(conn)


class Database:
    def __init__(self, dsn: str, *, max_size: int = 4, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not 0 < timeout < math.inf:
            raise ValueError(f"the database timeout must be a positive number of seconds, got {timeout!r}")
        self.dsn = dsn
        self.timeout = timeout
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[dict[str, Any]]] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=False,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "application_name": "pgtick-web",
                **_connect_timeout(dsn, timeout),
            },
            timeout=timeout,
            configure=_prepare,
            # A pooled connection the server dropped (a restart) is found out before a page
            # gets it, not one failed page per connection after; the check keeps the
            # request's deadline like its statements.
            check=self._check,
            # A connection that cannot be replaced within the limit is given up, and the next
            # request connects afresh: the dashboard is back as soon as the server answers,
            # not after the pool's backoff has grown over a long outage.
            reconnect_timeout=timeout,
        )
        self.access = Access("?", False, False)
        self.features = Features(frozenset(), frozenset())

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=30)
        async with self.reading() as conn:
            self.features = await features(conn)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Conn]:
        """A read-only transaction as jobs_reader (or as the login, if it cannot take that role)."""
        async with self._connection() as conn, conn.transaction():
            self._saw(await queries.begin_reading(conn, timeout=self.timeout))
            yield conn

    @asynccontextmanager
    async def acting(self) -> AsyncIterator[Conn]:
        """A transaction as jobs_operator: the action and its audit entry commit together."""
        # Cut while the commit was on its way, the change may have been made.
        unsure = "; the change may or may not have been made: look before trying again"
        async with self._connection(unsure) as conn, conn.transaction():
            self._saw(await queries.begin_acting(conn, timeout=self.timeout))
            if not self.access.operator:
                raise ActionsUnavailable(
                    f"the database login {self.access.login!r} is not a member of jobs_operator, "
                    "so the dashboard is read-only"
                )
            yield conn

    def _saw(self, row: dict[str, Any]) -> None:
        """The login's access as a transaction just read it (the pages offer actions by it)."""
        self.access = Access(row["login"], row["reader"], row["operator"])

    @asynccontextmanager
    async def _connection(self, unsure: str = "") -> AsyncIterator[Conn]:
        """A pooled connection whose use, from the wait for it to the commit, ends within
        `timeout` seconds: past it the connection is cut and `DatabaseTimeout` raised (its
        message followed by `unsure`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        token = _deadline.set(deadline)
        used: Conn | None = None
        try:
            async with self.pool.connection(timeout=self.timeout) as conn:
                used = conn
                with _cut_at(conn, deadline):
                    yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            if loop.time() < deadline:
                if unsure and used is not None and used.broken:  # (not an error the server sent)
                    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise DatabaseLost(f"the database connection was lost ({reason}){unsure}") from exc
                raise
            raise DatabaseTimeout(f"database did not answer within {self.timeout:g} s{unsure}") from exc
        finally:
            _deadline.reset(token)

    async def _check(self, conn: Conn) -> None:
        """The pool's check of a connection it is about to hand out, cut at the requesting
        task's deadline (or `timeout` from now, for a check outside a request)."""
        deadline = _deadline.get()
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.timeout
        with _cut_at(conn, deadline):
            await AsyncConnectionPool.check_connection(conn)
