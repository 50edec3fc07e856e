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
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg

from harness import Database, Processes, pid_of_owner, processes, scalar, wait_for

TICK = 0.2
APP = "ticker_app.py"


def leader_owners(conn: psycopg.Connection[Any]) -> list[str | None]:
    return [row[0] for row in conn.execute("SELECT owner FROM jobs.leader").fetchall()]


def start_replicas(procs: Processes, n: int) -> dict[int, str]:
    replicas = [procs.replica(APP, f"replica{i}") for i in range(n)]
    return {r.pid: r.worker_id for r in replicas}  # worker_id waits for "worker=... started"


def occurrences(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every run of the per-second definition with the executions that recorded it."""
    rows = conn.execute(
        """
        SELECT r.id, r.scheduled_for, r.status::text AS status, r.worker, r.origin,
               coalesce(array_agg(e.pid ORDER BY e.id) FILTER (WHERE e.id IS NOT NULL), '{}') AS pids,
               coalesce(array_agg(e.worker ORDER BY e.id) FILTER (WHERE e.id IS NOT NULL), '{}')
                   AS workers,
               count(e.exited) AS exits,
               bool_and(e.scheduled_for = r.scheduled_for AND e.definition_id = r.definition_id)
                   AS facts_match
          FROM jobs.runs AS r
          JOIN jobs.definitions AS d ON d.id = r.definition_id AND d.name = 'every-second'
          LEFT JOIN public.executions AS e ON e.run_id = r.id
         GROUP BY r.id
         ORDER BY r.scheduled_for, r.id
        """
    ).fetchall()
    keys = ("id", "scheduled_for", "status", "worker", "origin", "pids", "workers", "exits", "facts_match")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def catch_up_windows(conn: Any) -> list[tuple[datetime, datetime]]:
    """The late occurrences a leader coalesced after a gap in leadership (jobs.catch_ups)."""
    return [(r[0], r[1]) for r in conn.execute("SELECT first_late, last_late FROM jobs.catch_ups")]


def assert_each_occurrence_once(
    runs: list[dict[str, Any]],
    settled_before: datetime,
    dead_worker: str | None = None,
    coalesced: list[tuple[datetime, datetime]] | None = None,
) -> None:
    """One run per occurrence, consecutive seconds, each executed at most once; the ones
    due well before ``settled_before`` COMPLETED and executed exactly once by their worker
    (except runs claimed by ``dead_worker``, killed before it could report them). A gap is
    allowed only where a recorded catch-up coalesced the occurrences inside it (a failover
    slower than the schedule's period: misfire_policy coalesce, grace one period)."""
    assert len(runs) >= 3, f"too few occurrences materialized: {runs}"
    per_time = Counter(r["scheduled_for"] for r in runs)
    duplicated = [r for r in runs if per_time[r["scheduled_for"]] > 1]
    assert not duplicated, f"an occurrence materialized more than once: {duplicated}"
    assert all(r["origin"] == "schedule" for r in runs), runs
    gaps = [(a["scheduled_for"], b["scheduled_for"]) for a, b in pairwise(runs)]
    gaps = [(a, b) for a, b in gaps if b - a != timedelta(seconds=1)]
    gaps = [(a, b) for a, b in gaps if not any(a < first and last <= b for first, last in coalesced or [])]
    assert not gaps, f"occurrences not one second apart (gap or misalignment), none coalesced: {gaps}"
    twice = [r for r in runs if len(r["pids"]) > 1]
    assert not twice, f"runs executed more than once (run, pids, workers): {twice}"
    for r in runs:
        if r["worker"] is not None and r["worker"] == dead_worker and r["status"] != "COMPLETED":
            assert r["status"] == "RUNNING", f"a dead worker's unfinished run is not RUNNING: {r}"
            continue
        if r["status"] == "COMPLETED" or r["scheduled_for"] < settled_before:
            assert r["status"] == "COMPLETED", f"run due before the stop did not complete: {r}"
            assert len(r["pids"]) == 1 and r["exits"] == 1, f"completed run not executed once: {r}"
            assert r["facts_match"], f"job saw other facts than its run row: {r}"
            assert r["workers"] == [r["worker"]], f"executed by another worker than the claimer: {r}"
            assert r["pids"] == [pid_of_owner(r["worker"])], f"executed in another process: {r}"


def wait_for_occurrences(conn: psycopg.Connection[Any], n: int) -> None:
    """Until the per-second schedule has ``n`` runs (a busy machine starts replicas slowly)."""
    wait_for(f"{n} occurrences", lambda: len(occurrences(conn)) >= n, timeout=60)


def settle_after_failover(conn: psycopg.Connection[Any], since: datetime, dead_worker: str) -> datetime:
    """Wait until the new leader's occurrences after ``since`` complete, then until every
    occurrence due before a cut-off taken then has finished (but the dead worker's); return
    the cut-off. Everything before it is settled, however slowly a busy machine ran it."""
    wait_for(
        "occurrences after the failover to complete",
        lambda: (
            sum(1 for r in occurrences(conn) if r["scheduled_for"] > since and r["status"] == "COMPLETED")
            >= 2
        ),
        timeout=60,
    )
    return settle(conn, dead_worker)


def settle(conn: psycopg.Connection[Any], dead_worker: str | None = None) -> datetime:
    """Take a cut-off now and wait until every occurrence due before it has finished (but the
    dead worker's); return the cut-off."""
    cut_off: datetime = scalar(conn, "SELECT clock_timestamp()")
    wait_for(
        "every occurrence due before the cut-off to finish (but the dead worker's)",
        lambda: all(
            r["status"] == "COMPLETED" or (dead_worker is not None and r["worker"] == dead_worker)
            for r in occurrences(conn)
            if r["scheduled_for"] < cut_off
        ),
        timeout=60,
    )
    return cut_off


def stop_all(procs: Processes) -> list[tuple[str, int]]:
    alive = [p for p in procs.started if p.popen.poll() is None]
    for p in alive:
        p.send(signal.SIGTERM)
    return [(p.label, p.wait(15)) for p in alive]


def test_three_replicas_one_leader_each_second_exactly_once(db: Database, tmp_path: Path) -> None:
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        workers = start_replicas(procs, 3)
        wait_for("a leader", lambda: leader_owners(conn), timeout=60)
        samples: list[tuple[float, list[str | None]]] = []
        began = time.monotonic()
        while time.monotonic() - began < 10:
            samples.append((round(time.monotonic() - began, 2), leader_owners(conn)))
            time.sleep(0.1)
        settled_before = settle(conn)
        codes = stop_all(procs)
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


def test_killed_leader_is_replaced_within_two_ticks(db: Database, tmp_path: Path) -> None:
    """The failover is measured on the server's clock, from just before the kill to the new
    leader's `since`; every other step waits on a condition with a generous deadline, so a
    busy machine slows the test down but does not fail it."""
    with processes(tmp_path, db.dsn) as procs, db.connect() as conn:
        workers = start_replicas(procs, 3)
        wait_for("a leader", lambda: leader_owners(conn), timeout=60)
        wait_for_occurrences(conn, 2)  # a few under the first leader
        old = leader_owners(conn)
        assert len(old) == 1, old
        victim = procs.by_pid(pid_of_owner(old[0]))
        assert victim is not None, f"leader {old} is none of the replicas {workers}"

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
        codes = stop_all(procs)
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
