"""The CLI's queue commands: `pgtick run --queues a,b` claims only from those queues;
`pgtick pause-queue` / `resume-queue` stop and restart claiming; `pgtick scope-worker` /
`unscope-worker` bind a worker login to kinds and queues; bad input exits 2 with one
line and no traceback."""

from __future__ import annotations

import json
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


def test_pausing_a_queue_nothing_uses_warns_that_it_may_be_a_typo(db: Database) -> None:
    """ "mial" for "mail": the pause is made (runs may come), but a warning says that no live
    run, definition or limit uses the queue, so the operator sees that "mail" still runs."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('send', queue => 'mail')")
    typo = pgtick("pause-queue", "mial", "--dsn", db.dsn)
    assert typo.returncode == 0 and typo.stdout == "queue=mial paused\n", typo
    assert typo.stderr.startswith(
        "pgtick pause-queue: warning: no queued or running run, definition or limit uses"
    ), typo
    assert "'mial'" in typo.stderr and len(typo.stderr.splitlines()) == 1, typo.stderr
    meant = pgtick("pause-queue", "mail", "--dsn", db.dsn)
    assert (meant.returncode, meant.stdout, meant.stderr) == (0, "queue=mail paused\n", ""), meant
    with db.connect() as conn:
        conn.execute("SELECT jobs.set_limit('queue', 'reports', max_running => 2)")
    limited = pgtick("pause-queue", "reports", "--dsn", db.dsn)
    assert limited.stderr == "", "a queue with a limit is in use"


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


def test_scope_and_unscope_a_worker_login_from_the_cli(db: Database) -> None:
    dsn = ["--dsn", db.dsn]
    with db.worker_login("cli_scope") as role:
        out = pgtick("scope-worker", role, "--kinds", "send-email,send-sms", "--queues", "mail", *dsn)
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert out.stdout == f"role={role} kinds=send-email,send-sms queues=mail\n", out.stdout
        with db.connect() as conn:
            row = conn.execute(
                "SELECT kinds, queues FROM jobs.worker_scopes WHERE role = %s", (role,)
            ).fetchone()
            assert row == (["send-email", "send-sms"], ["mail"]), row
            out = pgtick("scope-worker", role, "--queues", "reports", "--json", *dsn)
            assert out.returncode == 0, out.stderr
            assert out.stderr == (
                "pgtick scope-worker: warning: kinds widened from send-email,send-sms to any"
                " (--kinds not given; a scope is set whole)\n"
            ), out.stderr
            assert json.loads(out.stdout) == {
                "role": role,
                "kinds": None,
                "queues": ["reports"],
                "scoped": True,
                "changed": True,
            }, out.stdout
            assert pgtick("unscope-worker", role, *dsn).stdout == f"role={role} unscoped\n"
            assert scalar(conn, "SELECT count(*) FROM jobs.worker_scopes") == 0
            assert pgtick("unscope-worker", role, *dsn).stdout == f"role={role} had no scope\n"
    gone = pgtick("unscope-worker", role, *dsn)  # the login is dropped: a typo looks the same
    assert (gone.returncode, gone.stdout) == (2, ""), gone
    assert gone.stderr == f"pgtick unscope-worker: error: role {role!r} does not exist\n", gone.stderr


def test_bad_scope_worker_arguments_exit_2_with_one_line(db: Database) -> None:
    with db.worker_login("cli_scope_bad") as role:
        for args in (
            ["scope-worker", role],
            ["scope-worker", role, "--kinds", "a,,b"],
            ["scope-worker", role, "--queues", "q\x1b[31m"],
            ["scope-worker", role, "--kinds", ",".join(f"k{i}" for i in range(1001))],
            ["scope-worker", "r" * 64, "--kinds", "a"],
            ["scope-worker", "pgtick_t_no_such_role", "--kinds", "a"],
            ["scope-worker", "jobs_worker", "--kinds", "a"],
            ["unscope-worker", ""],
        ):
            out = pgtick(*args, "--dsn", db.dsn)
            assert out.returncode == 2, (args[:2], out.returncode, out.stderr)
            assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        with db.connect() as conn:
            assert scalar(conn, "SELECT count(*) FROM jobs.worker_scopes") == 0


def test_define_from_the_cli_sets_and_keeps_a_definitions_queue_and_key(db: Database) -> None:
    """`pgtick define` takes --queue, --concurrency-key and --heartbeat-timeout, as jobs.define
    and define_many do: without them, editing a definition from the shell (a new payload, say)
    moved it out of its queue into 'default' and dropped its concurrency key."""
    with db.connect() as conn:
        conn.execute(
            "SELECT jobs.define('nightly', 'report', schedule => '0 3 * * *', queue => 'reports',"
            " concurrency_key => 'tenant-1', heartbeat_timeout => '2 minutes')"
        )
    done = pgtick(
        "define", "nightly", "report", "--schedule", "0 3 * * *", "--payload", '{"v": 2}',
        "--queue", "reports", "--concurrency-key", "tenant-1", "--heartbeat-timeout", "2m",
        "--dsn", db.dsn,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with db.connect() as conn:
        stored = conn.execute(
            "SELECT queue, concurrency_key, heartbeat_timeout::text, payload FROM jobs.definitions"
            " WHERE name = 'nightly'"
        ).fetchone()
    assert stored == ("reports", "tenant-1", "00:02:00", {"v": 2}), stored
