"""Test harness: a real PostgreSQL server, a migrated template, one database per test.

The server comes from ``PGTICK_TEST_DSN`` (any database on a server where we
may create databases and roles) or, without it, an embedded throwaway server
from the ``pgserver`` wheel running with fsync off.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo

from pgtick import migrate

ROOT = Path(__file__).resolve().parent.parent
TEST_ROLES = {
    "pgtick_t_reader": "jobs_reader",
    "pgtick_t_worker": "jobs_worker",
    "pgtick_t_operator": "jobs_operator",
    "pgtick_t_nobody": None,
}
_counter = itertools.count()
T = TypeVar("T")


def dsn_for(base: str, dbname: str, **extra: Any) -> str:
    return make_conninfo(base, dbname=dbname, **extra)


@dataclass
class Database:
    """One test database cloned from the migrated template."""

    name: str
    dsn: str

    def connect(self, *, autocommit: bool = True, **kw: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=autocommit, **kw)

    def dsn_as(self, user: str) -> str:
        return make_conninfo(self.dsn, user=user)

    def psql(self, sql: str, *, user: str | None = None, check: bool = True) -> str:
        """Run SQL through the psql binary (tuples only, unaligned, '|' separated)."""
        dsn = self.dsn_as(user) if user else self.dsn
        proc = subprocess.run(
            [psql_binary(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"psql failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout.strip() if check else proc.stdout + proc.stderr


def psql_binary() -> str:
    found = os.environ.get("PGTICK_PSQL") or shutil.which("psql")
    if found:
        return found
    from pgserver._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / "psql")


class Server:
    """A PostgreSQL server the tests may create databases on."""

    def __init__(self, admin_dsn: str, embedded: Any = None) -> None:
        self.admin_dsn = admin_dsn
        self.embedded = embedded
        self.template = f"pgtick_tpl_{os.getpid()}"

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_dsn, autocommit=True)

    def version(self) -> int:
        with self.admin() as conn:
            row = conn.execute("SHOW server_version_num").fetchone()
        assert row is not None
        return int(row[0]) // 10000

    def build_template(self) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.template}"')
        with psycopg.connect(dsn_for(self.admin_dsn, self.template), autocommit=True) as conn:
            migrate.apply(conn)
        with self.admin() as conn:
            for role, member_of in TEST_ROLES.items():
                exists = conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                if not exists:
                    conn.execute(f"CREATE ROLE {role} LOGIN")
                if member_of:
                    conn.execute(f"GRANT {member_of} TO {role}")

    def create_database(self, template: str | None = None) -> Database:
        name = f"pgtick_t_{os.getpid()}_{next(_counter)}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template or self.template}"')
        return Database(name, dsn_for(self.admin_dsn, name))

    def create_empty_database(self) -> Database:
        name = f"pgtick_e_{os.getpid()}_{next(_counter)}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return Database(name, dsn_for(self.admin_dsn, name))

    def drop_database(self, db: Database) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')

    def close(self) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        if self.embedded is not None:
            self.embedded.stop()


@contextmanager
def server() -> Iterator[Server]:
    dsn = os.environ.get("PGTICK_TEST_DSN")
    if dsn:
        srv = Server(dsn)
    else:
        from pgtick.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(ephemeral=True, fast=True)
        srv = Server(embedded.start(), embedded)
    try:
        srv.build_template()
        yield srv
    finally:
        srv.close()


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def _call(payload: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    fn, args = payload
    return fn(*args)


def run_in_processes(
    fn: Callable[..., Any], arg_tuples: Iterable[tuple[Any, ...]], *, timeout: float = 240
) -> list[Any]:
    """Run ``fn(*args)`` for each args tuple in its own spawned process, all at once.

    ``fn`` must be a module-level function. Returns the results in order; an
    exception in any child is re-raised here.
    """
    jobs = list(arg_tuples)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=len(jobs)) as pool:
        pending = pool.map_async(_call, [(fn, args) for args in jobs])
        return list(pending.get(timeout=timeout))
