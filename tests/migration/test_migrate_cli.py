"""`pgtick migrate` on the command line: a failure is an exit code and one readable line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness import (
    Database,
    Server,
    dsn_for,
    env_for,
    psql_file,
    psql_script_args,
    scalar,
    schema_before,
    wait_for,
)
from pgtick import migrate


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def empty(pg: Server) -> Iterator[Database]:
    database = pg.create_empty_database()
    yield database
    pg.drop_database(database)


@pytest.mark.parametrize("sql", [False, True], ids=["apply", "--sql"])
def test_a_driver_without_its_schema_files_says_so_in_one_line(
    db: Database, tmp_path: Path, sql: bool
) -> None:
    """A pgtick installed without the sql/ and migrations/ it ships (a broken package, a copy
    of the module alone) cannot migrate nor print the install script: it says which files it
    lacks, exits 1 and changes nothing, rather than ending in a traceback."""
    package = tmp_path / "site" / "packages"
    shutil.copytree(Path(migrate.__file__).parent, package / "pgtick")
    assert not (package.parent.parent / "sql").exists()
    args = ["--sql"] if sql else ["--dsn", db.dsn]
    env = env_for(None)
    env["PYTHONPATH"] = str(package)
    result = subprocess.run(
        [sys.executable, "-m", "pgtick", "migrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    line = _one_line(result.stderr)
    assert result.returncode == 1, result
    assert "cannot find sql/ and migrations/" in line, line
    assert result.stdout == ""


#: The migration lock's key (sql/install.sql, pgtick_migration_lock).
_MIGRATION_LOCK = migrate.install_plan().lock_key


@pytest.mark.parametrize(
    "path", ["pgtick migrate", "pgtick migrate through a pooler", "psql", "generated script"]
)
def test_a_migrator_waits_its_turn_whatever_timeouts_the_database_sets(
    pg: Server, empty: Database, tmp_path: Path, path: str
) -> None:
    """Invariant: two migrators at once run one after the other. A database (or role) that
    sets lock_timeout and statement_timeout, as many production databases do, must not make
    the second one fail while it waits for the first one's migration lock: it waits, then
    installs (the statements of the install itself still run under the database's
    statement_timeout)."""
    with pg.admin() as admin:
        admin.execute(f"ALTER DATABASE \"{empty.name}\" SET lock_timeout = '100ms'")
        admin.execute(f"ALTER DATABASE \"{empty.name}\" SET statement_timeout = '5s'")
    env = env_for(None)
    if path.startswith("pgtick migrate"):
        args = [sys.executable, "-m", "pgtick", "migrate", "--dsn", empty.dsn]
        # PGTICK_POOLER=1: the one-transaction install that a transaction-mode pooler needs.
        env["PGTICK_POOLER"] = "1" if "pooler" in path else "0"
    elif path == "psql":
        args = psql_script_args(empty.dsn, migrate.schema_root() / "sql" / "install.sql")
    else:
        script = tmp_path / "install.sql"
        script.write_text(migrate.install_script())
        args = psql_script_args(empty.dsn, script)
    with psycopg.connect(empty.dsn, autocommit=True) as first:
        first.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        second = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(None)
        )
        try:
            # Waiting for the lock longer than either timeout allows, by the server's clock.
            wait_for(
                "the second migrator to wait on the migration lock for six seconds",
                lambda: (
                    second.poll() is not None
                    or scalar(
                        first,
                        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
                        " AND wait_event = 'advisory' AND now() - query_start > interval '6 seconds'",
                    )
                ),
                timeout=60,
            )
            assert second.poll() is None, f"the second migrator stopped waiting: {second.communicate()}"
        finally:
            first.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
        _, err = second.communicate(timeout=240)
    assert second.returncode == 0, err
    with psycopg.connect(empty.dsn) as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.schema_migrations") == len(migrate.migrations())


def test_a_schema_one_role_installed_and_a_superuser_upgraded_keeps_one_owner(
    pg: Server, tmp_path: Path
) -> None:
    """A database owner installs (psql, an earlier release); a superuser runs `pgtick migrate`
    later. Every object of the jobs schema still belongs to the schema's owner, so the
    owner's SECURITY DEFINER functions can use what the upgrade created (jobs.enqueue calls a
    helper function a later migration re-created) and no function runs with the superuser's
    rights."""
    owner = f"pgtick_installer_{os.getpid()}"
    operator = f"pgtick_upg_operator_{os.getpid()}"
    with pg.admin() as admin:
        for role in (owner, operator):
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        admin.execute(f'CREATE ROLE "{owner}" LOGIN CREATEROLE')
        admin.execute(f'CREATE ROLE "{operator}" LOGIN IN ROLE jobs_operator')
        # The installer's install grants pgtick's roles, which exist already on this server: from
        # PostgreSQL 16 on, CREATEROLE alone no longer lets it grant roles another role made.
        for (role,) in admin.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'jobs\\_%'").fetchall():
            admin.execute(f'GRANT "{role}" TO "{owner}" WITH ADMIN OPTION')
    database = pg.create_empty_database()
    try:
        with pg.admin() as admin:
            admin.execute(f'ALTER DATABASE "{database.name}" OWNER TO "{owner}"')
        script = schema_before("0025_trace_context_check.sql", tmp_path / "before")
        installed = psql_file(dsn_for(pg.admin_dsn, database.name, user=owner), script)
        assert installed.returncode == 0, installed.stderr
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            assert "0025" in migrate.apply(conn)
            others = conn.execute(
                "SELECT c.relname FROM pg_class AS c WHERE c.relnamespace = 'jobs'::regnamespace"
                " AND c.relowner <> (SELECT nspowner FROM pg_namespace WHERE nspname = 'jobs')"
                " UNION ALL SELECT p.oid::regprocedure::text FROM pg_proc AS p"
                " WHERE p.pronamespace = 'jobs'::regnamespace"
                " AND p.proowner <> (SELECT nspowner FROM pg_namespace WHERE nspname = 'jobs')"
            ).fetchall()
        assert others == [], f"objects of the jobs schema not owned by its owner {owner}: {others}"
        with psycopg.connect(dsn_for(pg.admin_dsn, database.name, user=operator), autocommit=True) as conn:
            assert scalar(conn, "SELECT (jobs.enqueue('report', '{}')).id") is not None
    finally:
        pg.drop_database(database)
        with pg.admin() as admin:
            if admin.info.server_version >= 160000:  # grants record their grantor, who cannot go first
                granted = admin.execute(
                    "SELECT m.roleid::regrole::text, m.member::regrole::text FROM pg_auth_members AS m"
                    " WHERE m.grantor = (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = %s)",
                    (owner,),
                ).fetchall()
                for role, member in granted:
                    admin.execute(f'REVOKE {role} FROM {member} GRANTED BY "{owner}"')
            for role in (owner, operator):
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_a_login_that_may_not_install_says_so_in_one_line_and_changes_nothing(
    pg: Server, empty: Database, db: Database
) -> None:
    """A login without CREATE on the database (an empty one) or without the rights of the jobs
    schema's owner (a migrated one) runs `pgtick migrate`: exit 1, one line that says this
    login may not install or migrate and whom to migrate as, rather than PostgreSQL's word on
    the first statement it may not run (a role's admin option, a schema's permission); the
    psql install stops on the same line, and nothing changes."""
    login = f"pgtick_no_create_{os.getpid()}"
    with pg.admin() as admin:
        admin.execute(f'DROP ROLE IF EXISTS "{login}"')
        admin.execute(f'CREATE ROLE "{login}" LOGIN')
    script = Path(migrate.schema_root()) / "sql" / "install.sql"
    try:
        for database, expected in (
            (empty, f"role {login} may not create the schema jobs in database {empty.name}"),
            (db, f"role {login} may not migrate the schema jobs, which belongs to role "),
        ):
            with psycopg.connect(database.dsn) as conn:
                before = scalar(conn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'jobs'")
            dsn = dsn_for(pg.admin_dsn, database.name, user=login)
            result = subprocess.run(
                [sys.executable, "-m", "pgtick", "migrate", "--dsn", dsn],
                capture_output=True,
                text=True,
                timeout=120,
                env=env_for(None),
            )
            line = _one_line(result.stderr)
            assert result.returncode == 1, result
            assert expected in line and "Migrate as" in line, line
            by_psql = psql_file(dsn, script)
            assert by_psql.returncode != 0 and expected in by_psql.stderr, by_psql.stderr
            with psycopg.connect(database.dsn) as conn:
                after = scalar(conn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'jobs'")
            assert after == before, f"{database.name}: the jobs schema came or went"
    finally:
        with pg.admin() as admin:
            admin.execute(f'DROP ROLE IF EXISTS "{login}"')
