"""What the indexes of jobs.runs cost the updates of the hot path: a claim's and a
completion's UPDATE on a copy of jobs.runs with every index, against a copy with only the
four indexes that the claim and the completion themselves need.

    .venv/bin/python bench/profile_indexes.py [--dsn DSN] [--rounds 4] [--rows 20000]

A fresh database (embedded and throwaway unless ``--dsn``) gets pgtick's schema and two
tables made ``LIKE jobs.runs`` with its defaults and constraints: ``every-index`` with every
index of jobs.runs, ``hot-path`` with the primary key, ``runs_claim_idx``,
``runs_running_idx`` and ``runs_finished_idx`` only. Both are filled alike with QUEUED
ad-hoc runs. A PL/pgSQL loop per table then takes ``--rows`` of them a batch at a time, one
statement marking the batch RUNNING (as a claim does) and the next COMPLETED (as a
completion does), at batches of 1, 10 and 100; the two tables alternate, round after round.
The time is the server's clock around the loop, so neither the client nor the network counts.

Prints one JSON line per table, batch and round (µs per statement and per row updated), then
one per batch with the medians over the rounds and their ratio. Neither table is read by
anything else: the gap is what the indexes that serve other features (history, dashboards,
unique and idempotent runs, retries, dependencies) cost each claim and completion.
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

from bench import sys_pgtick
from bench.harness import Server, connect

HOT_PATH = ("runs_pkey", "runs_claim_idx", "runs_running_idx", "runs_finished_idx")
BATCHES = (1, 10, 100)
TABLES = ("every-index", "hot-path")

# One loop per table: `batches` claims and completions of `batch` rows each, from id `first`;
# returns the server time it took in microseconds.
LOOP = """
CREATE FUNCTION bench_idx.{name}(first bigint, batch integer, batches integer)
RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_began timestamptz := clock_timestamp();
BEGIN
    FOR i IN 0 .. batches - 1 LOOP
        v_ids := ARRAY(SELECT generate_series(first + i * batch, first + (i + 1) * batch - 1));
        UPDATE bench_idx.{table} AS r SET status = 'RUNNING', started_at = now(), worker = 'w'
         WHERE r.id = ANY (v_ids);
        UPDATE bench_idx.{table} AS r SET status = 'COMPLETED', finished_at = now()
         WHERE r.id = ANY (v_ids);
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - v_began) * 1e6;
END $$;
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="a superuser DSN instead of an embedded server")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", type=int, default=20000, help="rows updated per table, batch and round")
    args = parser.parse_args()
    if args.rounds < 1 or args.rows < max(BATCHES):
        parser.error(f"--rounds must be at least 1 and --rows at least {max(BATCHES)}")
    server = Server(args.dsn)
    try:
        dsn = server.fresh_database("profile_indexes")
        sys_pgtick.install(dsn)
        with connect(dsn) as conn:
            prepare(conn, args.rows * args.rounds * len(BATCHES))
            times: dict[tuple[str, int], list[float]] = {}
            first = 1
            for round_ in range(args.rounds):
                for batch in BATCHES:
                    batches = args.rows // batch
                    order = TABLES if round_ % 2 == 0 else TABLES[::-1]
                    for table in order:
                        row = conn.execute(
                            f"SELECT bench_idx.{table.replace('-', '_')}(%s, %s, %s)", (first, batch, batches)
                        ).fetchone()
                        assert row is not None
                        us = float(row[0])
                        times.setdefault((table, batch), []).append(us / (2 * batches))
                        print(
                            json.dumps(
                                {
                                    "table": table,
                                    "batch": batch,
                                    "round": round_ + 1,
                                    "us_per_statement": round(us / (2 * batches), 1),
                                    "us_per_row": round(us / (2 * batches * batch), 2),
                                    "loadavg": round(os.getloadavg()[0], 2),
                                }
                            ),
                            flush=True,
                        )
                    first += args.rows
            for batch in BATCHES:
                every = statistics.median(times[("every-index", batch)])
                hot = statistics.median(times[("hot-path", batch)])
                print(
                    json.dumps(
                        {
                            "batch": batch,
                            "every_index_us_per_statement": round(every, 1),
                            "hot_path_us_per_statement": round(hot, 1),
                            "hot_path_vs_every_index": round(hot / every, 3),
                        }
                    ),
                    flush=True,
                )
    finally:
        server.stop()
    return 0


def prepare(conn: psycopg.Connection[Any], rows: int) -> None:
    """The two tables, filled alike with ``rows`` QUEUED runs (ids 1 to rows), and their loops."""
    conn.execute("CREATE SCHEMA bench_idx")
    indexes = runs_indexes(conn, HOT_PATH)
    for table in TABLES:
        name = table.replace("-", "_")
        conn.execute(
            f"CREATE TABLE bench_idx.{name} (LIKE jobs.runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        for index, definition in indexes:
            if table == "every-index" or index in HOT_PATH:
                conn.execute(index_on(definition, index, f"bench_idx.{name}"))
        conn.execute(
            f"INSERT INTO bench_idx.{name} (id, kind, origin, queue) OVERRIDING SYSTEM VALUE"
            " SELECT g, 'noop', 'manual', 'default' FROM generate_series(1, %s) AS g",
            (rows,),
        )
        conn.execute(LOOP.format(name=name, table=name))
    conn.execute("VACUUM ANALYZE bench_idx.every_index")
    conn.execute("VACUUM ANALYZE bench_idx.hot_path")


def runs_indexes(conn: psycopg.Connection[Any], required: tuple[str, ...]) -> list[tuple[str, str]]:
    """The indexes of jobs.runs, name and definition; exits if one of ``required`` is missing."""
    indexes = conn.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index AS i"
        " JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = 'jobs.runs'::regclass"
    ).fetchall()
    missing = set(required) - {name for name, _ in indexes}
    if missing:
        raise SystemExit(f"jobs.runs has no index named {', '.join(sorted(missing))}")
    return [(str(name), str(definition)) for name, definition in indexes]


def index_on(definition: str, index: str, table: str) -> str:
    """The definition of jobs.runs's index ``index`` made for ``table`` instead (name left to it)."""
    return definition.replace(f"INDEX {index} ON jobs.runs", f"INDEX ON {table}", 1)


if __name__ == "__main__":
    sys.exit(main())
