"""Bare SQL: the classic SKIP LOCKED queue on a minimal table, no caps, no fencing, no
retries. It is the ceiling of the approach on this machine, not a product."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.harness import Control, Drain, claim_loops, connect, report_ready, worker_process

SCHEMA = """
CREATE TABLE bare_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    worker text
);
CREATE INDEX bare_jobs_queued_idx ON bare_jobs (id) WHERE status = 'queued';
"""

CLAIM_SQL = """
UPDATE bare_jobs SET status = 'running', started_at = now(), worker = %s
 WHERE id IN (SELECT id FROM bare_jobs WHERE status = 'queued'
               ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id
"""
COMPLETE_SQL = "UPDATE bare_jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s)"

DRAIN = Drain(
    remaining_sql="SELECT count(*) FROM bare_jobs WHERE status <> 'done'",
    last_finished_sql="SELECT max(finished_at) FROM bare_jobs",
    done_sql="SELECT count(*) FROM bare_jobs WHERE status = 'done'",
)


def install(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(SCHEMA)


def fill(dsn: str, jobs: int) -> None:
    with connect(dsn) as conn:
        conn.execute("INSERT INTO bare_jobs (status) SELECT 'queued' FROM generate_series(1, %s)", (jobs,))
        conn.execute("ANALYZE bare_jobs")


@worker_process
def sql_worker(control: Control, index: int, dsn: str, batch: int, threads: int) -> None:
    """``threads`` threads, each with its own connection: claim up to ``batch``, complete them."""

    def step(i: int, conn: psycopg.Connection[Any]) -> int:
        ids = [r[0] for r in conn.execute(CLAIM_SQL, (f"bare-{os.getpid()}-{i}", batch))]
        if ids:
            conn.execute(COMPLETE_SQL, (ids,))
        return len(ids)

    claim_loops(control, index, dsn, threads, step)


# -- latency: LISTEN/NOTIFY wake-up -------------------------------------------------------

ENQUEUE_SQL = """
WITH j AS (INSERT INTO bare_jobs (payload) VALUES (%s) RETURNING id)
SELECT pg_notify('bare_jobs', j.id::text) FROM j
"""


def enqueue_one(conn: psycopg.Connection[Any], i: int) -> None:
    conn.execute(ENQUEUE_SQL, (Jsonb({"i": i, "t": time.time()}),))


@worker_process
def listen_worker(control: Control, index: int, dsn: str, batch: int = 10) -> None:
    """A listener thread wakes one claimer; the claimer drains the queue, then waits again."""
    wake = threading.Event()
    starts: list[tuple[int, float, float]] = []
    claim = CLAIM_SQL.replace("RETURNING id", "RETURNING id, payload")

    def listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as lconn:
            lconn.execute("LISTEN bare_jobs")
            while not control.stop.is_set():
                for _ in lconn.notifies(timeout=0.5, stop_after=1):
                    wake.set()

    report_ready(control, index)
    control.go.wait()
    threading.Thread(target=listen, daemon=True).start()
    worker = f"bare-{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not control.stop.is_set():
            wake.clear()
            while True:
                rows = conn.execute(claim, (worker, batch)).fetchall()
                if not rows:
                    break
                now = time.time()
                starts.extend((int(p.get("i", -1)), float(p.get("t", 0.0)), now) for _, p in rows)
                conn.execute(COMPLETE_SQL, ([r[0] for r in rows],))
            wake.wait(1.0)
    control.out.put({"index": index, "starts": starts})


DB_LATENCY_SQL = (
    "SELECT extract(epoch FROM started_at - created_at)::float8 FROM bare_jobs WHERE started_at IS NOT NULL"
)
