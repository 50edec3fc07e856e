"""The dashboard's connections: one pool, and a role per use.

Pages read inside a READ ONLY transaction with ``SET LOCAL ROLE jobs_reader``;
actions run with ``SET LOCAL ROLE jobs_operator``. The login in the DSN only needs
to be a member of those roles (``GRANT jobs_operator TO dashboard_login``); a login
that is a member of jobs_reader only gets a read-only dashboard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from pgtick.web import queries
from pgtick.web.queries import Conn, Features, features


class ActionsUnavailable(Exception):
    """The database login cannot take the operator role, so nothing can be changed."""


@dataclass(frozen=True)
class Access:
    login: str
    reader: bool
    operator: bool


class Database:
    def __init__(self, dsn: str, *, max_size: int = 4) -> None:
        self.dsn = dsn
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[dict[str, Any]]] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=False,
            kwargs={"autocommit": True, "row_factory": dict_row, "application_name": "pgtick-web"},
            timeout=15,
            # A pooled connection the server dropped (a restart) is found out before a page
            # gets it, not one failed page per connection after.
            check=AsyncConnectionPool.check_connection,
        )
        self.access = Access("?", False, False)
        self.features = Features(frozenset(), frozenset())

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=30)
        async with self.pool.connection() as conn:
            row = await queries.access(conn)
            self.access = Access(row["login"], row["reader"], row["operator"])
        async with self.reading() as conn:
            self.features = await features(conn)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Conn]:
        """A read-only transaction as jobs_reader (or as the login, if it cannot take that role)."""
        async with self.pool.connection() as conn, conn.transaction():
            await queries.begin_reading(conn, as_reader=self.access.reader)
            yield conn

    @asynccontextmanager
    async def acting(self) -> AsyncIterator[Conn]:
        """A transaction as jobs_operator: the action and its audit entry commit together."""
        if not self.access.operator:
            raise ActionsUnavailable(
                f"the database login {self.access.login!r} is not a member of jobs_operator, "
                "so the dashboard is read-only"
            )
        async with self.pool.connection() as conn, conn.transaction():
            await queries.begin_acting(conn)
            yield conn
