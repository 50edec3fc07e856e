"""pgtick.errors maps the SQL API's SQLSTATEs in one place: class 22/23 and 54000 (a value past
a server limit) -> InvalidArgument (naming the field, keeping the hint), P0002 -> NotFound,
42883 -> SchemaMismatch, 42501 -> PermissionDenied, 25006 -> ReadOnly; anything else stays a
psycopg error. The CLI goes through the same mapping (one line; exit 2 for bad input, 1 for a
refusal)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from harness import Database, pgtick
from pgtick.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ReadOnly,
    SchemaMismatch,
    Session,
    UsageError,
    translate_errors,
)


def test_22023_becomes_invalid_argument_naming_the_field(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidArgument) as caught, translate_errors():
        conn.execute("SELECT jobs.enqueue('k', max_attempts => 0)")
    err = caught.value
    assert (err.sqlstate, err.field) == ("22023", "max_attempts"), vars(err)
    assert str(err).startswith("max_attempts must be between 1 and 1000"), str(err)
    assert isinstance(err, UsageError), "the CLI treats it as bad input (exit 2)"


def test_a_hint_from_the_server_is_kept(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidArgument) as caught, translate_errors():
        conn.execute("SELECT jobs.define('d', 'k', timezone => 'Mars/Olympus', run_at => now() + '1 day')")
    assert caught.value.field == "timezone"
    assert caught.value.hint == "Use a name such as Europe/Sofia or UTC (see pg_timezone_names)."


def test_class_23_becomes_invalid_argument(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidArgument) as caught, translate_errors():
        conn.execute("INSERT INTO jobs.runs (kind, attempt) VALUES ('k', 0)")
    assert caught.value.sqlstate == "23514", vars(caught.value)


def test_a_value_past_a_server_limit_becomes_invalid_argument(conn: psycopg.Connection[Any]) -> None:
    """54000, program_limit_exceeded: what a caller sent is too large for the server (a payload
    string past jsonb's 256 MB, here an array past its maximum size), bad input like 22023."""
    with pytest.raises(InvalidArgument, match="array size exceeds the maximum") as caught, translate_errors():
        conn.execute("SELECT array_fill(1, ARRAY[%s])", (200_000_000,))
    assert caught.value.sqlstate == "54000", vars(caught.value)


def test_p0002_becomes_not_found(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(NotFound, match="definition 'nope' does not exist") as caught, translate_errors():
        conn.execute("SELECT jobs.run_now('nope')")
    assert caught.value.sqlstate == "P0002"


def test_42883_says_the_schema_is_older_than_the_driver(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(SchemaMismatch, match="pgtick migrate"), translate_errors():
        conn.execute("SELECT jobs.enqueue('k', no_such_parameter => 1)")


def test_a_missing_table_or_column_of_the_schema_says_to_migrate(conn: psycopg.Connection[Any]) -> None:
    for sql in ("SELECT * FROM jobs.no_such_table", "SELECT no_such_column FROM jobs.runs"):
        with pytest.raises(SchemaMismatch, match="run pgtick migrate") as caught, translate_errors():
            conn.execute(sql)
        missing = psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn
        assert isinstance(caught.value.__cause__, missing)


def test_other_errors_stay_psycopg_errors(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled), translate_errors():
        conn.execute("SET statement_timeout = '10ms'")
        conn.execute("SELECT pg_sleep(5)")


def test_the_cli_reports_an_invalid_argument_as_one_line_exit_2(db: Database) -> None:
    result = pgtick("enqueue", "k", "--priority", "5000", "--dsn", db.dsn)
    assert result.returncode == 2, result
    expected = "pgtick enqueue: error: --priority: must be between -1000 and 1000 (got 5000)"
    assert result.stderr.strip() == f"{expected} (see pgtick enqueue --help)"


def test_the_cli_reports_not_found_as_one_line_exit_2(db: Database) -> None:
    result = pgtick("cancel", "424242", "--dsn", db.dsn)
    assert result.returncode == 2, result
    assert result.stderr.strip() == "pgtick cancel: error: run 424242 does not exist"


def test_42501_becomes_permission_denied_naming_pgticks_roles(db: Database) -> None:
    with db.worker_login("denied") as login, db.connect(user=login) as conn:
        with pytest.raises(PermissionDenied) as caught, translate_errors():
            conn.execute("SELECT jobs.enqueue('k')")
        assert caught.value.sqlstate == "42501" and caught.value.role is None
        assert str(caught.value) == (
            "permission denied for function enqueue (the login lacks the pgtick role this needs:"
            " jobs_operator to enqueue and manage runs, jobs_reader to read them, jobs_worker to run them)"
        )
        with (
            pytest.raises(PermissionDenied) as caught,
            translate_errors(Session(role="jobs_operator")) as session,
        ):
            session.info = conn.info
            conn.execute("SELECT jobs.cancel(1)")
        assert str(caught.value).endswith(
            f"(this call needs a login granted jobs_operator: GRANT jobs_operator TO {login})"
        )


def test_25006_becomes_read_only_saying_whether_the_server_is_a_standby(
    conn: psycopg.Connection[Any],
) -> None:
    """Without the connection the advice names both causes; with it, the one it reports
    (``in_hot_standby``: this server is a primary)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(
            ReadOnly, match="the server is a standby, or the transaction is READ ONLY"
        ) as caught:
            with conn.transaction(), translate_errors():
                conn.execute("SELECT jobs.enqueue('k')")
        assert (caught.value.sqlstate, caught.value.standby) == ("25006", None)
        with pytest.raises(ReadOnly, match=r"\(the transaction is READ ONLY") as caught:
            with conn.transaction(), translate_errors() as session:
                session.info = conn.info
                conn.execute("SELECT jobs.enqueue('k')")
        assert caught.value.standby is False


def test_the_cli_reports_a_read_only_session_as_one_line_exit_1(db: Database) -> None:
    read_only = make_conninfo(db.dsn, options="-c default_transaction_read_only=on")
    result = pgtick("enqueue", "k", "--dsn", read_only)
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pgtick enqueue: error: cannot execute"), result.stderr
    assert "read-only transaction (the" in lines[0] and "read-write transaction" in lines[0], lines[0]
