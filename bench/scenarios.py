"""The benchmark scenarios: drain, caps, latency, growth, the heartbeat/HOT study, limits (the
claim under flow control), and the worker engines (threads, async, processes).

Each scenario function takes the ``Bench`` context and emits one record (one JSON line)
per measured configuration through ``bench.emit``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bench import sys_bare, sys_limits, sys_peers, sys_pgtick
from bench.harness import (
    Control,
    Drain,
    Profiler,
    Server,
    connect,
    percentiles,
    rate,
    report_ready,
    run_drain,
    spawn,
    timed,
    worker_process,
)

THREADS = 10  # the 10-way concurrency of every drain, per worker process
#: Most runs one driver process holds in the drains (its concurrency at large batches).
DRIVER_MOST_HELD = 200


def driver_settings(batch: int) -> tuple[int, int]:
    """The driver's (concurrency, claimers) at a batch size: like the SQL loop's THREADS
    connections of ``batch`` runs each, THREADS claims of ``batch`` in flight, within
    DRIVER_MOST_HELD runs held (at batch 100: two claims in flight, 200 runs)."""
    concurrency = max(THREADS, min(THREADS * batch, DRIVER_MOST_HELD))
    return concurrency, max(1, min(THREADS, concurrency // batch))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Bench:
    server: Server
    quick: bool
    profiler: Profiler
    systems: set[str] | None = None  # --systems: run only these (drain, caps, latency)
    history: int | None = None  # --history: finished runs in the growth scenario
    records: list[dict[str, Any]] = field(default_factory=list)
    round: int | None = None  # --repeat: which round these records belong to
    _dbs: int = 0

    @property
    def jobs(self) -> int:
        return 5000 if self.quick else 20000

    def wants(self, system: str) -> bool:
        return self.systems is None or system in self.systems

    def database(self, label: str) -> tuple[str, str]:
        """A fresh database for one system/scenario; returns (name, dsn)."""
        self._dbs += 1
        name = f"b{self._dbs:03d}_{label}".replace("-", "_")[:60]
        return name, self.server.fresh_database(name)

    def emit(self, record: dict[str, Any], dbname: str | None = None) -> None:
        record = {k: v for k, v in record.items() if v is not None}
        record["loadavg"] = round(os.getloadavg()[0], 2)
        if self.round is not None:
            record["round"] = self.round
        if dbname is not None and self.profiler.enabled:
            record["profile"] = self.profiler.collect(dbname)
        self.records.append(record)
        print(json.dumps(record, default=str), flush=True)

    def done_with(self, dbname: str) -> None:
        self.server.drop_database(dbname)


# -- systems under drain -------------------------------------------------------------------


@dataclass(frozen=True)
class DrainSystem:
    name: str
    install: Callable[[str], None]
    fill: Callable[[str, int], None]
    drain: Drain
    target: Callable[..., None]
    args: Callable[[int], tuple[Any, ...]]  # batch -> worker args after dsn
    batches: tuple[int | None, ...]  # None: the system has no batch setting
    jobs_divisor: int = 1  # slow configurations drain fewer jobs (the rate is steady-state)
    settings: str = ""


def drain_systems() -> list[DrainSystem]:
    return [
        DrainSystem(
            "bare-sql",
            sys_bare.install,
            sys_bare.fill,
            sys_bare.DRAIN,
            sys_bare.sql_worker,
            lambda b: (b, THREADS),
            (1, 10, 100),
            settings=f"{THREADS} threads x own connection; claim UPDATE..IN(SELECT..SKIP LOCKED LIMIT b), "
            "complete UPDATE..= ANY(ids)",
        ),
        DrainSystem(
            "pgtick-sql",
            sys_pgtick.install,
            sys_pgtick.fill,
            sys_pgtick.DRAIN,
            sys_pgtick.sql_worker,
            lambda b: (b, THREADS),
            (1, 10, 100),
            settings=f"{THREADS} threads x own connection; jobs.claim(b, w); jobs.complete (b=1) or "
            "jobs.complete_many",
        ),
        DrainSystem(
            "pgtick-driver",
            sys_pgtick.install,
            sys_pgtick.fill,
            sys_pgtick.DRAIN,
            sys_pgtick.driver_worker,
            lambda b: (b, driver_settings(b)[0], True, False, driver_settings(b)[1]),
            (1, 10, 100),
            settings=f"pgtick.worker.Worker(concurrency=min({THREADS}*b, {DRIVER_MOST_HELD}), batch_size=b, "
            f"claimers=min({THREADS}, concurrency/b), listen=True, heartbeats on)",
        ),
        DrainSystem(
            "pgqueuer",
            sys_peers.pgqueuer_install,
            sys_peers.pgqueuer_fill,
            sys_peers.PGQUEUER_DRAIN,
            sys_peers.pgqueuer_worker,
            lambda b: (b, 2 * b if b == 5 else None),
            (5, 10),
            settings="PgQueuer(AsyncpgDriver) under uvloop; b=5: batch_size=5, max_concurrent_tasks=10; "
            "b=10: its defaults (batch_size=10, unlimited tasks)",
        ),
        DrainSystem(
            "procrastinate",
            sys_peers.procrastinate_install,
            sys_peers.procrastinate_fill,
            sys_peers.PROCRASTINATE_DRAIN,
            sys_peers.procrastinate_worker,
            lambda b: (THREADS,),
            (None,),
            jobs_divisor=4,
            settings=f"App(PsycopgConnector).run_worker_async(concurrency={THREADS}), listen_notify on, "
            "one job per fetch",
        ),
    ]


def drain_one(
    bench: Bench,
    system: DrainSystem,
    batch: int | None,
    procs: int,
    jobs: int,
    scenario: str = "drain",
) -> dict[str, Any]:
    """Drain ``jobs`` runs on a fresh database; short drains are repeated (best of up to 3,
    while the drains so far took under 4 s in all) so a burst of load from elsewhere on the
    machine does not decide a figure. Every attempt's rate is kept in ``runs``."""
    rates: list[float] = []
    best: tuple[float, Any, str] | None = None
    spent = 0.0
    attempts = 1 if bench.profiler.enabled else 3  # profiles: one attempt, so counters match it
    while len(rates) < attempts and (not rates or spent < 4.0):
        dbname, dsn = bench.database(f"{scenario}_{system.name}_{batch}_{procs}")
        system.install(dsn)
        system.fill(dsn, jobs)
        bench.profiler.reset()
        t = run_drain(dsn, jobs, system.drain, system.target, procs, *system.args(batch or 0))
        spent += t.seconds
        rates.append(rate(jobs, t.seconds))
        if t.completed != jobs:
            best = (0.0, t, dbname)
            break
        if best is None or rates[-1] > best[0]:
            if best is not None:
                bench.done_with(best[2])
            best = (rates[-1], t, dbname)
        else:
            bench.done_with(dbname)
    assert best is not None
    _, t, dbname = best
    record = {
        "scenario": scenario,
        "system": system.name,
        "batch": batch,
        "procs": procs,
        "concurrency": driver_settings(batch or 0)[0] if system.name == "pgtick-driver" else THREADS,
        "jobs": jobs,
        "seconds": round(t.seconds, 3),
        "jobs_per_s": rate(jobs, t.seconds),
        "runs": rates,
        "completed": t.completed,
        "settings": system.settings,
    }
    if t.completed != jobs:
        record["error"] = f"{t.completed} of {jobs} completed"
    bench.emit(record, dbname)
    bench.done_with(dbname)
    return record


def scenario_drain(bench: Bench) -> None:
    """Every system's drains, the configurations a target compares back to back: for each
    process count and batch, each system in turn. A drain takes seconds and the machine's
    load drifts over minutes, so both sides of a ratio meet nearly the same load."""
    procs_list = (1,) if bench.quick else (1, 2)
    systems = [system for system in drain_systems() if bench.wants(system.name)]
    batches = sorted({batch for system in systems for batch in system.batches}, key=lambda b: b or 0)
    for procs in procs_list:
        for batch in batches:
            for system in systems:
                if batch not in system.batches:
                    continue
                divisor = system.jobs_divisor
                if system.name == "pgtick-driver" and batch == 1:
                    divisor = 4  # commit-latency bound (see docs/performance.md): fewer jobs, same rate
                log(f"drain {system.name} batch={batch} procs={procs}")
                drain_one(bench, system, batch, procs, bench.jobs // divisor)


# -- caps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapsCase:
    """One drain of the caps scenario: ``count`` groups of ``cap`` running each, capped
    definitions (``keys`` False) or the keys of a per-key kind limit (``keys`` True)."""

    name: str
    count: int = 0
    cap: int = 0
    keys: bool = False

    def prepare(self, dsn: str, jobs: int) -> None:
        defs = sys_pgtick.define_capped(dsn, self.count, self.cap) if self.count and not self.keys else None
        sys_pgtick.fill(dsn, jobs, defs)
        if self.keys:
            sys_pgtick.limit_per_key(dsn, self.count, self.cap)

    def sampler(self) -> Callable[[Any], int] | None:
        if not self.count:
            return None
        return sys_pgtick.running_per_key if self.keys else sys_pgtick.running_per_definition


def scenario_caps(bench: Bench) -> None:
    systems = {s.name: s for s in drain_systems()}
    spread = CapsCase("100-definitions-cap-2", 100, 2)
    # The same spread of runs over a per-key kind limit of 2 (100 tenant keys): a limit that
    # tight is locked exclusively, as a capped definition is, and takes the full claim steps.
    keyed = CapsCase("100-keys-limit-2", 100, 2, keys=True)
    cases = [CapsCase("uncapped"), spread, CapsCase("hot-key-cap-10", 1, 10), keyed]
    plan = [("pgtick-driver", 1, cases), ("pgtick-sql", 1, cases)]
    if not bench.quick:
        # Four processes: claims of capped runs from more processes than the claim slots
        # (sql/helpers.sql jobs._claim_slot) let in at once. The hot key is left out: it starts
        # about ten runs per commit however many processes claim.
        plan += [("pgtick-driver", 2, cases), ("pgtick-driver", 4, [cases[0], spread, keyed])]
    for system_name, procs, system_cases in plan:
        if not bench.wants(system_name):
            continue
        system = systems[system_name]
        for case in system_cases:
            log(f"caps {system_name} {case.name} procs={procs}")
            dbname, dsn = bench.database(f"caps_{system_name}_{case.name}_{procs}")
            system.install(dsn)
            case.prepare(dsn, bench.jobs)
            bench.profiler.reset()
            t = run_drain(
                dsn,
                bench.jobs,
                system.drain,
                system.target,
                procs,
                *system.args(10),
                sampler=case.sampler(),
            )
            record: dict[str, Any] = {
                "scenario": "caps",
                "case": case.name,
                "system": system_name,
                "batch": 10,
                "procs": procs,
                "concurrency": driver_settings(10)[0] if system_name == "pgtick-driver" else THREADS,
                "jobs": bench.jobs,
                "seconds": round(t.seconds, 3),
                "jobs_per_s": rate(bench.jobs, t.seconds),
                "completed": t.completed,
            }
            if case.count:
                worst = max(t.samples, default=0)
                record.update(
                    definitions=0 if case.keys else case.count,
                    keys=case.count if case.keys else 0,
                    cap=case.cap,
                    samples=len(t.samples),
                    max_running_per_group=worst,
                    cap_respected=worst <= case.cap,
                )
            if t.completed != bench.jobs:
                record["error"] = f"{t.completed} of {bench.jobs} completed"
            bench.emit(record, dbname)
            bench.done_with(dbname)


# -- latency -------------------------------------------------------------------------------


class _PsycopgEnqueuer:
    def __init__(self, dsn: str, enqueue_one: Callable[[Any, int], None]) -> None:
        self.conn = connect(dsn)
        self._one = enqueue_one

    def enqueue(self, i: int) -> None:
        self._one(self.conn, i)

    def close(self) -> None:
        self.conn.close()


def _enqueuer(system: str, dsn: str) -> Any:
    if system == "pgtick-driver":
        return _PsycopgEnqueuer(dsn, sys_pgtick.enqueue_one)
    if system == "bare-sql":
        return _PsycopgEnqueuer(dsn, sys_bare.enqueue_one)
    if system == "pgqueuer":
        return sys_peers.PgqueuerEnqueuer(dsn)
    if system == "procrastinate":
        return sys_peers.ProcrastinateEnqueuer(dsn)
    raise ValueError(system)


@worker_process
def open_loop_enqueuer(
    control: Control, index: int, dsn: str, system: str, per_s: float, seconds: float, procs: int
) -> None:
    """Enqueue at a fixed schedule (job i at t0 + i/rate), never waiting for the worker: this
    process sends every procs-th job from job ``index`` on, so procs processes (each one commit
    at a time) together keep a rate one process's commits could not."""
    enq = _enqueuer(system, dsn)
    report_ready(control, index)
    control.go.wait()
    n = int(per_s * seconds)
    slips: list[float] = []
    t0 = time.perf_counter()
    for i in range(index, n, procs):
        target = t0 + i / per_s
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        slips.append(time.perf_counter() - target)
        enq.enqueue(i)
    sent_seconds = time.perf_counter() - t0
    enq.close()
    control.out.put({"sent": len(slips), "seconds": sent_seconds, "slips": slips})


@dataclass(frozen=True)
class LatencySystem:
    name: str
    install: Callable[[str], None]
    drain: Drain
    target: Callable[..., None]
    args: tuple[Any, ...]
    db_latency_sql: str
    db_clock: str


def latency_systems() -> list[LatencySystem]:
    return [
        LatencySystem(
            "pgtick-driver",
            sys_pgtick.install,
            sys_pgtick.DRAIN,
            sys_pgtick.driver_worker,
            (10, THREADS, True, True),
            sys_pgtick.DB_LATENCY_SQL,
            "runs.started_at - runs.created_at",
        ),
        LatencySystem(
            "bare-sql",
            sys_bare.install,
            sys_bare.DRAIN,
            sys_bare.listen_worker,
            (10,),
            sys_bare.DB_LATENCY_SQL,
            "started_at - created_at (LISTEN/NOTIFY wake-up)",
        ),
        LatencySystem(
            "pgqueuer",
            sys_peers.pgqueuer_install,
            sys_peers.PGQUEUER_DRAIN,
            sys_peers.pgqueuer_worker,
            (10, None, True),
            sys_peers.PGQUEUER_DB_LATENCY_SQL,
            "pgqueuer_log picked.created - queued.created",
        ),
        LatencySystem(
            "procrastinate",
            sys_peers.procrastinate_install,
            sys_peers.PROCRASTINATE_DRAIN,
            sys_peers.procrastinate_worker,
            (THREADS, True),
            sys_peers.PROCRASTINATE_DB_LATENCY_SQL,
            "procrastinate_events started.at - deferred.at",
        ),
    ]


def scenario_latency(bench: Bench) -> None:
    """Enqueue→start latency at 100 and at 1,000 enqueues a second (the targets' two rates)."""
    for per_s in (100.0, 1000.0):
        _latency_at(bench, per_s)


def _latency_at(bench: Bench, per_s: float) -> None:
    seconds = 5.0 if bench.quick else 10.0
    for system in latency_systems():
        if not bench.wants(system.name):
            continue
        log(f"latency {system.name} {per_s:.0f}/s for {seconds:.0f}s")
        dbname, dsn = bench.database(f"latency_{system.name}")
        system.install(dsn)
        bench.profiler.reset()
        workers = spawn(system.target, 1, dsn, *system.args)
        workers.control.go.set()
        time.sleep(1.5)  # the worker is up, listening and idle before the first enqueue
        senders = max(1, round(per_s / 125))  # one durable commit at a time each
        enq = spawn(open_loop_enqueuer, senders, dsn, system.name, per_s, seconds, senders)
        enq.control.go.set()
        sent = enq.join(timeout=seconds * 3 + 30)
        sent_seconds = max((s["seconds"] for s in sent), default=None)
        with connect(dsn) as conn:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = conn.execute(system.drain.remaining_sql).fetchone()
                if row is not None and int(row[0]) == 0:
                    break
                time.sleep(0.05)
            workers.control.stop.set()
            results = workers.join()
            db = [float(r[0]) for r in conn.execute(system.db_latency_sql)]
        client = [start - t for r in results for (_, t, start) in r.get("starts", [])]
        record: dict[str, Any] = {
            "scenario": "latency",
            "system": system.name,
            "batch": None,
            "procs": 1,
            "jobs": len(db),
            "rate_per_s": per_s,
            "enqueuers": senders,
            "enqueued_per_s": round(sum(s["sent"] for s in sent) / sent_seconds, 1) if sent_seconds else None,
            "seconds": round(sent_seconds, 3) if sent_seconds else None,
            **percentiles(db),
            "db_clock": system.db_clock,
            "client": percentiles(client),
            "enqueue_slip": percentiles([x for s in sent for x in s["slips"]]) if sent else None,
        }
        expected = int(per_s * seconds)
        if len(db) != expected:
            record["error"] = f"{len(db)} of {expected} started"
        bench.emit(record, dbname)
        bench.done_with(dbname)


# -- growth --------------------------------------------------------------------------------

# Finished runs spread evenly over the ten days before the last hour: a day holds a tenth.
# They are loaded where the leader keeps them: the last day (jobs.config.archive_after) in
# jobs.runs, older ones in jobs.run_history's day partitions, ids in finishing order.
HISTORY_SQL = [
    """
SELECT jobs._history_partitions(array_agg(DISTINCT (s.t AT TIME ZONE 'UTC')::date))
  FROM (SELECT now() - interval '10 days' + g * ((interval '10 days' - interval '1 hour') / %(n)s) AS t
          FROM generate_series(1, %(n)s) AS g) AS s
 WHERE s.t < now() - interval '1 day'
""",
    """
INSERT INTO jobs.run_history (id, kind, origin, status, created_at, scheduled_for, started_at, finished_at,
                              worker, queue, attempt, payload, priority, cancel_requested, blocked)
SELECT s.g, %(kind)s, 'manual', 'COMPLETED', s.t, s.t, s.t, s.t + interval '10 ms', 'history', 'default',
       1, '{}', 0, false, false
  FROM (SELECT g, now() - interval '10 days' + g * ((interval '10 days' - interval '1 hour') / %(n)s) AS t
          FROM generate_series(1, %(n)s) AS g) AS s
 WHERE s.t < now() - interval '1 day'
""",
    "SELECT setval(pg_get_serial_sequence('jobs.runs', 'id'), %(n)s)",
    """
INSERT INTO jobs.runs (kind, origin, status, created_at, scheduled_for, started_at, finished_at, worker)
SELECT %(kind)s, 'manual', 'COMPLETED', t, t, t, t + interval '10 ms', 'history'
  FROM (SELECT now() - interval '10 days' + g * ((interval '10 days' - interval '1 hour') / %(n)s) AS t
          FROM generate_series(1, %(n)s) AS g) AS s
 WHERE t >= now() - interval '1 day'
""",
]

STALE_SQL = """
INSERT INTO jobs.runs (kind, origin, status, created_at, scheduled_for, started_at, heartbeat_at, worker)
SELECT %s, 'manual', 'RUNNING', now() - interval '2 hours', now() - interval '2 hours',
       now() - interval '2 hours', now() - interval '90 minutes', 'gone'
  FROM generate_series(1, %s)
"""


def _table_sizes(conn: Any) -> dict[str, int]:
    row = conn.execute(
        "SELECT pg_relation_size('jobs.runs'), pg_indexes_size('jobs.runs'),"
        " pg_total_relation_size('jobs.runs'),"
        " (SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits AS i"
        "   WHERE i.inhparent = 'jobs.run_history'::regclass)"
    ).fetchone()
    return {
        "heap_bytes": int(row[0]),
        "index_bytes": int(row[1]),
        "total_bytes": int(row[2]),
        "history_total_bytes": int(row[3]),
    }


def scenario_growth(bench: Bench) -> None:
    """Drains with an empty history and with ``history`` finished runs, side by side: both
    databases are prepared first, then each system drains them alternately (empty, full,
    full, empty), so the two sides meet the machine's load at nearly the same moments; each
    side keeps its best drain. Then reap, archive and retention on each database."""
    history = bench.history or (250_000 if bench.quick else 1_000_000)
    systems = {s.name: s for s in drain_systems()}
    prepared: dict[int, tuple[str, str, dict[str, Any]]] = {}
    for hist in (0, history):
        log(f"growth: a database with {hist} finished runs of history")
        dbname, dsn = bench.database(f"growth_{hist}")
        sys_pgtick.install(dsn)
        prep: dict[str, Any] = {"history": hist}
        if hist:
            with connect(dsn) as conn, timed() as took:
                for statement in HISTORY_SQL:
                    conn.execute(statement, {"kind": sys_pgtick.KIND, "n": hist})
                conn.execute("VACUUM ANALYZE jobs.runs")
                conn.execute("VACUUM ANALYZE jobs.run_history")
            prep["history_load_seconds"] = round(took(), 2)
            with connect(dsn) as conn:
                prep.update(_table_sizes(conn))
        prepared[hist] = (dbname, dsn, prep)
    with connect(prepared[0][1]) as conn:
        # The drains measure a server that holds the history, not one still writing out the
        # gigabyte just loaded.
        conn.execute("CHECKPOINT")
    for name in ("pgtick-driver", "pgtick-sql"):
        system = systems[name]
        rates: dict[int, list[float]] = {0: [], history: []}
        for hist in (0, history, history, 0):
            dbname, dsn, prep = prepared[hist]
            log(f"growth: {name} drains with {hist} finished runs of history")
            sys_pgtick.fill(dsn, bench.jobs)
            bench.profiler.reset()
            t = run_drain(dsn, bench.jobs, system.drain, system.target, 1, *system.args(10))
            rates[hist].append(rate(bench.jobs, t.seconds))
        for hist, (dbname, _, prep) in prepared.items():
            bench.emit(
                {
                    "scenario": "growth-drain",
                    "system": name,
                    "batch": 10,
                    "procs": 1,
                    "jobs": bench.jobs,
                    "jobs_per_s": max(rates[hist]),
                    "drains_jobs_per_s": rates[hist],
                    **prep,
                },
                dbname,
            )
    for hist, (dbname, dsn, _) in prepared.items():
        _reap(bench, dsn, dbname, hist)
        _archive(bench, dsn, dbname, hist)
        if hist:
            _retention(bench, dsn, dbname, hist)
        bench.done_with(dbname)
    _materialize(bench)


def _until_short(conn: Any, call: str, batch: int = 10_000) -> tuple[int, float]:
    """Call ``call`` (a SELECT of one count) until it returns less than ``batch``, as the
    leader does; returns the total and the seconds it took."""
    total = 0
    with timed() as took:
        while True:
            row = conn.execute(call).fetchone()
            assert row is not None
            total += int(row[0])
            if int(row[0]) < batch:
                break
    return total, took()


def _archive(bench: Bench, dsn: str, dbname: str, hist: int) -> None:
    """The leader's move of finished runs to history: the runs the drains finished, aged past
    archive_after, moved by jobs.archive in its default batches of 10,000 until a short one."""
    with connect(dsn) as conn:
        conn.execute(
            "UPDATE jobs.runs SET finished_at = finished_at - interval '2 days'"
            " WHERE finished_at > now() - interval '1 hour'"
        )
        moved, seconds = _until_short(conn, "SELECT jobs.archive()")
    bench.emit(
        {
            "scenario": "archive",
            "system": "pgtick-sql",
            "batch": 10_000,
            "procs": 1,
            "jobs": moved,
            "history": hist,
            "seconds": round(seconds, 3),
            "jobs_per_s": rate(moved, seconds),
        },
        dbname,
    )


def _retention(bench: Bench, dsn: str, dbname: str, hist: int) -> None:
    """Retention of the oldest days of history (its first, partial UTC day and the next whole
    one): jobs.prune in its default batches of 10,000, called until a short batch, as the
    leader does. Whole days of history are dropped, the rest deleted row by row."""
    log(f"growth: prune the oldest days of {hist} history rows")
    with connect(dsn) as conn:
        deleted, seconds = _until_short(conn, "SELECT jobs.prune(interval '8 days')")
    bench.emit(
        {
            "scenario": "retention",
            "system": "pgtick-sql",
            "batch": 10_000,
            "procs": 1,
            "jobs": deleted,
            "history": hist,
            "seconds": round(seconds, 3),
        },
        dbname,
    )


def _reap(bench: Bench, dsn: str, dbname: str, hist: int) -> None:
    stale = 10_000
    log(f"growth: reap {stale} stale RUNNING runs ({hist} history rows)")
    with connect(dsn) as conn:
        conn.execute("SELECT jobs.set_retry_policy(%s, max_attempts => 3)", (sys_pgtick.KIND,))
        conn.execute(STALE_SQL, (sys_pgtick.KIND, stale))
        conn.execute("ANALYZE jobs.runs")
        bench.profiler.reset()
        with timed() as took:
            row = conn.execute("SELECT count(*), count(retry_run_id) FROM jobs.reap()").fetchone()
        seconds = took()
    assert row is not None
    bench.emit(
        {
            "scenario": "reap",
            "system": "pgtick-sql",
            "batch": None,
            "procs": 1,
            "jobs": stale,
            "history": hist,
            "seconds": round(seconds, 3),
            "reaped": int(row[0]),
            "retries_queued": int(row[1]),
        },
        dbname,
    )


def _materialize(bench: Bench) -> None:
    from pgtick.scheduler import Scheduler

    count = 10_000
    log(f"growth: materialize {count} due definitions")
    dbname, dsn = bench.database("materialize")
    sys_pgtick.install(dsn)
    with connect(dsn) as conn:
        with timed() as took:
            conn.execute(
                "SELECT count(jobs.define(name => 'every-minute-' || g, kind => %s, schedule => '* * * * *'))"
                "  FROM generate_series(1, %s) AS g",
                (sys_pgtick.KIND, count),
            )
        define_seconds = took()
        conn.execute("ANALYZE jobs.definitions")
        now: datetime = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    minute = now.replace(second=0, microsecond=0)
    clock = {"now": minute + timedelta(seconds=30)}  # first cursor: the next minute, not due yet
    scheduler = Scheduler(dsn, owner="bench", clock=lambda: clock["now"])
    try:
        bench.profiler.reset()
        init_calls = 0
        initialized = 0
        with timed() as took:
            while True:
                report = scheduler.materialize_due()
                init_calls += 1
                initialized += report.initialized
                if report.initialized == 0 or init_calls > 100:
                    break
        init_seconds = took()
        clock["now"] = minute + timedelta(seconds=61)  # every cursor is now due, once
        with timed() as took:
            report = scheduler.materialize_due()
        mat_seconds = took()
        created = report.runs_created
    finally:
        scheduler.close()
    bench.emit(
        {
            "scenario": "materialize",
            "system": "pgtick-driver",
            "batch": None,
            "procs": 1,
            "jobs": count,
            "seconds": round(mat_seconds, 3),
            "runs_created": created,
            "define_seconds": round(define_seconds, 3),
            "cursor_init_seconds": round(init_seconds, 3),
            "cursor_init_calls": init_calls,
            "cursors_initialized": initialized,
        },
        dbname,
    )
    bench.done_with(dbname)


# -- heartbeats, HOT updates and fillfactor -----------------------------------------------

TABLE_STATS_SQL = """
SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_newpage_upd, n_dead_tup, autovacuum_count,
       pg_relation_size('jobs.runs'), pg_indexes_size('jobs.runs')
  FROM pg_stat_user_tables WHERE relid = 'jobs.runs'::regclass
"""
TABLE_STATS_KEYS = (
    "n_tup_ins",
    "n_tup_upd",
    "n_tup_hot_upd",
    "n_tup_newpage_upd",
    "n_dead_tup",
    "autovacuum_count",
    "heap_bytes",
    "index_bytes",
)


def _table_stats(dsn: str) -> dict[str, int]:
    time.sleep(0.7)  # let exited backends flush their table counters
    with connect(dsn) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(TABLE_STATS_SQL).fetchone()
    assert row is not None
    return dict(zip(TABLE_STATS_KEYS, (int(v) for v in row), strict=True))


# The heartbeats scenario's runs: jobs that sleep, so that a beat finds runs held (a no-op job
# executes for microseconds and no beat ever finds it), and beats often enough that a drain of
# a few seconds writes about one heartbeat per run.
HEARTBEAT_JOB_SECONDS = 0.05
HEARTBEAT_INTERVAL = 0.05
HEARTBEAT_CONCURRENCY = 100


def scenario_heartbeats(bench: Bench) -> None:
    """Drains with the driver (batch 10, jobs of 50 ms, 100 at once, a beat every 50 ms):
    fillfactor 80 vs 100 with heartbeats, and 80 without."""
    jobs = bench.jobs // 2
    for fillfactor, heartbeats in ((80, True), (100, True), (80, False)):
        log(f"heartbeats: fillfactor={fillfactor} heartbeats={'on' if heartbeats else 'off'}")
        dbname, dsn = bench.database(f"hot_ff{fillfactor}_{'hb' if heartbeats else 'nohb'}")
        sys_pgtick.install(dsn)
        with connect(dsn) as conn:
            conn.execute(f"ALTER TABLE jobs.runs SET (fillfactor = {fillfactor})")
        sys_pgtick.fill(dsn, jobs)
        before = _table_stats(dsn)
        bench.profiler.reset()
        t = run_drain(
            dsn,
            jobs,
            sys_pgtick.DRAIN,
            sys_pgtick.driver_worker,
            1,
            10,
            HEARTBEAT_CONCURRENCY,
            heartbeats,
            False,
            10,  # claimers: enough claims in flight to keep the hundred slots full
            HEARTBEAT_JOB_SECONDS,
            HEARTBEAT_INTERVAL,
        )
        after = _table_stats(dsn)
        upd = after["n_tup_upd"] - before["n_tup_upd"]
        hot = after["n_tup_hot_upd"] - before["n_tup_hot_upd"]
        bench.emit(
            {
                "scenario": "heartbeats",
                "system": "pgtick-driver",
                "batch": 10,
                "procs": 1,
                "jobs": jobs,
                "concurrency": HEARTBEAT_CONCURRENCY,
                "job_ms": HEARTBEAT_JOB_SECONDS * 1000,
                "heartbeat_interval_s": HEARTBEAT_INTERVAL,
                "fillfactor": fillfactor,
                "heartbeats": heartbeats,
                "seconds": round(t.seconds, 3),
                "jobs_per_s": rate(jobs, t.seconds),
                "updates": upd,
                "hot_updates": hot,
                "hot_ratio": round(hot / upd, 3) if upd else None,
                "newpage_updates": after["n_tup_newpage_upd"] - before["n_tup_newpage_upd"],
                "heartbeat_row_updates": upd - 2 * jobs,
                "autovacuums": after["autovacuum_count"] - before["autovacuum_count"],
                "heap_bytes_before": before["heap_bytes"],
                "heap_bytes_after": after["heap_bytes"],
                "index_bytes_before": before["index_bytes"],
                "index_bytes_after": after["index_bytes"],
                "dead_tuples_after": after["n_dead_tup"],
            },
            dbname,
        )
        bench.done_with(dbname)


# -- limits ----------------------------------------------------------------------------------


def scenario_limits(bench: Bench) -> None:
    """The claim under flow control, as ratios within one run (pgtick-sql, batch 10, 1 process):
    a drain with three limits active on the pool (a queue, a kind, and a per-tenant kind
    limit) against the same drain with none; and the uncapped claim against the claim of the
    baseline commit (PGTICK_BENCH_BASELINE, default the merge base with main: on main itself
    that is the measured code, and the ratio shows only how far two drains of one claim
    differ). Cases alternate, three rounds, best of each, so load from elsewhere on the
    machine hits all of them alike."""
    rev = (
        os.environ.get("PGTICK_BENCH_BASELINE")
        or subprocess.run(
            ["git", "-C", str(sys_limits.ROOT), "merge-base", "HEAD", "main"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    baseline = sys_limits.baseline_root(rev)
    # The same SQL on both sides (the baseline against this working tree): the ratio is the
    # noise of two drains, not a comparison.
    same_code = not subprocess.run(
        ["git", "-C", str(sys_limits.ROOT), "diff", "--quiet", rev, "--", "sql", "migrations"],
        check=False,
    ).returncode
    system = next(s for s in drain_systems() if s.name == "pgtick-sql")
    jobs = bench.jobs // 2

    def no_limits(dsn: str) -> None:
        system.install(dsn)
        sys_limits.fill_two_kinds(dsn, jobs)

    def three_limits(dsn: str) -> None:
        no_limits(dsn)
        sys_limits.set_three_limits(dsn)

    def uncapped(dsn: str) -> None:
        system.install(dsn)
        sys_pgtick.fill(dsn, jobs)

    def uncapped_baseline(dsn: str) -> None:
        sys_limits.install_from(baseline, dsn)
        sys_pgtick.fill(dsn, jobs)

    cases: list[tuple[str, Callable[[str], None]]] = [
        ("no-limits", no_limits),
        ("three-limits", three_limits),
        ("uncapped", uncapped),
        ("uncapped-baseline", uncapped_baseline),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _ in cases}
    for round_ in range(1 if bench.quick else 3):
        for name, prepare in cases:
            log(f"limits {name} round {round_ + 1}")
            dbname, dsn = bench.database(f"limits_{name}")
            prepare(dsn)
            # Sessions warmed up first (sys_pgtick.sql_worker): a quick drain is about 25 claims
            # per connection, and a session's first claim plans every statement it reaches.
            t = run_drain(dsn, jobs, system.drain, system.target, 1, *system.args(10), True)
            if t.completed != jobs:
                raise RuntimeError(f"limits {name}: {t.completed} of {jobs} completed")
            rates[name].append(rate(jobs, t.seconds))
            bench.done_with(dbname)
    best = {name: max(r) for name, r in rates.items()}
    for name, _ in cases:
        bench.emit(
            {
                "scenario": "limits",
                "system": "pgtick-sql",
                "case": name,
                "batch": 10,
                "procs": 1,
                "concurrency": THREADS,
                "jobs": jobs,
                "jobs_per_s": best[name],
                "runs": rates[name],
                "baseline": rev[:12] if name == "uncapped-baseline" else None,
                "baseline_same_sql": same_code if name == "uncapped-baseline" else None,
            }
        )
    bench.emit(
        {
            "scenario": "limits",
            "case": "ratios",
            "three_limits_vs_none": round(best["three-limits"] / best["no-limits"], 3),
            "uncapped_vs_baseline": round(best["uncapped"] / best["uncapped-baseline"], 3),
        }
    )


# -- workers: async, process isolation, --processes ---------------------------------------


def _mode_system(mode: str) -> DrainSystem:
    return DrainSystem(
        f"pgtick-driver-{mode}",
        sys_pgtick.install,
        sys_pgtick.fill,
        sys_pgtick.DRAIN,
        sys_pgtick.mode_worker,
        lambda b: (b, THREADS, mode),
        (10,),
        settings=f"Worker(concurrency={THREADS}, batch_size=10); the no-op kind runs as: {mode}",
    )


def scenario_workers(bench: Bench) -> None:
    """No-op drains with one worker process, the kind run in a thread, as an ``async def``
    job on the worker's loop, and with ``isolation="process"`` (pooled, and one spawned
    process per job); then the per-job cost of isolation without the database.

    Thread and async drains alternate, several rounds, and each keeps its best: on a
    shared machine the load moves more between two drains than the modes differ."""
    jobs = bench.jobs
    rounds = 3 if bench.quick else 5
    rates: dict[str, list[float]] = {"thread": [], "async": []}
    best: dict[str, tuple[float, Any]] = {}
    for r in range(rounds):
        for mode in ("thread", "async") if r % 2 == 0 else ("async", "thread"):
            log(f"workers: drain with {mode} jobs, round {r + 1} of {rounds}")
            system = _mode_system(mode)
            dbname, dsn = bench.database(f"workers_{mode}_{r}")
            system.install(dsn)
            system.fill(dsn, jobs)
            t = run_drain(dsn, jobs, system.drain, system.target, 1, *system.args(10))
            bench.done_with(dbname)
            rates[mode].append(rate(jobs, t.seconds) if t.completed == jobs else 0.0)
            if mode not in best or rates[mode][-1] > best[mode][0]:
                best[mode] = (rates[mode][-1], t)
    for mode, (jobs_per_s, t) in best.items():
        record = {
            "scenario": "workers",
            "system": f"pgtick-driver-{mode}",
            "batch": 10,
            "procs": 1,
            "concurrency": THREADS,
            "jobs": jobs,
            "seconds": round(t.seconds, 3),
            "jobs_per_s": jobs_per_s,
            "runs": rates[mode],
            "completed": t.completed,
            "settings": _mode_system(mode).settings + f"; best of {rounds} alternating rounds",
        }
        if t.completed != jobs:
            record["error"] = f"{t.completed} of {jobs} completed"
        bench.emit(record)
    # A spawn per job costs the same for every job (a fresh interpreter each time, no backlog
    # to walk): fifty of them give its rate in a few seconds rather than half a minute.
    sizes = {"process": jobs // 5, "process-fresh": max(50, jobs // 400)}
    for mode, count in sizes.items():
        log(f"workers: drain with {mode} jobs")
        drain_one(bench, _mode_system(mode), 10, 1, count, scenario="workers")
    _isolation_cost(bench)


def _isolation_cost(bench: Bench) -> None:
    """Sequential executions of the no-op in this process: ``execute`` in a thread, and
    through the process pool (reused child; fresh child per job). Milliseconds per job."""
    from pgtick import isolation
    from pgtick.app import App, Context
    from pgtick.execution import execute

    app = App("bench")
    app.job(sys_pgtick.KIND)(sys_pgtick.noop_job)
    app.job("isolated", isolation="process")(sys_pgtick.noop_job)
    run = {"id": 1, "attempt": 1, "payload": {}, "scheduled_for": None, "definition_id": None}

    def per_job(kind: str, count: int) -> float:
        spec = app.jobs[kind]
        started = time.perf_counter()
        for i in range(count):
            outcome = execute(Context({**run, "id": i, "kind": kind}, spec, "bench", None))
            assert outcome.action == "complete", outcome
        return round((time.perf_counter() - started) / count * 1000, 3)

    counts = {"thread": 20000, "process": 2000, "process-fresh": 20 if bench.quick else 50}
    figures = {"thread": per_job(sys_pgtick.KIND, counts["thread"])}
    isolation.POOL.reuse = True
    per_job("isolated", 5)  # the pool's first child starts outside the measurement
    figures["process"] = per_job("isolated", counts["process"])
    isolation.POOL.reuse = False
    figures["process-fresh"] = per_job("isolated", counts["process-fresh"])
    isolation.POOL.reuse = True
    isolation.close_idle_processes()
    bench.emit(
        {
            "scenario": "isolation-cost",
            "ms_per_job": figures,
            "jobs": counts,
            "settings": "one job at a time in the bench process, no database: pgtick.execution.execute "
            "in the calling thread vs isolation='process' (pooled child; a spawned child per job)",
        }
    )


def scenario_processes(bench: Bench) -> None:
    """``pgtick run --processes N`` (N = 1, 2) drains the same queue: no-op jobs, and jobs
    that burn 2 ms of Python CPU each (the database is then not the bottleneck)."""
    import signal
    import subprocess
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    app = root / "bench" / "apps" / "cpu_app.py"
    for cpu_ms, divisor in ((0, 1), (2, 4)):
        jobs = bench.jobs // divisor
        for procs in (1, 2):
            dbname, dsn = bench.database(f"processes_{cpu_ms}_{procs}")
            sys_pgtick.install(dsn)
            env = dict(os.environ, PGTICK_BENCH_CPU_MS=str(cpu_ms), PGTICK_LOG="INFO")
            env["PYTHONPATH"] = os.pathsep.join([str(root / "driver"), env.get("PYTHONPATH", "")])
            command = [sys.executable, "-m", "pgtick.cli", "run", str(app), "--dsn", dsn]
            command += ["--processes", str(procs), "--concurrency", str(THREADS), "--poll", "0.1s"]
            with tempfile.TemporaryFile() as err:
                proc = subprocess.Popen(command, stderr=err, stdout=subprocess.DEVNULL, env=env)
                try:
                    deadline = time.monotonic() + 60
                    while True:
                        err.seek(0)
                        text = err.read().decode(errors="replace")
                        if text.count(" started kinds=") >= procs:
                            break
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"pgtick run did not start its workers:\n{text[-3000:]}")
                        time.sleep(0.1)
                    sys_pgtick.fill(dsn, jobs)
                    with connect(dsn) as conn:
                        t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                        while conn.execute(sys_pgtick.DRAIN.remaining_sql).fetchone()[0] > 0:
                            time.sleep(0.05)
                        last = conn.execute(sys_pgtick.DRAIN.last_finished_sql).fetchone()[0]
                        done = conn.execute(sys_pgtick.DRAIN.done_sql).fetchone()[0]
                finally:
                    proc.send_signal(signal.SIGTERM)  # our own child, by its handle
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            seconds = (last - t0).total_seconds()
            log(f"processes: cpu {cpu_ms} ms, {procs} processes: {rate(jobs, seconds)} jobs/s")
            bench.emit(
                {
                    "scenario": "processes",
                    "system": "pgtick-run",
                    "procs": procs,
                    "cpu_ms": cpu_ms,
                    "concurrency": THREADS,
                    "jobs": jobs,
                    "completed": int(done),
                    "seconds": round(seconds, 3),
                    "jobs_per_s": rate(jobs, seconds),
                    "settings": f"pgtick run --processes {procs} --concurrency {THREADS}; "
                    f"each job burns {cpu_ms} ms of CPU",
                },
                dbname,
            )
            bench.done_with(dbname)


def scenario_scaling(bench: Bench) -> None:
    """Drains with 1, 2 and 4 worker processes: pgtick-sql at batch 10 (10 connections per
    process) and the driver at batch 10 and 100 (one Worker per process)."""
    systems = {s.name: s for s in drain_systems()}
    for procs in (1, 2, 4):
        for name, batch in (("pgtick-sql", 10), ("pgtick-driver", 10), ("pgtick-driver", 100)):
            if bench.wants(name):
                log(f"scaling {name} batch={batch} procs={procs}")
                drain_one(bench, systems[name], batch, procs, bench.jobs, scenario="scaling")


# -- dependencies -------------------------------------------------------------------------


def scenario_dependencies(bench: Bench) -> None:
    """Completing the runs a fan-in waits on (one run depending on all of them), one
    jobs.complete each, against completing as many runs nothing waits on: the ratio is what a
    waiting run costs each completion (it is released by the last)."""
    count = 500 if bench.quick else 1000  # depends_on holds up to 1000 runs
    for case in ("none", "fan-in"):
        log(f"dependencies {case} {count}")
        dbname, dsn = bench.database(f"deps_{case}")
        sys_pgtick.install(dsn)
        with connect(dsn) as conn:
            enqueue = (
                "SELECT (jobs.enqueue('k', run_at => now() - interval '1 s')).id FROM generate_series(1, %s)"
            )
            ids = [r[0] for r in conn.execute(enqueue, (count,))]
            if case == "fan-in":
                conn.execute("SELECT jobs.enqueue('join', depends_on => %s)", (ids,))
            while conn.execute("SELECT count(*) FROM jobs.claim(1000, 'w', '{k}')").fetchone() != (0,):
                pass
            started = time.perf_counter()
            for run_id in ids:
                conn.execute("SELECT jobs.complete(%s, 'w')", (run_id,))
            seconds = time.perf_counter() - started
            waiting = conn.execute("SELECT count(*) FROM jobs.runs WHERE blocked").fetchone()
        bench.emit(
            {
                "scenario": "dependencies",
                "case": case,
                "completions": count,
                "seconds": round(seconds, 3),
                "ms_per_completion": round(seconds / count * 1000, 3),
                "still_blocked": waiting[0] if waiting else None,
            },
            dbname,
        )
        bench.done_with(dbname)


SCENARIOS: dict[str, Callable[[Bench], None]] = {
    "drain": scenario_drain,
    "caps": scenario_caps,
    "latency": scenario_latency,
    "growth": scenario_growth,
    "heartbeats": scenario_heartbeats,
    "limits": scenario_limits,
    "workers": scenario_workers,
    "processes": scenario_processes,
    "scaling": scenario_scaling,
    "dependencies": scenario_dependencies,
}
