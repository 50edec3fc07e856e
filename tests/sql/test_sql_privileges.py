"""Least privilege: roles get exactly the calls they need; PUBLIC gets nothing.

Logged in as the test login roles (members of jobs_worker / jobs_reader / nothing)
over real connections.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sql_support import Conn, add_runs, digest, expect_error, scalar

from harness import Database

WORKER = "pgtick_t_worker"


def _as(db: Database, user: str) -> psycopg.Connection[Any]:
    return psycopg.connect(db.dsn_as(user), autocommit=True)


def test_worker_cannot_write_tables_or_call_operator_functions(db: Database, conn: Conn) -> None:
    (run_id,) = add_runs(conn, 1)
    before = digest(conn)
    with _as(db, WORKER) as worker:
        assert scalar(worker, "SELECT current_user") == WORKER
        denied = [
            ("UPDATE jobs.runs SET status = 'COMPLETED', finished_at = now() WHERE id = %s", (run_id,)),
            ("INSERT INTO jobs.runs (kind) VALUES ('sneaky')", None),
            ("DELETE FROM jobs.runs WHERE id = %s", (run_id,)),
            ("UPDATE jobs.config SET heartbeat_timeout = '1 second'", None),
            ("INSERT INTO jobs.retry_policies (kind) VALUES ('x')", None),
            ("SELECT jobs.enqueue('sneaky')", None),
            ("SELECT jobs.define('d', 'k', run_at => now())", None),
            ("SELECT jobs.cancel(%s)", (run_id,)),
            ("SELECT jobs.reap()", None),
            ("SELECT jobs.set_retry_policy('k')", None),
            ("SELECT jobs._notify()", None),
            ("SELECT jobs._enqueue_retries(ARRAY[%s]::bigint[], NULL)", (run_id,)),
        ]
        for sql, params in denied:
            expect_error(worker, sql, params, "42501")
        # A reader role can look.
        assert scalar(worker, "SELECT count(*) FROM jobs.runs") == 1
    assert digest(conn) == before, "a refused call changed something"


def test_worker_runs_the_protocol_and_cannot_complete_anothers_run(db: Database, conn: Conn) -> None:
    """A jobs_worker login can claim, heartbeat, complete, fail and acknowledge; a run owned by
    another worker id is fenced: complete returns false and nothing changes."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 1)")
    ids = add_runs(conn, 3)
    with _as(db, WORKER) as worker:
        got = [r[0] for r in worker.execute("SELECT id FROM jobs.claim(2, 'w-mine')")]
        assert got == ids[:2]
        beat = worker.execute("SELECT run_id FROM jobs.heartbeat(%s, 'w-mine') ORDER BY 1", (got,))
        assert [r[0] for r in beat] == got
        assert scalar(worker, "SELECT jobs.complete(%s, 'w-mine', '{}')", (got[0],)) is True
        failed = worker.execute("SELECT status::text FROM jobs.fail(%s, 'w-mine', '{E}', 'x')", (got[1],))
        assert failed.fetchall() == [("FAILED",)]

    conn.execute("SELECT jobs.claim(1, 'w-other')")
    before = digest(conn)
    with _as(db, WORKER) as worker:
        assert scalar(worker, "SELECT jobs.complete(%s, 'w-mine')", (ids[2],)) is False
        assert worker.execute("SELECT * FROM jobs.heartbeat(%s, 'w-mine')", ([ids[2]],)).fetchall() == []
        assert scalar(worker, "SELECT jobs.fail(%s, 'w-mine', '{E}') IS NULL", (ids[2],)) is True
        assert scalar(worker, "SELECT jobs.acknowledge_cancel(%s, 'w-mine')", (ids[2],)) is False
    assert digest(conn) == before


def test_nobody_can_call_or_read_anything(db: Database, conn: Conn) -> None:
    (run_id,) = add_runs(conn, 1)
    before = digest(conn)
    with _as(db, "pgtick_t_nobody") as nobody:
        for sql, params in [
            ("SELECT * FROM jobs.runs", None),
            ("SELECT * FROM jobs.definitions", None),
            ("SELECT * FROM jobs.config", None),
            ("SELECT * FROM jobs.claim(1, 'n')", None),
            ("SELECT jobs.complete(%s, 'n')", (run_id,)),
            ("SELECT * FROM jobs.heartbeat(%s, 'n')", ([run_id],)),
            ("SELECT jobs.enqueue('k')", None),
            ("SELECT jobs.cancel(%s)", (run_id,)),
            ("SELECT * FROM jobs.reap()", None),
        ]:
            expect_error(nobody, sql, params, "42501")
    assert digest(conn) == before


def test_reader_reads_but_cannot_claim(db: Database, conn: Conn) -> None:
    add_runs(conn, 1)
    with _as(db, "pgtick_t_reader") as reader:
        assert scalar(reader, "SELECT count(*) FROM jobs.runs") == 1
        expect_error(reader, "SELECT * FROM jobs.claim(1, 'r')", None, "42501")
        expect_error(reader, "UPDATE jobs.runs SET priority = 1", None, "42501")


def test_no_jobs_function_is_executable_by_public(conn: Conn) -> None:
    """Every function in schema jobs: not executable by PUBLIC (neither via a NULL acl, which
    means the default grant to PUBLIC, nor an explicit entry), and search_path pinned."""
    rows = conn.execute(
        """
        SELECT p.oid::regprocedure::text,
               has_function_privilege('public', p.oid, 'EXECUTE'),
               p.proacl IS NULL,
               EXISTS (SELECT FROM aclexplode(p.proacl) AS a
                        WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'),
               coalesce(array_to_string(p.proconfig, ','), '') LIKE '%search_path=%'
          FROM pg_proc AS p
         WHERE p.pronamespace = 'jobs'::regnamespace
         ORDER BY 1
        """
    ).fetchall()
    assert len(rows) >= 20, f"expected the jobs API, found {[r[0] for r in rows]}"
    public = [name for name, has, null_acl, explicit, _ in rows if has or null_acl or explicit]
    assert not public, f"executable by PUBLIC: {public}"
    unpinned = [name for name, *_, pinned in rows if not pinned]
    assert not unpinned, f"functions without a pinned search_path: {unpinned}"


GRANTS = [
    ("jobs_worker", "jobs.claim(integer, text, text[], boolean, text[])", True),
    ("jobs_worker", "jobs.heartbeat(bigint[], text)", True),
    ("jobs_worker", "jobs.complete(bigint, text, jsonb)", True),
    ("jobs_worker", "jobs.complete_many(bigint[], text)", True),
    ("jobs_worker", "jobs.fail(bigint, text, text[], text, text)", True),
    ("jobs_worker", "jobs.acknowledge_cancel(bigint, text, text)", True),
    ("jobs_worker", "jobs.reap()", False),
    ("jobs_worker", "jobs.retry(bigint)", False),
    ("jobs_worker", "jobs.cancel(bigint)", False),
    ("jobs_reader", "jobs.claim(integer, text, text[], boolean, text[])", False),
    (
        "jobs_operator",
        "jobs.enqueue(text, jsonb, timestamptz, integer, text, integer, interval, interval,"
        " text, text, text, text, interval, text, bigint[])",
        True,
    ),
    ("jobs_worker", "jobs.snooze(bigint, text, interval)", True),
    ("jobs_reader", "jobs.snooze(bigint, text, interval)", False),
    ("jobs_worker", "jobs.pause_queue(text)", False),
    ("jobs_operator", "jobs.pause_queue(text)", True),
    ("jobs_operator", "jobs.resume_queue(text)", True),
    ("jobs_worker", "jobs.set_limit(text, text, integer, integer, interval, boolean)", False),
    ("jobs_operator", "jobs.set_limit(text, text, integer, integer, interval, boolean)", True),
    ("jobs_operator", "jobs.remove_limit(text, text)", True),
    (
        "jobs_operator",
        "jobs.enqueue_many(text, jsonb, timestamptz, integer, text, text, integer, interval,"
        " interval, bigint[])",
        True,
    ),
    ("jobs_operator", "jobs._dependency_state(bigint[])", False),
    ("jobs_operator", "jobs._cascade_dependency_failure(bigint[])", False),
    ("jobs_operator", "jobs.reap()", True),
    ("jobs_operator", "jobs.cancel(bigint)", True),
    ("jobs_operator", "jobs.claim(integer, text, text[], boolean, text[])", True),
    ("jobs_operator", "jobs._enqueue_retries(bigint[], text[])", False),
    ("jobs_operator", "jobs._check_payload(text, jsonb)", False),
]


def test_role_grants(conn: Conn) -> None:
    """Roles nest reader < worker < operator; private helpers are granted to nobody."""
    wrong = []
    for role, function, allowed in GRANTS:
        got = scalar(
            conn,
            "SELECT has_function_privilege(%s, %s::regprocedure, 'EXECUTE')",
            (role, function),
        )
        if got is not allowed:
            wrong.append((role, function, f"expected {allowed}, got {got}"))
    assert not wrong, wrong
