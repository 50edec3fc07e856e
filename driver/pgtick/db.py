"""Connections: where the DSN comes from and how the driver opens connections."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgtick.errors import PgtickError

Connection = psycopg.Connection[Any]

#: What a database outage looks like to the driver's loops: retry, never die.
DB_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, PgtickError)


def connect(dsn: str, *, application_name: str = "pgtick", **kwargs: Any) -> Connection:
    """An autocommit connection (each function call is its own transaction)."""
    try:
        return psycopg.connect(
            dsn,
            autocommit=True,
            application_name=application_name,
            connect_timeout=10,
            **kwargs,
        )
    except psycopg.OperationalError as exc:
        raise PgtickError(f"cannot connect to PostgreSQL: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else repr(exc)


def connect_dicts(dsn: str, *, application_name: str = "pgtick") -> psycopg.Connection[dict[str, Any]]:
    """Like ``connect``, with rows as dicts."""
    conn: psycopg.Connection[dict[str, Any]] = connect(
        dsn, application_name=application_name, row_factory=dict_row
    )
    return conn


def resolve_dsn(explicit: str | None, start_embedded: Callable[[], str]) -> str:
    """--dsn, else $DATABASE_URL, else the embedded PostgreSQL."""
    if explicit:
        return explicit
    env = os.environ.get("DATABASE_URL") or os.environ.get("PGTICK_DSN")
    if env:
        return env
    return start_embedded()
