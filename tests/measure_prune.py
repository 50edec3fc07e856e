"""Measure pruning of finished history, for docs/operations.md ("Keeping history small").

    .venv/bin/python tests/measure_prune.py                 # 200,000 old runs, embedded PG
    .venv/bin/python tests/measure_prune.py --old 1000000 --dsn postgresql://.../scratch

Builds a scratch database (dropped at the end) with OLD finished runs past the retention,
RECENT finished runs inside it and QUEUED live runs, then:

1. times jobs.prune(NULL, BATCH) call by call until a short batch, as the leader does,
   while a second connection keeps claiming and completing runs (its latency is reported
   before and during the prune, to show what pruning costs the workers);
2. reports WAL written, table and index sizes before, after pruning, after VACUUM (twice:
   the second one recycles emptied index pages), and after as many new runs as were pruned
   are inserted again: freed space is reused, the table does not grow.

Prints one JSON object per step and a summary. Timing is a measurement, not a test: the
test suite (tests/sql/test_ops.py) runs this with small numbers and checks only counts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "driver"), str(ROOT / "tests")]

from pgtick import migrate  # noqa: E402

Conn = psycopg.Connection[Any]


def _one(conn: Conn, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def sizes(conn: Conn) -> dict[str, int]:
    return {
        "rows": int(_one(conn, "SELECT count(*) FROM jobs.runs")),
        "table_bytes": int(_one(conn, "SELECT pg_table_size('jobs.runs')")),
        "index_bytes": int(_one(conn, "SELECT pg_indexes_size('jobs.runs')")),
    }


def seed(conn: Conn, old: int, recent: int, queued: int) -> None:
    """OLD runs finished 15..45 days ago, RECENT in the last 13 days, QUEUED due later."""
    conn.execute(
        """
        INSERT INTO jobs.runs (kind, status, payload, scheduled_for, created_at, started_at,
                               finished_at, worker, result, failure_reason, error)
        SELECT 'report', s.status, '{"customer": 42, "period": "2026-01"}', t, t, t,
               t + interval '3 seconds', 'host-1234-abcdef',
               CASE WHEN s.status = 'COMPLETED' THEN '{"rows": 1234}'::jsonb END,
               CASE WHEN s.status = 'FAILED' THEN 'Error' END,
               CASE WHEN s.status = 'FAILED' THEN 'upstream timed out' END
          FROM (SELECT CASE WHEN g %% 20 = 0 THEN 'FAILED' ELSE 'COMPLETED' END::jobs.run_status AS status,
                       now() - interval '15 days' - (g::double precision / %s) * interval '30 days' AS t
                  FROM generate_series(1, %s) AS g) AS s
        """,
        (old, old),
    )
    conn.execute(
        """
        INSERT INTO jobs.runs (kind, status, scheduled_for, created_at, started_at, finished_at, worker)
        SELECT 'report', 'COMPLETED', t, t, t, t + interval '3 seconds', 'host-1234-abcdef'
          FROM (SELECT now() - (g::double precision / %s) * interval '13 days' AS t
                  FROM generate_series(1, %s) AS g) AS s
        """,
        (recent, recent),
    )
    conn.execute(
        "INSERT INTO jobs.runs (kind, scheduled_for) SELECT 'work', now() FROM generate_series(1, %s)",
        (queued,),
    )
    conn.execute("VACUUM (ANALYZE) jobs.runs")


class ClaimLoop:
    """Claims and completes one run at a time on its own connection, timing each cycle."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                began = time.perf_counter()
                row = conn.execute("SELECT id FROM jobs.claim(1, 'bench', '{work}')").fetchone()
                if row is None:
                    break
                conn.execute("SELECT jobs.complete(%s, 'bench')", (row[0],))
                self.samples.append(time.perf_counter() - began)

    def take(self) -> dict[str, float]:
        got, self.samples = self.samples, []
        if not got:
            return {"cycles": 0}
        ms = sorted(s * 1000 for s in got)
        return {
            "cycles": len(ms),
            "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        }


def measure(
    dsn: str,
    *,
    old: int,
    recent: int,
    batch: int,
    queued: int = 50_000,
    idle_seconds: float = 2.0,
    emit: Any = None,
) -> dict[str, Any]:
    """Seed, prune in batches under a claim load, vacuum, refill; returns the numbers."""
    emit = emit or (lambda step, data: None)
    out: dict[str, Any] = {"old": old, "recent": recent, "batch": batch, "queued": queued}
    with psycopg.connect(dsn, autocommit=True) as conn:
        out["server"] = _one(conn, "SHOW server_version")
        seed(conn, old, recent, queued)
        out["before"] = sizes(conn)
        emit("seeded", out["before"])

        loop = ClaimLoop(dsn)
        loop.thread.start()
        time.sleep(idle_seconds)
        out["claim_idle"] = loop.take()
        emit("claim latency, no prune", out["claim_idle"])

        wal0 = _one(conn, "SELECT pg_current_wal_lsn()")
        batches: list[float] = []
        pruned = 0
        began = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            n = int(_one(conn, "SELECT jobs.prune(NULL, %s)", (batch,)))
            batches.append(time.perf_counter() - t0)
            pruned += n
            if n < batch:
                break
        total = time.perf_counter() - began
        out["claim_during_prune"] = loop.take()
        loop.stop.set()
        loop.thread.join(30)
        wal = int(_one(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (wal0,)))
        out["prune"] = {
            "pruned": pruned,
            "calls": len(batches),
            "seconds": round(total, 2),
            "rows_per_second": round(pruned / total) if total else None,
            "batch_ms_median": round(statistics.median(batches) * 1000, 1),
            "batch_ms_max": round(max(batches) * 1000, 1),
            "wal_bytes": wal,
        }
        emit("pruned", out["prune"])
        emit("claim latency during prune", out["claim_during_prune"])
        out["after_prune"] = sizes(conn)
        emit("after prune", out["after_prune"])

        t0 = time.perf_counter()
        conn.execute("VACUUM jobs.runs")
        out["vacuum_seconds"] = round(time.perf_counter() - t0, 2)
        out["after_vacuum"] = sizes(conn)
        emit("after vacuum", {"seconds": out["vacuum_seconds"], **out["after_vacuum"]})
        # B-tree pages emptied by that VACUUM become reusable only once no transaction older
        # than it remains: the next vacuum (autovacuum, after the next churn) recycles them.
        for _ in range(2):
            conn.execute("SELECT txid_current()")
        t0 = time.perf_counter()
        conn.execute("VACUUM jobs.runs")
        out["second_vacuum_seconds"] = round(time.perf_counter() - t0, 2)
        emit("second vacuum", {"seconds": out["second_vacuum_seconds"]})

        seed(conn, old, 0, queued=0)  # the next OLD runs of history arrive
        out["after_refill"] = sizes(conn)
        emit("after refilling as many runs", out["after_refill"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=int, default=200_000, help="finished runs past retention")
    parser.add_argument("--recent", type=int, default=50_000, help="finished runs inside retention")
    parser.add_argument("--batch", type=int, default=10_000, help="jobs.prune batch_size")
    parser.add_argument("--queued", type=int, default=50_000, help="live queue the claim loop works on")
    parser.add_argument(
        "--dsn", default=os.environ.get("PGTICK_TEST_DSN"), help="an admin DSN (default: embedded)"
    )
    args = parser.parse_args()

    embedded = None
    admin = args.dsn
    if not admin:
        from pgtick.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(ephemeral=True)  # fsync on: the default, durable settings
        admin = embedded.start()
    name = f"pgtick_prune_{os.getpid()}"
    from harness import dsn_for

    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        dsn = dsn_for(admin, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.apply(conn)

        def emit(step: str, data: dict[str, Any]) -> None:
            print(json.dumps({"step": step, **data}), flush=True)

        out = measure(dsn, old=args.old, recent=args.recent, batch=args.batch, queued=args.queued, emit=emit)
        mb = 1024 * 1024
        p = out["prune"]
        print(
            f"\nPostgreSQL {out['server']}: pruned {p['pruned']:,} runs in {p['calls']} calls of "
            f"batch {args.batch:,}: {p['seconds']} s ({p['rows_per_second']:,} rows/s, median call "
            f"{p['batch_ms_median']} ms, max {p['batch_ms_max']} ms), WAL {p['wal_bytes'] / mb:.0f} MB.\n"
            f"claim+complete p50/p99: idle {out['claim_idle'].get('p50_ms')}/"
            f"{out['claim_idle'].get('p99_ms')} ms,"
            f" during prune {out['claim_during_prune'].get('p50_ms')}/"
            f"{out['claim_during_prune'].get('p99_ms')} ms.\n"
            + "\n".join(
                f"{label:>14}: {s['rows']:>9,} rows, table {s['table_bytes'] / mb:7.1f} MB,"
                f" indexes {s['index_bytes'] / mb:6.1f} MB"
                for label, s in [
                    ("before", out["before"]),
                    ("after prune", out["after_prune"]),
                    ("after vacuum", out["after_vacuum"]),
                    ("after refill", out["after_refill"]),
                ]
            )
            + f"\nVACUUM after the prune: {out['vacuum_seconds']} s; the next one (recycles the"
            f" emptied index pages): {out['second_vacuum_seconds']} s."
        )
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
