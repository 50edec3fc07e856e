"""The CLI's queue commands: `pgtick run --queues a,b` claims only from those queues;
`pgtick pause-queue` / `resume-queue` stop and restart claiming; bad input exits 2 with one
line and no traceback."""

from __future__ import annotations

from pathlib import Path

from harness import Database, pgtick, processes, scalar, wait_for


def test_pause_and_resume_queue_from_the_cli(db: Database) -> None:
    dsn = ["--dsn", db.dsn]
    out = pgtick("pause-queue", "mail", *dsn)
    assert out.returncode == 0 and out.stdout == "queue=mail paused\n", (out.stdout, out.stderr)
    assert pgtick("pause-queue", "mail", *dsn).stdout == "queue=mail already paused\n"
    with db.connect() as conn:
        assert scalar(conn, "SELECT paused FROM jobs.queues WHERE name = 'mail'") is True
        out = pgtick("resume-queue", "mail", *dsn)
        assert out.returncode == 0 and out.stdout == "queue=mail resumed\n", (out.stdout, out.stderr)
        assert scalar(conn, "SELECT count(*) FROM jobs.paused_queues") == 0
    assert pgtick("resume-queue", "mail", *dsn).stdout == "queue=mail already running\n"


def test_enqueue_into_a_queue_with_a_concurrency_key(db: Database) -> None:
    out = pgtick("enqueue", "quick", "--queue", "tenants", "--concurrency-key", "acme", "--dsn", db.dsn)
    assert out.returncode == 0, out.stderr
    with db.connect() as conn:
        row = conn.execute("SELECT queue, concurrency_key FROM jobs.runs").fetchone()
    assert row == ("tenants", "acme")


def test_bad_queue_arguments_exit_2_with_one_line(db: Database) -> None:
    for args in (["run", "x.py", "--queues", "a,,b"], ["pause-queue", ""], ["enqueue", "k", "--queue", ""]):
        out = pgtick(*args, "--dsn", db.dsn)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_run_with_queues_claims_only_from_those_queues(db: Database, tmp_path: Path) -> None:
    """A worker started with --queues a claims the runs of queue a and leaves queue b alone."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue_many('quick', '[{}, {}, {}]', queue => 'a')")
        conn.execute("SELECT jobs.enqueue_many('quick', '[{}, {}]', queue => 'b')")
        with processes(tmp_path, db.dsn) as procs:
            procs.replica("work_app.py", "worker", "--queues", "a", "--no-scheduler")
            wait_for(
                "queue a drained",
                lambda: (
                    scalar(conn, "SELECT count(*) FROM jobs.runs WHERE queue = 'a' AND status = 'COMPLETED'")
                    == 3
                ),
                timeout=90,
            )
            states = conn.execute(
                "SELECT queue, status::text, count(*) FROM jobs.runs GROUP BY 1, 2 ORDER BY 1"
            ).fetchall()
        assert states == [("a", "COMPLETED", 3), ("b", "QUEUED", 2)], states
