"""Chaos soak: three `pgtick run` processes, ~50 definitions and a stream of
ad-hoc runs, while faults are injected at random — kill -9 of workers,
SIGSTOP/SIGCONT of the leader (with its session terminated: two leaders at
once), restarts of PostgreSQL itself, and dropped connections. Then a full
accounting from the database proves the invariants of DESIGN.md.

CI runs a short soak (PGTICK_SOAK_SECONDS, default 40); a long one is
`PGTICK_SOAK_SECONDS=1800 pytest -m chaos -s`. PGTICK_SOAK_REPORT=path writes
the figures as JSON (docs/reliability.md quotes them).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import APPS
from pgtick import migrate
from pgtick.embedded import EmbeddedPostgres

SOAK_SECONDS = float(os.environ.get("PGTICK_SOAK_SECONDS", "40"))
TICK = 0.3
HEARTBEAT_TIMEOUT = 2.0

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SOAK_SECONDS + 300)]


def _try(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
    """Run one statement on a fresh connection; None if the database is unavailable."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []
    except psycopg.Error:
        return None


class Fleet:
    """The three `pgtick run` replicas, restartable."""

    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn = dsn
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = open(self.logs / f"replica-{self.started}.log", "wb")
        env = dict(os.environ, CHAOS_DSN=self.dsn, PGTICK_LOG="INFO")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgtick.cli",
                "run",
                str(APPS / "soak_app.py"),
                "--dsn",
                self.dsn,
                "--tick",
                f"{TICK}s",
                "--poll",
                "0.5s",
                "--heartbeat",
                "0.3s",
                "--grace",
                "2s",
                "--concurrency",
                "6",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def by_pid(self, pid: int) -> subprocess.Popen[bytes] | None:
        return next((p for p in self.alive() if p.pid == pid), None)

    def stop(self) -> None:
        for p in self.alive():
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _leader_pid(dsn: str) -> int | None:
    rows = _try(dsn, "SELECT owner, pid FROM jobs.leader")
    if not rows or rows[0][0] is None:
        return None
    # owner is host-PID-random (pgtick.identity.new_worker_id)
    return int(str(rows[0][0]).rsplit("-", 2)[1])


def _setup(dsn: str) -> list[tuple[int, int, int | None]]:
    """Schema, the executions table, short timeouts and ~50 definitions."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.apply(conn)
        conn.execute(
            """
            CREATE SCHEMA chaos;
            CREATE TABLE chaos.executions (
                run_id bigint, definition_id bigint, kind text, attempt int, pid int,
                entered timestamptz NOT NULL DEFAULT clock_timestamp(), exited timestamptz);
            CREATE TABLE chaos.cap_violations (
                seen_at timestamptz DEFAULT clock_timestamp(), definition_id bigint,
                running bigint, cap int);
            """
        )
        conn.execute(
            "UPDATE jobs.config SET heartbeat_timeout = %s, orphan_timeout = '6 seconds'",
            (f"{HEARTBEAT_TIMEOUT} seconds",),
        )
        definitions = []
        for i in range(50):
            kind = rng.choice(["quick", "quick", "flaky", "long"])
            interval = rng.randint(1, 5)
            cap = rng.choice([1, 2, 3, None])
            overlap = "skip" if (cap and rng.random() < 0.3) else "queue"
            schedule = f"FREQ=SECONDLY;INTERVAL={interval}"
            zone = rng.choice(["UTC", "Europe/Sofia", "America/New_York", "Australia/Lord_Howe"])
            row = conn.execute(
                "SELECT id FROM jobs.define(%s, %s, %s, %s, max_concurrent_runs => %s, overlap_policy => %s)",
                (f"chaos-{i}", kind, schedule, zone, cap, overlap),
            ).fetchone()
            assert row is not None
            definitions.append((int(row[0]), interval, cap))
    return definitions


def test_chaos_soak(tmp_path: Path) -> None:
    server = EmbeddedPostgres(ephemeral=True, fast=True)
    dsn = server.start()
    faults: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    fleet = Fleet(dsn, tmp_path)
    enqueued = 0
    probe_samples = 0
    try:
        definitions = _setup(dsn)
        for _ in range(3):
            fleet.spawn()

        def enqueue_stream() -> None:
            nonlocal enqueued
            while not stop.wait(0.05):
                if _try(dsn, "SELECT jobs.enqueue('adhoc', '{}')") is not None:
                    enqueued += 1

        def cap_probe() -> None:
            nonlocal probe_samples
            while not stop.wait(0.05):
                rows = _try(
                    dsn,
                    "INSERT INTO chaos.cap_violations (definition_id, running, cap)"
                    " SELECT r.definition_id, count(*), d.max_concurrent_runs"
                    "   FROM jobs.runs r JOIN jobs.definitions d ON d.id = r.definition_id"
                    "  WHERE r.status = 'RUNNING' GROUP BY 1, 3"
                    " HAVING count(*) > d.max_concurrent_runs RETURNING definition_id",
                )
                if rows is not None:
                    probe_samples += 1

        def inject() -> None:
            rng = random.Random()
            while not stop.wait(rng.uniform(1.0, 3.0)):
                fault = rng.choice(["kill9", "kill9", "sigstop_leader", "restart_pg", "drop_conns"])
                if fault == "kill9":
                    victims = fleet.alive()
                    if victims:
                        victim = rng.choice(victims)
                        victim.kill()
                        victim.wait()
                        fleet.spawn()
                elif fault == "sigstop_leader":
                    pid = _leader_pid(dsn)
                    proc = fleet.by_pid(pid) if pid else None
                    if proc is None:
                        continue
                    proc.send_signal(signal.SIGSTOP)
                    time.sleep(rng.uniform(2 * TICK, 3.0))
                    if rng.random() < 0.6:  # its session dies: another replica leads meanwhile
                        _try(
                            dsn,
                            "SELECT pg_terminate_backend(l.pid) FROM jobs.leader l",
                        )
                        faults["leader_session_killed"] += 1
                        time.sleep(3 * TICK)
                    proc.send_signal(signal.SIGCONT)
                elif fault == "restart_pg":
                    server.restart()
                elif fault == "drop_conns":
                    _try(
                        dsn,
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name LIKE 'pgtick%%' AND random() < 0.3",
                    )
                faults[fault] += 1

        threads = [threading.Thread(target=f, daemon=True) for f in (enqueue_stream, cap_probe, inject)]
        for t in threads:
            t.start()
        time.sleep(SOAK_SECONDS)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        # Settle: full fleet, no faults, until the backlog due so far is worked off.
        while len(fleet.alive()) < 3:
            fleet.spawn()
        _try(dsn, "UPDATE jobs.definitions SET enabled = false")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = _try(
                dsn,
                "SELECT count(*) FROM jobs.runs"
                " WHERE status IN ('QUEUED', 'RUNNING') AND scheduled_for <= now()",
            )
            if rows is not None and rows[0][0] == 0:
                break
            time.sleep(0.5)
        fleet.stop()
        # Whatever the stopped replicas still held is the reaper's to hand on.
        for _ in range(20):
            time.sleep(HEARTBEAT_TIMEOUT / 2)
            _try(dsn, "SELECT jobs.reap()")
            left = _try(dsn, "SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING'")
            if left is not None and left[0][0] == 0:
                break

        report = _account(dsn, server, definitions)
        report.update(
            seconds=SOAK_SECONDS,
            faults=dict(faults),
            replicas_started=fleet.started,
            adhoc_enqueued=enqueued,
            cap_probe_samples=probe_samples,
        )
        print("\nchaos soak:", json.dumps(report, indent=1, default=str))
        if os.environ.get("PGTICK_SOAK_REPORT"):
            Path(os.environ["PGTICK_SOAK_REPORT"]).write_text(json.dumps(report, indent=1, default=str))
        assert sum(faults.values()) >= max(3, SOAK_SECONDS / 6), f"too few faults injected: {faults}"
        assert report["runs_completed"] > 100, report
        assert report["violations"] == {}, json.dumps(report["violations"], indent=1, default=str)
    finally:
        stop.set()
        fleet.stop()
        server.stop()


def _account(
    dsn: str, server: EmbeddedPostgres, definitions: list[tuple[int, int, int | None]]
) -> dict[str, Any]:
    violations: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:

        def q(sql: str) -> list[tuple[Any, ...]]:
            return conn.execute(sql).fetchall()

        # 1. Every occurrence materialized once, and none lost between first and last.
        dupes = q(
            "SELECT definition_id, scheduled_for, count(*) FROM jobs.runs WHERE origin = 'schedule'"
            " GROUP BY 1, 2 HAVING count(*) > 1"
        )
        if dupes:
            violations["occurrence_materialized_twice"] = dupes[:20]
        # A gap is allowed only where a recorded catch-up coalesced the occurrences a
        # stalled or stopped scheduler found late (misfire_policy coalesce, the default):
        # it resumed from the occurrence after a and ran one run at b.
        gaps = []
        for definition_id, interval, _ in definitions:
            times = [
                r[0]
                for r in conn.execute(
                    "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s AND origin = 'schedule'"
                    " ORDER BY 1",
                    (definition_id,),
                )
            ]
            coalesced = {
                (r[0], r[1])
                for r in conn.execute(
                    "SELECT resumed_from, last_late FROM jobs.catch_ups WHERE definition_id = %s",
                    (definition_id,),
                )
            }
            for a, b in itertools.pairwise(times):
                if (b - a).total_seconds() != interval and (
                    a + timedelta(seconds=interval),
                    b,
                ) not in coalesced:
                    gaps.append((definition_id, a, b))
        if gaps:
            violations["occurrence_gaps"] = gaps[:20]
        # 2. No run executed twice (each run id is entered by one execution only).
        twice = q("SELECT run_id, array_agg(pid) FROM chaos.executions GROUP BY 1 HAVING count(*) > 1")
        if twice:
            violations["run_executed_twice"] = twice[:20]
        # 3. Caps never exceeded (probe samples during the soak).
        over = q("SELECT definition_id, running, cap, seen_at FROM chaos.cap_violations LIMIT 20")
        if over:
            violations["cap_exceeded"] = over
        # 4. Nothing lost: every run terminal with a reason, or still queued for later.
        live = q("SELECT id, status::text, worker FROM jobs.runs WHERE status = 'RUNNING'")
        if live:
            violations["still_running_after_settle"] = live[:20]
        unreasoned = q("SELECT id FROM jobs.runs WHERE status = 'FAILED' AND failure_reason IS NULL")
        if unreasoned:
            violations["failed_without_reason"] = unreasoned[:20]
        exited_not_done = q(
            "SELECT e.run_id, r.status::text FROM chaos.executions e JOIN jobs.runs r ON r.id = e.run_id"
            " WHERE e.exited IS NOT NULL AND r.status IN ('QUEUED', 'RUNNING')"
        )
        if exited_not_done:
            violations["finished_execution_not_recorded"] = exited_not_done[:20]
        due_left = q(
            "SELECT count(*) FROM jobs.runs"
            " WHERE status = 'QUEUED' AND scheduled_for <= now() - interval '5 s'"
        )[0][0]
        if due_left:
            violations["due_runs_never_claimed"] = due_left
        # 5. Retries linked: each attempt n+1 points at a FAILED attempt n of the same kind.
        bad_links = q(
            "SELECT r.id, r.attempt, p.id, p.attempt, p.status::text FROM jobs.runs r"
            " LEFT JOIN jobs.runs p ON p.id = r.retry_of"
            " WHERE r.attempt > 1 AND (p.id IS NULL OR p.attempt <> r.attempt - 1"
            "       OR p.status <> 'FAILED' OR p.kind <> r.kind)"
        )
        if bad_links:
            violations["broken_retry_links"] = bad_links[:20]
        stats = dict(q("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1"))
        reasons = dict(
            q("SELECT failure_reason, count(*) FROM jobs.runs WHERE failure_reason IS NOT NULL GROUP BY 1")
        )
        retries = q("SELECT count(*) FROM jobs.runs WHERE attempt > 1")[0][0]
        executions = q("SELECT count(*) FROM chaos.executions")[0][0]
    # 6. No deadlocks or lock timeouts in the server log.
    log_lines = (server.data_dir / "log").read_text(errors="replace").splitlines()
    bad_lines = [
        "\n".join(log_lines[i : i + 6])  # the error with its DETAIL and STATEMENT lines
        for i, line in enumerate(log_lines)
        if "deadlock detected" in line or "lock timeout" in line or "canceling statement due to lock" in line
    ]
    if bad_lines:
        violations["server_log"] = bad_lines[:20]
    return {
        "violations": violations,
        "runs_by_status": stats,
        "failure_reasons": reasons,
        "runs_completed": stats.get("COMPLETED", 0),
        "retries": retries,
        "executions": executions,
    }
