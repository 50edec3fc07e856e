"""A login that is only a jobs_worker runs jobs end to end: `pgtick run --no-scheduler` with
its DSN claims, heartbeats, completes and fails runs through its calls alone (it reads no
table of runs), and every run it claimed is bound to its process's secret claim token.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import pytest

from harness import APPS, FAST, NEVER, Database, pgtick, processes, scalar, wait_for
from pgtick.app import App, Context
from pgtick.worker import Worker


def test_pgtick_run_as_a_worker_login_completes_fails_and_cancels_jobs(db: Database, tmp_path: Path) -> None:
    """Every call the worker makes on the way (register, LISTEN, next_due, claim, heartbeat,
    complete, complete_many, fail, acknowledge_cancel, definition names, stop) is allowed
    to a jobs_worker login, and each run it claimed carries its claim token's hash."""
    with db.worker_login("runner") as login, processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        replica = procs.start(
            "worker-login",
            ["run", str(APPS / "work_app.py"), "--dsn", db.dsn_as(login), "--no-scheduler", *FAST],
        )
        worker = replica.worker_id
        quick = [scalar(conn, "SELECT id FROM jobs.enqueue('quick')") for _ in range(3)]
        sleepy = scalar(conn, """SELECT id FROM jobs.enqueue('sleepy', '{"seconds": 2}')""")
        exits = scalar(conn, "SELECT id FROM jobs.enqueue('exits', max_attempts => 1)")
        conn.execute("SELECT jobs.define('nightly', 'quick', run_at => %s)", (NEVER,))
        scheduled = scalar(conn, "SELECT id FROM jobs.run_now('nightly')")  # named in the log
        cancelled = scalar(conn, """SELECT id FROM jobs.enqueue('mutating', '{"seconds": 60}')""")
        wait_for(
            f"run {cancelled} to be RUNNING",
            lambda: scalar(conn, "SELECT status = 'RUNNING' FROM jobs.runs WHERE id = %s", (cancelled,)),
            timeout=30,
        )
        conn.execute("SELECT jobs.cancel(%s)", (cancelled,))
        ids = [*quick, sleepy, exits, scheduled, cancelled]
        wait_for(
            f"runs {ids} to end",
            lambda: scalar(
                conn,
                "SELECT bool_and(finished_at IS NOT NULL) FROM jobs.runs WHERE id = ANY(%s)",
                (ids,),
            ),
            timeout=30,
        )
        runs = conn.execute(
            "SELECT id, status::text, error, worker, heartbeat_at > started_at AS beat"
            " FROM jobs.runs WHERE id = ANY(%s) ORDER BY id",
            (ids,),
        ).fetchall()
        hashes = scalar(
            conn, "SELECT array_agg(DISTINCT claim_token_hash) FROM jobs.runs WHERE id = ANY(%s)", (ids,)
        )
        replica.send(signal.SIGTERM)
        code = replica.wait(30)
        log = replica.log()
    context = f"runs {runs}\n{log}"
    assert [r[:4] for r in runs] == [
        *[(q, "COMPLETED", None, worker) for q in quick],
        (sleepy, "COMPLETED", None, worker),
        (exits, "FAILED", "SystemExit: 3", worker),
        (scheduled, "COMPLETED", None, worker),
        (cancelled, "CANCELLED", f"run {cancelled} cancelled", worker),
    ], context
    assert "definition=nightly" in log, log
    assert runs[3][4] is True, f"the 2 s run was never heartbeated after its claim: {context}"
    assert len(hashes) == 1 and hashes[0] is not None, f"claim token hashes of the runs: {hashes}"
    assert "permission denied" not in log and "Traceback" not in log, log
    assert code == 0, context


@pytest.mark.parametrize("processes", ["1", "2"])
def test_pgtick_run_as_a_worker_login_refuses_to_schedule(
    db: Database, tmp_path: Path, processes: str
) -> None:
    """Scheduling needs jobs_operator: one readable line and exit 2, not a traceback (nor
    worker processes that a supervisor restarts for ever)."""
    app = tmp_path / "one_job.py"
    app.write_text("from pgtick import App\napp = App()\napp.job('k')(lambda ctx: None)\n")
    with db.worker_login("scheduler") as login:
        done = pgtick("run", str(app), "--dsn", db.dsn_as(login), "--processes", processes, *FAST)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--no-scheduler" in lines[0], done.stderr


def test_the_worker_presents_a_secret_it_never_logs_or_stores(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Each Worker claims with a token of its own; the database has its hash on the runs,
    never its text; no log line and no statement text in pg_stat_activity shows it."""
    app = App()
    done = threading.Event()

    @app.job("k")
    def k(ctx: Context) -> dict[str, int]:
        done.set()
        return {"ok": 1}

    with db.worker_login("inproc") as login:
        worker = Worker(app, db.dsn_as(login), poll_interval=0.1, heartbeat_interval=0.2)
        other = Worker(app, db.dsn_as(login))
        assert worker.claim_token != other.claim_token and len(worker.claim_token) >= 32
        with db.connect() as conn:
            run_id = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,))
        with caplog.at_level(logging.DEBUG, logger="pgtick"):
            thread.start()
            try:
                assert done.wait(20), "the job never ran"
                with db.connect() as conn:
                    wait_for(
                        f"run {run_id} to complete",
                        lambda: scalar(
                            conn, "SELECT status = 'COMPLETED' FROM jobs.runs WHERE id = %s", (run_id,)
                        ),
                        timeout=20,
                    )
                    # Bound parameters: no session's statement text shows the token.
                    statements = scalar(conn, "SELECT string_agg(query, '|') FROM pg_stat_activity")
                    assert worker.claim_token not in statements, "pg_stat_activity shows the token"
            finally:
                stop.set()
                thread.join(timeout=30)
    with db.connect() as conn:
        row = conn.execute(
            "SELECT claim_token_hash = sha256(convert_to(%s, 'UTF8')), result FROM jobs.runs WHERE id = %s",
            (worker.claim_token, run_id),
        ).fetchone()
        text = scalar(conn, "SELECT string_agg(t::text, '|') FROM jobs.runs AS t")
    assert row == (True, {"ok": 1}), f"run {run_id}: {row}"
    assert worker.claim_token not in text, "the token's text is stored in jobs.runs"
    assert worker.claim_token not in caplog.text, "a log line shows the claim token"
