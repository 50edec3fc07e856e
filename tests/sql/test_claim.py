"""jobs.claim: exactly-once hand-out, global caps, oversample against starvation, overlap skip.

Concurrency tests here run real processes with their own connections and real
commits; each states the invariant it checks and fails with the counter-example.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
import pytest

from harness import (
    OVER_CAP_SQL,
    Conn,
    Database,
    Tally,
    add_definition,
    add_runs,
    claim_after_a_wait,
    gated,
    materialize_occurrences,
    probe,
    race,
    race_parts,
    run_row,
    scalar,
    wait_for,
)

# ---------------------------------------------------------------------------
# Child processes (module level: spawned processes import them by name)
# ---------------------------------------------------------------------------


def _claim_until_empty(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Claim with random batch sizes 1..10 until nothing is QUEUED; record every run id."""
    rng = random.Random(seed)
    claimed: list[int] = []
    oversized: list[tuple[int, int]] = []
    deadline = time.monotonic() + seconds
    with gated(dsn) as conn:
        while time.monotonic() < deadline:
            batch = rng.randint(1, 10)
            rows = conn.execute("SELECT id FROM jobs.claim(%s, %s)", (batch, worker)).fetchall()
            if len(rows) > batch:
                oversized.append((batch, len(rows)))
            if rows:
                claimed.extend(int(r[0]) for r in rows)
            elif scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'QUEUED'") == 0:
                break
    return {"worker": worker, "claimed": claimed, "oversized": oversized}


def _cap_claimer(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Claim 1..5, check caps right after the claim committed, hold a few ms, complete, loop."""
    rng = random.Random(seed)
    tally = Tally(worker)
    refused: list[int] = []
    deadline = time.monotonic() + seconds
    with gated(dsn) as conn:
        while time.monotonic() < deadline:
            rows = tally.claim(conn, rng.randint(1, 5), "id, definition_id")
            if not rows:
                if scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'QUEUED'") == 0:
                    break
                time.sleep(0.002)
                continue
            capped = sorted({int(r[1]) for r in rows if r[1] is not None})
            if capped:
                tally.check(conn, OVER_CAP_SQL, {"defs": capped})
            time.sleep(rng.uniform(0.001, 0.006))
            for run_id, _ in rows:
                if not scalar(conn, "SELECT jobs.complete(%s, %s)", (run_id, worker)):
                    refused.append(int(run_id))
    return tally.result(refused=refused)


def _cap_probe(dsn: str, seconds: float) -> dict[str, Any]:
    """Sample RUNNING per definition continuously until the queue is drained."""
    with gated(dsn) as conn:
        return probe(conn, seconds, OVER_CAP_SQL, {"defs": None})


def _claimed_by(results: list[dict[str, Any]]) -> dict[int, list[str]]:
    owners: dict[int, list[str]] = defaultdict(list)
    for result in results:
        for run_id in result["claimed"]:
            owners[run_id].append(result["worker"])
    return owners


# ---------------------------------------------------------------------------
# Invariant 1: a QUEUED run is claimed by at most one claimer
# ---------------------------------------------------------------------------


def test_no_double_claim_across_processes(db: Database, conn: Conn) -> None:
    """Invariant: 8 processes claiming concurrently (batch sizes 1..10) over 5,000 QUEUED runs
    claim every run exactly once, and each run ends RUNNING for the worker that got it."""
    total, workers = 5000, 8
    expected = set(add_runs(conn, total))
    args = [(db.dsn, f"w{i}", i, 120.0) for i in range(workers)]
    results = race(db.dsn, _claim_until_empty, args)

    owners = _claimed_by(results)
    doubles = {run_id: ws for run_id, ws in owners.items() if len(ws) > 1}
    assert not doubles, f"runs claimed more than once (run -> workers): {dict(list(doubles.items())[:20])}"
    oversized = [(r["worker"], r["oversized"]) for r in results if r["oversized"]]
    assert not oversized, f"claim returned more rows than batch_size: {oversized}"
    missing = expected - owners.keys()
    assert not missing, f"{len(missing)} runs never claimed, e.g. {sorted(missing)[:20]}"
    assert owners.keys() == expected
    busy = [r["worker"] for r in results if r["claimed"]]
    assert len(busy) >= 2, f"only {busy} claimed anything: the race did not happen"

    wrong = [
        (run_id, status, worker, owners[run_id][0])
        for run_id, status, worker in conn.execute("SELECT id, status::text, worker FROM jobs.runs")
        if status != "RUNNING" or worker != owners[run_id][0]
    ]
    assert not wrong, f"(run, status, worker in db, worker that claimed it): {wrong[:20]}"


# ---------------------------------------------------------------------------
# Invariant 2: RUNNING per definition never exceeds max_concurrent_runs
# ---------------------------------------------------------------------------


def test_caps_hold_under_concurrent_claimers(db: Database, conn: Conn) -> None:
    """Invariant: with 8 claimer processes (claim, hold a few ms, complete, loop) over 50 capped
    definitions (caps 1..3), no definition ever has more RUNNING runs than its cap, as seen by a
    probe sampling continuously and by each claimer right after its claim commits; and every run
    completes exactly once. Uncapped runs (ad-hoc, and of a definition without a cap) are mixed
    in, so some claims take the one-statement uncapped path while others count caps."""
    rng = random.Random(42)
    caps: dict[int, int] = {}
    expected: set[int] = set()
    for i in range(50):
        cap = rng.randint(1, 3)
        def_id = add_definition(conn, f"capped-{i}", kind="capped", cap=cap)
        caps[def_id] = cap
        expected |= set(add_runs(conn, 20, kind="capped", definition_id=def_id))
    uncapped = add_definition(conn, "uncapped", kind="capped")
    expected |= set(add_runs(conn, 150, kind="capped", definition_id=uncapped))
    expected |= set(add_runs(conn, 150, kind="capped"))
    # Shuffle claim order across definitions so claimers collide on the same definitions.
    conn.execute("UPDATE jobs.runs SET priority = (random() * 10)::int")

    claimers = 8
    parts: list[tuple[Any, tuple[Any, ...]]] = [
        (_cap_claimer, (db.dsn, f"w{i}", i, 120.0)) for i in range(claimers)
    ]
    parts.append((_cap_probe, (db.dsn, 120.0)))
    results = race_parts(db.dsn, parts)

    violations = [v for r in results for v in r["violations"]]
    assert not violations, (
        "definitions above their cap (who saw it, definition, cap, running, run ids, workers): "
        f"{violations[:10]}"
    )
    probe = next(r for r in results if r["worker"] == "probe")
    assert probe["samples"] >= 5, f"the probe sampled only {probe['samples']} times"
    refused = [(r["worker"], r["refused"]) for r in results if r.get("refused")]
    assert not refused, f"complete() refused by the claiming worker: {refused}"

    owners = _claimed_by(results)
    doubles = {run_id: ws for run_id, ws in owners.items() if len(ws) > 1}
    assert not doubles, f"runs claimed more than once: {doubles}"
    assert owners.keys() == expected, f"never claimed: {sorted(expected - owners.keys())[:20]}"
    states = dict(conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall())
    assert states == {"COMPLETED": len(expected)}, states


@pytest.mark.parametrize(
    ("crowd", "others_cap"),
    [
        pytest.param(25, None, id="25-ahead-within-the-oversample"),
        pytest.param(200, 5, id="200-ahead-far-beyond-the-oversample"),
    ],
)
def test_a_crowded_capped_definition_does_not_starve_the_others(
    conn: Conn, crowd: int, others_cap: int | None
) -> None:
    """A cap-1 definition with ``crowd`` higher-priority runs queued ahead of 20 runs of other
    definitions: claim(10) looks at ~4x the batch, and when the capped backlog is far larger
    than that it must still return 10 runs, one of the crowded definition and nine of the others
    (not 1, which would make the others wait for the whole backlog to drain one run at a time)."""
    crowded = add_definition(conn, "crowded", cap=1)
    add_runs(conn, crowd, kind="crowded", definition_id=crowded, priority=10)
    others = [add_definition(conn, f"other-{i}", cap=others_cap) for i in range(4)]
    for def_id in others:
        add_runs(conn, 5, kind="other", definition_id=def_id)

    rows = conn.execute("SELECT id, definition_id FROM jobs.claim(10, 'w')").fetchall()
    defs = [r[1] for r in rows]
    assert defs.count(crowded) == 1, defs
    assert len(defs) == 10, f"claim(10) returned {len(defs)} runs of definitions {defs}"
    # And the crowded definition's next run still waits for its slot: at cap, not lost.
    assert conn.execute("SELECT * FROM jobs.claim(10, 'w2', ARRAY['crowded'])").fetchall() == []


@pytest.mark.parametrize("batch", [1, 5])
def test_runs_with_room_start_behind_two_crowded_capped_definitions(conn: Conn, batch: int) -> None:
    """Two cap-1 definitions, each with 100 runs queued ahead of 5 runs of no definition:
    claims of ``batch`` start one run of each definition and then every other run, none
    coming back empty while one of those is QUEUED. (However many full groups sit ahead of
    a run whose groups all have room, a claim reaches it.)"""
    first = add_definition(conn, "crowded-1", cap=1)
    second = add_definition(conn, "crowded-2", cap=1)
    ahead = [
        add_runs(conn, 100, kind="crowded-1", definition_id=first, priority=3)[0],
        add_runs(conn, 100, kind="crowded-2", definition_id=second, priority=2)[0],
    ]
    free = add_runs(conn, 5, kind="free", priority=1)
    claims: list[list[int]] = []
    while not set(free) <= {i for c in claims for i in c} and len(claims) < 10:
        claims.append([int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(%s, 'w')", (batch,))])
        if not claims[-1]:
            break
    started = sorted(i for c in claims for i in c)
    assert started == sorted(ahead + free), f"claims of {batch}: {claims}; behind the crowds: {free}"
    assert conn.execute("SELECT * FROM jobs.claim(%s, 'w')", (batch,)).fetchall() == []


def test_cap_counts_runs_already_running(conn: Conn) -> None:
    """Runs RUNNING before the claim count against the cap; at cap the rows stay QUEUED."""
    def_id = add_definition(conn, "busy", cap=2)
    ids = add_runs(conn, 5, kind="busy", definition_id=def_id)
    first = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'a')")]
    assert first == ids[:1]
    second = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(10, 'b')")]
    assert second == ids[1:2], "only one slot was left"
    assert conn.execute("SELECT * FROM jobs.claim(10, 'c')").fetchall() == []
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'QUEUED'") == 3
    assert scalar(conn, "SELECT jobs.complete(%s, 'a')", (ids[0],)) is True
    third = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(10, 'c')")]
    assert third == ids[2:3]


def test_a_claim_waiting_for_a_busy_group_gives_way_to_its_holder(db: Database, conn: Conn) -> None:
    """A claim that finds its only group busy waits for it while it holds its pool's rows. When
    the group's holder then needs one of those rows, the claim must give way (poll, return
    nothing, commit), not wait in the lock manager: that wait and the holder's would be a
    deadlock, and one of the two would fail."""
    def_id = add_definition(conn, "contended", cap=5)
    (run_id,) = add_runs(conn, 1, kind="contended", definition_id=def_id)
    outcome: dict[str, Any] = {}
    with db.connect(autocommit=False) as holder, db.connect() as claimer:
        claimer_pid = scalar(claimer, "SELECT pg_backend_pid()")
        holder.execute("SELECT pg_advisory_xact_lock(jobs._dispatch_key(%s))", (def_id,))

        def claim() -> None:
            started = time.monotonic()
            try:
                outcome["ids"] = [r[0] for r in claimer.execute("SELECT id FROM jobs.claim(1, 'w')")]
            except psycopg.Error as error:
                outcome["error"] = f"{error.sqlstate}: {error}"
            outcome["seconds"] = time.monotonic() - started

        thread = threading.Thread(target=claim)
        thread.start()
        try:
            wait_for(
                "the claim to wait for the busy definition's group",
                lambda: scalar(
                    conn,
                    "SELECT wait_event IN ('PgSleep', 'advisory') FROM pg_stat_activity WHERE pid = %s",
                    (claimer_pid,),
                ),
                60,
            )
            holder.execute("SET LOCAL lock_timeout = '60s'")
            try:
                holder.execute("UPDATE jobs.runs SET priority = priority WHERE id = %s", (run_id,))
                holder.commit()
            except psycopg.Error as error:
                outcome["holder_error"] = f"{error.sqlstate}: {error}"
                holder.rollback()
        finally:
            thread.join(120)
    assert "error" not in outcome and "holder_error" not in outcome, outcome
    assert outcome["ids"] == [], f"the group was busy throughout, yet the claim returned {outcome}"
    claimed = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'w')")]
    assert claimed == [run_id], "with the group free, the run is claimed"


def test_a_queue_paused_while_a_claim_waits_for_a_busy_group_starts_nothing(db: Database, conn: Conn) -> None:
    """Invariant: a paused queue starts nothing. A claim polling a capped definition's busy
    group when the queue is paused, and which gets the group once its holder commits, starts
    none of that queue's runs."""
    def_id = add_definition(conn, "paused-meanwhile", cap=5)
    run_ids = add_runs(conn, 3, kind="paused-meanwhile", definition_id=def_id)
    conn.execute("UPDATE jobs.runs SET queue = 'p' WHERE id = ANY(%s)", (run_ids,))
    waited = claim_after_a_wait(
        db,
        conn,
        setup=lambda: conn.execute("SELECT jobs.resume_queue('p')"),
        hold=lambda holder: holder.execute("SELECT pg_advisory_xact_lock(jobs._dispatch_key(%s))", (def_id,)),
        claim=lambda claimer: [r[0] for r in claimer.execute("SELECT id FROM jobs.claim(5, 'w')")],
        meanwhile=lambda: conn.execute("SELECT jobs.pause_queue('p')"),
    )
    assert waited.runs == [], f"a claim started runs of a queue paused while it waited: {waited}"
    statuses = conn.execute("SELECT DISTINCT status::text FROM jobs.runs WHERE id = ANY(%s)", (run_ids,))
    assert statuses.fetchall() == [("QUEUED",)]


def test_a_queue_paused_while_a_claim_waits_then_looks_further_starts_nothing(
    db: Database, conn: Conn
) -> None:
    """Invariant: a paused queue starts nothing, also where the claim goes on past its wait.
    Queue p at max_running 2 with one run RUNNING and three QUEUED; claim(2) finds the queue's
    group busy and polls for it; meanwhile p is paused (committed) and the holder commits. The
    claim then has room for one run, takes a further slice of the queue for the rest of its
    batch, and must start nothing."""
    conn.execute("SELECT jobs.set_limit('queue', 'p', max_running => 2)")
    run_ids: list[int] = []

    def setup() -> None:
        conn.execute("SELECT jobs.resume_queue('p')")
        conn.execute("UPDATE jobs.runs SET status = 'CANCELLED', finished_at = now() WHERE queue = 'p'")
        run_ids[:] = [
            int(
                scalar(
                    conn, "SELECT id FROM jobs.enqueue('k', queue => 'p', run_at => now() - interval '1 s')"
                )
            )
            for _ in range(4)
        ]
        assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'first')")] == run_ids[:1]

    waited = claim_after_a_wait(
        db,
        conn,
        setup=setup,
        hold=lambda holder: holder.execute(
            'SELECT pg_advisory_xact_lock(jobs._limit_key(\'["queue", "p"]\'))'
        ),
        claim=lambda claimer: [r[0] for r in claimer.execute("SELECT id FROM jobs.claim(2, 'w')")],
        meanwhile=lambda: conn.execute("SELECT jobs.pause_queue('p')"),
    )
    assert waited.runs == [], f"a claim started runs of a queue paused while it waited: {waited}"
    statuses = conn.execute(
        "SELECT status::text, count(*) FROM jobs.runs WHERE id = ANY(%s) GROUP BY 1", (run_ids,)
    )
    assert dict(statuses.fetchall()) == {"RUNNING": 1, "QUEUED": 3}


# ---------------------------------------------------------------------------
# Claim order, due time, kinds, worker id
# ---------------------------------------------------------------------------


def test_claim_order_due_time_and_kinds(conn: Conn) -> None:
    """Claim order is priority DESC, then scheduled_for; future runs are not due; kinds filter."""
    low = add_runs(conn, 2, kind="a", priority=0)
    high = add_runs(conn, 2, kind="b", priority=5)
    future = int(scalar(conn, "SELECT id FROM jobs.enqueue('a', run_at => now() + interval '1 hour')"))
    got = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'w', ARRAY['a'])")]
    assert got == low[:1], "kinds => ARRAY['a'] must skip the higher-priority kind b"
    got = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')")]
    assert got == [*high, low[1]], "priority DESC then scheduled_for; the future run is not due"
    assert run_row(conn, future)["status"] == "QUEUED"
    assert conn.execute("SELECT * FROM jobs.claim(10, 'w')").fetchall() == []


def test_claim_marks_running_and_defaults_worker_to_the_session(conn: Conn) -> None:
    (run_id,) = add_runs(conn, 1)
    row = conn.execute(
        "SELECT id, status::text, worker, started_at, heartbeat_at FROM jobs.claim()"
    ).fetchone()
    assert row is not None
    assert row[0] == run_id and row[1] == "RUNNING"
    pid = scalar(conn, "SELECT pg_backend_pid()")
    assert row[2].startswith(f"sql-{pid}-"), row[2]
    assert row[3] is not None and row[4] is None
    # The session-derived id works for the rest of the protocol too.
    assert scalar(conn, "SELECT jobs.complete(%s, %s)", (run_id, row[2])) is True


def test_the_session_worker_is_the_same_at_every_claim_and_a_forged_one_is_not_taken(conn: Conn) -> None:
    """The name a claim without a worker gives is read once per session and kept in a session
    setting: every later claim of the session gives the same name, and a setting that names
    another server process (set by hand, or left by a pooler's previous client of another
    backend) is not taken for this one's."""
    add_runs(conn, 3)
    named = scalar(
        conn,
        "SELECT format('sql-%s-%s', pid, to_char(backend_start, 'YYYYMMDDHH24MISSUS'))"
        " FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    )
    first = scalar(conn, "SELECT worker FROM jobs.claim()")
    again = scalar(conn, "SELECT worker FROM jobs.claim()")
    assert first == again == named, (first, again, named)
    conn.execute("SELECT set_config('pgtick.session_worker', 'sql-1-20260101000000000000', false)")
    forged = scalar(conn, "SELECT worker FROM jobs.claim()")
    assert forged == named, forged


# ---------------------------------------------------------------------------
# overlap_policy = 'skip'
# ---------------------------------------------------------------------------


def test_overlap_skip_cancels_scheduled_occurrence_at_cap(conn: Conn) -> None:
    """overlap_policy skip + cap 1 + one RUNNING run: a due scheduled occurrence is recorded as
    CANCELLED / Skipped by claim; a manual run of the same definition waits (stays QUEUED)."""
    skip_def = add_definition(conn, "nightly", cap=1, overlap="skip")
    queue_def = add_definition(conn, "hourly", cap=1, overlap="queue")
    running = {}
    for def_id in (skip_def, queue_def):
        running[def_id] = scalar(
            conn,
            """
            INSERT INTO jobs.runs (definition_id, kind, origin, status, started_at, worker,
                                   scheduled_for)
            VALUES (%s, 'k', 'schedule', 'RUNNING', now(), 'w0', now() - interval '2 hours')
            RETURNING id
            """,
            (def_id,),
        )
    (occurrence,) = add_runs(conn, 1, definition_id=skip_def, origin="schedule", start="30 min")
    (manual,) = add_runs(conn, 1, definition_id=skip_def, origin="manual", start="20 min")
    (queued_occurrence,) = add_runs(conn, 1, definition_id=queue_def, origin="schedule", start="10 min")

    assert conn.execute("SELECT * FROM jobs.claim(5, 'w1')").fetchall() == []

    skipped = run_row(conn, occurrence)
    assert skipped["status"] == "CANCELLED"
    assert skipped["failure_reason"] == "Skipped"
    assert skipped["finished_at"] is not None and skipped["worker"] is None
    assert run_row(conn, manual)["status"] == "QUEUED", "a manual run waits for capacity"
    assert run_row(conn, queued_occurrence)["status"] == "QUEUED", "overlap_policy queue waits"

    # Once the running one finishes, the manual run gets the slot.
    assert scalar(conn, "SELECT jobs.complete(%s, 'w0')", (running[skip_def],)) is True
    got = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(5, 'w1')")]
    assert got == [manual]


def _skip_policy_definition(conn: Conn, minutes_ago: list[int]) -> tuple[int, list[int]]:
    """A minutely definition (cap 1, overlap_policy skip, max_attempts 3, a jitter) with the runs
    of the occurrences that many minutes ago materialized as the scheduler makes them, in
    occurrence order."""
    def_id = int(
        scalar(
            conn,
            "SELECT id FROM jobs.define('minutely', 'k', '* * * * *', max_concurrent_runs => 1,"
            " overlap_policy => 'skip', max_attempts => 3, jitter => '20 seconds')",
        )
    )
    base = scalar(conn, "SELECT date_trunc('minute', now())")
    occurrences = [base - timedelta(minutes=m) for m in minutes_ago]
    materialize_occurrences(conn, def_id, occurrences, base + timedelta(minutes=1))
    ids = [
        int(r[0])
        for r in conn.execute(
            "SELECT id FROM jobs.runs WHERE definition_id = %s ORDER BY occurrence_at", (def_id,)
        )
    ]
    assert len(ids) == len(occurrences)
    return def_id, ids


def test_overlap_skip_skips_only_new_occurrences_never_a_snoozed_run_or_a_retry(conn: Conn) -> None:
    """overlap_policy skip is for a new occurrence that comes due while the definition is at its
    cap. A run that already started and asked to run later (jobs.snooze), or the retry of one that
    failed, waits for room like a manual run: skipping it would drop work that had begun."""
    _, (failed, snoozed, running, fresh) = _skip_policy_definition(conn, [10, 9, 8, 7])
    claim = "SELECT id FROM jobs.claim(%s, %s)"

    assert [r[0] for r in conn.execute(claim, (1, "w1"))] == [failed]
    retry_id = scalar(conn, "SELECT id FROM jobs.fail(%s, 'w1', ARRAY['Exception'], 'boom')", (failed,))
    assert retry_id != failed and run_row(conn, retry_id)["origin"] == "retry"
    conn.execute(  # its backoff has passed
        "UPDATE jobs.runs SET scheduled_for = now() - interval '1 minute' WHERE id = %s", (retry_id,)
    )
    assert [r[0] for r in conn.execute(claim, (1, "w1"))] == [snoozed]
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w1', '0 seconds')", (snoozed,)) is True
    # The definition's one slot goes to the next occurrence in claim order.
    assert [r[0] for r in conn.execute(claim, (1, "w2"))] == [running]

    # At the cap: the new occurrence is skipped; the snoozed run and the retry wait.
    assert conn.execute(claim, (10, "w3")).fetchall() == []
    got = {
        run_id: (run_row(conn, run_id)["status"], run_row(conn, run_id)["failure_reason"])
        for run_id in (snoozed, retry_id, fresh)
    }
    assert got == {
        snoozed: ("QUEUED", None),
        retry_id: ("QUEUED", None),
        fresh: ("CANCELLED", "Skipped"),
    }, f"only the new occurrence {fresh} may be skipped: {got}"

    # Nothing is lost: each waiting run starts once the slot frees up again.
    started = []
    for _ in range(2):
        worker = run_row(conn, running)["worker"]
        assert scalar(conn, "SELECT jobs.complete(%s, %s)", (running, worker)) is True
        (running,) = [r[0] for r in conn.execute(claim, (10, "w4"))]
        started.append(running)
    assert sorted(started) == sorted([snoozed, retry_id]), started


def test_claim_twice_in_one_transaction_is_refused(conn: psycopg.Connection[Any]) -> None:
    """The first call's dispatch locks live until commit; a second call in the same
    transaction could wait on a lower definition id (a deadlock risk), so it is refused."""
    conn.execute("SELECT jobs.enqueue('k')")
    conn.execute("SELECT jobs.enqueue('k')")
    with pytest.raises(psycopg.errors.InvalidTransactionState, match="already called"):
        with conn.transaction():
            conn.execute("SELECT * FROM jobs.claim(1, 'w')")
            conn.execute("SELECT * FROM jobs.claim(1, 'w')")
    # Rolled back: both runs still queued; separate transactions are fine.
    assert len(conn.execute("SELECT * FROM jobs.claim(1, 'w')").fetchall()) == 1
    assert len(conn.execute("SELECT * FROM jobs.claim(1, 'w')").fetchall()) == 1


def test_claim_can_stamp_the_first_heartbeat(conn: psycopg.Connection[Any]) -> None:
    """heartbeat => true: the run counts as heartbeated from its claim (reaped by the
    heartbeat timeout); by default it counts as never heartbeated (orphan timeout)."""
    conn.execute("SELECT jobs.enqueue('k')")
    conn.execute("SELECT jobs.enqueue('k')")
    plain = conn.execute("SELECT heartbeat_at FROM jobs.claim(1, 'w')").fetchone()
    stamped = conn.execute(
        "SELECT heartbeat_at, started_at FROM jobs.claim(1, 'w', heartbeat => true)"
    ).fetchone()
    assert plain == (None,)
    assert stamped is not None and stamped[0] == stamped[1]


@pytest.mark.parametrize(
    ("history", "defined"),
    [(0, None), (20000, None), (20000, "capped"), (20000, "capped-head"), (20000, "roomy-limit")],
)
def test_claim_walks_the_claim_index_on_a_long_backlog(
    db: Database, history: int, defined: str | None
) -> None:
    """The pool query's plan is made once per session, for any batch size, kinds and queues,
    so it cannot lean on their values: on a long backlog (with or without a history beside
    it) it must walk runs_claim_idx in claim order, never scan and sort jobs.runs, which
    would cost every claim the whole queue. With nothing capped that is the statement that
    also starts the batch; with a capped definition defined, the capped definitions' first
    statement and the steps' first slice; with that definition's runs at the head of the
    queue and at its cap, also the steps' second slice, which looks past them; with a roomy
    limit on the queue, the one that also locks its groups (batches of up to 20) or the full
    steps' (the batch of 100), whose RUNNING count must not scan the table either. Read from
    the transaction's own scan counters, so no timing is involved."""
    with db.connect() as setup:
        if defined in ("capped", "capped-head"):  # "capped": defined, none of its runs queued
            setup.execute(
                "SELECT jobs.define(name => 'capped', kind => 'k', schedule => '@yearly',"
                " max_concurrent_runs => 1)"
            )
            if defined == "capped-head":
                capped = scalar(setup, "SELECT id FROM jobs.definitions WHERE name = 'capped'")
                head = add_runs(setup, 200, definition_id=capped, priority=5)
                setup.execute(
                    "UPDATE jobs.runs SET status = 'RUNNING', started_at = now() WHERE id = %s", (head[0],)
                )
        elif defined == "roomy-limit":
            setup.execute("SELECT jobs.set_limit('queue', 'default', max_running => 10000)")
        setup.execute("ALTER TABLE jobs.runs SET (autovacuum_enabled = false)")
        setup.execute(
            "INSERT INTO jobs.runs (kind, status, finished_at)"
            " SELECT 'k', 'COMPLETED', now() FROM generate_series(1, %s)",
            (history,),
        )
        add_runs(setup, 5000)
        setup.execute("ANALYZE jobs.runs")
    with db.connect() as claimer:  # a new session: the plan is made on its first claim
        for args in ("10, 'w'", "100, 'w', kinds => '{k}', queues => '{default}'", "1, 'w'"):
            with claimer.transaction():
                claimed = claimer.execute(f"SELECT count(*) FROM jobs.claim({args})").fetchone()
                scans = claimer.execute(
                    "SELECT pg_stat_get_xact_numscans('jobs.runs'::regclass),"
                    "       pg_stat_get_xact_numscans('jobs.runs_claim_idx'::regclass)"
                ).fetchone()
            assert claimed is not None and claimed[0] > 0, f"claim({args}) claimed nothing"
            if defined == "capped-head":  # all from behind the capped runs: the second slice
                batch = int(args.split(",")[0])
                assert claimed[0] == batch, f"claim({args}) started {claimed[0]}, expected {batch}"
            assert scans is not None and scans[0] == 0 and scans[1] >= 1, (
                f"claim({args}): {scans[0] if scans else '?'} sequential scans of jobs.runs and"
                f" {scans[1] if scans else '?'} of runs_claim_idx; expected none and at least one"
            )


def test_a_workers_calls_find_their_runs_by_id_not_by_walking_the_running_set(db: Database) -> None:
    """heartbeat, complete_many, complete and fail fence a worker's runs by id; their plans are
    made once per session, from statistics that may have seen nothing RUNNING (taken while the
    queue was filling). With 3,000 runs RUNNING for another worker, a call about one run must
    read runs_pkey and never walk runs_running_idx, which would cost every heartbeat the
    whole RUNNING set. Read from the transaction's own scan counters, so no timing is involved."""
    with db.connect() as setup:
        setup.execute("ALTER TABLE jobs.runs SET (autovacuum_enabled = false)")
        add_runs(setup, 3004)
        setup.execute("ANALYZE jobs.runs")  # statistics with nothing RUNNING
        for _ in range(3):
            setup.execute("SELECT count(*) FROM jobs.claim(1000, 'other')")
        mine = [int(r[0]) for r in setup.execute("SELECT id FROM jobs.claim(4, 'w')")]
    assert len(mine) == 4
    calls = [
        ("SELECT count(*) FROM jobs.heartbeat(%s, 'w')", [mine[0]]),
        ("SELECT count(*) FROM jobs.complete_many(%s, 'w')", [mine[1]]),
        ("SELECT jobs.complete(%s, 'w')::int", mine[2]),
        ("SELECT count((jobs.fail(%s, 'w', message => 'boom')).id)", mine[3]),
    ]
    with db.connect() as worker:  # a new session: each plan is made on its first call
        for sql, arg in calls:
            with worker.transaction():
                done = worker.execute(sql, (arg,)).fetchone()
                scans = worker.execute(
                    "SELECT pg_stat_get_xact_numscans('jobs.runs_running_idx'::regclass),"
                    "       pg_stat_get_xact_numscans('jobs.runs_pkey'::regclass)"
                ).fetchone()
            assert done == (1,), f"{sql}: {done}"
            assert scans is not None and scans[0] == 0 and scans[1] >= 1, (
                f"{sql}: {scans[0] if scans else '?'} scans of runs_running_idx and"
                f" {scans[1] if scans else '?'} of runs_pkey; expected none and at least one"
            )
        statuses = worker.execute(
            "SELECT status::text FROM jobs.runs WHERE id = ANY (%s) ORDER BY id", (mine,)
        ).fetchall()
    assert [s for (s,) in statuses] == ["RUNNING", "COMPLETED", "COMPLETED", "FAILED"]


def _claim_ids(claimer: Conn, n: int) -> list[int]:
    return [int(r[0]) for r in claimer.execute("SELECT id FROM jobs.claim(%s, 'w')", (n,))]


def _hint(claimer: Conn) -> Any:
    """The session's claim hint (pgtick.claim_steps); never set reads as 'off'."""
    return scalar(claimer, "SELECT coalesce(nullif(current_setting('pgtick.claim_steps', true), ''), 'off')")


def _calls_past_the_common_case(claimer: Conn, batch: int) -> tuple[int, int]:
    """Claim ``batch`` in a transaction of its own, with function calls counted; how many runs it
    started and how often it called the private function that holds everything past the common
    case (whose first call in a session compiles most of the claim)."""
    calls = (
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
        " WHERE schemaname = 'jobs' AND funcname = '_claim_rest'"
    )
    with claimer.transaction():  # (counts not yet reported stay in the view: hence the difference)
        claimer.execute("SET LOCAL track_functions = 'all'")
        before = scalar(claimer, calls)
        started = len(claimer.execute("SELECT id FROM jobs.claim(%s, 'w')", (batch,)).fetchall())
        after = scalar(claimer, calls)
    return started, int(after - before)


def test_a_claim_with_nothing_capped_runs_only_the_common_case(db: Database, conn: Conn) -> None:
    """A session whose claims find nothing capped never runs (so never compiles) the rest of
    the claim; a limit, or an empty queue, takes it there."""
    add_runs(conn, 12)
    with db.connect() as claimer:
        claim = partial(_calls_past_the_common_case, claimer, 10)
        assert claim() == (10, 0), "an uncapped claim went past the common case"
        assert claim() == (2, 0), "a claim of the last runs went past the common case"
        assert claim() == (0, 1), "a claim of an empty queue skipped the settings read"
        add_runs(conn, 5)
        conn.execute("SELECT jobs.set_limit('queue', 'default', max_running => 13)")  # 12 RUNNING
        assert claim() == (1, 1), "a claim under a limit did not go past the common case"


def test_a_sessions_hint_of_something_capped_never_outlives_the_cap(db: Database, conn: Conn) -> None:
    """A session whose claim found a limit defined goes straight to the capped steps next time
    (a session hint). The hint must follow the settings both ways: once the limit is gone the
    same session claims the whole batch again, and once one is set again it is kept from the
    first claim after."""
    add_runs(conn, 30)
    conn.execute("SELECT jobs.set_limit('queue', 'default', max_running => 2)")
    with db.connect() as claimer:
        claim, hint = partial(_claim_ids, claimer), partial(_hint, claimer)

        assert len(claim(10)) == 2, "a claim under a limit of 2 started more than 2"
        assert hint() == "on", f"a claim that met a limit left the hint {hint()!r}"
        assert claim(10) == [], "a claim at the limit started more"
        conn.execute("SELECT jobs.remove_limit('queue', 'default')")
        assert len(claim(10)) == 10, "with the limit removed, the hinted session did not claim a full batch"
        assert hint() == "off", f"a claim that found nothing capped left the hint {hint()!r}"
        conn.execute("SELECT jobs.set_limit('queue', 'default', max_running => 13)")
        assert len(claim(10)) == 1, "with 12 RUNNING under a new limit of 13, a claim started other than 1"
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING'") == 13


def test_a_sessions_hint_of_capped_definitions_gives_way_to_whatever_is_set_next(
    db: Database, conn: Conn
) -> None:
    """A session whose claim found only capped definitions claims through their two statements
    next time (the hint 'defs'), and those read the limits themselves: a limit set since then
    is kept from the next claim on, and the hint follows the settings back to the capped
    definitions and, once none is left, to nothing capped."""
    capped = add_definition(conn, "capped", kind="k", cap=2)
    add_runs(conn, 20, definition_id=capped)
    add_runs(conn, 200)
    with db.connect() as claimer:
        claim, hint = partial(_claim_ids, claimer), partial(_hint, claimer)

        def running(sql: str = "TRUE") -> Any:
            return scalar(conn, f"SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING' AND {sql}")

        assert len(claim(10)) == 10
        assert hint() == "defs", f"a claim that met only a capped definition left the hint {hint()!r}"
        assert len(claim(10)) == 10, "the capped definitions' statements did not fill the batch"
        assert running(f"definition_id = {capped}") == 2, "the capped definition runs other than its cap"

        conn.execute("SELECT jobs.set_limit('kind', 'k', max_running => 23)")
        got = len(claim(10))
        assert got == 3, f"a session hinted 'defs', under a new limit of 23 with 20 RUNNING, started {got}"
        assert hint() == "on", f"a claim that met a limit left the hint {hint()!r}"
        conn.execute("SELECT jobs.remove_limit('kind', 'k')")
        assert len(claim(10)) == 10
        assert hint() == "defs", f"with the limit gone the hint is {hint()!r}"

        conn.execute("DELETE FROM jobs.runs WHERE definition_id = %s AND status = 'QUEUED'", (capped,))
        conn.execute("UPDATE jobs.definitions SET max_concurrent_runs = NULL WHERE id = %s", (capped,))
        assert len(claim(10)) == 10
        assert hint() == "off", f"with nothing capped any more the hint is {hint()!r}"
        assert len(claim(10)) == 10
        assert running() == 53


#: The capped definitions whose dispatch lock the session ``pid`` holds (key: sql/helpers.sql).
HELD_DEFINITIONS_SQL = """
SELECT coalesce(array_agg(d.name ORDER BY d.name), '{}')
  FROM jobs.definitions AS d
  JOIN pg_locks AS l
    ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = %s
   AND (l.classid::bigint << 32) | l.objid::bigint = hashtextextended('dispatch:' || d.id, 0)
"""


def test_a_capped_claim_locks_only_the_definitions_it_is_likely_to_start(db: Database, conn: Conn) -> None:
    """A claim through the capped definitions' statements holds each definition's dispatch lock
    until it commits, and every claimer whose pool meets that definition meanwhile finds it
    busy. So it tries the locks in pool order only until the room it reads covers the batch,
    and never tries a definition already at its cap: a second claimer, while the first has not
    committed, starts runs of the definitions the first left alone."""
    ids = {name: add_definition(conn, name, kind="k", cap=2) for name in ("d1", "d2", "d3", "d4", "d5", "d6")}
    full = add_runs(conn, 2, definition_id=ids["d2"], start="2 hours")
    conn.execute(
        "UPDATE jobs.runs SET status = 'RUNNING', started_at = now(), worker = 'x' WHERE id = ANY (%s)",
        (full,),
    )
    # 24 runs, the six definitions in turn: d1, d2, ..., d6, d1, d2, ...
    conn.execute(
        """
        INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for)
        SELECT (%s::bigint[])[1 + (g - 1) %% 6], 'k', 'manual',
               now() - interval '1 hour' + g * interval '1 ms'
          FROM generate_series(1, 24) AS g
        """,
        ([ids[n] for n in ("d1", "d2", "d3", "d4", "d5", "d6")],),
    )
    name_of = {v: k for k, v in ids.items()}
    with db.connect(autocommit=False) as first, db.connect(autocommit=False) as second:
        for session in (first, second):
            session.execute("SET pgtick.claim_steps = 'defs'")
            session.commit()
        got = first.execute("SELECT definition_id FROM jobs.claim(2, 'first')").fetchall()
        assert sorted(name_of[d] for (d,) in got) == ["d1", "d3"], got
        pid = scalar(first, "SELECT pg_backend_pid()")
        held = scalar(conn, HELD_DEFINITIONS_SQL, (pid,))
        assert held == ["d1", "d3"], f"a claim of 2 (d1 has room for 2, d2 is full) holds the locks of {held}"

        # d3 is busy (the first holds it); d4 and d5 are free only because the first left them.
        got = second.execute("SELECT definition_id FROM jobs.claim(2, 'second')").fetchall()
        assert sorted(name_of[d] for (d,) in got) == ["d4", "d5"], got
        first.commit()
        second.commit()
    running = dict(
        conn.execute(
            "SELECT definition_id, count(*) FROM jobs.runs WHERE status = 'RUNNING' GROUP BY 1"
        ).fetchall()
    )
    assert {name_of[d]: n for d, n in running.items()} == {"d1": 1, "d2": 2, "d3": 1, "d4": 1, "d5": 1}


def test_a_sessions_hint_of_roomy_limits_gives_way_to_whatever_is_set_next(db: Database, conn: Conn) -> None:
    """A session whose claim found only roomy limits goes straight to their two statements next
    time (the hint 'roomy'), and those read the settings themselves: a tight limit, a capped
    definition or the claim-token rule set since then is kept from the next claim on, and the
    hint follows the settings back to the roomy limits and to nothing capped."""
    add_runs(conn, 200)
    conn.execute("SELECT jobs.set_limit('queue', 'default', max_running => 10000)")
    with db.connect() as claimer:
        claim, hint = partial(_claim_ids, claimer), partial(_hint, claimer)

        def running() -> Any:
            return scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING'")

        assert len(claim(10)) == 10
        assert hint() == "roomy", f"a claim that met only a roomy limit left the hint {hint()!r}"
        assert len(claim(10)) == 10 and running() == 20

        conn.execute("SELECT jobs.set_limit('kind', 'k', max_running => 22)")
        assert len(claim(10)) == 2, "a session hinted 'roomy' passed a tight limit (22, with 20 RUNNING)"
        assert hint() == "on", f"a claim that met a tight limit left the hint {hint()!r}"
        conn.execute("SELECT jobs.remove_limit('kind', 'k')")
        assert len(claim(10)) == 10
        assert hint() == "roomy", f"with the tight limit gone the hint is {hint()!r}"

        conn.execute(
            "SELECT jobs.define(name => 'capped', kind => 'z', schedule => '@yearly',"
            " max_concurrent_runs => 1)"
        )
        assert len(claim(10)) == 10
        assert hint() == "on", f"a session hinted 'roomy' missed a capped definition: hint {hint()!r}"
        conn.execute("SELECT jobs.undefine('capped')")
        assert len(claim(10)) == 10
        assert hint() == "roomy", f"with the capped definition gone the hint is {hint()!r}"

        conn.execute("UPDATE jobs.config SET require_claim_token = true")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="claim_token is required"):
            claim(10)
        conn.execute("UPDATE jobs.config SET require_claim_token = false")
        assert running() == 52, "a claim refused for want of a claim token started runs"

        conn.execute("SELECT jobs.remove_limit('queue', 'default')")
        assert len(claim(10)) == 10
        assert hint() == "off", f"with no limit left, a session hinted 'roomy' kept the hint {hint()!r}"
        assert running() == 62


#: The sessions holding a claim slot in this database (keys 'pgtickS0'..'pgtickS2': sql/helpers.sql).
SLOT_HOLDERS_SQL = """
SELECT coalesce(array_agg(l.pid ORDER BY l.pid), '{}')
  FROM pg_locks AS l
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
   AND (l.classid::bigint << 32) | l.objid::bigint BETWEEN 8099570450837492528 AND 8099570450837492530
"""


@pytest.mark.parametrize("hint", ["unset", "defs"])
def test_at_most_three_claims_of_capped_runs_are_in_progress_at_once(
    db: Database, conn: Conn, hint: str
) -> None:
    """A claim of capped runs holds the dispatch locks of its groups until it commits, and claims
    beyond a few at once mostly find one another's groups busy. So each takes one of three claim
    slots before it locks anything, until its commit. A fourth while three are open tries for a
    tenth of a second, then claims without one: a transaction left open after its claim holds
    the others up no longer than that. The first claim of a session reads the settings in the
    steps; a session hinted 'defs' claims through the capped definitions' statements."""
    kinds = [f"k{i}" for i in range(4)]
    for k in kinds:  # a definition per session, so that no claim finds another's group busy
        add_runs(conn, 10, kind=k, definition_id=add_definition(conn, f"capped-{k}", kind=k, cap=100))
    sessions = [db.connect(autocommit=False) for _ in kinds]
    try:
        for s in sessions:
            if hint != "unset":
                s.execute("SELECT set_config('pgtick.claim_steps', %s, false)", (hint,))
            s.commit()

        def claim(i: int) -> int:
            sql = "SELECT id FROM jobs.claim(2, %s, %s)"
            return len(sessions[i].execute(sql, (f"w{i}", [kinds[i]])).fetchall())

        pids = [scalar(s, "SELECT pg_backend_pid()") for s in sessions]
        for s in sessions:
            s.commit()
        for i in range(3):
            assert claim(i) == 2
        holders = scalar(conn, SLOT_HOLDERS_SQL)
        first_three = sorted(pids[:3])
        assert holders == first_three, f"three open claims: {holders} hold the slots, not {first_three}"

        began = time.monotonic()
        assert claim(3) == 2, "a fourth claim while three hold the slots did not claim"
        waited = time.monotonic() - began
        assert waited >= 0.1, f"the fourth claim found no slot free but gave up trying after {waited:.3f} s"
        holders = scalar(conn, SLOT_HOLDERS_SQL)
        assert holders == sorted(pids[:3]), f"the slots are held by {holders} after the fourth claim"

        sessions[0].commit()
        sessions[3].commit()
        assert claim(3) == 2
        holders = scalar(conn, SLOT_HOLDERS_SQL)
        assert holders == sorted(pids[1:]), f"with a slot free, a claim left the slots to {holders}"
        for s in sessions:
            s.rollback()
        holders = scalar(conn, SLOT_HOLDERS_SQL)
        assert holders == [], f"claims that ended left the slots held by {holders}"
    finally:
        for s in sessions:
            s.close()


@pytest.mark.parametrize(
    ("setup", "takes_slot"),
    [
        ("SELECT 1", False),
        ("SELECT jobs.set_limit('kind', 'k', max_running => 1000)", False),
        ("SELECT jobs.set_limit('kind', 'k', max_running => 100)", True),
        ("SELECT jobs.set_limit('queue', 'default', rate_limit => 1000, rate_period => '1 minute')", False),
        ("SELECT jobs.set_limit('queue', 'default', rate_limit => 100, rate_period => '1 minute')", True),
    ],
    ids=["nothing-capped", "roomy-limit", "tight-limit", "roomy-rate-limit", "tight-rate-limit"],
)
def test_only_claims_of_capped_runs_take_a_claim_slot(
    db: Database, conn: Conn, setup: str, takes_slot: bool
) -> None:
    """Claims of runs under no cap, or only under roomy limits (500 or more running and starts
    per period: locked shared, many claims at once), take no claim slot: only those that may
    lock a group exclusively do."""
    conn.execute(setup)
    add_runs(conn, 20)
    with db.connect(autocommit=False) as claimer:
        pid = scalar(claimer, "SELECT pg_backend_pid()")
        claimer.commit()
        for _ in range(2):  # the session's first claim, then one with its hint set
            assert len(claimer.execute("SELECT id FROM jobs.claim(5, 'w')").fetchall()) == 5
            holders = scalar(conn, SLOT_HOLDERS_SQL)
            assert holders == ([pid] if takes_slot else []), f"{setup}: the slots are held by {holders}"
            claimer.commit()
