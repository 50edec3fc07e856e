"""The connections the driver opens: TCP keepalives and a bound on unacknowledged data, so a
network that drops packets silently ends a call in seconds; a DSN's own settings win."""

from __future__ import annotations

import psycopg
import pytest

from harness import Database
from pgtick.db import KEEPALIVES, TCP_USER_TIMEOUT_MS, connect


def _settings(conn: psycopg.Connection[object]) -> dict[str, str]:
    wanted = {*KEEPALIVES, "tcp_user_timeout"}
    return {
        o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info if o.keyword.decode() in wanted
    }


def test_every_connection_asks_for_keepalives(db: Database) -> None:
    with connect(db.dsn) as conn:
        got = _settings(conn)
    expected = {k: str(v) for k, v in KEEPALIVES.items()}
    if psycopg.pq.version() >= 120000:
        expected["tcp_user_timeout"] = str(TCP_USER_TIMEOUT_MS)
    assert got == expected


@pytest.mark.parametrize("where", ["dsn", "argument"])
def test_a_keepalive_setting_given_is_kept(db: Database, where: str) -> None:
    if where == "dsn":
        conn = connect(f"{db.dsn} keepalives_idle=42")
    else:
        conn = connect(db.dsn, keepalives_idle=42)
    with conn:
        got = _settings(conn)
    assert got["keepalives_idle"] == "42" and got["keepalives_count"] == str(KEEPALIVES["keepalives_count"])
