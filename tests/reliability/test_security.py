"""Least privilege and hostile search_path.

Every role is logged in as and tried. Every function is SECURITY DEFINER with
search_path pinned to pg_catalog, pg_temp, so objects a caller plants earlier
on their own search_path cannot hijack anything.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from harness import Database

# (statement, lowest role allowed) — roles nest reader < worker < operator.
ORDER = ["pgtick_t_nobody", "pgtick_t_reader", "pgtick_t_worker", "pgtick_t_operator"]
MATRIX = [
    ("SELECT count(*) FROM jobs.runs", "pgtick_t_reader"),
    ("SELECT count(*) FROM jobs.definition_health", "pgtick_t_reader"),
    ("SELECT count(*) FROM jobs.queue_stats", "pgtick_t_reader"),
    ("SELECT count(*) FROM jobs.leader", "pgtick_t_reader"),
    ("SELECT count(*) FROM jobs.claim(1, 'w')", "pgtick_t_worker"),
    ("SELECT count(*) FROM jobs.heartbeat('{1}', 'w')", "pgtick_t_worker"),
    ("SELECT jobs.complete(1, 'w')", "pgtick_t_worker"),
    ("SELECT jobs.fail(1, 'w', '{}', 'm')", "pgtick_t_worker"),
    ("SELECT jobs.acknowledge_cancel(1, 'w')", "pgtick_t_worker"),
    ("SELECT jobs.enqueue('k')", "pgtick_t_operator"),
    ("SELECT jobs.define('d', 'k', '* * * * *')", "pgtick_t_operator"),
    ("SELECT jobs.cancel(1)", "pgtick_t_operator"),
    ("SELECT count(*) FROM jobs.reap()", "pgtick_t_operator"),
    ("SELECT jobs.prune()", "pgtick_t_operator"),
    ("SELECT jobs.try_lead('x')", "pgtick_t_operator"),
    ("SELECT jobs.acquire_lease('l', 'o', '1 minute')", "pgtick_t_operator"),
    ("UPDATE jobs.config SET retention = '7 days'", "pgtick_t_operator"),
    ("UPDATE jobs.runs SET status = 'COMPLETED'", None),
    ("DELETE FROM jobs.runs", None),
    ("INSERT INTO jobs.runs (kind) VALUES ('k')", None),
    ("UPDATE jobs.definitions SET enabled = false", None),
    ("TRUNCATE jobs.runs", None),
    ("DROP TABLE jobs.leases", None),
    ("SELECT jobs._notify()", None),
    ("SELECT * FROM jobs._enqueue_retries('{1}', NULL)", None),
]


@pytest.mark.parametrize("role", ORDER)
def test_every_role_gets_exactly_its_privileges(db: Database, role: str) -> None:
    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('k')")
    rank = ORDER.index(role)
    wrong = []
    for sql, lowest in MATRIX:
        allowed = lowest is not None and rank >= ORDER.index(lowest)
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


def test_no_public_execute_and_every_definer_pins_search_path(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        """
        SELECT p.oid::regprocedure::text, p.prosecdef,
               EXISTS (SELECT FROM unnest(p.proconfig) c WHERE c = 'search_path=pg_catalog, pg_temp'),
               has_function_privilege('public', p.oid, 'EXECUTE')
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'jobs'
        """
    ).fetchall()
    assert rows, "no functions found"
    bad = [r for r in rows if (r[1] and not r[2]) or r[3]]
    assert bad == [], f"definer without pinned search_path, or executable by PUBLIC: {bad}"
    public_api = [r[0] for r in rows if not r[0].startswith("jobs._")]
    assert all(r[1] for r in rows if r[0] in public_api), "every public function is SECURITY DEFINER"
