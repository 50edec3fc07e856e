"""Migration mechanics: idempotent, serialized, psql path == driver path, documented schema."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import (
    Database,
    Server,
    checkout_schema,
    commits_adding,
    dsn_for,
    enqueue,
    pgtick,
    psql_file,
    psql_script_args,
    run_in_processes,
    scalar,
    schema_before,
    wait_for,
)
from migration.test_install_includes import add_migration_line
from pgtick import migrate
from pgtick.embedded import EmbeddedPostgres
from pgtick.errors import SchemaMismatch

# Everything a user or another language can observe about the jobs schema, by name (the
# position of a column added by a later migration depends on when a database got it).
CATALOG_SNAPSHOT = """
SELECT 'rel', c.relname || ':' || c.relkind::text || ':' || coalesce(array_to_string(c.reloptions, ','), '')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'col', c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)
       || ':' || a.attnotnull || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE n.nspname = 'jobs' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'idx', pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'con', conrelid::regclass::text || ':' || conname || ':' || pg_get_constraintdef(o.oid)
  FROM pg_constraint o JOIN pg_namespace n ON n.oid = o.connamespace WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'fn', pg_get_functiondef(p.oid) || coalesce(array_to_string(p.proacl, ','), '')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'view', c.relname || ':' || pg_get_viewdef(c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'jobs' AND c.relkind = 'v'
UNION ALL
SELECT 'acl', c.relname || ':' || coalesce(array_to_string(c.relacl, ','), '')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'enum', t.typname || ':' || e.enumlabel || ':' || e.enumsortorder
  FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
  JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'comment', c.relname || ':' || coalesce(a.attname, '') || ':' || d.description
  FROM pg_description d
  JOIN pg_class c ON d.classoid = 'pg_class'::regclass AND c.oid = d.objoid
  LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.objsubid AND d.objsubid > 0
  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobs'
UNION ALL
SELECT 'version', version FROM jobs.schema_migrations
ORDER BY 1, 2
"""


def snapshot(dsn: str) -> list[tuple[Any, ...]]:
    # Definitions printed alike whatever the database's default (quote_all_identifiers on
    # quotes every name).
    with psycopg.connect(dsn, autocommit=True, options="-c quote_all_identifiers=off") as conn:
        return [tuple(row) for row in conn.execute(CATALOG_SNAPSHOT).fetchall()]


def migrate_dsn(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return migrate.apply(conn)


@pytest.fixture
def empty(pg: Server) -> Any:
    database = pg.create_empty_database()
    yield database
    pg.drop_database(database)


@pytest.fixture
def empty2(pg: Server) -> Any:
    database = pg.create_empty_database()
    yield database
    pg.drop_database(database)


@contextmanager
def _encoded_database(pg: Server, encoding: str) -> Iterator[Database]:
    """An empty database in ``encoding`` (C locale, which every encoding takes), dropped after."""
    name = f"pgtick_enc_{os.getpid()}_{encoding.lower()}"
    with pg.admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(
            f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    database = Database(name, dsn_for(pg.admin_dsn, name))
    try:
        yield database
    finally:
        pg.drop_database(database)


def test_generated_script_equals_the_includes(empty: Database, empty2: Database, tmp_path: Path) -> None:
    """`pgtick migrate --sql` (includes inlined) installs the same schema as sql/install.sql."""
    script = tmp_path / "install.sql"
    script.write_text(migrate.install_script())
    result = psql_file(empty.dsn, script)
    assert result.returncode == 0, result.stderr
    installed = psql_file(empty2.dsn, migrate.schema_root() / "sql" / "install.sql")
    assert installed.returncode == 0, installed.stderr
    assert snapshot(empty.dsn) == snapshot(empty2.dsn)


def test_applying_twice_is_a_noop(empty: Database) -> None:
    assert migrate_dsn(empty.dsn) == [m.version for m in migrate.migrations()]
    first = snapshot(empty.dsn)
    assert migrate_dsn(empty.dsn) == []
    assert snapshot(empty.dsn) == first


def test_psql_path_equals_driver_path(empty: Database, empty2: Database) -> None:
    result = psql_file(empty.dsn, migrate.schema_root() / "sql" / "install.sql")
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in result.stderr
    migrate_dsn(empty2.dsn)
    assert snapshot(empty.dsn) == snapshot(empty2.dsn)
    # And re-running the psql script over an installed schema changes nothing.
    again = psql_file(empty.dsn, migrate.schema_root() / "sql" / "install.sql")
    assert again.returncode == 0, again.stderr
    assert snapshot(empty.dsn) == snapshot(empty2.dsn)


def test_concurrent_migrators_leave_one_schema(empty: Database, empty2: Database) -> None:
    """Invariant: N migrators at once are serialized by the advisory lock; each
    migration is applied once and the result equals a lone migrator's schema."""
    results = run_in_processes(migrate_dsn, [(empty.dsn,)] * 4)
    applied = [v for r in results for v in r]
    assert sorted(applied) == [m.version for m in migrate.migrations()], results
    migrate_dsn(empty2.dsn)
    assert snapshot(empty.dsn) == snapshot(empty2.dsn)


@pytest.mark.parametrize("path", ["pgtick migrate", "psql"])
def test_a_role_another_databases_migrator_creates_meanwhile_does_not_fail_the_migration(path: str) -> None:
    """The roles are cluster-wide, the migration lock is per database: a migrator of a fresh
    server's second database that finds a role missing, while the first database's migrator
    is creating it, waits for that creation and then must not fail on the role's name.
    A fresh server of the test's own, since the shared one has the roles already; the other
    migrator is a transaction here that creates jobs_reader and commits only once the
    migrator (a `pgtick migrate` or psql process) waits for it."""
    server = EmbeddedPostgres(ephemeral=True, fast=True)
    admin_dsn = server.start()
    try:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute("CREATE DATABASE app")
            with psycopg.connect(admin_dsn) as other:
                other.execute("CREATE ROLE jobs_reader NOLOGIN")
                app_dsn = dsn_for(admin_dsn, "app")
                migrator = subprocess.Popen(
                    [sys.executable, "-m", "pgtick.cli", "migrate", "--dsn", app_dsn]
                    if path == "pgtick migrate"
                    else psql_script_args(app_dsn, migrate.schema_root() / "sql" / "install.sql"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                wait_for(
                    "the migrator to wait for the other transaction's role",
                    lambda: (
                        admin.execute(
                            "SELECT 1 FROM pg_stat_activity"
                            " WHERE datname = 'app' AND wait_event_type = 'Lock'"
                        ).fetchone()
                        or migrator.poll() is not None
                    ),
                    timeout=180,
                )
                other.commit()
            out, err = migrator.communicate(timeout=300)
            assert migrator.returncode == 0, (out, err)
            with psycopg.connect(dsn_for(admin_dsn, "app"), autocommit=True) as conn:
                assert migrate.applied_versions(conn) == {m.version for m in migrate.migrations()}
            roles = admin.execute(
                "SELECT array_agg(rolname ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'jobs%'"
            ).fetchone()
            assert roles == (["jobs_operator", "jobs_reader", "jobs_worker"],)
    finally:
        server.stop()


def test_mixed_psql_and_driver_migrators_at_once(empty: Database, empty2: Database) -> None:
    script = migrate.schema_root() / "sql" / "install.sql"
    procs = [
        subprocess.Popen(
            psql_script_args(empty.dsn, script),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    migrate_dsn(empty.dsn)
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    migrate_dsn(empty2.dsn)
    assert snapshot(empty.dsn) == snapshot(empty2.dsn)


def _earlier_states() -> list[str]:
    """Git revisions of every earlier schema: the commit just before each migration after the
    first was added (what a user who installed then has in their database)."""
    refs: list[str] = []
    for migration in migrate.migrations()[1:]:
        for commit in commits_adding(migration.path.name):
            if f"{commit}^" not in refs:
                refs.append(f"{commit}^")
    return refs


def test_upgrade_from_every_earlier_schema_equals_fresh_install(
    pg: Server, empty2: Database, tmp_path: Path
) -> None:
    """A database installed (with psql, as that release documented) from any earlier schema
    and then migrated ends in the same schema as a fresh install of everything, and with
    the same role memberships (a worker is no longer a reader)."""
    migrate_dsn(empty2.dsn)
    fresh = snapshot(empty2.dsn)
    refs = _earlier_states()
    assert refs or len(migrate.migrations()) == 1
    for number, ref in enumerate(refs):
        script = checkout_schema(ref, tmp_path / f"state{number}")
        database = pg.create_empty_database()
        try:
            installed = psql_file(database.dsn, script)
            assert installed.returncode == 0, f"installing {ref}: {installed.stderr}"
            migrate_dsn(database.dsn)
            assert snapshot(database.dsn) == fresh, f"upgrading from {ref} differs from a fresh install"
            with psycopg.connect(database.dsn) as conn:  # roles are the cluster's, not in the snapshot
                reader = conn.execute("SELECT pg_has_role('jobs_worker', 'jobs_reader', 'MEMBER')").fetchone()
            assert reader == (False,), f"after upgrading from {ref}, jobs_worker is still a jobs_reader"
        finally:
            pg.drop_database(database)


@contextmanager
def _installed_before(pg: Server, migration: str, tmp_path: Path) -> Iterator[psycopg.Connection[Any]]:
    """A database with the schema as it was just before ``migration`` (installed with psql, as
    that release documented), an autocommit connection to it; dropped afterwards."""
    script = schema_before(migration, tmp_path / "before")
    database = pg.create_empty_database()
    try:
        installed = psql_file(database.dsn, script)
        assert installed.returncode == 0, f"installing the schema before {migration}: {installed.stderr}"
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            yield conn
    finally:
        pg.drop_database(database)


def test_the_occurrence_key_migration_refuses_an_occurrence_with_two_scheduled_runs(
    pg: Server, tmp_path: Path
) -> None:
    """Keyed by start, jobs.runs allowed two scheduled first attempts of one occurrence at two
    starts. Keying it by occurrence then cannot build its unique index: the migration says which
    occurrence (SQLSTATE 23505) and changes nothing; once one of the two is gone it applies."""
    with _installed_before(pg, "0019_occurrence_key.sql", tmp_path) as conn:
        row = conn.execute("SELECT id FROM jobs.define('d', 'k', schedule => '* * * * *')").fetchone()
        assert row is not None
        conn.execute(
            "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for, occurrence_at)"
            " VALUES (%(d)s, 'k', 'schedule', '2030-01-01 00:10Z', '2030-01-01 00:00Z'),"
            "        (%(d)s, 'k', 'schedule', '2030-01-01 00:20Z', '2030-01-01 00:00Z')",
            {"d": row[0]},
        )
        named = f"definition {row[0]}, occurrence 2030-01-01"
        with pytest.raises(psycopg.errors.UniqueViolation, match=named):
            migrate.apply(conn)
        said = pgtick("migrate", "--dsn", conn.info.dsn)
        assert said.returncode == 1, f"a failed migration is a failure, not a usage error: {said}"
        lines = said.stderr.splitlines()
        assert len(lines) == 1 and named in lines[0] and "Delete the one" in lines[0], said
        assert "run pgtick migrate" not in said.stderr, said
        assert "0019" not in migrate.applied_versions(conn)
        index = conn.execute("SELECT pg_get_indexdef('jobs.runs_occurrence_uniq'::regclass)").fetchone()
        assert index is not None and "coalesce" not in index[0], f"the index changed anyway: {index}"
        conn.execute("DELETE FROM jobs.runs WHERE scheduled_for = '2030-01-01 00:20Z'")
        migrate.apply(conn)
        assert "0019" in migrate.applied_versions(conn)


def test_the_history_keys_migration_keeps_the_keys_of_runs_moved_before_it(
    pg: Server, tmp_path: Path
) -> None:
    """Runs with an idempotency key and a unique key kept 'ever', moved to history before the
    keys had a table of their own: after the upgrade, enqueuing those keys again still returns
    the moved runs."""
    with _installed_before(pg, "0024_history_keys.sql", tmp_path) as conn:
        moved = [
            int(r[0])
            for r in conn.execute(
                "INSERT INTO jobs.runs (kind, status, started_at, finished_at, idempotency_key,"
                " unique_key) SELECT 'k', 'COMPLETED', now() - d * interval '1 day',"
                " now() - d * interval '1 day', i, u"
                " FROM (VALUES (3, 'i', NULL), (4, NULL, 'u')) AS v (d, i, u) RETURNING id"
            )
        ]
        assert conn.execute("SELECT jobs.archive()").fetchone() == (2,)
        migrate.apply(conn)
        again = [
            conn.execute("SELECT id FROM jobs.enqueue('k', idempotency_key => 'i')").fetchone(),
            conn.execute(
                "SELECT id FROM jobs.enqueue('k', unique_key => 'u', unique_while => 'ever')"
            ).fetchone(),
        ]
        assert again == [(moved[0],), (moved[1],)], f"enqueued again: {again}, the moved runs: {moved}"
        assert conn.execute("SELECT count(*) FROM jobs.runs").fetchone() == (0,), "no new run"


def test_the_blank_keys_migration_keeps_blank_keys_written_before_it(pg: Server, tmp_path: Path) -> None:
    """Blank keys written directly before the columns refused them (a queued run with all three,
    a definition's concurrency key) do not fail the upgrade and stay as they were. Such a run is
    still claimed and failed, and its retry by policy keeps its keys (copied, not written
    anew); the definition can still be changed (a table CHECK would refuse every UPDATE of its
    row); a new blank key is refused (23514 naming the constraint)."""
    with _installed_before(pg, "0026_blank_keys.sql", tmp_path) as conn:
        conn.execute("SELECT jobs.define('d', 'k', run_at => now() + interval '1 day')")
        conn.execute("UPDATE jobs.definitions SET concurrency_key = ' ' WHERE name = 'd'")
        conn.execute(
            "SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)"
        )
        row = conn.execute(
            "INSERT INTO jobs.runs (kind, idempotency_key, unique_key, concurrency_key)"
            " VALUES ('k', '  ', chr(9), U&'\\3000') RETURNING id"
        ).fetchone()
        assert row is not None
        migrate.apply(conn)
        assert "0026" in migrate.applied_versions(conn)
        kept = conn.execute(
            "SELECT r.idempotency_key, r.unique_key, r.concurrency_key, d.concurrency_key"
            " FROM jobs.runs AS r, jobs.definitions AS d WHERE r.id = %s AND d.name = 'd'",
            (row[0],),
        ).fetchone()
        assert kept == ("  ", "\t", "\u3000", " "), f"the blank keys changed: {kept!r}"
        claimed = conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall()
        assert claimed == [(row[0],)], f"claimed {claimed}, expected the run {row[0]}"
        retry = conn.execute(
            "SELECT status::text, unique_key, concurrency_key FROM jobs.fail(%s, 'w1', '{E}', 'once')",
            (row[0],),
        ).fetchone()
        assert retry == ("QUEUED", "\t", "\u3000"), f"failing the run with blank keys: {retry!r}"
        conn.execute("UPDATE jobs.definitions SET enabled = FALSE WHERE name = 'd'")
        with pytest.raises(psycopg.errors.CheckViolation, match="runs_idempotency_key_not_blank"):
            conn.execute("INSERT INTO jobs.runs (kind, idempotency_key) VALUES ('k', '  ')")
        with pytest.raises(psycopg.errors.CheckViolation, match="definitions_concurrency_key_not_blank"):
            conn.execute("UPDATE jobs.definitions SET concurrency_key = '  ' WHERE name = 'd'")


def test_a_definition_with_a_blank_key_from_before_stops_no_other_definitions_runs(
    pg: Server, tmp_path: Path
) -> None:
    """A definition whose concurrency key was blank before the upgrade cannot have runs (the
    runs' key refuses it), but that stays with it: the one-shots due with it are still
    materialized, it records why (materialize_error naming concurrency_key), and a backfill of
    it is voided with that reason while the next backfill goes on; jobs.run_now of it is
    refused naming concurrency_key (22023), not by the runs' bare constraint; and the recurring
    one is recorded by jobs.materialize_many, naming it, while the other is materialized."""
    with _installed_before(pg, "0026_blank_keys.sql", tmp_path) as conn:
        conn.execute("SELECT jobs.define('blank', 'k', run_at => now() + interval '1 day')")
        conn.execute("SELECT jobs.define('fine', 'k', run_at => now() + interval '1 day')")
        conn.execute("SELECT jobs.define('every', 'k', schedule => '0 * * * *')")
        conn.execute("SELECT jobs.define('every_blank', 'k', schedule => '0 * * * *')")
        conn.execute(
            "UPDATE jobs.definitions SET concurrency_key = '  ' WHERE name IN ('blank', 'every_blank')"
        )
        migrate.apply(conn)
        conn.execute(
            "UPDATE jobs.definitions SET next_run_at = now() - interval '1 second' WHERE schedule IS NULL"
        )
        made = conn.execute("SELECT jobs.materialize_one_shots()").fetchone()
        assert made == (1,), f"the one-shot with a real key was not materialized: {made}"
        runs = conn.execute(
            "SELECT d.name FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id"
        ).fetchall()
        assert runs == [("fine",)], runs
        error = conn.execute(
            "SELECT materialize_error, materialize_failures, finished_at IS NULL"
            " FROM jobs.definitions WHERE name = 'blank'"
        ).fetchone()
        assert error is not None and "concurrency_key" in (error[0] or "") and error[1:] == (1, True), error
        window = "now() - interval '3 hours', now() - interval '1 hour'"
        conn.execute(f"SELECT jobs.backfill('every_blank', {window})")
        conn.execute(f"SELECT jobs.backfill('every', {window})")
        done = conn.execute(
            "SELECT d.name, jobs.finish_backfill(b.id, ARRAY[date_trunc('hour', now()) - interval '2 hours'])"
            " FROM jobs.backfills AS b JOIN jobs.definitions AS d ON d.id = b.definition_id ORDER BY b.id"
        ).fetchall()
        assert done == [("every_blank", 0), ("every", 1)], f"runs inserted by the two backfills: {done}"
        voided = conn.execute(
            "SELECT b.done_at IS NOT NULL, b.error FROM jobs.backfills AS b"
            " JOIN jobs.definitions AS d ON d.id = b.definition_id WHERE d.name = 'every_blank'"
        ).fetchone()
        assert voided is not None and voided[0] and "concurrency_key" in (voided[1] or ""), voided
        with pytest.raises(
            psycopg.errors.InvalidParameterValue, match="'every_blank': concurrency_key must not"
        ):
            conn.execute("SELECT jobs.run_now('every_blank')")
        conn.execute(
            "UPDATE jobs.definitions SET next_run_at = date_trunc('minute', now()) + interval '1 minute'"
            " WHERE schedule IS NOT NULL"
        )
        made = conn.execute(
            "WITH d AS (SELECT array_agg(id ORDER BY id) AS ids, array_agg(next_run_at ORDER BY id) AS at,"
            "                  array_agg(revision ORDER BY id) AS revisions"
            "             FROM jobs.definitions WHERE schedule IS NOT NULL)"
            " SELECT f.name, m.created, m.error FROM d, jobs.materialize_many(d.ids, d.at,"
            "        array(SELECT a + interval '1 minute' FROM unnest(d.at) AS a),"
            "        d.revisions, d.ids, d.at) AS m"
            " JOIN jobs.definitions AS f ON f.id = m.definition_id ORDER BY f.name"
        ).fetchall()
        assert [(name, created) for name, created, _ in made] == [("every", 1), ("every_blank", 0)], made
        assert "concurrency_key must not be blank" in (made[1][2] or ""), made


def test_failed_migration_leaves_nothing_half_applied(empty: Database, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(migrate.schema_root() / "sql", root / "sql")
    shutil.copytree(migrate.schema_root() / "migrations", root / "migrations")
    (root / "migrations" / "9999_broken.sql").write_text(
        "CREATE TABLE jobs.half_applied (id int);\nSELECT no_such_function();\n"
    )
    add_migration_line(root, "9999_broken")
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction) as caught:
            migrate.apply(conn, root)
        # Where it stopped, as `pgtick migrate` says it: the file and the statement's line.
        assert caught.value.__notes__ == ["in migrations/9999_broken.sql, line 2"], caught.value.__notes__
        assert conn.execute("SELECT to_regclass('jobs.half_applied')").fetchone() == (None,)
        versions = migrate.applied_versions(conn)
    assert "9999" not in versions
    assert versions == {m.version for m in migrate.migrations()}


def test_a_migrator_stopped_before_the_functions_leaves_a_ledger_that_says_to_migrate(
    empty: Database, tmp_path: Path
) -> None:
    """The last migration commits with the functions: a migrator that stops between them
    (here a function file that fails, as an interrupt or a lost connection would stop it)
    leaves a migration unrecorded, which `pgtick run` refuses to start on, rather than a
    complete ledger over a schema without its functions."""
    root = tmp_path / "root"
    shutil.copytree(migrate.schema_root() / "sql", root / "sql")
    shutil.copytree(migrate.schema_root() / "migrations", root / "migrations")
    roles = root / "sql" / "roles.sql"
    roles.write_text(roles.read_text() + "\nSELECT no_such_function();\n")
    broken_line = len(roles.read_text().splitlines())
    last = migrate.migrations()[-1]
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction) as caught:
            migrate.apply(conn, root)
        assert caught.value.__notes__ == [f"in sql/roles.sql, line {broken_line}"], caught.value.__notes__
        assert last.version not in migrate.applied_versions(conn)
        assert conn.execute(
            "SELECT to_regprocedure('jobs.claim(integer, text, text[], boolean, text[], text)')"
        ).fetchone() == (None,)
        with pytest.raises(SchemaMismatch, match=f"lacks migration {last.version}_{last.name}"):
            migrate.check_schema(conn)
        assert migrate.apply(conn) == [last.version]
        assert migrate.check_schema(conn) is None


def schema_copy(tmp_path: Path) -> Path:
    """A copy of sql/ and migrations/ to break on purpose; returns its root."""
    root = tmp_path / "root"
    shutil.copytree(migrate.schema_root() / "sql", root / "sql")
    shutil.copytree(migrate.schema_root() / "migrations", root / "migrations")
    return root


def psql_script(root: Path, tmp_path: Path, path: str) -> Path:
    """The install psql runs: the root's sql/install.sql, or the script `pgtick migrate --sql`
    prints from it."""
    if path == "psql":
        return root / "sql" / "install.sql"
    script = tmp_path / "install.sql"
    script.write_text(migrate.install_script(root))
    return script


def jobs_schema(dsn: str) -> tuple[str | None, set[str]]:
    """The jobs schema (NULL when there is none) and the versions its ledger records."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = scalar(conn, "SELECT to_regnamespace('jobs')::text")
        return schema, migrate.applied_versions(conn) if schema else set()


@pytest.mark.parametrize("path", ["psql", "generated script"])
@pytest.mark.parametrize("broken", ["0015_history.sql", "roles.sql"])
def test_a_psql_install_that_fails_midway_leaves_no_jobs_schema_and_a_rerun_installs_it(
    empty: Database, tmp_path: Path, path: str, broken: str
) -> None:
    """The psql install (sql/install.sql, `pgtick migrate --sql`) is one transaction: one that
    fails anywhere (here in a migration half way through, or in the last function file) leaves
    no jobs schema, no ledger and no migration of it, not a half-installed schema; run again,
    it installs the whole schema."""
    root = schema_copy(tmp_path)
    target = root / ("migrations" if broken[0].isdigit() else "sql") / broken
    target.write_text(target.read_text() + "\nSELECT no_such_function();\n")
    result = psql_file(empty.dsn, psql_script(root, tmp_path, path))
    assert result.returncode != 0 and "no_such_function" in result.stderr, result.stderr
    assert jobs_schema(empty.dsn) == (None, set()), "a failed psql install left a jobs schema behind"
    installed = psql_file(empty.dsn, migrate.schema_root() / "sql" / "install.sql")
    assert installed.returncode == 0, installed.stderr
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        assert migrate.check_schema(conn) is None


@pytest.mark.parametrize("path", ["psql", "generated script"])
def test_a_psql_upgrade_that_fails_midway_leaves_the_previous_schema_whole(
    empty: Database, tmp_path: Path, path: str
) -> None:
    """An upgrade through psql of two migrations that fails after both applied (here in the
    last function file) leaves the schema as the previous install left it: neither migration
    applied nor recorded, the previous functions in place; not the first of them committed."""
    assert psql_file(empty.dsn, migrate.schema_root() / "sql" / "install.sql").returncode == 0
    root = schema_copy(tmp_path)
    (root / "migrations" / "9998_next.sql").write_text("CREATE TABLE jobs.half_applied (id int);\n")
    add_migration_line(root, "9998_next")
    (root / "migrations" / "9999_last.sql").write_text("CREATE TABLE jobs.half_applied_too (id int);\n")
    add_migration_line(root, "9999_last")
    console = root / "sql" / "console.sql"
    text = console.read_text().replace("'Worker: record (or refresh) this worker,", "'Changed: ", 1)
    console.write_text(text)
    roles = root / "sql" / "roles.sql"
    roles.write_text(roles.read_text() + "\nSELECT no_such_function();\n")
    result = psql_file(empty.dsn, psql_script(root, tmp_path, path))
    assert result.returncode != 0 and "no_such_function" in result.stderr, result.stderr
    assert jobs_schema(empty.dsn) == ("jobs", {m.version for m in migrate.migrations()})
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        assert scalar(conn, "SELECT to_regclass('jobs.half_applied')") is None
        assert scalar(conn, "SELECT to_regclass('jobs.half_applied_too')") is None
        registration = "jobs.register_worker(text, text[], text, integer, text[])"
        comment = f"SELECT obj_description('{registration}'::regprocedure)"
        assert str(scalar(conn, comment)).startswith("Worker: record"), "a failed upgrade replaced a function"
        assert migrate.check_schema(conn) is None


def test_a_psql_install_stopped_with_ctrl_c_leaves_no_jobs_schema(empty: Database, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to psql) half way through the install: psql cancels the statement in
    flight and stops; the install's one transaction rolls back, so no jobs schema is left."""
    root = schema_copy(tmp_path)
    target = root / "migrations" / "0015_history.sql"
    target.write_text(target.read_text() + "\nSELECT pg_sleep(600);\n")
    psql = subprocess.Popen(
        psql_script_args(empty.dsn, root / "sql" / "install.sql"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with psycopg.connect(empty.dsn, autocommit=True) as conn:
            wait_for(
                "psql to reach the injected pause",
                lambda: (
                    scalar(
                        conn,
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(600)%%'",
                    )
                    or psql.poll() is not None
                ),
                timeout=180,
            )
        assert psql.poll() is None, psql.communicate()
        psql.send_signal(signal.SIGINT)
        _, err = psql.communicate(timeout=120)
    finally:
        if psql.poll() is None:
            psql.kill()
            psql.wait()
    assert psql.returncode != 0 and "canceling statement" in err, err
    assert jobs_schema(empty.dsn) == (None, set()), "an install stopped with Ctrl-C left a jobs schema behind"
    installed = psql_file(empty.dsn, migrate.schema_root() / "sql" / "install.sql")
    assert installed.returncode == 0, installed.stderr
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        assert migrate.check_schema(conn) is None


def test_a_schema_a_newer_pgtick_migrated_keeps_its_functions(db: Database, tmp_path: Path) -> None:
    """An older pgtick's migrate (driver, generated script, psql) refuses a schema whose
    ledger holds a migration it does not know, and leaves that pgtick's functions as they are."""
    marker = "COMMENT ON FUNCTION jobs.next_due(text[], text[]) IS 'as a newer pgtick wrote it'"
    read = "SELECT obj_description('jobs.next_due(text[], text[])'::regprocedure)"
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO jobs.schema_migrations (version, name) VALUES ('9999', 'from_the_future')")
        conn.execute(marker)
        with pytest.raises(SchemaMismatch, match=r"does not know \(9999\).*nothing was applied"):
            migrate.apply(conn)
        assert conn.execute(read).fetchone() == ("as a newer pgtick wrote it",)
    script = tmp_path / "install.sql"
    script.write_text(migrate.install_script())
    for path in (script, migrate.schema_root() / "sql" / "install.sql"):
        result = psql_file(db.dsn, path)
        assert result.returncode != 0 and "a newer pgtick migrated it" in result.stderr, result.stderr
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            assert conn.execute(read).fetchone() == ("as a newer pgtick wrote it",), path


def test_every_jobs_object_is_documented(db: Database) -> None:
    """STYLE: every table, column, view and function in jobs carries a COMMENT."""
    with db.connect() as conn:
        missing = conn.execute(
            """
            SELECT 'table ' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'jobs' AND c.relkind IN ('r', 'v', 'p')
               AND obj_description(c.oid, 'pg_class') IS NULL
            UNION ALL
            SELECT 'column ' || c.relname || '.' || a.attname
              FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'jobs' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
               AND a.attnum > 0 AND NOT a.attisdropped
               AND col_description(c.oid, a.attnum) IS NULL
            UNION ALL
            SELECT 'function ' || p.oid::regprocedure FROM pg_proc p
              JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'jobs' AND obj_description(p.oid, 'pg_proc') IS NULL
            """
        ).fetchall()
    assert missing == [], f"undocumented objects: {missing}"


#: Functions another role puts in public that a migration calling format() unqualified would
#: pick over pg_catalog.format(text, VARIADIC "any") (an exact match wins): each marks the
#: session it runs in.
SHADOWS = """
CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM set_config('pgtick_test.hijacked', 'yes', false); RETURN pg_catalog.format($1, $2); END $$;
CREATE FUNCTION public.format(text, text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM set_config('pgtick_test.hijacked', 'yes', false); RETURN pg_catalog.format($1, $2, $3); END $$;
CREATE FUNCTION public.format(text, regclass) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM set_config('pgtick_test.hijacked', 'yes', false); RETURN pg_catalog.format($1, $2); END $$;
"""


@pytest.mark.parametrize("path", ["driver", "psql"])
def test_installing_runs_no_function_of_the_callers_search_path(
    empty: Database, tmp_path: Path, path: str
) -> None:
    """A migration calls built-ins unqualified; with the caller's search path (public first for
    an unqualified name that matches exactly), a function another role created in public would
    run with the installer's rights. The install searches only pg_catalog, and gives the
    caller's search path back."""
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        conn.execute(SHADOWS)
        conn.execute("SET search_path = public, pg_catalog")
        if path == "driver":
            migrate.apply(conn)
        else:
            script = tmp_path / "install.sql"
            script.write_text(
                "SET search_path = public, pg_catalog;\n"
                + migrate.install_script()
                + "SELECT 'hijacked=' || coalesce(current_setting('pgtick_test.hijacked', true), '');\n"
                + "SELECT 'search_path=' || current_setting('search_path');\n"
            )
            done = subprocess.run(
                [*psql_script_args(empty.dsn, script), "-A", "-t"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
            assert "hijacked=\n" in done.stdout + "\n", done.stdout[-500:]
            assert "search_path=public, pg_catalog" in done.stdout, done.stdout[-500:]
            return
        marked = conn.execute("SELECT current_setting('pgtick_test.hijacked', true)").fetchone()
        restored = conn.execute("SHOW search_path").fetchone()
    assert marked in ((None,), ("",)), (
        f"a function of the caller's search path ran during the install: {marked}"
    )
    assert restored == ("public, pg_catalog",)


def test_a_jobs_schema_that_is_not_pgticks_is_left_alone(empty: Database) -> None:
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA jobs")
        conn.execute("CREATE FUNCTION jobs.count_orders() RETURNS integer LANGUAGE sql AS 'SELECT 1'")
        conn.execute("GRANT EXECUTE ON FUNCTION jobs.count_orders() TO PUBLIC")
        with pytest.raises(psycopg.errors.DuplicateSchema, match="not pgtick's"):
            migrate.apply(conn)
        row = conn.execute(
            "SELECT p.proconfig, has_function_privilege('public', p.oid, 'EXECUTE')"
            " FROM pg_proc AS p WHERE p.proname = 'count_orders'"
        ).fetchone()
        tables = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'jobs'::regnamespace"
        ).fetchone()
    assert row == (None, True), f"the user's function was changed: {row}"
    assert tables == (0,)


def test_an_installer_that_may_not_grant_the_roles_stops_before_anything_is_installed(
    pg: Server, empty: Database
) -> None:
    """A database owner without the right to grant jobs_reader and jobs_worker (PostgreSQL 16:
    ADMIN OPTION on them; 15: CREATEROLE) is refused in the bootstrap: no schema, no table,
    so nothing is left half installed for the next attempt to trip on."""
    owner = f"pgtick_owner_{os.getpid()}"
    with pg.admin() as admin:
        admin.execute(f'DROP ROLE IF EXISTS "{owner}"')
        admin.execute(f'CREATE ROLE "{owner}" LOGIN')
        admin.execute(f'ALTER DATABASE "{empty.name}" OWNER TO "{owner}"')
    try:
        with psycopg.connect(dsn_for(pg.admin_dsn, empty.name, user=owner), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                migrate.apply(conn)
        with psycopg.connect(empty.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT to_regnamespace('jobs')").fetchone() == (None,)
    finally:
        with pg.admin() as admin:
            admin.execute(f'ALTER DATABASE "{empty.name}" OWNER TO CURRENT_USER')
            admin.execute(f'DROP ROLE IF EXISTS "{owner}"')


def test_an_install_that_fails_in_a_sql_ascii_database_raises_its_own_error_and_gives_the_search_path_back(
    pg: Server,
) -> None:
    """psycopg reads a SQL_ASCII database's text as bytes: the caller's search path, read so at
    the start, must still be set back at the end, and not fail there in place of the install's
    own error."""
    with _encoded_database(pg, "SQL_ASCII") as database:
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            conn.execute("SET search_path = public, pg_catalog")
            with pytest.raises(psycopg.Error) as raised:
                migrate.apply(conn)
            assert "set_config" not in str(raised.value), f"the install's error was lost: {raised.value}"
            assert conn.execute("SHOW search_path").fetchone() == (b"public, pg_catalog",)


@pytest.mark.parametrize("path", ["driver", "psql", "generated script"])
def test_a_database_whose_defaults_change_how_sql_is_read_gets_the_same_schema(
    pg: Server, empty2: Database, tmp_path: Path, path: str
) -> None:
    """A database whose default is standard_conforming_strings off (a migration's '\\m' read as
    'm', U&'' literals refused) and quote_all_identifiers on (a migration reads constraint
    definitions back from the catalog): the install runs under settings of its own, installs
    what a database with the defaults gets, and gives the session its settings back."""
    database = pg.create_empty_database()
    try:
        with pg.admin() as admin:
            admin.execute(f'ALTER DATABASE "{database.name}" SET standard_conforming_strings = off')
            admin.execute(f'ALTER DATABASE "{database.name}" SET quote_all_identifiers = on')
        shown = (
            "SELECT current_setting('standard_conforming_strings'), current_setting('quote_all_identifiers')"
        )
        if path == "driver":
            with psycopg.connect(database.dsn, autocommit=True) as conn:
                migrate.apply(conn)
                after = "|".join(conn.execute(shown).fetchone() or ())
        else:
            script = migrate.schema_root() / "sql" / "install.sql"
            if path == "generated script":
                script = tmp_path / "install.sql"
                script.write_text(migrate.install_script())
            done = subprocess.run(
                [*psql_script_args(database.dsn, script), "-A", "-t", "-c", shown],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
            after = done.stdout.strip().splitlines()[-1]
        migrate_dsn(empty2.dsn)
        assert snapshot(database.dsn) == snapshot(empty2.dsn)
        assert after == "off|on", "the session's own settings were not given back"
    finally:
        pg.drop_database(database)


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII"])
@pytest.mark.parametrize("path", ["driver", "psql"])
def test_a_database_not_in_utf8_is_refused_before_anything_is_installed(
    pg: Server, encoding: str, path: str
) -> None:
    """The functions spell characters LATIN1 lacks, and SQL_ASCII neither checks nor converts
    text: the install says the database must be UTF8 and leaves nothing behind, where it had
    applied every migration but the last before failing on a function."""
    with _encoded_database(pg, encoding) as database:
        if path == "driver":
            with psycopg.connect(database.dsn, autocommit=True) as conn:
                with pytest.raises(psycopg.Error) as raised:
                    migrate.apply(conn)
            error = str(raised.value)
        else:
            result = psql_file(database.dsn, migrate.schema_root() / "sql" / "install.sql")
            assert result.returncode != 0, result.stdout
            error = result.stderr
        assert f"the database encoding is {encoding}: pgtick needs a UTF8 database" in error, error
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT to_regnamespace('jobs') IS NULL").fetchone() == (True,)


@pytest.mark.parametrize(
    ("ledger", "row"),
    [
        ("version bigint PRIMARY KEY, dirty boolean NOT NULL", "(20240101120000, false)"),  # golang-migrate
        ("version varchar PRIMARY KEY", "('20240101120000')"),  # Rails
    ],
)
@pytest.mark.parametrize("path", ["driver", "psql"])
def test_a_jobs_schema_with_another_tools_migration_ledger_is_left_alone(
    empty: Database, ledger: str, row: str, path: str
) -> None:
    """A jobs schema another application migrates with a tool that keeps its ledger in
    jobs.schema_migrations: it is not pgtick's, and the install says so before it comments on
    the schema and the table as its own (or fails on a column the table lacks)."""
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA jobs")
        conn.execute("COMMENT ON SCHEMA jobs IS 'the orders service'")
        conn.execute(f"CREATE TABLE jobs.schema_migrations ({ledger})")
        conn.execute(f"INSERT INTO jobs.schema_migrations VALUES {row}")
        if path == "driver":
            with pytest.raises(psycopg.errors.DuplicateSchema) as raised:
                migrate.apply(conn)
            error = str(raised.value)
        else:
            result = psql_file(empty.dsn, migrate.schema_root() / "sql" / "install.sql")
            assert result.returncode != 0, result.stdout
            error = result.stderr
        assert "schema_migrations that is not pgtick's ledger" in error, error
        left = conn.execute(
            "SELECT obj_description('jobs'::regnamespace, 'pg_namespace'),"
            " obj_description('jobs.schema_migrations'::regclass, 'pg_class'),"
            " (SELECT count(*) FROM pg_class WHERE relnamespace = 'jobs'::regnamespace)"
        ).fetchone()
    assert left == ("the orders service", None, 2), f"the schema was changed: {left}"


def test_a_migration_step_chosen_to_end_a_deadlock_is_rolled_back_and_tried_again(empty: Database) -> None:
    """A step of the migration that the server ends to break a deadlock (a claim in progress
    reading a view the step re-creates, on a server whose deadlock_timeout is below the
    migration's lock wait) is rolled back whole and tried again, as a step that gave up waiting
    for a lock is: the migration does not stop half done on it. Here the step takes table a,
    then waits for b, which another session holds while it waits for a."""
    with psycopg.connect(empty.dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE a (x int); CREATE TABLE b (x int)")
    tries: list[str] = []
    other_has_b = threading.Event()
    other_done = threading.Event()

    def other() -> None:
        with psycopg.connect(empty.dsn, application_name="other") as own:
            own.execute("SET deadlock_timeout = '60s'")  # the step is the one to find the cycle
            own.execute("LOCK TABLE b")
            other_has_b.set()
            wait_for("the step to hold a", lambda: len(tries) >= 1, 60)
            own.execute("LOCK TABLE a")  # a cycle: the step, which holds a, waits for b
            own.commit()
        other_done.set()

    def step() -> None:
        conn.execute("SET LOCAL deadlock_timeout = '50ms'")
        conn.execute("SET LOCAL lock_timeout = '30s'")  # the deadlock, not the wait, ends it
        conn.execute("LOCK TABLE a")
        tries.append("a")
        if len(tries) == 1:
            with psycopg.connect(empty.dsn, autocommit=True) as watch:
                wait_for(
                    "the other session to wait for a",
                    lambda: (
                        scalar(
                            watch,
                            "SELECT count(*) FROM pg_stat_activity"
                            " WHERE application_name = 'other' AND wait_event_type = 'Lock'",
                        )
                        == 1
                    ),
                    60,
                )
        conn.execute("LOCK TABLE b")
        conn.execute("INSERT INTO b VALUES (1)")

    thread = threading.Thread(target=other, daemon=True)
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        thread.start()
        assert other_has_b.wait(60)
        migrate._retrying_on_locks(conn, "a step", step)
        thread.join(60)
        assert other_done.is_set(), "the other session did not finish"
        assert len(tries) == 2, f"expected one deadlock and one retry, the step ran {len(tries)} times"
        assert scalar(conn, "SELECT count(*) FROM b") == 1


def test_a_migration_held_up_by_slow_readers_of_a_view_waits_longer_each_try_and_names_them(
    empty: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Two sessions take turns reading a view the install re-creates, each statement two seconds
    long and starting a second after the other's: whenever the migration asks for the view, one
    of them holds it for a second more at least. A migration that waited half a second each try
    would never commit; each try waits twice as long as the one before (up to 5 s here: the
    heartbeat timeout is a minute), so it commits, and its warning names the readers."""
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        migrate.apply(conn)
        stop = threading.Event()

        def read(offset: float) -> None:
            with psycopg.connect(empty.dsn, autocommit=True, application_name="slow-reader") as own:
                stop.wait(offset)
                while not stop.is_set():
                    own.execute("SELECT pg_sleep(2), (SELECT count(*) FROM jobs.queue_stats)")

        readers = [threading.Thread(target=read, args=(offset,), daemon=True) for offset in (0.0, 1.0)]
        for reader in readers:
            reader.start()
        reading = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slow-reader'"
            " AND state = 'active' AND datname = current_database()"
        )
        wait_for("both readers to read", lambda: scalar(conn, reading) == 2, 60)
        outcome: list[object] = []

        def migrating() -> None:
            try:
                outcome.append(migrate.apply(conn))
            except Exception as exc:  # the test says what it was
                outcome.append(exc)

        with caplog.at_level("WARNING", logger="pgtick.migrate"):
            thread = threading.Thread(target=migrating, daemon=True)
            thread.start()
            thread.join(90)
            finished = not thread.is_alive()
            stop.set()
            thread.join(60)
            for reader in readers:
                reader.join(60)
    assert finished, f"the migration did not commit within 90 s beside the readers: {caplog.text}"
    assert outcome == [[]], outcome
    assert "the functions and views waits for a lock" in caplog.text, caplog.text
    assert "slow-reader" in caplog.text, caplog.text


def test_a_migration_waits_at_most_a_quarter_of_the_shortest_heartbeat_timeout(empty: Database) -> None:
    """The longest wait of a held-up migration: 5 s before the schema exists and under the
    default minute; a quarter of the server's heartbeat timeout when that is shorter, or of a
    queued run's own shorter one (a heartbeat queued behind the wait must still arrive in time);
    never under half a second."""
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        assert migrate._longest_lock_wait(conn) == migrate.LOCK_WAIT_MAX == 5.0
        migrate.apply(conn)
        assert migrate._longest_lock_wait(conn) == 5.0
        conn.execute("UPDATE jobs.config SET heartbeat_timeout = '8 seconds'")
        assert migrate._longest_lock_wait(conn) == 2.0
        run_id = enqueue(conn, "k", heartbeat_timeout="'4 seconds'")
        assert migrate._longest_lock_wait(conn) == 1.0
        conn.execute("SELECT jobs.cancel(%s)", (run_id,))
        assert migrate._longest_lock_wait(conn) == 2.0
        enqueue(conn, "k", heartbeat_timeout="'1 second'")
        assert migrate._longest_lock_wait(conn) == migrate.LOCK_WAIT == 0.5


def test_the_rate_period_bound_keeps_the_rate_of_a_shorter_period_written_before_it(
    pg: Server, tmp_path: Path
) -> None:
    """Limits stored with a period under a second before the table refused them: the upgrade
    gives each a second's period and the starts its rate allows in one (rounded up, at most
    1,000,000), leaves longer periods and limits without a rate alone, and the bound holds."""
    with _installed_before(pg, "0029_rate_period_bound.sql", tmp_path) as conn:
        conn.execute(
            "INSERT INTO jobs.limits (scope, name, max_running, rate_limit, rate_period) VALUES"
            " ('kind', 'ten-per-100ms', NULL, 10, '100 milliseconds'),"
            " ('kind', 'three-per-700ms', NULL, 3, '700 milliseconds'),"
            " ('kind', 'three-per-300ms', NULL, 3, '300 milliseconds'),"
            " ('kind', 'flood', NULL, 1000000, '1 millisecond'),"
            " ('queue', 'hourly', 5, 100, '1 hour'),"
            " ('queue', 'running-only', 7, NULL, NULL)"
        )
        migrate.apply(conn)
        assert "0029" in migrate.applied_versions(conn)
        stored = conn.execute(
            "SELECT name, max_running, rate_limit, rate_period::text FROM jobs.limits ORDER BY name"
        ).fetchall()
        assert stored == [
            ("flood", None, 1000000, "00:00:01"),
            ("hourly", 5, 100, "01:00:00"),
            ("running-only", 7, None, None),
            ("ten-per-100ms", None, 100, "00:00:01"),
            ("three-per-300ms", None, 10, "00:00:01"),
            ("three-per-700ms", None, 5, "00:00:01"),
        ], stored
        with pytest.raises(psycopg.errors.CheckViolation, match="limits_rate_period_check"):
            conn.execute("UPDATE jobs.limits SET rate_period = '0.5 seconds' WHERE name = 'hourly'")


def test_the_elapsed_rate_period_rule_keeps_the_length_of_a_period_in_days_written_before_it(
    pg: Server, tmp_path: Path
) -> None:
    """Limits stored with a period that has a day field before the table refused one: the
    upgrade keeps each period's length as hours (a day as 24:00:00) and leaves the others
    alone; afterwards a period with a day field is refused by the table (23514, naming the
    rule) and jobs.set_limit stores one given in days as hours."""
    with _installed_before(pg, "0030_rate_period_elapsed.sql", tmp_path) as conn:
        conn.execute(
            "INSERT INTO jobs.limits (scope, name, max_running, rate_limit, rate_period) VALUES"
            " ('kind', 'daily', NULL, 10, '1 day'),"
            " ('kind', 'day-less-an-hour', NULL, 3, '1 day -1 hour'),"
            " ('queue', 'hourly', 5, 100, '1 hour'),"
            " ('queue', 'running-only', 7, NULL, NULL)"
        )
        migrate.apply(conn)
        assert "0030" in migrate.applied_versions(conn)
        stored = conn.execute(
            "SELECT name, max_running, rate_limit, rate_period::text FROM jobs.limits ORDER BY name"
        ).fetchall()
        assert stored == [
            ("daily", None, 10, "24:00:00"),
            ("day-less-an-hour", None, 3, "23:00:00"),
            ("hourly", 5, 100, "01:00:00"),
            ("running-only", 7, None, None),
        ], stored
        with pytest.raises(psycopg.errors.CheckViolation, match="limits_rate_period_elapsed"):
            conn.execute("UPDATE jobs.limits SET rate_period = '1 day' WHERE name = 'hourly'")
        row = conn.execute(
            "SELECT rate_period::text FROM jobs.set_limit('queue', 'hourly', max_running => 5,"
            " rate_limit => 100, rate_period => '1 day')"
        ).fetchone()
        assert row == ("24:00:00",), row


def test_durations_stored_with_mixed_signs_before_the_rule_become_the_one_sign_value_they_compared_as(
    pg: Server, tmp_path: Path
) -> None:
    """A retention, a definition's timeout and a retry policy's backoff stored as '1 mon -1 day'
    (and the like) before such values were refused: the upgrade stores each as the one-sign
    interval it compared as, leaves the others alone, and the leader's prune of the configured
    retention runs instead of being refused every hour."""
    with _installed_before(pg, "0032_one_sign_durations.sql", tmp_path) as conn:
        conn.execute("SELECT jobs.define('mixed', 'k', schedule => '* * * * *')")
        conn.execute("SELECT jobs.define('plain', 'k', schedule => '* * * * *', timeout => '1 day 2 hours')")
        conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 2)")
        # Written past the checks of today's functions (which the schema before this migration
        # is installed with), as a release before those checks stored them.
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE jobs.config SET archive_after = '2 days -1 hour', retention = '1 mon -1 day'")
        conn.execute("UPDATE jobs.definitions SET timeout = '1 day -2 hours' WHERE name = 'mixed'")
        conn.execute("UPDATE jobs.retry_policies SET backoff_max = '2 hours -30 minutes' WHERE kind = 'k'")
        conn.execute("RESET session_replication_role")
        migrate.apply(conn)
        assert "0032" in migrate.applied_versions(conn)
        config = conn.execute("SELECT archive_after::text, retention::text FROM jobs.config").fetchone()
        assert config == ("1 day 23:00:00", "29 days"), config
        timeouts = conn.execute("SELECT name, timeout::text FROM jobs.definitions ORDER BY name").fetchall()
        assert timeouts == [("mixed", "22:00:00"), ("plain", "1 day 02:00:00")], timeouts
        backoff = conn.execute(
            "SELECT backoff_max::text FROM jobs.retry_policies WHERE kind = 'k'"
        ).fetchone()
        assert backoff == ("01:30:00",), backoff
        assert conn.execute("SELECT jobs.prune()").fetchone() == (0,)


def test_a_backoff_cap_stored_below_the_first_delay_becomes_the_first_delay_and_is_refused_after(
    pg: Server, tmp_path: Path
) -> None:
    """A retry policy and the config row stored with backoff_max below backoff_initial (every
    delay was the cap) before the rule: the upgrade makes the first delay the cap, which gives
    the same delays, leaves sound pairs alone, and from then on the tables refuse such a pair
    however it is written."""
    with _installed_before(pg, "0034_backoff_order.sql", tmp_path) as conn:
        conn.execute("SELECT jobs.set_retry_policy('capped', max_attempts => 3)")
        conn.execute("SELECT jobs.set_retry_policy('sound', max_attempts => 3, backoff_max => '2 hours')")
        # Written past the checks of today's functions, as a release before them stored it.
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE jobs.config SET backoff_initial = '2 hours', backoff_max = '1 minute'")
        conn.execute(
            "UPDATE jobs.retry_policies SET backoff_initial = '3 hours', backoff_max = '5 minutes'"
            " WHERE kind = 'capped'"
        )
        conn.execute("RESET session_replication_role")
        migrate.apply(conn)
        assert "0034" in migrate.applied_versions(conn)
        policies = conn.execute(
            "SELECT kind, backoff_initial::text, backoff_max::text FROM jobs.retry_policies ORDER BY kind"
        ).fetchall()
        assert policies == [("capped", "00:05:00", "00:05:00"), ("sound", "00:00:10", "02:00:00")], policies
        config = conn.execute("SELECT backoff_initial::text, backoff_max::text FROM jobs.config").fetchone()
        assert config == ("00:01:00", "00:01:00"), config
        conn.execute("SET session_replication_role = replica")
        for statement, constraint in (
            (
                "UPDATE jobs.retry_policies SET backoff_initial = '1 day' WHERE kind = 'sound'",
                "retry_policies_backoff_order",
            ),
            ("UPDATE jobs.config SET backoff_max = '1 second'", "config_backoff_order"),
        ):
            with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
                conn.execute(statement)
