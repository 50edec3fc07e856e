"""The benchmark harness: one PostgreSQL, a fresh database per system and scenario,
worker processes that start on a common signal, and drains timed on the database clock.

Every system is driven the same way:

1. a fresh database gets the system's schema and its queue is filled set-based;
2. the worker processes are spawned, set themselves up (connections, app objects,
   imports), report ready and block on the ``go`` event;
3. the parent reads ``clock_timestamp()`` from the server, sets ``go``, and polls a cheap
   count of unfinished jobs until it is zero;
4. the drain time is the last completion timestamp the system itself wrote (database
   clock) minus the ``clock_timestamp()`` read just before ``go``, so the polling interval
   does not blur short drains; the poll only decides when to stop the workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SPAWN = mp.get_context("spawn")

#: Server settings reported with the results (and checked: synchronous_commit must be on).
REPORTED_SETTINGS = (
    "server_version",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
    "work_mem",
    "wal_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "commit_delay",
    "autovacuum",
    "autovacuum_naptime",
    "track_functions",
    "shared_preload_libraries",
)


class Server:
    """The one PostgreSQL every scenario runs on: embedded and throwaway, or given by DSN."""

    def __init__(self, dsn: str | None = None) -> None:
        self._embedded: Any = None
        if dsn is None:
            from pgtick.embedded import EmbeddedPostgres

            # Not fast mode: synchronous_commit and fsync stay on (durable commits).
            self._embedded = EmbeddedPostgres(ephemeral=True)
            dsn = self._embedded.start()
        self.admin_dsn = dsn
        settings = self.settings()
        if settings["synchronous_commit"] != "on":
            raise SystemExit(f"synchronous_commit is {settings['synchronous_commit']}: benchmarks need it on")

    def stop(self) -> None:
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_dsn, autocommit=True)

    def settings(self) -> dict[str, str]:
        with self.admin() as conn:
            return {
                name: str(conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()[0])  # type: ignore[index]
                for name in REPORTED_SETTINGS
            }

    def has_extension(self, name: str) -> bool:
        with self.admin() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_available_extensions WHERE name = %s", (name,)
            ).fetchone()
            return bool(row and row[0])

    def fresh_database(self, name: str) -> str:
        """Drop and create database ``name``; returns its DSN."""
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def dsn(self, name: str) -> str:
        return make_conninfo(self.admin_dsn, dbname=name)


def asyncpg_params(dsn: str) -> dict[str, Any]:
    """Keyword arguments for ``asyncpg.connect`` from a libpq DSN (socket dir or host)."""
    info = conninfo_to_dict(dsn)
    params: dict[str, Any] = {"database": info.get("dbname"), "user": info.get("user") or "postgres"}
    if info.get("host"):
        params["host"] = info["host"]
    if info.get("port"):
        params["port"] = int(str(info["port"]))
    if info.get("password"):
        params["password"] = info["password"]
    return params


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


# -- worker processes --------------------------------------------------------------------


@dataclass
class Control:
    """What a worker process shares with the parent."""

    ready: Any  # mp.Queue: one item per process when set up
    go: Any  # mp.Event: start working
    stop: Any  # mp.Event: stop working (drain done, or latency window over)
    out: Any  # mp.Queue: one result dict per process when it ends


@dataclass
class Workers:
    """Spawned worker processes, started together."""

    procs: list[Any]
    control: Control
    results: list[dict[str, Any]] = field(default_factory=list)

    def join(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        want = len(self.procs)
        while len(self.results) < want and time.monotonic() < deadline:
            try:
                self.results.append(self.control.out.get(timeout=0.2))
            except Exception:
                if not any(p.is_alive() for p in self.procs) and self.control.out.empty():
                    break
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()  # our own child, by its handle
                p.join(5)
        return self.results


def spawn(target: Callable[..., None], count: int, *args: Any, ready_timeout: float = 60.0) -> Workers:
    """Start ``count`` processes running ``target(control, index, *args)``; wait until ready."""
    control = Control(SPAWN.Queue(), SPAWN.Event(), SPAWN.Event(), SPAWN.Queue())
    procs = [SPAWN.Process(target=target, args=(control, i, *args), daemon=True) for i in range(count)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + ready_timeout
    for _ in procs:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError("worker processes did not get ready in time")
        item = control.ready.get(timeout=left)
        if isinstance(item, dict) and item.get("error"):
            raise RuntimeError(f"worker process failed to start: {item['error']}")
    return Workers(procs, control)


def report_ready(control: Control, index: int) -> None:
    control.ready.put({"index": index, "pid": os.getpid()})


def claim_loops(
    control: Control,
    index: int,
    dsn: str,
    threads: int,
    step: Callable[[int, psycopg.Connection[Any]], int],
    warm: Callable[[int, psycopg.Connection[Any]], None] | None = None,
) -> None:
    """The body of a SQL-only drain worker: ``threads`` threads, each with its own autocommit
    connection, call ``step(thread, conn)`` (claim a batch and complete it; returns how many)
    until told to stop, pausing 2 ms when it found nothing; reports the total completed.
    ``warm(thread, conn)``, if given, runs on each connection before the start signal."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(threads)]
    counts = [0] * threads
    if warm is not None:
        for i, c in enumerate(conns):
            warm(i, c)

    def loop(i: int, conn: psycopg.Connection[Any]) -> None:
        while not control.stop.is_set():
            done = step(i, conn)
            if not done:
                time.sleep(0.002)
            counts[i] += done

    report_ready(control, index)
    control.go.wait()
    ts = [threading.Thread(target=loop, args=(i, c), daemon=True) for i, c in enumerate(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for c in conns:
        c.close()
    control.out.put({"index": index, "completed": sum(counts)})


# -- drains ------------------------------------------------------------------------------


@dataclass
class Drain:
    """How one system tells the harness that its queue is empty, and when it emptied."""

    remaining_sql: str  # count of jobs not yet finished
    last_finished_sql: str  # max completion timestamp the system wrote (database clock)
    done_sql: str  # count of jobs that finished successfully


@dataclass
class DrainTiming:
    jobs: int
    seconds: float
    wall_seconds: float
    completed: int
    samples: list[Any] = field(default_factory=list)
    worker_results: list[dict[str, Any]] = field(default_factory=list)


def run_drain(
    dsn: str,
    jobs: int,
    drain: Drain,
    target: Callable[..., None],
    procs: int,
    *args: Any,
    poll: float = 0.05,
    timeout: float = 300.0,
    sampler: Callable[[psycopg.Connection[Any]], Any] | None = None,
    sample_every: float = 0.01,
) -> DrainTiming:
    """Spawn the workers, start them together, wait until the queue is empty, stop them."""
    workers = spawn(target, procs, dsn, *args)
    samples: list[Any] = []
    with connect(dsn) as conn, connect(dsn) if sampler else contextlib.nullcontext() as sconn:
        t0_db = db_now(conn)
        t0 = time.perf_counter()
        workers.control.go.set()
        next_poll = 0.0
        while True:
            now = time.perf_counter()
            if now - t0 > timeout:
                workers.control.stop.set()
                workers.join(10)
                raise RuntimeError(f"drain did not finish within {timeout:.0f}s")
            if sampler is not None and sconn is not None:
                samples.append(sampler(sconn))
            if now >= next_poll:
                row = conn.execute(drain.remaining_sql).fetchone()
                if row is not None and int(row[0]) == 0:
                    break
                next_poll = now + poll
            time.sleep(sample_every if sampler is not None else poll)
        wall = time.perf_counter() - t0
        workers.control.stop.set()
        results = workers.join()
        last = conn.execute(drain.last_finished_sql).fetchone()
        done = conn.execute(drain.done_sql).fetchone()
    assert last is not None and done is not None
    seconds = (last[0] - t0_db).total_seconds() if last[0] is not None else wall
    return DrainTiming(jobs, seconds, wall, int(done[0]), samples, results)


# -- numbers -----------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 and max, in milliseconds (values are seconds)."""
    if not values:
        return {}
    ordered = sorted(values)
    qs = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 99

    def ms(v: float) -> float:
        return round(v * 1000, 2)

    return {"p50_ms": ms(qs[49]), "p95_ms": ms(qs[94]), "p99_ms": ms(qs[98]), "max_ms": ms(ordered[-1])}


def rate(jobs: int, seconds: float) -> float:
    return round(jobs / seconds, 1) if seconds > 0 else 0.0


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    start = time.perf_counter()
    end: list[float] = []
    try:
        yield lambda: (end[0] if end else time.perf_counter()) - start
    finally:
        end.append(time.perf_counter())


def worker_process(fn: Callable[..., None]) -> Callable[..., None]:
    """Decorate a worker-process body: a failure reaches the parent instead of a hang."""
    import functools
    import traceback

    @functools.wraps(fn)
    def wrapper(control: Control, index: int, *args: Any) -> None:
        try:
            fn(control, index, *args)
        except BaseException as exc:
            text = "".join(traceback.format_exception(exc))
            control.ready.put({"index": index, "error": text})
            control.out.put({"index": index, "error": text})
            raise

    return wrapper


# -- profiling (--profile) ---------------------------------------------------------------


class Profiler:
    """Per-scenario server-side profile: pg_stat_user_functions (track_functions = all) and,
    when the server preloads it, pg_stat_statements with nested statements tracked (so the
    statements inside jobs.claim show up one by one)."""

    def __init__(self, server: Server, enabled: bool) -> None:
        self.server = server
        self.enabled = enabled
        self.statements = False
        if not enabled:
            return
        with server.admin() as conn:
            conn.execute("ALTER SYSTEM SET track_functions = 'all'")
            conn.execute("SELECT pg_reload_conf()")
            libs = conn.execute("SHOW shared_preload_libraries").fetchone()
            if libs and "pg_stat_statements" in str(libs[0]):
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                self.statements = True

    def reset(self) -> None:
        if self.enabled and self.statements:
            with self.server.admin() as conn:
                conn.execute("SELECT pg_stat_statements_reset()")

    def collect(self, dbname: str, top: int = 12) -> dict[str, Any]:
        if not self.enabled:
            return {}
        time.sleep(0.5)  # exited backends flush their counters on the way out
        out: dict[str, Any] = {}
        with connect(self.server.dsn(dbname)) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            out["functions"] = [
                {"function": r[0], "calls": r[1], "total_ms": round(r[2], 1), "self_ms": round(r[3], 1)}
                for r in conn.execute(
                    "SELECT schemaname || '.' || funcname, calls, total_time, self_time"
                    "  FROM pg_stat_user_functions ORDER BY total_time DESC LIMIT %s",
                    (top,),
                )
            ]
        if self.statements:
            with self.server.admin() as conn:
                out["statements"] = [
                    {
                        "query": " ".join(str(r[0]).split())[:220],
                        "calls": r[1],
                        "total_ms": round(r[2], 1),
                        "mean_ms": round(r[3], 3),
                        "rows": r[4],
                        "toplevel": r[5],
                    }
                    for r in conn.execute(
                        "SELECT query, calls, total_exec_time, mean_exec_time, rows, toplevel"
                        "  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                        " WHERE d.datname = %s ORDER BY total_exec_time DESC LIMIT %s",
                        (dbname, top),
                    )
                ]
        return out
