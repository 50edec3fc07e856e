"""Claim tokens: a worker's identity is a secret it generated, not the worker id anyone can read.

Each test logs in as real LOGIN roles created for it and granted only jobs_worker. A worker
that claims with ``claim_token => T`` holds runs that only a caller presenting T can
heartbeat, complete, fail, snooze, unclaim or acknowledge; the database keeps sha256(T), never T.
A run claimed without a token keeps worker-id fencing (callers that predate tokens).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness import Conn, Database, add_runs, digest, expect_error, scalar

TOKEN = "mine-0123456789abcdef-secret"
FORGED = "forged-0123456789abcdef-guess"


@pytest.fixture
def logins(db: Database) -> Iterator[tuple[str, str]]:
    """Two LOGIN roles that are members of jobs_worker only (dropped at the end)."""
    with db.worker_login("tok_a") as a, db.worker_login("tok_b") as b:
        yield a, b


def _as(db: Database, user: str) -> psycopg.Connection[Any]:
    return psycopg.connect(db.dsn_as(user), autocommit=True)


def _claim_one(worker: Conn, name: str, token: str | None) -> int:
    claimed = worker.execute("SELECT id FROM jobs.claim(1, %s, claim_token => %s)", (name, token)).fetchall()
    assert len(claimed) == 1, f"expected one run claimed by {name}, got {claimed}"
    return int(claimed[0][0])


def _touches(worker: Conn, run_id: int, name: str, token: str | None) -> dict[str, Any]:
    """Every worker call on the run, each in a rolled-back transaction: what each answered."""
    one, many = run_id, [run_id]
    # call -> (statement taking the run(s), the worker and the token; which run argument)
    calls: dict[str, tuple[str, Any]] = {
        "heartbeat": ("SELECT count(*) FROM jobs.heartbeat(%s, %s, claim_token => %s)", many),
        "complete": ("SELECT jobs.complete(%s, %s, '{\"forged\": true}', claim_token => %s)", one),
        "complete_many": ("SELECT count(*) FROM jobs.complete_many(%s, %s, claim_token => %s)", many),
        "fail": ("SELECT (jobs.fail(%s, %s, '{E}', 'forged', claim_token => %s)).id IS NOT NULL", one),
        "snooze": ("SELECT jobs.snooze(%s, %s, '1 hour', claim_token => %s)", one),
        "unclaim": ("SELECT count(*) FROM jobs.unclaim(%s, %s, claim_token => %s)", many),
        "acknowledge_cancel": ("SELECT jobs.acknowledge_cancel(%s, %s, 'forged', claim_token => %s)", one),
    }
    answers: dict[str, Any] = {}
    for call, (query, runs) in calls.items():
        with worker.transaction(force_rollback=True):
            answers[call] = scalar(worker, query, (runs, name, token))
    return answers


NOTHING = {
    "heartbeat": 0,
    "complete": False,
    "complete_many": 0,
    "fail": False,
    "snooze": False,
    "unclaim": 0,
    "acknowledge_cancel": False,
}
EVERYTHING = {
    "heartbeat": 1,
    "complete": True,
    "complete_many": 1,
    "fail": True,
    "snooze": False,  # refused while a cancellation is requested (as it is here)
    "unclaim": 0,  # likewise
    "acknowledge_cancel": True,
}


def test_a_run_claimed_with_a_token_is_fenced_against_anyone_without_it(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Worker B knows worker A's id (jobs.running shows it) but not its token: none of B's
    calls touches A's run, with no token or a wrong one, and nothing changes. A's own calls,
    with its token, do."""
    (run_id,) = add_runs(conn, 1)
    mine, other = logins
    with _as(db, mine) as a:
        _claim_one(a, "w-a", TOKEN)
    shown = scalar(conn, "SELECT worker FROM jobs.running WHERE id = %s", (run_id,))
    assert shown == "w-a", f"jobs.running shows worker {shown!r}"
    # Before and after a cancellation request (snooze applies only before, acknowledge after).
    for cancel in (False, True):
        if cancel:
            conn.execute("SELECT jobs.cancel(%s)", (run_id,))
        before = digest(conn)
        with _as(db, other) as b:
            for token in (None, FORGED):
                got = _touches(b, run_id, "w-a", token)
                assert got == NOTHING, f"a caller with token {token!r} touched run {run_id}: {got}"
        assert digest(conn) == before, "a fenced call changed something"
    with _as(db, mine) as a:
        got = _touches(a, run_id, "w-a", TOKEN)
        assert got == EVERYTHING, f"the token's owner was refused on run {run_id}: {got}"
        assert scalar(a, "SELECT jobs.complete(%s, 'w-a', '{\"ok\": 1}', claim_token => %s)", (run_id, TOKEN))
    row = conn.execute("SELECT status::text, result FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
    assert row == ("COMPLETED", {"ok": 1}), f"run {run_id} ended {row}"


def test_a_completion_sent_again_is_true_for_its_worker_alone_and_changes_nothing(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """A completion whose answer was lost with its connection is sent again: the worker that
    completed the run (its id and token) is told it is completed, and nothing changes; anyone
    else, even with the same worker id, is still fenced."""
    first, second = add_runs(conn, 2)
    mine, other = logins
    with _as(db, mine) as a:
        assert sorted([_claim_one(a, "w-a", TOKEN), _claim_one(a, "w-a", TOKEN)]) == [first, second]
        assert scalar(a, "SELECT jobs.complete(%s, 'w-a', '{\"n\": 1}', claim_token => %s)", (first, TOKEN))
        done = a.execute("SELECT * FROM jobs.complete_many(%s, 'w-a', claim_token => %s)", ([second], TOKEN))
        assert done.fetchall() == [(second,)]
        before = digest(conn)
        stamps = conn.execute("SELECT id, finished_at, result FROM jobs.runs ORDER BY id").fetchall()
        again = "SELECT jobs.complete(%s, 'w-a', '{\"n\": 2}', claim_token => %s)"
        assert scalar(a, again, (first, TOKEN)) is True
        assert scalar(a, again, (second, TOKEN)) is True
        many = "SELECT run_id FROM jobs.complete_many(%s, 'w-a', claim_token => %s) ORDER BY 1"
        assert a.execute(many, ([first, second, 987654321], TOKEN)).fetchall() == [(first,), (second,)]
    with _as(db, other) as b:
        for token in (None, FORGED):
            assert scalar(b, again, (first, token)) is False
            assert b.execute(many, ([first, second], token)).fetchall() == []
    assert digest(conn) == before, "a repeated completion changed something"
    assert conn.execute("SELECT id, finished_at, result FROM jobs.runs ORDER BY id").fetchall() == stamps


def test_a_token_holder_snoozes_its_run_and_the_requeued_run_forgets_the_hash(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    (run_id,) = add_runs(conn, 1)
    with _as(db, logins[0]) as a:
        _claim_one(a, "w-a", TOKEN)
        assert scalar(a, "SELECT jobs.snooze(%s, 'w-a', '0', claim_token => %s)", (run_id, FORGED)) is False
        assert scalar(a, "SELECT jobs.snooze(%s, 'w-a', '0', claim_token => %s)", (run_id, TOKEN)) is True
    row = conn.execute(
        "SELECT status::text, worker, claim_token_hash FROM jobs.runs WHERE id = %s", (run_id,)
    ).fetchone()
    assert row == ("QUEUED", None, None), f"snoozed run {run_id}: {row}"
    with _as(db, logins[1]) as b:  # the next claimer (no token) owns it now
        assert _claim_one(b, "w-b", None) == run_id
        assert scalar(b, "SELECT jobs.complete(%s, 'w-b')", (run_id,)) is True


def test_another_login_claiming_or_handing_back_under_a_workers_id_never_touches_its_runs(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Login B uses login A's worker id: its jobs.hand_back_unheld, with no token or its own,
    hands back none of A's runs (nothing changes); a run B claims under A's id with its own
    token stays B's: A's hand_back_unheld and A's calls leave it alone, and B completes it."""
    first, second = add_runs(conn, 2)
    mine, other = logins
    with _as(db, mine) as a, _as(db, other) as b:
        assert _claim_one(a, "w-a", TOKEN) == first
        before = digest(conn)
        for token in (None, FORGED):
            handed = b.execute(
                "SELECT run_id FROM jobs.hand_back_unheld('{}', 'w-a', %s)", (token,)
            ).fetchall()
            assert handed == [], f"a hand-back with token {token!r} under A's id handed back {handed}"
        assert digest(conn) == before, "a fenced hand-back changed something"
        assert _claim_one(b, "w-a", FORGED) == second
        handed = a.execute(
            "SELECT run_id FROM jobs.hand_back_unheld(%s, 'w-a', %s)", ([first], TOKEN)
        ).fetchall()
        assert handed == [], f"A's hand-back took back run {second}, which B claimed under A's id: {handed}"
        assert _touches(a, second, "w-a", TOKEN) == NOTHING
        assert scalar(b, "SELECT jobs.complete(%s, 'w-a', claim_token => %s)", (second, FORGED)) is True
        assert scalar(a, "SELECT jobs.complete(%s, 'w-a', claim_token => %s)", (first, TOKEN)) is True


def test_runs_claimed_without_a_token_keep_worker_id_fencing(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Old-style calls (no token) work on runs claimed without one; presenting a token
    there does not (the run was not claimed with it); another worker id never does."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 1)")
    ids = add_runs(conn, 2)
    with _as(db, logins[0]) as a:
        got = [r[0] for r in a.execute("SELECT id FROM jobs.claim(2, 'w-old')")]
        assert got == ids
        assert [r[0] for r in a.execute("SELECT run_id FROM jobs.heartbeat(%s, 'w-old')", (ids,))] == ids
        assert scalar(a, "SELECT jobs.complete(%s, 'w-old', claim_token => %s)", (ids[0], TOKEN)) is False
        assert scalar(a, "SELECT jobs.complete(%s, 'w-other')", (ids[0],)) is False
        assert scalar(a, "SELECT jobs.complete(%s, 'w-old', '{}')", (ids[0],)) is True
        assert scalar(a, "SELECT (jobs.fail(%s, 'w-old', '{E}', 'x')).status::text", (ids[1],)) == "FAILED"
    hashes = scalar(conn, "SELECT array_agg(claim_token_hash) FROM jobs.runs WHERE id = ANY(%s)", (ids,))
    assert hashes == [None, None], f"runs claimed without a token carry a hash: {hashes}"


def test_the_token_is_stored_only_as_its_hash(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    """After claiming, heartbeating and completing with a token, no table or view in schema
    jobs holds the token's text; the run holds sha256(token)."""
    (run_id,) = add_runs(conn, 1)
    with _as(db, logins[0]) as a:
        _claim_one(a, "w-a", TOKEN)
        a.execute("SELECT * FROM jobs.heartbeat(%s, 'w-a', claim_token => %s)", ([run_id], TOKEN))
        assert scalar(a, "SELECT jobs.complete(%s, 'w-a', claim_token => %s)", (run_id, TOKEN)) is True
    stored = scalar(conn, "SELECT claim_token_hash FROM jobs.runs WHERE id = %s", (run_id,))
    assert stored == hashlib.sha256(TOKEN.encode()).digest(), f"run {run_id} stores {stored!r}"
    relations = [
        r[0]
        for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class AS c"
            " WHERE c.relnamespace = 'jobs'::regnamespace AND c.relkind IN ('r', 'v', 'm')"
        )
    ]
    assert "jobs.runs" in relations and "jobs.running" in relations, relations
    holding = [
        name
        for name in relations
        if scalar(conn, f"SELECT count(*) FROM {name} AS t WHERE t::text LIKE %s", (f"%{TOKEN}%",))
    ]
    assert holding == [], f"the token's text is stored in {holding}"


def test_claim_token_is_checked_and_can_be_required(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """A token too short to be a secret is refused naming claim_token (22023), on every call;
    with jobs.config.require_claim_token a claim without one is refused and claims nothing."""
    add_runs(conn, 1)
    before = digest(conn)
    with _as(db, logins[0]) as a:
        expect_error(
            a, "SELECT * FROM jobs.claim(1, 'w', claim_token => 'short')", None, "22023", "claim_token"
        )
        expect_error(a, "SELECT jobs.complete(1, 'w', claim_token => '')", None, "22023", "claim_token")
        expect_error(
            a,
            "SELECT * FROM jobs.heartbeat('{1}', 'w', claim_token => %s)",
            ("x" * 201,),
            "22023",
            "claim_token",
        )
    assert digest(conn) == before
    conn.execute("UPDATE jobs.config SET require_claim_token = true")
    before = digest(conn)
    with _as(db, logins[0]) as a:
        expect_error(a, "SELECT * FROM jobs.claim(1, 'w')", None, "22023", "claim_token")
        assert digest(conn) == before, "a refused claim changed something"
        _claim_one(a, "w", TOKEN)


def test_a_worker_login_reads_no_payload_or_result(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    """A jobs_worker login cannot SELECT runs (payloads, results), definitions' payloads or
    the console's views; what it needs comes back from its calls."""
    conn.execute("""SELECT jobs.enqueue('k', '{"secret": "payload"}')""")
    with _as(db, logins[0]) as a:
        for query in (
            "SELECT payload FROM jobs.runs",
            "SELECT result FROM jobs.runs",
            "SELECT count(*) FROM jobs.runs",
            "SELECT payload FROM jobs.definitions",
            "SELECT count(*) FROM jobs.running",
            "SELECT count(*) FROM jobs.run_list",
            "SELECT * FROM jobs.run_detail(1)",
        ):
            expect_error(a, query, None, "42501")
        # The two column grants the Python worker reads, and its calls.
        assert scalar(a, "SELECT heartbeat_timeout IS NOT NULL FROM jobs.config") is True
        assert a.execute("SELECT id, name FROM jobs.definitions").fetchall() == []
        claimed = a.execute("SELECT payload FROM jobs.claim(1, 'w', claim_token => %s)", (TOKEN,)).fetchall()
        assert claimed == [({"secret": "payload"},)], f"its own claim returned {claimed}"


def test_a_worker_call_naming_runs_it_does_not_hold_locks_none_of_them(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Worker B names A's run (A's worker id, without A's token) and a QUEUED run in each
    worker call, and keeps its transaction open: neither row is locked meanwhile, so A can
    still complete its run and a claim still gets the queued one. A fenced call must not hand
    a worker the row locks it could never take itself (it has no UPDATE on jobs.runs)."""
    held, queued = add_runs(conn, 2)
    mine, other = logins
    with _as(db, mine) as a:
        assert _claim_one(a, "w-a", TOKEN) == held
    calls = {
        "heartbeat": "SELECT count(*) FROM jobs.heartbeat(%(many)s, 'w-a', claim_token => %(token)s)",
        "complete": "SELECT jobs.complete(%(one)s, 'w-a', claim_token => %(token)s)",
        "complete_many": "SELECT count(*) FROM jobs.complete_many(%(many)s, 'w-a', claim_token => %(token)s)",
        "fail": "SELECT (jobs.fail(%(one)s, 'w-a', '{E}', 'x', claim_token => %(token)s)).id IS NULL",
        "snooze": "SELECT jobs.snooze(%(one)s, 'w-a', '1 hour', claim_token => %(token)s)",
        "unclaim": "SELECT count(*) FROM jobs.unclaim(%(many)s, 'w-a', claim_token => %(token)s)",
        "acknowledge_cancel": "SELECT jobs.acknowledge_cancel(%(one)s, 'w-a', claim_token => %(token)s)",
    }
    locked = []
    with _as(db, other) as b:
        for call, query in calls.items():
            for token in (None, FORGED):
                for one in (held, queued):
                    with b.transaction(force_rollback=True):
                        b.execute(query, {"one": one, "many": [held, queued], "token": token})
                        # B's transaction is still open: whatever its call locked is held now.
                        with conn.transaction(force_rollback=True):
                            got = conn.execute(
                                "SELECT id FROM jobs.runs WHERE id = ANY(%s) ORDER BY id"
                                " FOR NO KEY UPDATE SKIP LOCKED",
                                ([held, queued],),
                            ).fetchall()
                        if got != [(held,), (queued,)]:
                            locked.append((call, token, one, got))
    assert locked == [], f"fenced calls left runs locked (call, token, run named, rows free): {locked}"


def test_a_fenced_failure_holds_no_lock_on_the_runs_unique_key(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Worker B names A's run of a unique key in jobs.fail (A's worker id, without A's token, or
    with a forged one) and keeps its transaction open. The call is fenced, and it must hold up
    nobody meanwhile: an enqueue of the key still answers at once with A's run, and A still
    fails its run, its retry queued under the key. A fenced call that took the key's lock would
    stop every enqueue of the key, and A's own failure, for as long as B's transaction lasts."""
    conn.execute("SELECT jobs.set_retry_policy('keyed', max_attempts => 2, jitter => 0)")
    run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('keyed', unique_key => 'k-1')"))
    mine, other = logins
    blocked = []
    with _as(db, mine) as a, _as(db, other) as b:
        assert _claim_one(a, "w-a", TOKEN) == run_id
        for token in (None, FORGED):
            with b.transaction(force_rollback=True):
                fenced = scalar(
                    b, "SELECT (jobs.fail(%s, 'w-a', '{E}', 'x', claim_token => %s)).id", (run_id, token)
                )
                assert fenced is None, f"B's failure of A's run (token {token}) was not fenced"
                with conn.transaction(force_rollback=True):
                    conn.execute("SET LOCAL lock_timeout = '2s'")
                    try:
                        got = scalar(
                            conn,
                            "SELECT id FROM jobs.enqueue('keyed', unique_key => 'k-1',"
                            " on_conflict => 'ignore')",
                        )
                    except psycopg.errors.LockNotAvailable:
                        blocked.append(token)
                    else:
                        assert got == run_id, f"the enqueue of k-1 answered run {got}, not A's run {run_id}"
        assert blocked == [], f"a fenced jobs.fail (tokens {blocked}) held the unique key's lock open"
        with b.transaction():
            scalar(b, "SELECT (jobs.fail(%s, 'w-a', '{E}', 'x')).id", (run_id,))
            a.execute("SET lock_timeout = '2s'")
            retry = a.execute(
                "SELECT id, status::text FROM jobs.fail(%s, 'w-a', '{E}', 'boom', claim_token => %s)",
                (run_id, TOKEN),
            ).fetchone()
        assert retry is not None and retry[1] == "QUEUED", f"A's failure answered {retry}"


def test_a_heartbeat_held_open_under_a_workers_id_keeps_only_that_tokens_runs_from_the_reaper(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """A heartbeat in flight keeps the reaper off the runs it may stamp, those of its worker id
    and claim token. Worker B, knowing only A's worker id, calls jobs.heartbeat under it (with no
    token, or a forged one) and keeps its transaction open: A's run whose heartbeat is stale is
    still reaped, as B could never stamp it. A's own heartbeat held open, with A's token, keeps
    the reaper off A's stale run until it ends."""
    stale, other = add_runs(conn, 2)
    mine, intruder = logins
    with _as(db, mine) as a, _as(db, intruder) as b:
        assert _claim_one(a, "w-a", TOKEN) == stale
        assert _claim_one(a, "w-a", TOKEN) == other
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '2 hours' WHERE id = %s", (stale,))
        with a.transaction():
            beat = a.execute(
                "SELECT run_id FROM jobs.heartbeat(%s, 'w-a', claim_token => %s)", ([other], TOKEN)
            ).fetchall()
            assert beat == [(other,)], beat
            reaped = conn.execute("SELECT run_id FROM jobs.reap()").fetchall()
            assert reaped == [], f"A's heartbeat was in flight, yet the reap took {reaped}"
        kept = []
        for token in (None, FORGED):
            with b.transaction(force_rollback=True):
                b.execute(
                    "SELECT count(*) FROM jobs.heartbeat(%s, 'w-a', claim_token => %s)", ([stale], token)
                )
                with conn.transaction(force_rollback=True):
                    if conn.execute("SELECT run_id FROM jobs.reap()").fetchall() != [(stale,)]:
                        kept.append(token)
        assert kept == [], f"B's heartbeat under A's id (tokens {kept}) kept A's lost run from the reaper"


def test_a_hand_back_held_open_under_a_workers_id_holds_up_none_of_its_claims(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Worker B calls jobs.hand_back_unheld under A's worker id (with no token, or a forged one)
    and keeps its transaction open: it hands back nothing of A's, and A's claims go on at once.
    The hand-back waits for the claims of its worker and token only (those whose runs it could
    hand back), so a caller knowing only A's id cannot stop A from claiming."""
    add_runs(conn, 2)
    mine, other = logins
    waited = []
    with _as(db, mine) as a, _as(db, other) as b:
        for token in (None, FORGED):
            with b.transaction(force_rollback=True):
                back = b.execute(
                    "SELECT count(*) FROM jobs.hand_back_unheld('{}', 'w-a', claim_token => %s)", (token,)
                ).fetchone()
                assert back == (0,), back
                with a.transaction():
                    a.execute("SET LOCAL lock_timeout = '2s'")
                    try:
                        _claim_one(a, "w-a", TOKEN)
                    except psycopg.errors.LockNotAvailable:
                        waited.append(token)
    assert waited == [], f"A's claims waited for B's hand-back under A's id (tokens {waited})"
