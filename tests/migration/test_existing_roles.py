"""pgtick's roles when they exist before the install: refused with an attribute no pgtick role
may have, used with a warning otherwise, and quietly once pgtick has made or marked them.

The roles are the server's, so these tests run on a fresh server of their own (the shared
one has pgtick's roles already, and other tests use them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness import dsn_for, pgtick, psql_file
from pgtick import migrate
from pgtick.embedded import EmbeddedPostgres


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A fresh server's admin DSN: no pgtick role exists on it yet."""
    server = EmbeddedPostgres(ephemeral=True, fast=True)
    admin_dsn = server.start()
    try:
        yield admin_dsn
    finally:
        server.stop()


def _admin(admin_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(admin_dsn, autocommit=True)


def _fresh_database(admin_dsn: str, name: str) -> str:
    with _admin(admin_dsn) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return dsn_for(admin_dsn, name)


def _installed(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT to_regnamespace('jobs') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _role_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "already existed" in line]


def test_a_role_someone_else_made_is_used_with_a_warning_given_once(cluster: str) -> None:
    """Before the install, someone made jobs_worker a login, a member of an application's role
    and gave it a member; and jobs_reader, a plain NOLOGIN role. `pgtick migrate` installs, and
    warns once for each of the two, naming what it carries; jobs_operator, which it created,
    is not mentioned. Migrating again, or migrating another database of the server, says
    nothing more."""
    with _admin(cluster) as admin:
        admin.execute("CREATE ROLE app_tables NOLOGIN")
        admin.execute("CREATE ROLE jobs_worker LOGIN IN ROLE app_tables")
        admin.execute("CREATE ROLE alice LOGIN IN ROLE jobs_worker")
        admin.execute("CREATE ROLE jobs_reader NOLOGIN")
    first = _fresh_database(cluster, "adopts")
    done = pgtick("migrate", "--dsn", first, timeout=300)
    assert done.returncode == 0, done.stderr
    warnings = _role_warnings(done.stderr)
    assert len(warnings) == 2, f"expected a warning for jobs_reader and jobs_worker, got:\n{done.stderr}"
    reader, worker = sorted(warnings, key=lambda line: "jobs_worker" in line)
    plain = "role jobs_reader already existed and pgtick did not create it: using it (Every login"
    assert plain in reader, reader
    carried = ("role jobs_worker already existed", "it can log in", "member of app_tables", "members: alice")
    for said in carried:
        assert said in worker, f"{said!r} missing from: {worker}"
    assert "jobs_operator" not in done.stderr, done.stderr

    again = pgtick("migrate", "--dsn", first, timeout=300)
    assert again.returncode == 0, again.stderr
    assert _role_warnings(again.stderr) == [], again.stderr
    second = _fresh_database(cluster, "adopts_too")
    other = pgtick("migrate", "--dsn", second, timeout=300)
    assert other.returncode == 0, other.stderr
    assert _role_warnings(other.stderr) == [], other.stderr
    with _admin(cluster) as admin:
        marks = admin.execute(
            "SELECT rolname, shobj_description(oid, 'pg_authid') LIKE 'pgtick:%' FROM pg_roles"
            " WHERE rolname LIKE 'jobs\\_%' ORDER BY rolname"
        ).fetchall()
    assert marks == [("jobs_operator", True), ("jobs_reader", True), ("jobs_worker", True)], marks


@pytest.mark.parametrize("attribute", ["SUPERUSER", "CREATEROLE", "CREATEDB", "REPLICATION", "BYPASSRLS"])
def test_a_role_with_an_attribute_no_pgtick_role_may_have_is_refused_before_anything_changes(
    cluster: str, attribute: str
) -> None:
    """jobs_worker given an attribute that every worker login would then hold too: migrating a
    new database, and migrating again one already installed, stops with an error naming the
    role and the attribute, by `pgtick migrate` (exit 1, one line) and by psql, and nothing is
    installed or changed. Once the attribute is removed, the install goes through."""
    installed = _fresh_database(cluster, f"installed_{attribute.lower()}")
    with psycopg.connect(installed, autocommit=True) as conn:
        migrate.apply(conn)
        ledger = conn.execute("SELECT count(*) FROM jobs.schema_migrations").fetchone()
    fresh = _fresh_database(cluster, f"refused_{attribute.lower()}")
    with _admin(cluster) as admin:
        admin.execute(f"ALTER ROLE jobs_worker {attribute}")
    try:
        for dsn in (fresh, installed):
            by_cli = pgtick("migrate", "--dsn", dsn, timeout=300)
            assert by_cli.returncode == 1, (by_cli.stdout, by_cli.stderr)
            assert "Traceback" not in by_cli.stderr, by_cli.stderr
            assert f"role jobs_worker already exists with {attribute}" in by_cli.stderr, by_cli.stderr
            assert f"ALTER ROLE jobs_worker NO{attribute}" in by_cli.stderr, by_cli.stderr
            by_psql = psql_file(dsn, migrate.schema_root() / "sql" / "install.sql")
            assert by_psql.returncode != 0, by_psql.stderr
            assert f"role jobs_worker already exists with {attribute}" in by_psql.stderr, by_psql.stderr
        assert not _installed(fresh), "a refused install left a jobs schema behind"
        with psycopg.connect(installed, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM jobs.schema_migrations").fetchone() == ledger
    finally:
        with _admin(cluster) as admin:
            admin.execute(f"ALTER ROLE jobs_worker NO{attribute}")
    done = pgtick("migrate", "--dsn", fresh, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _installed(fresh)


@pytest.mark.parametrize(
    ("granted", "named"),
    [
        ("app_admin", "which has SUPERUSER"),
        ("pg_execute_server_program", "the rights of pg_execute_server_program"),
    ],
)
def test_a_role_that_may_set_role_to_a_powerful_one_is_refused_before_anything_changes(
    cluster: str, granted: str, named: str
) -> None:
    """jobs_worker a member, through a role of the application's, of a SUPERUSER role or of
    pg_execute_server_program: every worker login granted it could SET ROLE to that role, as
    good as holding the attribute. Migrating stops naming the role and the membership, by
    `pgtick migrate` and by psql, and installs nothing; once revoked, the install goes through."""
    fresh = _fresh_database(cluster, f"member_{granted}")
    with _admin(cluster) as admin:
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'jobs_worker'").fetchone() is None:
            admin.execute("CREATE ROLE jobs_worker NOLOGIN")
        if granted == "app_admin":
            admin.execute("CREATE ROLE app_admin SUPERUSER NOLOGIN")
        admin.execute("CREATE ROLE app_ops NOLOGIN")
        admin.execute(f"GRANT {granted} TO app_ops")
        admin.execute("GRANT app_ops TO jobs_worker")
    try:
        said = f"role jobs_worker already exists as a member of {granted} (through app_ops), which has"
        by_cli = pgtick("migrate", "--dsn", fresh, timeout=300)
        assert by_cli.returncode == 1, (by_cli.stdout, by_cli.stderr)
        assert "Traceback" not in by_cli.stderr, by_cli.stderr
        assert said in by_cli.stderr and named in by_cli.stderr, by_cli.stderr
        assert "REVOKE app_ops FROM jobs_worker" in by_cli.stderr, by_cli.stderr
        by_psql = psql_file(fresh, migrate.schema_root() / "sql" / "install.sql")
        assert by_psql.returncode != 0 and said in by_psql.stderr, by_psql.stderr
        assert not _installed(fresh), "a refused install left a jobs schema behind"
    finally:
        with _admin(cluster) as admin:
            admin.execute("DROP ROLE app_ops")
            if granted == "app_admin":
                admin.execute("DROP ROLE app_admin")
    done = pgtick("migrate", "--dsn", fresh, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _installed(fresh)
