"""Heartbeat cost: a heartbeat is a HOT update (no index writes), so workers can beat often.

heartbeat_at is in no index and no index predicate, and jobs.runs has fillfactor
80, so the new row version fits on the same page once the page's dead versions
are pruned. Measured here with the cumulative statistics of jobs.runs.

A run a worker claimed and never began goes back with jobs.unclaim exactly as the claim
found it: same attempt, scheduled_for, occurrence and place in the claim order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from harness import Conn, Database, add_definition, add_runs, scalar

STATS = """
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobs.runs'::regclass
"""


def _flushed_stats(conn: Conn, at_least_updates: int = 0) -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd) after this session's pending statistics are flushed."""
    deadline = time.monotonic() + 10
    while True:
        conn.execute("SELECT pg_stat_force_next_flush()")  # flushed when the session goes idle
        row = conn.execute(STATS).fetchone()
        assert row is not None
        if row[0] >= at_least_updates or time.monotonic() > deadline:
            return int(row[0]), int(row[1])
        time.sleep(0.05)


def _until_older_transactions_end(conn: Conn, since: Any) -> None:
    """Wait (30 s at most) until no other transaction that began before ``since`` (a server
    clock reading) still runs: in this database any of them, with a snapshot or a write (an
    autovacuum ANALYZE, a harness connection), and in any database a write, since a snapshot
    taken while it runs, this session's own included, keeps the versions made dead after it
    began. Then the versions this session's transactions before ``since`` made dead can be
    pruned by its next statement."""
    deadline = time.monotonic() + 30  # measured anyway after that: the attempt may still pass
    while time.monotonic() < deadline and scalar(
        conn,
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND xact_start < %s"
        " AND (backend_xid IS NOT NULL OR (datname = current_database() AND backend_xmin IS NOT NULL))",
        (since,),
    ):
        time.sleep(0.01)


def test_heartbeats_are_hot_updates(conn: Conn) -> None:
    """20 workers claim 10 runs each and heartbeat them 5 times (one call per worker per round,
    each its own transaction, as the driver does): n_tup_hot_upd grows by about as many rows
    as the heartbeats updated.

    Measured caveat (docs/performance.md): one statement that heartbeats hundreds of runs
    packed on the same pages is only ~2/3 HOT, because a page cannot prune the versions that
    the same statement just made dead; per-worker batches of ~10 are ~98% HOT.

    A page cannot prune either the versions a transaction still running may see: one that
    began before they were made dead (in this database, or writing in any: a test elsewhere on
    the server). A worker heartbeats every few seconds, long after such transactions end; the
    rounds here follow each other at once, so each waits for the transactions that began
    before the last one committed. That is the server being busy, not the heartbeat's shape,
    and the measurement is taken up to five times: a heartbeat that could not be HOT (an
    indexed column changed) fails every time.
    """
    workers, batch, rounds = 20, 10, 5
    conn.execute("ALTER TABLE jobs.runs SET (autovacuum_enabled = off)")
    add_runs(conn, workers * batch)
    # The database was just made and migrated, catalogs included: autovacuum would analyze
    # them during the measurement, each ANALYZE holding a snapshot. Analyzed now, nothing is
    # left for it to do.
    conn.execute("ANALYZE")
    held: dict[str, list[int]] = {}
    for w in range(workers):
        name = f"w{w}"
        held[name] = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(%s, %s)", (batch, name))]
        assert len(held[name]) == batch

    attempts: list[str] = []
    for _ in range(5):
        upd0, hot0 = _flushed_stats(conn)
        beats = 0
        for _ in range(rounds):
            _until_older_transactions_end(conn, scalar(conn, "SELECT clock_timestamp()"))
            for name, ids in held.items():
                answered = conn.execute("SELECT run_id FROM jobs.heartbeat(%s, %s)", (ids, name))
                beats += len(answered.fetchall())
        assert beats == workers * batch * rounds
        upd1, hot1 = _flushed_stats(conn, upd0 + beats)
        updates, hot = upd1 - upd0, hot1 - hot0
        assert updates == beats, f"expected {beats} row updates from heartbeats, stats say {updates}"
        tolerance = max(10, beats // 20)  # 5%: a page now and then has not been pruned yet
        if hot >= beats - tolerance:
            return
        pages = scalar(conn, "SELECT pg_relation_size(%s) / 8192", ("jobs.runs",))
        attempts.append(f"{hot} of {beats} HOT (pages: {pages})")
    raise AssertionError(f"heartbeat updates were not HOT in any attempt: {'; '.join(attempts)}")


def test_heartbeat_touches_only_heartbeat_at(conn: Conn) -> None:
    """The heartbeat changes no other column (any indexed one would make it non-HOT)."""
    (run_id,) = add_runs(conn, 1)
    conn.execute("SELECT jobs.claim(1, 'w1')")
    before = conn.execute("SELECT to_jsonb(r) - 'heartbeat_at' FROM jobs.runs AS r").fetchone()
    conn.execute("SELECT * FROM jobs.heartbeat(%s, 'w1')", ([run_id],))
    after = conn.execute(
        "SELECT to_jsonb(r) - 'heartbeat_at', heartbeat_at IS NOT NULL FROM jobs.runs AS r"
    ).fetchone()
    assert after is not None and before is not None
    assert after[0] == before[0] and after[1] is True


TOKEN = "a-worker-secret-token"
ROW = "SELECT to_jsonb(r) FROM jobs.runs AS r WHERE r.id = %s"


def test_unclaim_puts_a_run_back_exactly_as_the_claim_found_it(conn: Conn) -> None:
    """A scheduled run an hour late is claimed and given back: its row is the same as before
    the claim (attempt, scheduled_for, occurrence_at, no owner, no start), so the next claim
    takes it before a newer run of its priority, and its lateness still counts from when it
    was due. Another worker, a wrong token, a run no longer RUNNING and a run asked to cancel
    are refused, changing nothing."""
    definition = add_definition(conn, "nightly", kind="k")
    late, newer = add_runs(conn, 2, definition_id=definition, origin="schedule")
    conn.execute("UPDATE jobs.runs SET occurrence_at = scheduled_for - interval '5 s' WHERE id = %s", (late,))
    before = scalar(conn, ROW, (late,))
    claimed = conn.execute("SELECT id FROM jobs.claim(1, 'w1', claim_token => %s)", (TOKEN,)).fetchall()
    assert claimed == [(late,)], f"expected run {late} claimed first, got {claimed}"
    held = scalar(conn, ROW, (late,))
    for worker, token in (("w2", TOKEN), ("w1", None), ("w1", "another-secret-token")):
        refused = conn.execute("SELECT * FROM jobs.unclaim(%s, %s, %s)", ([late], worker, token)).fetchall()
        assert refused == [], f"unclaim by {worker} with token {token!r} gave back {refused}"
    assert scalar(conn, ROW, (late,)) == held, "a refused unclaim changed the run"

    given = conn.execute("SELECT * FROM jobs.unclaim(%s, 'w1', %s)", ([late, newer], TOKEN)).fetchall()
    after = scalar(conn, ROW, (late,))
    assert given == [(late,)], f"expected only run {late} given back (run {newer} is QUEUED), got {given}"
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"run {late} is not as the claim found it: (before, after) {changed}"
    again = conn.execute("SELECT * FROM jobs.unclaim(%s, 'w1', %s)", ([late], TOKEN)).fetchall()
    assert again == [], f"a QUEUED run was given back again: {again}"

    reclaimed = conn.execute("SELECT id, attempt FROM jobs.claim(1, 'w2')").fetchall()
    assert reclaimed == [(late, 1)], f"the given-back run lost its place in the claim order: {reclaimed}"
    conn.execute("SELECT jobs.cancel(%s)", (late,))
    kept = conn.execute("SELECT * FROM jobs.unclaim(%s, 'w2')", ([late],)).fetchall()
    status = scalar(conn, "SELECT status::text || ' ' || worker FROM jobs.runs WHERE id = %s", (late,))
    assert (kept, status) == ([], "RUNNING w2"), "a run asked to cancel must stay with its worker"


def test_unclaim_gives_back_the_starts_a_rate_limit_counted_for_its_runs(conn: Conn) -> None:
    """A kind may start 2 runs an hour. A worker claims 2 and gives both back before they
    began: they never started, so another worker may still start 2 this hour, not none (the
    window would otherwise stay full until the hour is over). A run given back from a claim of
    two leaves the other's start counted."""
    conn.execute("SELECT jobs.set_limit('kind', 'k', rate_limit => 2, rate_period => '1 hour')")
    runs = add_runs(conn, 3)
    assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(2, 'w1')")] == runs[:2]
    given = conn.execute("SELECT * FROM jobs.unclaim(%s, 'w1')", (runs[:2],)).fetchall()
    assert given == [(runs[0],), (runs[1],)], f"not given back: {given}"
    again = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(3, 'w2')")]
    assert again == runs[:2], f"the rate window still counts the runs given back: claimed {again}"
    assert scalar(conn, "SELECT count(*) FROM jobs.unclaim(%s, 'w2')", ([runs[1]],)) == 1
    last = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(3, 'w3')")]
    assert last == [runs[1]], f"expected only run {runs[1]} to start again within the limit, got {last}"


def test_complete_many_sent_again_answers_the_runs_it_completed_once_each(conn: Conn) -> None:
    """Its answer lost, a worker sends complete_many again: the runs it completed come back as
    completed (once each, however often listed), nothing changes, and another worker is
    fenced. In one call, a run completed now is listed once, not again as a repeat."""
    runs = add_runs(conn, 3)
    claimed = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(3, 'w')")]
    assert claimed == runs
    first = [r[0] for r in conn.execute("SELECT run_id FROM jobs.complete_many(%s, 'w')", (runs[:2] * 2,))]
    assert sorted(first) == runs[:2], first
    finished = conn.execute(
        "SELECT id, finished_at FROM jobs.runs WHERE id = ANY (%s) ORDER BY id", (runs,)
    ).fetchall()
    again = [r[0] for r in conn.execute("SELECT run_id FROM jobs.complete_many(%s, 'w')", (runs * 2,))]
    assert sorted(again) == runs, f"completed now: {runs[2]}; completed before: {runs[:2]}; got {again}"
    after = conn.execute(
        "SELECT id, finished_at FROM jobs.runs WHERE id = ANY (%s) ORDER BY id", (runs,)
    ).fetchall()
    assert after[:2] == finished[:2], "a repeat changes nothing"
    assert conn.execute("SELECT run_id FROM jobs.complete_many(%s, 'other')", (runs,)).fetchall() == []


def test_a_heartbeat_skips_a_run_another_transaction_holds_and_answers_it_still_ours(
    conn: Conn, db: Database
) -> None:
    """A run whose row another session holds (an application's jobs.cancel not yet committed)
    does not hold up the heartbeat of the worker's other runs: they are stamped at once, the
    locked one is not stamped and is answered with cancel_requested NULL (still this worker's,
    not lost), and a locked run that is another worker's is not in the answer. Once the other
    transaction commits, the next heartbeat stamps it and reports the cancellation."""
    add_runs(conn, 3)
    mine = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(2, 'w1', heartbeat => true) ORDER BY id")]
    theirs = scalar(conn, "SELECT id FROM jobs.claim(1, 'w2', heartbeat => true)")
    beat = "SELECT heartbeat_at FROM jobs.runs WHERE id = %s"
    stamped = {run_id: scalar(conn, beat, (run_id,)) for run_id in mine}
    heartbeat = "SELECT run_id, cancel_requested FROM jobs.heartbeat(%s, 'w1')"
    conn.execute("SET lock_timeout = '20s'")  # fails instead of hanging should it wait
    with db.connect(autocommit=False) as app_tx:
        app_tx.execute("SELECT jobs.cancel(%s)", (mine[0],))
        app_tx.execute("SELECT 1 FROM jobs.runs WHERE id = %s FOR UPDATE", (theirs,))
        answer = dict(conn.execute(heartbeat, ([*mine, theirs],)).fetchall())
        after = {run_id: scalar(conn, beat, (run_id,)) for run_id in mine}
        app_tx.commit()
    assert answer == {mine[0]: None, mine[1]: False}, (
        f"heartbeat answered {answer} while run {mine[0]} was locked"
    )
    assert after[mine[0]] == stamped[mine[0]], f"locked run {mine[0]} was stamped"
    assert after[mine[1]] > stamped[mine[1]], f"run {mine[1]} was not stamped beside a locked run"
    answer = dict(conn.execute(heartbeat, ([*mine, theirs],)).fetchall())
    assert answer == {mine[0]: True, mine[1]: False}, f"after the commit the heartbeat answered {answer}"
    assert scalar(conn, beat, (mine[0],)) > stamped[mine[0]]


def test_next_due_reads_the_first_future_run_not_the_whole_scheduled_backlog(db: Database) -> None:
    """An idle worker asks jobs.next_due at each cycle; its plan is made once per session. With
    5,000 runs scheduled ahead (and 1,000 due now), a call must read the claim index in order and
    stop at the first future run of each priority, not fetch every future run and sort them.
    Read from the transaction's own counters of runs_claim_idx, so no timing is involved."""
    with db.connect() as setup:
        add_runs(setup, 1000)
        setup.execute(
            "INSERT INTO jobs.runs (kind, origin, scheduled_for, priority)"
            " SELECT 'k', 'manual', now() + g * interval '1 second', g % 2 FROM generate_series(1, 5000) AS g"
        )
        setup.execute("ANALYZE jobs.runs")
        first = scalar(setup, "SELECT min(scheduled_for) FROM jobs.runs WHERE scheduled_for > now()")
    with db.connect() as worker:  # a new session: the plan is made on its first call
        for _ in range(3):
            with worker.transaction():
                due = scalar(worker, "SELECT next_at FROM jobs.next_due()")
                read = scalar(
                    worker, "SELECT pg_stat_get_xact_tuples_returned('jobs.runs_claim_idx'::regclass)"
                )
            assert due == first
            assert read <= 100, f"jobs.next_due read {read} entries of runs_claim_idx for 5,000 future runs"


# Each call of a worker's cycle, with what it needs from the runs the cycle's claim took.
WORKER_CALLS: list[tuple[str, str, Callable[[list[int]], tuple[Any, ...]]]] = [
    ("next_due", "SELECT * FROM jobs.next_due(NULL, NULL)", lambda ids: ()),
    ("heartbeat", "SELECT * FROM jobs.heartbeat(%s, 'w', %s)", lambda ids: (ids, TOKEN)),
    ("complete", "SELECT jobs.complete(%s, 'w', '{}', %s)", lambda ids: (ids[0], TOKEN)),
    ("fail", "SELECT jobs.fail(%s, 'w', '{}', 'boom', 'Error', %s)", lambda ids: (ids[1], TOKEN)),
    ("snooze", "SELECT jobs.snooze(%s, 'w', '1 hour', %s)", lambda ids: (ids[2], TOKEN)),
    ("unclaim", "SELECT * FROM jobs.unclaim(%s, 'w', %s)", lambda ids: ([ids[3]], TOKEN)),
    ("acknowledge_cancel", "SELECT jobs.acknowledge_cancel(%s, 'w', NULL, %s)", lambda ids: (ids[4], TOKEN)),
    ("hand_back_unheld", "SELECT * FROM jobs.hand_back_unheld(%s, 'w', %s)", lambda ids: (ids[5:], TOKEN)),
    ("complete_many", "SELECT * FROM jobs.complete_many(%s, 'w', %s)", lambda ids: (ids[5:], TOKEN)),
]
READ_WHOLE = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'jobs.runs'::regclass"


def _reads_whole(worker: Conn, sql: str, args: tuple[Any, ...]) -> tuple[int, list[tuple[Any, ...]]]:
    """Make one call in a transaction of its own, as a worker does: the sequential scans of
    jobs.runs it made (counted within the transaction, so none of the session's others), and
    its rows."""
    with worker.transaction():
        before = scalar(worker, READ_WHOLE)
        answer = worker.execute(sql, args).fetchall()
        return scalar(worker, READ_WHOLE) - before, answer


def _worker_cycle(conn: Conn, worker: Conn) -> dict[str, int]:
    """Queue six runs; the worker claims them (and the run the last cycle gave back) and makes
    each call of WORKER_CALLS. Which calls read jobs.runs whole, and how often."""
    add_runs(conn, 6)
    read_whole = {}
    read_whole["claim"], claimed = _reads_whole(
        worker, "SELECT id FROM jobs.claim(10, 'w', NULL, true, claim_token => %s)", (TOKEN,)
    )
    ids = [r[0] for r in claimed]
    assert len(ids) >= 6, f"the cycle's claim took {ids}"
    conn.execute("SELECT jobs.cancel(%s)", (ids[4],))
    for name, sql, args in WORKER_CALLS:
        read_whole[name], _ = _reads_whole(worker, sql, args(ids))
    return {name: n for name, n in read_whole.items() if n}


def test_a_worker_that_started_on_an_empty_table_finds_its_runs_by_index_as_it_fills(
    db: Database, conn: Conn
) -> None:
    """A session keeps the plans of its calls until jobs.runs is analyzed, so a worker that
    starts on a new, empty table must not read the whole table in every claim, heartbeat and
    outcome as the table fills. The worker's calls are made (and planned) on an empty table
    with autovacuum off for it (no ANALYZE to replan them), 5,000 finished runs are added, and
    the same session's calls then read jobs.runs through its indexes only."""
    conn.execute("ALTER TABLE jobs.runs SET (autovacuum_enabled = off)")
    with db.connect() as worker:
        for _ in range(6):  # past the custom plans PostgreSQL tries before it keeps a generic one
            _worker_cycle(conn, worker)
        conn.execute(
            "INSERT INTO jobs.runs (kind, status, started_at, finished_at)"
            " SELECT 'k', 'COMPLETED', now(), now() FROM generate_series(1, 5000)"
        )
        read_whole = _worker_cycle(conn, worker)
    assert read_whole == {}, f"calls that read all of jobs.runs (sequential scans per call): {read_whole}"


def test_every_function_that_turns_a_plan_node_off_turns_jit_off_too(conn: Conn) -> None:
    """A scan a function's statement cannot avoid (jobs.config has no index) with that scan
    type turned off is priced as a disabled node, far above jit_above_cost: on a server with
    JIT (PostgreSQL's default where LLVM is installed) its generic plan would be compiled again
    at every call, half a second of server CPU for each failed run's retry. So every function
    that turns a plan node off (enable_seqscan, enable_sort, ...) also sets jit = off."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc AS p"
        " WHERE p.pronamespace = 'jobs'::regnamespace"
        "   AND EXISTS (SELECT FROM unnest(p.proconfig) AS c WHERE c LIKE 'enable\\_%=off')"
        " ORDER BY 1"
    ).fetchall()
    assert len(rows) >= 8, rows  # the worker's calls: claim, heartbeat, complete, fail, ...
    without = [name for name, config in rows if "jit=off" not in config]
    assert not without, f"functions that turn a plan node off but leave JIT on: {without}"


def test_a_failure_with_a_retry_compiles_nothing_where_jit_is_on(db: Database) -> None:
    """Where the server has JIT, a worker's failure of a run whose kind retries, and the retry it
    queues, run without compiling a plan (pg_stat_statements is not needed: JIT compilation
    shows as the jit counters of EXPLAIN ANALYZE, so the statement inside is checked through
    auto_explain's plan of it at the same settings)."""
    with db.connect() as conn:
        if not scalar(conn, "SELECT pg_jit_available()"):
            pytest.skip("this server has no JIT (the catalog test above holds the rule here)")
        conn.execute("SELECT jobs.set_retry_policy('flaky', max_attempts => 3)")
        (run_id,) = add_runs(conn, 1, kind="flaky")
        assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'w')")] == [run_id]
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET auto_explain.log_analyze = on")
        conn.execute("SET auto_explain.log_level = notice")
        conn.execute("SET client_min_messages = notice")
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        retry = scalar(conn, "SELECT (jobs.fail(%s, 'w', message => 'boom')).id", (run_id,))
        assert retry is not None and retry != run_id, retry
        plans = [n for n in notices if "plan:" in n]
        assert plans, notices
        compiled = [n for n in plans if "JIT:" in n]
        assert not compiled, "a statement of jobs.fail was JIT-compiled:\n" + "\n\n".join(compiled)
