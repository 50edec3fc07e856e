"""The schedule benchmark: how late do scheduled occurrences start, and are any missed or
run twice, with N schedules every minute (and 100 every second)?

    .venv/bin/python bench/schedule.py [--sizes 100,1000,10000,100000] [--every-second 100]
                                       [--boundaries 3] [--workers 1] [--concurrency 100]
                                       [--dsn DSN] [--out results.json]

stdout: one JSON line per scenario, then a table. Progress goes to stderr. Without ``--dsn``
an embedded PostgreSQL (durable: synchronous_commit and fsync on) is started on a temporary
directory; every scenario gets a fresh database on it.

Per scenario: N definitions of a no-op job, ``* * * * *`` in UTC, are created with
``jobs.define_many`` (timed: setup seconds); a leader process (``pgtick run --no-worker``)
and ``--workers`` worker processes (``pgtick run --no-scheduler``) start; after one warm-up
minute boundary, ``--boundaries`` boundaries are observed. Lateness is
``started_at - scheduled_for`` of every occurrence of the observed boundaries (database
clock); missed = occurrences not started 60 s after their time (counting those never
inserted); duplicated = more than one run of one definition for one occurrence;
inserted_after_their_time counts runs materialized late. CPU is the user+system time
of the leader and the worker processes over the observed window, as a percentage of
one core. The every-second scenario observes 60 seconds of ``FREQ=SECONDLY`` occurrences
the same way.

Peers (pg_cron, procrastinate, DBOS) are not driven by this script yet; they are reported
as ``not run``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from bench.harness import Server  # noqa: E402
from pgtick import migrate  # noqa: E402

PGTICK = str(Path(sys.executable).with_name("pgtick"))
APP = str(ROOT / "bench" / "schedule_app.py")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PEERS = ("pg_cron", "procrastinate", "DBOS")


def log(message: str) -> None:
    print(f"[schedule-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (Linux /proc), seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def sleep_until(conn: psycopg.Connection[Any], at: datetime) -> None:
    while True:
        left = (at - db_now(conn)).total_seconds()
        if left <= 0:
            return
        time.sleep(min(left, 5.0))


def start(dsn: str, *flags: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": dsn}
    return subprocess.Popen(
        [PGTICK, "run", APP, "--dsn", dsn, *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # our own child, by its handle
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def scenario(
    server: Server,
    name: str,
    count: int,
    schedule: str,
    step: timedelta,
    observe: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Define ``count`` schedules, run pgtick, observe ``observe`` occurrence instants."""
    dbname = f"sched_{name.replace('-', '_')}"
    dsn = server.fresh_database(dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.apply(conn)
        defs = [{"name": f"s{i:06}", "kind": "noop", "schedule": schedule} for i in range(count)]
        began = time.monotonic()
        conn.execute("SELECT count(*) FROM jobs.define_many(%s)", (Jsonb(defs),))
        setup = time.monotonic() - began
        log(f"{name}: {count} definitions in {setup:.2f}s")
        flags = ["--concurrency", str(args.concurrency), "--batch", str(min(args.concurrency, 1000))]
        leader = start(dsn, "--no-worker")
        workers = [start(dsn, "--no-scheduler", *flags) for _ in range(args.workers)]
        try:
            now = db_now(conn)
            # Warm-up: cursors set, the horizon learned, one boundary (or 10 s) passed.
            unit = step.total_seconds()
            first = datetime.fromtimestamp((now.timestamp() // unit + 1) * unit, tz=now.tzinfo)
            warm = first + (step if unit >= 60 else timedelta(seconds=10))
            while warm - now < timedelta(seconds=min(30.0, unit / 2)):
                warm += step
            sleep_until(conn, warm)
            observed_from = warm + step
            observed_to = observed_from + step * (observe - 1)
            cpu0 = {p.pid: cpu_seconds(p.pid) for p in [leader, *workers]}
            t0 = time.monotonic()
            log(f"{name}: observing {observe} instants from {observed_from:%H:%M:%S}")
            sleep_until(conn, observed_to + timedelta(seconds=1))
            window = time.monotonic() - t0
            cpu = {pid: cpu_seconds(pid) - c for pid, c in cpu0.items()}
            # Let late starts happen (they count as late, not missed, within 60 s).
            deadline = observed_to + timedelta(seconds=60)
            while db_now(conn) < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM jobs.runs WHERE origin = 'schedule' AND started_at IS NULL"
                    " AND scheduled_for BETWEEN %s AND %s",
                    (observed_from, observed_to),
                ).fetchone()
                inserted = conn.execute(
                    "SELECT count(*) FROM jobs.runs"
                    " WHERE origin = 'schedule' AND scheduled_for BETWEEN %s AND %s",
                    (observed_from, observed_to),
                ).fetchone()
                if row == (0,) and inserted == (count * observe,):
                    break
                time.sleep(1.0)
        finally:
            for p in [leader, *workers]:
                stop(p)
        stats = conn.execute(
            """
            WITH r AS (
                SELECT definition_id, scheduled_for, started_at, created_at,
                       started_at - scheduled_for AS late
                  FROM jobs.runs
                 WHERE origin = 'schedule' AND scheduled_for BETWEEN %s AND %s
            )
            SELECT count(*) FILTER (WHERE late <= interval '60 s'),
                   count(*) - count(DISTINCT (definition_id, scheduled_for)),
                   1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY late)),
                   1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY late)),
                   1000 * extract(epoch FROM max(late)),
                   1000 * extract(epoch FROM min(late)),
                   count(*) FILTER (WHERE started_at < scheduled_for),
                   count(*) FILTER (WHERE created_at > scheduled_for),
                   count(*)
              FROM r
            """,
            (observed_from, observed_to),
        ).fetchone()
        assert stats is not None
        started, duplicated, p50, p99, worst, best, early, inserted_late, inserted = stats
        expected = count * observe
    server.drop_database(dbname)
    return {
        "system": "pgtick",
        "scenario": name,
        "schedules": count,
        "schedule": schedule,
        "occurrences": expected,
        "started": int(started),
        "missed": expected - int(started),
        "duplicated": int(duplicated),
        "started_early": int(early),
        "inserted": int(inserted),
        "inserted_after_their_time": int(inserted_late),
        "lateness_ms": {
            "p50": _round(p50),
            "p99": _round(p99),
            "max": _round(worst),
            "min": _round(best),
        },
        "setup_seconds": round(setup, 2),
        "leader_cpu_pct": round(100 * cpu[leader.pid] / window, 1),
        "worker_cpu_pct": round(100 * sum(cpu[w.pid] for w in workers) / window, 1),
        "workers": args.workers,
        "concurrency": args.concurrency,
        "observed_seconds": round(window, 1),
    }


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="every-minute schedule counts")
    parser.add_argument("--every-second", type=int, default=100, help="every-second schedules (0: skip)")
    parser.add_argument("--boundaries", type=int, default=3, help="minute boundaries observed per size")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (2 at 100,000 always)")
    parser.add_argument("--concurrency", type=int, default=100, help="worker concurrency (no-op jobs)")
    parser.add_argument("--dsn", help="use this server (a superuser DSN) instead of an embedded one")
    parser.add_argument("--out", help="also write all records to this JSON file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    server = Server(args.dsn)
    records: list[dict[str, Any]] = []
    try:
        settings = server.settings()
        log(f"server {settings['server_version']}, synchronous_commit={settings['synchronous_commit']}")
        scenarios: list[tuple[str, int, str, timedelta, int]] = [
            (f"every-minute-{n}", n, "* * * * *", timedelta(minutes=1), args.boundaries) for n in sizes
        ]
        if args.every_second:
            scenarios.append(
                (
                    f"every-second-{args.every_second}",
                    args.every_second,
                    "FREQ=SECONDLY",
                    timedelta(seconds=1),
                    60,
                )
            )
        for name, count, schedule, step, observe in scenarios:
            workers = max(args.workers, 2) if count >= 100_000 else args.workers
            run_args = argparse.Namespace(**{**vars(args), "workers": workers})
            load_before = loadavg()
            record = scenario(server, name, count, schedule, step, observe, run_args)
            record["load_before"] = load_before
            record["load_after"] = loadavg()
            records.append(record)
            print(json.dumps(record), flush=True)
        for peer in PEERS:
            record = {"system": peer, "status": "not run", "why": "not driven by bench/schedule.py yet"}
            records.append(record)
            print(json.dumps(record), flush=True)
    finally:
        server.stop()
    print_table(records)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=2))
    return 0


def print_table(records: list[dict[str, Any]]) -> None:
    print(
        "\n| scenario | p50 ms | p99 ms | max ms | missed | duplicated | setup s"
        " | leader CPU % | worker CPU % |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in records:
        if r.get("status") == "not run":
            print(f"| {r['system']} | not run | | | | | | | |")
            continue
        lat = r["lateness_ms"]
        print(
            f"| {r['scenario']} ({r['workers']} worker proc.) | {lat['p50']} | {lat['p99']} | {lat['max']} |"
            f" {r['missed']} of {r['occurrences']} | {r['duplicated']} | {r['setup_seconds']} |"
            f" {r['leader_cpu_pct']} | {r['worker_cpu_pct']} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
