"""A dashboard test database: schedules across DST changes, runs of every status, a retry
chain, a definition at its cap, and hostile text in names, payloads and errors.

Everything goes through the SQL API (define, enqueue, run_now, claim, complete, fail,
cancel, retry) as a worker and an operator would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg.types.json import Jsonb

HOSTILE_NAME = '<script>alert("definition")</script>'
HOSTILE_PAYLOAD = "<script>alert('payload')</script>"
HOSTILE_ERROR = '<img src=x onerror=alert("error")>'
WORKER = "seed-worker"


@dataclass
class Seeded:
    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int
    chain: list[int]  # a retry chain, first attempt first (last one QUEUED)
    hostile_run: int  # FAILED, with the hostile payload and error
    capped_running: int
    capped_waiting: int
    failed_batch: list[int]  # FAILED runs of kind "batch", none retried


def pages(s: Seeded) -> list[str]:
    """Every page of the dashboard, with the seed's definitions and runs in their queries."""
    return [
        "/",
        "/definitions",
        "/definition?name=capped",
        "/definition?name=berlin-sunday-0230",
        "/definition?" + urlencode({"name": HOSTILE_NAME}),
        "/preview",
        "/preview?" + urlencode({"schedule": "30 2 * 3,10 0", "tz": "Europe/Berlin", "after": "2027-03-01"}),
        "/runs",
        "/runs?status=FAILED",
        "/runs?kind=batch&status=FAILED&since=2000-01-01T00:00Z&until=2100-01-01",
        "/runs?definition=capped",
        "/runs?queue=default",
        f"/runs?before={s.failed_batch[0]}",
        f"/runs/{s.chain[1]}",
        f"/runs/{s.hostile_run}",
        f"/runs/{s.running}",
        "/running",
        "/audit",
        "/login",
        "/static/app.js",
        "/static/style.css",
    ]


def _one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def _claim(conn: psycopg.Connection[Any], kind: str) -> int:
    return int(_one(conn, "SELECT id FROM jobs.claim(1, %s, ARRAY[%s], true)", WORKER, kind))


def _fail(conn: psycopg.Connection[Any], run_id: int, message: str) -> None:
    conn.execute(
        "SELECT jobs.fail(%s, %s, ARRAY['RuntimeError', 'Exception'], %s)", (run_id, WORKER, message)
    )


def seed(conn: psycopg.Connection[Any]) -> Seeded:
    """Seed an empty, migrated database (autocommit connection)."""
    define = (
        "SELECT jobs.define(name => %s, kind => %s, schedule => %s, timezone => %s, "
        "max_concurrent_runs => %s, payload => %s)"
    )
    # DST: 02:30 on Sundays in March and October. Berlin's last Sunday of March has no 02:30,
    # its last Sunday of October has two; New York's second Sunday of March has none.
    conn.execute(define, ("berlin-sunday-0230", "report", "30 2 * 3,10 0", "Europe/Berlin", None, Jsonb({})))
    conn.execute(define, ("ny-sunday-0230", "report", "30 2 * 3 0", "America/New_York", None, Jsonb({})))
    conn.execute(
        define,
        (
            "sofia-weekday-0900",
            "report",
            "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0",
            "Europe/Sofia",
            None,
            Jsonb({"team": "sofia"}),
        ),
    )
    conn.execute(define, ("capped", "slow", "0 * * * *", "UTC", 1, Jsonb({})))
    conn.execute(define, (HOSTILE_NAME, "hostile", "0 0 * * *", "UTC", None, Jsonb({"x": HOSTILE_PAYLOAD})))
    conn.execute("SELECT jobs.set_retry_policy('flaky', max_attempts => 5, backoff_initial => '1 hour')")

    completed = int(_one(conn, "SELECT id FROM jobs.enqueue('report', %s)", Jsonb({"n": 1})))
    assert _claim(conn, "report") == completed
    conn.execute("SELECT jobs.complete(%s, %s, %s)", (completed, WORKER, Jsonb({"rows": 42})))

    # A retry chain: attempt 1 and 2 failed by policy, attempt 3 waits for its backoff.
    first = int(_one(conn, "SELECT id FROM jobs.enqueue('flaky', %s)", Jsonb({"n": 2})))
    chain = [first]
    assert _claim(conn, "flaky") == first
    _fail(conn, first, "upstream did not answer")
    second = int(_one(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", first))
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = %s", (second,))
    assert _claim(conn, "flaky") == second
    _fail(conn, second, "upstream did not answer again")
    chain += [second, int(_one(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", second))]

    hostile = int(_one(conn, "SELECT id FROM jobs.enqueue('hostile', %s)", Jsonb({"x": HOSTILE_PAYLOAD})))
    assert _claim(conn, "hostile") == hostile
    _fail(conn, hostile, HOSTILE_ERROR)

    failed_batch = []
    for i in range(3):
        run_id = int(_one(conn, "SELECT id FROM jobs.enqueue('batch', %s)", Jsonb({"i": i})))
        assert _claim(conn, "batch") == run_id
        _fail(conn, run_id, f"batch item {i} failed")
        failed_batch.append(run_id)

    cancelled = int(
        _one(conn, "SELECT id FROM jobs.enqueue('report', %s, now() + interval '1 day')", Jsonb({}))
    )
    conn.execute("SELECT jobs.cancel(%s)", (cancelled,))

    running = int(_one(conn, "SELECT id FROM jobs.enqueue('long-import', %s)", Jsonb({"steps": 20})))
    assert _claim(conn, "long-import") == running

    capped_running = int(_one(conn, "SELECT id FROM jobs.run_now('capped')"))
    assert _claim(conn, "slow") == capped_running
    capped_waiting = int(_one(conn, "SELECT id FROM jobs.run_now('capped')"))

    queued = int(
        _one(conn, "SELECT id FROM jobs.enqueue('report', %s, now() + interval '1 hour')", Jsonb({}))
    )
    return Seeded(
        queued=queued,
        running=running,
        completed=completed,
        failed=first,
        cancelled=cancelled,
        chain=chain,
        hostile_run=hostile,
        capped_running=capped_running,
        capped_waiting=capped_waiting,
        failed_batch=failed_batch,
    )


def history(conn: psycopg.Connection[Any], runs: int, *, span: str = "1 hour", definitions: int = 0) -> None:
    """Insert `runs` finished runs spread evenly over the last `span` (one statement):
    1 in 20 FAILED, 1 in 200 lost (HeartbeatLost), the rest COMPLETED, started 0-5 s late.
    With `definitions`, also define that many hourly schedules and spread the runs over them."""
    for n in range(definitions):
        conn.execute(
            "SELECT jobs.define(%s, 'report', %s, %s)",
            (f"history-{n:04d}", f"{n % 60} * * * *", ("UTC", "Europe/Berlin", "America/New_York")[n % 3]),
        )
    conn.execute(
        """
        INSERT INTO jobs.runs (kind, payload, status, scheduled_for, created_at, started_at, heartbeat_at,
                               finished_at, worker, origin, failure_reason, error, result, definition_id)
        SELECT (ARRAY['report', 'sync', 'email', 'thumbnail'])[1 + i %% 4],
               jsonb_build_object('i', i),
               CASE WHEN i %% 20 = 0 OR i %% 200 = 7 THEN 'FAILED' ELSE 'COMPLETED' END::jobs.run_status,
               f - interval '3 seconds' - late, f - interval '1 minute', f - interval '3 seconds',
               f - interval '1 second', f, 'history-worker', 'manual',
               CASE WHEN i %% 20 = 0 THEN 'Error' WHEN i %% 200 = 7 THEN 'HeartbeatLost' END,
               CASE WHEN i %% 20 = 0 THEN 'TimeoutError: upstream took too long'
                    WHEN i %% 200 = 7 THEN 'no heartbeat for 60s' END,
               CASE WHEN i %% 20 = 0 OR i %% 200 = 7 THEN NULL ELSE '{"ok": true}'::jsonb END,
               (SELECT d.id FROM jobs.definitions AS d
                 WHERE d.name = 'history-' || lpad((i %% greatest(%(definitions)s, 1))::text, 4, '0')
                   AND %(definitions)s > 0)
          FROM generate_series(1, %(runs)s) AS i
         CROSS JOIN LATERAL (
             SELECT now() - %(span)s::interval * (i::float8 / %(runs)s) AS f,
                    make_interval(secs => (i %% 50) / 10.0) AS late
         ) AS t
        """,
        {"runs": runs, "span": span, "definitions": definitions},
    )
