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
        )
        self.access = Access("?", False, False)
        self.features = Features(frozenset(), frozenset())

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=30)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                """
                SELECT current_user AS login,
                       pg_catalog.pg_has_role('jobs_reader', 'MEMBER') AS reader,
                       pg_catalog.pg_has_role('jobs_operator', 'MEMBER') AS operator
                """
            )
            row = await cur.fetchone()
            assert row is not None
            self.access = Access(row["login"], row["reader"], row["operator"])
        async with self.reading() as conn:
            self.features = await features(conn)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Conn]:
        """A read-only transaction as jobs_reader (or as the login, if it cannot take that role)."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION READ ONLY")
            await conn.execute("SET LOCAL statement_timeout = '15s'")
            if self.access.reader:
                await conn.execute("SET LOCAL ROLE jobs_reader")
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
            await conn.execute("SET LOCAL statement_timeout = '60s'")
            await conn.execute("SET LOCAL ROLE jobs_operator")
            yield conn
