"""jobs.fail and retry policies: deny wins, class chains, attempt budget, backoff, new rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from harness import (
    Conn,
    add_runs,
    claim,
    enqueue,
    expect_error,
    materialize_occurrences,
    one,
    run_row,
    scalar,
)

CHAIN = ["BudgetExhausted", "RuntimeError", "Exception"]


def _policy(conn: Conn, kind: str, **kw: Any) -> None:
    args = "".join(f", {name} => %({name})s" for name in kw)
    conn.execute(f"SELECT jobs.set_retry_policy(%(kind)s{args})", {"kind": kind, **kw})


def _start(conn: Conn, kind: str, worker: str = "w1", **kw: Any) -> int:
    args = "".join(f", {name} => %({name})s" for name in kw)
    run_id = int(scalar(conn, f"SELECT id FROM jobs.enqueue(%(kind)s{args})", {"kind": kind, **kw}))
    got = conn.execute("SELECT id FROM jobs.claim(1, %s, ARRAY[%s])", (worker, kind)).fetchall()
    assert got == [(run_id,)], f"expected to claim {run_id}, got {got}"
    return run_id


def _fail(
    conn: Conn,
    run_id: int,
    classes: list[str],
    message: str | None = None,
    worker: str = "w1",
    reason: str = "Error",
) -> dict[str, Any] | None:
    """Call jobs.fail; the returned row as a dict, or None when it returned NULL."""
    cur = conn.execute(
        "SELECT (f).* FROM (SELECT jobs.fail(%s, %s, %s, %s, %s) AS f) AS x WHERE (f).id IS NOT NULL",
        (run_id, worker, classes, message, reason),
    )
    row = cur.fetchone()
    if row is None:
        return None
    assert cur.description is not None
    return {c.name: v for c, v in zip(cur.description, row, strict=True)}


def _retries_of(conn: Conn, run_id: int) -> int:
    return int(scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (run_id,)))


@pytest.mark.parametrize(
    ("allow", "deny", "classes", "retried"),
    [
        (["RuntimeError"], [], CHAIN, True),  # a base class in the chain is allowed
        (["RuntimeError"], ["BudgetExhausted"], CHAIN, False),  # deny beats allow
        (None, ["BudgetExhausted"], CHAIN, False),  # deny beats "allow everything"
        (["Exception"], ["RuntimeError"], CHAIN, False),  # deny on a base class wins too
        (None, [], CHAIN, True),  # allow NULL = every class not denied
        (["RuntimeError"], [], ["ValueError", "Exception"], False),  # not in the allow list
        (["Error"], [], [], True),  # the failure reason is matched as a class too
    ],
)
def test_policy_allow_and_deny(
    conn: Conn, allow: list[str] | None, deny: list[str], classes: list[str], retried: bool
) -> None:
    _policy(conn, "job", allow=allow, deny=deny, max_attempts=5, backoff_initial="0")
    run_id = _start(conn, "job")
    got = _fail(conn, run_id, classes, "boom")
    assert got is not None
    if retried:
        assert (got["status"], got["retry_of"], got["attempt"]) == ("QUEUED", run_id, 2)
        assert _retries_of(conn, run_id) == 1
    else:
        assert (got["id"], got["status"]) == (run_id, "FAILED"), "no retry: fail returns the row"
        assert _retries_of(conn, run_id) == 0


def test_failed_row_keeps_its_own_error_and_retry_is_a_new_row(conn: Conn) -> None:
    """A failure never rewrites the attempt into the next one: the FAILED row keeps message and
    reason; the retry row is attempt 2 with retry_of, the same kind and payload, clean state."""
    _policy(conn, "mail", max_attempts=3, backoff_initial="1 minute", jitter=0)
    run_id = _start(conn, "mail", payload='{"to": "a@b"}', priority=7)
    retry = _fail(conn, run_id, CHAIN, "SMTP said no")
    assert retry is not None
    failed = run_row(conn, run_id)
    assert (failed["status"], failed["failure_reason"], failed["error"]) == (
        "FAILED",
        "Error",
        "SMTP said no",
    )
    assert failed["worker"] == "w1" and failed["finished_at"] is not None
    assert retry["id"] != run_id
    assert (retry["status"], retry["attempt"], retry["retry_of"], retry["origin"]) == (
        "QUEUED",
        2,
        run_id,
        "retry",
    )
    assert (retry["kind"], retry["payload"], retry["priority"]) == ("mail", {"to": "a@b"}, 7)
    for clean in ("worker", "started_at", "heartbeat_at", "finished_at", "error", "failure_reason"):
        assert retry[clean] is None, f"retry row carries {clean}={retry[clean]!r}"
    # The error text defaults to the first class when no message is given.
    second = _start(conn, "mail")
    _fail(conn, second, CHAIN)
    assert run_row(conn, second)["error"] == "BudgetExhausted"


def test_retry_row_is_not_claimable_before_scheduled_for(conn: Conn) -> None:
    _policy(conn, "slow", max_attempts=3, backoff_initial="30 seconds", jitter=0)
    run_id = _start(conn, "slow")
    retry = _fail(conn, run_id, ["RuntimeError"])
    assert retry is not None
    assert conn.execute("SELECT * FROM jobs.claim(10, 'w2')").fetchall() == []
    # Move the test's clock: make it due.
    conn.execute(
        "UPDATE jobs.runs SET scheduled_for = now() - interval '1 second' WHERE id = %s",
        (retry["id"],),
    )
    assert conn.execute("SELECT id FROM jobs.claim(10, 'w2')").fetchall() == [(retry["id"],)]


def test_attempt_budget_is_exhausted_without_a_new_row(conn: Conn) -> None:
    """max_attempts counts attempts including the first; the last failure inserts nothing.
    runs.max_attempts (from enqueue) overrides the policy."""
    _policy(conn, "twice", max_attempts=2, backoff_initial="0")
    first = _start(conn, "twice")
    second = _fail(conn, first, ["RuntimeError"])
    assert second is not None and second["attempt"] == 2
    got = conn.execute("SELECT id FROM jobs.claim(1, 'w1', ARRAY['twice'])").fetchall()
    assert got == [(second["id"],)]
    last = _fail(conn, second["id"], ["RuntimeError"])
    assert last is not None and (last["id"], last["status"]) == (second["id"], "FAILED")
    assert _retries_of(conn, second["id"]) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'twice'") == 2

    once = _start(conn, "twice", max_attempts=1)
    got_once = _fail(conn, once, ["RuntimeError"])
    assert got_once is not None and got_once["status"] == "FAILED"
    assert _retries_of(conn, once) == 0

    # A kind with no policy uses jobs.config.max_attempts (1 by default): no retry.
    plain = _start(conn, "no-policy")
    got_plain = _fail(conn, plain, ["RuntimeError"])
    assert got_plain is not None and got_plain["id"] == plain


def test_backoff_grows_exponentially_and_is_capped(conn: Conn) -> None:
    """Delay before attempt n+1 = min(initial * factor^(n-1), backoff_max), +- jitter."""
    initial, factor, cap, jitter = 10.0, 3.0, 100.0, 0.1
    _policy(
        conn,
        "grow",
        max_attempts=10,
        backoff_initial=f"{initial} seconds",
        backoff_factor=factor,
        backoff_max=f"{cap} seconds",
        jitter=jitter,
    )
    run_id = _start(conn, "grow")
    delays: list[tuple[int, float, float]] = []
    for attempt in range(1, 7):
        retry = _fail(conn, run_id, ["RuntimeError"], f"attempt {attempt}")
        assert retry is not None and retry["attempt"] == attempt + 1
        failed = run_row(conn, run_id)
        delay = (retry["scheduled_for"] - failed["finished_at"]).total_seconds()
        expected = min(initial * factor ** (attempt - 1), cap)
        delays.append((attempt, expected, delay))
        # Make it due (the test's clock) and take the next attempt.
        conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = %s", (retry["id"],))
        run_id = int(scalar(conn, "SELECT id FROM jobs.claim(1, 'w1', ARRAY['grow'])"))
        assert run_id == retry["id"]
    bad = [(a, e, d) for a, e, d in delays if not e * (1 - jitter) - 1e-3 <= d <= e * (1 + jitter) + 1e-3]
    assert not bad, f"(attempt, expected delay, actual delay) outside +-{jitter:.0%}: {delays}"
    assert max(d for _, _, d in delays) <= cap * (1 + jitter) + 1e-3


def test_zero_jitter_is_exact(conn: Conn) -> None:
    _policy(conn, "exact", max_attempts=3, backoff_initial="7 seconds", jitter=0)
    run_id = _start(conn, "exact")
    retry = _fail(conn, run_id, ["X"])
    assert retry is not None
    delay = retry["scheduled_for"] - run_row(conn, run_id)["finished_at"]
    assert delay.total_seconds() == pytest.approx(7.0, abs=1e-6)


def test_fail_return_values_and_fencing(conn: Conn) -> None:
    """fail returns the retry row (QUEUED) / the FAILED row when no retry / NULL when fenced
    (not RUNNING, or another worker's run), and a fenced fail changes nothing. The same call
    sent again by its worker (its answer lost) gets the same answer and changes nothing; a
    different failure of the same run is fenced."""
    _policy(conn, "r", max_attempts=2, backoff_initial="0")
    run_id = _start(conn, "r")
    assert _fail(conn, run_id, ["E"], worker="intruder") is None
    assert run_row(conn, run_id)["status"] == "RUNNING"
    retry = _fail(conn, run_id, ["E"], "boom")
    assert retry is not None and retry["status"] == "QUEUED"
    failed = run_row(conn, run_id)
    assert _fail(conn, run_id, ["E"], "boom") == retry, "the same failure sent again: the same answer"
    assert _fail(conn, run_id, ["E"], "another message") is None, "a different failure is fenced"
    assert _fail(conn, run_id, ["E"], "boom", reason="Timeout") is None
    assert _fail(conn, run_id, ["E"], "boom", worker="intruder") is None
    assert _retries_of(conn, run_id) == 1 and run_row(conn, run_id) == failed
    queued = _fail(conn, retry["id"], ["E"])
    assert queued is None, "a QUEUED run cannot be failed"
    # No retry follows: the FAILED row, again for the repeat.
    last = _fail(conn, int(claim(conn, "w1", kinds=["r"])[0]), ["E"], "boom again")
    assert last is not None and last["status"] == "FAILED"
    assert _fail(conn, last["id"], ["E"], "boom again") == last


def test_a_failure_sent_again_after_an_operator_retry_is_answered_without_that_retry(conn: Conn) -> None:
    """A failure with no retry to follow is answered with the FAILED row; an operator then
    queues the run again (jobs.retry). The same failure sent again (its answer lost) gets the
    FAILED row again: the operator's retry is not the one its failure queued."""
    _policy(conn, "o", max_attempts=1)
    run_id = _start(conn, "o")
    failed = _fail(conn, run_id, ["E"], "boom")
    assert failed is not None and failed["status"] == "FAILED"
    retried = conn.execute("SELECT (jobs.retry(%s)).id", (run_id,)).fetchone()
    assert retried is not None
    assert _fail(conn, run_id, ["E"], "boom") == failed


def test_a_reaped_run_is_fenced_for_its_worker_whatever_it_reports(conn: Conn) -> None:
    """A run the reaper failed (here as Timeout) keeps its worker id; that worker's late fail,
    even with the reaper's own reason, is fenced: only a repeat of its own failure is not."""
    _policy(conn, "x", max_attempts=1)
    run_id = _start(conn, "x", timeout="1 second")
    conn.execute(
        "UPDATE jobs.runs SET started_at = started_at - interval '1 minute' WHERE id = %s", (run_id,)
    )
    assert [r[1] for r in conn.execute("SELECT * FROM jobs.reap()").fetchall()] == ["Timeout"]
    reaped = run_row(conn, run_id)
    assert _fail(conn, run_id, ["TimeoutError"], "took too long", reason="Timeout") is None
    assert _fail(conn, run_id, ["E"], reaped["error"], reason="Error") is None
    assert run_row(conn, run_id) == reaped


def test_timeout_reason_is_recorded_and_matchable(conn: Conn) -> None:
    _policy(conn, "t", allow=["Timeout"], max_attempts=3, backoff_initial="0")
    run_id = _start(conn, "t")
    retry = _fail(conn, run_id, ["TimeoutError"], "took too long", reason="Timeout")
    assert retry is not None and retry["status"] == "QUEUED"
    assert run_row(conn, run_id)["failure_reason"] == "Timeout"


def test_operator_retry_ignores_policy_once(conn: Conn) -> None:
    """jobs.retry queues a FAILED run again now, once; twice is refused."""
    run_id = _start(conn, "manual-retry")
    failed = _fail(conn, run_id, ["E"])
    assert failed is not None and failed["status"] == "FAILED"
    again = conn.execute(
        "SELECT id, attempt, retry_of, status::text FROM jobs.retry(%s)", (run_id,)
    ).fetchone()
    assert again is not None and again[1:] == (2, run_id, "QUEUED")
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(again[0],)]


@pytest.mark.parametrize("own", [None, 5], ids=["inherited", "own"])
def test_an_operator_retry_is_retried_by_policy_while_attempts_remain(conn: Conn, own: int | None) -> None:
    """A failure its policy does not retry (a denied class) is queued again by an operator at
    attempt 2 of 5; that attempt's own failure is retried by policy as any attempt 2 of 5 is,
    whether the 5 is the run's own max_attempts or inherited from its kind's policy."""
    _policy(conn, "op", deny=["Fatal"], max_attempts=5, backoff_initial="0")
    run_id = _start(conn, "op", max_attempts=own)
    failed = _fail(conn, run_id, ["Fatal"], "bad configuration")
    assert failed is not None and failed["status"] == "FAILED"
    again = one(conn, "SELECT * FROM jobs.retry(%s)", (run_id,))
    assert claim(conn, "w1", kinds=["op"]) == [again["id"]]
    retry = _fail(conn, again["id"], ["Transient"], "network blip")
    assert retry is not None and (retry["status"], retry["attempt"]) == ("QUEUED", 3), (
        f"attempt 2 of 5 (run {again['id']}, max_attempts {again['max_attempts']}) was not retried: {retry}"
    )


def test_an_operator_retry_past_the_budget_is_not_retried_by_policy(conn: Conn) -> None:
    """Attempt 3 of 3 queued again by an operator is attempt 4 past the budget: it runs once."""
    _policy(conn, "op", max_attempts=3, backoff_initial="0")
    run_id = _start(conn, "op")
    for _ in range(2):
        retry = _fail(conn, run_id, ["E"])
        assert retry is not None and retry["status"] == "QUEUED"
        run_id = retry["id"]
        assert claim(conn, "w1", kinds=["op"]) == [run_id]
    failed = _fail(conn, run_id, ["E"])
    assert failed is not None and (failed["status"], failed["attempt"]) == ("FAILED", 3)
    again = one(conn, "SELECT * FROM jobs.retry(%s)", (run_id,))
    assert (again["attempt"], again["max_attempts"]) == (4, 4)
    assert claim(conn, "w1", kinds=["op"]) == [again["id"]]
    last = _fail(conn, again["id"], ["E"])
    assert last is not None and last["status"] == "FAILED", f"attempt 4 of 3 was retried: {last}"


def test_an_operator_retry_past_the_largest_budget_is_queued_and_stays_out_of_policy(conn: Conn) -> None:
    """An operator may retry a run any number of times. Past 1000 attempts (the largest budget a
    run can hold) the new attempt's budget stays at 1000: spent, so a policy never retries it."""
    _policy(conn, "op", max_attempts=3, backoff_initial="0")
    (first, run_id) = add_runs(conn, 2, kind="op")
    conn.execute("UPDATE jobs.runs SET attempt = 1000, retry_of = %s WHERE id = %s", (first, run_id))
    conn.execute("SELECT jobs.cancel(id) FROM jobs.runs WHERE id IN (%s, %s)", (first, run_id))
    again = one(conn, "SELECT * FROM jobs.retry(%s)", (run_id,))
    assert (again["status"], again["attempt"], again["max_attempts"]) == ("QUEUED", 1001, 1000), again
    assert claim(conn, "w1", kinds=["op"]) == [again["id"]]
    last = _fail(conn, again["id"], ["E"])
    assert last is not None and last["status"] == "FAILED", f"attempt 1001 was retried by policy: {last}"
    further = one(conn, "SELECT * FROM jobs.retry(%s)", (again["id"],))
    assert (further["attempt"], further["max_attempts"]) == (1002, 1000), further


def test_absurd_backoff_is_refused_where_written_and_the_largest_keeps_fail_and_reap_working(
    conn: Conn,
) -> None:
    """A backoff of 400,000 years once made now() + backoff overflow, so every jobs.fail() and
    jobs.reap() meeting that kind raised 22008 and rolled back. Such a value is now refused
    where it is written (the policy, jobs.config, a direct UPDATE of either), and the largest
    accepted ones (366 days, factor 100, attempt 999) still give a retry 366 days out."""
    expect_error(
        conn,
        "SELECT jobs.set_retry_policy('forever', backoff_initial => '400000 years')",
        None,
        "22023",
        "backoff_initial",
        "366 days",
    )
    expect_error(
        conn, "UPDATE jobs.config SET backoff_max = '400000 years'", None, "22023", "backoff_max", "366 days"
    )
    _policy(
        conn,
        "forever",
        max_attempts=1000,
        backoff_initial="366 days",
        backoff_factor=100,
        backoff_max="366 days",
        jitter=0,
    )
    expect_error(
        conn, "UPDATE jobs.retry_policies SET backoff_max = '400000 years'", None, "23514", "backoff_max"
    )

    earlier = int(scalar(conn, "SELECT id FROM jobs.enqueue('forever', run_at => now() + interval '1 day')"))
    run_id = _start(conn, "forever")
    conn.execute("UPDATE jobs.runs SET attempt = 999, retry_of = %s WHERE id = %s", (earlier, run_id))
    retry = _fail(conn, run_id, ["E"])
    assert retry is not None and retry["status"] == "QUEUED", retry
    days = scalar(
        conn,
        "SELECT extract(epoch FROM scheduled_for - now()) / 86400 FROM jobs.runs WHERE id = %s",
        (retry["id"],),
    )
    assert 365.99 <= float(days) <= 366, f"retry after attempt 999 is {days} days out"

    reaped_id = _start(conn, "forever")
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (reaped_id,))
    reaped = conn.execute("SELECT run_id, reason, retry_run_id FROM jobs.reap()").fetchall()
    assert [r[:2] for r in reaped] == [(reaped_id, "HeartbeatLost")] and reaped[0][2] is not None, reaped


def _policy_row(conn: Conn, kind: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT backoff_initial::text, backoff_factor, backoff_max::text, jitter, updated_at"
        " FROM jobs.retry_policies WHERE kind = %s",
        (kind,),
    ).fetchone()


@pytest.mark.parametrize(
    ("given", "cap", "first"),
    [
        ({"backoff_initial": "2 minutes", "backoff_max": "1 minute"}, "00:01:00", "00:02:00"),
        # One of the two given, the other its default (10 seconds, 1 hour): the default is named.
        ({"backoff_initial": "2 hours"}, "01:00:00", "02:00:00"),
        ({"backoff_max": "5 seconds"}, "00:00:05", "00:00:10"),
        ({"backoff_initial": "1 day", "backoff_max": "23:59:59.999999"}, "23:59:59.999999", "1 day"),
    ],
    ids=["both-given", "initial-above-the-default-max", "max-below-the-default-initial", "by-a-microsecond"],
)
def test_a_policy_whose_backoff_max_is_below_its_backoff_initial_is_refused_naming_both(
    conn: Conn, given: dict[str, str], cap: str, first: str
) -> None:
    """A cap below the first delay made every delay the cap, whatever backoff_initial and the
    factor said: the policy read as one thing and did another. It is refused with 22023 naming
    both fields and both values (a default among them), and the kind keeps its policy."""
    _policy(conn, "capped", max_attempts=4, backoff_initial="3 seconds", backoff_max="30 seconds")
    before = _policy_row(conn, "capped")
    args = "".join(f", {name} => %({name})s" for name in given)
    for kind in ("capped", "new-kind"):
        err = expect_error(
            conn,
            f"SELECT jobs.set_retry_policy(%(kind)s{args})",
            {"kind": kind, **given},
            "22023",
            f"backoff_max must be at least backoff_initial, got backoff_max {cap}"
            f" and backoff_initial {first}",
        )
        assert err.diag.column_name == "backoff_max", err.diag.column_name
        assert "10 seconds" in (err.diag.message_hint or "") and "1 hour" in (err.diag.message_hint or "")
    assert _policy_row(conn, "capped") == before
    assert _policy_row(conn, "new-kind") is None


def test_a_policy_whose_backoff_max_equals_its_backoff_initial_is_a_constant_delay(conn: Conn) -> None:
    _policy(conn, "steady", max_attempts=3, backoff_initial="2 hours", backoff_max="2 hours", jitter=0)
    run_id = _start(conn, "steady")
    retry = _fail(conn, run_id, ["X"])
    assert retry is not None
    delay = retry["scheduled_for"] - run_row(conn, run_id)["finished_at"]
    assert delay == timedelta(hours=2), delay


@pytest.mark.parametrize(
    ("update", "cap", "first"),
    [
        ("backoff_max = '5 seconds'", "00:00:05", "00:00:10"),
        ("backoff_initial = '2 hours'", "01:00:00", "02:00:00"),
        ("backoff_initial = '1 minute', backoff_max = '30 seconds'", "00:00:30", "00:01:00"),
    ],
    ids=["max-below-the-initial", "initial-above-the-max", "both"],
)
def test_a_config_whose_backoff_max_is_below_its_backoff_initial_is_refused_naming_both(
    conn: Conn, update: str, cap: str, first: str
) -> None:
    """jobs.config's pair (for kinds without a policy) is held to the same rule where an
    operator writes it; both can change in one UPDATE."""
    conn.execute("UPDATE jobs.config SET backoff_initial = '10 seconds', backoff_max = '1 hour'")
    before = conn.execute("SELECT c::text FROM jobs.config AS c").fetchone()
    err = expect_error(
        conn,
        f"UPDATE jobs.config SET {update}",
        None,
        "22023",
        "jobs.config.backoff_max must be at least jobs.config.backoff_initial,"
        f" got jobs.config.backoff_max {cap} and jobs.config.backoff_initial {first}",
    )
    assert err.diag.column_name == "backoff_max", err.diag.column_name
    assert conn.execute("SELECT c::text FROM jobs.config AS c").fetchone() == before
    conn.execute("UPDATE jobs.config SET backoff_initial = '2 hours', backoff_max = '3 hours'")
    assert conn.execute("SELECT backoff_initial::text, backoff_max::text FROM jobs.config").fetchone() == (
        "02:00:00",
        "03:00:00",
    )


def test_a_pair_written_past_the_functions_is_refused_by_the_tables(conn: Conn) -> None:
    """The rule holds for any writer, not only jobs.set_retry_policy and the jobs.config trigger:
    another language inserting a policy itself, or a row written with the trigger disabled, is
    refused by the table's constraint, and nothing is stored."""
    expect_error(
        conn,
        "INSERT INTO jobs.retry_policies (kind, max_attempts, backoff_initial, backoff_max, jitter)"
        " VALUES ('direct', 3, '2 hours', '1 minute', 0)",
        None,
        "23514",
        "retry_policies_backoff_order",
    )
    assert scalar(conn, "SELECT count(*) FROM jobs.retry_policies WHERE kind = 'direct'") == 0
    with pytest.raises(psycopg.errors.CheckViolation, match="config_backoff_order"), conn.transaction():
        conn.execute("ALTER TABLE jobs.config DISABLE TRIGGER config_bounds")
        conn.execute("UPDATE jobs.config SET backoff_initial = '2 hours', backoff_max = '1 minute'")
    stored = conn.execute("SELECT backoff_initial::text, backoff_max::text FROM jobs.config").fetchone()
    assert stored == ("00:00:10", "01:00:00"), stored


def _failed(conn: Conn, kind: str = "k") -> int:
    run_id = enqueue(conn, kind, payload='{"n": 7}')
    assert claim(conn, "w", kinds=[kind]) == [run_id]
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'it broke')", (run_id,))
    assert run_row(conn, run_id)["status"] == "FAILED"
    return run_id


def test_retry_queues_a_new_attempt_row_now(conn: Conn) -> None:
    failed = _failed(conn)
    before = run_row(conn, failed)
    new = one(conn, "SELECT * FROM jobs.retry(%s)", (failed,))
    assert new["id"] != failed
    assert (new["status"], new["attempt"], new["retry_of"], new["origin"]) == ("QUEUED", 2, failed, "retry")
    assert (new["kind"], new["payload"]) == ("k", {"n": 7})
    assert new["scheduled_for"] <= scalar(conn, "SELECT now()"), "due at once, no backoff"
    assert run_row(conn, failed) == before, "the failed attempt keeps its row, error and reason"
    assert claim(conn, "w2") == [new["id"]]
    conn.execute("SELECT jobs.fail(%s, 'w2', '{Boom}', 'again')", (new["id"],))
    third = one(conn, "SELECT * FROM jobs.retry(%s)", (new["id"],))
    assert (third["attempt"], third["retry_of"]) == (3, new["id"])


def test_retry_of_a_cancelled_run(conn: Conn) -> None:
    run_id = enqueue(conn)
    conn.execute("SELECT jobs.cancel(%s)", (run_id,))
    new = one(conn, "SELECT * FROM jobs.retry(%s)", (run_id,))
    assert (new["status"], new["attempt"], new["retry_of"]) == ("QUEUED", 2, run_id)


def test_retry_refuses_live_and_completed_runs(conn: Conn) -> None:
    running = enqueue(conn)
    completed = enqueue(conn)
    assert claim(conn, "w", batch=2) == [running, completed]
    conn.execute("SELECT jobs.complete(%s, 'w')", (completed,))
    queued = enqueue(conn)
    count = scalar(conn, "SELECT count(*) FROM jobs.runs")
    for run_id, status in [(queued, "QUEUED"), (running, "RUNNING"), (completed, "COMPLETED")]:
        assert run_row(conn, run_id)["status"] == status
        expect_error(conn, "SELECT jobs.retry(%s)", (run_id,), "22023", status, str(run_id))
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == count, "a refused retry inserts nothing"
    expect_error(conn, "SELECT jobs.retry(%s)", (987654,), "P0002", "987654")
    expect_error(conn, "SELECT jobs.retry(NULL)", None, "22023")


def test_retry_twice_is_refused(conn: Conn) -> None:
    failed = _failed(conn)
    first = scalar(conn, "SELECT id FROM jobs.retry(%s)", (failed,))
    expect_error(conn, "SELECT jobs.retry(%s)", (failed,), "22023", "already retried", str(first))
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (failed,)) == 1


def test_retry_is_refused_when_the_policy_already_retried(conn: Conn) -> None:
    conn.execute("SELECT jobs.set_retry_policy('auto', max_attempts => 3, backoff_initial => '1 hour')")
    failed = _failed(conn, "auto")
    auto = scalar(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", (failed,))
    assert auto is not None, "the policy queued attempt 2"
    expect_error(conn, "SELECT jobs.retry(%s)", (failed,), "22023", "already retried", str(auto))


def test_the_retries_of_a_scheduled_run_keep_its_occurrence(conn: Conn) -> None:
    """A run materialized for an occurrence (delayed by its jitter) records that occurrence;
    its retry by policy and an operator's retry record the same one, so job code and operators
    see which occurrence an attempt is for."""
    definition_id = int(
        scalar(
            conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => '0 * * * *', jitter => '10 minutes')"
        )
    )
    occurrence = scalar(conn, "SELECT date_trunc('hour', now()) - interval '1 hour'")
    materialize_occurrences(conn, definition_id, [occurrence], occurrence + timedelta(hours=1))
    first = one(
        conn,
        "SELECT id, scheduled_for, occurrence_at FROM jobs.runs WHERE definition_id = %s",
        (definition_id,),
    )
    assert first["occurrence_at"] == occurrence, first
    assert first["scheduled_for"] == scalar(
        conn, "SELECT %s + jobs.jitter_offset(%s, %s, '10 minutes')", (occurrence, definition_id, occurrence)
    ), first
    _policy(conn, "k", max_attempts=3, backoff_initial="1 ms")
    assert claim(conn, "w", kinds=["k"]) == [first["id"]]
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'it broke')", (first["id"],))
    second = one(conn, "SELECT id, occurrence_at, origin FROM jobs.runs WHERE retry_of = %s", (first["id"],))
    assert (second["origin"], second["occurrence_at"]) == ("retry", occurrence), second
    conn.execute("SELECT jobs.cancel(%s)", (second["id"],))
    third = one(conn, "SELECT * FROM jobs.retry(%s)", (second["id"],))
    assert third["occurrence_at"] == occurrence, third


@pytest.mark.parametrize("end", ["fail", "reap"])
def test_a_run_asked_to_cancel_is_not_retried_when_it_fails_or_is_reaped(conn: Conn, end: str) -> None:
    """A cancel reaches a RUNNING run as a request; if the attempt then fails (or its worker
    dies), the run ends there: it fails for good, and what waits on it is cancelled."""
    _policy(conn, "k", max_attempts=3, backoff_initial=timedelta(0), jitter=0)
    run_id = _start(conn, "k")
    waiting = int(scalar(conn, "SELECT id FROM jobs.enqueue('w', depends_on => %s)", ([run_id],)))
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "RUNNING"
    if end == "fail":
        failed = _fail(conn, run_id, ["E"], "stopped badly")
        assert failed is not None and (failed["id"], failed["status"]) == (run_id, "FAILED"), failed
    else:
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 day' WHERE id = %s", (run_id,))
        reaped = conn.execute("SELECT run_id, retry_run_id FROM jobs.reap()").fetchall()
        assert reaped == [(run_id, None)], reaped
    assert _retries_of(conn, run_id) == 0
    row = run_row(conn, waiting)
    assert (row["status"], row["failure_reason"]) == ("CANCELLED", "DependencyFailed"), row


def test_retries_keep_the_unique_key_so_the_key_stays_taken(conn: Conn) -> None:
    """A run's retries are the same job: an enqueue of its unique key while one is QUEUED or
    RUNNING gets that attempt, whether a failure, the reaper or an operator queued it."""
    _policy(conn, "k", max_attempts=3, backoff_initial=timedelta(0), jitter=0)
    first = _start(conn, "k", unique_key="u")
    by_fail = _fail(conn, first, ["E"])
    assert by_fail is not None and by_fail["unique_key"] == "u", by_fail
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', unique_key => 'u')") == by_fail["id"]
    assert claim(conn, "w1", kinds=["k"]) == [by_fail["id"]]
    conn.execute(
        "UPDATE jobs.runs SET heartbeat_at = now() - interval '1 day' WHERE id = %s", (by_fail["id"],)
    )
    by_reap = scalar(conn, "SELECT retry_run_id FROM jobs.reap()")
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', unique_key => 'u')") == by_reap
    conn.execute("SELECT jobs.cancel(%s)", (by_reap,))
    by_operator = one(conn, "SELECT id, unique_key FROM jobs.retry(%s)", (by_reap,))
    assert by_operator["unique_key"] == "u", by_operator
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', unique_key => 'u')") == by_operator["id"]
