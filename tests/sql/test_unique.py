"""Unique jobs (jobs.enqueue unique_key / unique_while / unique_for / on_conflict), the
per-kind idempotency key, jobs.enqueue_many and jobs.snooze."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from harness import (
    BlockedCall,
    Conn,
    Database,
    digest,
    expect_error,
    gated,
    race,
    run_row,
    scalar,
    spring_forward_zone,
)


def _enqueue(conn: Conn, sql_args: str, params: tuple[Any, ...] = ()) -> dict[str, Any]:
    row_id = int(scalar(conn, f"SELECT id FROM jobs.enqueue({sql_args})", params))
    return run_row(conn, row_id)


def _enqueue_with_key(dsn: str, i: int) -> int:
    with gated(dsn) as conn:
        with conn.transaction():  # hold the transaction open a moment after the enqueue
            run_id = int(
                scalar(
                    conn,
                    "SELECT id FROM jobs.enqueue('sync', jsonb_build_object('i', %s::int),"
                    " unique_key => 'account-7')",
                    (i,),
                )
            )
            conn.execute("SELECT pg_sleep(0.05)")
        return run_id


def test_concurrent_enqueues_with_one_unique_key_give_one_run(db: Database, conn: Conn) -> None:
    """Invariant: 8 processes enqueueing the same unique key at once, each in a transaction
    that commits a moment later, all get the same run, and only one row exists."""
    n = 8
    ids = race(db.dsn, _enqueue_with_key, [(db.dsn, i) for i in range(n)])
    rows = conn.execute("SELECT id FROM jobs.runs WHERE unique_key = 'account-7'").fetchall()
    assert len(rows) == 1, f"{len(rows)} runs for one unique key: {rows}"
    assert set(ids) == {rows[0][0]}, f"callers got {ids}, the run is {rows[0][0]}"


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_unique_enqueue_needs_read_committed(db: Database, conn: Conn, level: str) -> None:
    """Its check for an existing run reads after waiting for the key's lock; a snapshot taken
    before another enqueue of the key committed would miss that run and add a second (and
    SERIALIZABLE does not see the conflict with a READ COMMITTED enqueue)."""
    with psycopg.connect(db.dsn, autocommit=True) as other:
        other.execute(f"BEGIN ISOLATION LEVEL {level}")
        other.execute("SELECT count(*) FROM jobs.runs")  # the snapshot is taken
        first = _enqueue(conn, "'sync', unique_key => 'account-7'")
        sql = "SELECT jobs.enqueue('sync', unique_key => 'account-7')"
        expect_error(other, sql, None, "25000", "unique_key", "needs READ COMMITTED", level)
        other.execute("ROLLBACK")
        other.execute(f"BEGIN ISOLATION LEVEL {level}")
        plain = int(scalar(other, "SELECT id FROM jobs.enqueue('sync')"))  # no key: nothing to miss
        other.execute("COMMIT")
    keyed = conn.execute("SELECT id FROM jobs.runs WHERE unique_key = 'account-7'").fetchall()
    assert keyed == [(first["id"],)], f"one run for the key: {keyed}"
    assert run_row(conn, plain)["status"] == "QUEUED"


def test_ignore_returns_the_existing_run_unchanged(conn: Conn) -> None:
    first = _enqueue(conn, "'k', '{\"v\": 1}', unique_key => 'u'")
    second = _enqueue(conn, "'k', '{\"v\": 2}', unique_key => 'u'")
    assert second["id"] == first["id"] and second["payload"] == {"v": 1}
    # Another kind with the same key is another job.
    other = _enqueue(conn, "'k2', unique_key => 'u'")
    assert other["id"] != first["id"]


@pytest.mark.parametrize(
    ("on_conflict", "first_at", "second_at", "payload"),
    [
        pytest.param("replace", "1 hour", "2 hours", {"v": 2}, id="replace-updates-payload-and-time"),
        pytest.param("debounce", "1 minute", "5 minutes", {"v": 1}, id="debounce-moves-only-the-time"),
    ],
)
def test_a_conflict_with_a_queued_run_moves_its_time(
    conn: Conn, on_conflict: str, first_at: str, second_at: str, payload: dict[str, int]
) -> None:
    """replace takes the new payload and time, debounce only the time; one run either way."""
    first = _enqueue(conn, f"'k', '{{\"v\": 1}}', run_at => now() + interval '{first_at}', unique_key => 'u'")
    second = _enqueue(
        conn,
        f"'k', '{{\"v\": 2}}', run_at => now() + interval '{second_at}', unique_key => 'u',"
        f" on_conflict => '{on_conflict}'",
    )
    assert second["id"] == first["id"], (first, second)
    assert second["payload"] == payload, (first, second)
    assert second["scheduled_for"] > first["scheduled_for"], (first, second)
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1


@pytest.mark.parametrize("on_conflict", ["replace", "debounce"])
def test_a_conflict_that_moves_a_run_earlier_wakes_the_workers(
    db: Database, conn: Conn, on_conflict: str
) -> None:
    _enqueue(conn, "'k', run_at => now() + interval '1 hour', unique_key => 'u'")
    with db.connect() as listener:
        listener.execute("LISTEN jobs")
        _enqueue(conn, f"'k', unique_key => 'u', on_conflict => '{on_conflict}'")
        notes = list(listener.notifies(timeout=10.0, stop_after=1))
    assert len(notes) == 1, f"{on_conflict}: a worker sleeping until the old time was not woken"


def test_replace_leaves_a_running_run_alone(conn: Conn) -> None:
    first = _enqueue(conn, "'k', '{\"v\": 1}', run_at => now() - interval '1 s', unique_key => 'u'")
    conn.execute("SELECT jobs.claim(1, 'w')")
    second = _enqueue(conn, "'k', '{\"v\": 2}', unique_key => 'u', on_conflict => 'replace'")
    assert second["id"] == first["id"] and second["payload"] == {"v": 1} and second["status"] == "RUNNING"


@pytest.mark.parametrize("key_state", ["no-run-of-the-key", "a-queued-run-of-the-key"])
def test_replace_refuses_depends_on_whatever_the_keys_state(conn: Conn, key_state: str) -> None:
    """Invariant: a payload never runs before the runs its enqueue named complete. A replace
    keeps what the queued run waits on, so it refuses depends_on, with or without a run of the
    key, and changes nothing: neither the new payload nor anything else becomes claimable."""
    prep = _enqueue(conn, "'prep', run_at => now() + interval '1 hour'")["id"]
    if key_state == "a-queued-run-of-the-key":
        _enqueue(conn, "'k', '{\"v\": \"old\"}', run_at => now() - interval '1 s', unique_key => 'u'")
    before = digest(conn)
    expect_error(
        conn,
        "SELECT jobs.enqueue('k', '{\"v\": \"after prep\"}', run_at => now() - interval '1 s',"
        " unique_key => 'u', on_conflict => 'replace', depends_on => ARRAY[%s]::bigint[])",
        (prep,),
        "22023",
        "depends_on",
        "replace",
    )
    assert digest(conn) == before, f"{key_state}: a refused replace changed rows"
    claimed = conn.execute("SELECT id, payload FROM jobs.claim(10, 'w', kinds => '{k}')").fetchall()
    started = [row for row in claimed if row[1] == {"v": "after prep"}]
    assert started == [], f"{key_state}: started {started} while run {prep} it depends on is QUEUED"


_BAD_DEPENDS_ON = [
    pytest.param("ARRAY[987654321]::bigint[]", "P0002", id="a-run-that-does-not-exist"),
    pytest.param("ARRAY[NULL]::bigint[]", "22023", id="a-NULL-id"),
    pytest.param("'{}'::bigint[]", "22023", id="an-empty-list"),
]


@pytest.mark.parametrize("on_conflict", ["ignore", "replace", "debounce"])
@pytest.mark.parametrize(("depends_on", "sqlstate"), _BAD_DEPENDS_ON)
def test_a_bad_depends_on_fails_alike_whatever_the_keys_state(
    conn: Conn, depends_on: str, sqlstate: str, on_conflict: str
) -> None:
    """Invariant: arguments are checked before the key is looked up, so a bad depends_on is
    refused with the same SQLSTATE whether the key has no run, a QUEUED one or a RUNNING one,
    and the call changes nothing (no payload replaced, no time moved)."""
    _enqueue(conn, "'k', '{\"v\": 1}', run_at => now() - interval '1 s', unique_key => 'running'")
    conn.execute("SELECT jobs.claim(1, 'w')")
    _enqueue(conn, "'k', '{\"v\": 1}', run_at => now() + interval '1 hour', unique_key => 'queued'")
    before = digest(conn)
    for key in ["fresh", "queued", "running"]:
        expect_error(
            conn,
            f"SELECT jobs.enqueue('k', '{{\"v\": 2}}', unique_key => '{key}',"
            f" on_conflict => '{on_conflict}', depends_on => {depends_on})",
            None,
            sqlstate,
            "depends_on",
        )
        assert digest(conn) == before, f"key {key!r}, {on_conflict}: the refused call changed rows"


@pytest.mark.parametrize(("depends_on", "sqlstate"), _BAD_DEPENDS_ON)
def test_a_bad_depends_on_fails_alike_whatever_the_idempotency_keys_state(
    conn: Conn, depends_on: str, sqlstate: str
) -> None:
    _enqueue(conn, "'k', idempotency_key => 'taken'")
    before = digest(conn)
    for key in ["fresh", "taken"]:
        expect_error(
            conn,
            f"SELECT jobs.enqueue('k', idempotency_key => '{key}', depends_on => {depends_on})",
            None,
            sqlstate,
            "depends_on",
        )
        assert digest(conn) == before, f"idempotency key {key!r}: the refused call changed rows"


def test_active_lets_a_new_run_in_after_completion_and_ever_does_not(conn: Conn) -> None:
    a = _enqueue(conn, "'k', run_at => now() - interval '1 s', unique_key => 'a'")
    e = _enqueue(conn, "'k', run_at => now() - interval '1 s', unique_key => 'e', unique_while => 'ever'")
    conn.execute("SELECT jobs.claim(10, 'w')")
    conn.execute("SELECT jobs.complete_many(ARRAY[%s, %s]::bigint[], 'w')", (a["id"], e["id"]))
    a2 = _enqueue(conn, "'k', unique_key => 'a'")
    e2 = _enqueue(conn, "'k', unique_key => 'e', unique_while => 'ever'")
    assert a2["id"] != a["id"], "active: a completed run must not block a new one"
    assert e2["id"] == e["id"], "ever: a completed run must still count"


def _queued_of_key(conn: Conn, key: str) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM jobs.runs WHERE unique_key = %s AND status = 'QUEUED' ORDER BY id", (key,)
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_queued_lets_a_new_run_in_while_one_is_running(conn: Conn) -> None:
    q = _enqueue(
        conn,
        "'k', run_at => now() - interval '1 s', unique_key => 'q', unique_while => 'queued',"
        " max_attempts => 3",
    )
    assert _enqueue(conn, "'k', unique_key => 'q', unique_while => 'queued'")["id"] == q["id"]
    conn.execute("SELECT jobs.claim(1, 'w')")
    newer = _enqueue(conn, "'k', unique_key => 'q', unique_while => 'queued'")
    assert newer["id"] != q["id"]
    assert _queued_of_key(conn, "q") == [newer["id"]]


def test_a_retry_folds_into_the_queued_run_of_its_key(conn: Conn) -> None:
    """Invariant: one QUEUED run per unique key while one is queued. The running run fails with
    a retry left while a newer run of its key waits: as an enqueue of the key would, the retry
    folds into the queued run, which does the job (once); the failed run's error names it, and
    a repeat of the failure (its answer lost) gets the same answer."""
    q = _enqueue(
        conn,
        "'k', run_at => now() - interval '1 s', unique_key => 'q', unique_while => 'queued',"
        " max_attempts => 3",
    )
    conn.execute("SELECT jobs.claim(1, 'w')")
    newer = _enqueue(conn, "'k', '{\"v\": 2}', unique_key => 'q', unique_while => 'queued'")
    fail = "SELECT id, status::text, error FROM jobs.fail(%s, 'w', '{RuntimeError}', 'boom')"
    answer = conn.execute(fail, (q["id"],)).fetchone()
    assert answer is not None and answer[:2] == (q["id"], "FAILED"), answer
    assert answer[2].startswith("boom") and f"run {newer['id']}" in answer[2], answer[2]
    assert _queued_of_key(conn, "q") == [newer["id"]], "a second QUEUED run of the key"
    assert run_row(conn, newer["id"])["payload"] == {"v": 2}, "the queued run keeps its payload"
    assert conn.execute(fail, (q["id"],)).fetchone() == answer, "a repeat of the failure"


def test_a_snooze_folds_into_the_queued_run_of_its_key(conn: Conn) -> None:
    """A running run of a key snoozes while a newer run of its key waits: it does not go back to
    the queue beside it; it ends CANCELLED naming the run that does the key's job."""
    q = _enqueue(conn, "'k', run_at => now() - interval '1 s', unique_key => 'q', unique_while => 'queued'")
    conn.execute("SELECT jobs.claim(1, 'w')")
    newer = _enqueue(conn, "'k', unique_key => 'q', unique_while => 'queued'")
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '1 minute')", (q["id"],)) is True
    after = run_row(conn, q["id"])
    assert after["status"] == "CANCELLED" and f"run {newer['id']}" in after["error"], after
    assert _queued_of_key(conn, "q") == [newer["id"]]
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '1 minute')", (q["id"],)) is False  # fenced now


def test_a_run_others_wait_on_keeps_its_own_retry_and_snooze(conn: Conn) -> None:
    """Runs that depend on a run wait for its chain's outcome: its retry (or snooze) is its
    own, even beside a queued run of its key, and they keep waiting."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3)")
    ids = {}
    for name in ("failing", "snoozing"):
        ids[name] = _enqueue(
            conn, f"'k', run_at => now() - interval '1 s', unique_key => '{name}', unique_while => 'queued'"
        )["id"]
    dependents = {
        name: int(
            scalar(conn, "SELECT id FROM jobs.enqueue('after', depends_on => ARRAY[%s]::bigint[])", (i,))
        )
        for name, i in ids.items()
    }
    assert len(conn.execute("SELECT jobs.claim(2, 'w', '{k}')").fetchall()) == 2
    for name in ids:
        conn.execute("SELECT jobs.enqueue('k', unique_key => %s, unique_while => 'queued')", (name,))
    retry = scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{RuntimeError}', 'boom')", (ids["failing"],))
    assert retry != ids["failing"]
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '0 seconds')", (ids["snoozing"],)) is True
    assert len(_queued_of_key(conn, "failing")) == 2 and retry in _queued_of_key(conn, "failing")
    assert ids["snoozing"] in _queued_of_key(conn, "snoozing")
    for name, d in dependents.items():
        row = run_row(conn, d)
        assert (row["status"], row["blocked"]) == ("QUEUED", True), (name, row)


def test_several_retries_of_one_key_from_one_reap_leave_one_queued_run(conn: Conn) -> None:
    """Two runs of one key (unique_while queued lets a second start while the first runs) lost
    with their worker: the reap queues one retry of the key, and the other failed run names it."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3)")
    first = _enqueue(
        conn, "'k', run_at => now() - interval '1 s', unique_key => 'q', unique_while => 'queued'"
    )
    conn.execute("SELECT jobs.claim(1, 'w')")
    second = _enqueue(
        conn, "'k', run_at => now() - interval '1 s', unique_key => 'q', unique_while => 'queued'"
    )
    conn.execute("SELECT jobs.claim(1, 'w')")
    reaped = conn.execute("SELECT run_id, retry_run_id FROM jobs.reap_worker('w') ORDER BY run_id").fetchall()
    assert [r[0] for r in reaped] == [first["id"], second["id"]], reaped
    retries = [r[1] for r in reaped if r[1] is not None]
    assert len(retries) == 1 and _queued_of_key(conn, "q") == retries, (reaped, _queued_of_key(conn, "q"))
    folded = next(r[0] for r in reaped if r[1] is None)
    assert f"run {retries[0]}" in run_row(conn, folded)["error"]


def test_unique_for_limits_the_window(conn: Conn) -> None:
    old = _enqueue(conn, "'k', unique_key => 'w', unique_while => 'ever'")
    conn.execute("UPDATE jobs.runs SET created_at = now() - interval '2 hours' WHERE id = %s", (old["id"],))
    same = _enqueue(conn, "'k', unique_key => 'w', unique_while => 'ever'")
    assert same["id"] == old["id"]
    fresh = _enqueue(conn, "'k', unique_key => 'w', unique_while => 'ever', unique_for => '1 hour'")
    assert fresh["id"] != old["id"]


def test_unique_for_is_elapsed_time_whatever_the_sessions_time_zone(conn: Conn) -> None:
    """A run of the key created 23 hours 30 minutes ago is within unique_for '1 day' for every
    caller. In a session whose zone sprang forward during that day, now() - interval '1 day'
    is only 23 hours back: read that way, the run fell out of the window and a second run of
    the key was queued beside it."""
    first = _enqueue(conn, "'k', unique_key => 'daily', unique_while => 'ever'")
    conn.execute(
        "UPDATE jobs.runs SET created_at = now() - interval '23 hours 30 minutes' WHERE id = %s",
        (first["id"],),
    )
    zone = spring_forward_zone(conn)
    conn.execute(f"SET TIME ZONE '{zone}'")
    again = _enqueue(conn, "'k', unique_key => 'daily', unique_while => 'ever', unique_for => '1 day'")
    queued = conn.execute("SELECT id FROM jobs.runs WHERE unique_key = 'daily' ORDER BY id").fetchall()
    assert again["id"] == first["id"] and queued == [(first["id"],)], (
        f"zone {zone}: enqueue returned run {again['id']}; runs of the key {queued}"
    )
    # 24 hours and more back is out of the window, in any zone.
    conn.execute(
        "UPDATE jobs.runs SET created_at = now() - interval '24 hours 1 second' WHERE id = %s", (first["id"],)
    )
    conn.execute("SET TIME ZONE 'UTC'")
    fresh = _enqueue(conn, "'k', unique_key => 'daily', unique_while => 'ever', unique_for => '1 day'")
    assert fresh["id"] != first["id"]


def test_idempotency_key_is_per_kind(conn: Conn) -> None:
    a = _enqueue(conn, "'k1', idempotency_key => 'x'")
    assert _enqueue(conn, "'k1', idempotency_key => 'x'")["id"] == a["id"]
    b = _enqueue(conn, "'k2', idempotency_key => 'x'")
    assert b["id"] != a["id"]


def test_an_operator_retry_never_makes_a_second_active_run_of_a_key(conn: Conn) -> None:
    """Run A of key sync:42 failed for good; an enqueue of the key then queued run B. Retrying
    A (jobs.retry) while B is queued or running would do the job twice: refused, naming B.
    jobs.retry_many passes such a run over, and of two failed runs of one key queues one
    retry. Once B finished, A can be retried."""
    a = _enqueue(conn, "'sync', unique_key => '42'")["id"]
    conn.execute(
        "UPDATE jobs.runs SET status = 'FAILED', finished_at = now(), failure_reason = 'Error' WHERE id = %s",
        (a,),
    )
    b = _enqueue(conn, "'sync', unique_key => '42'")["id"]
    assert b != a, "A failed for good: the key is free"
    expect_error(conn, "SELECT jobs.retry(%s)", (a,), "22023", f"run {a} has unique_key '42'", f"run {b}")
    assert conn.execute("SELECT id FROM jobs.retry_many(ARRAY[%s]::bigint[])", (a,)).fetchall() == []
    conn.execute(
        "UPDATE jobs.runs SET status = 'FAILED', finished_at = now(), failure_reason = 'Error' WHERE id = %s",
        (b,),
    )
    retried = [r[0] for r in conn.execute("SELECT id FROM jobs.retry_many(ARRAY[%s, %s]::bigint[])", (a, b))]
    active = scalar(
        conn,
        "SELECT array_agg(id) FROM jobs.runs WHERE unique_key = '42' AND status IN ('QUEUED', 'RUNNING')",
    )
    assert len(retried) == 1 and active == retried, (
        f"retry_many queued {retried}; active runs of the key {active}"
    )
    conn.execute(
        "UPDATE jobs.runs SET status = 'COMPLETED', finished_at = now() WHERE id = %s", (retried[0],)
    )
    other = b if retried == [scalar(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", (a,))] else a
    assert scalar(conn, "SELECT retry_of FROM jobs.retry(%s)", (other,)) == other


def test_enqueue_many_inserts_in_order_with_one_notify(db: Database, conn: Conn) -> None:
    with db.connect() as listener:
        listener.execute("LISTEN jobs")
        rows = conn.execute(
            "SELECT id, payload, queue, concurrency_key FROM jobs.enqueue_many('bulk',"
            " '[{\"n\": 1}, {\"n\": 2}, {\"n\": 3}]', queue => 'b', concurrency_key => 't')"
        ).fetchall()
        assert [r[1] for r in rows] == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert {(r[2], r[3]) for r in rows} == {("b", "t")}
        assert [r[0] for r in rows] == sorted(r[0] for r in rows)
        notes = list(listener.notifies(timeout=1.0, stop_after=5))
    assert len(notes) == 1, f"{len(notes)} notifications for one enqueue_many"


def test_snooze_requeues_the_same_attempt_later_and_is_fenced(conn: Conn) -> None:
    run = _enqueue(conn, "'k', run_at => now() - interval '1 s'")
    conn.execute("SELECT jobs.claim(1, 'w')")
    assert scalar(conn, "SELECT jobs.snooze(%s, 'intruder', '1 minute')", (run["id"],)) is False
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '1 minute')", (run["id"],)) is True
    after = run_row(conn, run["id"])
    assert (after["status"], after["attempt"], after["worker"], after["started_at"]) == (
        "QUEUED",
        1,
        None,
        None,
    )
    assert after["scheduled_for"] > run["scheduled_for"]
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w')").fetchall() == []  # not due yet
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '1 minute')", (run["id"],)) is False  # not RUNNING
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (run["id"],)) is False
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = %s", (run["id"],))
    assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'w2')")] == [run["id"]]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2')", (run["id"],)) is True


def test_snooze_delays_by_elapsed_time_whatever_the_sessions_time_zone(conn: Conn) -> None:
    """A run snoozed for a day is due 24 hours on for every caller. In a session whose zone
    springs forward within that day, now() + interval '1 day' is only 23 hours on: read that
    way, the run came back an hour early."""
    run = _enqueue(conn, "'k', run_at => now() - interval '1 s'")
    conn.execute("SELECT jobs.claim(1, 'w')")
    zone = spring_forward_zone(conn, ahead=True)
    conn.execute(f"SET TIME ZONE '{zone}'")
    with conn.transaction():  # one now() for both
        assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '1 day')", (run["id"],)) is True
        delay = scalar(conn, "SELECT scheduled_for - now() FROM jobs.runs WHERE id = %s", (run["id"],))
    assert delay == timedelta(hours=24), f"zone {zone}: snoozed for {delay}"


_OVERDUE = "UPDATE jobs.runs SET started_at = now() - interval '1 minute' WHERE id = %s"


@pytest.mark.parametrize("failure", ["fail", "reap"])
def test_an_enqueue_that_waits_for_a_holder_to_fail_gets_its_retry_not_a_second_run(
    db: Database, conn: Conn, failure: str
) -> None:
    """Invariant: while a run of the key is active, an enqueue adds nothing. A holder failing
    (its worker's jobs.fail, or the reaper's Timeout) queues its retry in the same
    transaction; an enqueue of the key that came in meanwhile waits, then returns that retry.
    Both sessions commit for real, from two connections."""
    conn.execute(
        "SELECT jobs.set_retry_policy('sync', max_attempts => 3, backoff_initial => '0', jitter => 0)"
    )
    holder = _enqueue(conn, "'sync', unique_key => 'account-7', timeout => '1 second'")["id"]
    conn.execute("SELECT id FROM jobs.claim(1, 'w', '{sync}')")
    with (
        psycopg.connect(db.dsn, autocommit=True) as failing,
        psycopg.connect(db.dsn, autocommit=True) as other,
    ):
        failing.execute("BEGIN")
        if failure == "fail":
            failing.execute("SELECT jobs.fail(%s, 'w', '{E}', 'boom')", (holder,))
        else:
            conn.execute(
                "UPDATE jobs.runs SET started_at = now() - interval '1 minute' WHERE id = %s", (holder,)
            )
            reaped = failing.execute("SELECT run_id, reason FROM jobs.reap()").fetchall()
            assert reaped == [(holder, "Timeout")], reaped
        enqueue = BlockedCall(
            conn,
            other,
            lambda: scalar(other, "SELECT id FROM jobs.enqueue('sync', unique_key => 'account-7')"),
            "the enqueue to wait for the failing transaction",
        )
        failing.execute("COMMIT")
        outcome = enqueue.join(timeout=60)
    active = conn.execute(
        "SELECT id, attempt, origin::text FROM jobs.runs"
        " WHERE unique_key = 'account-7' AND status IN ('QUEUED', 'RUNNING') ORDER BY id"
    ).fetchall()
    assert len(active) == 1 and active[0][1:] == (2, "retry"), f"active runs of the key: {active}"
    assert outcome == [active[0][0]], f"the enqueue returned {outcome}, the retry is {active[0][0]}"


@pytest.mark.parametrize("how", ["unclaim", "hand_back_unheld"])
def test_a_run_given_back_unstarted_folds_into_the_queued_run_of_its_key(conn: Conn, how: str) -> None:
    """A claimed run of a key given back before it began (jobs.unclaim, or jobs.hand_back_unheld
    after a lost claim answer) while a newer run of its key waits: it does not go back beside it
    (two QUEUED runs of the key); it ends CANCELLED naming the run that does the key's job, and
    the call counts it as given back."""
    q = _enqueue(conn, "'k', run_at => now() - interval '1 s', unique_key => 'q', unique_while => 'queued'")
    other = _enqueue(
        conn, "'k', run_at => now() - interval '1 s', unique_key => 'other', unique_while => 'queued'"
    )
    assert len(conn.execute("SELECT jobs.claim(2, 'w')").fetchall()) == 2
    newer = _enqueue(conn, "'k', unique_key => 'q', unique_while => 'queued'")
    if how == "unclaim":
        got = conn.execute(
            "SELECT run_id FROM jobs.unclaim(%s, 'w') ORDER BY 1", ([q["id"], other["id"]],)
        ).fetchall()
        assert [r[0] for r in got] == [q["id"], other["id"]], got
    else:
        got = conn.execute(
            "SELECT run_id, status::text FROM jobs.hand_back_unheld('{}', 'w') ORDER BY 1"
        ).fetchall()
        assert got == [(q["id"], "CANCELLED"), (other["id"], "QUEUED")], got
    after = run_row(conn, q["id"])
    assert after["status"] == "CANCELLED" and f"run {newer['id']}" in after["error"], after
    assert _queued_of_key(conn, "q") == [newer["id"]]
    assert _queued_of_key(conn, "other") == [other["id"]], "a run of a key with no queued run goes back"


_GIVE_BACK = {
    "fail": "SELECT (f).id FROM jobs.fail(%s, 'w', '{E}', 'boom') AS f",
    "snooze": "SELECT jobs.snooze(%s, 'w', '0 seconds')",
    "unclaim": "SELECT count(*) FROM jobs.unclaim(ARRAY[%s]::bigint[], 'w')",
}


@pytest.mark.parametrize("first", ["enqueue", "give_back"])
@pytest.mark.parametrize("give_back", ["fail", "snooze", "unclaim"])
def test_an_enqueue_and_a_retry_or_snooze_of_one_key_at_once_leave_one_queued_run(
    db: Database, conn: Conn, give_back: str, first: str
) -> None:
    """Invariant: with unique_while => 'queued', one QUEUED run per key, however an enqueue of
    the key and a running run's retry (jobs.fail), snooze or give-back (jobs.unclaim)
    interleave. All take the key's lock: whichever commits second sees the QUEUED run the first
    made and folds into it (the enqueue returns it; the failed, snoozed or given-back run names
    it). Two sessions, real commits."""
    conn.execute(
        "SELECT jobs.set_retry_policy('sync', max_attempts => 3, backoff_initial => '0', jitter => 0)"
    )
    holder = _enqueue(conn, "'sync', unique_key => 'account-7', unique_while => 'queued'")["id"]
    assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'w', '{sync}')")] == [holder]
    enqueue_sql = "SELECT id FROM jobs.enqueue('sync', unique_key => 'account-7', unique_while => 'queued')"
    with (
        psycopg.connect(db.dsn, autocommit=True) as worker,
        psycopg.connect(db.dsn, autocommit=True) as client,
    ):
        holding, waiting = (client, worker) if first == "enqueue" else (worker, client)
        holding.execute("BEGIN")
        if first == "enqueue":
            enqueued = scalar(client, enqueue_sql)
            blocked = BlockedCall(
                conn,
                worker,
                lambda: scalar(worker, _GIVE_BACK[give_back], (holder,)),
                f"the {give_back} to wait",
            )
        else:
            scalar(worker, _GIVE_BACK[give_back], (holder,))
            blocked = BlockedCall(conn, client, lambda: scalar(client, enqueue_sql), "the enqueue to wait")
        holding.execute("COMMIT")
        outcome = blocked.join(timeout=60)
        assert outcome and not isinstance(outcome[0], Exception), outcome
        del waiting
    queued = _queued_of_key(conn, "account-7")
    assert len(queued) == 1, f"QUEUED runs of the key: {queued}"
    if first == "enqueue":
        assert queued == [enqueued]
        after = run_row(conn, holder)
        assert after["status"] in ("FAILED", "CANCELLED") and f"run {enqueued}" in after["error"], after
    else:
        assert outcome == queued, f"the enqueue returned {outcome}, the queued run is {queued}"


def test_the_reaper_leaves_a_holder_an_enqueue_of_its_key_holds_for_the_next_pass(
    db: Database, conn: Conn
) -> None:
    """The reaper only tries the key (an enqueue holding it may wait for the run's row): a run
    whose key is held is failed by a later pass, never waited for."""
    holder = _enqueue(conn, "'sync', unique_key => 'account-7', timeout => '1 second'")["id"]
    conn.execute("SELECT id FROM jobs.claim(1, 'w', '{sync}')")
    conn.execute(_OVERDUE, (holder,))
    with psycopg.connect(db.dsn, autocommit=True) as other:
        other.execute("BEGIN")
        assert scalar(other, "SELECT id FROM jobs.enqueue('sync', unique_key => 'account-7')") == holder
        assert conn.execute("SELECT run_id FROM jobs.reap()").fetchall() == [], "reaped with the key held"
        other.execute("COMMIT")
    assert conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall() == [(holder, "Timeout")]
