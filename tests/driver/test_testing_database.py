"""pgtick.testing on a database the user gives ($PGTICK_TESTING_DSN): it is migrated first,
used as it is, and reset() empties the jobs tables (and only those)."""

from __future__ import annotations

import psycopg
import pytest

from harness import Server
from pgtick import App, Context


def test_a_given_database_is_migrated_and_used(pg: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # Imported here: tests/driver/test_testing.py loads it as a pytest plugin, and a module
    # imported before that could not have its asserts rewritten.
    from pgtick.testing import JobsTester, database

    empty = pg.create_empty_database()
    try:
        monkeypatch.setenv("PGTICK_TESTING_DSN", empty.dsn)
        with database() as dsn:
            assert dsn == empty.dsn
            app = App("given")

            @app.job("double")
            def double(ctx: Context) -> int:
                return int(ctx.payload["n"]) * 2

            tester = JobsTester(dsn)
            tester.enqueue("double", {"n": 21})
            [outcome] = tester.run_due(app)
            assert (outcome.status, outcome.result) == ("COMPLETED", 42)

            tester.enqueue("double", {"n": 1})
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE orders (id int)")
                conn.execute("INSERT INTO orders VALUES (1)")
                # One finished run moved to history: reset empties that too.
                conn.execute(
                    "UPDATE jobs.runs SET finished_at = now() - interval '3 days' WHERE status = 'COMPLETED'"
                )
                assert conn.execute("SELECT jobs.archive()").fetchone() == (1,)
            tester.reset()
            tester.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                runs = conn.execute("SELECT count(*) FROM jobs.runs_all").fetchone()
                orders = conn.execute("SELECT count(*) FROM orders").fetchone()
            assert runs is not None and orders is not None
            assert (runs[0], orders[0]) == (0, 1), "reset must empty the jobs tables and nothing else"
    finally:
        pg.drop_database(empty)
