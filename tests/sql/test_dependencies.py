"""Dependencies (jobs.enqueue depends_on): a run is not claimable until every run it depends
on has COMPLETED by its retry chain's final outcome; a dependency that fails for good or is
cancelled cancels its dependents (DependencyFailed), down the chain. Concurrency tests use
real processes and check the final rows."""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from harness import (
    BlockedCall,
    Conn,
    Database,
    add_definition,
    add_runs,
    expect_error,
    gated,
    materialize_occurrences,
    race,
    run_row,
    scalar,
    wait_for,
)


def _enqueue(conn: Conn, kind: str = "k", deps: list[int] | None = None, **extra: Any) -> int:
    args = ", ".join(f"{k} => %({k})s" for k in extra)
    sql = (
        "SELECT id FROM jobs.enqueue(%(kind)s, run_at => now() - interval '1 s',"
        " depends_on => %(deps)s::bigint[]"
    )
    sql += (", " + args if args else "") + ")"
    return int(scalar(conn, sql, {"kind": kind, "deps": deps, **extra}))


def _claim(conn: Conn, n: int = 10, worker: str = "w") -> list[int]:
    return sorted(int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(%s, %s)", (n, worker)))


def _status(conn: Conn, run_id: int) -> tuple[str, str | None]:
    row = run_row(conn, run_id)
    return row["status"], row["failure_reason"]


def test_chain_runs_one_after_another(conn: Conn) -> None:
    a = _enqueue(conn)
    b = _enqueue(conn, deps=[a])
    c = _enqueue(conn, deps=[b])
    assert _claim(conn) == [a]
    conn.execute("SELECT jobs.complete(%s, 'w')", (a,))
    assert _claim(conn) == [b]
    conn.execute("SELECT jobs.complete(%s, 'w')", (b,))
    assert _claim(conn) == [c]


def test_fan_in_waits_for_every_dependency(conn: Conn) -> None:
    parts = [_enqueue(conn) for _ in range(3)]
    join = _enqueue(conn, deps=parts)
    assert _claim(conn) == parts
    blocked = conn.execute("SELECT id, waiting_on FROM jobs.blocked").fetchall()
    assert blocked == [(join, parts)], blocked
    conn.execute("SELECT jobs.complete(%s, 'w')", (parts[0],))
    conn.execute("SELECT * FROM jobs.complete_many(%s, 'w')", (parts[1:2],))
    assert _claim(conn) == []
    assert conn.execute("SELECT waiting_on FROM jobs.blocked").fetchall() == [([parts[2]],)]
    conn.execute("SELECT jobs.complete(%s, 'w')", (parts[2],))
    assert _claim(conn) == [join]


def test_fan_out_releases_every_dependent(conn: Conn) -> None:
    root = _enqueue(conn)
    leaves = [_enqueue(conn, deps=[root]) for _ in range(5)]
    assert _claim(conn) == [root]
    conn.execute("SELECT jobs.complete(%s, 'w')", (root,))
    assert _claim(conn) == leaves


def test_already_completed_dependency_is_met_at_enqueue(conn: Conn) -> None:
    a = _enqueue(conn)
    _claim(conn)
    conn.execute("SELECT jobs.complete(%s, 'w')", (a,))
    b = _enqueue(conn, deps=[a])
    assert run_row(conn, b)["blocked"] is False
    assert _claim(conn) == [b]


def test_a_unique_enqueue_that_meets_a_queued_run_leaves_it_waiting_on_its_own_dependencies(
    conn: Conn,
) -> None:
    """A replace (without depends_on: it refuses one) gives the run a new payload and keeps
    what it waits on; ignore and debounce check a depends_on they are given but leave the run's
    own. The run starts once its own dependency completes, with the replaced payload."""
    prep = _enqueue(conn, "prep")
    later = _enqueue(conn, "prep")
    waiting = _enqueue(conn, "k", deps=[prep], unique_key="u")
    _claim(conn)  # prep and later start; the run of the key waits on prep
    for on_conflict in ["ignore", "debounce"]:
        again = _enqueue(conn, "k", deps=[later], unique_key="u", on_conflict=on_conflict)
        assert again == waiting, f"{on_conflict}: a second run {again} of the key"
    replaced = int(
        scalar(
            conn,
            "SELECT id FROM jobs.enqueue('k', '{\"v\": 2}', run_at => now() - interval '1 s',"
            " unique_key => 'u', on_conflict => 'replace')",
        )
    )
    row = run_row(conn, waiting)
    after = (replaced, row["payload"], row["depends_on"], row["blocked"])
    assert after == (waiting, {"v": 2}, [prep], True), row
    assert _claim(conn) == [], "the run of the key started before the run it depends on completed"
    conn.execute("SELECT jobs.complete(%s, 'w')", (prep,))
    assert _claim(conn) == [waiting], "the run of the key did not start once its dependency completed"


def test_failure_for_good_cascades_down_the_chain(conn: Conn) -> None:
    a = _enqueue(conn)
    b = _enqueue(conn, deps=[a])
    c = _enqueue(conn, deps=[b])
    other = _enqueue(conn)
    _claim(conn)
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'boom')", (a,))
    assert _status(conn, b) == ("CANCELLED", "DependencyFailed")
    assert _status(conn, c) == ("CANCELLED", "DependencyFailed")
    assert _status(conn, other) == ("RUNNING", None)
    late = _enqueue(conn, deps=[a])
    assert _status(conn, late) == ("CANCELLED", "DependencyFailed")


def test_cancel_of_a_dependency_cascades(conn: Conn) -> None:
    a = int(scalar(conn, "SELECT id FROM jobs.enqueue('k', run_at => now() + interval '1 hour')"))
    b = _enqueue(conn, deps=[a])
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (a,)) == "CANCELLED"
    assert _status(conn, b) == ("CANCELLED", "DependencyFailed")


def test_a_wide_cascade_walks_the_dependency_index_not_every_blocked_run(conn: Conn) -> None:
    """Cancelling the roots of 1,250 four-deep chains among 10,000 (40,000 blocked runs) cancels
    the 5,000 dependents in seconds: the cascade probes the depends_on index one level at a time.
    A walk that filters every blocked run once per doomed run (5,000 x 40,000 array tests)
    takes minutes and holds the cancelled roots' locks all that while."""
    roots = add_runs(conn, 10_000, kind="root", definition_id=add_definition(conn, "roots", kind="root"))
    conn.execute("UPDATE jobs.runs SET definition_id = NULL WHERE id = ANY (%s)", (roots[len(roots) // 8 :],))
    level = roots
    for depth in range(1, 5):
        level = [
            int(r[0])
            for r in conn.execute(
                """
                INSERT INTO jobs.runs (kind, origin, scheduled_for, depends_on, blocked)
                SELECT %s, 'manual', now(), ARRAY[p], TRUE
                  FROM unnest(%s::bigint[]) WITH ORDINALITY AS u (p, n)
                 ORDER BY n
                RETURNING id
                """,
                (f"level{depth}", level),
            )
        ]
    conn.execute("ANALYZE jobs.runs")
    conn.execute("SET statement_timeout = '120s'")
    began = time.monotonic()
    assert scalar(conn, "SELECT jobs.cancel_queued('roots')") == 1_250
    took = time.monotonic() - began
    cascaded = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE failure_reason = 'DependencyFailed'")
    assert cascaded == 5_000, f"{cascaded} dependents cancelled, expected 5000"
    assert took < 10, f"cancelling 1250 roots with 5000 dependents among 40000 blocked runs took {took:.1f}s"


@pytest.mark.parametrize("ending", ["cancel", "fail", "reap"])
def test_a_cascade_planned_on_statistics_from_before_its_dependents_probes_them_by_their_index(
    db: Database, ending: str
) -> None:
    """One run with 5,000 dependents, enqueued after jobs.runs was analyzed with 3,000 other runs
    QUEUED and none blocked (autoanalyze lags a burst of enqueues). Ending it, by cancel, a final
    failure or the reaper, cancels every dependent, each found through the depends_on index: a
    probe planned with the QUEUED test inside it also read runs_claim_idx, every QUEUED run once
    per dependent (tens of seconds here, holding the ended run's locks). Read from the
    transaction's own scan counters, so no timing is involved."""
    with db.connect() as conn:
        conn.execute("ALTER TABLE jobs.runs SET (autovacuum_enabled = false)")
        add_runs(conn, 3_000, kind="other")
        conn.execute("ANALYZE jobs.runs")
        root = _enqueue(conn, "root")
        dependents = scalar(
            conn,
            "SELECT count(*) FROM jobs.enqueue_many('leaf', (SELECT jsonb_agg('{}'::jsonb)"
            " FROM generate_series(1, 5000)), depends_on => ARRAY[%s]::bigint[])",
            (root,),
        )
        assert dependents == 5_000
        if ending != "cancel":
            claimed = conn.execute("SELECT id FROM jobs.claim(1, 'w', kinds => ARRAY['root'])").fetchall()
            assert claimed == [(root,)], claimed
        if ending == "reap":
            conn.execute(
                "UPDATE jobs.runs SET heartbeat_at = now() - interval '2 hours',"
                " started_at = now() - interval '2 hours' WHERE id = %s",
                (root,),
            )
        call = {
            "cancel": "SELECT jobs.cancel(%(root)s) IS NOT NULL",
            "fail": "SELECT jobs.fail(%(root)s, 'w', message => 'boom') IS NOT NULL",
            "reap": "SELECT jobs.reap() IS NOT NULL",
        }[ending]
        with conn.transaction():
            conn.execute("SET LOCAL statement_timeout = '300s'")
            conn.execute(call, {"root": root})
            scans = conn.execute(
                "SELECT pg_stat_get_xact_numscans('jobs.runs_claim_idx'::regclass),"
                "       pg_stat_get_xact_numscans('jobs.runs_depends_on_idx'::regclass)"
            ).fetchone()
        assert scans is not None and scans[0] < 100 and scans[1] >= 5_000, (
            f"{ending}: {scans} scans of runs_claim_idx and runs_depends_on_idx; expected a"
            " probe of the depends_on index per dependent and no walk of the QUEUED runs per probe"
        )
        cascaded = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE failure_reason = 'DependencyFailed'")
        assert cascaded == 5_000, f"{ending}: {cascaded} dependents cancelled, expected 5000"


def test_a_dependent_enqueued_while_the_cascade_waits_for_its_dependency_is_cancelled_too(
    db: Database, conn: Conn
) -> None:
    """b waits on a, c is being enqueued on b (its transaction holds b FOR SHARE) when a fails
    for good: the cascade waits for b's lock, and once c commits it must cancel c as well, not
    leave it blocked forever on a cancelled run."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 1)")
    a = _enqueue(conn)
    b = _enqueue(conn, deps=[a])
    assert _claim(conn) == [a]
    with db.connect(autocommit=False) as enqueuer, db.connect() as failer:
        c = _enqueue(enqueuer, deps=[b])  # b locked FOR SHARE until this commits
        failing = BlockedCall(
            conn,
            failer,
            lambda: scalar(failer, "SELECT jobs.fail(%s, 'w', '{Boom}', 'boom')::text", (a,)),
            "the cascade to wait for b's lock",
        )
        enqueuer.commit()
        outcome = failing.join(60)
    assert len(outcome) == 1, outcome
    assert not isinstance(outcome[0], Exception), outcome
    states = {r: _status(conn, r) for r in (a, b, c)}
    assert states[b] == ("CANCELLED", "DependencyFailed"), states
    assert states[c] == ("CANCELLED", "DependencyFailed"), f"c left waiting on a cancelled run: {states}"


def test_acknowledged_cancel_and_reaped_runs_cascade(conn: Conn) -> None:
    a = _enqueue(conn)
    b = _enqueue(conn, deps=[a])
    lost = _enqueue(conn)
    lost_dep = _enqueue(conn, deps=[lost])
    _claim(conn)
    conn.execute("SELECT jobs.cancel(%s)", (a,))
    conn.execute("SELECT jobs.acknowledge_cancel(%s, 'w')", (a,))
    assert _status(conn, b) == ("CANCELLED", "DependencyFailed")
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 1)")
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 day' WHERE id = %s", (lost,))
    conn.execute("SELECT * FROM jobs.reap()")
    assert _status(conn, lost) == ("FAILED", "HeartbeatLost")
    assert _status(conn, lost_dep) == ("CANCELLED", "DependencyFailed")


def test_a_dependency_retried_then_completed_releases_its_dependents(conn: Conn) -> None:
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3, backoff_initial => '0', jitter => 0)")
    a = _enqueue(conn)
    b = _enqueue(conn, deps=[a])
    _claim(conn)
    retry = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{Flaky}', 'first try')", (a,)))
    assert retry != a
    assert _status(conn, b) == ("QUEUED", None) and run_row(conn, b)["blocked"] is True
    late = _enqueue(conn, deps=[a])  # enqueued while the chain is mid-retry: still waits
    assert run_row(conn, late)["blocked"] is True
    assert _claim(conn) == [retry]
    conn.execute("SELECT jobs.complete(%s, 'w')", (retry,))
    assert _claim(conn) == sorted([b, late])


def test_reaped_then_retried_dependency_keeps_dependents_waiting(conn: Conn) -> None:
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)")
    a = _enqueue(conn)
    b = _enqueue(conn, deps=[a])
    _claim(conn)
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 day' WHERE id = %s", (a,))
    retry = conn.execute("SELECT retry_run_id FROM jobs.reap()").fetchone()
    assert retry is not None and retry[0] is not None
    assert _status(conn, b) == ("QUEUED", None)
    assert _claim(conn) == [retry[0]]
    conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'again')", (retry[0],))
    assert _status(conn, b) == ("CANCELLED", "DependencyFailed")


def _open_chain(conn: Conn) -> tuple[int, int, int, int]:
    """A run that waits on a chain two attempts into its retries: (first, second, third
    attempt, the waiting run). The first two FAILED, the third is QUEUED."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3, backoff_initial => '0', jitter => 0)")
    first = _enqueue(conn)
    waiting = _enqueue(conn, "w", deps=[first])
    assert _claim(conn) == [first]
    second = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'one')", (first,)))
    assert _claim(conn) == [second]
    third = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'two')", (second,)))
    return first, second, third, waiting


def test_discard_and_prune_keep_the_failed_attempts_of_a_chain_a_run_waits_on(conn: Conn) -> None:
    """Releasing a waiting run follows its dependency's retry chain from the id it names:
    deleting an earlier attempt would leave it blocked for good."""
    first, second, third, waiting = _open_chain(conn)
    assert scalar(conn, "SELECT jobs.discard(%s)", ([first, second],)) == 0
    assert scalar(conn, "SELECT jobs.prune_count('0 s')") == 0
    assert scalar(conn, "SELECT jobs.prune('0 s')") == 0
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s)", ([first, second],)) == 2

    assert _claim(conn) == [third]
    conn.execute("SELECT jobs.complete(%s, 'w')", (third,))
    assert run_row(conn, waiting)["blocked"] is False, "the chain completed: the waiting run is free"
    assert scalar(conn, "SELECT jobs.discard(%s)", ([first],)) == 1, "waited on no more: discarded"
    assert scalar(conn, "SELECT jobs.prune_count('0 s')") == 2
    assert scalar(conn, "SELECT jobs.prune('0 s')") == 2  # the second attempt and the third


def test_prune_passes_over_the_kept_attempts_to_the_runs_behind_them(conn: Conn) -> None:
    """The kept attempts are the oldest finished runs here, and the batch holds one run: prune
    still deletes the run behind them rather than picking the kept ones every time."""
    first, second, _, _ = _open_chain(conn)
    conn.execute(
        "UPDATE jobs.runs SET finished_at = now() - interval '2 days' WHERE id = ANY(%s)", ([first, second],)
    )
    done = _enqueue(conn, "plain")
    assert scalar(conn, "SELECT id FROM jobs.claim(1, 'w2', ARRAY['plain'])") == done
    conn.execute("SELECT jobs.complete(%s, 'w2')", (done,))
    conn.execute("UPDATE jobs.runs SET finished_at = now() - interval '1 day' WHERE id = %s", (done,))
    assert scalar(conn, "SELECT jobs.prune('12 hours', 1)") == 1
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE id = %s", (done,)) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s)", ([first, second],)) == 2


def test_a_discarded_chain_that_fails_for_good_still_cancels_the_run_waiting_on_it(conn: Conn) -> None:
    first, second, third, waiting = _open_chain(conn)
    assert scalar(conn, "SELECT jobs.discard(%s)", ([first, second],)) == 0
    assert _claim(conn) == [third]
    conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'three')", (third,))
    assert _status(conn, waiting) == ("CANCELLED", "DependencyFailed")


def test_a_discard_never_cuts_a_retry_chain_between_attempts_that_stay(conn: Conn) -> None:
    """A chain is followed by retry_of: with a middle attempt deleted, the first would read as
    the chain's end, so a run naming it would be cancelled while the last attempt may still
    complete, and jobs.retry of the first would queue the job a second time. The middle
    attempts stay; the first attempts may go (together), and so may the last."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 4, backoff_initial => '0', jitter => 0)")
    first = _enqueue(conn)
    attempts = [first]
    for message in ("one", "two", "three"):
        assert _claim(conn) == [attempts[-1]]
        failed = scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', %s)", (attempts[-1], message))
        attempts.append(int(failed))
    second, third, fourth = attempts[1:]
    assert _status(conn, fourth) == ("QUEUED", None)
    for cut in ([second], [third], [second, third]):
        assert scalar(conn, "SELECT jobs.discard(%s)", (cut,)) == 0, f"discard({cut}) cut the chain"
    expect_error(conn, "SELECT jobs.retry(%s)", (first,), "22023", "already retried")

    waiting = _enqueue(conn, "w", deps=[first])
    assert _status(conn, waiting) == ("QUEUED", None), "the chain's last attempt is still queued"
    assert _claim(conn) == [fourth]
    conn.execute("SELECT jobs.complete(%s, 'w')", (fourth,))
    assert run_row(conn, waiting)["blocked"] is False, "the chain completed: the waiting run is free"
    assert scalar(conn, "SELECT jobs.discard(%s)", ([first, second],)) == 2, "the first attempts may go"


@pytest.mark.parametrize(
    "call",
    [
        "SELECT jobs.complete(%(run)s, 'w')",
        "SELECT * FROM jobs.complete_many(ARRAY[%(run)s]::bigint[], 'w')",
        "SELECT jobs.fail(%(run)s, 'w', '{E}', 'for good')",
        "SELECT jobs.cancel(%(queued)s)",
        "SELECT jobs.cancel_queued('d')",
    ],
)
def test_ending_a_run_needs_read_committed(conn: Conn, call: str) -> None:
    """The decision for the runs waiting on this one reads them after waiting for their locks:
    a snapshot older than the statement would miss what committed since the transaction began
    (an enqueue naming it, another dependency completing), and SERIALIZABLE catches that only
    against other SERIALIZABLE transactions. Refused, with nothing changed; READ COMMITTED runs."""
    add_definition(conn, name="d")
    run = _enqueue(conn)
    _claim(conn)
    queued = int(scalar(conn, "SELECT id FROM jobs.run_now('d')"))
    waiting = _enqueue(conn, "w", deps=[run, queued])
    params = {"run": run, "queued": queued}
    before = conn.execute("SELECT id, status, blocked FROM jobs.runs ORDER BY id").fetchall()
    for level in ("REPEATABLE READ", "SERIALIZABLE"):
        conn.execute(f"BEGIN ISOLATION LEVEL {level}")
        expect_error(conn, call, params, "25000", "needs READ COMMITTED", level)
        conn.execute("ROLLBACK")
    assert conn.execute("SELECT id, status, blocked FROM jobs.runs ORDER BY id").fetchall() == before
    conn.execute(call, params)
    after = conn.execute("SELECT id, status FROM jobs.runs ORDER BY id").fetchall()
    assert after != [(r[0], r[1]) for r in before], f"{call} changed nothing: {after}"
    assert _status(conn, waiting)[0] in ("QUEUED", "CANCELLED")


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_an_enqueue_with_depends_on_needs_read_committed(db: Database, conn: Conn, level: str) -> None:
    """Whether the new run waits is decided from the dependency chains read after locking them:
    a snapshot taken before an operator's jobs.retry of a cancelled dependency committed misses
    the retry, and the new run would be cancelled as DependencyFailed while the retry may still
    complete. Refused (enqueue, enqueue_many and jobs.retry of a run that waits), nothing changed."""
    dependency = _enqueue(conn)
    conn.execute("SELECT jobs.cancel(%s)", (dependency,))
    cancelled = _enqueue(conn, "w", deps=[dependency])
    assert _status(conn, cancelled) == ("CANCELLED", "DependencyFailed")
    calls = [
        "SELECT jobs.enqueue('w', depends_on => %(deps)s)",
        "SELECT count(*) FROM jobs.enqueue_many('w', '[{}]', depends_on => %(deps)s)",
    ]
    refused = ("depends_on", "needs READ COMMITTED")
    with psycopg.connect(db.dsn, autocommit=True) as other:
        other.execute(f"BEGIN ISOLATION LEVEL {level}")
        other.execute("SELECT count(*) FROM jobs.runs")  # the snapshot is taken
        retry = int(scalar(conn, "SELECT id FROM jobs.retry(%s)", (dependency,)))
        before = conn.execute("SELECT id, status FROM jobs.runs ORDER BY id").fetchall()
        for call in calls:
            expect_error(other, call, {"deps": [dependency]}, "25000", *refused, level)
            other.execute("ROLLBACK")
            other.execute(f"BEGIN ISOLATION LEVEL {level}")
        expect_error(other, "SELECT jobs.retry(%s)", (cancelled,), "25000", *refused, level)
        other.execute("ROLLBACK")
        assert conn.execute("SELECT id, status FROM jobs.runs ORDER BY id").fetchall() == before
        waiting = int(scalar(other, "SELECT id FROM jobs.enqueue('w', depends_on => %s)", ([dependency],)))
    assert _status(conn, waiting) == ("QUEUED", None), "the chain goes on in its retry"
    assert run_row(conn, waiting)["blocked"] is True
    assert _claim(conn) == [retry]


# ---------------------------------------------------------------------------
# Concurrency: real processes, final rows
# ---------------------------------------------------------------------------


def _complete_one(dsn: str, run_id: int) -> bool:
    with gated(dsn) as conn:
        with conn.transaction():
            ok = bool(scalar(conn, "SELECT jobs.complete(%s, 'w')", (run_id,)))
            conn.execute("SELECT pg_sleep(0.05)")  # both completions in flight together
        return ok


def test_fan_in_released_when_its_dependencies_complete_at_the_same_time(db: Database, conn: Conn) -> None:
    """Invariant: two dependencies completed concurrently in two processes (each transaction
    open while the other commits) release the run that waits on both: neither completion
    may miss the other."""
    for attempt in range(5):
        a, b = _enqueue(conn), _enqueue(conn)
        join = _enqueue(conn, deps=[a, b])
        assert _claim(conn, 2) == [a, b]
        done = race(db.dsn, _complete_one, [(db.dsn, a), (db.dsn, b)])
        assert done == [True, True]
        row = run_row(conn, join)
        assert row["blocked"] is False, (
            f"round {attempt}: run {join} still blocked after {a} and {b} completed"
        )
        assert _claim(conn) == [join]
        conn.execute("SELECT jobs.complete(%s, 'w')", (join,))


def test_a_dependency_pruned_while_enqueue_locks_it_is_not_found(db: Database, conn: Conn) -> None:
    """A dependency deleted by jobs.prune after jobs.enqueue saw it, while enqueue waits to lock
    it FOR SHARE: the enqueue answers P0002 naming it (it did not exist by the time its chain was
    locked), and neither spins nor inserts a run."""
    a = _enqueue(conn)
    assert _claim(conn) == [a]
    conn.execute("SELECT jobs.complete(%s, 'w')", (a,))
    before = scalar(conn, "SELECT count(*) FROM jobs.runs")
    with db.connect(autocommit=False) as pruner, db.connect() as client:
        client.execute("SET statement_timeout = '60s'")  # a spinning enqueue fails the test, not CI
        assert scalar(pruner, "SELECT jobs.prune('0', 1000)") >= 1  # deleted, not committed yet
        enqueuing = BlockedCall(
            conn, client, lambda: _enqueue(client, deps=[a]), "the enqueue to wait for the pruner's row lock"
        )
        pruner.commit()
        outcome = enqueuing.join(90)
    assert outcome, "enqueue still running 90 s after the pruner committed"
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.Error), f"expected an error, got {outcome}"
    err = outcome[0]
    assert err.sqlstate == "P0002" and str(a) in str(err), (
        f"expected P0002 naming run {a}, got {err.sqlstate}: {err}"
    )
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == before - 1, "a run was inserted or kept"


def test_a_discard_that_waits_for_an_enqueue_naming_the_run_keeps_it(db: Database, conn: Conn) -> None:
    """jobs.discard of a failed attempt while an enqueue that names it (its chain still open)
    holds it: the discard waits, then sees the new waiting run and keeps the attempt, so the
    run is released when the chain completes."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)")
    first = _enqueue(conn)
    assert _claim(conn) == [first]
    retry = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'once')", (first,)))
    with db.connect(autocommit=False) as enqueuer, db.connect() as operator:
        operator.execute("SET statement_timeout = '60s'")
        late = _enqueue(enqueuer, "w", deps=[first])  # holds the chain, not committed yet
        discarding = BlockedCall(
            conn,
            operator,
            lambda: scalar(operator, "SELECT jobs.discard(%s)", ([first],)),
            "the discard to wait for the enqueue's lock",
        )
        enqueuer.commit()
        outcome = discarding.join(90)
    assert outcome == [0], f"the discard deleted the run a committed enqueue waits on: {outcome}"
    assert _claim(conn) == [retry]
    conn.execute("SELECT jobs.complete(%s, 'w')", (retry,))
    assert run_row(conn, late)["blocked"] is False


def test_an_enqueue_naming_a_retried_chain_and_a_run_waiting_on_it_does_not_deadlock_its_completion(
    db: Database, conn: Conn
) -> None:
    """x failed once; b and c were enqueued on x before its retry x2, so x2 has the higher id.
    x2 completes while an enqueue names both c and x: the completion holds x2 and then locks
    the runs waiting on x (b, then c), the enqueue locks the chains it names. Both must end
    (the enqueue's run waiting on c), neither with a deadlock error. A third session holds b
    for a moment so that the enqueue reaches its locks between the two steps of the completion."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 2, backoff_initial => '0', jitter => 0)")
    x = _enqueue(conn)
    b = _enqueue(conn, deps=[x])
    c = _enqueue(conn, deps=[x])
    assert _claim(conn) == [x]
    x2 = int(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'once')", (x,)))
    assert x2 > c
    assert _claim(conn) == [x2]
    with db.connect(autocommit=False) as holder, db.connect() as completer, db.connect() as enqueuer:
        _enqueue(holder, deps=[b])  # b locked FOR SHARE until the holder commits
        completing = BlockedCall(
            conn,
            completer,
            lambda: scalar(completer, "SELECT jobs.complete(%s, 'w')", (x2,)),
            "the completion of x2 to wait for b's lock",
        )
        enqueuing = BlockedCall(
            conn, enqueuer, lambda: _enqueue(enqueuer, deps=[c, x]), "the enqueue to wait for a lock"
        )
        holder.commit()
        completed = completing.join(60)
        enqueued = enqueuing.join(60)
    assert completed == [True], f"the completion of x2: {completed}"
    assert len(enqueued) == 1 and not isinstance(enqueued[0], Exception), f"the enqueue: {enqueued}"
    assert run_row(conn, c)["blocked"] is False
    assert run_row(conn, int(enqueued[0]))["blocked"] is True  # it waits for c


def _dag_worker(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Claim, hold briefly, then complete (mostly) or fail; loop until nothing is live."""
    rng = random.Random(seed)
    claimed: list[int] = []
    deadline = time.monotonic() + seconds
    with gated(dsn) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute("SELECT id FROM jobs.claim(%s, %s)", (rng.randint(1, 4), worker)).fetchall()
            if not rows:
                if scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING')") == 0:
                    break
                time.sleep(0.005)
                continue
            time.sleep(rng.uniform(0, 0.004))
            for (run_id,) in rows:
                claimed.append(int(run_id))
                if rng.random() < 0.35:
                    conn.execute("SELECT jobs.fail(%s, %s, '{Flaky}', 'chaos')", (run_id, worker))
                else:
                    conn.execute("SELECT jobs.complete(%s, %s)", (run_id, worker))
    return {"worker": worker, "claimed": claimed}


def test_no_dependent_starts_before_its_dependencies_complete(db: Database, conn: Conn) -> None:
    """Invariant, from the final rows: in a random DAG of 300 runs drained by 6 processes that
    fail 35% of attempts (retried up to 3 attempts), every run that started did so after the
    final attempt of each of its dependencies COMPLETED; every run whose dependency chain
    ended FAILED or CANCELLED was cancelled with DependencyFailed and never started; and
    nothing is left QUEUED or RUNNING."""
    rng = random.Random(7)
    conn.execute(
        "SELECT jobs.set_retry_policy('dag', max_attempts => 3, backoff_initial => '0', jitter => 0)"
    )
    ids: list[int] = []
    for _ in range(300):
        deps = rng.sample(ids[-40:], k=min(len(ids[-40:]), rng.choice([0, 0, 1, 1, 2, 3]))) if ids else []
        ids.append(_enqueue(conn, "dag", deps or None))
    workers = 6
    race(db.dsn, _dag_worker, [(db.dsn, f"w{i}", i, 120.0) for i in range(workers)])

    live = conn.execute(
        "SELECT id, status::text FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING')"
    ).fetchall()
    assert not live, f"left live: {live[:20]}"
    # Final outcome of each chain (root = first attempt).
    final = {
        int(r[0]): (r[1], r[2])
        for r in conn.execute(
            """
            WITH RECURSIVE chain AS (
                SELECT id AS root, id, attempt FROM jobs.runs WHERE attempt = 1
                UNION ALL
                SELECT c.root, r.id, r.attempt FROM chain c JOIN jobs.runs r ON r.retry_of = c.id
            )
            SELECT DISTINCT ON (c.root) c.root, r.status::text, r.finished_at
              FROM chain c JOIN jobs.runs r ON r.id = c.id
             ORDER BY c.root, c.attempt DESC
            """
        )
    }
    early: list[tuple[Any, ...]] = []
    wrong_cancel: list[tuple[Any, ...]] = []
    for run_id, depends_on, started_at, status, reason in conn.execute(
        "SELECT id, depends_on, started_at, status::text, failure_reason"
        " FROM jobs.runs WHERE depends_on IS NOT NULL"
    ):
        outcomes = [final[d] for d in depends_on]
        all_done = all(s == "COMPLETED" for s, _ in outcomes)
        if started_at is not None:
            for dep, (s, finished) in zip(depends_on, outcomes, strict=True):
                if s != "COMPLETED" or finished > started_at:
                    early.append((run_id, started_at, dep, s, finished))
        if not all_done and (status, reason) != ("CANCELLED", "DependencyFailed"):
            wrong_cancel.append((run_id, status, reason, depends_on, outcomes))
        if all_done and reason == "DependencyFailed":
            wrong_cancel.append((run_id, status, reason, depends_on, outcomes))
    assert not early, f"(run, started_at, dependency, its final status, finished_at): {early[:10]}"
    assert not wrong_cancel, f"(run, status, reason, depends_on, dependency outcomes): {wrong_cancel[:10]}"
    started = scalar(
        conn, "SELECT count(*) FROM jobs.runs WHERE depends_on IS NOT NULL AND started_at IS NOT NULL"
    )
    cascaded = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE failure_reason = 'DependencyFailed'")
    assert started > 20 and cascaded > 0, (
        f"the DAG should both run and cascade: started {started}, cascaded {cascaded}"
    )


def _late_runs(conn: Conn, definition_id: int, minutes: int, ago: str) -> list[int]:
    """Runs of the definition's first `minutes` minutely occurrences from `ago` before now, as
    the leader materializes them (its cursor left a minute past the last); their ids."""
    first = scalar(conn, "SELECT date_trunc('minute', now()) - %s::interval", (ago,))
    times = [first + timedelta(minutes=m) for m in range(minutes)]
    materialize_occurrences(conn, definition_id, times, times[-1] + timedelta(minutes=1))
    return [
        int(r[0])
        for r in conn.execute(
            "SELECT id FROM jobs.runs WHERE definition_id = %s ORDER BY scheduled_for", (definition_id,)
        )
    ]


def test_an_occurrence_skipped_by_buffer_one_cancels_the_runs_waiting_on_it(conn: Conn) -> None:
    """A dependency the scheduler cancels (Skipped) has failed for its dependents as any
    cancelled run has: they end DependencyFailed, not blocked for ever."""
    definition = int(
        scalar(
            conn,
            "SELECT id FROM jobs.define('bo', 'kb', schedule => '* * * * *', max_concurrent_runs => 1,"
            " overlap_policy => 'buffer_one')",
        )
    )
    runs = _late_runs(conn, definition, 3, "10 minutes")
    waiting = _enqueue(conn, "dep", [runs[2]])
    assert [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(1, 'w', '{kb}')")] == [runs[0]]
    assert run_row(conn, runs[2])["failure_reason"] == "Skipped", "buffer_one keeps one waiting occurrence"
    assert _status(conn, waiting) == ("CANCELLED", "DependencyFailed")


def test_a_run_a_catch_up_coalesces_away_cancels_the_runs_waiting_on_it(conn: Conn) -> None:
    definition = int(scalar(conn, "SELECT id FROM jobs.define('cu', 'kc', schedule => '* * * * *')"))
    [stale] = _late_runs(conn, definition, 1, "30 minutes")
    waiting = _enqueue(conn, "dep", [stale])
    # The scheduler comes back: it materializes the latest late occurrence and records the
    # catch-up, which coalesces the older run that never started.
    first_late = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (definition,))
    last_late = scalar(conn, "SELECT date_trunc('minute', now())")
    conn.execute(
        "SELECT jobs.materialize(%s, %s, array[%s::timestamptz], %s::timestamptz + interval '1 minute')",
        (definition, first_late, last_late, last_late),
    )
    cursor = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (definition,))
    recorded = scalar(
        conn,
        "SELECT jobs.record_catch_up(%s, 'coalesce', %s, %s, 29, 1, %s)",
        (definition, first_late, last_late, cursor),
    )
    assert recorded is not None
    assert run_row(conn, stale)["failure_reason"] == "Skipped"
    assert _status(conn, waiting) == ("CANCELLED", "DependencyFailed")


def test_an_operator_retry_of_a_run_that_never_started_waits_on_its_dependencies_again(conn: Conn) -> None:
    """Invariant: a run never starts before every run it depends on has completed, retried by
    hand or not. Its dependency failed for good, so a retry of it alone is refused; once the
    dependency is retried, its own retry waits for that one to complete."""
    a = _enqueue(conn, "a")
    b = _enqueue(conn, "b", [a])
    assert _claim(conn) == [a]
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'boom')", (a,))
    assert _status(conn, b) == ("CANCELLED", "DependencyFailed")

    expect_error(conn, "SELECT jobs.retry(%s)", (b,), "22023", f"run {b} depends on", "retry that one first")
    a2 = int(scalar(conn, "SELECT (jobs.retry(%s)).id", (a,)))
    b2 = run_row(conn, int(scalar(conn, "SELECT (jobs.retry(%s)).id", (b,))))
    assert (b2["depends_on"], b2["blocked"], b2["status"]) == ([a], True, "QUEUED"), b2
    assert _claim(conn) == [a2], "the dependent's retry waits for the dependency's"
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (a2,)) is True
    assert _claim(conn) == [b2["id"]]


def test_an_operator_retry_of_a_run_that_ran_does_not_wait_again(conn: Conn) -> None:
    a = _enqueue(conn, "a")
    b = _enqueue(conn, "b", [a])
    assert _claim(conn) == [a]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (a,)) is True
    assert _claim(conn) == [b]
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'boom')", (b,))
    b2 = run_row(conn, int(scalar(conn, "SELECT (jobs.retry(%s)).id", (b,))))
    assert (b2["blocked"], b2["status"]) == (False, "QUEUED"), b2
    assert _claim(conn) == [b2["id"]]


def test_an_operator_retry_of_a_run_whose_dependency_was_pruned_is_refused_naming_it(conn: Conn) -> None:
    """A run cancelled before it started, retried after retention pruned a run it depends on:
    that run's outcome is gone, so the retry is refused as a bad request (22023 naming the
    pruned run), not reported as a missing run (P0002: the client's NotFound, 'no such run')."""
    a = _enqueue(conn, "a")
    b = _enqueue(conn, "b", [a])
    assert _claim(conn) == [a]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (a,)) is True
    assert scalar(conn, "SELECT jobs.cancel(%s)", (b,)) == "CANCELLED"  # released, never started
    conn.execute("UPDATE jobs.runs SET finished_at = now() - interval '30 days' WHERE id = %s", (a,))
    assert scalar(conn, "SELECT jobs.prune('14 days')") == 1
    expect_error(conn, "SELECT jobs.retry(%s)", (b,), "22023", f"run {b} depends on", f"{{{a}}}", "pruned")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (b,)) == 0


def _waits_for(observer: Conn, waiter: Conn, holder: Conn) -> bool:
    return bool(
        scalar(
            observer,
            "SELECT %s = ANY (pg_blocking_pids(%s))",
            (holder.info.backend_pid, waiter.info.backend_pid),
        )
    )


def test_an_enqueue_that_finds_a_new_retry_in_a_chain_locks_it_before_the_runs_waiting_on_it(
    db: Database, conn: Conn
) -> None:
    """An enqueue names a (RUNNING) and b, which waits on a and c. It reads a's chain, then a
    fails and its retry a2 is queued: the enqueue must lock a2 (or find it claimed) before it
    locks b. Locked after b, a2 could be claimed and completed meanwhile, and the completion,
    which holds a2 and then locks b, and the enqueue, which holds b and waits for a2, deadlocked
    (one of them failed with 40P01). c's completion holds b for a moment, so that a2 is
    claimed, if it can be, while the enqueue waits for b. Both end; the enqueue's run waits on b."""
    conn.execute("SELECT jobs.set_retry_policy('a', max_attempts => 2, backoff_initial => '0', jitter => 0)")
    a = _enqueue(conn, "a")
    c = _enqueue(conn, "c")
    assert _claim(conn) == [a, c]
    b = _enqueue(conn, "b", [a, c])
    completing: BlockedCall | None = None
    with (
        db.connect(autocommit=False) as failer,
        db.connect(autocommit=False) as holder,
        db.connect() as enqueuer,
        db.connect() as completer,
    ):
        a2 = int(scalar(failer, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'once')", (a,)))  # not committed
        assert scalar(holder, "SELECT jobs.complete(%s, 'w')", (c,)) is True  # holds b, not committed
        enqueuing = BlockedCall(
            conn, enqueuer, lambda: _enqueue(enqueuer, "e", [a, b]), "the enqueue to wait for a's failure"
        )
        failer.commit()  # a2 is queued; the enqueue goes on to b, held by c's completion
        wait_for("the enqueue to wait for b", lambda: _waits_for(conn, enqueuer, holder), timeout=60)
        claimed = [int(r[0]) for r in completer.execute("SELECT id FROM jobs.claim(1, 'w2', '{a}')")]
        if claimed == [a2]:  # the enqueue left it free: its completion holds it and waits for b
            completing = BlockedCall(
                conn,
                completer,
                lambda: scalar(completer, "SELECT jobs.complete(%s, 'w2')", (a2,)),
                "a2's completion to wait for b",
            )
        holder.commit()
        enqueued = enqueuing.join(60)
        if completing is not None:
            completed = completing.join(60)
        else:  # the enqueue held a2 (a claim passes over a locked run) until it committed
            assert claimed == [], f"claimed {claimed}, not a2 = {a2}"
            claimed = [int(r[0]) for r in completer.execute("SELECT id FROM jobs.claim(1, 'w2', '{a}')")]
            assert claimed == [a2], f"claimed {claimed} once the enqueue committed, not a2 = {a2}"
            completed = [scalar(completer, "SELECT jobs.complete(%s, 'w2')", (a2,))]
    assert completed == [True], f"a2's completion: {completed}"
    assert len(enqueued) == 1 and not isinstance(enqueued[0], Exception), f"the enqueue: {enqueued}"
    assert run_row(conn, b)["blocked"] is False, "a2 and c completed"
    assert run_row(conn, int(enqueued[0]))["blocked"] is True  # it waits for b


def test_a_cascade_cancels_the_runs_that_name_an_earlier_attempt_of_a_run_it_cancels(conn: Conn) -> None:
    """r was cancelled before it started and retried by hand: its retry r2 waits on d again,
    and x, enqueued on r, waits on r's chain, whose last run is r2. d is cancelled: the cascade
    cancels r2, and must cancel x too. It went down by the ids the runs name, so x, naming r
    and not r2, stayed QUEUED and blocked for good."""
    d = _enqueue(conn, "d")
    r = _enqueue(conn, "r", [d])
    assert scalar(conn, "SELECT jobs.cancel(%s)", (r,)) == "CANCELLED"
    r2 = int(scalar(conn, "SELECT (jobs.retry(%s)).id", (r,)))
    x = _enqueue(conn, "x", [r])
    y = _enqueue(conn, "y", [x])
    assert [run_row(conn, i)["blocked"] for i in (r2, x, y)] == [True, True, True]
    assert scalar(conn, "SELECT jobs.cancel(%s)", (d,)) == "CANCELLED"
    assert {i: _status(conn, i) for i in (r2, x, y)} == dict.fromkeys(
        (r2, x, y), ("CANCELLED", "DependencyFailed")
    )
    assert scalar(conn, "SELECT count(*) FROM jobs.blocked") == 0
