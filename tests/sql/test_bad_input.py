"""Bad input: every public call, the flow-control API (queues, limits, unique jobs,
enqueue_many, snooze, dependencies) included, refuses it with a SQLSTATE (class 22, 23 or P0)
and a message naming the field, and never half-applies (the database is byte-for-byte the same
afterwards: runs, definitions, policies, config, leases, limits and paused queues)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from harness import Conn, add_definition, add_runs, digest, expect_error, scalar

BIG = 1_100_000  # characters: a payload over the default 1 MiB jobs.config.max_payload_bytes
INVALID = "22023"
NOT_FOUND = "P0002"
INJECTION = "x'); DROP TABLE jobs.runs; --"

# (call, params, SQLSTATE, word the message must contain)
CASES: list[tuple[str, tuple[Any, ...] | None, str, str]] = [
    # jobs.enqueue
    ("SELECT jobs.enqueue(NULL)", None, INVALID, "kind"),
    ("SELECT jobs.enqueue('')", None, INVALID, "kind"),
    ("SELECT jobs.enqueue(repeat('k', 201))", None, INVALID, "kind"),
    ("SELECT jobs.enqueue('k', NULL)", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', '[1, 2]')", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', '\"text\"')", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', '42')", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', 'null'::jsonb)", None, INVALID, "payload"),
    (
        "SELECT jobs.enqueue('k', jsonb_build_object('x', repeat('a', %s)))",
        (BIG,),
        INVALID,
        "max_payload_bytes",
    ),
    ("SELECT jobs.enqueue('k', run_at => 'infinity')", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue('k', run_at => '-infinity')", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue('k', run_at => NULL)", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue('k', priority => 1001)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue('k', priority => -1001)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue('k', priority => NULL)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue('k', idempotency_key => '')", None, INVALID, "idempotency_key"),
    ("SELECT jobs.enqueue('k', idempotency_key => repeat('x', 201))", None, INVALID, "idempotency_key"),
    ("SELECT jobs.enqueue('k', max_attempts => 0)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue('k', max_attempts => -1)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue('k', max_attempts => 1001)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue('k', timeout => '-1 second')", None, INVALID, "timeout"),
    ("SELECT jobs.enqueue('k', timeout => '0')", None, INVALID, "timeout"),
    ("SELECT jobs.enqueue('k', heartbeat_timeout => '-5 minutes')", None, INVALID, "heartbeat_timeout"),
    # jobs.run_now
    ("SELECT jobs.run_now(NULL)", None, INVALID, "name"),
    ("SELECT jobs.run_now('no-such-definition')", None, NOT_FOUND, "no-such-definition"),
    ("SELECT jobs.run_now('defined', '[]')", None, INVALID, "payload"),
    # jobs.claim
    ("SELECT * FROM jobs.claim(0)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(-1)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(1001)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(NULL)", None, INVALID, "batch_size"),
    ("SELECT * FROM jobs.claim(1, '')", None, INVALID, "worker"),
    ("SELECT * FROM jobs.claim(1, repeat('w', 201))", None, INVALID, "worker"),
    # jobs.heartbeat
    ("SELECT * FROM jobs.heartbeat(NULL, 'w1')", None, INVALID, "run_ids"),
    ("SELECT * FROM jobs.heartbeat('{1}', NULL)", None, INVALID, "worker"),
    ("SELECT * FROM jobs.heartbeat('{1}', '')", None, INVALID, "worker"),
    (
        "SELECT * FROM jobs.heartbeat(array(SELECT generate_series(1, 10001)::bigint), 'w1')",
        None,
        INVALID,
        "run_ids",
    ),
    # jobs.complete / complete_many
    ("SELECT jobs.complete(NULL, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.complete(0, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.complete(-7, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.complete(%s, NULL)", ("RUNNING",), INVALID, "worker"),
    ("SELECT jobs.complete(%s, '')", ("RUNNING",), INVALID, "worker"),
    (
        "SELECT jobs.complete(%s, 'w1', jsonb_build_object('x', repeat('a', %s)))",
        ("RUNNING", BIG),
        INVALID,
        "result",
    ),
    ("SELECT * FROM jobs.complete_many(NULL, 'w1')", None, INVALID, "run_ids"),
    ("SELECT * FROM jobs.complete_many(%s, NULL)", ("RUNNING[]",), INVALID, "worker"),
    # jobs.fail
    ("SELECT jobs.fail(NULL, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.fail(-1, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.fail(%s, NULL)", ("RUNNING",), INVALID, "worker"),
    ("SELECT jobs.fail(%s, 'w1', '{}', 'm', 'Bogus')", ("RUNNING",), INVALID, "reason"),
    ("SELECT jobs.fail(%s, 'w1', '{}', 'm', NULL)", ("RUNNING",), INVALID, "reason"),
    ("SELECT jobs.fail(%s, 'w1', '{}', 'm', 'HeartbeatLost')", ("RUNNING",), INVALID, "reason"),
    ("SELECT jobs.fail(%s, 'w1', ARRAY['E', NULL])", ("RUNNING",), INVALID, "error_classes"),
    ("SELECT jobs.fail(%s, 'w1', ARRAY[''])", ("RUNNING",), INVALID, "error_classes"),
    (
        "SELECT jobs.fail(%s, 'w1', array(SELECT 'E' || g FROM generate_series(1, 101) g))",
        ("RUNNING",),
        INVALID,
        "error_classes",
    ),
    # jobs.acknowledge_cancel
    ("SELECT jobs.acknowledge_cancel(NULL, 'w1')", None, INVALID, "run_id"),
    ("SELECT jobs.acknowledge_cancel(%s, NULL)", ("RUNNING",), INVALID, "worker"),
    # jobs.cancel / cancel_queued
    ("SELECT jobs.cancel(NULL)", None, INVALID, "run_id"),
    ("SELECT jobs.cancel(987654321)", None, NOT_FOUND, "987654321"),
    ("SELECT jobs.cancel(-1)", None, NOT_FOUND, "-1"),
    ("SELECT jobs.cancel_queued('no-such-definition')", None, NOT_FOUND, "no-such-definition"),
    # jobs.retry
    ("SELECT jobs.retry(NULL)", None, INVALID, "run_id"),
    ("SELECT jobs.retry(987654321)", None, NOT_FOUND, "987654321"),
    ("SELECT jobs.retry(%s)", ("QUEUED",), INVALID, "QUEUED"),
    ("SELECT jobs.retry(%s)", ("RUNNING",), INVALID, "RUNNING"),
    # jobs.set_retry_policy
    ("SELECT jobs.set_retry_policy(NULL)", None, INVALID, "kind"),
    ("SELECT jobs.set_retry_policy('k', max_attempts => 0)", None, INVALID, "max_attempts"),
    ("SELECT jobs.set_retry_policy('k', max_attempts => NULL)", None, INVALID, "max_attempts"),
    ("SELECT jobs.set_retry_policy('k', backoff_initial => '-1 second')", None, INVALID, "backoff_initial"),
    ("SELECT jobs.set_retry_policy('k', backoff_max => NULL)", None, INVALID, "backoff_max"),
    ("SELECT jobs.set_retry_policy('k', backoff_factor => 0.5)", None, INVALID, "backoff_factor"),
    ("SELECT jobs.set_retry_policy('k', backoff_factor => 'NaN')", None, INVALID, "backoff_factor"),
    ("SELECT jobs.set_retry_policy('k', backoff_factor => 'Infinity')", None, INVALID, "backoff_factor"),
    ("SELECT jobs.set_retry_policy('k', jitter => 1.5)", None, INVALID, "jitter"),
    ("SELECT jobs.set_retry_policy('k', jitter => -0.1)", None, INVALID, "jitter"),
    ("SELECT jobs.set_retry_policy('k', jitter => 'NaN')", None, INVALID, "jitter"),
    # validation comes before the lookup: these name runs that do not exist
    ("SELECT jobs.fail(1, 'w', '{}', 'm', 'Oops')", None, INVALID, "reason"),
    ("SELECT jobs.fail(1, 'w', ARRAY[NULL]::text[], 'm')", None, INVALID, "error_classes"),
    # more limits
    ("SELECT jobs.enqueue('k', jsonb_build_object('a', repeat('x', 2000000)))", None, INVALID, "payload"),
    ("SELECT jobs.enqueue('k', priority => 100000)", None, INVALID, "priority"),
    # jobs.define / pause (an injection attempt is only a name that is not there)
    ("SELECT jobs.define(NULL, 'k', '* * * * *')", None, INVALID, "name"),
    ("SELECT jobs.define('d', 'k', '* * * * *', %s)", (INJECTION,), INVALID, "timezone"),
    ("SELECT jobs.define('d', 'k', run_at => 'infinity')", None, INVALID, "run_at"),
    ("SELECT jobs.pause(%s)", (INJECTION,), NOT_FOUND, "DROP TABLE"),
    # jobs.acquire_lease
    ("SELECT jobs.acquire_lease('l', 'o', '0')", None, INVALID, "ttl"),
    ("SELECT jobs.acquire_lease('l', 'o', '-1 minute')", None, INVALID, "ttl"),
    ("SELECT jobs.acquire_lease('l', NULL, '1 minute')", None, INVALID, "owner"),
    # jobs.prune
    ("SELECT jobs.prune('-1 day')", None, INVALID, "older_than"),
    ("SELECT jobs.prune('1 day', 0)", None, INVALID, "batch_size"),
    # jobs.materialize / materialize_one_shots
    ("SELECT jobs.materialize(NULL, NULL, '{}', NULL)", None, INVALID, "definition_id"),
    ("SELECT jobs.materialize_one_shots('-1 s')", None, INVALID, "lookahead"),
    # --- flow control: queues, limits, unique jobs, enqueue_many, snooze, dependencies ---
    # jobs.enqueue: queue, concurrency_key, unique_*, on_conflict, depends_on
    ("SELECT jobs.enqueue('k', queue => NULL)", None, INVALID, "queue"),
    ("SELECT jobs.enqueue('k', queue => '')", None, INVALID, "queue"),
    ("SELECT jobs.enqueue('k', queue => repeat('q', 201))", None, INVALID, "queue"),
    ("SELECT jobs.enqueue('k', concurrency_key => '')", None, INVALID, "concurrency_key"),
    ("SELECT jobs.enqueue('k', concurrency_key => repeat('c', 201))", None, INVALID, "concurrency_key"),
    ("SELECT jobs.enqueue('k', unique_key => '')", None, INVALID, "unique_key"),
    ("SELECT jobs.enqueue('k', unique_key => repeat('u', 201))", None, INVALID, "unique_key"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', unique_while => 'forever')", None, INVALID, "unique_while"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', unique_while => NULL)", None, INVALID, "unique_while"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', unique_for => '-1 hour')", None, INVALID, "unique_for"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', unique_for => '0')", None, INVALID, "unique_for"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', on_conflict => 'merge')", None, INVALID, "on_conflict"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', on_conflict => NULL)", None, INVALID, "on_conflict"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', idempotency_key => 'i')", None, INVALID, "unique_key"),
    ("SELECT jobs.enqueue('k', depends_on => '{}')", None, INVALID, "depends_on"),
    ("SELECT jobs.enqueue('k', depends_on => ARRAY[NULL]::bigint[])", None, INVALID, "depends_on"),
    ("SELECT jobs.enqueue('k', depends_on => ARRAY[987654321]::bigint[])", None, NOT_FOUND, "depends_on"),
    ("SELECT jobs.enqueue('k', depends_on => %s)", ("QUEUED+missing",), NOT_FOUND, "987654321"),
    # jobs.enqueue_many
    ("SELECT jobs.enqueue_many(NULL, '[{}]')", None, INVALID, "kind"),
    ("SELECT jobs.enqueue_many('k', NULL)", None, INVALID, "payloads"),
    ("SELECT jobs.enqueue_many('k', '{}')", None, INVALID, "payloads"),
    ("SELECT jobs.enqueue_many('k', '[]')", None, INVALID, "payloads"),
    ("SELECT jobs.enqueue_many('k', '[{}, 1]')", None, INVALID, "payloads[1]"),
    ("SELECT jobs.enqueue_many('k', '[{}]', run_at => 'infinity')", None, INVALID, "run_at"),
    ("SELECT jobs.enqueue_many('k', '[{}]', priority => 5000)", None, INVALID, "priority"),
    ("SELECT jobs.enqueue_many('k', '[{}]', queue => '')", None, INVALID, "queue"),
    ("SELECT jobs.enqueue_many('k', '[{}]', concurrency_key => '')", None, INVALID, "concurrency_key"),
    ("SELECT jobs.enqueue_many('k', '[{}]', max_attempts => 0)", None, INVALID, "max_attempts"),
    ("SELECT jobs.enqueue_many('k', '[{}]', timeout => '0')", None, INVALID, "timeout"),
    (
        "SELECT jobs.enqueue_many('k', '[{}]', depends_on => ARRAY[987654321]::bigint[])",
        None,
        NOT_FOUND,
        "depends_on",
    ),
    # jobs.claim(queues => ...)
    ("SELECT * FROM jobs.claim(1, 'w', queues => '{}')", None, INVALID, "queues"),
    ("SELECT * FROM jobs.claim(1, 'w', queues => ARRAY[NULL]::text[])", None, INVALID, "queues"),
    ("SELECT * FROM jobs.claim(1, 'w', queues => ARRAY[''])", None, INVALID, "queues"),
    # jobs.pause_queue / jobs.resume_queue
    ("SELECT jobs.pause_queue(NULL)", None, INVALID, "name"),
    ("SELECT jobs.pause_queue('')", None, INVALID, "name"),
    ("SELECT jobs.resume_queue(repeat('q', 201))", None, INVALID, "name"),
    # jobs.set_limit / jobs.remove_limit
    ("SELECT jobs.set_limit('tenant', 'x', max_running => 1)", None, INVALID, "scope"),
    ("SELECT jobs.set_limit(NULL, 'x', max_running => 1)", None, INVALID, "scope"),
    ("SELECT jobs.set_limit('queue', '', max_running => 1)", None, INVALID, "name"),
    ("SELECT jobs.set_limit('queue', NULL, max_running => 1)", None, INVALID, "name"),
    ("SELECT jobs.set_limit('queue', 'x', max_running => 0)", None, INVALID, "max_running"),
    ("SELECT jobs.set_limit('queue', 'x', max_running => -3)", None, INVALID, "max_running"),
    ("SELECT jobs.set_limit('queue', 'x')", None, INVALID, "max_running"),
    (
        "SELECT jobs.set_limit('queue', 'x', rate_limit => 0, rate_period => '1 s')",
        None,
        INVALID,
        "rate_limit",
    ),
    ("SELECT jobs.set_limit('queue', 'x', rate_limit => 5)", None, INVALID, "rate_period"),
    ("SELECT jobs.set_limit('queue', 'x', rate_period => '1 s')", None, INVALID, "rate_limit"),
    (
        "SELECT jobs.set_limit('queue', 'x', rate_limit => 5, rate_period => '0')",
        None,
        INVALID,
        "rate_period",
    ),
    (
        "SELECT jobs.set_limit('queue', 'x', rate_limit => 5, rate_period => '2 days')",
        None,
        INVALID,
        "rate_period",
    ),
    ("SELECT jobs.set_limit('queue', 'x', max_running => 1, per_key => NULL)", None, INVALID, "per_key"),
    ("SELECT jobs.remove_limit('tenant', 'x')", None, INVALID, "scope"),
    ("SELECT jobs.remove_limit('kind', '')", None, INVALID, "name"),
    # jobs.snooze
    ("SELECT jobs.snooze(NULL, 'w1', '1 minute')", None, INVALID, "run_id"),
    ("SELECT jobs.snooze(%s, NULL, '1 minute')", ("RUNNING",), INVALID, "worker"),
    ("SELECT jobs.snooze(%s, 'w1', NULL)", ("RUNNING",), INVALID, "delay"),
    ("SELECT jobs.snooze(%s, 'w1', '-1 minute')", ("RUNNING",), INVALID, "delay"),
    ("SELECT jobs.snooze(%s, 'w1', '400 days')", ("RUNNING",), INVALID, "delay"),
    # jobs.define: queue, concurrency_key
    ("SELECT jobs.define('d', 'k', run_at => now(), queue => '')", None, INVALID, "queue"),
    (
        "SELECT jobs.define('d', 'k', run_at => now(), concurrency_key => '')",
        None,
        INVALID,
        "concurrency_key",
    ),
]


def _label(sql: str, params: tuple[Any, ...] | None) -> str:
    call = sql.removeprefix("SELECT ").removeprefix("* FROM ").removeprefix("jobs.")
    if params:
        call += " % " + ",".join(str(p)[:12] for p in params)
    return call[:90]


def _seed(conn: Conn) -> dict[str, Any]:
    """One run in each interesting state, a definition, a policy, a limit, a paused queue."""
    add_definition(conn, "defined", cap=2)
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3)")
    conn.execute("SELECT jobs.set_limit('queue', 'x', max_running => 7)")
    conn.execute("SELECT jobs.pause_queue('held')")
    queued, running = add_runs(conn, 2)
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() + interval '1 day' WHERE id = %s", (queued,))
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(running,)]
    return {
        "QUEUED": queued,
        "RUNNING": running,
        "RUNNING[]": [running],
        "QUEUED+missing": [queued, 987654321],
    }


@pytest.mark.parametrize(
    ("sql", "params", "sqlstate", "mention"), CASES, ids=[_label(c[0], c[1]) for c in CASES]
)
def test_bad_input_is_refused_by_name_and_changes_nothing(
    conn: Conn, sql: str, params: tuple[Any, ...] | None, sqlstate: str, mention: str
) -> None:
    assert sqlstate[:2] in ("22", "23", "P0"), sqlstate
    ids = _seed(conn)
    bound = None if params is None else tuple(ids.get(p, p) if isinstance(p, str) else p for p in params)
    before = digest(conn)
    expect_error(conn, sql, bound, sqlstate, mention)
    assert digest(conn) == before, f"{sql}: changed the database"


def test_payload_limit_follows_config(conn: Conn) -> None:
    """max_payload_bytes is read at call time: lower it and a modest payload is refused."""
    conn.execute("UPDATE jobs.config SET max_payload_bytes = 100")
    before = digest(conn)
    expect_error(
        conn, "SELECT jobs.enqueue('k', jsonb_build_object('x', repeat('a', 200)))", None, INVALID, "payload"
    )
    assert digest(conn) == before
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', '{\"x\": 1}')") is not None


def test_wrong_worker_and_unknown_ids_are_no_ops(conn: Conn) -> None:
    """Not errors: fencing answers. complete/fail/acknowledge with the wrong worker or an unknown
    id say no (false / NULL / empty) and change nothing."""
    ids = _seed(conn)
    running = ids["RUNNING"]
    before = digest(conn)
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2')", (running,)) is False
    assert scalar(conn, "SELECT jobs.complete(987654321, 'w1')") is False
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (ids["QUEUED"],)) is False
    assert scalar(conn, "SELECT (jobs.fail(%s, 'w2')).id IS NULL", (running,)) is True
    assert scalar(conn, "SELECT (jobs.fail(987654321, 'w1')).id IS NULL") is True
    assert conn.execute("SELECT * FROM jobs.heartbeat(%s, 'w2')", ([running],)).fetchall() == []
    assert conn.execute("SELECT * FROM jobs.heartbeat('{987654321}', 'w1')").fetchall() == []
    assert conn.execute("SELECT * FROM jobs.heartbeat('{}', 'w1')").fetchall() == []
    assert conn.execute("SELECT * FROM jobs.complete_many(%s, 'w2')", ([running],)).fetchall() == []
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w2')", (running,)) is False
    assert digest(conn) == before


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_claim_refuses_snapshot_isolation(conn: Conn, isolation: str) -> None:
    """claim needs a fresh snapshot per step: under REPEATABLE READ / SERIALIZABLE it raises
    25000 instead of silently counting RUNNING rows from a stale snapshot."""
    add_runs(conn, 3)
    before = digest(conn)
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        conn.execute("SELECT * FROM jobs.claim(1, 'w1')")
    assert info.value.sqlstate == "25000", info.value
    assert "READ COMMITTED" in str(info.value)
    assert digest(conn) == before


def test_injection_attempts_are_stored_as_data(conn: psycopg.Connection[Any]) -> None:
    payload = '{"k\\"ey\'); DROP TABLE jobs.runs; --": "v"}'
    run = conn.execute("SELECT id, kind FROM jobs.enqueue(%s, %s::jsonb)", (INJECTION, payload)).fetchone()
    assert run is not None and run[1] == INJECTION
    conn.execute("SELECT jobs.define(%s, %s, '* * * * *')", (INJECTION, INJECTION))
    conn.execute("SELECT jobs.pause(%s)", (INJECTION,))
    assert conn.execute(
        "SELECT jobs.acquire_lease(%s, %s, '1 minute')", (INJECTION, INJECTION)
    ).fetchone() == (True,)
    row = conn.execute("SELECT payload FROM jobs.runs WHERE id = %s", (run[0],)).fetchone()
    assert row is not None and list(row[0]) == ["k\"ey'); DROP TABLE jobs.runs; --"]
    assert conn.execute("SELECT count(*) FROM jobs.definitions WHERE name = %s", (INJECTION,)).fetchone() == (
        1,
    )
    assert conn.execute("SELECT to_regclass('jobs.runs') IS NOT NULL").fetchone() == (True,)


def test_extreme_but_valid_timestamps(conn: psycopg.Connection[Any]) -> None:
    far = conn.execute("SELECT scheduled_for FROM jobs.enqueue('k', run_at => '9999-12-30 23:59:59+00')")
    assert far.fetchone() is not None
    conn.execute("SELECT jobs.define('far', 'k', run_at => '9999-12-30 00:00+00')")
    assert conn.execute("SELECT jobs.materialize_one_shots()").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM jobs.claim(10)").fetchone() == (0,)
    past = conn.execute("SELECT id FROM jobs.enqueue('k', run_at => '0001-01-02 00:00+00')").fetchone()
    claimed = conn.execute("SELECT id FROM jobs.claim(10, 'w')").fetchall()
    assert past is not None and [r[0] for r in claimed] == [past[0]]
