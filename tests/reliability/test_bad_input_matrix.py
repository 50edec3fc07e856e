"""The bad input matrix: through SQL and through the CLI.

Every row: a clear SQLSTATE (22023 invalid parameter, P0002 not found) and a
message naming the field; nothing changed. Injection attempts are data, never code.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from harness import Database
from pgtick.app import App, Context
from pgtick.worker import Worker

INJECTION = "x'); DROP TABLE jobs.runs; --"


def counts(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs.runs), (SELECT count(*) FROM jobs.definitions),"
        " (SELECT count(*) FROM jobs.leases), (SELECT count(*) FROM jobs.retry_policies),"
        " (SELECT string_agg(status::text || coalesce(worker, ''), ',' ORDER BY id) FROM jobs.runs)"
    ).fetchone()
    assert row is not None
    return tuple(row)


MATRIX: list[tuple[str, str, dict[str, Any], str, str]] = [
    # (label, sql, params, sqlstate, fragment of the message)
    ("null kind", "SELECT jobs.enqueue(NULL)", {}, "22023", "kind"),
    ("empty kind", "SELECT jobs.enqueue('')", {}, "22023", "kind"),
    ("huge kind", "SELECT jobs.enqueue(repeat('k', 201))", {}, "22023", "kind"),
    (
        "huge payload",
        "SELECT jobs.enqueue('k', jsonb_build_object('a', repeat('x', 2000000)))",
        {},
        "22023",
        "payload",
    ),
    ("array payload", "SELECT jobs.enqueue('k', '[1, 2]')", {}, "22023", "payload"),
    ("null payload", "SELECT jobs.enqueue('k', NULL)", {}, "22023", "payload"),
    ("infinite run_at", "SELECT jobs.enqueue('k', run_at => 'infinity')", {}, "22023", "run_at"),
    ("-infinite run_at", "SELECT jobs.enqueue('k', run_at => '-infinity')", {}, "22023", "run_at"),
    ("null run_at", "SELECT jobs.enqueue('k', run_at => NULL)", {}, "22023", "run_at"),
    ("priority", "SELECT jobs.enqueue('k', priority => 100000)", {}, "22023", "priority"),
    ("zero timeout", "SELECT jobs.enqueue('k', timeout => '0')", {}, "22023", "timeout"),
    ("negative timeout", "SELECT jobs.enqueue('k', timeout => '-1 second')", {}, "22023", "timeout"),
    (
        "negative heartbeat_timeout",
        "SELECT jobs.enqueue('k', heartbeat_timeout => '-5 minutes')",
        {},
        "22023",
        "heartbeat_timeout",
    ),
    ("zero attempts", "SELECT jobs.enqueue('k', max_attempts => 0)", {}, "22023", "max_attempts"),
    ("batch 0", "SELECT * FROM jobs.claim(0)", {}, "22023", "batch_size"),
    ("batch 1001", "SELECT * FROM jobs.claim(1001)", {}, "22023", "batch_size"),
    ("batch null", "SELECT * FROM jobs.claim(NULL)", {}, "22023", "batch_size"),
    ("heartbeat null ids", "SELECT * FROM jobs.heartbeat(NULL, 'w')", {}, "22023", "run_ids"),
    ("heartbeat null worker", "SELECT * FROM jobs.heartbeat('{1}', NULL)", {}, "22023", "worker"),
    ("complete null run", "SELECT jobs.complete(NULL, 'w')", {}, "22023", "run_id"),
    ("complete negative run", "SELECT jobs.complete(-1, 'w')", {}, "22023", "run_id"),
    ("fail bad reason", "SELECT jobs.fail(1, 'w', '{}', 'm', 'Oops')", {}, "22023", "reason"),
    ("fail null class", "SELECT jobs.fail(1, 'w', ARRAY[NULL]::text[], 'm')", {}, "22023", "error_classes"),
    ("cancel null", "SELECT jobs.cancel(NULL)", {}, "22023", "run_id"),
    ("cancel unknown", "SELECT jobs.cancel(987654321)", {}, "P0002", "987654321"),
    ("retry unknown", "SELECT jobs.retry(987654321)", {}, "P0002", "987654321"),
    ("run_now unknown", "SELECT jobs.run_now('nope')", {}, "P0002", "nope"),
    ("pause unknown", "SELECT jobs.pause(%(n)s)", {"n": INJECTION}, "P0002", "DROP TABLE"),
    ("define null name", "SELECT jobs.define(NULL, 'k', '* * * * *')", {}, "22023", "name"),
    (
        "define bad zone",
        "SELECT jobs.define('d', 'k', '* * * * *', %(z)s)",
        {"z": INJECTION},
        "22023",
        "timezone",
    ),
    ("define year 10000", "SELECT jobs.define('d', 'k', run_at => 'infinity')", {}, "22023", "run_at"),
    ("lease zero ttl", "SELECT jobs.acquire_lease('l', 'o', '0')", {}, "22023", "ttl"),
    ("lease negative ttl", "SELECT jobs.acquire_lease('l', 'o', '-1 minute')", {}, "22023", "ttl"),
    ("lease null owner", "SELECT jobs.acquire_lease('l', NULL, '1 minute')", {}, "22023", "owner"),
    ("prune negative", "SELECT jobs.prune('-1 day')", {}, "22023", "older_than"),
    ("prune batch 0", "SELECT jobs.prune('1 day', 0)", {}, "22023", "batch_size"),
    ("materialize null", "SELECT jobs.materialize(NULL, NULL, '{}', NULL)", {}, "22023", "definition_id"),
    ("one-shots negative", "SELECT jobs.materialize_one_shots('-1 s')", {}, "22023", "lookahead"),
]


@pytest.mark.parametrize(
    ("label", "sql", "params", "sqlstate", "fragment"), MATRIX, ids=[m[0] for m in MATRIX]
)
def test_sql_bad_input(
    conn: psycopg.Connection[Any], label: str, sql: str, params: dict[str, Any], sqlstate: str, fragment: str
) -> None:
    conn.execute("SELECT jobs.enqueue('seed')")
    before = counts(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, params)
    assert info.value.sqlstate == sqlstate, f"{label}: {info.value.sqlstate} {info.value}"
    assert fragment in str(info.value), f"{label}: message does not name {fragment!r}: {info.value}"
    assert counts(conn) == before, f"{label} changed something"


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
    far = conn.execute("SELECT scheduled_for FROM jobs.enqueue('k', run_at => '9999-12-31 23:59:59+00')")
    assert far.fetchone() is not None
    conn.execute("SELECT jobs.define('far', 'k', run_at => '9999-12-31 00:00+00')")
    assert conn.execute("SELECT jobs.materialize_one_shots()").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM jobs.claim(10)").fetchone() == (0,)
    past = conn.execute("SELECT id FROM jobs.enqueue('k', run_at => '1970-01-01 00:00+00')").fetchone()
    claimed = conn.execute("SELECT id FROM jobs.claim(10, 'w')").fetchall()
    assert past is not None and [r[0] for r in claimed] == [past[0]]


def cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtick.cli", *args[:1], "--dsn", db.dsn, *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )


CLI_MATRIX = [
    ("define", "x", "k", "--schedule", "* * * * * *"),  # six fields
    ("define", "x", "k", "--schedule", "FREQ=DAILY;BYHOUR=99"),
    ("define", "x", "k", "--schedule", "* * * * *", "--tz", "Nowhere/Land"),
    ("define", "x", "k", "--run-at", "tomorrow"),
    ("define", "x", "k", "--schedule", "* * * * *", "--cap", "0"),
    ("define", "x", "k", "--schedule", "* * * * *", "--timeout", "-5s"),
    ("enqueue", "k", "--payload", "[1]"),
    ("enqueue", "k", "--payload", "{not json"),
    ("enqueue", "k", "--run-at", "infinity"),
    ("enqueue", "", "--payload", "{}"),
    ("run-now", INJECTION),
    ("cancel", "-5"),
    ("retry", "123456789"),
    ("runs", "--limit", "0"),
]


@pytest.mark.parametrize("args", CLI_MATRIX, ids=[" ".join(a)[:40] for a in CLI_MATRIX])
def test_cli_bad_input(db: Database, args: tuple[str, ...]) -> None:
    with db.connect() as conn:
        before = counts(conn)
    result = cli(db, *args)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in result.stderr, result.stderr
    with db.connect() as conn:
        assert counts(conn) == before


def test_unknown_kind_waits_visibly_and_crashes_nothing(db: Database) -> None:
    """A run whose kind no worker knows stays QUEUED (no worker claims kinds it
    does not have) and shows in jobs.queue_stats with a growing oldest age."""
    app = App()
    done = threading.Event()

    @app.job("known")
    def known(ctx: Context) -> None:
        done.set()

    with db.connect() as conn:
        orphan = conn.execute("SELECT id FROM jobs.enqueue('nobody-knows-me')").fetchone()
        conn.execute("SELECT jobs.enqueue('known')")
    worker = Worker(app, db.dsn, poll_interval=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        assert done.wait(10)
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=10)
    with db.connect() as conn:
        status = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", orphan).fetchone()
        stats = conn.execute(
            "SELECT queued, oldest_queued_age > interval '0' FROM jobs.queue_stats"
            " WHERE kind = 'nobody-knows-me'"
        ).fetchone()
    assert status == ("QUEUED",)
    assert stats == (1, True)
