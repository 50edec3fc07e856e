"""jobs.version(): the installed schema version and the package version that installed it."""

from __future__ import annotations

from pathlib import Path

import psycopg

from harness import Database, Server, psql_file
from pgtick import __version__, migrate


def _latest() -> tuple[str, str]:
    last = migrate.migrations()[-1]
    return last.version, last.name


def test_version_names_the_latest_migration_and_the_package_that_applied_it(pg: Server) -> None:
    empty = pg.create_empty_database()
    try:
        with psycopg.connect(empty.dsn, autocommit=True) as conn:
            migrate.apply(conn)
            row = conn.execute(
                "SELECT schema_version, migration, package_version FROM jobs.version()"
            ).fetchone()
        assert row == (*_latest(), __version__)
    finally:
        pg.drop_database(empty)


def test_psql_from_the_checkout_records_no_package_and_the_generated_script_records_its_own(
    pg: Server, tmp_path: Path
) -> None:
    script = tmp_path / "install.sql"
    script.write_text(migrate.install_script())
    for source, expected in ((migrate.schema_root() / "sql" / "install.sql", None), (script, __version__)):
        empty = pg.create_empty_database()
        try:
            result = psql_file(empty.dsn, source)
            assert result.returncode == 0, result.stderr
            with psycopg.connect(empty.dsn) as conn:
                row = conn.execute("SELECT schema_version, package_version FROM jobs.version()").fetchone()
            assert row == (_latest()[0], expected), source
        finally:
            pg.drop_database(empty)


def test_a_reader_sees_the_version(db: Database) -> None:
    out = db.psql("SELECT schema_version FROM jobs.version()", user="pgtick_t_reader")
    assert out == _latest()[0]
