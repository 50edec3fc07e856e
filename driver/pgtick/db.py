"""Connections: where the DSN comes from and how the driver opens connections."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from pgtick import calls
from pgtick.errors import PgtickError, UsageError

Connection = psycopg.Connection[Any]

#: What a database outage looks like to the driver's loops: retry, never die.
DB_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, PgtickError)


#: libpq's TCP keepalives for every connection the driver opens, and a limit on how long sent
#: data may go unacknowledged (libpq 12 and later): a network that drops packets silently ends
#: a call in seconds rather than at the kernel's TCP timeout (many minutes), so a worker's
#: heartbeat and claims reconnect, and its runs' ownership is settled, once the network is
#: back. A DSN that sets one of them keeps its own; a Unix socket ignores them.
KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}
TCP_USER_TIMEOUT_MS = 15000


def _keepalives(dsn: str, given: dict[str, Any]) -> dict[str, Any]:
    """The keepalive settings neither ``dsn`` nor ``given`` sets."""
    wanted: dict[str, Any] = dict(KEEPALIVES)
    if psycopg.pq.version() >= 120000:
        wanted["tcp_user_timeout"] = TCP_USER_TIMEOUT_MS
    try:
        in_dsn = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # not a DSN: psycopg.connect says so
        return {}
    return {k: v for k, v in wanted.items() if k not in in_dsn and k not in given}


def connect(dsn: str, *, application_name: str = "pgtick", **kwargs: Any) -> Connection:
    """An autocommit connection (each function call is its own transaction), with TCP
    keepalives (``KEEPALIVES``), dates in ISO 8601, intervals in the postgres style, text in
    UTF-8 and, behind a pooler, no prepared statements (see ``prepare``)."""
    try:
        conn = psycopg.connect(
            dsn,
            autocommit=True,
            application_name=application_name,
            connect_timeout=10,
            **_keepalives(dsn, kwargs),
            **kwargs,
        )
    except psycopg.OperationalError as exc:
        raise PgtickError(f"cannot connect to PostgreSQL: {_first_line(exc)}") from exc
    prepare(conn)
    return conn


def _session_settings(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> list[str]:
    """The SETs that make the session write what psycopg reads (none when it does): dates as
    ISO 8601 (psycopg reads no other style: a database set to ``SQL, DMY`` would fail every
    read of a time; the field order stays), intervals in the ``postgres`` style (psycopg
    reads no other: ``sql_standard``, ``iso_8601`` or ``postgres_verbose`` would fail every
    read of a duration, a claimed run's timeout included) and text as UTF-8 (psycopg reads
    JSON as UTF-8 whatever the encoding: a ``PGCLIENTENCODING=LATIN1`` would fail every read
    of a payload with a non-ASCII character; a database not in UTF-8 is pgtick's install's to
    refuse). PgBouncer keeps DateStyle and client_encoding per client, and IntervalStyle
    where its ``track_extra_parameters`` lists it (the default from 1.20)."""
    status = conn.info.parameter_status
    sets = []
    if not (status("DateStyle") or "ISO").startswith("ISO"):
        sets.append("SET DateStyle TO ISO")
    if (status("IntervalStyle") or "postgres") != "postgres":
        sets.append("SET IntervalStyle TO postgres")
    if status("server_encoding") == "UTF8" and (status("client_encoding") or "UTF8") != "UTF8":
        sets.append("SET client_encoding TO 'UTF8'")
    return sets


def prepare(conn: psycopg.Connection[Any]) -> bool:
    """Make a connection the driver opened fit for it: the session settings psycopg reads by
    (``_session_settings``), ``prepare_for_pooler``, whose answer it returns, and, without a
    pooler, READ COMMITTED as the session's default isolation (``calls.READ_COMMITTED_SESSION``:
    a database set to SERIALIZABLE for its application would refuse every claim). Behind a
    transaction-mode pooler a SET would reach other clients' sessions: none is sent (set it on
    the worker's login there: ALTER ROLE ... SET default_transaction_isolation = 'read committed')."""
    for statement in _session_settings(conn):
        conn.execute(statement)
    pooled = prepare_for_pooler(conn)
    if not pooled:
        conn.execute(calls.READ_COMMITTED_SESSION)
    return pooled


async def prepare_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """``prepare`` for an async connection."""
    for statement in _session_settings(conn):
        await conn.execute(statement)
    pooled = await prepare_for_pooler_async(conn)
    if not pooled:
        await conn.execute(calls.READ_COMMITTED_SESSION)
    return pooled


#: Overrides the detection of a transaction-mode pooler: 1 (yes) or 0 (no).
POOLER_VARIABLE = "PGTICK_POOLER"


def behind_pooler(conn: psycopg.Connection[Any]) -> bool:
    """True when something sits between this client and PostgreSQL (PgBouncer, a proxy):
    the port this connection reached is not the port the server listens on.

    Through a transaction-mode pooler, consecutive transactions of one client may run
    on different server sessions, and a session's state (advisory locks, LISTEN, SET,
    prepared statements) reaches other clients: the driver then leads by a lease,
    polls instead of listening and prepares nothing. A port-mapping proxy in front of
    a direct connection is taken for a pooler too, which only costs those shortcuts.
    A pooler on the server's own port number (on another host) looks direct: say so with
    ``PGTICK_POOLER=1`` (``0`` says there is none).
    """
    told = _told_pooler()
    if told is not None:
        return told
    server_port = calls.server_port(conn)
    return server_port is not None and conn.info.port != server_port


def _told_pooler() -> bool | None:
    """What ``PGTICK_POOLER`` says: True (a pooler), False (none), None (not set: ask the ports)."""
    told = os.environ.get(POOLER_VARIABLE, "").strip().lower()
    if told in ("1", "yes", "true", "transaction"):
        return True
    if told in ("0", "no", "false", "none"):
        return False
    return None


def prepare_for_pooler(conn: psycopg.Connection[Any]) -> bool:
    """Behind a pooler, turn psycopg's automatic prepared statements off (a statement
    prepared on one server session does not exist on the next); True if it did."""
    if behind_pooler(conn):
        conn.prepare_threshold = None
        return True
    return False


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else repr(exc)


def connect_dicts(dsn: str, *, application_name: str = "pgtick") -> psycopg.Connection[dict[str, Any]]:
    """Like ``connect``, with rows as dicts."""
    conn: psycopg.Connection[dict[str, Any]] = connect(
        dsn, application_name=application_name, row_factory=dict_row
    )
    return conn


_URI_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s\"]*:)[^\s\"]*@", re.IGNORECASE)


_QUOTED = re.compile(r'"([^"]*)"')
# libpq's messages that quote an option's name, not a value: a name is no secret, and it is
# what the reader must fix.
_QUOTES_A_NAME = ("invalid connection option", "invalid URI query parameter")


def without_password(message: str) -> str:
    """libpq's message about a connection string or URL it cannot parse, with what could be a
    password masked: the message goes to a terminal and to CI logs. A quoted URL keeps all but
    its password; any other quoted token (a fragment of a value: ``invalid percent-encoded
    token: "Sup3r%Secret"``, ``missing "=" after "Secret"``) is masked, unless the message
    quotes an option's name or a single punctuation mark."""
    message = _URI_PASSWORD.sub(r"\1***@", message)
    names = message.lstrip().startswith(_QUOTES_A_NAME)

    def mask(found: re.Match[str]) -> str:
        token = found.group(1)
        if re.match(r"postgres(?:ql)?://", token, re.IGNORECASE) or (len(token) == 1 and not token.isalnum()):
            return found.group(0)
        if names and re.fullmatch(r"[A-Za-z_]+", token):
            return found.group(0)
        return '"***"'

    return _QUOTED.sub(mask, message)


def resolve_dsn(explicit: str | None, start_embedded: Callable[[], str]) -> str:
    """--dsn, else $DATABASE_URL, else the embedded PostgreSQL."""
    if explicit:
        return explicit
    for variable in ("DATABASE_URL", "PGTICK_DSN"):
        env = os.environ.get(variable)
        if env and not env.strip():  # as --dsn ' ': libpq would read it as every default
            raise UsageError(f"${variable}: must not be blank (unset it for the next choice)")
        if env:
            try:
                conninfo_to_dict(env)
            except psycopg.ProgrammingError as exc:  # a typo in the environment is a usage error
                why = without_password(" ".join(str(exc).split()))
                raise UsageError(f"${variable}: not a connection string or URL: {why}") from None
            return env
    return start_embedded()


async def prepare_for_pooler_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """``prepare_for_pooler`` for an async connection (``PGTICK_POOLER`` decides first, as in
    ``behind_pooler``)."""
    pooled = _told_pooler()
    if pooled is None:
        cur = await conn.execute(calls.SERVER_PORT)
        row = await cur.fetchone()
        pooled = row is not None and conn.info.port != int(row[0] if isinstance(row, tuple) else row["port"])
    if pooled:
        conn.prepare_threshold = None
        return True
    return False
