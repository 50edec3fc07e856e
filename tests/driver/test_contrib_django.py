"""pgtick.contrib.django: the example project (examples/django_project) against a real,
empty database, through its own manage.py in subprocesses.

`migrate` installs the jobs schema with the shop's tables; the system check tells a
missing schema; an order placed inside `transaction.atomic()` enqueues its receipt in
the same transaction (a failing one leaves neither); `pgtick_worker` runs the job,
which writes through the ORM; `pgtick_scheduler` leads and materializes the schedule.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from harness import ROOT, Database, Server, dsn_for, rows, scalar, wait_for

PROJECT = ROOT / "examples" / "django_project"


@pytest.fixture
def empty(pg: Server) -> Iterator[Database]:
    database = pg.create_empty_database()
    try:
        yield database
    finally:
        pg.drop_database(database)


def _env(dsn: str | None = None) -> dict[str, str]:
    """This process's environment without its database and Django settings; ``dsn`` as the
    example project's DATABASE_URL."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "PGTICK_DSN", "DJANGO_SETTINGS_MODULE")
    }
    env.update(PYTHONUNBUFFERED="1", PGTICK_LOG="INFO")
    if dsn is not None:
        env["DATABASE_URL"] = dsn
    return env


def manage(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=_env(db.dsn),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start(db: Database, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=_env(db.dsn),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], log: Path) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise AssertionError(f"manage.py did not stop on SIGTERM:\n{log.read_text()}") from None


def test_the_example_project_migrates_checks_enqueues_in_its_transaction_and_runs_orm_jobs(
    empty: Database, tmp_path: Path
) -> None:
    before = manage(empty, "check", "--database", "default", "--fail-level", "WARNING")
    assert before.returncode != 0 and "pgtick.W001" in before.stderr, before.stderr

    migrated = manage(empty, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    assert "pgtick.0001_jobs_schema" in migrated.stdout or "Applying pgtick" in migrated.stdout, (
        migrated.stdout
    )
    again = manage(empty, "pgtick_migrate")
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr
    # An upgraded pgtick brings schema changes no Django migration records: every migrate
    # applies them (here: a function of the schema that went missing comes back).
    with empty.connect() as conn:
        conn.execute("DROP FUNCTION jobs.version()")
    upgraded = manage(empty, "migrate", "--no-input")
    assert upgraded.returncode == 0, upgraded.stderr
    with empty.connect() as conn:
        assert scalar(conn, "SELECT to_regprocedure('jobs.version()') IS NOT NULL"), upgraded.stdout
    after = manage(empty, "check", "--database", "default", "--fail-level", "WARNING")
    assert after.returncode == 0, after.stderr

    placed = manage(empty, "place_order", "book")
    assert placed.returncode == 0, placed.stderr
    match = re.search(r"order=(\d+) run=(\d+)", placed.stdout)
    assert match, placed.stdout
    order_id, run_id = int(match.group(1)), int(match.group(2))
    failed = manage(empty, "place_order", " ")
    assert failed.returncode != 0 and "item must not be empty" in failed.stderr, failed.stderr

    with empty.connect() as conn:
        orders = rows(conn, "SELECT id, item FROM shop_order ORDER BY id")
        runs = rows(conn, "SELECT id, kind, payload FROM jobs.runs ORDER BY id")
    assert orders == [{"id": order_id, "item": "book"}], "the failed order was not rolled back"
    assert runs == [{"id": run_id, "kind": "send-receipt", "payload": {"order": order_id}}], (
        f"the failed order's run was not rolled back with it: {runs}"
    )

    log = tmp_path / "worker.log"
    worker = start(empty, log, "pgtick_worker", "--poll", "0.2s", "--grace", "5s")
    try:
        with empty.connect() as conn:

            def sent() -> bool:
                row = rows(conn, "SELECT receipt_run FROM shop_order WHERE id = %s", (order_id,))
                done = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,))
                return row == [{"receipt_run": run_id}] and done == "COMPLETED"

            wait_for(f"the worker to run the ORM job\n{log.read_text()}", sent, timeout=60)
    finally:
        code = stop(worker, log)
    assert code == 0, log.read_text()

    log = tmp_path / "scheduler.log"
    scheduler = start(empty, log, "pgtick_scheduler", "--tick", "0.2s")
    try:
        with empty.connect() as conn:

            def materialized() -> bool:
                cursor = "SELECT next_run_at IS NOT NULL FROM jobs.definitions WHERE name = 'close-day'"
                return bool(scalar(conn, cursor)) and bool(scalar(conn, "SELECT count(*) FROM jobs.leader"))

            wait_for(
                f"the scheduler to lead and set the schedule's cursor\n{log.read_text()}", materialized, 60
            )
    finally:
        code = stop(scheduler, log)
    assert code == 0, log.read_text()


def test_the_schema_check_reports_an_unreachable_database_as_its_error() -> None:
    """`check --database default` is the deploy gate: a database it cannot reach is the check's
    own error (pgtick.E003), not a traceback."""
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"],
        cwd=PROJECT,
        env=_env("postgresql://nobody@127.0.0.1:1/none?connect_timeout=5"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    shown = f"exit {result.returncode}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
    assert result.returncode == 1, shown
    assert "Traceback" not in result.stderr, shown
    assert "pgtick.E003" in result.stderr and "cannot read the pgtick schema" in result.stderr, shown


def test_the_worker_dsn_keeps_every_libpq_option_of_the_django_database() -> None:
    """What Django would pass to libpq (channel binding, CRLs, keepalives, ...) reaches the
    worker's and the scheduler's connections too; Django's own options do not."""
    script = """
import json

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict
settings.configure(
    INSTALLED_APPS=["pgtick.contrib.django"],
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app", "HOST": "db.internal",
        "OPTIONS": {"sslmode": "verify-full", "channel_binding": "require", "sslcrl": "/etc/crl.pem",
                    "gssencmode": "disable", "keepalives_idle": 30, "tcp_user_timeout": 10000,
                    "server_side_binding": True},
    }},
)
django.setup()
from pgtick.contrib.django import dsn
print(json.dumps(conninfo_to_dict(dsn())))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    for key, value in {
        "dbname": "shop",
        "user": "app",
        "host": "db.internal",
        "sslmode": "verify-full",
        "channel_binding": "require",
        "sslcrl": "/etc/crl.pem",
        "gssencmode": "disable",
        "keepalives_idle": "30",
        "tcp_user_timeout": "10000",
    }.items():
        assert got.get(key) == value, (key, got)
    assert "server_side_binding" not in got, got


#: A Django project configured in ``-c``: ``DATABASES`` and ``PGTICK`` from argv[1] (JSON),
#: then ``manage.py`` with the remaining arguments.
CONFIGURED_PROJECT = """
import json, sys

import django
from django.conf import settings
from django.core.management import execute_from_command_line

config = json.loads(sys.argv[1])
settings.configure(
    INSTALLED_APPS=["pgtick.contrib.django", "shop"], USE_TZ=True, DATABASES=config["DATABASES"],
    PGTICK=config["PGTICK"], DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()
execute_from_command_line(["manage.py", *sys.argv[2:]])
"""


def configured(
    databases: dict[str, Any], pgtick: dict[str, str] | str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` of a project with these ``DATABASES`` and ``PGTICK`` settings."""
    config = json.dumps({"DATABASES": databases, "PGTICK": pgtick})
    return subprocess.run(
        [sys.executable, "-c", CONFIGURED_PROJECT, config, *args],
        cwd=PROJECT,
        env={**_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _postgresql_settings(dsn: str) -> dict[str, str]:
    params = conninfo_to_dict(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": str(params.get("dbname", "")),
        "USER": str(params.get("user", "")),
        "PASSWORD": str(params.get("password", "")),
        "HOST": str(params.get("host", "")),
        "PORT": str(params.get("port", "")),
    }


def _one_error_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    shown = f"exit {result.returncode}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
    assert result.returncode != 0, shown
    assert "Traceback" not in result.stderr, shown
    assert expected in result.stderr, shown


def test_a_database_alias_that_is_not_postgresql_is_refused_not_left_to_libpq_defaults(
    empty: Database, tmp_path: Path
) -> None:
    """With pgtick's alias on SQLite, the DSN would be empty and libpq would connect wherever
    its PG* environment points: the commands refuse the alias instead, and `check` says why."""
    params = conninfo_to_dict(empty.dsn)
    elsewhere = {
        "PGHOST": str(params.get("host", "")),
        "PGPORT": str(params.get("port", "")),
        "PGDATABASE": empty.name,
        "PGUSER": str(params.get("user", "")),
        "PGPASSWORD": str(params.get("password", "")),
    }
    sqlite = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db.sqlite3")}}
    settings = {"APP": "shop.jobs:app"}
    for command in (["pgtick_migrate"], ["pgtick_worker", "--grace", "1s"], ["pgtick_scheduler"]):
        result = configured(sqlite, settings, *command, "--skip-checks", env=elsewhere)
        _one_error_line(result, "'default' is not PostgreSQL")
    with empty.connect() as conn:
        assert scalar(conn, "SELECT to_regnamespace('jobs') IS NULL"), (
            "the jobs schema was installed in the database libpq's environment points at"
        )
    check = configured(sqlite, settings, "check")
    _one_error_line(check, "pgtick.E001")


def test_an_unreachable_database_or_a_missing_alias_is_one_error_line_and_fails_the_check(
    tmp_path: Path,
) -> None:
    unreachable = {"default": _postgresql_settings("postgresql://nobody@127.0.0.1:1/none")}
    settings = {"APP": "shop.jobs:app"}
    for command in (["pgtick_migrate"], ["pgtick_worker", "--grace", "1s"]):
        result = configured(unreachable, settings, *command)
        _one_error_line(result, "cannot connect to PostgreSQL")
        assert result.stderr.strip().count("\n") == 0, result.stderr

    missing = {**settings, "DATABASE": "reports"}
    for command in (["pgtick_migrate", "--skip-checks"], ["pgtick_worker", "--skip-checks"]):
        result = configured(unreachable, missing, *command)
        _one_error_line(result, "'reports'")
        assert result.stderr.strip().count("\n") == 0, result.stderr
    for command in (["check"], ["check", "--database", "default"], ["migrate", "--no-input"]):
        result = configured(unreachable, missing, *command)
        _one_error_line(result, "pgtick.E001")
        assert "'reports'" in result.stderr, result.stderr


def test_a_pgtick_setting_that_is_not_a_dict_or_an_app_that_does_not_load_fails_the_check(
    empty: Database,
) -> None:
    """`manage.py check` (which every deploy step runs) fails, one error each, when PGTICK is
    not a dict (pgtick.E001: it was read as unset, so a worker said to set what was set) or
    PGTICK["APP"] names no loadable pgtick.App (pgtick.E002: the worker would stop on it);
    a worker given either says the same in one line."""
    databases = {"default": _postgresql_settings(empty.dsn)}
    for pgtick, expected in (
        ("shop.jobs:app", ("pgtick.E001", "PGTICK must be a dict")),
        ({"APP": "shop.jobs:nope"}, ("pgtick.E002", "no pgtick.App named 'nope'")),
        ({"APP": "nomodule:app"}, ("pgtick.E002", "cannot import app module 'nomodule'")),
    ):
        for command in (["check"], ["check", "--database", "default"]):
            result = configured(databases, pgtick, *command)
            for text in expected:
                _one_error_line(result, text)
        worker = configured(databases, pgtick, "pgtick_worker", "--skip-checks")
        _one_error_line(worker, expected[1])
        assert worker.stderr.strip().count("\n") == 0, worker.stderr
    fine = configured(databases, {"APP": "shop.jobs:app"}, "check")
    assert fine.returncode == 0 and "pgtick.E" not in fine.stderr, fine.stderr


def test_manage_py_migrate_by_a_login_that_may_not_install_the_schema_is_one_error_line(
    pg: Server,
) -> None:
    """`manage.py migrate` as the database's owner without the right to grant pgtick's roles
    (an application login without CREATEROLE) stops in pgtick's Django migration: one
    CommandError line that names pgtick and what PostgreSQL refused (exit 1), as
    `pgtick_migrate` says it, not a traceback through Django's migration executor."""
    login = f"pgtick_django_owner_{os.getpid()}"
    with pg.admin() as admin:
        admin.execute(f'DROP ROLE IF EXISTS "{login}"')
        admin.execute(f'CREATE ROLE "{login}" LOGIN')
    database = pg.create_empty_database()
    try:
        with pg.admin() as admin:
            admin.execute(f'ALTER DATABASE "{database.name}" OWNER TO "{login}"')
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            conn.execute(f'GRANT CREATE ON SCHEMA public TO "{login}"')
        owner = _postgresql_settings(dsn_for(pg.admin_dsn, database.name, user=login))
        for command in (["migrate", "--no-input"], ["pgtick_migrate"]):
            result = configured({"default": owner}, {"APP": "shop.jobs:app"}, *command)
            # PostgreSQL's words differ by major: "must have admin option on role" (15),
            # "permission denied to grant role" (16).
            _one_error_line(result, "pgtick could not migrate database 'default': ")
            assert re.search(r"(admin option on|permission denied to grant) role \"jobs_", result.stderr), (
                result.stderr
            )
            # `migrate` prints its system check warnings first (the schema is not installed).
            errors = [line for line in result.stderr.splitlines() if "Error" in line]
            assert errors == [line for line in errors if line.startswith("CommandError: pgtick")], (
                result.stderr
            )
            assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    finally:
        pg.drop_database(database)
        with pg.admin() as admin:
            admin.execute(f'DROP ROLE IF EXISTS "{login}"')


def test_a_flush_does_not_migrate_the_jobs_schema_again(empty: Database) -> None:
    """`manage.py flush` (which Django's TransactionTestCase runs after every test) sends
    post_migrate, but changes no schema: the jobs schema is not migrated again (its
    functions are not re-created), as it is after `manage.py migrate`."""
    assert manage(empty, "migrate", "--no-input").returncode == 0
    query = "SELECT xmin::text FROM pg_proc WHERE oid = 'jobs.claim'::regproc"
    with empty.connect() as conn:
        before = scalar(conn, query)
    flushed = manage(empty, "flush", "--no-input")
    assert flushed.returncode == 0, flushed.stderr
    with empty.connect() as conn:
        after_flush = scalar(conn, query)
    assert after_flush == before, "manage.py flush re-applied the jobs schema's functions"
    assert manage(empty, "migrate", "--no-input").returncode == 0
    with empty.connect() as conn:
        assert scalar(conn, query) != before, "manage.py migrate no longer brings the schema up to date"


def test_a_worker_option_out_of_range_is_one_usage_line_as_pgtick_run_says_it(tmp_path: Path) -> None:
    """`pgtick_worker` and `pgtick_scheduler` take `--concurrency` and `--tick` in the ranges
    `pgtick run` takes them: a value outside is argparse's one line (exit 2), naming the
    option, before any connection, never a traceback from the worker."""
    unreachable = {"default": _postgresql_settings("postgresql://nobody@127.0.0.1:1/none")}
    settings = {"APP": "shop.jobs:app"}
    for command, option in (
        (["pgtick_worker", "--concurrency", "0"], "--concurrency"),
        (["pgtick_worker", "--concurrency", "-3"], "--concurrency"),
        (["pgtick_worker", "--concurrency", "1001"], "--concurrency"),
        (["pgtick_scheduler", "--tick", "2d"], "--tick"),
    ):
        result = configured(unreachable, settings, *command, "--skip-checks")
        _one_error_line(result, option)
        assert result.returncode == 2, f"{command}: exit {result.returncode}\n{result.stderr}"
        assert "cannot connect" not in result.stderr, result.stderr


#: The start of a script run with ``-c``: Django configured on the database argv[1] (a DSN),
#: with the database settings ``EXTRA`` (a dict display) added.
DJANGO_ON_ARGV = """
import sys

import django
import psycopg
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

params = conninfo_to_dict(sys.argv[1])
settings.configure(
    INSTALLED_APPS=["pgtick.contrib.django"], USE_TZ=True,
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": params.get("dbname", ""),
        "USER": params.get("user", ""), "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""), "PORT": params.get("port", ""), **EXTRA,
    }},
)
django.setup()
"""


def _kinds_left_by(script: str, db: Database) -> list[str]:
    """Run ``script`` (a ``DJANGO_ON_ARGV`` script) on ``db``; the kinds of the runs it left."""
    result = subprocess.run(
        [sys.executable, "-c", script, db.dsn],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with db.connect() as conn:
        return [r["kind"] for r in rows(conn, "SELECT kind FROM jobs.runs ORDER BY id")]


#: Its code keeps a client from ``pgtick.contrib.django.client()`` as an application keeps
#: one at module level.
KEPT_CLIENT = (
    DJANGO_ON_ARGV.replace("EXTRA", "{}")
    + """
from django.db import connection, transaction

import pgtick.contrib.django as pgtick

jobs = pgtick.client()


class Undo(Exception):
    pass


try:
    with transaction.atomic():
        jobs.enqueue("rolled-back")  # the block's first statement
        raise Undo
except Undo:
    pass
connection.close()  # as Django does at the end of a request
with transaction.atomic():
    jobs.enqueue("committed")
jobs.enqueue("autocommitted")
"""
)


def test_a_kept_django_client_joins_each_atomic_block_and_outlives_the_requests_connection(
    db: Database,
) -> None:
    """Django begins no transaction when an atomic block begins (it turns autocommit off): an
    enqueue that is the block's first statement must still roll back with the block. And
    Django closes its connection after each request: a client kept from one request to the
    next works on the connection Django has now."""
    kinds = _kinds_left_by(KEPT_CLIENT, db)
    assert kinds == ["committed", "autocommitted"], f"runs left: {kinds}"


#: A client made at import time (module level), as in a module that Django imports while it
#: starts, before any request: with the database down (a container built or checked without
#: one), then with it up.
CLIENT_AT_IMPORT = (
    DJANGO_ON_ARGV.replace("EXTRA", "{}")
    + """
from django.db import connection

import pgtick.contrib.django as pgtick

jobs = pgtick.client()
if connection.connection is not None:
    sys.exit("making a client opened a database connection")
jobs.enqueue("from-a-kept-client")
"""
)


def test_a_django_client_made_at_import_time_opens_no_connection(db: Database) -> None:
    """`pgtick.contrib.django.client()` kept at module level, as its docs offer, is made while
    Django imports the module: it opens no database connection then (Django warns against
    queries at import, and a database that is down would stop the import), only at its
    first call."""
    kinds = _kinds_left_by(CLIENT_AT_IMPORT, db)
    assert kinds == ["from-a-kept-client"], f"runs left: {kinds}"


#: A persistent connection (CONN_MAX_AGE) that the server ends between two requests: the
#: request that meets it fails, and the next one must get a new connection.
DEAD_CONNECTION = (
    DJANGO_ON_ARGV.replace("EXTRA", '{"CONN_MAX_AGE": 600}')
    + """
from django.db import close_old_connections, connection

import pgtick.contrib.django as pgtick

jobs = pgtick.client()
for request, enqueue in enumerate([jobs.enqueue, pgtick.enqueue]):
    close_old_connections()  # a request begins
    enqueue(f"first-{request}")
    close_old_connections()  # it ends: the connection is kept
    with psycopg.connect(sys.argv[1], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (connection.connection.info.backend_pid,))
    close_old_connections()
    try:
        enqueue(f"lost-{request}")
    except Exception:
        pass
    else:
        sys.exit("an enqueue on a connection the server ended succeeded")
    close_old_connections()  # that request ends
    close_old_connections()
    enqueue(f"after-{request}")  # the next request
"""
)


def test_a_persistent_connection_the_server_ended_is_replaced_after_the_request_that_met_it(
    db: Database,
) -> None:
    kinds = _kinds_left_by(DEAD_CONNECTION, db)
    assert kinds == ["first-0", "after-0", "first-1", "after-1"], f"runs: {kinds}"


#: Jobs added to a copy of the example project: process-isolated, one of them using the ORM.
ISOLATED_JOBS = """


@app.job("count-orders", isolation="process", timeout=60)
def count_orders(ctx: Context) -> dict[str, int]:
    import os

    from shop.models import Order

    return {"orders": Order.objects.count(), "pid": os.getpid()}


@app.job("plain-isolated", isolation="process", timeout=60)
def plain_isolated(ctx: Context) -> int:
    return 7
"""


def _project_with(tmp_path: Path, jobs: str, db: Database) -> Path:
    """A copy of the example project with ``jobs`` appended to shop/jobs.py, migrated into
    ``db`` with one order placed."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    with (project / "shop" / "jobs.py").open("a") as out:
        out.write(jobs)
    for args in (["migrate", "--no-input"], ["place_order", "book"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=project,
            env=_env(db.dsn),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    return project


def _start_worker(project: Path, db: Database, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", "pgtick_worker", "--poll", "0.2s", "--grace", "5s"],
            cwd=project,
            env=_env(db.dsn),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_finished(conn: Any, run_ids: list[int], log: Path) -> dict[int, dict[str, Any]]:
    """The runs, once every one of them is COMPLETED or FAILED."""

    def finished() -> list[dict[str, Any]] | None:
        found = rows(
            conn,
            "SELECT id, status::text AS status, result, error FROM jobs.runs"
            " WHERE id = ANY(%s) AND status IN ('COMPLETED', 'FAILED') ORDER BY id",
            (run_ids,),
        )
        return found if len(found) == len(run_ids) else None

    try:
        ended = wait_for(f"runs {run_ids} to finish", finished, timeout=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()}") from None
    return {r["id"]: r for r in ended}


def test_process_isolated_jobs_run_under_the_django_worker_with_the_orm(
    empty: Database, tmp_path: Path
) -> None:
    """manage.py pgtick_worker wraps each sync job to close Django's stale connections around
    it; the wrapped job must still travel to its child process (by reference, as any isolated
    job does), and there the ORM needs Django set up before the job's module is imported."""
    project = _project_with(tmp_path, ISOLATED_JOBS, empty)
    log = tmp_path / "worker.log"
    with empty.connect() as conn:
        counted = scalar(conn, "SELECT id FROM jobs.enqueue('count-orders')")
        plain = scalar(conn, "SELECT id FROM jobs.enqueue('plain-isolated')")
        worker = _start_worker(project, empty, log)
        try:
            by_id = _wait_finished(conn, [counted, plain], log)
        finally:
            code = stop(worker, log)
    assert code == 0, log.read_text()
    shown = f"{by_id}\n{log.read_text()}"
    assert (by_id[plain]["status"], by_id[plain]["result"]) == ("COMPLETED", 7), shown
    assert by_id[counted]["status"] == "COMPLETED", shown
    assert by_id[counted]["result"]["orders"] == 1, shown
    assert by_id[counted]["result"]["pid"] != worker.pid, f"the job did not run in a child process: {shown}"


#: An ``async def`` job using Django's async ORM, added to a copy of the example project.
ASYNC_ORM_JOB = """


@app.job("count-orders-async")
async def count_orders_async(ctx: Context) -> int:
    from shop.models import Order

    return await Order.objects.acount()
"""


def test_an_async_orm_job_recovers_after_the_server_ends_its_connection(
    empty: Database, tmp_path: Path
) -> None:
    """Django's async ORM queries on a thread of its own: the worker closes the stale
    connections there around each async job, as it does for a sync job's thread, so a
    connection the server ended (a restart, a failover) fails no later run."""
    project = _project_with(tmp_path, ASYNC_ORM_JOB, empty)
    log = tmp_path / "worker.log"
    with empty.connect() as conn:
        worker = _start_worker(project, empty, log)
        try:
            first = scalar(conn, "SELECT id FROM jobs.enqueue('count-orders-async')")
            _wait_finished(conn, [first], log)
            conn.execute(  # every session of the worker's but pgtick's own (they reconnect)
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND application_name NOT LIKE 'pgtick%'"
            )
            later = [scalar(conn, "SELECT id FROM jobs.enqueue('count-orders-async')") for _ in range(2)]
            by_id = _wait_finished(conn, [first, *later], log)
        finally:
            code = stop(worker, log)
    assert code == 0, log.read_text()
    got = [(i, by_id[i]["status"], by_id[i]["result"], by_id[i]["error"]) for i in [first, *later]]
    assert got == [(i, "COMPLETED", 1, None) for i in [first, *later]], f"{got}\n{log.read_text()}"
