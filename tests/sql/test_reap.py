"""Reaping and fencing: a worker that went silent loses its run, cannot touch it afterwards,
and the retry row is a new attempt another worker claims and completes.

Time passes by moving the rows' timestamps as the superuser (the test's clock).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from harness import (
    BlockedCall,
    Conn,
    Database,
    add_runs,
    digest,
    expect_error,
    gated,
    race_parts,
    run_row,
    scalar,
    wait_for,
)


def _enqueue(conn: Conn, kind: str, **kw: object) -> int:
    extra = "".join(f", {name} => %({name})s" for name in kw)
    return int(scalar(conn, f"SELECT id FROM jobs.enqueue(%(kind)s{extra})", {"kind": kind, **kw}))


def _claim_one(conn: Conn, worker: str, kind: str) -> int:
    rows = conn.execute("SELECT id FROM jobs.claim(1, %s, ARRAY[%s])", (worker, kind)).fetchall()
    assert len(rows) == 1, f"{worker} expected one {kind} run, got {rows}"
    return int(rows[0][0])


def _assert_fenced(conn: Conn, run_id: int, worker: str) -> None:
    """Every call of the old owner is a no-op that says so; the row does not change."""
    before = digest(conn)
    assert scalar(conn, "SELECT jobs.complete(%s, %s, '{\"late\": true}')", (run_id, worker)) is False
    beat = conn.execute("SELECT * FROM jobs.heartbeat(ARRAY[%s]::bigint[], %s)", (run_id, worker))
    assert beat.fetchall() == [], "heartbeat must omit a run that is no longer this worker's"
    assert scalar(conn, "SELECT jobs.fail(%s, %s, '{RuntimeError}', 'late') IS NULL", (run_id, worker))
    done = conn.execute("SELECT * FROM jobs.complete_many(ARRAY[%s]::bigint[], %s)", (run_id, worker))
    assert done.fetchall() == []
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, %s)", (run_id, worker)) is False
    assert digest(conn) == before, f"a fenced call by {worker} changed the database"


def test_heartbeat_lost_is_reaped_fenced_and_retried(conn: Conn) -> None:
    """Invariant: a reaped run's old worker cannot complete it. w1 claims and heartbeats, then
    goes silent; reap() fails the run as HeartbeatLost with a retry id; w1's complete is false,
    its heartbeat omits the run, its fail returns NULL; the retry is claimable by w2 once due."""
    conn.execute(
        "SELECT jobs.set_retry_policy('report', max_attempts => 3,"
        " backoff_initial => '5 minutes', jitter => 0)"
    )
    run_id = _enqueue(conn, "report", payload='{"n": 1}')
    assert _claim_one(conn, "w1", "report") == run_id
    beat = conn.execute("SELECT * FROM jobs.heartbeat(ARRAY[%s]::bigint[], 'w1')", (run_id,))
    assert beat.fetchall() == [(run_id, False)]
    assert conn.execute("SELECT * FROM jobs.reap()").fetchall() == [], "a fresh heartbeat is alive"

    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '2 minutes' WHERE id = %s", (run_id,))
    reaped = conn.execute("SELECT run_id, reason, retry_run_id FROM jobs.reap()").fetchall()
    assert len(reaped) == 1 and reaped[0][:2] == (run_id, "HeartbeatLost"), reaped
    retry_id = reaped[0][2]
    assert retry_id is not None, "the policy allows 3 attempts: reap must queue a retry"

    failed = run_row(conn, run_id)
    assert failed["status"] == "FAILED" and failed["failure_reason"] == "HeartbeatLost"
    assert "w1" in failed["error"] and failed["finished_at"] is not None
    assert conn.execute("SELECT * FROM jobs.reap()").fetchall() == [], "reaped once only"

    _assert_fenced(conn, run_id, "w1")

    retry = run_row(conn, retry_id)
    assert (retry["status"], retry["attempt"], retry["retry_of"], retry["origin"]) == (
        "QUEUED",
        2,
        run_id,
        "retry",
    )
    assert retry["payload"] == {"n": 1} and retry["worker"] is None
    assert conn.execute("SELECT * FROM jobs.claim(1, 'w2')").fetchall() == [], "not due yet"
    # Its backoff over (moved rather than waited for: a loaded machine can take any time
    # between the reap and the claim above), the retry is claimable.
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = %s", (retry_id,))
    assert _claim_one(conn, "w2", "report") == retry_id
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2', '{\"ok\": 1}')", (retry_id,)) is True
    done = run_row(conn, retry_id)
    assert (done["status"], done["worker"], done["result"]) == ("COMPLETED", "w2", {"ok": 1})
    # w1 still cannot touch the new attempt either.
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (retry_id,)) is False


def test_orphaned_run_is_reaped_and_retried(conn: Conn) -> None:
    """A run that never heartbeated is reaped as Orphaned once orphan_timeout passes, not before;
    its worker is fenced and the retry row is a new attempt."""
    conn.execute("SELECT jobs.set_retry_policy('psql-job', max_attempts => 2, jitter => 0)")
    conn.execute("UPDATE jobs.config SET orphan_timeout = '5 minutes'")
    run_id = _enqueue(conn, "psql-job")
    assert _claim_one(conn, "w1", "psql-job") == run_id
    conn.execute("UPDATE jobs.runs SET started_at = now() - interval '4 minutes' WHERE id = %s", (run_id,))
    assert conn.execute("SELECT * FROM jobs.reap()").fetchall() == [], "within orphan_timeout"

    conn.execute("UPDATE jobs.config SET orphan_timeout = '1 minute'")
    reaped = conn.execute("SELECT run_id, reason, retry_run_id FROM jobs.reap()").fetchall()
    assert len(reaped) == 1 and reaped[0][:2] == (run_id, "Orphaned"), reaped
    retry_id = reaped[0][2]
    assert retry_id is not None
    failed = run_row(conn, run_id)
    assert (failed["status"], failed["failure_reason"]) == ("FAILED", "Orphaned")
    _assert_fenced(conn, run_id, "w1")
    retry = run_row(conn, retry_id)
    assert (retry["status"], retry["attempt"], retry["retry_of"]) == ("QUEUED", 2, run_id)


def test_per_run_heartbeat_timeout_and_no_retry_without_budget(conn: Conn) -> None:
    """runs.heartbeat_timeout overrides jobs.config for that run only; a kind without a policy
    (jobs.config.max_attempts = 1) is reaped without a retry row."""
    short = _enqueue(conn, "plain", heartbeat_timeout="1 second")
    normal = _enqueue(conn, "plain")
    claimed = {r[0] for r in conn.execute("SELECT id FROM jobs.claim(2, 'w1')")}
    assert claimed == {short, normal}
    beat = conn.execute(
        "SELECT run_id FROM jobs.heartbeat(ARRAY[%s, %s]::bigint[], 'w1') ORDER BY 1",
        (short, normal),
    )
    assert [r[0] for r in beat] == sorted([short, normal])
    conn.execute(
        "UPDATE jobs.runs SET heartbeat_at = now() - interval '5 seconds' WHERE id IN (%s, %s)",
        (short, normal),
    )
    reaped = conn.execute("SELECT run_id, reason, retry_run_id FROM jobs.reap()").fetchall()
    assert reaped == [(short, "HeartbeatLost", None)]
    assert run_row(conn, normal)["status"] == "RUNNING"
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (short,)) == 0
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (normal,)) is True


def test_reap_is_set_based_over_many_runs(conn: Conn) -> None:
    """One reap() call sweeps every stale run at once (and only those)."""
    ids = add_runs(conn, 30, kind="bulk")
    got = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(30, 'w1')")]
    assert sorted(got) == ids
    conn.execute("SELECT * FROM jobs.heartbeat(%s, 'w1')", (ids,))
    stale = ids[:20]
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = ANY(%s)", (stale,))
    reaped = conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall()
    assert reaped == [(i, "HeartbeatLost") for i in stale]
    alive = conn.execute("SELECT run_id FROM jobs.heartbeat(%s, 'w1') ORDER BY 1", (ids,))
    assert [r[0] for r in alive] == ids[20:]


def _keyed_runs(conn: Conn, stale: int, live: int) -> tuple[list[int], list[int]]:
    """Runs of unique keys u-1, u-2, ..., RUNNING for w1: ``stale`` ones (silent for two hours),
    then ``live`` ones (heartbeated now); the ids of each."""
    rows = conn.execute(
        "INSERT INTO jobs.runs (kind, status, worker, started_at, heartbeat_at, unique_key)"
        " SELECT 'keyed', 'RUNNING', 'w1', now() - interval '2 hours',"
        "        CASE WHEN g <= %s THEN now() - interval '2 hours' ELSE now() END, 'u-' || g"
        "   FROM generate_series(1, %s) AS g ORDER BY g RETURNING id, heartbeat_at < now()",
        (stale, stale + live),
    ).fetchall()
    conn.execute("ANALYZE jobs.runs")
    return sorted(r[0] for r in rows if r[1]), sorted(r[0] for r in rows if not r[1])


def _advisory_locks_of(conn: Conn, pid: int) -> int:
    return int(scalar(conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", (pid,)))


def test_a_reap_holds_the_unique_keys_of_the_runs_it_fails_and_no_others(db: Database, conn: Conn) -> None:
    """A reap fails a run of a unique key holding that key's lock until it commits; the keys of
    the live runs it leaves alone are not its business. Each lock it holds takes a slot of the
    server's shared lock table, so a reap that took the key of every RUNNING run (thousands of
    live unique jobs) would fail with 53200 on every pass and starve other sessions of locks."""
    stale, _ = _keyed_runs(conn, 3, 2000)
    with db.connect(autocommit=False) as reaper:
        reaped = [r[0] for r in reaper.execute("SELECT run_id FROM jobs.reap() ORDER BY 1")]
        assert reaped == stale, reaped
        held = _advisory_locks_of(conn, reaper.info.backend_pid)
        assert held <= len(stale), f"a reap of {len(stale)} runs holds {held} advisory locks until it commits"
        reaper.rollback()


def test_a_reap_of_many_runs_of_unique_keys_holds_at_most_a_thousand_keys_and_the_next_passes_take_the_rest(
    db: Database, conn: Conn
) -> None:
    """A fleet lost with tens of thousands of unique jobs running: one pass failing them all would
    hold one key per run to its end, more than the server's shared lock table holds (6,400 slots
    by default), and end in 53200 on every pass, reaping nothing. A pass takes at most 1,000 of
    them; the next passes take the rest, each with its retry, none twice."""
    conn.execute("SELECT jobs.set_retry_policy('keyed', max_attempts => 2, jitter => 0)")
    stale, _ = _keyed_runs(conn, 2500, 0)
    passes: list[list[int]] = []
    with db.connect(autocommit=False) as reaper:
        rows = reaper.execute("SELECT run_id, retry_run_id FROM jobs.reap() ORDER BY 1").fetchall()
        held = _advisory_locks_of(conn, reaper.info.backend_pid)
        reaper.commit()
    assert held <= 1000, f"a reap of {len(rows)} runs of unique keys held {held} advisory locks at once"
    passes.append([r[0] for r in rows])
    assert all(r[1] is not None for r in rows), f"runs reaped without their retry: {rows[:5]}"
    while len(passes) < 10 and sum(map(len, passes)) < len(stale):
        passes.append([r[0] for r in conn.execute("SELECT run_id FROM jobs.reap() ORDER BY 1")])
    assert sorted(i for p in passes for i in p) == stale, (
        f"{len(passes)} passes reaped {[len(p) for p in passes]} runs,"
        f" not each of the {len(stale)} stale ones once"
    )
    assert [len(p) for p in passes] == [1000, 1000, 500], [len(p) for p in passes]


def test_run_past_its_timeout_is_reaped_as_timeout_while_it_still_heartbeats(conn: Conn) -> None:
    """The timeout is the server's: a run whose worker heartbeats on time but whose
    started_at + timeout has passed is failed as Timeout in the same reap pass as the lost ones,
    returned by reap() with its retry; its worker is fenced (a late complete, fail or heartbeat
    changes nothing) and the retry is claimed and completed by another worker."""
    conn.execute(
        "SELECT jobs.set_retry_policy('hangs', max_attempts => 2, backoff_initial => '0', jitter => 0)"
    )
    hung = _enqueue(conn, "hangs", timeout="30 seconds", payload='{"n": 1}')
    within = _enqueue(conn, "hangs", timeout="30 seconds")
    lost = _enqueue(conn, "other")
    claimed = {r[0] for r in conn.execute("SELECT id FROM jobs.claim(3, 'w1', heartbeat => true)")}
    assert claimed == {hung, within, lost}
    conn.execute("UPDATE jobs.runs SET started_at = now() - interval '31 seconds' WHERE id = %s", (hung,))
    conn.execute("UPDATE jobs.runs SET started_at = now() - interval '29 seconds' WHERE id = %s", (within,))
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '2 minutes' WHERE id = %s", (lost,))
    beat = conn.execute(
        "SELECT run_id FROM jobs.heartbeat(ARRAY[%s, %s]::bigint[], 'w1') ORDER BY 1", (hung, within)
    )
    assert [r[0] for r in beat] == sorted([hung, within]), "the hung run's heartbeats still arrive"

    reaped = conn.execute("SELECT run_id, reason, retry_run_id FROM jobs.reap()").fetchall()
    assert [r[:2] for r in reaped] == [(hung, "Timeout"), (lost, "HeartbeatLost")], reaped
    retry_id = reaped[0][2]
    assert retry_id is not None, f"the policy allows 2 attempts: the Timeout must be retried: {reaped}"
    failed = run_row(conn, hung)
    assert (failed["status"], failed["failure_reason"]) == ("FAILED", "Timeout"), failed
    assert "timeout" in failed["error"] and "w1" in failed["error"], failed["error"]
    assert run_row(conn, within)["status"] == "RUNNING", "a run within its timeout is not reaped"

    _assert_fenced(conn, hung, "w1")
    assert _claim_one(conn, "w2", "hangs") == retry_id
    retry = run_row(conn, retry_id)
    assert (retry["attempt"], retry["retry_of"], retry["timeout"]) == (2, hung, timedelta(seconds=30)), retry
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1', '{\"late\": 1}')", (retry_id,)) is False
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2', '{\"ok\": 1}')", (retry_id,)) is True
    assert run_row(conn, hung)["result"] is None, "the late worker's result must not land"


@pytest.mark.parametrize(
    ("allow", "deny", "retried"),
    [
        (None, [], True),  # every class allowed
        (["JobTimeout"], [], True),  # the class the Python driver reports for a timeout
        (["Exception"], [], True),  # and its base class, as the driver reports it
        (None, ["Exception"], False),
        (["Timeout"], [], True),  # the failure reason counts as a class
        (["ConnectionError"], [], False),  # a hung job is not an infrastructure failure
        (None, ["Timeout"], False),  # deny wins
    ],
)
def test_a_server_timeout_is_retried_by_the_kinds_policy(
    conn: Conn, allow: list[str] | None, deny: list[str], retried: bool
) -> None:
    conn.execute(
        "SELECT jobs.set_retry_policy('hangs', %s, %s, max_attempts => 3, jitter => 0)", (allow, deny)
    )
    run_id = _enqueue(conn, "hangs", timeout="1 second")
    assert _claim_one(conn, "w1", "hangs") == run_id
    conn.execute("UPDATE jobs.runs SET started_at = now() - interval '2 seconds' WHERE id = %s", (run_id,))
    reaped = conn.execute("SELECT run_id, reason, retry_run_id IS NOT NULL FROM jobs.reap()").fetchall()
    assert reaped == [(run_id, "Timeout", retried)], f"allow={allow} deny={deny}: {reaped}"


def test_the_deadline_that_passed_first_names_the_reason(conn: Conn) -> None:
    """A run both silent and past its timeout is failed for whichever deadline came first."""
    silent_first = _enqueue(conn, "k", timeout="1 hour", heartbeat_timeout="1 minute")
    timed_out_first = _enqueue(conn, "k", timeout="1 minute", heartbeat_timeout="1 hour")
    never_beat = _enqueue(conn, "k", timeout="2 hours")
    assert len(conn.execute("SELECT id FROM jobs.claim(3, 'w1')").fetchall()) == 3
    conn.execute(
        "UPDATE jobs.runs SET started_at = now() - interval '3 hours',"
        " heartbeat_at = now() - interval '170 minutes' WHERE id IN (%s, %s)",
        (silent_first, timed_out_first),
    )
    conn.execute("UPDATE jobs.runs SET started_at = now() - interval '3 hours' WHERE id = %s", (never_beat,))
    reaped = conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall()
    assert reaped == [
        (silent_first, "HeartbeatLost"),  # silent at 2:49 ago, timeout only at 2:00 ago
        (timed_out_first, "Timeout"),  # timed out at 2:59 ago, silent only at 1:50 ago
        (never_beat, "Orphaned"),  # orphan timeout (1 hour) at 2:00 ago, timeout at 1:00 ago
    ], reaped


def test_reap_survives_absurd_rows_written_around_the_constraints(conn: Conn) -> None:
    """The constraints make these rows impossible; should one exist anyway (the constraints
    dropped, a restore without them), the reaper's arithmetic still cannot overflow: it sweeps
    the stale run next to them, and the absurd rows are judged, never a reason to stop."""
    stale = _enqueue(conn, "k")
    huge = _enqueue(conn, "k")
    endless = _enqueue(conn, "k")
    beyond = _enqueue(conn, "k")
    assert len(conn.execute("SELECT id FROM jobs.claim(4, 'w1', heartbeat => true)").fetchall()) == 4
    with conn.transaction():
        conn.execute(
            "ALTER DOMAIN jobs.run_timeout DROP CONSTRAINT runs_timeout_check;"
            "ALTER DOMAIN jobs.run_heartbeat_timeout DROP CONSTRAINT runs_heartbeat_timeout_check;"
            "ALTER TABLE jobs.config DISABLE TRIGGER config_bounds,"
            " DROP CONSTRAINT config_heartbeat_timeout_check, DROP CONSTRAINT config_orphan_timeout_check"
        )
        conn.execute(
            "UPDATE jobs.config SET heartbeat_timeout = '178000000 years', orphan_timeout = '178000000 years'"
        )
        for sets, run_id in [
            ("heartbeat_timeout = '1 minute', heartbeat_at = now() - interval '1 hour'", stale),
            ("timeout = '178000000 years', heartbeat_timeout = '178000000 years'", huge),
            ("started_at = '-infinity', heartbeat_at = '-infinity', timeout = '1 second'", endless),
            ("started_at = '294276-12-31', heartbeat_at = 'infinity', timeout = '178000000 years'", beyond),
        ]:
            conn.execute(f"UPDATE jobs.runs SET {sets} WHERE id = %s", (run_id,))
    reaped = conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall()
    assert reaped == [(stale, "HeartbeatLost"), (endless, "Timeout")], reaped
    still = conn.execute("SELECT id FROM jobs.runs WHERE status = 'RUNNING' ORDER BY id").fetchall()
    assert [r[0] for r in still] == [huge, beyond], still
    assert conn.execute("SELECT * FROM jobs.reap()").fetchall() == [], "a second pass finds nothing new"


# -- a completion racing the reaper, in two processes ------------------------------------

LEAD = 731_006  # advisory key: the first side of the race holds its rows under it
REAPED_MARK = "CREATE TABLE IF NOT EXISTS public.race_reaped (at timestamptz)"


def _lead_held(conn: Conn) -> bool:
    return bool(
        scalar(
            conn,
            "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            (LEAD,),
        )
    )


def _complete(conn: Conn, many: list[int], one: list[int], worker: str) -> list[int]:
    done = [int(r[0]) for r in conn.execute("SELECT run_id FROM jobs.complete_many(%s, %s)", (many, worker))]
    done += [r for r in one if scalar(conn, "SELECT jobs.complete(%s, %s)", (r, worker))]
    return sorted(done)


def _reap(conn: Conn) -> list[int]:
    return sorted(int(r[0]) for r in conn.execute("SELECT run_id FROM jobs.reap()"))


def _reaper_leading(dsn: str) -> list[int]:
    """Reap, and keep the reaped rows locked until a completion waits on them."""
    with gated(dsn) as conn, conn.transaction():
        reaped = _reap(conn)
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LEAD,))
        wait_for(
            "a completion waiting on the reaped rows",
            lambda: scalar(
                conn,
                "SELECT EXISTS (SELECT FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
                " WHERE NOT l.granted AND l.locktype = 'transactionid' AND a.datname = current_database())",
            ),
            timeout=120,
            interval=0.02,
        )
    return reaped


def _completing_after(dsn: str, many: list[int], one: list[int], worker: str) -> list[int]:
    with gated(dsn) as conn:
        wait_for("the reaper to hold its rows", lambda: _lead_held(conn), timeout=120, interval=0.02)
        return _complete(conn, many, one, worker)


def _completing_leading(dsn: str, many: list[int], one: list[int], worker: str) -> list[int]:
    """Complete, and keep the completed rows locked until a reaper has swept past them."""
    with gated(dsn) as conn, conn.transaction():
        done = _complete(conn, many, one, worker)
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LEAD,))
        wait_for(
            "the reaper's sweep",
            lambda: scalar(conn, "SELECT EXISTS (SELECT FROM public.race_reaped)"),
            timeout=120,
            interval=0.02,
        )
    return done


def _reaping_after(dsn: str) -> list[int]:
    with gated(dsn) as conn:
        wait_for("the completion to hold its rows", lambda: _lead_held(conn), timeout=120, interval=0.02)
        reaped = _reap(conn)
        conn.execute("INSERT INTO public.race_reaped VALUES (now())")
    return reaped


@pytest.mark.parametrize("first", ["reaper", "completion"])
def test_a_completion_racing_the_reaper_ends_each_run_one_way_and_says_which(
    db: Database, conn: Conn, first: str
) -> None:
    """A worker completes its 40 runs (complete_many for half, complete for the rest) while
    the reaper, in another process, sweeps them with half of them silent past their heartbeat
    timeout. Whichever side locks first holds its rows until the other has met them: a
    completion that waited on reaped rows must leave them FAILED and not report them; a
    sweep that met completed rows still uncommitted must leave them alone. Every run ends
    exactly one way, and each side reports exactly the runs it ended."""
    conn.execute(REAPED_MARK)
    ids = add_runs(conn, 40)
    claimed = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(40, 'w', heartbeat => true)")]
    assert sorted(claimed) == sorted(ids)
    silent = ids[::2]
    conn.execute(
        "UPDATE jobs.runs SET heartbeat_at = now() - interval '1 day' WHERE id = ANY (%s)", (silent,)
    )
    many, one = ids[:20], ids[20:]
    if first == "reaper":
        reaped, completed = race_parts(
            db.dsn, [(_reaper_leading, (db.dsn,)), (_completing_after, (db.dsn, many, one, "w"))]
        )
        assert reaped == sorted(silent), f"the sweep reaped {reaped}, not the silent runs {sorted(silent)}"
    else:
        completed, reaped = race_parts(
            db.dsn, [(_completing_leading, (db.dsn, many, one, "w")), (_reaping_after, (db.dsn,))]
        )
        assert completed == sorted(ids), f"the completion ended {completed} of {sorted(ids)}"
    assert not set(reaped) & set(completed), f"ended both ways: {sorted(set(reaped) & set(completed))}"
    assert sorted(reaped + completed) == sorted(ids), "some run ended neither way"
    states = dict(
        conn.execute(
            "SELECT id, status::text || coalesce(':' || failure_reason::text, '')"
            "  FROM jobs.runs WHERE id = ANY (%s)",
            (ids,),
        ).fetchall()
    )
    wrong = {i: states[i] for i in completed if states[i] != "COMPLETED"}
    wrong |= {i: states[i] for i in reaped if states[i] != "FAILED:HeartbeatLost"}
    assert not wrong, f"runs whose stored end is not what their side reported: {wrong}"


#: The heartbeat key of worker w1: jobs._heartbeat_key('w1') (the key table in sql/helpers.sql).
HEARTBEAT_KEY_W1 = "hashtextextended('heartbeat:w1', 0)"


def test_a_stall_longer_than_the_heartbeat_timeout_takes_no_run_from_a_worker_that_heartbeats(
    db: Database, conn: Conn
) -> None:
    """Invariant: a table lock on jobs.runs held for longer than a run's heartbeat timeout (a
    LOCK TABLE, an ALTER TABLE, a migration) ages no heartbeat. w1's heartbeat and a reap that
    began once the timeout had passed wait behind the lock together; the waiting heartbeat holds
    its worker's heartbeat key all the while. Once the lock is released, whichever goes first,
    the reap takes nothing and the heartbeat stamps the time it wrote, after the release."""
    run_id = _enqueue(conn, "stalled", heartbeat_timeout="1 second")
    assert _claim_one(conn, "w1", "stalled") == run_id
    beat = "SELECT run_id, cancel_requested FROM jobs.heartbeat(ARRAY[%s]::bigint[], 'w1')"
    assert conn.execute(beat, (run_id,)).fetchall() == [(run_id, False)]
    last = scalar(conn, "SELECT heartbeat_at FROM jobs.runs WHERE id = %s", (run_id,))
    # The locker is left first, so a failure releases the lock the other two wait for.
    with db.connect() as worker, db.connect() as reaper, db.connect(autocommit=False) as locker:
        locker.execute("LOCK TABLE jobs.runs IN ACCESS EXCLUSIVE MODE")
        heartbeat = BlockedCall(
            conn, worker, lambda: worker.execute(beat, (run_id,)).fetchall(), "the heartbeat to wait"
        )
        held = scalar(
            conn,
            "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND granted"
            " AND mode = 'ShareLock' AND (classid::bigint << 32 | objid::bigint) = " + HEARTBEAT_KEY_W1,
            (worker.info.backend_pid,),
        )
        wait_for(
            "the heartbeat timeout to pass in the stall",
            lambda: scalar(conn, "SELECT clock_timestamp() > %s + interval '1.5 seconds'", (last,)),
            timeout=60,
        )
        reap = BlockedCall(
            conn,
            reaper,
            lambda: reaper.execute("SELECT run_id, reason FROM jobs.reap()").fetchall(),
            "the reap to wait",
        )
        released = scalar(locker, "SELECT clock_timestamp()")
        locker.commit()
        assert heartbeat.join(60) == [[(run_id, False)]], "the heartbeat that waited lost its run"
        assert reap.join(60) == [[]], f"a reap that waited through the stall took run {run_id}"
    stamped = scalar(conn, "SELECT heartbeat_at FROM jobs.runs WHERE id = %s", (run_id,))
    assert stamped > released, (
        f"the heartbeat that waited stamped {stamped}, before the release at {released}"
    )
    assert conn.execute("SELECT * FROM jobs.reap()").fetchall() == []
    assert run_row(conn, run_id)["status"] == "RUNNING"
    assert held == 1, "a heartbeat waiting behind a table lock must hold its worker's heartbeat key"


def test_a_run_whose_worker_has_a_heartbeat_in_flight_is_left_to_the_next_pass(
    db: Database, conn: Conn
) -> None:
    """While a heartbeat of w1 is in flight (its heartbeat key held), a reap leaves w1's runs
    whose heartbeat is stale to the next pass; it still fails w1's run past its timeout, and the
    stale run of w2, a worker with no heartbeat in flight. The next pass after the heartbeat
    commits takes w1's stale run if it is still stale."""
    stale = _enqueue(conn, "silent")
    overdue = _enqueue(conn, "silent", timeout="1 minute")
    other = _enqueue(conn, "silent")
    assert _claim_one(conn, "w1", "silent") == stale
    assert _claim_one(conn, "w1", "silent") == overdue
    assert _claim_one(conn, "w2", "silent") == other
    conn.execute(
        "UPDATE jobs.runs SET heartbeat_at = now() - interval '2 hours',"
        " started_at = now() - interval '2 hours' WHERE id = ANY (%s)",
        ([stale, overdue, other],),
    )
    with db.connect(autocommit=False) as in_flight:
        in_flight.execute(f"SELECT pg_advisory_xact_lock_shared({HEARTBEAT_KEY_W1})")
        reaped = conn.execute("SELECT run_id, reason FROM jobs.reap() ORDER BY 1").fetchall()
        assert reaped == sorted([(overdue, "Timeout"), (other, "HeartbeatLost")]), reaped
        in_flight.commit()
    assert conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall() == [(stale, "HeartbeatLost")]


def test_a_run_past_its_timeout_is_failed_as_timeout_while_its_worker_has_a_heartbeat_in_flight(
    db: Database, conn: Conn
) -> None:
    """A heartbeat of w1 in flight holds back only the reasons that are missing heartbeats: a
    run of w1 whose heartbeat went stale before its timeout passed is still failed as Timeout by
    that reap (a worker whose heartbeat transaction stays open must not keep a hung run RUNNING
    past its timeout), while w1's stale run without a timeout is left to the next pass."""
    conn.execute(
        "SELECT jobs.set_retry_policy('hangs', max_attempts => 2, backoff_initial => '0', jitter => 0)"
    )
    hung = _enqueue(conn, "hangs", timeout="1 hour", heartbeat_timeout="1 minute")
    stale = _enqueue(conn, "silent", heartbeat_timeout="1 minute")
    assert _claim_one(conn, "w1", "hangs") == hung
    assert _claim_one(conn, "w1", "silent") == stale
    # Silent for two hours: the heartbeat deadline passed 1 h 59 min ago, the timeout 1 h ago.
    conn.execute(
        "UPDATE jobs.runs SET heartbeat_at = now() - interval '2 hours',"
        " started_at = now() - interval '2 hours' WHERE id = ANY (%s)",
        ([hung, stale],),
    )
    with db.connect(autocommit=False) as in_flight:
        in_flight.execute(f"SELECT pg_advisory_xact_lock_shared({HEARTBEAT_KEY_W1})")
        reaped = conn.execute("SELECT run_id, reason, retry_run_id IS NOT NULL FROM jobs.reap()").fetchall()
        assert reaped == [(hung, "Timeout", True)], (
            f"run {hung} is past its timeout while a heartbeat of w1 is in flight: {reaped}"
        )
        assert run_row(conn, stale)["status"] == "RUNNING", "a stale heartbeat waits for the next pass"
        in_flight.commit()
    assert conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall() == [(stale, "HeartbeatLost")]


def test_a_heartbeat_that_commits_while_a_reap_reads_the_runs_keeps_its_run(db: Database, conn: Conn) -> None:
    """A heartbeat and a reap that a table lock held back go on at the same moment. When the
    heartbeat commits after the reap's snapshot but before the reap locks the run, the reap
    must see the new stamp: a run whose heartbeat was answered as stamped is never failed by a
    reap that ran alongside it. The heartbeat also stamps 2,000 other runs of its worker, so it
    is likely to commit after the reap took its snapshot, and the reap reads 20,000 runs of
    another worker before it reaches the stale one, so the commit lands in between. A run both
    stamped and reaped is a counter-example."""
    conn.execute(
        "INSERT INTO jobs.runs (kind, status, worker, started_at, heartbeat_at)"
        " SELECT 'busy', 'RUNNING', CASE WHEN g <= 2000 THEN 'w1' ELSE 'w2' END, now(),"
        " now() + interval '1 hour' FROM generate_series(1, 22000) AS g"
    )
    held = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.runs WHERE worker = 'w1' ORDER BY id")]
    both: list[int] = []
    for _ in range(10):
        run_id = _enqueue(conn, "silent", heartbeat_timeout="1 second")
        assert _claim_one(conn, "w1", "silent") == run_id
        conn.execute(
            "UPDATE jobs.runs SET heartbeat_at = now() - interval '5 seconds' WHERE id = %s", (run_id,)
        )
        answers: dict[str, list[Any]] = {}

        def call(name: str, sql: str, args: tuple[Any, ...], answers: dict[str, list[Any]] = answers) -> None:
            with db.connect(autocommit=True) as own:
                answers[name] = own.execute(sql, args).fetchall()

        with db.connect(autocommit=False) as locker:
            locker.execute("LOCK TABLE jobs.runs IN ACCESS EXCLUSIVE MODE")
            calls = [
                threading.Thread(
                    target=call,
                    args=("beat", "SELECT run_id FROM jobs.heartbeat(%s, 'w1')", ([*held, run_id],)),
                ),
                threading.Thread(target=call, args=("reap", "SELECT run_id FROM jobs.reap()", ())),
            ]
            for thread in calls:
                thread.start()
            wait_for(
                "the heartbeat and the reap to wait for the lock",
                lambda: (
                    scalar(
                        conn,
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock' AND query ~ 'jobs\\.(heartbeat|reap)'",
                    )
                    == 2
                ),
                60,
            )
            locker.commit()
        for thread in calls:
            thread.join(60)
        stamped = (run_id,) in answers["beat"]
        reaped = (run_id,) in answers["reap"]
        assert stamped or reaped, f"run {run_id}: neither stamped nor reaped: {answers}"
        if stamped and reaped:
            both.append(run_id)
        conn.execute(
            "UPDATE jobs.runs SET status = 'COMPLETED', finished_at = now()"
            " WHERE id = %s AND status = 'RUNNING'",
            (run_id,),
        )
    assert not both, f"runs answered as stamped to their worker and failed by the reap beside it: {both}"


def test_a_reap_of_many_workers_runs_holds_no_lock_per_worker(db: Database, conn: Conn) -> None:
    """A reap that fails the runs of 500 dead workers holds none of their heartbeat keys until it
    commits: each takes a slot of the server's shared lock table, which a few thousand workers
    (a crash-looping fleet while no scheduler reaped) fill, and then every reap fails with 53200
    (out of shared memory) and nothing is reaped any more. Every run is still reaped, and the
    heartbeat of a worker still in flight keeps its runs."""
    ids = add_runs(conn, 501, kind="many")
    conn.execute(
        "UPDATE jobs.runs SET status = 'RUNNING', attempt = 1, started_at = now() - interval '2 hours',"
        " heartbeat_at = now() - interval '2 hours', worker = 'dead-' || id WHERE id = ANY (%s)",
        (ids[:-1],),
    )
    assert _claim_one(conn, "w1", "many") == ids[-1]
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '2 hours' WHERE id = %s", (ids[-1],))
    with db.connect(autocommit=False) as reaper, db.connect(autocommit=False) as in_flight:
        in_flight.execute(f"SELECT pg_advisory_xact_lock_shared({HEARTBEAT_KEY_W1})")
        reaped = reaper.execute("SELECT run_id, reason FROM jobs.reap() ORDER BY 1").fetchall()
        held = scalar(
            reaper, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        assert held == 0, f"the reap holds {held} advisory locks until it commits"
        reaper.commit()
        in_flight.commit()
    assert reaped == [(i, "HeartbeatLost") for i in ids[:-1]], f"{len(reaped)} reaped of {len(ids) - 1}"
    assert conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall() == [(ids[-1], "HeartbeatLost")]


def test_reap_worker_fails_only_that_workers_runs_whatever_their_token(conn: Conn) -> None:
    """An operator hands on the runs of a worker known to be gone: each of its RUNNING runs,
    claimed with a claim token or without, fails now as HeartbeatLost with its retry queued by
    policy; another worker's run is untouched; bad input is refused with 22023 naming the field,
    changing nothing."""
    conn.execute("SELECT jobs.set_retry_policy('report', max_attempts => 2)")
    with_token = _enqueue(conn, "report")
    assert conn.execute(
        "SELECT id FROM jobs.claim(1, 'gone', ARRAY['report'], claim_token => %s)", ("t" * 20,)
    ).fetchall() == [(with_token,)]
    without = _enqueue(conn, "report")
    assert _claim_one(conn, "gone", "report") == without
    other = _enqueue(conn, "report")
    assert _claim_one(conn, "alive", "report") == other

    before = digest(conn)
    for args, field in (((None, None), "worker"), (("", None), "worker"), (("gone", "x" * 10001), "message")):
        expect_error(conn, "SELECT * FROM jobs.reap_worker(%s, %s)", args, "22023", field)
    assert digest(conn) == before, "a refused jobs.reap_worker changed the database"

    got = conn.execute(
        "SELECT run_id, reason, retry_run_id IS NOT NULL FROM jobs.reap_worker('gone')"
    ).fetchall()
    assert got == [(with_token, "HeartbeatLost", True), (without, "HeartbeatLost", True)], got
    assert run_row(conn, other)["status"] == "RUNNING", "another worker's run was reaped"
    _assert_fenced(conn, without, "gone")
    assert conn.execute("SELECT * FROM jobs.reap_worker('gone')").fetchall() == [], (
        "a second call reaps again"
    )


def _lowered(conn: Conn) -> tuple[Any, Any]:
    row = conn.execute(
        "SELECT heartbeat_timeout_lowered_from, heartbeat_timeout_lowered_at FROM jobs.config"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_lowered_heartbeat_timeout_keeps_the_previous_one_for_runs_beaten_before_it(conn: Conn) -> None:
    """Workers read jobs.config.heartbeat_timeout at each beat and until their next one beat at
    the cadence the previous timeout asked for (a third of it). So a run whose last heartbeat
    came before the timeout was lowered is judged by the previous timeout for that one's length
    after the change; a run beaten since is judged by the new one at once, and a run silent for
    longer than the previous timeout is reaped as before."""
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '1 minute'")
    early, late, silent = (_enqueue(conn, "report") for _ in range(3))
    assert {r[0] for r in conn.execute("SELECT id FROM jobs.claim(3, 'w1')")} == {early, late, silent}
    conn.execute("SELECT * FROM jobs.heartbeat(ARRAY[%s, %s, %s]::bigint[], 'w1')", (early, late, silent))
    # At a minute's timeout a worker beats every 20 s: 15 s since the last beat is alive.
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '15 seconds' WHERE id = %s", (early,))
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '61 seconds' WHERE id = %s", (silent,))

    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '1 second'")
    assert _lowered(conn)[0] == timedelta(minutes=1)
    reaped = conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall()
    assert reaped == [(silent, "HeartbeatLost")], "only the run silent for longer than the previous timeout"
    assert run_row(conn, early)["status"] == "RUNNING", "beaten 15 s ago at a minute's cadence: alive"
    shown = dict(conn.execute("SELECT id, heartbeat_timeout FROM jobs.running").fetchall())
    assert shown == {early: timedelta(minutes=1), late: timedelta(minutes=1)}, shown

    # The worker's next beat reads the new timeout: from then on its runs are judged by it.
    conn.execute("SELECT * FROM jobs.heartbeat(ARRAY[%s]::bigint[], 'w1')", (late,))
    assert dict(conn.execute("SELECT id, heartbeat_timeout FROM jobs.running").fetchall())[late] == timedelta(
        seconds=1
    )
    late_reaped: list[Any] = []

    def reaped_late() -> bool:
        late_reaped.extend(conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall())
        return bool(late_reaped)

    wait_for("the run beaten after the change to be reaped by the new timeout", reaped_late, 60)
    assert late_reaped == [(late, "HeartbeatLost")], late_reaped
    assert run_row(conn, early)["status"] == "RUNNING"

    # Once the previous timeout's length has passed since the change, the new one holds for all.
    conn.execute("ALTER TABLE jobs.config DISABLE TRIGGER config_bounds")
    conn.execute(
        "UPDATE jobs.config"
        " SET heartbeat_timeout_lowered_at = heartbeat_timeout_lowered_at - interval '2 minutes'"
    )
    conn.execute("ALTER TABLE jobs.config ENABLE TRIGGER config_bounds")
    conn.execute(
        "UPDATE jobs.runs SET heartbeat_at = c.heartbeat_timeout_lowered_at - interval '1 second'"
        " FROM jobs.config AS c WHERE id = %s",
        (early,),
    )
    assert conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall() == [(early, "HeartbeatLost")]


def test_the_config_remembers_the_longest_timeout_still_in_force_when_lowered_again(conn: Conn) -> None:
    """Lowered twice within the first timeout's length: runs beaten before the second change
    keep the first timeout (their workers may still beat at its cadence). Raised: nothing to
    remember. The two columns are pgtick's: a direct write to them is kept out."""
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '1 minute'")
    assert _lowered(conn) == (None, None)
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '30 seconds'")
    first = _lowered(conn)
    assert first[0] == timedelta(minutes=1) and first[1] is not None
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '10 seconds'")
    second = _lowered(conn)
    assert second[0] == timedelta(minutes=1) and second[1] >= first[1]
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '2 minutes'")
    assert _lowered(conn) == second, "raising changes nothing remembered"
    conn.execute(
        "UPDATE jobs.config"
        " SET heartbeat_timeout_lowered_from = '1 day', heartbeat_timeout_lowered_at = now()"
    )
    assert _lowered(conn) == second, "a direct write to the remembered timeout is kept out"
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '1 minute'")
    assert _lowered(conn)[0] == timedelta(minutes=2)
