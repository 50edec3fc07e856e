"""Invariant 2 for limits, under real concurrency: 8 claimer processes hammer a queue limit,
a kind limit, per-key limits with several keys, definition caps combined with a queue limit,
and a rate limit, all in one pool. A probe samples RUNNING per group continuously from
another connection, each claimer checks right after its claim commits, and the starts per
trailing rate window are checked from the final rows. Never above a limit; everything
drains; no call fails (no deadlock, no lock timeout)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import psycopg

from harness import (
    LIVE_SQL,
    Conn,
    Database,
    Tally,
    add_definition,
    add_runs,
    gated,
    probe,
    race_parts,
    scalar,
)

#: Every group above its running limit right now: (scope, name, key, limit, running, run ids, workers).
OVER_LIMIT_SQL = """
SELECT l.scope, l.name, CASE WHEN l.per_key THEN r.concurrency_key END, l.max_running, count(*),
       array_agg(r.id ORDER BY r.id), array_agg(r.worker ORDER BY r.id)
  FROM jobs.runs AS r
  JOIN jobs.limits AS l
    ON (l.scope = 'queue' AND l.name = r.queue) OR (l.scope = 'kind' AND l.name = r.kind)
 WHERE r.status = 'RUNNING' AND l.max_running IS NOT NULL
 GROUP BY l.scope, l.name, l.max_running, l.per_key, CASE WHEN l.per_key THEN r.concurrency_key END
HAVING count(*) > l.max_running
UNION ALL
SELECT 'definition', d.name, NULL, d.max_concurrent_runs, count(*),
       array_agg(r.id ORDER BY r.id), array_agg(r.worker ORDER BY r.id)
  FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id
 WHERE r.status = 'RUNNING' AND d.max_concurrent_runs IS NOT NULL
 GROUP BY d.name, d.max_concurrent_runs
HAVING count(*) > d.max_concurrent_runs
"""


def _session(dsn: str) -> psycopg.Connection[Any]:
    """A session that has passed the start gate and then waits at most 5 s for any lock
    (a hang shows up as 55P03, a deadlock as 40P01)."""
    conn = gated(dsn)  # the gate can take long on a loaded machine: before the timeout
    conn.execute("SET lock_timeout = '5s'")
    return conn


def _claimer(
    dsn: str, worker: str, seed: int, seconds: float, most: int = 5, hint: str | None = None
) -> dict[str, Any]:
    """Claim 1 to ``most`` at a time, keep them a moment, complete them; with ``hint``, count
    the claims after which the session's claim hint (pgtick.claim_steps) read so."""
    rng = random.Random(seed)
    tally = Tally(worker)
    hinted = 0
    deadline = time.monotonic() + seconds
    with _session(dsn) as conn:
        while time.monotonic() < deadline:
            try:
                rows = tally.claim(conn, rng.randint(1, most))
                if hint is not None:
                    hinted += scalar(conn, "SELECT current_setting('pgtick.claim_steps', true)") == hint
                if not rows:
                    if scalar(conn, LIVE_SQL) == 0:
                        break
                    time.sleep(0.003)
                    continue
                tally.check(conn, OVER_LIMIT_SQL)
                time.sleep(rng.uniform(0.001, 0.006))
                conn.execute("SELECT * FROM jobs.complete_many(%s, %s)", ([r[0] for r in rows], worker))
            except psycopg.Error as exc:
                if tally.failed(exc):
                    break
    return tally.result(hinted=hinted)


def _probe(dsn: str, seconds: float) -> dict[str, Any]:
    with _session(dsn) as conn:
        return probe(conn, seconds, OVER_LIMIT_SQL)


def _claim_race(db: Database, claimer: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """8 claimers and a probe, all released at once, until the pool drains: no claim fails and
    no one ever sees a group above its limit."""
    parts: list[tuple[Any, tuple[Any, ...]]] = [(claimer, (db.dsn, f"w{i}", i, 240.0)) for i in range(8)]
    parts.append((_probe, (db.dsn, 240.0)))
    results = race_parts(db.dsn, parts, timeout=400)
    errors = [e for r in results for e in r["errors"]]
    assert not errors, f"claims failed (worker, SQLSTATE, message): {errors[:10]}"
    violations = [(*v[:6], v[6][:10], v[7][:10]) for r in results for v in r["violations"]]
    assert not violations, (
        "groups above their limit (who saw it, scope, name, key, limit, running, run ids, workers): "
        f"{violations[:10]}"
    )
    return results


def _rate_violations(starts: list[Any], limit: int, period: timedelta) -> list[tuple[Any, ...]]:
    """Every trailing window [s, s + period) that holds more than limit starts."""
    starts = sorted(starts)
    out = []
    j = 0
    for i, s in enumerate(starts):
        j = max(j, i)
        while j + 1 < len(starts) and starts[j + 1] < s + period:
            j += 1
        if j - i + 1 > limit:
            out.append((s, j - i + 1, starts[i : j + 1]))
    return out


def test_limits_hold_under_concurrent_claimers(db: Database, conn: Conn) -> None:
    """Invariant: no queue, kind, per-key or definition group ever has more RUNNING runs
    than its limit (probe and claimers), no trailing window holds more starts than the rate
    limit (final rows), every run completes exactly once, and no claim fails."""
    rng = random.Random(11)
    expected: set[int] = set()

    def runs(n: int, kind: str, queue: str, key: str | None = None, def_id: int | None = None) -> None:
        ids = add_runs(conn, n, kind=kind, definition_id=def_id)
        conn.execute(
            "UPDATE jobs.runs SET queue = %s, concurrency_key = %s WHERE id = ANY (%s)", (queue, key, ids)
        )
        expected.update(ids)

    conn.execute("SELECT jobs.set_limit('queue', 'qlim', max_running => 3)")
    runs(120, "plain", "qlim")
    conn.execute("SELECT jobs.set_limit('kind', 'klim', max_running => 2)")
    runs(60, "klim", "default")
    runs(60, "klim", "other")
    conn.execute("SELECT jobs.set_limit('queue', 'tenants', max_running => 2, per_key => true)")
    for t in range(5):
        runs(30, "tenant-work", "tenants", key=f"t{t}")
    runs(10, "tenant-work", "tenants", key=None)
    conn.execute("SELECT jobs.set_limit('queue', 'dq', max_running => 3)")
    for d in range(2):
        def_id = add_definition(conn, f"capped-{d}", kind="capped", cap=2)
        runs(40, "capped", "dq", def_id=def_id)
    rate_limit, period = 4, timedelta(seconds=1)
    conn.execute(
        "SELECT jobs.set_limit('kind', 'rated', rate_limit => %s, rate_period => %s)", (rate_limit, period)
    )
    runs(24, "rated", "default")
    runs(100, "free", "default")
    # Mix the claim order so claimers collide on every group at once.
    conn.execute("UPDATE jobs.runs SET priority = (random() * 10)::int")
    rng.random()

    results = _claim_race(db, _claimer)
    probe = next(r for r in results if r["worker"] == "probe")
    assert probe["samples"] >= 5, f"the probe sampled only {probe['samples']} times"

    owners: dict[int, str] = {}
    doubles = []
    for r in results:
        for run_id in r["claimed"]:
            if run_id in owners:
                doubles.append((run_id, owners[run_id], r["worker"]))
            owners[run_id] = r["worker"]
    assert not doubles, f"(run, first worker, second worker): {doubles[:10]}"
    assert owners.keys() == expected, f"never claimed: {sorted(expected - owners.keys())[:20]}"
    states = dict(conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall())
    assert states == {"COMPLETED": len(expected)}, states

    starts = [r[0] for r in conn.execute("SELECT started_at FROM jobs.runs WHERE kind = 'rated'")]
    over = _rate_violations(starts, rate_limit, period)
    assert not over, f"(window start, starts in it, the starts) above {rate_limit} per {period}: {over[:5]}"
    busy = [r["worker"] for r in results if r["claimed"]]
    assert len(busy) >= 2, f"only {busy} claimed anything: the race did not happen"


def test_rate_window_check_catches_an_excess() -> None:
    """The final-rows rate check itself: 3 starts within one period are caught at limit 2."""
    from datetime import datetime

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    period = timedelta(seconds=1)
    starts = [
        t0,
        t0 + timedelta(milliseconds=400),
        t0 + timedelta(milliseconds=999),
        t0 + timedelta(seconds=2),
    ]
    assert _rate_violations(starts, 2, period)
    assert not _rate_violations(starts, 3, period)
    assert not _rate_violations([t0, t0 + period, t0 + 2 * period], 1, period)


# ---------------------------------------------------------------------------
# Roomy limits: shared-mode dispatch locks
# ---------------------------------------------------------------------------

SHARED_HOLDERS_SQL = """
SELECT coalesce(max(n), 0) FROM (
    SELECT count(*) AS n FROM pg_locks
     WHERE locktype = 'advisory' AND mode = 'ShareLock' AND granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND ((classid::bigint << 32) | objid::bigint) <> jobs._claiming_key()   -- every claim holds it
     GROUP BY classid, objid) AS held
"""


def _hoarder(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Claim up to 50 at a time and keep up to 150 runs RUNNING, completing the oldest 40
    whenever it holds 120: together the claimers want far more than the limits allow."""
    rng = random.Random(seed)
    held: list[int] = []
    tally = Tally(worker)
    shared_seen = 0
    deadline = time.monotonic() + seconds
    with _session(dsn) as conn:
        while time.monotonic() < deadline:
            try:
                rows = tally.claim(conn, rng.randint(1, 50))
                held.extend(int(r[0]) for r in rows)
                tally.check(conn, OVER_LIMIT_SQL)
                shared_seen = max(shared_seen, int(scalar(conn, SHARED_HOLDERS_SQL)))
                if len(held) >= 120 or (not rows and held):
                    done, held = held[:40], held[40:]
                    conn.execute("SELECT * FROM jobs.complete_many(%s, %s)", (done, worker))
                elif not rows:
                    if scalar(conn, LIVE_SQL) == 0:
                        break
                    time.sleep(0.003)
            except psycopg.Error as exc:
                if tally.failed(exc):
                    break
        if held:
            conn.execute("SELECT * FROM jobs.complete_many(%s, %s)", (held, worker))
    return tally.result(shared_seen=shared_seen)


def test_roomy_limits_hold_with_shared_dispatch_locks(db: Database, conn: Conn) -> None:
    """Invariant: a queue limit of 500 and a kind rate limit of 600 per second are taken in
    shared mode (several claimers hold the lock at once, as pg_locks shows), and still 8
    hoarding claimers never push RUNNING above 500 nor starts in any 1-second window above
    600; everything completes once."""
    expected: set[int] = set()
    conn.execute("SELECT jobs.set_limit('queue', 'big', max_running => 500)")
    ids = add_runs(conn, 2500, kind="a")
    conn.execute("UPDATE jobs.runs SET queue = 'big' WHERE id = ANY (%s)", (ids,))
    expected.update(ids)
    rate_limit, period = 600, timedelta(seconds=1)
    conn.execute(
        "SELECT jobs.set_limit('kind', 'burst', rate_limit => %s, rate_period => %s)", (rate_limit, period)
    )
    expected.update(add_runs(conn, 2500, kind="burst"))
    conn.execute("UPDATE jobs.runs SET priority = (random() * 10)::int")

    results = _claim_race(db, _hoarder)
    shared = max(r.get("shared_seen", 0) for r in results)
    assert shared >= 2, f"never saw two claimers holding one shared dispatch lock (max {shared})"
    starts = [r[0] for r in conn.execute("SELECT started_at FROM jobs.runs WHERE kind = 'burst'")]
    over = _rate_violations(starts, rate_limit, period)
    assert not over, f"above {rate_limit} per {period}: {[(s, n) for s, n, _ in over[:5]]}"
    claimed = [run_id for r in results for run_id in r["claimed"]]
    assert len(claimed) == len(set(claimed)), "a run was claimed twice"
    assert set(claimed) == expected
    states = dict(conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall())
    assert states == {"COMPLETED": len(expected)}, states


def test_a_per_key_limit_holds_for_each_of_many_keys_and_every_key_runs(db: Database, conn: Conn) -> None:
    """Invariant: a kind limit of 1 per key over 1,500 keys (more than jobs.set_limit locks one
    by one), two runs each, a key's runs next to each other in claim order: under 8 claimers
    no key ever has two RUNNING (probe and claimers, each check one snapshot), every run of
    every key is claimed once and completes, and no claim fails. The claim itself has no bound
    on keys: a later slice of its pool leaves out every key found full, however many."""
    keys = 1500
    conn.execute("SELECT jobs.set_limit('kind', 'tenanted', max_running => 1, per_key => true)")
    expected = {
        int(r[0])
        for r in conn.execute(
            "INSERT INTO jobs.runs (kind, concurrency_key, scheduled_for)"
            " SELECT 'tenanted', 'tenant-' || g, now() - interval '1 hour' + g * interval '1 ms'"
            " FROM generate_series(1, %s) AS g, generate_series(1, 2) AS n RETURNING id",
            (keys,),
        )
    }

    results = _claim_race(db, _claimer)
    claimed = [run_id for r in results for run_id in r["claimed"]]
    assert len(claimed) == len(set(claimed)), "a run was claimed twice"
    assert set(claimed) == expected, f"never claimed: {sorted(expected - set(claimed))[:20]}"
    left = conn.execute(
        "SELECT count(DISTINCT concurrency_key) FROM jobs.runs WHERE status <> 'COMPLETED'"
    ).fetchone()
    assert left == (0,), f"keys with a run not completed: {left}"
    busy = [r["worker"] for r in results if r["claimed"]]
    assert len(busy) >= 2, f"only {busy} claimed anything: the race did not happen"


def test_roomy_running_limits_hold_where_claims_start_their_pool_whole(db: Database, conn: Conn) -> None:
    """Invariant: with only roomy running limits (a queue limit of 500, and a kind limit of 500
    per tenant), a claim of up to 20 starts its whole pool under shared locks when every group
    has room for it with 16 claimers at once, and counts exactly nearer the limit. 8 hoarders
    claiming 1 to 50 at a time (so both ways) never push a group above its limit, and
    everything completes once."""
    conn.execute("SELECT jobs.set_limit('queue', 'big', max_running => 500)")
    conn.execute("SELECT jobs.set_limit('kind', 'tenanted', max_running => 500, per_key => true)")
    big = add_runs(conn, 2500, kind="a")
    conn.execute("UPDATE jobs.runs SET queue = 'big' WHERE id = ANY (%s)", (big,))
    tenanted = add_runs(conn, 2500, kind="tenanted")
    conn.execute("UPDATE jobs.runs SET concurrency_key = 't' || id %% 2 WHERE id = ANY (%s)", (tenanted,))
    conn.execute("UPDATE jobs.runs SET priority = (random() * 10)::int")

    results = _claim_race(db, _hoarder)
    claimed = [run_id for r in results for run_id in r["claimed"]]
    assert len(claimed) == len(set(claimed)), "a run was claimed twice"
    assert set(claimed) == set(big) | set(tenanted)
    states = dict(conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall())
    assert states == {"COMPLETED": len(big) + len(tenanted)}, states


# ---------------------------------------------------------------------------
# Capped definitions and no limit: the definitions' own two statements
# ---------------------------------------------------------------------------


def _definitions_claimer(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Claim 1 to 12 at a time, noting whether the session took the capped definitions'
    statements (its hint says 'defs' after its first claim)."""
    return _claimer(dsn, worker, seed, seconds, most=12, hint="defs")


def test_definition_caps_hold_where_no_limit_is_defined(db: Database, conn: Conn) -> None:
    """Invariant: with capped definitions and no limit defined, claims take the definitions'
    own two statements (try each definition's lock, count, start up to its room), falling back
    to the steps where the pool is mostly held back or a definition has another overlap
    policy. 8 claimers of 1 to 12 runs, interleaved over capped definitions (caps 1 to 3, one
    with overlap_policy 'skip'), an uncapped definition and ad-hoc runs, never push a
    definition above its cap, claim every run once, and complete everything."""
    expected: set[int] = set()
    for d, cap in enumerate([1, 2, 3, 2, 1, 3]):
        def_id = add_definition(conn, f"capped-{d}", kind="capped", cap=cap)
        expected.update(add_runs(conn, 60, kind="capped", definition_id=def_id))
    skip_id = add_definition(conn, "capped-skip", kind="capped", cap=2, overlap="skip")
    expected.update(add_runs(conn, 40, kind="capped", definition_id=skip_id))
    free_id = add_definition(conn, "uncapped", kind="free")
    expected.update(add_runs(conn, 80, kind="free", definition_id=free_id))
    expected.update(add_runs(conn, 80, kind="adhoc"))
    # Mix the claim order so that every pool meets several definitions at once.
    conn.execute("UPDATE jobs.runs SET priority = (random() * 10)::int")

    results = _claim_race(db, _definitions_claimer)
    assert sum(r.get("hinted", 0) for r in results) > 0, "no claim took the capped definitions' statements"
    claimed = [run_id for r in results for run_id in r["claimed"]]
    doubles = sorted({run_id for run_id in claimed if claimed.count(run_id) > 1})
    assert not doubles, f"claimed twice: {doubles[:20]}"
    assert set(claimed) == expected, f"never claimed: {sorted(expected - set(claimed))[:20]}"
    states = dict(conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall())
    assert states == {"COMPLETED": len(expected)}, states
    busy = [r["worker"] for r in results if r["claimed"]]
    assert len(busy) >= 2, f"only {busy} claimed anything: the race did not happen"


# ---------------------------------------------------------------------------
# Rate limits changed while workers give runs back
# ---------------------------------------------------------------------------


def _giver(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Claim 1 or 2 runs four times, then give all of them back at once, in a shuffled order:
    by jobs.unclaim, or by jobs.hand_back_unheld holding none (every other round)."""
    rng = random.Random(seed)
    tally = Tally(worker)
    rounds = 0
    deadline = time.monotonic() + seconds
    with _session(dsn) as conn:
        while time.monotonic() < deadline:
            try:
                held = [int(r[0]) for _ in range(4) for r in tally.claim(conn, rng.randint(1, 2))]
                rng.shuffle(held)
                if rounds % 2:
                    conn.execute("SELECT * FROM jobs.hand_back_unheld('{}', %s)", (worker,))
                else:
                    conn.execute("SELECT * FROM jobs.unclaim(%s, %s)", (held, worker))
                rounds += 1
            except psycopg.Error as exc:
                if tally.failed(exc):
                    break
    return tally.result(rounds=rounds)


def _limit_changer(dsn: str, worker: str, seed: int, seconds: float) -> dict[str, Any]:
    """Change the rate limits of kind 'rc' and queue 'rcq' again and again: per_key flips, the
    period grows and shrinks (each flip and growth rewrites the window's rows)."""
    rng = random.Random(seed)
    tally = Tally(worker)
    changes = 0
    deadline = time.monotonic() + seconds
    with _session(dsn) as conn:
        while time.monotonic() < deadline:
            scope, name = rng.choice([("kind", "rc"), ("queue", "rcq")])
            try:
                conn.execute(
                    "SELECT jobs.set_limit(%s, %s, rate_limit => 100000, rate_period => %s, per_key => %s)",
                    (scope, name, rng.choice(["1 minute", "2 minutes", "30 seconds"]), rng.random() < 0.5),
                )
                changes += 1
            except psycopg.Error as exc:
                if tally.failed(exc):
                    break
            time.sleep(rng.uniform(0, 0.01))
    return tally.result(changes=changes)


def test_rate_limit_changes_and_give_backs_never_deadlock(db: Database, conn: Conn) -> None:
    """Invariant 5 for limit changes: 3 workers claim a few runs at a time from several claims
    and give them all back at once (jobs.unclaim, jobs.hand_back_unheld), each give-back
    lowering the rows of the rate windows of a kind and a per-key queue limit, while 2 sessions
    change those limits (per_key flips, periods that grow) and so rewrite the same rows. No call
    fails: no deadlock, no lock timeout."""
    conn.execute("SELECT jobs.set_limit('kind', 'rc', rate_limit => 100000, rate_period => '1 minute')")
    conn.execute(
        "SELECT jobs.set_limit('queue', 'rcq', rate_limit => 100000, rate_period => '1 minute',"
        " per_key => true)"
    )
    for key in ("a", "b", "c"):
        ids = add_runs(conn, 100, kind="rc")
        conn.execute(
            "UPDATE jobs.runs SET queue = 'rcq', concurrency_key = %s WHERE id = ANY (%s)", (key, ids)
        )
    seconds = 8.0
    parts: list[tuple[Any, tuple[Any, ...]]] = [(_giver, (db.dsn, f"g{i}", i, seconds)) for i in range(3)]
    parts += [(_limit_changer, (db.dsn, f"c{i}", 100 + i, seconds)) for i in range(2)]
    results = race_parts(db.dsn, parts, timeout=120)
    errors = [e for r in results for e in r["errors"]]
    assert not errors, f"calls failed (worker, SQLSTATE, message): {errors[:10]}"
    rounds = sum(r.get("rounds", 0) for r in results)
    changes = sum(r.get("changes", 0) for r in results)
    assert rounds >= 20 and changes >= 20, f"{rounds} give-backs, {changes} changes: the race did not happen"
    left = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status <> 'QUEUED'")
    assert left == 0, f"{left} runs were not given back"
