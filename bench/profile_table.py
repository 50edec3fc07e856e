"""Where a claim and a completion spend the server's CPU: bare SQL's two statements on its own
minimal table, the same statements on copies of jobs.runs stripped step by step, and
jobs.claim with jobs.complete_many on jobs.runs itself.

    .venv/bin/python bench/profile_table.py [--dsn DSN] [--rounds 4] [--rows 50000] [--batches 10,100]

A fresh database (embedded and throwaway unless ``--dsn``; the server must run on this
machine, since the backend's CPU time is read from /proc) gets pgtick's schema, bare SQL's
table (bench/sys_bare.py) and four tables made ``LIKE jobs.runs`` with its defaults and
fillfactor:

- ``runs-copy``: every index, table constraint and row trigger of jobs.runs;
- ``runs-hot-indexes``: only the four indexes the claim and the completion use (primary key,
  ``runs_claim_idx``, ``runs_running_idx``, ``runs_finished_idx``), still with the
  constraints and the trigger;
- ``runs-no-rules``: those four indexes, no constraint, no trigger;
- ``runs-claim-index``: the primary key and ``runs_claim_idx`` alone.

Each copy is drained by bare SQL's statements (lock the first batch in claim order with
``FOR UPDATE SKIP LOCKED`` and mark it RUNNING, then mark it COMPLETED), bare_jobs by bare
SQL's own, and ``pgtick`` is jobs.claim and jobs.complete_many on jobs.runs. Per system,
batch and round: refill with ``--rows`` QUEUED ad-hoc runs, VACUUM ANALYZE, one session
with synchronous_commit off warms up with 20 claims, then claims and completes the rest
batch by batch; the backend's CPU time per run is the figure. The systems alternate round
after round, so a burst of load elsewhere meets them all.

Prints one JSON line per system, batch and round, then one per system and batch with the
median over the rounds and its ratio to bare SQL's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_bare, sys_pgtick
from bench.harness import Server, connect
from bench.profile_indexes import index_on, runs_indexes

HOT_INDEXES = ("runs_pkey", "runs_claim_idx", "runs_running_idx", "runs_finished_idx")
COPIES = {  # name: (indexes kept, None for all; constraints and trigger kept)
    "runs-copy": (None, True),
    "runs-hot-indexes": (HOT_INDEXES, True),
    "runs-no-rules": (HOT_INDEXES, False),
    "runs-claim-index": (("runs_pkey", "runs_claim_idx"), False),
}
SYSTEMS = ("bare-sql", *COPIES, "pgtick")
WARM = 20


def statements(system: str) -> tuple[str, str]:
    """The claim (params: worker, batch) and the completion (params: ids) of a system."""
    if system == "bare-sql":
        return sys_bare.CLAIM_SQL, sys_bare.COMPLETE_SQL
    if system == "pgtick":
        return (
            "SELECT id FROM jobs.claim(%(batch)s, %(worker)s)",
            "SELECT jobs.complete_many(%(ids)s, 'w')",
        )
    table = copy_table(system)
    return (
        f"UPDATE {table} SET status = 'RUNNING', started_at = now(), worker = %s"
        f" WHERE id IN (SELECT id FROM {table} WHERE status = 'QUEUED'"
        "  ORDER BY priority DESC, scheduled_for, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id",
        f"UPDATE {table} SET status = 'COMPLETED', finished_at = now() WHERE id = ANY(%s)",
    )


def copy_table(copy: str) -> str:
    """The table of one of the COPIES."""
    return f"bench_tbl.{copy.replace('-', '_')}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dsn", help="a superuser DSN of a server on this machine instead of an embedded one"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", type=int, default=50000, help="runs drained per system, batch and round")
    parser.add_argument("--batches", default="10,100", help="comma-separated batch sizes")
    args = parser.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error("--batches takes comma-separated whole numbers, e.g. 10,100")
    if args.rounds < 1 or not batches or min(batches) < 1 or args.rows < (WARM + 10) * max(batches):
        parser.error(
            f"--rounds must be at least 1, batches at least 1 and --rows at least {WARM + 10} batches"
        )
    server = Server(args.dsn)
    try:
        dsn = server.fresh_database("profile_table")
        sys_pgtick.install(dsn)
        with connect(dsn) as conn:
            prepare(conn)
        cpu: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            order = SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]
            for batch in batches:
                for system in order:
                    us = drain(dsn, system, batch, args.rows)
                    cpu.setdefault((system, batch), []).append(us)
                    line = {
                        "system": system,
                        "batch": batch,
                        "round": round_ + 1,
                        "cpu_us_per_run": round(us, 2),
                    }
                    print(json.dumps(line | {"loadavg": round(os.getloadavg()[0], 2)}), flush=True)
        for batch in batches:
            bare = statistics.median(cpu[("bare-sql", batch)])
            for system in SYSTEMS:
                median = statistics.median(cpu[(system, batch)])
                summary = {"system": system, "batch": batch, "median_cpu_us_per_run": round(median, 2)}
                print(json.dumps(summary | {"vs_bare_sql": round(median / bare, 3)}), flush=True)
    finally:
        server.stop()
    return 0


def prepare(conn: psycopg.Connection[Any]) -> None:
    """bare_jobs, and the copies of jobs.runs with the indexes, constraints and trigger each keeps."""
    conn.execute(sys_bare.SCHEMA)
    conn.execute("CREATE SCHEMA bench_tbl")
    indexes = runs_indexes(conn, HOT_INDEXES)
    checks = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'jobs.runs'::regclass AND contype = 'c'"
    ).fetchall()
    triggers = conn.execute(
        "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
        " WHERE tgrelid = 'jobs.runs'::regclass AND NOT tgisinternal"
    ).fetchall()
    (options,) = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'jobs.runs'::regclass"
    ).fetchone() or (None,)
    for copy, (kept, rules) in COPIES.items():
        table = copy_table(copy)
        with_options = f" WITH ({', '.join(options)})" if options else ""
        conn.execute(
            f"CREATE TABLE {table} (LIKE jobs.runs INCLUDING DEFAULTS INCLUDING IDENTITY){with_options}"
        )
        for index, definition in indexes:
            if kept is None or index in kept:
                conn.execute(index_on(definition, index, table))
        if rules:
            for (check,) in checks:
                conn.execute(f"ALTER TABLE {table} ADD {check}")
            for name, definition in triggers:
                conn.execute(
                    definition.replace(f"TRIGGER {name} ", f"TRIGGER {name}_copy ", 1).replace(
                        " ON jobs.runs ", f" ON {table} ", 1
                    )
                )


def drain(dsn: str, system: str, batch: int, rows: int) -> float:
    """Backend CPU µs per run to claim and complete ``rows`` fresh QUEUED runs, ``batch`` at a time."""
    claim, complete = statements(system)
    table = {"bare-sql": "bare_jobs", "pgtick": "jobs.runs"}.get(system) or copy_table(system)
    with connect(dsn) as conn:
        if system == "bare-sql":
            conn.execute("TRUNCATE bare_jobs")
            conn.execute(
                "INSERT INTO bare_jobs (status) SELECT 'queued' FROM generate_series(1, %s)", (rows,)
            )
        else:
            conn.execute(f"TRUNCATE {table} CASCADE")
            conn.execute(f"INSERT INTO {table} (kind) SELECT 'noop' FROM generate_series(1, %s)", (rows,))
        conn.execute(f"VACUUM ANALYZE {table}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        pid = conn.info.backend_pid

        def step() -> int:
            params: Any = {"batch": batch, "worker": "w"} if system == "pgtick" else ("w", batch)
            ids = [r[0] for r in conn.execute(claim, params)]
            if ids:
                conn.execute(complete, {"ids": ids} if system == "pgtick" else (ids,))
            return len(ids)

        for _ in range(WARM):
            step()
        # (Up to the last run, not to an empty claim: jobs.claim's first empty one would be
        # timed compiling the rest of the claim.)
        target = rows - WARM * batch
        started, done = backend_cpu(pid), 0
        while done < target and (n := step()) > 0:
            done += n
        if done != target:
            raise RuntimeError(f"{system}: drained {done} of {target} runs")
        return (backend_cpu(pid) - started) * 1e6 / done


def backend_cpu(pid: int) -> float:
    """A backend's CPU seconds so far (user and system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
