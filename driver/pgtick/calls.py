"""Every SQL statement the driver sends, by name.

One answer to "what does the driver send?": each call is a name, its SQL text
and a thin typed function. The rules live in SQL (``sql/*.sql``, documented in
DESIGN.md); these calls only name the function or view and pass arguments.
Hot-path calls that travel in a pipeline expose their SQL text as constants.
"""

from __future__ import annotations

from typing import Any

import psycopg

Conn = psycopg.Connection[Any]

# --- migrations (migrate.py) -------------------------------------------------

MIGRATION_LEDGER_EXISTS = "SELECT to_regclass('jobs.schema_migrations') IS NOT NULL"
APPLIED_MIGRATIONS = "SELECT version FROM jobs.schema_migrations"
RECORD_MIGRATION = "INSERT INTO jobs.schema_migrations (version, name) VALUES (%s, %s)"
ADVISORY_LOCK = "SELECT pg_advisory_lock(%s)"
ADVISORY_UNLOCK = "SELECT pg_advisory_unlock(%s)"


def migration_ledger_exists(conn: Conn) -> bool:
    row = conn.execute(MIGRATION_LEDGER_EXISTS).fetchone()
    return bool(row and row[0])


def applied_migrations(conn: Conn) -> set[str]:
    return {str(row[0]) for row in conn.execute(APPLIED_MIGRATIONS)}


def record_migration(conn: Conn, version: str, name: str) -> None:
    conn.execute(RECORD_MIGRATION, (version, name))


def advisory_lock(conn: Conn, key: int) -> None:
    conn.execute(ADVISORY_LOCK, (key,))


def advisory_unlock(conn: Conn, key: int) -> None:
    conn.execute(ADVISORY_UNLOCK, (key,))
