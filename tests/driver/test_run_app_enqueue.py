"""Under ``pgtick run``, job code enqueues follow-ups with ``app.enqueue`` although the app
was given no DSN: they go to the database the worker works on, and run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from harness import Database, processes, scalar, wait_for
from pgtick import Client


def test_a_job_enqueues_follow_ups_with_app_enqueue(
    db: Database, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with processes(tmp_path, db.dsn) as procs, Client(db.dsn) as client:
        procs.replica("fanout_app.py", "worker")
        parent = client.enqueue("fan-out", {"n": 3})

        def done() -> bool:
            # The leaves may run and complete before their parent's completion commits: the
            # worker reports outcomes apart from the job threads. So both are waited for.
            return bool(
                scalar(
                    conn,
                    "SELECT count(*) FILTER (WHERE kind = 'leaf' AND status = 'COMPLETED') = 3"
                    " AND bool_or(id = %s AND status = 'COMPLETED') FROM jobs.runs",
                    (parent.id,),
                )
            )

        try:
            wait_for("three leaf runs and their parent to complete", done, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{procs.tails()}") from None
        finished = client.get_run(parent.id)
        assert finished.status == "COMPLETED"
        assert sorted(finished.result) == sorted(
            r[0] for r in conn.execute("SELECT id FROM jobs.runs WHERE kind = 'leaf'").fetchall()
        )
