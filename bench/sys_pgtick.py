"""pgtick under benchmark: the Python driver (``pgtick.worker.Worker``) and the SQL API alone
(a psycopg loop over ``jobs.claim`` and ``jobs.complete``/``jobs.complete_many``)."""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from psycopg.sql import SQL, Identifier
from psycopg.types.json import Jsonb

from bench.harness import Control, Drain, claim_loops, connect, report_ready, worker_process

KIND = "noop"

DRAIN = Drain(
    remaining_sql=(
        "SELECT (SELECT count(*) FROM jobs.runs WHERE status = 'QUEUED')"
        " + (SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING')"
    ),
    last_finished_sql=(
        "SELECT max(finished_at) FROM jobs.runs WHERE status = 'COMPLETED' AND worker <> 'history'"
    ),
    done_sql="SELECT count(*) FROM jobs.runs WHERE status = 'COMPLETED' AND worker <> 'history'",
)


def install(dsn: str) -> None:
    """Migrate a fresh database with pgtick's own migrator."""
    from pgtick.migrate import apply

    with connect(dsn) as conn:
        apply(conn)


def fill(dsn: str, jobs: int, definition_ids: list[int] | None = None, seed: float = 0.42) -> None:
    """Queue ``jobs`` no-op runs set-based; with ``definition_ids``, each run belongs to one of
    them, drawn at random (fixed seed), as if many schedules had materialized interleaved."""
    with connect(dsn) as conn:
        if definition_ids:
            conn.execute("SELECT setseed(%s)", (seed,))
            conn.execute(
                """
                INSERT INTO jobs.runs (kind, origin, definition_id)
                SELECT %s, 'manual', (%s::bigint[])[1 + floor(random() * %s)::int]
                  FROM generate_series(1, %s)
                """,
                (KIND, definition_ids, len(definition_ids), jobs),
            )
        else:
            conn.execute(
                "INSERT INTO jobs.runs (kind, origin) SELECT %s, 'manual' FROM generate_series(1, %s)",
                (KIND, jobs),
            )
        conn.execute("ANALYZE jobs.runs")


def define_capped(dsn: str, count: int, cap: int) -> list[int]:
    """``count`` recurring definitions with max_concurrent_runs ``cap`` (never materialized here)."""
    with connect(dsn) as conn:
        rows = conn.execute(
            """
            SELECT (jobs.define(name => 'capped-' || g, kind => %s, schedule => '@yearly',
                                max_concurrent_runs => %s)).id
              FROM generate_series(1, %s) AS g
            """,
            (KIND, cap, count),
        ).fetchall()
    return [int(r[0]) for r in rows]


def limit_per_key(dsn: str, keys: int, limit: int, seed: float = 0.3) -> None:
    """Give each queued run one of ``keys`` concurrency keys at random (fixed seed), and the
    kind a per-key limit of ``limit`` running: ``keys`` tenants, each limited like a capped
    definition, under a limit tight enough that its lock is exclusive."""
    with connect(dsn) as conn:
        conn.execute("SELECT setseed(%s)", (seed,))
        conn.execute("UPDATE jobs.runs SET concurrency_key = 'tenant-' || floor(random() * %s)::int", (keys,))
        conn.execute("SELECT jobs.set_limit('kind', %s, max_running => %s, per_key => true)", (KIND, limit))
        conn.execute("VACUUM ANALYZE jobs.runs")


def _largest_group(conn: psycopg.Connection[Any], column: str) -> int:
    """The largest RUNNING count of any one value of ``column``, read in one snapshot (a
    violation of a cap or a per-key limit would show here)."""
    query = SQL(
        """
        SELECT coalesce(max(n), 0) FROM (
            SELECT count(*) AS n FROM jobs.runs
             WHERE status = 'RUNNING' AND {column} IS NOT NULL
             GROUP BY {column}) AS c
        """
    ).format(column=Identifier(column))
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def running_per_key(conn: psycopg.Connection[Any]) -> int:
    """Sampler for the per-key limit: the largest RUNNING count of any one concurrency key."""
    return _largest_group(conn, "concurrency_key")


def running_per_definition(conn: psycopg.Connection[Any]) -> int:
    """Sampler for the caps scenario: the largest RUNNING count of any one definition."""
    return _largest_group(conn, "definition_id")


# -- the driver ---------------------------------------------------------------------------


@worker_process
def driver_worker(
    control: Control,
    index: int,
    dsn: str,
    batch: int,
    concurrency: int,
    heartbeats: bool = True,
    record_starts: bool = False,
    claimers: int = 1,
    job_seconds: float = 0.0,
    heartbeat_interval: float = 5.0,
) -> None:
    """One process running ``pgtick.worker.Worker`` with a no-op job until ``stop`` (a job
    that sleeps ``job_seconds``, where the heartbeats' cost is measured)."""
    from pgtick.app import App, Context
    from pgtick.worker import Worker

    app = App("bench")
    starts: list[tuple[int, float, float]] = []

    @app.job(KIND)
    def noop(ctx: Context) -> None:
        if record_starts:
            starts.append((int(ctx.payload.get("i", -1)), float(ctx.payload.get("t", 0.0)), time.time()))
        if job_seconds:
            time.sleep(job_seconds)

    worker = Worker(
        app,
        dsn,
        worker_id=f"bench-{os.getpid()}",
        concurrency=concurrency,
        batch_size=batch,
        listen=True,
        claimers=claimers,
        heartbeat_interval=heartbeat_interval,
    )
    if not heartbeats:  # the counterfactual for the heartbeat cost: no heartbeat calls at all
        worker._heartbeat.beat = lambda: None  # type: ignore[method-assign]
    report_ready(control, index)
    control.go.wait()
    worker.run(control.stop)
    s = worker.stats
    control.out.put(
        {
            "index": index,
            "claimed": s.claimed,
            "completed": s.completed,
            "fenced": s.fenced,
            "heartbeat_failures": s.heartbeat_failures,
            "starts": starts,
        }
    )


# -- SQL only -----------------------------------------------------------------------------

CLAIM_SQL = "SELECT id FROM jobs.claim(%s, %s)"
COMPLETE_SQL = "SELECT jobs.complete(%s, %s)"
COMPLETE_MANY_SQL = "SELECT count(*) FROM jobs.complete_many(%s, %s)"


@worker_process
def sql_worker(control: Control, index: int, dsn: str, batch: int, threads: int, warm: bool = False) -> None:
    """``threads`` threads, each with its own connection: claim a batch, complete it, repeat.
    With ``warm``, each connection first claims and completes a batch in a transaction it rolls
    back, before the start: the session's first calls (plpgsql compile, plans, catalog caches)
    are then not timed, and the queue is left as it was."""

    def step(i: int, conn: psycopg.Connection[Any]) -> int:
        worker = f"sql-{os.getpid()}-{i}"
        ids = [r[0] for r in conn.execute(CLAIM_SQL, (batch, worker))]
        if len(ids) == 1:
            conn.execute(COMPLETE_SQL, (ids[0], worker))
        elif ids:
            conn.execute(COMPLETE_MANY_SQL, (ids, worker))
        return len(ids)

    def warm_up(i: int, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction(force_rollback=True):
            step(i, conn)

    claim_loops(control, index, dsn, threads, step, warm_up if warm else None)


# -- latency ------------------------------------------------------------------------------


def enqueue_one(conn: psycopg.Connection[Any], i: int) -> None:
    conn.execute("SELECT (jobs.enqueue(%s, %s)).id", (KIND, Jsonb({"i": i, "t": time.time()})))


DB_LATENCY_SQL = (
    "SELECT extract(epoch FROM started_at - created_at)::float8 FROM jobs.runs WHERE started_at IS NOT NULL"
)


# -- how job code runs: thread, async, process ---------------------------------------------

#: Worker modes the ``workers`` scenario compares (``isolation="process"`` in two variants).
MODES = ("thread", "async", "process", "process-fresh")


def noop_job(ctx: Any) -> None:
    """A module-level no-op (a process-isolated job's function must be importable)."""


async def async_noop_job(ctx: Any) -> None:
    """The same no-op as an ``async def`` job."""


def register(app: Any, mode: str) -> None:
    """Register the no-op kind in ``app`` the way ``mode`` runs it."""
    if mode == "async":
        app.job(KIND)(async_noop_job)
    elif mode in ("process", "process-fresh"):
        import multiprocessing

        from pgtick import isolation

        # The harness's worker processes are daemonic, and a daemonic process may not start
        # children; a worker started by `pgtick run` is not.
        multiprocessing.current_process().daemon = False

        isolation.POOL.reuse = mode == "process"  # process-fresh: one spawned process per job
        app.job(KIND, isolation="process")(noop_job)
    else:
        app.job(KIND)(noop_job)


@worker_process
def mode_worker(control: Control, index: int, dsn: str, batch: int, concurrency: int, mode: str) -> None:
    """One process running ``pgtick.worker.Worker`` with the no-op kind run as ``mode``."""
    from pgtick.app import App
    from pgtick.worker import Worker

    app = App("bench")
    register(app, mode)
    worker = Worker(app, dsn, worker_id=f"bench-{os.getpid()}", concurrency=concurrency, batch_size=batch)
    report_ready(control, index)
    control.go.wait()
    worker.run(control.stop)
    s = worker.stats
    control.out.put({"index": index, "claimed": s.claimed, "completed": s.completed, "fenced": s.fenced})
