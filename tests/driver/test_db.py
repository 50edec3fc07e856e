"""The connections the driver opens: TCP keepalives and a bound on unacknowledged data, so a
network that drops packets silently ends a call in seconds; a DSN's own settings win; dates
read in ISO 8601 whatever the database's default DateStyle."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import datetime, timedelta

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from harness import PGTICK, ROOT, Database, env_for, pgtick
from pgtick.client import AsyncClient, Client
from pgtick.db import KEEPALIVES, TCP_USER_TIMEOUT_MS, connect, prepare


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


def test_a_database_whose_dates_are_not_iso_is_read_by_every_connection_the_driver_opens(
    db: Database,
) -> None:
    """psycopg reads times only in the ISO DateStyle: with a database default of 'SQL, DMY', the
    driver's own connections (the CLI's, the clients', the dashboard's) set ISO for themselves."""
    name = str(conninfo_to_dict(db.dsn)["dbname"])
    with db.connect() as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET DateStyle = 'SQL, DMY'").format(sql.Identifier(name)))
        with db.connect() as plain:
            assert plain.info.parameter_status("DateStyle") == "SQL, DMY", "the setting took"

    with connect(db.dsn) as conn:
        assert conn.execute("SELECT now()::text").fetchone()[0][:4].isdigit()  # type: ignore[index]
    with Client(db.dsn) as client:
        run_id = client.enqueue("report", {"day": 1}).id
        created = client.get_run(run_id).created_at
        assert created is not None and created.tzinfo is not None

    async def read_async() -> datetime | None:
        async with AsyncClient(db.dsn) as aclient:
            return (await aclient.get_run(run_id)).created_at

    assert asyncio.run(read_async()) == created
    shown = pgtick("show", str(run_id), "--dsn", db.dsn)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown


def test_a_client_encoding_other_than_utf8_is_read_by_every_connection_the_driver_opens(
    db: Database,
) -> None:
    """psycopg reads JSON as UTF-8 whatever the connection's encoding: with PGCLIENTENCODING
    set to LATIN1, a payload with a non-ASCII character would fail every read of it, and the
    CLI's enqueue would commit its run and then end in a traceback."""
    env = {**env_for(None), "PGCLIENTENCODING": "LATIN1"}
    enqueued = subprocess.run(
        [*PGTICK, "enqueue", "report", "--payload", '{"city": "Zürich"}', "--dsn", db.dsn],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert enqueued.returncode == 0 and "Traceback" not in enqueued.stderr, enqueued
    with psycopg.connect(db.dsn, client_encoding="LATIN1") as conn:
        prepare(conn)
        assert conn.execute("SELECT payload FROM jobs.runs").fetchone() == ({"city": "Zürich"},)


@pytest.mark.parametrize("style", ["sql_standard", "iso_8601", "postgres_verbose"])
def test_a_database_whose_intervals_are_not_postgres_style_is_read_by_every_connection_the_driver_opens(
    db: Database, style: str
) -> None:
    """psycopg reads intervals only in the 'postgres' IntervalStyle: with a database default of
    another style, every read of a duration (a definition's or a run's timeout, a claim's
    answer) raised NotImplementedError, and `pgtick define` committed its definition, then
    ended in a traceback. The driver's own connections set the style for themselves."""
    name = str(conninfo_to_dict(db.dsn)["dbname"])
    with db.connect() as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET IntervalStyle = {}").format(
                sql.Identifier(name), sql.Literal(style)
            )
        )
        with db.connect() as plain:
            assert plain.info.parameter_status("IntervalStyle") == style, "the setting took"

    defined = pgtick(
        "define", "nightly", "report", "--schedule", "0 2 * * *", "--timeout", "90", "--dsn", db.dsn
    )  # fmt: skip
    assert defined.returncode == 0 and "Traceback" not in defined.stderr, defined
    listed = pgtick("definitions", "--json", "--dsn", db.dsn)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
    with connect(db.dsn) as conn:
        read = conn.execute("SELECT interval '1 day 02:03:04'").fetchone()
        assert read == (timedelta(days=1, seconds=7384),)
    with Client(db.dsn) as client:
        run_id = client.enqueue("report", {"day": 1}, timeout=timedelta(minutes=5)).id
        assert client.get_run(run_id).timeout == timedelta(minutes=5)

    async def read_async() -> timedelta | None:
        async with AsyncClient(db.dsn) as aclient:
            return (await aclient.get_run(run_id)).timeout

    assert asyncio.run(read_async()) == timedelta(minutes=5)


def test_a_database_whose_default_isolation_is_not_read_committed_is_claimed_from_by_the_driver(
    db: Database,
) -> None:
    """jobs.claim, jobs.complete and an enqueue with a key need READ COMMITTED: with a database
    default of SERIALIZABLE every claim of the Python worker raised 25000 (a worker that never
    ran anything) and `pgtick enqueue --key` failed. The driver's own direct connections set
    READ COMMITTED for themselves; a session the caller opened is left as it is."""
    name = str(conninfo_to_dict(db.dsn)["dbname"])
    with db.connect() as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'serializable'").format(
                sql.Identifier(name)
            )
        )
        with db.connect() as plain:
            got = plain.execute("SHOW default_transaction_isolation").fetchone()
            assert got == ("serializable",), "the setting took"

    enqueued = pgtick("enqueue", "report", "--key", "order-42", "--dsn", db.dsn)
    assert enqueued.returncode == 0 and "Traceback" not in enqueued.stderr, enqueued
    with connect(db.dsn) as conn:
        claimed = conn.execute("SELECT id FROM jobs.claim(1, 'w-1', ARRAY['report'])").fetchall()
        assert len(claimed) == 1
        assert conn.execute("SELECT jobs.complete(%s, 'w-1')", claimed[0]).fetchone() == (True,)
    with Client(db.dsn) as client:
        assert client.enqueue("report", {"day": 2}, idempotency_key="day-2").status == "QUEUED"

    async def enqueue_async() -> str:
        async with AsyncClient(db.dsn) as aclient:
            return (await aclient.enqueue("report", {"day": 3}, idempotency_key="day-3")).status

    assert asyncio.run(enqueue_async()) == "QUEUED"
