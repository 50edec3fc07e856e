"""Concurrent durable enqueues: the NOTIFY in the enqueue's transaction against after it.

    .venv/bin/python bench/enqueue_wake.py [--sessions 8] [--seconds 5] [--rounds 3] [--dsn DSN]

``--sessions`` threads, each on its own connection, call ``jobs.enqueue`` as fast as they
can for ``--seconds``, on a durable server (embedded and throwaway unless ``--dsn``):

- ``inline``: ``SELECT jobs.enqueue(...)`` in autocommit, the NOTIFY in its transaction;
- ``deferred``: the same call in a transaction that sets ``pgtick.defer_wake``, then, once it
  committed, ``pg_notify('jobs', '')`` in a transaction of its own with
  ``synchronous_commit`` off (docs/other-languages.md);
- ``client``: ``pgtick.Client(dsn).enqueue`` per session, which defers its NOTIFY so, its
  statements pipelined (``pgtick.client.DEFER_WAKE``).

PostgreSQL holds the notify queue's lock from a notifying commit's start to its end, the WAL
flush included, so inline enqueues commit one at a time whatever the number of sessions.
The cases alternate, ``--rounds`` of each; one JSON line per case and round (enqueues/s,
the per-call latency's percentiles, the load average), then one with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_pgtick
from bench.harness import Server, connect, percentiles
from pgtick import Client

ENQUEUE = "SELECT (jobs.enqueue('noop', '{}')).id"
DEFER = "SELECT set_config('pgtick.defer_wake', 'on', true)"
WAKE = "SELECT set_config('synchronous_commit', 'off', true), pg_notify('jobs', '')"


def enqueue_for(dsn: str, mode: str, seconds: float, sessions: int) -> dict[str, object]:
    """Every session enqueueing for ``seconds``; the rate and the per-call latencies."""
    start = threading.Barrier(sessions + 1)
    latencies: list[list[float]] = [[] for _ in range(sessions)]

    def session(index: int) -> None:
        with connect(dsn) as conn, Client(dsn) as client:
            start.wait()
            until = time.perf_counter() + seconds
            mine = latencies[index]
            while (began := time.perf_counter()) < until:
                if mode == "inline":
                    conn.execute(ENQUEUE)
                elif mode == "client":
                    client.enqueue("noop")
                else:
                    with conn.transaction():
                        conn.execute(DEFER)
                        conn.execute(ENQUEUE)
                    conn.execute(WAKE)
                mine.append(time.perf_counter() - began)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    start.wait()
    for thread in threads:
        thread.join()
    calls = [x for per in latencies for x in per]
    return {
        "scenario": "enqueue-wake",
        "case": mode,
        "sessions": sessions,
        "enqueues": len(calls),
        "enqueues_per_s": round(len(calls) / seconds, 1),
        **percentiles(calls),
        "loadavg": round(os.getloadavg()[0], 2),
    }


def _ratios(base: list[float], other: list[float]) -> list[float]:
    return [round(o / b, 2) for b, o in zip(base, other, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", help="a superuser DSN instead of an embedded server")
    args = parser.parse_args()
    server = Server(args.dsn)
    rates: dict[str, list[float]] = {"inline": [], "deferred": [], "client": []}
    try:
        for round_ in range(1, args.rounds + 1):
            for mode in rates:
                dsn = server.fresh_database(f"enqueue_wake_{mode}")
                sys_pgtick.install(dsn)
                record = enqueue_for(dsn, mode, args.seconds, args.sessions)
                rates[mode].append(float(record["enqueues_per_s"]))  # type: ignore[arg-type]
                print(json.dumps({**record, "round": round_}), flush=True)
        summary = {
            "scenario": "enqueue-wake",
            "case": "ratios",
            **{
                f"{mode}_vs_inline": [
                    round(m / i, 2) for i, m in zip(rates["inline"], rates[mode], strict=True)
                ]
                for mode in ("deferred", "client")
            },
        }
        print(json.dumps(summary), flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
