"""`pgtick run` replicas against one database: one leader, each occurrence run exactly once.

Invariants checked from the database (job code records itself, tests/apps/recording.py):
* at most one leader at any instant (jobs.leader sampled every ~100 ms), and one
  most of the time; a killed leader is replaced within two ticks plus a margin;
* each occurrence of the per-second schedule has exactly one run (invariant 3),
  no gaps between the first and the last one, and each run executed once (invariant 1).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg

from harness import (
    Clock,
    Conn,
    Database,
    Processes,
    assert_each_occurrence_once,
    catch_up_windows,
    leader_to_kill,
    occurrences,
    pid_of_owner,
    scalar,
    settle_after_failover,
    settle_occurrences,
    wait_for,
)
from pgtick.scheduler import Scheduler

TICK = 0.2
APP = "ticker_app.py"


def leader_owners(conn: psycopg.Connection[Any]) -> list[str | None]:
    return [row[0] for row in conn.execute("SELECT owner FROM jobs.leader").fetchall()]


def start_replicas(procs: Processes, n: int) -> dict[int, str]:
    replicas = [procs.replica(APP, f"replica{i}") for i in range(n)]
    return {r.pid: r.worker_id for r in replicas}  # worker_id waits for "worker=... started"


def test_three_replicas_one_leader_each_second_exactly_once(procs: Processes, conn: Conn) -> None:
    workers = start_replicas(procs, 3)
    wait_for("a leader", lambda: leader_owners(conn), timeout=60)
    samples: list[tuple[float, list[str | None]]] = []
    began = time.monotonic()
    while time.monotonic() - began < 10:
        samples.append((round(time.monotonic() - began, 2), leader_owners(conn)))
        time.sleep(0.1)
    settled_before = settle_occurrences(conn)
    codes = procs.stop_all()
    runs = occurrences(conn)
    coalesced = catch_up_windows(conn)
    logs = procs.tails()

    assert all(code == 0 for _, code in codes), f"replicas exit codes {codes}\n{logs}"
    crowded = [s for s in samples if len(s[1]) > 1]
    assert not crowded, f"more than one leader at once (t, owners): {crowded}"
    led = [s for s in samples if len(s[1]) == 1]
    assert len(led) >= 0.9 * len(samples), (
        f"a leader in only {len(led)}/{len(samples)} samples: {[s for s in samples if not s[1]]}"
    )
    owners = [s[1][0] for s in led]
    strangers = {o for o in owners if pid_of_owner(o) not in workers}
    assert not strangers, f"leader owners that are no replica {strangers}; replicas {workers}"
    changes = [(a, b) for a, b in pairwise(owners) if a != b]
    assert not changes, f"leadership changed hands with no failure: {changes}"
    assert_each_occurrence_once(runs, settled_before=settled_before, coalesced=coalesced)
    assert len(runs) >= 8, f"a per-second schedule over ~10 s gave {len(runs)} occurrences: {runs}"
    by_process = Counter(r["pids"][0] for r in runs if r["pids"])
    print(f"\n{len(runs)} occurrences, executions per replica pid: {dict(by_process)}")


def leader_since(conn: psycopg.Connection[Any]) -> datetime | None:
    since: datetime | None = scalar(conn, "SELECT max(since) FROM jobs.leader")
    return since


def test_killed_leader_is_replaced_within_two_ticks(procs: Processes, conn: Conn) -> None:
    """The failover is measured on the server's clock, from just before the kill to the new
    leader's `since`; every other step waits on a condition with a generous deadline, so a
    busy machine slows the test down but does not fail it."""
    workers = start_replicas(procs, 3)
    old, victim = leader_to_kill(procs, conn, leader_owners, workers)

    killed_at: datetime = scalar(conn, "SELECT clock_timestamp()")
    victim.send(signal.SIGKILL)
    samples: list[tuple[float, list[str | None]]] = []
    began = time.monotonic()
    while True:
        owners = leader_owners(conn)
        elapsed = time.monotonic() - began
        samples.append((round(elapsed, 3), owners))
        assert len(owners) <= 1, f"two leaders at once: {samples[-5:]}"
        assert None not in owners, f"a leader without its owner: {samples[-5:]}"
        if owners and owners != old:
            break
        assert elapsed < 60, f"no new leader 60 s after killing {old}: {samples[-5:]}\n{procs.tails()}"
        time.sleep(0.01)
    since = leader_since(conn)
    assert since is not None
    failover = (since - killed_at).total_seconds()
    assert victim.wait(30) == -signal.SIGKILL
    settled_before = settle_after_failover(conn, since, workers[victim.pid])
    new = leader_owners(conn)
    codes = procs.stop_all()
    runs = occurrences(conn)
    coalesced = catch_up_windows(conn)

    print(f"\nfailover after kill -9 of the leader: {failover:.3f}s (tick {TICK}s)")
    survivors = {pid for pid in workers if pid != victim.pid}
    assert pid_of_owner(owners[0]) in survivors, f"new leader {owners} is not a survivor {survivors}"
    assert new == owners, f"leadership moved again after the failover: {owners} then {new}"
    assert failover <= 2.0, f"new leader only {failover:.2f}s after the kill (tick {TICK}s): {samples}"
    assert all(code == 0 for _, code in codes), codes
    # Occurrences across the failover: still one run each, no gap, each executed once.
    # A run the victim had claimed stays RUNNING for the reaper (heartbeat timeout 1 min).
    assert_each_occurrence_once(runs, settled_before, dead_worker=workers[victim.pid], coalesced=coalesced)


def test_a_restart_after_downtime_coalesces_the_runs_made_ahead_before_it(
    procs: Processes, conn: Conn, db: Database
) -> None:
    """Runs a leader materialized ahead and that never started before everything went down are
    late occurrences too: with coalesce, the restarted process's leader supersedes them before
    its own worker claims them, and the downtime ends in one run, not one per stale row."""
    conn.execute("SELECT jobs.define('every-second', 'tick', 'FREQ=SECONDLY;INTERVAL=1', timezone => 'UTC')")
    before_downtime = Scheduler(
        db.dsn, owner="gone", clock=Clock(datetime.now(UTC) - timedelta(minutes=2)), lookahead=20
    )
    try:
        before_downtime.materialize_due()  # the cursor
        before_downtime.materialize_due()  # and 20 s of runs ahead of it
    finally:
        before_downtime.close()
    stale = [
        r[0] for r in conn.execute("SELECT id FROM jobs.runs WHERE status = 'QUEUED' ORDER BY id").fetchall()
    ]
    assert len(stale) >= 10, stale
    replica = procs.replica(APP, "restarted")
    wait_for(
        "the catch-up after the downtime",
        lambda: (
            scalar(conn, "SELECT count(*) FROM jobs.catch_ups")
            and scalar(
                conn, "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s) AND status = 'QUEUED'", (stale,)
            )
            == 0
        ),
        timeout=60,
    )
    ended = conn.execute(
        "SELECT status::text, error, count(*) FROM jobs.runs WHERE id = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 2",
        (stale,),
    ).fetchall()
    assert ended == [
        ("CANCELLED", "skipped: superseded by coalescing (a later occurrence runs instead)", len(stale))
    ], f"{ended}\n{replica.tail()}"
