"""`pgtick run` on a database whose jobs schema is not the driver's: older (a migration is
missing) is exit 1 with one line saying to run `pgtick migrate`, before any worker or
scheduler starts; newer (migrated by a later release) is a warning, and it runs."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import (
    ROOT,
    Database,
    Server,
    pgtick,
    pgtick_in_foreground,
    psql_file,
    scalar,
    schema_before,
    wait_for,
)
from pgtick import migrate
from pgtick.errors import SchemaMismatch

EXAMPLE = str(ROOT / "examples" / "app.py")


@contextmanager
def installed_before(pg: Server, migration: migrate.Migration, into: Path) -> Iterator[Database]:
    """A database installed with psql from the schema as it was before ``migration``."""
    script = schema_before(migration.path.name, into)
    database = pg.create_empty_database()
    try:
        installed = psql_file(database.dsn, script)
        assert installed.returncode == 0, (
            f"installing the schema before {migration.path.name}: {installed.stderr}"
        )
        yield database
    finally:
        pg.drop_database(database)


@pytest.fixture(scope="module")
def older(pg: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One migration older than the driver's schema."""
    with installed_before(pg, migrate.migrations()[-1], tmp_path_factory.mktemp("older")) as database:
        yield database


@pytest.fixture(scope="module")
def oldest(pg: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """The first release's schema: its first migration only."""
    with installed_before(pg, migrate.migrations()[1], tmp_path_factory.mktemp("oldest")) as database:
        yield database


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower() or "Traceback" in line]


@pytest.mark.parametrize("part", ["--no-scheduler", "--no-worker", "--processes=2"])
def test_run_on_an_older_schema_exits_1_saying_to_migrate(older: Database, part: str) -> None:
    """The worker would call functions the schema lacks and retry them forever; the
    scheduler would warn on every tick. Neither starts: exit 1, one line naming what is
    missing and the command that installs it."""
    latest = migrate.migrations()[-1]
    result = pgtick("run", EXAMPLE, "--dsn", older.dsn, part, timeout=60)
    shown = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert result.returncode == 1, shown
    assert "Traceback" not in result.stderr and "retrying" not in result.stderr, shown
    errors = error_lines(result.stderr)
    assert len(errors) == 1, shown
    assert "run `pgtick migrate`" in errors[0], shown
    assert f"{latest.version}_{latest.name}" in errors[0], shown
    assert "worker=" not in result.stderr, f"a worker started: {shown}"


def test_run_on_the_first_schema_exits_1_saying_to_migrate(oldest: Database) -> None:
    result = pgtick("run", EXAMPLE, "--dsn", oldest.dsn, "--no-scheduler", timeout=60)
    shown = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert result.returncode == 1 and len(error_lines(result.stderr)) == 1, shown
    assert "migrations" in result.stderr and "run `pgtick migrate`" in result.stderr, shown


def test_a_worker_only_login_on_an_older_schema_is_refused_by_the_functions_it_lacks(
    oldest: Database,
) -> None:
    """A worker login may not read the migration ledger: the functions a worker calls are
    what it checks, and the first schema lacks them with this driver's arguments."""
    with oldest.worker_login("oldschema") as login, oldest.connect(user=login) as conn:
        with pytest.raises(SchemaMismatch, match=r"run `pgtick migrate`"):
            migrate.check_schema(conn)


def test_the_current_schema_passes_for_every_login(db: Database) -> None:
    with db.connect() as conn:
        assert migrate.check_schema(conn) is None
    with db.worker_login("current") as login, db.connect(user=login) as conn:
        assert migrate.check_schema(conn) is None


def test_a_schema_newer_than_the_driver_is_a_warning_not_a_refusal(db: Database) -> None:
    """A newer release migrated the database (a rolling upgrade: migrate, then restart the
    processes): this one still runs, and says which migrations it does not know."""
    with db.connect() as conn:
        conn.execute("INSERT INTO jobs.schema_migrations (version, name) VALUES ('9999', 'from_the_future')")
        warning = migrate.check_schema(conn)
    assert warning is not None and "9999" in warning and "upgrade" in warning, warning


@pytest.fixture(scope="module")
def before_history(pg: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """The schema before finished runs moved to jobs.run_history (no jobs.get_run): the
    dashboard's cancel on it answered 500 ``function jobs.get_run(smallint) does not exist``."""
    history = next(m for m in migrate.migrations() if m.name == "history")
    with installed_before(pg, history, tmp_path_factory.mktemp("history")) as database:
        yield database


@pytest.mark.parametrize("schema", ["older", "before_history"])
def test_web_on_an_older_schema_exits_1_saying_to_migrate(
    schema: str, request: pytest.FixtureRequest
) -> None:
    """The dashboard works through the same functions as the driver: on a schema that lacks
    some, its pages and actions would fail one by one (500s). `pgtick web` refuses to start
    as `pgtick run` does: exit 1, one line naming the migration and `pgtick migrate`."""
    database: Database = request.getfixturevalue(schema)
    result = pgtick("web", "--dsn", database.dsn, "--bind", "127.0.0.1:0", timeout=60)
    shown = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert result.returncode == 1, shown
    assert "Traceback" not in result.stderr and "dashboard on" not in result.stderr, shown
    errors = error_lines(result.stderr)
    assert len(errors) == 1, shown
    assert errors[0].startswith("pgtick web: error: the jobs schema is older than pgtick"), shown
    assert "run `pgtick migrate`" in errors[0], shown


def test_run_with_the_dashboard_on_an_older_schema_exits_1_with_one_line(older: Database) -> None:
    """`pgtick run --web` says it once, before its dashboard starts, not a dashboard startup
    traceback beside the run's own error line."""
    result = pgtick("run", EXAMPLE, "--dsn", older.dsn, "--web", "127.0.0.1:0", timeout=60)
    shown = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert result.returncode == 1, shown
    assert "Traceback" not in result.stderr and "dashboard on" not in result.stderr, shown
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "run `pgtick migrate`" in errors[0], shown


@pytest.mark.asyncio
async def test_the_dashboards_app_factory_refuses_an_older_schema(older: Database) -> None:
    """``create_app`` served by another ASGI server fails its startup with the same line."""
    from pgtick.web import create_app

    app = create_app(older.dsn)
    with pytest.raises(SchemaMismatch, match=r"is older than pgtick .*run `pgtick migrate`"):
        async with app.router.lifespan_context(app):
            pytest.fail("the dashboard started")


@pytest.mark.asyncio
async def test_the_dashboards_app_factory_starts_on_the_current_schema(db: Database) -> None:
    from pgtick.web import create_app

    app = create_app(db.dsn)
    async with app.router.lifespan_context(app):
        pass


def test_a_migrate_stopped_by_ctrl_c_says_where_the_schema_stands(pg: Server, tmp_path: Path) -> None:
    """Ctrl-C in the middle of an upgrade: the migrations committed stay (each is its own
    transaction), the one in flight is rolled back, and one line on stderr says what was
    applied and what is still missing and to run `pgtick migrate` again, exit 130, rather than
    nothing at all over a schema between two releases."""
    versions = [m.version for m in migrate.migrations()]
    blocked = next(m for m in migrate.migrations() if m.name == "bounds")
    with installed_before(pg, migrate.migrations()[1], tmp_path) as database:
        with database.connect(autocommit=False) as holder, database.connect() as observer:
            # The first release's jobs.retry_policies, altered again only by `blocked`: the
            # upgrade applies the migrations before it, then waits for this lock.
            holder.execute("LOCK TABLE jobs.retry_policies IN ACCESS SHARE MODE")
            proc = pgtick_in_foreground("migrate", "--dsn", database.dsn)
            try:
                applied = "SELECT count(*) FROM jobs.schema_migrations WHERE version < %s"
                wait_for(
                    f"the migrations before {blocked.version} to commit",
                    lambda: scalar(observer, applied, (blocked.version,)) == versions.index(blocked.version),
                    timeout=120,
                )
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        with database.connect() as conn:
            stored = {r[0] for r in conn.execute("SELECT version FROM jobs.schema_migrations")}
    before, after = versions[: versions.index(blocked.version)], versions[versions.index(blocked.version) :]
    assert stored == set(before), f"applied {sorted(stored)}, expected {before}"
    assert proc.returncode == 130, (proc.returncode, out, err)
    expected = (
        f"pgtick migrate: warning: interrupted after applying {before[1]} to {before[-1]}:"
        f" {after[0]} to {after[-1]} still to apply; run pgtick migrate again"
        " (pgtick run refuses to start until then)\n"
    )
    assert err == expected, err


def test_a_migration_the_database_refuses_is_named_with_what_it_committed_left_as_it_was(
    db: Database,
) -> None:
    """The server's message alone ("constraint ... already exists", "syntax error at end of
    input") does not say which file of the schema it stopped at: the error line names it. Here
    the ledger lacks the last migration while the schema has it, so applying it again fails;
    its transaction rolls back, and the ledger stays as it was."""
    last = migrate.migrations()[-1]
    with db.connect() as conn:
        conn.execute("DELETE FROM jobs.schema_migrations WHERE version = %s", (last.version,))
    result = pgtick("migrate", "--dsn", db.dsn)
    shown = f"exit {result.returncode}\nstderr: {result.stderr!r}"
    assert result.returncode == 1, shown
    assert "Traceback" not in result.stderr, shown
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and errors[0].startswith("pgtick migrate: error: migrating stopped: "), shown
    assert errors[0].endswith(f"(in migrations/{last.path.name})"), shown
    with db.connect() as conn:
        assert (
            scalar(conn, "SELECT count(*) FROM jobs.schema_migrations WHERE version = %s", (last.version,))
            == 0
        )
