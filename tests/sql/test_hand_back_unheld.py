"""jobs.hand_back_unheld: a worker that lost a claim's answer gives back what that claim took.

A claim can commit and its answer never arrive (the connection broke after the commit). Its
runs are RUNNING for the worker, which does not know them. The worker, on its next
connection, hands back every run RUNNING for its worker id and claim token that it does not
hold: QUEUED as before the claim (same attempt, scheduled_for, priority), or CANCELLED when
a cancellation was requested meanwhile. Fenced by worker and token like jobs.heartbeat; it
waits for a claim of the worker still in progress on another connection, and after 5 s
raises 55P03 changing nothing.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from harness import BlockedCall, Conn, Database, enqueue, expect_error, scalar

TOKEN = "mine-0123456789abcdef-secret"
OTHER = "other-0123456789abcdef-secret"
HAND_BACK = "SELECT run_id, status::text FROM jobs.hand_back_unheld(%s, %s, claim_token => %s) ORDER BY 1"
CLAIM = "SELECT id FROM jobs.claim(%s, %s, claim_token => %s) ORDER BY id"


def _state(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status::text, attempt, scheduled_for, priority, worker, started_at IS NULL,"
        " heartbeat_at IS NULL, claim_token_hash IS NULL, failure_reason FROM jobs.runs ORDER BY id"
    ).fetchall()


def test_the_runs_a_worker_does_not_hold_go_back_unchanged(conn: Conn) -> None:
    runs = [enqueue(conn, "k", priority=str(i), run_at=f"now() - interval '{i} minutes'") for i in range(4)]
    queued = {r[0]: r for r in _state(conn)}
    mine = [r[0] for r in conn.execute(CLAIM, (3, "w", TOKEN)).fetchall()]
    (theirs,) = [r[0] for r in conn.execute(CLAIM, (1, "w", OTHER)).fetchall()]  # same id, another token
    held, lost, asked_to_cancel = mine
    dependent = enqueue(conn, "k", depends_on=f"ARRAY[{asked_to_cancel}]::bigint[]")
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (asked_to_cancel,)) == "RUNNING"

    assert conn.execute(HAND_BACK, ([held], "w", TOKEN)).fetchall() == [
        (lost, "QUEUED"),
        (asked_to_cancel, "CANCELLED"),
    ]
    state = {r[0]: r for r in _state(conn)}
    # QUEUED as before the claim: same attempt, scheduled_for and priority, no trace of the claim.
    assert state[lost] == queued[lost], state
    assert state[asked_to_cancel][1:3] == ("CANCELLED", 1), state
    assert state[dependent][1] == "CANCELLED" and state[dependent][9] == "DependencyFailed", state
    # The held run and the other token's run are untouched.
    assert state[held][1] == "RUNNING" and state[held][5] == "w", state
    assert state[theirs][1] == "RUNNING", state
    assert set(runs) == {held, lost, asked_to_cancel, theirs}
    # Handed back, the run is claimable again; a second call finds nothing more.
    assert [r[0] for r in conn.execute(CLAIM, (1, "w2", TOKEN)).fetchall()] == [lost]
    assert conn.execute(HAND_BACK, ([held], "w", TOKEN)).fetchall() == []


def test_a_run_claimed_without_a_token_is_handed_back_only_without_one(conn: Conn) -> None:
    run_id = enqueue(conn, "k")
    assert [r[0] for r in conn.execute(CLAIM, (1, "w", None)).fetchall()] == [run_id]
    assert conn.execute(HAND_BACK, ([], "w", TOKEN)).fetchall() == []
    assert conn.execute(HAND_BACK, ([], "w2", None)).fetchall() == []
    assert conn.execute(HAND_BACK, ([], "w", None)).fetchall() == [(run_id, "QUEUED")]


def test_it_waits_for_a_claim_in_progress_and_hands_back_what_it_took(db: Database, conn: Conn) -> None:
    """A claim whose client is gone may still be running on the server: the hand-back waits for
    it to commit, so the runs it took are not left behind."""
    runs = [enqueue(conn, "k") for _ in range(2)]
    with db.connect(autocommit=False) as claimer, db.connect() as worker:
        assert [r[0] for r in claimer.execute(CLAIM, (2, "w", TOKEN)).fetchall()] == runs  # not committed
        call = BlockedCall(
            conn,
            worker,
            lambda: worker.execute(HAND_BACK, ([], "w", TOKEN)).fetchall(),
            "the hand-back to wait for the claim in progress",
        )
        claimer.commit()
        assert call.join(30) == [[(runs[0], "QUEUED"), (runs[1], "QUEUED")]]
    assert [r[1] for r in _state(conn)] == ["QUEUED", "QUEUED"]


def test_a_claim_in_progress_past_the_wait_makes_it_fail_and_change_nothing(db: Database, conn: Conn) -> None:
    enqueue(conn, "k")
    mine = enqueue(conn, "k", priority="1")
    assert [r[0] for r in conn.execute(CLAIM, (1, "w", TOKEN)).fetchall()] == [mine]
    with db.connect(autocommit=False) as claimer:
        claimer.execute(CLAIM, (1, "w", TOKEN)).fetchall()  # in progress, past the wait
        began = time.monotonic()
        expect_error(conn, HAND_BACK, ([], "w", TOKEN), "55P03", "claim of worker w is still in progress")
        assert time.monotonic() - began >= 4.5
        claimer.commit()
    assert [r[1] for r in _state(conn)] == ["RUNNING", "RUNNING"]  # nothing was handed back
    assert len(conn.execute(HAND_BACK, ([], "w", TOKEN)).fetchall()) == 2


def test_bad_arguments_are_refused_by_name_and_change_nothing(conn: Conn) -> None:
    run_id = enqueue(conn, "k")
    conn.execute(CLAIM, (1, "w", TOKEN)).fetchall()
    before = _state(conn)
    expect_error(conn, HAND_BACK, (None, "w", TOKEN), "22023", "held")
    expect_error(conn, HAND_BACK, (list(range(1, 10_002)), "w", TOKEN), "22023", "held")
    expect_error(conn, HAND_BACK, ([], None, TOKEN), "22023", "worker")
    expect_error(conn, HAND_BACK, ([], "", TOKEN), "22023", "worker")
    expect_error(conn, HAND_BACK, ([], "w", "short"), "22023", "claim_token")
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        expect_error(conn, HAND_BACK, ([], "w", TOKEN), "25000", "READ COMMITTED")
    assert _state(conn) == before
    assert conn.execute(HAND_BACK, ([run_id], "w", TOKEN)).fetchall() == []


def test_a_worker_login_may_call_it(db: Database, conn: Conn) -> None:
    run_id = enqueue(conn, "k")
    with db.worker_login("handback") as login, psycopg.connect(db.dsn_as(login), autocommit=True) as worker:
        assert [r[0] for r in worker.execute(CLAIM, (1, "w", TOKEN)).fetchall()] == [run_id]
        assert worker.execute(HAND_BACK, ([], "w", TOKEN)).fetchall() == [(run_id, "QUEUED")]


def test_the_runs_handed_back_no_longer_count_as_starts_against_a_rate_limit(conn: Conn) -> None:
    """A kind may start 2 runs an hour. A claim of 2 whose answer was lost is handed back: the
    runs never started, so a claim may start both again this hour."""
    conn.execute("SELECT jobs.set_limit('kind', 'k', rate_limit => 2, rate_period => '1 hour')")
    runs = [enqueue(conn, "k") for _ in range(3)]
    assert [r[0] for r in conn.execute(CLAIM, (2, "w", TOKEN)).fetchall()] == runs[:2]
    assert [r[0] for r in conn.execute(HAND_BACK, ([], "w", TOKEN)).fetchall()] == runs[:2]
    again = [r[0] for r in conn.execute(CLAIM, (3, "w", TOKEN)).fetchall()]
    assert again == runs[:2], f"the rate window still counts the runs handed back: claimed {again}"
