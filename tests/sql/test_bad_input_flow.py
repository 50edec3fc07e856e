"""Bad input to the flow-control API (queues, limits, unique jobs, enqueue_many, snooze,
dependencies): refused with SQLSTATE class 22, 23 or P0 and a message naming the field, and
nothing changed (runs, definitions, limits and paused queues are the same afterwards)."""

from __future__ import annotations

from typing import Any

import pytest

from harness import Conn, add_runs, digest, expect_error

INVALID = "22023"
NOT_FOUND = "P0002"

# (call, params, SQLSTATE, word the message must contain)
CASES: list[tuple[str, tuple[Any, ...] | None, str, str]] = [
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


def _digest(conn: Conn) -> dict[str, Any]:
    out = digest(conn)
    for table in ("limits", "paused_queues"):
        out[table] = conn.execute(
            "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM jobs.{table} AS t"
        ).fetchone()
    return out


def test_flow_control_bad_input_is_refused_by_name_and_changes_nothing(conn: Conn) -> None:
    conn.execute("SELECT jobs.set_limit('queue', 'x', max_running => 7)")
    conn.execute("SELECT jobs.pause_queue('held')")
    queued, running = add_runs(conn, 2)
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() + interval '1 day' WHERE id = %s", (queued,))
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(running,)]
    ids: dict[str, Any] = {"RUNNING": running, "QUEUED+missing": [queued, 987654321]}
    wrong: list[str] = []
    for sql, params, sqlstate, mention in CASES:
        assert sqlstate[:2] in ("22", "23", "P0")
        bound = None if params is None else tuple(ids.get(p, p) if isinstance(p, str) else p for p in params)
        before = _digest(conn)
        try:
            expect_error(conn, sql, bound, sqlstate, mention)
        except AssertionError as exc:  # collect them all: one run shows every gap
            wrong.append(str(exc).splitlines()[0][:300])
        except pytest.fail.Exception as exc:
            wrong.append(f"{sql}: did not raise ({exc})"[:300])
        if _digest(conn) != before:
            wrong.append(f"{sql}: changed the database")
    assert not wrong, "\n".join(wrong)
