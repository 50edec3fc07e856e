"""WAL bytes and function time per run: pgtick's claim/complete against the bare SQL queue.

    .venv/bin/python bench/profile_sql.py [--jobs 1000] [--dsn DSN]

For batch 1, 10 and 100, a fresh database per system (embedded and throwaway unless
``--dsn``) is filled with ``--jobs`` runs and drained by one connection in a loop (claim a
batch, complete it). Prints per system and batch: runs/s, WAL bytes per run (from
``pg_current_wal_insert_lsn()``), and for pgtick the per-call time of its functions from
``pg_stat_user_functions`` (``track_functions = all`` in the session). Where the server has
``pg_walinspect`` (PostgreSQL 15 and later, with contrib), each drain's WAL records follow by
type: how many per run, and their bytes per run (full-page images apart), largest first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_bare, sys_pgtick
from bench.harness import Server, connect

#: The drain's WAL by record type, per run: record count, record bytes, full-page image bytes.
WAL_RECORDS = """
SELECT "resource_manager/record_type", round(count::numeric / %(runs)s, 2),
       round(record_size::numeric / %(runs)s), round(fpi_size::numeric / %(runs)s)
  FROM pg_get_wal_stats(%(start)s, %(end)s, true)
 WHERE count > 0 ORDER BY combined_size DESC LIMIT 8
"""

FUNCTIONS = """
SELECT funcname, calls, round(total_time::numeric / calls * 1000), round(self_time::numeric / calls * 1000)
  FROM pg_stat_user_functions WHERE calls > 0 ORDER BY total_time DESC LIMIT 4
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--dsn", help="a superuser DSN instead of an embedded server")
    args = parser.parse_args()
    server = Server(args.dsn)
    try:
        for batch in (1, 10, 100):
            for name in ("bare-sql", "pgtick-sql"):
                dsn = server.fresh_database(f"profile_sql_{name.replace('-', '_')}_{batch}")
                system = sys_bare if name == "bare-sql" else sys_pgtick
                system.install(dsn)
                system.fill(dsn, args.jobs)
                with connect(dsn) as conn:
                    conn.execute("SET track_functions = 'all'")
                    start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
                    began, done = time.perf_counter(), 0
                    while True:
                        if name == "bare-sql":
                            ids = [r[0] for r in conn.execute(sys_bare.CLAIM_SQL, ("w", batch))]
                            if ids:
                                conn.execute(sys_bare.COMPLETE_SQL, (ids,))
                        else:
                            ids = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(%s, 'w')", (batch,))]
                            if len(ids) == 1:
                                conn.execute("SELECT jobs.complete(%s, 'w')", (ids[0],))
                            elif ids:
                                conn.execute("SELECT count(*) FROM jobs.complete_many(%s, 'w')", (ids,))
                        if not ids:
                            break
                        done += len(ids)
                    seconds = time.perf_counter() - began
                    row = conn.execute(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",
                        (start[0] if start else None,),
                    ).fetchone()
                    wal = float(row[0]) if row else 0.0
                    # Function statistics reach the shared view when the session flushes them,
                    # at most once a second and only between transactions: force it.
                    conn.execute("SELECT pg_stat_force_next_flush()")
                    functions = conn.execute(FUNCTIONS).fetchall() if name == "pgtick-sql" else []
                    records = _wal_records(conn, start[0] if start else None, done)
                print(
                    f"batch={batch} {name}: runs={done} {done / seconds:.0f}/s"
                    f" wal_bytes_per_run={wal / max(done, 1):.0f} load={os.getloadavg()[0]:.1f}"
                    + "".join(
                        f" {f}: {calls} calls {us} us/call (self {own})" for f, calls, us, own in functions
                    ),
                    flush=True,
                )
                for kind, count, size, fpi in records:
                    print(f"    {kind}: {count} per run, {size} bytes per run (+{fpi} in full-page images)")
    finally:
        server.stop()
    return 0


def _wal_records(conn: Any, start: Any, runs: int) -> list[tuple[Any, ...]]:
    """The WAL the drain wrote from ``start`` on, by record type (``WAL_RECORDS``); none where
    the server has no pg_walinspect. Up to the flushed end, which only flushed WAL can be read
    to: the drain's last commit flushed its records (synchronous_commit is on)."""
    end = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
    if (
        not runs
        or not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'").fetchone()
    ):
        return []
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    lsns = {"start": start, "end": end[0] if end else None}
    return conn.execute(WAL_RECORDS, {"runs": runs, **lsns}).fetchall()


if __name__ == "__main__":
    sys.exit(main())
