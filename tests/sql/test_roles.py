"""Least privilege: roles get exactly the calls they need; PUBLIC gets nothing; a hostile
search_path cannot hijack a function.

Logged in as the test login roles (members of jobs_worker / jobs_reader / nothing)
over real connections. Every function is SECURITY DEFINER with search_path pinned to
pg_catalog, pg_temp, so objects a caller plants earlier on their own search_path
cannot hijack anything.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from harness import Conn, Database, add_runs, digest, expect_error, scalar

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
        # A worker is not a reader: payloads and results of runs are not its to read.
        expect_error(worker, "SELECT count(*) FROM jobs.runs", None, "42501")
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


#: function -> role -> whether the role may execute it (EXECUTE privilege).
GRANTS: dict[str, dict[str, bool]] = {
    "jobs.claim(integer, text, text[], boolean, text[], text)": {
        "jobs_worker": True,
        "jobs_reader": False,
        "jobs_operator": True,
    },
    "jobs.heartbeat(bigint[], text, text)": {"jobs_worker": True},
    "jobs.hand_back_unheld(bigint[], text, text)": {"jobs_worker": True, "jobs_reader": False},
    "jobs.complete(bigint, text, jsonb, text)": {"jobs_worker": True},
    "jobs.complete_many(bigint[], text, text)": {"jobs_worker": True},
    "jobs.fail(bigint, text, text[], text, text, text)": {"jobs_worker": True},
    "jobs.acknowledge_cancel(bigint, text, text, text)": {"jobs_worker": True},
    "jobs.run_detail(bigint)": {"jobs_worker": False, "jobs_operator": True},
    "jobs.reap()": {"jobs_worker": False, "jobs_operator": True},
    "jobs.retry(bigint)": {"jobs_worker": False},
    "jobs.cancel(bigint)": {"jobs_worker": False, "jobs_operator": True},
    (
        "jobs.enqueue(text, jsonb, timestamptz, integer, text, integer, interval, interval,"
        " text, text, text, text, interval, text, bigint[])"
    ): {"jobs_operator": True},
    "jobs.snooze(bigint, text, interval, text)": {"jobs_worker": True, "jobs_reader": False},
    "jobs.unclaim(bigint[], text, text)": {"jobs_worker": True, "jobs_reader": False},
    "jobs.pause_queue(text)": {"jobs_worker": False, "jobs_operator": True},
    "jobs.resume_queue(text)": {"jobs_operator": True},
    "jobs.set_limit(text, text, integer, integer, interval, boolean)": {
        "jobs_worker": False,
        "jobs_operator": True,
    },
    "jobs.remove_limit(text, text)": {"jobs_operator": True},
    (
        "jobs.enqueue_many(text, jsonb, timestamptz, integer, text, text, integer, interval,"
        " interval, bigint[])"
    ): {"jobs_operator": True},
    "jobs._dependency_state(bigint[])": {"jobs_operator": False},
    "jobs._cascade_dependency_failure(bigint[])": {"jobs_operator": False},
    "jobs._enqueue_retries(bigint[], text[])": {"jobs_operator": False},
    "jobs._check_payload(text, jsonb)": {"jobs_operator": False},
}


def test_role_grants(conn: Conn) -> None:
    """The operator has the reader's and the worker's rights, the worker not the reader's;
    private helpers are granted to nobody."""
    wrong = []
    for function, roles in GRANTS.items():
        for role, allowed in roles.items():
            got = scalar(
                conn,
                "SELECT has_function_privilege(%s, %s::regprocedure, 'EXECUTE')",
                (role, function),
            )
            if got is not allowed:
                wrong.append((role, function, f"expected {allowed}, got {got}"))
    assert not wrong, wrong


ORDER = ["pgtick_t_nobody", "pgtick_t_reader", "pgtick_t_worker", "pgtick_t_operator"]
# Who may run each statement: the operator is a reader and a worker; a worker is no reader.
READERS = ("pgtick_t_reader", "pgtick_t_operator")
WORKERS = ("pgtick_t_worker", "pgtick_t_operator")
OPERATORS = ("pgtick_t_operator",)
NOBODY: tuple[str, ...] = ()


MATRIX = [
    ("SELECT count(*) FROM jobs.runs", READERS),
    ("SELECT count(*) FROM jobs.definition_health", READERS),
    ("SELECT count(*) FROM jobs.queue_stats", READERS),
    ("SELECT count(*) FROM jobs.leader", READERS),
    ("SELECT heartbeat_timeout FROM jobs.config", (*READERS, "pgtick_t_worker")),
    ("SELECT id, name, max_concurrent_runs FROM jobs.definitions", (*READERS, "pgtick_t_worker")),
    ("SELECT payload FROM jobs.definitions", READERS),
    ("SELECT scope, name FROM jobs.tight_limits", (*READERS, "pgtick_t_worker")),
    ("SELECT scope, name FROM jobs.limits", (*READERS, "pgtick_t_worker")),
    ("SELECT max_running FROM jobs.limits", READERS),
    ("SELECT count(*) FROM jobs.running", READERS),
    ("SELECT count(*) FROM jobs.get_run(1)", READERS),
    ("SELECT count(*) FROM jobs.claim(1, 'w')", WORKERS),
    ("SELECT count(*) FROM jobs.heartbeat('{1}', 'w')", WORKERS),
    ("SELECT count(*) FROM jobs.hand_back_unheld('{}', 'w')", WORKERS),
    ("SELECT jobs.complete(1, 'w')", WORKERS),
    ("SELECT jobs.fail(1, 'w', '{}', 'm')", WORKERS),
    ("SELECT jobs.acknowledge_cancel(1, 'w')", WORKERS),
    ("SELECT jobs.enqueue('k')", OPERATORS),
    ("SELECT jobs.define('d', 'k', '* * * * *')", OPERATORS),
    ("SELECT jobs.cancel(1)", OPERATORS),
    ("SELECT count(*) FROM jobs.reap()", OPERATORS),
    ("SELECT jobs.prune()", OPERATORS),
    ("SELECT jobs.try_lead('x')", OPERATORS),
    ("SELECT jobs.acquire_lease('l', 'o', '1 minute')", OPERATORS),
    ("UPDATE jobs.config SET retention = '7 days'", OPERATORS),
    ("UPDATE jobs.runs SET status = 'COMPLETED'", NOBODY),
    ("DELETE FROM jobs.runs", NOBODY),
    ("INSERT INTO jobs.runs (kind) VALUES ('k')", NOBODY),
    ("UPDATE jobs.definitions SET enabled = false", NOBODY),
    ("TRUNCATE jobs.runs", NOBODY),
    ("DROP TABLE jobs.leases", NOBODY),
    ("SELECT jobs._notify()", NOBODY),
    ("SELECT * FROM jobs._enqueue_retries('{1}', NULL)", NOBODY),
]


@pytest.mark.parametrize("role", ORDER)
def test_every_role_gets_exactly_its_privileges(db: Database, role: str) -> None:
    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('k')")
    wrong = []
    for sql, roles in MATRIX:
        allowed = role in roles
        with psycopg.connect(db.dsn_as(role), autocommit=True) as conn:
            try:
                with conn.transaction():
                    conn.execute(sql)
                    raise _Rollback  # try it, keep nothing
            except _Rollback:
                got = True
            except psycopg.errors.InsufficientPrivilege:
                got = False
            except psycopg.Error as exc:  # e.g. wrong worker: allowed, but refused by the rules
                got = exc.sqlstate != "42501"
        if got != allowed:
            wrong.append(
                (sql, "allowed" if got else "denied", "expected", "allowed" if allowed else "denied")
            )
    assert wrong == [], f"{role}: {wrong}"


class _Rollback(Exception):
    pass


def test_hostile_search_path_cannot_hijack_functions(db: Database) -> None:
    """A caller shadows built-ins (now, jsonb_typeof, length, hashtextextended,
    pg_advisory_xact_lock, =) in a schema searched before pg_catalog and sets a
    temp table named like ours. The functions must behave exactly as normal."""
    with db.connect() as admin:
        admin.execute(
            """
            CREATE SCHEMA evil;
            GRANT USAGE, CREATE ON SCHEMA evil TO pgtick_t_operator;
            CREATE TABLE evil.calls (fn text);
            GRANT INSERT ON evil.calls TO PUBLIC;
            CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql
                AS $$ INSERT INTO evil.calls VALUES ('now') RETURNING '1970-01-01'::timestamptz $$;
            CREATE FUNCTION evil.jsonb_typeof(jsonb) RETURNS text LANGUAGE sql
                AS $$ INSERT INTO evil.calls VALUES ('jsonb_typeof') RETURNING 'object' $$;
            CREATE FUNCTION evil.length(text) RETURNS integer LANGUAGE sql
                AS $$ INSERT INTO evil.calls VALUES ('length') RETURNING 1 $$;
            CREATE FUNCTION evil.hashtextextended(text, bigint) RETURNS bigint LANGUAGE sql
                AS $$ INSERT INTO evil.calls VALUES ('hashtextextended') RETURNING 1::bigint $$;
            CREATE FUNCTION evil.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE sql
                AS $$ INSERT INTO evil.calls VALUES ('pg_advisory_xact_lock') $$;
            CREATE FUNCTION evil.eq(bigint, bigint) RETURNS boolean LANGUAGE sql
                AS $$ INSERT INTO evil.calls VALUES ('=') RETURNING true $$;
            CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.eq);
            """
        )
        admin.execute(
            "SELECT jobs.define('capped', 'k', run_at => now() + interval '1 day', max_concurrent_runs => 1)"
        )
    with psycopg.connect(db.dsn_as("pgtick_t_operator"), autocommit=True) as conn:
        conn.execute("SET search_path = evil, pg_catalog, public")
        conn.execute("CREATE TEMP TABLE runs (id int)")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="payload"):
            conn.execute("SELECT jobs.enqueue('k', '[1]')")  # the real jsonb_typeof says array
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="kind"):
            conn.execute("SELECT jobs.enqueue(repeat('k', 300))")  # the real length says 300
        run = conn.execute("SELECT id, scheduled_for > '2000-01-01' FROM jobs.run_now('capped')").fetchone()
        second = conn.execute("SELECT id FROM jobs.run_now('capped')").fetchone()
        claimed = conn.execute("SELECT id, worker FROM jobs.claim(10, 'w')").fetchall()
        assert run is not None and second is not None and run[1] is True  # the real now()
        assert [c[0] for c in claimed] == [run[0]], "cap 1 must hold: one of the two runs"
        assert conn.execute("SELECT jobs.complete(%s, 'w')", (run[0],)).fetchone() == (True,)
        assert conn.execute("SELECT jobs.complete(%s, 'w')", (second[0],)).fetchone() == (False,)
        assert conn.execute("SELECT count(*) FROM pg_temp.runs").fetchone() == (0,)
    with db.connect() as admin:
        calls = admin.execute("SELECT fn, count(*) FROM evil.calls GROUP BY 1").fetchall()
    assert calls == [], f"hijacked: {calls}"


def test_no_function_is_public_and_every_one_pins_search_path(conn: Conn) -> None:
    """Every function in schema jobs: not executable by PUBLIC (neither via a NULL acl, which
    means the default grant to PUBLIC, nor an explicit entry), search_path pinned to
    ``pg_catalog, pg_temp`` unless its body is SQL-standard (parsed at creation, so no
    search_path reaches it; pinning would stop its inlining), and then it is private and
    IMMUTABLE; every public (not underscored) one is SECURITY DEFINER."""
    found = conn.execute(
        """
        SELECT p.oid::regprocedure::text,
               has_function_privilege('public', p.oid, 'EXECUTE')
               OR p.proacl IS NULL
               OR EXISTS (SELECT FROM aclexplode(p.proacl) AS a
                           WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'),
               'search_path=pg_catalog, pg_temp' = ANY (coalesce(p.proconfig, '{}'))
               OR (p.prosqlbody IS NOT NULL AND p.provolatile = 'i' AND p.proname LIKE '\\_%%'
                   AND NOT p.prosecdef AND p.proconfig IS NULL),
               p.prosecdef,
               p.proname LIKE '\\_%%'
          FROM pg_proc AS p
         WHERE p.pronamespace = 'jobs'::regnamespace
         ORDER BY 1
        """
    ).fetchall()
    assert len(found) >= 20, f"expected the jobs API, found {[r[0] for r in found]}"
    public = [name for name, is_public, *_ in found if is_public]
    assert not public, f"executable by PUBLIC: {public}"
    unpinned = [name for name, _, pinned, *_ in found if not pinned]
    assert not unpinned, f"functions without search_path pinned to pg_catalog, pg_temp: {unpinned}"
    invoker = [name for name, _, _, definer, private in found if not (definer or private)]
    assert not invoker, f"public functions that are not SECURITY DEFINER: {invoker}"


def test_functions_read_their_literals_alike_whatever_the_callers_standard_conforming_strings(
    db: Database,
) -> None:
    """A PL/pgSQL body is parsed in the session that first calls it: with the caller's
    standard_conforming_strings off (a database or role default), '\\s' would read as 's' and a
    U&'' literal be refused, unless the function pins the setting."""
    with db.connect() as conn:
        conn.execute("SET standard_conforming_strings = off")
        conn.execute("SELECT jobs.define('nightly', 'report', schedule => '0  3 * * *')")
        assert scalar(conn, "SELECT schedule FROM jobs.definitions WHERE name = 'nightly'") == "0  3 * * *"
        expect_error(
            conn,
            "SELECT jobs.enqueue(%s)",
            ("re\u200bport",),
            "22023",
            "U+200B",
        )
        assert scalar(conn, "SHOW standard_conforming_strings") == "off", "the caller's setting is its own"


def test_the_drivers_worker_functions_are_the_worker_roles_grants(conn: Conn) -> None:
    """``pgtick run`` checks a worker login's schema by the functions the worker role may call
    (calls.WORKER_FUNCTIONS): that list and sql/roles.sql's grants to jobs_worker are one set."""
    from pgtick.calls import WORKER_FUNCTIONS

    granted = {
        str(r[0])
        for r in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
            " WHERE p.pronamespace = 'jobs'::regnamespace AND p.proname NOT LIKE '\\_%'"
            " AND has_function_privilege('jobs_worker', p.oid, 'EXECUTE')"
        )
    }
    listed = {signature.replace(" ", "") for signature in WORKER_FUNCTIONS}
    assert listed == granted, (
        f"listed only: {sorted(listed - granted)}; granted only: {sorted(granted - listed)}"
    )


def test_migrating_takes_back_from_pgticks_roles_what_the_release_does_not_grant(conn: Conn) -> None:
    """An earlier release granted jobs_worker columns of jobs.limits it no longer reads (its
    max_running and rate_limit): migrating leaves pgtick's three roles exactly the grants of
    sql/roles.sql, whatever grants a database kept, on columns, tables and functions alike."""
    from pgtick import migrate

    conn.execute("GRANT SELECT (max_running, rate_limit) ON jobs.limits TO jobs_worker")
    conn.execute("GRANT SELECT ON jobs.audit_log TO jobs_worker")
    conn.execute("GRANT INSERT ON jobs.audit_log TO jobs_reader")
    conn.execute("GRANT EXECUTE ON FUNCTION jobs.reap() TO jobs_worker")
    conn.execute("GRANT EXECUTE ON FUNCTION jobs._notify() TO jobs_operator")
    migrate.apply(conn)
    claim = "jobs.claim(integer, text, text[], boolean, text[], text)"
    # (role, privilege, object, column or None) -> whether roles.sql grants it
    expected = {
        ("jobs_worker", "SELECT", "jobs.limits", "max_running"): False,
        ("jobs_worker", "SELECT", "jobs.limits", "rate_limit"): False,
        ("jobs_worker", "SELECT", "jobs.audit_log", None): False,
        ("jobs_reader", "INSERT", "jobs.audit_log", None): False,
        ("jobs_worker", "EXECUTE", "jobs.reap()", None): False,
        ("jobs_operator", "EXECUTE", "jobs._notify()", None): False,
        ("jobs_worker", "SELECT", "jobs.limits", "name"): True,
        ("jobs_worker", "EXECUTE", claim, None): True,
        ("jobs_reader", "SELECT", "jobs.audit_log", None): True,
        ("jobs_operator", "UPDATE", "jobs.config", None): True,
    }
    wrong = []
    for (role, privilege, target, column), granted in expected.items():
        if privilege == "EXECUTE":
            got = scalar(conn, "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, target))
        elif column is not None:
            got = scalar(
                conn, "SELECT has_column_privilege(%s, %s, %s, %s)", (role, target, column, privilege)
            )
        else:
            got = scalar(conn, "SELECT has_table_privilege(%s, %s, %s)", (role, target, privilege))
        if got is not granted:
            wrong.append((role, privilege, target, column, "held" if got else "missing"))
    assert wrong == [], f"after a migration, grants other than roles.sql's: {wrong}"
