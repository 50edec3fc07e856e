"""Writing an app's declarations (`pgtick run` and `pgtick.testing` do it at start): the
retry policies and the schedules land together or not at all."""

from __future__ import annotations

import psycopg
import pytest

from harness import Database, scalar
from pgtick.app import App, Context
from pgtick.definitions import sync_app


def test_a_schedule_the_database_refuses_leaves_the_retry_policies_as_they_were(db: Database) -> None:
    """The definitions table held by another transaction past the sync's lock timeout: the
    schedules are not written, and neither are the policies written before them."""
    app = App("t")

    @app.job("report", max_attempts=9)
    def report(ctx: Context) -> None:
        pass

    app.schedule("nightly", "report", "0 3 * * *")
    with db.connect() as conn:
        conn.execute("SELECT jobs.set_retry_policy('report', max_attempts => 2)")
    with db.connect() as holder, holder.transaction():
        holder.execute("LOCK TABLE jobs.definitions IN ACCESS EXCLUSIVE MODE")
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '100ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                sync_app(app, conn)
    with db.connect() as conn:
        assert scalar(conn, "SELECT max_attempts FROM jobs.retry_policies WHERE kind = 'report'") == 2
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0
        sync_app(app, conn)
        assert scalar(conn, "SELECT max_attempts FROM jobs.retry_policies WHERE kind = 'report'") == 9
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 1
