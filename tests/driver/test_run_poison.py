"""A run whose outcome or input the database or the driver refuses fails alone.

A result the database refuses (NaN, a NUL character, a lone surrogate, too large), one
that is not JSON at all, an error message that cannot be sent (NUL, undecodable bytes)
or cannot even be printed, a payload too deeply nested for the driver to decode, an
interval too large for Python: each ends its run FAILED with a readable message, and
the worker goes on claiming (the next run completes on the same worker). A fault of the
worker itself stops `pgtick run` with a non-zero exit code, and the runs it had claimed
are failed at once instead of waiting for the reaper.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import Conn, Database, Proc, Processes, processes, rows, scalar, wait_for, worker_thread

APP = "poison_app.py"

#: Poison results: what the stored error says after "the result could not be stored: ".
RESULTS = {
    "nan": "ValueError: it holds a float JSON cannot represent (NaN or Infinity)",
    "infinity": "ValueError: it holds a float JSON cannot represent (NaN or Infinity)",
    "nul": "unsupported Unicode escape sequence (\\u0000 cannot be converted to text.)",
    "surrogate": "invalid input syntax for type json (Unicode low surrogate must follow a high surrogate.)",
    "object": "TypeError: Object of type Opaque is not JSON serializable",
    "deep": "RecursionError: maximum recursion depth exceeded while encoding a JSON object",
    "large": "result is larger than jobs.config.max_payload_bytes",
}

#: Error messages that cannot be sent as they are: the readable form stored instead.
ERRORS = {
    "nul": "ValueError: bad\\x00byte",
    "undecodable": "OSError: file \\udcff\\udcfe name",
    "unprintable": "Unprintable: (the error message could not be read: RuntimeError: this error cannot say",
    # Its own class, not SystemExit's, so that its retry policy still matches it.
    "exits-when-printed": "ExitsWhenPrinted: (the error message could not be read: SystemExit: this error",
}


def _finished(conn: Conn, run_id: int) -> dict[str, Any] | None:
    found = rows(
        conn,
        "SELECT id, kind, status::text AS status, failure_reason, error, worker, result"
        " FROM jobs.runs WHERE id = %s AND finished_at IS NOT NULL",
        (run_id,),
    )
    return found[0] if found else None


def _wait_finished(conn: Conn, run_id: int, worker: Proc, timeout: float = 30) -> dict[str, Any]:
    try:
        return wait_for(f"run {run_id} to finish", lambda: _finished(conn, run_id), timeout)
    except AssertionError as exc:
        state = rows(conn, "SELECT id, kind, status::text, error FROM jobs.runs ORDER BY id")
        raise AssertionError(f"{exc}\nruns: {state}\n{worker.tail()}") from None


def _enqueue(conn: Conn, kind: str, payload: dict[str, Any] | str | None = None) -> int:
    text = payload if isinstance(payload, str) else json.dumps(payload or {})
    return int(scalar(conn, "SELECT id FROM jobs.enqueue(%s, %s::jsonb)", (kind, text)))


def _assert_fails_alone(conn: Conn, procs: Processes, poison: int, expected: str) -> None:
    """Run ``poison`` on a one-slot worker: it fails with ``expected`` in its error, and
    a run enqueued after it completes on the same, still living, worker."""
    worker = procs.replica(APP, "worker", "--concurrency", "1", "--no-scheduler")
    worker_id = worker.worker_id
    failed = _wait_finished(conn, poison, worker)
    after = _enqueue(conn, "quick")
    completed = _wait_finished(conn, after, worker)
    context = f"poison run {failed}\nrun after it {completed}\n{worker.tail()}"
    assert failed["status"] == "FAILED" and failed["failure_reason"] == "Error", context
    assert expected in (failed["error"] or ""), f"expected {expected!r} in the error: {context}"
    assert "\x00" not in failed["error"], context
    assert len(failed["error"]) <= 10000, context
    assert failed["worker"] == worker_id, context
    assert completed["status"] == "COMPLETED" and completed["worker"] == worker_id, context
    assert completed["result"] == {"ok": True}, context
    assert worker.popen.poll() is None, f"the worker exited: {context}"


@pytest.mark.parametrize(
    ("kind", "what"), [("returns", w) for w in sorted(RESULTS)] + [("raises", w) for w in sorted(ERRORS)]
)
def test_an_outcome_the_database_refuses_fails_its_run_and_the_worker_goes_on(
    kind: str, what: str, procs: Processes, conn: Conn
) -> None:
    """A poison result, or an error message that cannot be sent as it is."""
    expected = f"the result could not be stored: {RESULTS[what]}" if kind == "returns" else ERRORS[what]
    poison = _enqueue(conn, kind, {"what": what})
    _assert_fails_alone(conn, procs, poison, expected)


def test_a_poison_result_does_not_sink_the_outcomes_reported_with_it(procs: Processes, conn: Conn) -> None:
    """Outcomes finished together are reported together (plain completions in one batch):
    the poison one fails alone."""
    runs = [
        _enqueue(conn, "quick"),
        _enqueue(conn, "returns", {"what": "nan"}),
        _enqueue(conn, "breaks"),  # no result: a plain completion, sent in a batch
        _enqueue(conn, "quick"),
        _enqueue(conn, "breaks"),
    ]
    worker = procs.replica(APP, "worker", "--concurrency", "5", "--no-scheduler")
    ended = [_wait_finished(conn, run_id, worker) for run_id in runs]
    statuses = [r["status"] for r in ended]
    assert statuses == ["COMPLETED", "FAILED", "COMPLETED", "COMPLETED", "COMPLETED"], (
        f"{ended}\n{worker.tail()}"
    )


def test_a_payload_too_deep_for_the_driver_fails_its_run_alone(procs: Processes, conn: Conn) -> None:
    depth = 5000
    payload = '{"deep": ' + "[" * depth + "]" * depth + "}"
    # jobs.enqueue refuses such nesting now; a row written around it (by an older
    # version, or by hand) must still fail alone.
    with conn.transaction():
        poison = _enqueue(conn, "quick")
        conn.execute("UPDATE jobs.runs SET payload = %s::jsonb WHERE id = %s", (payload, poison))
    _assert_fails_alone(conn, procs, poison, "the driver cannot read this run's payload")


def _drop_interval_checks(conn: Conn) -> None:
    """Values written before any range check existed: drop the checks that would refuse them,
    the table's and those of the columns' domains."""
    drops = conn.execute(
        "SELECT format('ALTER TABLE jobs.runs DROP CONSTRAINT %I', c.conname) FROM pg_constraint AS c"
        " WHERE c.conrelid = 'jobs.runs'::regclass AND c.contype = 'c'"
        "   AND pg_get_constraintdef(c.oid) ~ 'timeout'"
        " UNION ALL"
        " SELECT format('ALTER DOMAIN %s DROP CONSTRAINT %I', c.contypid::regtype, c.conname)"
        "   FROM pg_constraint AS c JOIN pg_attribute AS a ON a.atttypid = c.contypid"
        "  WHERE a.attrelid = 'jobs.runs'::regclass AND a.attname ~ 'timeout'"
    ).fetchall()
    for (drop,) in drops:
        conn.execute(drop)


@pytest.mark.parametrize("column", ["timeout", "heartbeat_timeout"])
def test_an_interval_too_large_for_python_fails_its_run_not_its_batch(
    column: str, procs: Processes, conn: Conn
) -> None:
    _drop_interval_checks(conn)
    good = [_enqueue(conn, "quick") for _ in range(2)]
    poison = _enqueue(conn, "quick")
    good.append(_enqueue(conn, "quick"))
    conn.execute(f"UPDATE jobs.runs SET {column} = interval '100000000 years' WHERE id = %s", (poison,))
    # One claim takes all four: the poison run sits in the middle of the batch.
    worker = procs.replica(APP, "worker", "--concurrency", "4", "--no-scheduler")
    worker_id = worker.worker_id
    failed = _wait_finished(conn, poison, worker)
    others = [_wait_finished(conn, run_id, worker) for run_id in good]
    after = _enqueue(conn, "quick")
    completed = _wait_finished(conn, after, worker)
    alive = worker.popen.poll() is None
    context = f"poison {failed}\nbatch {others}\nafter {completed}\n{worker.tail()}"
    assert failed["status"] == "FAILED", context
    assert f"the driver cannot read this run's {column}" in failed["error"], context
    assert all(r["status"] == "COMPLETED" and r["worker"] == worker_id for r in others), context
    assert completed["status"] == "COMPLETED" and completed["worker"] == worker_id, context
    assert alive, context


def test_a_time_the_driver_cannot_read_fails_its_run_alone(procs: Processes, conn: Conn) -> None:
    poison = _enqueue(conn, "quick")
    conn.execute("UPDATE jobs.runs SET scheduled_for = '0044-03-15 BC' WHERE id = %s", (poison,))
    _assert_fails_alone(conn, procs, poison, "the driver cannot read this run's scheduled_for")


def _assert_keeps_claiming(conn: Conn, procs: Processes, what: str) -> None:
    worker = procs.replica(APP, "worker", "--concurrency", "1", "--no-scheduler")
    worker_id = worker.worker_id
    run_id = _enqueue(conn, "quick")
    completed = _wait_finished(conn, run_id, worker)
    context = f"{what}: {completed}\n{worker.tail()}"
    assert completed["status"] == "COMPLETED" and completed["worker"] == worker_id, context


def test_a_queued_run_due_beyond_year_9999_does_not_stop_claiming(procs: Processes, conn: Conn) -> None:
    """jobs.next_due answers with that run's time, which Python cannot hold."""
    later = int(scalar(conn, "SELECT id FROM jobs.enqueue('quick', run_at => now() + interval '1 day')"))
    conn.execute("UPDATE jobs.runs SET scheduled_for = '20000-01-01 00:00Z' WHERE id = %s", (later,))
    _assert_keeps_claiming(conn, procs, "a run due in the year 20000")


def test_a_default_heartbeat_timeout_too_large_for_python_does_not_stop_claiming(
    procs: Processes, conn: Conn
) -> None:
    for (name,) in conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'jobs.config'::regclass AND contype = 'c'"
        " AND pg_get_constraintdef(oid) ~ 'heartbeat_timeout'"
    ).fetchall():
        conn.execute(f'ALTER TABLE jobs.config DROP CONSTRAINT "{name}"')
    conn.execute("ALTER TABLE jobs.config DISABLE TRIGGER USER")  # the bounds check on UPDATE
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = interval '100000000 years'")
    _assert_keeps_claiming(conn, procs, "jobs.config.heartbeat_timeout of 100000000 years")


def test_a_hook_that_fails_around_one_run_fails_that_run(
    monkeypatch: pytest.MonkeyPatch, procs: Processes, conn: Conn
) -> None:
    monkeypatch.setenv("PGTICK_TEST_BROKEN_HOOK", "1")
    poison = _enqueue(conn, "hooked")
    expected = "the worker could not run the job: RuntimeError: the execution hook is broken"
    _assert_fails_alone(conn, procs, poison, expected)


def test_a_fault_of_the_worker_itself_exits_non_zero_and_fails_its_claimed_runs(
    monkeypatch: pytest.MonkeyPatch, procs: Processes, conn: Conn
) -> None:
    monkeypatch.setenv("PGTICK_TEST_BROKEN_HOOK", "1")
    claimed = [_enqueue(conn, "quick"), _enqueue(conn, "breaks"), _enqueue(conn, "quick")]
    worker = procs.replica(APP, "worker", "--concurrency", "3", "--no-scheduler", grace="60s")
    code = worker.wait(timeout=60)
    runs = rows(
        conn,
        "SELECT id, status::text AS status, failure_reason, error FROM jobs.runs ORDER BY id",
    )
    tail = worker.tail()
    context = f"exit code {code}\nruns {runs}\n{tail}"
    assert code == 1, context
    assert [r["id"] for r in runs] == claimed, context
    for r in runs:
        assert r["status"] == "FAILED" and r["failure_reason"] == "Error", context
        assert "the worker stopped on an internal error" in r["error"], context
        assert "the claim hook is broken" in r["error"], context
    assert "the claim hook is broken" in tail, context


def test_a_worker_whose_own_arguments_are_refused_stops_with_the_databases_message(
    db: Database, tmp_path: Path
) -> None:
    """jobs.claim refuses more than 1000 queues: retrying the same call cannot help, so a
    worker given them through the Python API stops and raises the database's message rather
    than living on without claiming; `pgtick run` refuses them before it starts (one line,
    exit 2)."""
    import psycopg

    from pgtick.app import App
    from pgtick.worker import Worker

    queues = [f"q{i}" for i in range(1001)]
    app = App("refused-arguments")
    app.job("k")(lambda ctx: None)
    worker = Worker(app, db.dsn, queues=queues, listen=False, poll_interval=0.1, shutdown_grace=1)
    with worker_thread(worker, may_raise=True) as running:
        running.thread.join(timeout=60)
    raised = running.raised
    assert not running.thread.is_alive(), "the worker lived on after the database refused its arguments"
    assert len(raised) == 1 and isinstance(raised[0], psycopg.Error), raised
    assert "queues must hold 1 to 1000" in str(raised[0]), raised
    with processes(tmp_path, db.dsn) as procs:
        replica = procs.replica(APP, "worker", "--no-scheduler", "--queues", ",".join(queues))
        code = replica.wait(timeout=60)
        tail = replica.tail()
    assert code == 2, f"exit code {code}\n{tail}"
    assert "--queues: must list at most 1000 queue names" in tail and "Traceback" not in tail, tail
