"""Dashboard page times on a large history, and the plans of every query the pages send.

    .venv/bin/python -m bench.web_pages [--runs 100000] [--explain-runs 1000000]

Seeds a fresh database (embedded throwaway PostgreSQL, or $PGTICK_BENCH_DSN) with
`--runs` finished runs over two weeks spread across 300 definitions (plus the test
seed: every status, a retry chain, a definition at its cap, DST schedules), then
times each page in-process, server side (request in, HTML out), and prints one JSON
line per page. Then it grows the history to `--explain-runs`, moves the runs finished over a
day ago to jobs.run_history as the leader does (jobs.archive), times the pages again and
prints EXPLAIN (ANALYZE, BUFFERS) of each query each page sent, on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from starlette.testclient import TestClient

from bench.harness import Server
from pgtick import migrate
from pgtick.web import Secret, create_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "web"))
from web_seed import Seeded, history, pages, seed

TARGET_MS = 300
Recorded = list[tuple[Any, Any]]


def _record_queries(into: Recorded) -> None:
    """Remember every statement the dashboard sends (to EXPLAIN them afterwards)."""
    original = psycopg.AsyncConnection.execute

    async def execute(self: psycopg.AsyncConnection[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self)
        if text.strip() and not text.lstrip().upper().startswith(("SET", "SHOW")):  # not the pool's check
            into.append((text, params))
        return await original(self, query, params, **kw)

    psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign,assignment]


def bench_pages(s: Seeded) -> list[str]:
    """The dashboard's pages (those that query the database) and the history's own."""
    history_pages = [
        "/definition?name=history-0007",
        "/runs?status=FAILED&kind=email",
        "/runs?kind=thumbnail",
        "/runs?definition=history-0042",
        "/runs?since=2000-01-01T00:00Z&until=2000-01-02T00:00Z",
        "/preview?schedule=30+2+*+3,10+0&tz=Europe/Berlin&count=50",
    ]
    return [p for p in pages(s) if not p.startswith(("/static/", "/login"))] + history_pages


def time_pages(client: TestClient, paths: list[str], runs: int, repeat: int) -> None:
    for path in paths:
        assert client.get(path).status_code == 200, path  # warm: pool, caches, plans
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            response = client.get(path)
            samples.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, path
        print(
            json.dumps(
                {
                    "bench": "web_pages",
                    "page": path,
                    "runs": runs,
                    "median_ms": round(statistics.median(samples), 1),
                    "max_ms": round(max(samples), 1),
                    "samples": repeat,
                    "target_ms": TARGET_MS,
                }
            ),
            flush=True,
        )


def explain(dsn: str, client: TestClient, paths: list[str], recorded: Recorded) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        for path in paths:
            recorded.clear()
            client.get(path)
            for text, params in list(recorded):
                with conn.transaction():
                    conn.execute("SET LOCAL ROLE jobs_reader")
                    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, params).fetchall()
                print(f"\n=== {path}\n{text.strip()}\n--- params: {params!r}", file=sys.stderr)
                for row in rows:
                    print(row["QUERY PLAN"], file=sys.stderr)
            sys.stderr.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--explain-runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    import os

    server = Server(os.environ.get("PGTICK_BENCH_DSN"))
    dsn = server.fresh_database("pgtick_bench_web")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.apply(conn)
            history(conn, args.runs, span="14 days", definitions=300)
            history(conn, 3000, span="1 hour")
            seeded = seed(conn)
            conn.execute("VACUUM ANALYZE jobs.runs")
        recorded: Recorded = []
        _record_queries(recorded)
        with TestClient(create_app(dsn, Secret.from_plain("benchmark secret"))) as client:
            time_pages(client, bench_pages(seeded), args.runs + 3000, args.repeat)
            if args.explain_runs > args.runs:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    history(conn, args.explain_runs - args.runs, span="14 days")
                    # As the leader keeps them: runs finished over a day ago in jobs.run_history.
                    while conn.execute("SELECT jobs.archive(100000)").fetchone() != (0,):
                        pass
                    conn.execute("VACUUM ANALYZE jobs.runs")
                    conn.execute("ANALYZE jobs.run_history")
                time_pages(client, bench_pages(seeded), args.explain_runs + 3000, args.repeat)
            explain(dsn, client, bench_pages(seeded), recorded)
    finally:
        try:
            server.drop_database("pgtick_bench_web")
        finally:
            server.stop()  # also when the drop failed: no server left running
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
