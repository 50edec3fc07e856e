"""Invariant 5: no deadlock between claim, heartbeat, complete, complete_many, fail, reap,
cancel, enqueue, run_now, define and prune, hand_back_unheld, and the flow-control calls (claim
from queues, snooze, unclaim, set_limit, remove_limit, pause_queue, resume_queue, unique enqueue,
enqueue with dependencies, enqueue_many), run concurrently from real processes.

Every session sets lock_timeout = 30s, so a hang shows up as SQLSTATE 55P03 instead
of a stuck test; a deadlock shows up as 40P01 (deadlock_timeout is 1s) and as
"deadlock detected" in the server log.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from harness import NEVER, Conn, Database, Server, add_definition, add_runs, race_parts, scalar, wait_at_gate

KINDS = [f"k{i}" for i in range(12)]
QUEUES = [f"q{i}" for i in range(4)]
SECONDS = 10.0
# Far above any wait a claim or a commit causes, even when a busy 2-core machine leaves a
# lock holder off the CPU for seconds; far below the test's own deadline.
LOCK_TIMEOUT = "30s"


class Recorder:
    """Counts operations and keeps every database error with its context."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.ops: Counter[str] = Counter()
        self.errors: list[tuple[str, str, str | None, str]] = []
        self.lock = threading.Lock()

    def call(self, op: str, fn: Callable[[], Any], benign: tuple[str, ...] = ()) -> Any:
        try:
            result = fn()
        except psycopg.Error as exc:
            with self.lock:
                if exc.sqlstate in benign:
                    self.ops[f"{op}:{exc.sqlstate}"] += 1
                else:
                    self.errors.append((self.who, op, exc.sqlstate, str(exc).splitlines()[0]))
            return None
        with self.lock:
            self.ops[op] += 1
        return result

    def result(self, **extra: Any) -> dict[str, Any]:
        return {"who": self.who, "ops": dict(self.ops), "errors": self.errors, **extra}


def _session(dsn: str) -> Conn:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    conn.execute("SET application_name = 'pgtick-deadlock-test'")
    return conn


def _gated_session(dsn: str) -> Conn:
    """A role's main session, returned once the start gate has opened."""
    conn = _session(dsn)
    wait_at_gate(conn)
    return conn


def _worker(dsn: str, worker: str, seed: int) -> dict[str, Any]:
    """Claim over a random half of the kinds; a heartbeat thread on its own connection beats
    for every held run; the main thread completes, completes in batches, fails, acknowledges
    cancellations, and abandons a few runs (no more heartbeats) so the reaper takes them, or,
    now and then, hands them back as after a claim whose answer was lost (hand_back_unheld)."""
    rng = random.Random(seed)
    rec = Recorder(worker)
    held: dict[int, float] = {}  # run id -> when to finish it
    abandoned: dict[int, float] = {}  # run id -> when we abandoned it
    cancel_seen: set[int] = set()
    claimed: list[int] = []
    snoozed_ok: list[int] = []
    guard = threading.Lock()
    stop = threading.Event()

    def beat() -> None:
        with _session(dsn) as hb:
            while not stop.is_set():
                with guard:
                    ids = sorted(held)
                if ids:
                    rows = rec.call(
                        "heartbeat",
                        lambda ids=ids: hb.execute(  # type: ignore[misc]  # default-bound lambda
                            "SELECT run_id, cancel_requested FROM jobs.heartbeat(%s, %s)",
                            (ids, worker),
                        ).fetchall(),
                    )
                    with guard:
                        cancel_seen.update(r[0] for r in rows or [] if r[1])
                stop.wait(0.02)

    with _gated_session(dsn) as conn:
        beater = threading.Thread(target=beat, name=f"{worker}-heartbeat", daemon=True)
        beater.start()
        deadline = time.monotonic() + SECONDS
        halfway = deadline - SECONDS / 2
        handed_back = False
        while time.monotonic() < deadline:
            # What the worker does not hold goes back to the queue: now and then, and at least
            # once per worker however few rounds a busy machine lets it make.
            if rng.random() < 0.03 or (not handed_back and time.monotonic() >= halfway):
                handed_back = True
                with guard:  # (the abandoned runs of even id are left to the reaper)
                    holding = sorted({*held, *(i for i in abandoned if i % 2 == 0)})
                back = rec.call(
                    "hand_back_unheld",
                    lambda h=holding: conn.execute(  # type: ignore[misc]  # default-bound lambda
                        "SELECT run_id FROM jobs.hand_back_unheld(%s, %s)", (h, worker)
                    ).fetchall(),
                )
                with guard:
                    for (run_id,) in back or []:
                        abandoned.pop(run_id, None)
                        snoozed_ok.append(run_id)  # queued again: a later claim of it is legitimate
            kinds = rng.sample(KINDS, 6)
            queues = rng.sample(QUEUES, 2) if rng.random() < 0.3 else None
            rows = rec.call(
                "claim",
                lambda k=kinds, q=queues: conn.execute(  # type: ignore[misc]  # default-bound lambda
                    "SELECT id FROM jobs.claim(%s, %s, %s, queues => %s)", (rng.randint(1, 6), worker, k, q)
                ).fetchall(),
            )
            now = time.monotonic()
            with guard:
                for (run_id,) in rows or []:
                    claimed.append(run_id)
                    if rng.random() < 0.02:  # never heartbeated: Orphaned
                        abandoned[run_id] = now
                    else:
                        held[run_id] = now + rng.choice([0, 0.002, 0.01, 0.05, 0.3, 0.3])
                due = [i for i, t in held.items() if t <= now]
                for i in due:
                    del held[i]
                    if rng.random() < 0.04:  # heartbeated a while, then went silent
                        abandoned[i] = now
                due = [i for i in due if i not in abandoned]
                cancels = [i for i in due if i in cancel_seen]
                zombies = [i for i, t in abandoned.items() if now - t > 1.5]
                for i in zombies:
                    del abandoned[i]
            for run_id in cancels:
                rec.call(
                    "acknowledge_cancel",
                    lambda r=run_id: conn.execute("SELECT jobs.acknowledge_cancel(%s, %s)", (r, worker)),  # type: ignore[misc]  # default-bound lambda
                )
            rest = [i for i in due if i not in cancels]
            rng.shuffle(rest)
            snoozed = [i for i in rest if rng.random() < 0.05]
            for run_id in snoozed:
                back = rec.call(
                    "snooze",
                    lambda r=run_id: scalar(  # type: ignore[misc]  # default-bound lambda
                        conn, "SELECT jobs.snooze(%s, %s, %s)", (r, worker, rng.choice(["0", "20 ms"]))
                    ),
                )
                if back:
                    snoozed_ok.append(run_id)  # queued again: a later claim of it is legitimate
            rest = [i for i in rest if i not in snoozed]
            handed = [i for i in rest if rng.random() < 0.05]
            if handed:  # given back as never begun, in one call
                back = rec.call(
                    "unclaim",
                    lambda h=handed: conn.execute(  # type: ignore[misc]  # default-bound lambda
                        "SELECT run_id FROM jobs.unclaim(%s, %s)", (h, worker)
                    ).fetchall(),
                )
                snoozed_ok.extend(r[0] for r in back or [])  # queued again, as snoozed ones are
            rest = [i for i in rest if i not in handed]
            batch, rest = rest[: len(rest) // 2], rest[len(rest) // 2 :]
            if batch:
                rec.call(
                    "complete_many",
                    lambda b=batch: conn.execute(  # type: ignore[misc]  # default-bound lambda
                        "SELECT * FROM jobs.complete_many(%s, %s)", (b, worker)
                    ).fetchall(),
                )
            for run_id in rest:
                if rng.random() < 0.3:
                    rec.call(
                        "fail",
                        lambda r=run_id: conn.execute(  # type: ignore[misc]  # default-bound lambda
                            "SELECT jobs.fail(%s, %s, %s, 'chaos')",
                            (r, worker, rng.choice([["RuntimeError", "Exception"], ["Denied"]])),
                        ),
                    )
                else:
                    rec.call(
                        "complete",
                        lambda r=run_id: conn.execute(  # type: ignore[misc]  # default-bound lambda
                            "SELECT jobs.complete(%s, %s, '{\"ok\": true}')", (r, worker)
                        ),
                    )
            for run_id in zombies:  # back from the dead: fenced if the reaper got it
                ok = rec.call(
                    "zombie_complete",
                    lambda r=run_id: scalar(conn, "SELECT jobs.complete(%s, %s)", (r, worker)),  # type: ignore[misc]  # default-bound lambda
                )
                rec.ops["zombie_fenced" if ok is False else "zombie_completed"] += 1
            time.sleep(rng.uniform(0, 0.004))
        stop.set()
        beater.join(10)
        with guard:
            leftovers = sorted(held)
        if leftovers:
            rec.call(
                "complete_many",
                lambda: conn.execute(
                    "SELECT * FROM jobs.complete_many(%s, %s)", (leftovers, worker)
                ).fetchall(),
            )
    return rec.result(claimed=claimed, snoozed=snoozed_ok)


def _operator(dsn: str, name: str, seed: int) -> dict[str, Any]:
    """Keep the queue fed and stir it: enqueue (some with colliding idempotency keys), run_now,
    cancel random live runs, cancel_queued, redefine caps."""
    rng = random.Random(seed)
    rec = Recorder(name)
    with _gated_session(dsn) as conn:
        deadline = time.monotonic() + SECONDS
        n = 0
        while time.monotonic() < deadline:
            n += 1
            if rng.random() < 0.4:
                _flow_action(conn, rec, rng)
            action = rng.random()
            if action < 0.35:
                with conn.transaction():  # several enqueues in one transaction
                    for _ in range(rng.randint(1, 5)):
                        rec.call(
                            "enqueue",
                            lambda: conn.execute(
                                "SELECT jobs.enqueue(%s, idempotency_key => %s)",
                                (rng.choice(KINDS), rng.choice([None, f"key-{rng.randint(0, 40)}"])),
                            ),
                        )
            elif action < 0.55:
                rec.call(
                    "run_now",
                    lambda: conn.execute("SELECT jobs.run_now(%s)", (f"d{rng.randint(0, 11)}",)),
                )
            elif action < 0.85:
                ids = conn.execute(
                    "SELECT id FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING') ORDER BY random() LIMIT 2"
                ).fetchall()
                for (run_id,) in ids:
                    # P0002: pruned between the pick and the call; that is an answer, not a hang.
                    rec.call(
                        "cancel",
                        lambda r=run_id: conn.execute("SELECT jobs.cancel(%s)", (r,)),  # type: ignore[misc]  # default-bound lambda
                        benign=("P0002",),
                    )
            elif action < 0.9:
                rec.call(
                    "cancel_queued",
                    lambda: conn.execute("SELECT jobs.cancel_queued(%s)", (f"d{rng.randint(0, 11)}",)),
                )
            else:
                i = rng.randint(0, 11)
                rec.call(
                    "define",
                    lambda i=i: conn.execute(  # type: ignore[misc]  # default-bound lambda
                        "SELECT jobs.define(%s, %s, run_at => %s, max_concurrent_runs => %s,"
                        " overlap_policy => %s)",
                        (f"d{i}", f"k{i}", NEVER, rng.randint(1, 3), "skip" if i < 2 else "queue"),
                    ),
                )
            time.sleep(rng.uniform(0, 0.01))
        for queue in QUEUES:
            rec.call("resume_queue", lambda q=queue: conn.execute("SELECT jobs.resume_queue(%s)", (q,)))  # type: ignore[misc]  # default-bound lambda
    return rec.result(claimed=[])


def _flow_action(conn: Conn, rec: Recorder, rng: random.Random) -> None:
    """One flow-control call: limits, pause/resume, unique or dependent enqueues, bulk enqueue."""
    action = rng.random()
    queue, kind = rng.choice(QUEUES), rng.choice(KINDS)
    if action < 0.2:
        scope, name = rng.choice([("queue", queue), ("kind", kind)])
        rec.call(
            "set_limit",
            lambda: conn.execute(
                "SELECT jobs.set_limit(%s, %s, max_running => %s, rate_limit => %s,"
                " rate_period => %s, per_key => %s)",
                (
                    scope,
                    name,
                    rng.randint(1, 4),
                    *rng.choice([(None, None), (50, "1 s")]),
                    rng.random() < 0.5,
                ),
            ),
        )
    elif action < 0.3:
        scope, name = rng.choice([("queue", queue), ("kind", kind)])
        rec.call("remove_limit", lambda: conn.execute("SELECT jobs.remove_limit(%s, %s)", (scope, name)))
    elif action < 0.45:
        rec.call("pause_queue", lambda: conn.execute("SELECT jobs.pause_queue(%s)", (queue,)))
    elif action < 0.6:
        rec.call("resume_queue", lambda: conn.execute("SELECT jobs.resume_queue(%s)", (queue,)))
    elif action < 0.75:
        rec.call(
            "enqueue_unique",
            lambda: conn.execute(
                "SELECT jobs.enqueue(%s, queue => %s, concurrency_key => %s, unique_key => %s,"
                " on_conflict => %s)",
                (
                    kind,
                    queue,
                    rng.choice([None, "t1", "t2"]),
                    f"u{rng.randint(0, 10)}",
                    rng.choice(["ignore", "replace", "debounce"]),
                ),
            ),
        )
    elif action < 0.9:
        deps = [r[0] for r in conn.execute("SELECT id FROM jobs.runs ORDER BY random() LIMIT 2").fetchall()]
        if deps:
            # P0002: a dependency pruned between the pick and the call.
            rec.call(
                "enqueue_depends",
                lambda: conn.execute(
                    "SELECT jobs.enqueue(%s, queue => %s, depends_on => %s)", (kind, queue, deps)
                ),
                benign=("P0002",),
            )
    else:
        rec.call(
            "enqueue_many",
            lambda: conn.execute(
                "SELECT count(*) FROM jobs.enqueue_many(%s, '[{}, {}, {}]', queue => %s,"
                " concurrency_key => %s)",
                (kind, queue, rng.choice([None, "t1"])),
            ),
        )


def _reaper(dsn: str, name: str) -> dict[str, Any]:
    """Sweep all the time, and prune finished history now and then."""
    rec = Recorder(name)
    reaped: Counter[str] = Counter()
    with _gated_session(dsn) as conn:
        deadline = time.monotonic() + SECONDS
        i = 0
        while time.monotonic() < deadline:
            i += 1
            rows = rec.call("reap", lambda: conn.execute("SELECT run_id, reason FROM jobs.reap()").fetchall())
            reaped.update(r[1] for r in rows or [])
            if i % 10 == 0:
                rec.call("prune", lambda: conn.execute("SELECT jobs.prune('0', 200)"))
            time.sleep(0.02)
    return rec.result(claimed=[], reaped=dict(reaped))


def _log_file(pg: Server) -> Path | None:
    """The server log: $PGTICK_SERVER_LOG (CI's external server), else the embedded one's."""
    configured = os.environ.get("PGTICK_SERVER_LOG")
    if configured:
        return Path(configured)
    if pg.embedded is None:
        return None  # an external server without a known log: only the log check is skipped
    return Path(pg.embedded.data_dir) / "log"


def test_no_deadlocks_or_hangs_under_a_concurrent_mix(pg: Server, db: Database, conn: Conn) -> None:
    """Invariant: for ~10 s, 4 workers (each with a heartbeat thread on its own connection),
    an operator and a reaper run claim / heartbeat / complete / complete_many / fail /
    acknowledge_cancel / hand_back_unheld / reap / prune / cancel / cancel_queued / enqueue / run_now
    / define and the flow-control calls (claim from queues, snooze, unclaim, set_limit, remove_limit,
    pause_queue, resume_queue, unique and dependent enqueues, enqueue_many) over overlapping
    definition, queue, kind and concurrency-key sets. No call fails with 40P01 (deadlock) or 55P03 (lock
    timeout, i.e. a wait of 30 s), no call fails at all, the server logs no deadlock, and no run
    is handed to two workers."""
    for i, kind in enumerate(KINDS):
        def_id = add_definition(
            conn, f"d{i}", kind=kind, cap=(i % 3) + 1, overlap="skip" if i < 2 else "queue"
        )
        ids = add_runs(conn, 25, kind=kind, definition_id=def_id, origin="schedule" if i < 2 else "manual")
        conn.execute(
            "UPDATE jobs.runs SET queue = %s, concurrency_key = %s WHERE id = ANY (%s)",
            (QUEUES[i % len(QUEUES)], f"t{i % 3}", ids),
        )
        conn.execute(
            "SELECT jobs.set_retry_policy(%s, deny => '{Denied}', max_attempts => 3,"
            " backoff_initial => '0', jitter => 0)",
            (kind,),
        )
    add_runs(conn, 100, kind="k11")  # ad-hoc runs, no definition
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '700 ms', orphan_timeout = '700 ms'")

    log = _log_file(pg)
    log_offset = log.stat().st_size if log is not None else 0

    parts: list[tuple[Any, tuple[Any, ...]]] = [(_worker, (db.dsn, f"w{i}", i)) for i in range(4)]
    parts += [(_operator, (db.dsn, "operator", 99)), (_reaper, (db.dsn, "reaper"))]
    results = race_parts(db.dsn, parts, timeout=SECONDS + 120)

    errors = [e for r in results for e in r["errors"]]
    stuck = [e for e in errors if e[2] in ("40P01", "55P03")]
    assert not stuck, f"deadlocks / lock timeouts (who, op, SQLSTATE, message): {stuck[:10]}"
    assert not errors, f"unexpected errors (who, op, SQLSTATE, message): {errors[:10]}"

    ops: Counter[str] = Counter()
    for r in results:
        ops.update(r["ops"])
    reaped: Counter[str] = Counter()
    for r in results:
        reaped.update(r.get("reaped", {}))
    for op in (
        "claim",
        "heartbeat",
        "complete",
        "complete_many",
        "fail",
        "reap",
        "prune",
        "enqueue",
        "run_now",
        "cancel",
        "define",
        "snooze",
        "unclaim",
        "hand_back_unheld",
        "set_limit",
        "remove_limit",
        "pause_queue",
        "resume_queue",
        "enqueue_unique",
        "enqueue_depends",
        "enqueue_many",
    ):
        assert ops[op] > 0, f"the mix never ran {op}: {dict(ops)}"
    assert reaped["HeartbeatLost"] > 0 and reaped["Orphaned"] > 0, (
        f"the reaper should have taken both kinds of silent runs: {dict(reaped)}, {dict(ops)}"
    )
    assert ops["zombie_fenced"] > 0, f"no reaped worker came back to be fenced: {dict(ops)}"

    owners: dict[int, str] = {}
    doubles = []
    snoozed = {run_id for r in results for run_id in r.get("snoozed", [])}
    for r in results:
        for run_id in r["claimed"]:
            if run_id in owners and run_id not in snoozed:
                doubles.append((run_id, owners[run_id], r["who"]))
            owners[run_id] = r["who"]
    assert not doubles, f"(run, first worker, second worker) claimed twice: {doubles[:10]}"

    if log is not None:
        with log.open("rb") as fh:
            fh.seek(log_offset)
            tail = fh.read().decode("utf-8", "replace")
        lines = tail.splitlines()
        hits = [line for line in lines if "deadlock detected" in line and not _of_another(line, db)]
        assert not hits, "server log:\n" + "\n".join(hits[:10])


def _of_another(line: str, db: Database) -> bool:
    """Whether a server log line names another test's database (a log_line_prefix with %d, as
    CI's shared server has): another test session on the same server may cause a deadlock on
    purpose. A line that names no database counts as this test's."""
    named = re.findall(r"\bpgtick_[a-z]+_\d+_\d+\b", line)
    return bool(named) and db.name not in named
