"""WAL bytes and function time per run: pgtick's claim/complete against the bare SQL queue.

    .venv/bin/python bench/profile_sql.py [--jobs 1000] [--dsn DSN]

For batch 1, 10 and 100, a fresh database per system (embedded and throwaway unless
``--dsn``) is filled with ``--jobs`` runs and drained by one connection in a loop (claim a
batch, complete it). Prints per system and batch: runs/s, WAL bytes per run (from
``pg_current_wal_insert_lsn()``), and for pgtick the per-call time of its functions from
``pg_stat_user_functions`` (``track_functions = all`` in the session).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_bare, sys_pgtick
from bench.harness import Server, connect

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
                print(
                    f"batch={batch} {name}: runs={done} {done / seconds:.0f}/s"
                    f" wal_bytes_per_run={wal / max(done, 1):.0f} load={os.getloadavg()[0]:.1f}"
                    + "".join(
                        f" {f}: {calls} calls {us} us/call (self {own})" for f, calls, us, own in functions
                    ),
                    flush=True,
                )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
