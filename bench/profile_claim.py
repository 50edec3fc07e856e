"""Where one jobs.claim spends its time: per-statement plan and execution times and the
backend's CPU per claim and completion, this schema against a baseline commit, alternated.

    .venv/bin/python bench/profile_claim.py --dsn DSN [--case uncapped|three-limits|capped|keyed]
                                            [--rounds 4] [--calls 400] [--batch 10]
                                            [--baseline REV]

DSN: a superuser DSN of a server that preloads pg_stat_statements (track = all shows the
statements inside the claim). Two databases are created on it, one with this checkout's sql/
and one with the baseline's (default: main), installed by its own sql/install.sql from ``git
archive``. Each round refills both with the limits benchmark's pool (bench/sys_limits.py;
``three-limits`` adds its three roomy limits; ``capped`` queues the runs of the caps
benchmark instead: 100 definitions capped at 2, each run drawn from one of them; ``keyed`` its
runs of 100 tenant keys under a per-key limit of 2), warms a
session up, then times ``--calls`` claims of ``--batch`` and their ``jobs.complete_many`` in
one session with synchronous_commit off, and reads the backend's CPU time from /proc (so the
server must run on this machine). The two schemas alternate, round after round, so that a
burst of load elsewhere hits both. Prints per round the CPU and wall time per
claim+completion and the load average, then per schema the median CPU and, per statement,
the median over the rounds of its planning and execution time per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_limits, sys_pgtick
from bench.harness import connect

STATEMENTS = """
SELECT calls, plans, round((total_plan_time / greatest(plans, 1) * 1000)::numeric, 1),
       round((total_exec_time / calls * 1000)::numeric, 1),
       left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
  FROM pg_stat_statements
 WHERE calls >= %s
 ORDER BY total_plan_time + total_exec_time DESC
 LIMIT 12
"""


def database(admin_dsn: str, name: str, baseline: str | None) -> str:
    """A fresh database ``name`` with this checkout's schema, or the baseline's."""
    from psycopg.conninfo import make_conninfo

    from pgtick import migrate

    with connect(admin_dsn) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    dsn = make_conninfo(admin_dsn, dbname=name)
    if baseline:
        sys_limits.install_from(sys_limits.baseline_root(baseline), dsn)
    else:
        with connect(dsn) as conn:
            migrate.apply(conn)
    with connect(dsn) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return dsn


def schemas(admin_dsn: str, prefix: str, baseline: str) -> dict[str, str]:
    """Two fresh databases, ``this`` (this checkout's schema) and ``baseline``, by name."""
    return {
        "this": database(admin_dsn, f"{prefix}_this", None),
        baseline: database(admin_dsn, f"{prefix}_base", baseline),
    }


def alternating(names: list[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, name) for every name in every round, the order reversed every other round, so
    that a burst of load elsewhere hits both schemas alike."""
    for n in range(rounds):
        for name in names if n % 2 == 0 else list(reversed(names)):
            yield n, name


def backend_cpu(pid: int) -> float:
    """User + system CPU seconds of a local backend."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(dsn: str, case: str, calls: int, batch: int) -> tuple[float, float, list[tuple]]:
    """CPU and wall microseconds per claim+completion, and the statements of the round."""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE jobs.runs CASCADE")
        conn.execute("DELETE FROM jobs.limits")
        conn.execute("DELETE FROM jobs.definitions")
    warm = 20
    if case == "capped":
        sys_pgtick.fill(dsn, (calls + warm) * batch, sys_pgtick.define_capped(dsn, 100, 2))
    elif case == "keyed":
        sys_pgtick.fill(dsn, (calls + warm) * batch)
        sys_pgtick.limit_per_key(dsn, 100, 2)
    else:
        sys_limits.fill_two_kinds(dsn, (calls + warm) * batch)
    if case == "three-limits":
        sys_limits.set_three_limits(dsn)
    with connect(dsn) as conn:
        conn.execute("SET synchronous_commit = off")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])

        def one() -> int:
            ids = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(%s, 'w')", (batch,))]
            conn.execute("SELECT count(*) FROM jobs.complete_many(%s, 'w')", (ids,))
            return len(ids)

        for _ in range(warm):
            one()
        conn.execute("SELECT pg_stat_statements_reset()")
        cpu, wall = backend_cpu(pid), time.perf_counter()
        done = sum(one() for _ in range(calls))
        cpu, wall = backend_cpu(pid) - cpu, time.perf_counter() - wall
        if done != calls * batch:
            raise SystemExit(f"claimed {done} runs, expected {calls * batch}")
        statements = conn.execute(STATEMENTS, (calls,)).fetchall()
    return cpu / calls * 1e6, wall / calls * 1e6, statements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="superuser DSN; pg_stat_statements preloaded")
    parser.add_argument("--case", choices=["uncapped", "three-limits", "capped", "keyed"], default="uncapped")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--baseline", default="main", help="commit to compare with (git archive)")
    args = parser.parse_args()
    dsns = schemas(args.dsn, "pgtick_profile", args.baseline)
    cpu: dict[str, list[float]] = {name: [] for name in dsns}
    statements: dict[str, dict[str, list[tuple[int, float, float]]]] = {name: {} for name in dsns}
    for n, name in alternating(list(dsns), args.rounds):
        c, w, rows = measure(dsns[name], args.case, args.calls, args.batch)
        cpu[name].append(c)
        for calls, plans, plan_us, exec_us, query in rows:
            statements[name].setdefault(query, []).append(
                (calls // args.calls, float(plan_us) if plans else 0.0, float(exec_us))
            )
        print(
            f"round {n + 1} {name}: cpu {c:.0f} us, wall {w:.0f} us per claim+completion,"
            f" load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    for name in dsns:
        print(f"{name}: median cpu {statistics.median(cpu[name]):.0f} us per claim+completion")
        print("  per claim  plan_us  exec_us  statement (medians over the rounds)")
        for query, seen in statements[name].items():
            plan_us = statistics.median(x[1] for x in seen)
            exec_us = statistics.median(x[2] for x in seen)
            print(f"  {seen[0][0]:9}  {plan_us:7.1f}  {exec_us:7.1f}  {query}")


if __name__ == "__main__":
    main()
