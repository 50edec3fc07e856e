"""Server CPU per call of the API a worker and an enqueuer call one run at a time, this schema
against a baseline commit, alternated.

    .venv/bin/python bench/profile_calls.py --dsn DSN [--rounds 4] [--calls 1000]
                                            [--baseline REV]

DSN: a superuser DSN of a server on this machine (the backend's CPU time is read from /proc).
Two databases are created on it, one with this checkout's sql/ and one with the baseline's
(default: main), installed by its own sql/install.sql from ``git archive``. Each round
times, in one session with synchronous_commit off and after a warm-up that makes every plan
the session keeps: ``jobs.enqueue`` of a small payload, the same with an idempotency key
never used before (over a history of 30 days, each with 100 keyed runs), what
``Client.get_run`` sends for a live run (``jobs.get_run`` where the schema has it, else a read
of ``jobs.runs_all``), ``jobs.next_due()`` over a queue of future runs, ``jobs.heartbeat``
of one run, ``jobs.complete`` of one run, ``jobs.fail`` of one run whose kind's policy
allows a retry (so the retry row is inserted), and ``jobs.claim()`` of one run without a
worker name (the session's own name is then the worker). The two schemas
alternate, round after round, so that a burst of load elsewhere hits both. Prints one JSON
line per call: the median microseconds of backend CPU per call for each schema over the
rounds, every round's figure, their ratio and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg.types.json import Jsonb

from bench.harness import connect
from bench.profile_claim import alternating, backend_cpu, schemas

KIND = "noop"
WARM = 50


def measure(dsn: str, calls: int) -> dict[str, float]:
    """Microseconds of backend CPU per call of each API function, one fresh session."""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE jobs.runs CASCADE")
        conn.execute("DELETE FROM jobs.retry_policies")
        conn.execute("SELECT jobs.set_retry_policy(%s, max_attempts => 3)", (KIND,))
        # Runs to heartbeat, complete and fail: queued now, claimed below; and a queue of
        # future runs for next_due to look over.
        conn.execute(
            "INSERT INTO jobs.runs (kind, origin) SELECT %s, 'manual' FROM generate_series(1, %s)",
            (KIND, 4 * (calls + WARM)),
        )
        conn.execute(
            "INSERT INTO jobs.runs (kind, origin, scheduled_for)"
            " SELECT %s, 'manual', now() + g * interval '1 minute' FROM generate_series(1, 1000) AS g",
            (KIND,),
        )
        history = "SELECT FROM pg_inherits WHERE inhparent = 'jobs.run_history'::regclass"
        if not conn.execute(history).fetchone():
            conn.execute(
                "INSERT INTO jobs.runs (kind, status, started_at, finished_at, idempotency_key)"
                " SELECT %s, 'COMPLETED', now() - d * interval '1 day', now() - d * interval '1 day',"
                "        'moved-' || d || '-' || g"
                "   FROM generate_series(2, 31) AS d, generate_series(1, 100) AS g",
                (KIND,),
            )
            while conn.execute("SELECT jobs.archive(10000)").fetchone() != (0,):
                pass
        conn.execute("ANALYZE jobs.runs")
    per_call: dict[str, float] = {}
    fresh = os.urandom(4).hex()
    with connect(dsn) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET client_min_messages = warning")  # enqueue's notice about an unknown kind
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])
        # Three runs per call claimed for the calls on claimed runs, one left for the claim.
        runs: list[int] = []
        while len(runs) < 3 * (calls + WARM):
            batch = min(1000, 3 * (calls + WARM) - len(runs))
            more = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(%s, 'w')", (batch,))]
            if not more:
                raise SystemExit(f"claimed {len(runs)} runs, expected {3 * (calls + WARM)}")
            runs += more
        beat, done, failed = (iter(runs[i::3]) for i in range(3))
        has_get_run = conn.execute("SELECT to_regprocedure('jobs.get_run(bigint)') IS NOT NULL").fetchone()
        get_run = (
            "SELECT r.* FROM jobs.get_run(%s) AS r"
            if has_get_run == (True,)
            else "SELECT r.* FROM jobs.runs_all AS r WHERE r.id = %s"
        )

        steps: dict[str, Callable[[int], Any]] = {
            "enqueue": lambda i: conn.execute("SELECT (jobs.enqueue(%s, %s)).id", (KIND, Jsonb({"i": i}))),
            "enqueue_keyed": lambda i: conn.execute(
                "SELECT (jobs.enqueue(%s, %s, idempotency_key => %s)).id",
                (KIND, Jsonb({"i": i}), f"{fresh}-{i}"),
            ),
            "get_run": lambda i: conn.execute(get_run, (runs[0],)).fetchone(),
            "next_due": lambda i: conn.execute("SELECT next_at FROM jobs.next_due()"),
            "heartbeat": lambda i: conn.execute(
                "SELECT count(*) FROM jobs.heartbeat(%s, 'w')", ([next(beat)],)
            ),
            "complete": lambda i: conn.execute("SELECT jobs.complete(%s, 'w')", (next(done),)),
            "fail": lambda i: conn.execute(
                "SELECT (jobs.fail(%s, 'w', message => 'boom')).id", (next(failed),)
            ),
            "claim_unnamed": lambda i: conn.execute("SELECT id FROM jobs.claim()"),
        }
        for name, step in steps.items():
            for i in range(WARM):
                step(i)
            cpu = backend_cpu(pid)
            for i in range(calls):
                step(i)
            per_call[name] = (backend_cpu(pid) - cpu) / calls * 1e6
    return per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="superuser DSN of a server on this machine")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--baseline", default="main", help="commit to compare with (git archive)")
    args = parser.parse_args()
    dsns = schemas(args.dsn, "pgtick_calls", args.baseline)
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in dsns}
    loads: list[float] = []
    for n, name in alternating(list(dsns), args.rounds):
        try:
            for call, us in measure(dsns[name], args.calls).items():
                seen[name].setdefault(call, []).append(us)
        except psycopg.Error as exc:
            raise SystemExit(f"{name}: {exc}") from None
        loads.append(os.getloadavg()[0])
        print(f"round {n + 1} {name} done, load {loads[-1]:.1f}", file=sys.stderr, flush=True)
    for call in seen["this"]:
        this, base = seen["this"][call], seen[args.baseline][call]
        print(
            json.dumps(
                {
                    "call": call,
                    "this_cpu_us": round(statistics.median(this), 1),
                    "baseline_cpu_us": round(statistics.median(base), 1),
                    # (None where the baseline's median is under one tick of CPU accounting)
                    "ratio": round(statistics.median(this) / statistics.median(base), 3)
                    if statistics.median(base) > 0
                    else None,
                    "baseline": args.baseline,
                    "rounds_this": [round(x, 1) for x in this],
                    "rounds_baseline": [round(x, 1) for x in base],
                    "loadavg": [round(min(loads), 1), round(max(loads), 1)],
                }
            )
        )


if __name__ == "__main__":
    main()
