"""Run the pgtick benchmark suite against one throwaway PostgreSQL.

    .venv/bin/python bench/run.py [--quick] [--scenarios drain,caps,latency,growth,heartbeats]
                                  [--repeat N] [--dsn DSN] [--profile] [--history N]
                                  [--out results.json]

stdout: one JSON line per measured configuration, then a summary table of the ratios the
performance targets set. With ``--repeat N`` the chosen scenarios run N rounds, one after
the other (each line carries its round); the last table gives each target's median over the
rounds, every round's figure with the load average it ran under, and "met" only when the
target held in every round. Progress goes to stderr. Without ``--dsn`` an embedded PostgreSQL (the
``pgserver`` wheel) is started on a temporary directory with durable settings
(synchronous_commit and fsync on) and removed at the end; every system and scenario gets a
fresh database on it. ``--profile`` adds per-scenario server profiles (pg_stat_user_functions,
and pg_stat_statements when the server preloads it) to the JSON lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Profiler, Server
from bench.scenarios import SCENARIOS, Bench, log
from bench.summary import Summary, combine, summarize


def source_state() -> dict[str, str]:
    """Which pgtick code was measured: the commit, and a digest of the SQL, migrations and
    driver as they are on disk (others may be editing them while the suite runs)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    files = sorted(
        [*root.glob("sql/*.sql"), *root.glob("migrations/*.sql"), *root.glob("driver/pgtick/*.py")]
    )
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "sql", "migrations", "driver"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.count("\n")
    except (OSError, subprocess.CalledProcessError):
        head, dirty = "unknown", 0
    return {"commit": head, "uncommitted_files": str(dirty), "digest": digest.hexdigest()[:12]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer jobs and variants (about 4 minutes)")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--systems",
        help="comma-separated subset of: bare-sql, pgtick-sql, pgtick-driver, pgqueuer, procrastinate",
    )
    parser.add_argument("--dsn", help="use this server (a superuser DSN) instead of an embedded one")
    parser.add_argument("--profile", action="store_true", help="attach server-side profiles to each record")
    parser.add_argument(
        "--history", type=int, help="finished runs in the growth scenario (default 1,000,000; 250,000 quick)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of the scenarios (the targets: median of 3, met in all)"
    )
    parser.add_argument("--out", help="also write all records and the summary to this JSON file")
    args = parser.parse_args(argv)
    if not 1 <= args.repeat <= 20:
        parser.error("--repeat takes a whole number from 1 to 20")

    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")

    started = time.perf_counter()
    server = Server(args.dsn)
    try:
        settings = server.settings()
        machine = {
            "nproc": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": sys.version.split()[0],
            **source_state(),
            **settings,
        }
        log("server: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
        systems = {x.strip() for x in args.systems.split(",")} if args.systems else None
        rounds: list[Summary] = []
        for round_ in range(1, args.repeat + 1):
            bench = Bench(server, args.quick, Profiler(server, args.profile), systems, args.history)
            bench.round = round_ if args.repeat > 1 else None
            for name in chosen:
                with_time = time.perf_counter()
                SCENARIOS[name](bench)
                log(f"round {round_}: scenario {name} took {time.perf_counter() - with_time:.0f}s")
            rounds.append(summarize(bench.records))
    finally:
        server.stop()
    elapsed = time.perf_counter() - started
    records = [r for s in rounds for r in s.records]
    for i, summary in enumerate(rounds, start=1):
        print()
        if len(rounds) > 1:
            print(f"round {i}")
        print(summary.table())
    if len(rounds) > 1:
        print()
        print(combine(rounds))
    m = machine
    print(
        f"\nmeasured: pgtick {m['commit']} (+{m['uncommitted_files']} uncommitted files,"
        f" digest {m['digest']}); PostgreSQL {m['server_version']},"
        f" synchronous_commit={m['synchronous_commit']}, fsync={m['fsync']}; {m['nproc']} cores"
    )
    mode = "--quick" if args.quick else "full"
    print(f"total runtime: {elapsed:.0f}s ({mode}; scenarios: {','.join(chosen)})")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "machine": machine,
                    "quick": args.quick,
                    "seconds": round(elapsed, 1),
                    "records": records,
                    "ratios": [s.rows for s in rounds] if len(rounds) > 1 else rounds[0].rows,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
