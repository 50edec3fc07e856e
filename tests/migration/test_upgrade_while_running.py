"""Upgrading pgtick while it runs, as a team deploys it.

The database holds the previous release's schema (installed with psql, as that release
documented) and is busy: a leader and two workers of the previous release's driver (its files
taken from the git history, so CI's fresh clone has them too) run per-second schedules (one
capped at one run, one whose first attempts fail and are retried) and a stream of ad-hoc runs
(some with unique keys, some under a per-key limit). Then this release's `pgtick migrate` runs
against the same database, and the old processes are replaced one by one by this release's
(a rolling deploy). Invariants (DESIGN 1-4): no run executed twice, every run ends once, no cap
or limit exceeded at any sampled instant, each occurrence materialized once with none skipped,
no process crashes or logs a traceback; and a migration that stalls behind an operator's open
transaction longer than a run's heartbeat timeout costs no live worker its run.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import (
    APPS,
    FAST,
    PGTICK,
    ROOT,
    SHORT_HEARTBEAT,
    Conn,
    Database,
    PgBouncer,
    Proc,
    Processes,
    Server,
    attempts,
    checkout_schema,
    env_for,
    pgtick,
    processes,
    psql_file,
    revision_before,
    scalar,
    start_sleepy_run,
    wait_finished,
    wait_for,
)
from pgtick import migrate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: The first migration of this release: the previous release is the tree just before it.
FIRST_OF_THIS_RELEASE = "0026_blank_keys.sql"
APP = str(APPS / "upgrade_app.py")
DEFINITIONS = ("every-second", "capped-every-second", "retried-every-second")
TENANTS = 3


def _previous_release(into: Path) -> tuple[Path, Path]:
    """The previous release's install.sql and driver directory, from the git history."""
    repo = migrate.schema_root()
    ref = revision_before(FIRST_OF_THIS_RELEASE)
    script = checkout_schema(ref, into)
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "driver"], cwd=repo, capture_output=True)
    assert archive.returncode == 0, archive.stderr.decode()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return script, into / "driver"


@dataclass
class Deployment:
    """The database at the previous release, and old and new `pgtick run` processes on it."""

    db: Database
    procs: Processes
    old_driver: Path
    directory: Path

    def start(self, label: str, *extra: str, old: bool) -> Proc:
        args = ["run", APP, "--dsn", self.db.dsn, *FAST, "--grace", "10s", *extra]
        if not old:
            return self.procs.start(label, args)
        log = self.directory / f"{label}.log"
        env = env_for(self.db.dsn)
        env["PYTHONPATH"] = os.pathsep.join([str(self.old_driver), str(ROOT / "tests")])
        with log.open("wb") as stderr:
            popen = subprocess.Popen(
                [*PGTICK, *args],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                cwd=self.directory,
                start_new_session=True,
            )
        proc = Proc(label, popen, log)
        self.procs.started.append(proc)
        return proc

    def migrate(self) -> subprocess.CompletedProcess[str]:
        """This release's `pgtick migrate`, a process of its own. Taking longer than four
        minutes fails with what it logged and what every session of the database held and
        waited for at that moment."""
        try:
            return subprocess.run(
                [*PGTICK, "migrate", "--dsn", self.db.dsn],
                capture_output=True,
                text=True,
                timeout=240,
                env=env_for(None),
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired as exc:
            said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
            raise AssertionError(
                f"pgtick migrate did not finish within 240 s; it said:\n{said}\n"
                f"the sessions of the database:\n{_sessions(self.db.dsn)}\n{self.procs.tails()}"
            ) from None


@pytest.fixture
def deployment(pg: Server, tmp_path: Path) -> Iterator[Deployment]:
    script, old_driver = _previous_release(tmp_path / "previous")
    database = pg.create_empty_database()
    try:
        installed = psql_file(database.dsn, script)
        assert installed.returncode == 0, f"installing the previous release: {installed.stderr}"
        with processes(tmp_path, database.dsn) as procs:
            yield Deployment(database, procs, old_driver, tmp_path)
    finally:
        pg.drop_database(database)


def _stop(proc: Proc) -> None:
    proc.send(signal.SIGTERM)
    code = proc.wait(60)
    assert code == 0, f"{proc.label} exited {code} on SIGTERM:\n{proc.tail()}"


def _works(conn: Conn, proc: Proc) -> None:
    """Wait until ``proc`` has executed a few runs."""
    worker = proc.worker_id
    count = "SELECT count(*) FROM public.executions WHERE worker = %s"
    wait_for(f"{proc.label} to work", lambda: scalar(conn, count, (worker,)) >= 5, 90)


def _seconds_pass(conn: Conn, seconds: int) -> None:
    """Wait until ``seconds`` more per-second occurrences have completed."""
    count = "SELECT count(*) FROM public.executions WHERE kind = 'tick'"
    until = int(scalar(conn, count)) + seconds
    wait_for(f"{seconds} more occurrences to complete", lambda: scalar(conn, count) >= until, 90)


# --- the load: ad-hoc runs and a sampler of caps, limits and lock waits ---------------------


#: Every definition above its cap and every key of the keyed kind above its limit of one, now.
OVER_SQL = """
SELECT 'definition ' || d.name, count(*), array_agg(r.id ORDER BY r.id), array_agg(r.worker ORDER BY r.id)
  FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id
 WHERE r.status = 'RUNNING' AND d.max_concurrent_runs IS NOT NULL
 GROUP BY d.name, d.max_concurrent_runs HAVING count(*) > d.max_concurrent_runs
UNION ALL
SELECT 'key ' || r.concurrency_key, count(*), array_agg(r.id ORDER BY r.id), array_agg(r.worker ORDER BY r.id)
  FROM jobs.runs AS r
 WHERE r.status = 'RUNNING' AND r.kind = 'keyed'
 GROUP BY r.concurrency_key HAVING count(*) > 1
"""

#: The pgtick sessions waiting for a lock right now: which (application name), how long, for
#: what and behind whom.
WAITS_SQL = """
SELECT a.application_name, extract(epoch FROM clock_timestamp() - a.query_start)::float8,
       (SELECT string_agg(l.mode || ' on ' || coalesce(l.relation::regclass::text, l.locktype), ', ')
          FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted)
       || ' behind ' || (SELECT string_agg(b.application_name, ', ')
                           FROM pg_stat_activity AS b WHERE b.pid = ANY (pg_blocking_pids(a.pid)))
  FROM pg_stat_activity AS a
 WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.application_name LIKE 'pgtick%'
"""


#: Each session of this database: who, in what state, for how long its transaction has been
#: open, what it waits for, the jobs relations it holds a lock on and its statement.
SESSIONS_SQL = """
SELECT a.pid, a.application_name, a.state, a.wait_event_type, a.wait_event,
       round(extract(epoch FROM clock_timestamp() - a.xact_start)::numeric, 1) AS xact_seconds,
       pg_blocking_pids(a.pid) AS blocked_by,
       (SELECT string_agg(l.mode || ' ' || l.relation::regclass::text
                          || CASE WHEN l.granted THEN '' ELSE ' (waiting)' END,
                          ', ' ORDER BY l.relation::regclass::text)
          FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
         WHERE l.pid = a.pid AND c.relnamespace = 'jobs'::regnamespace
           AND c.relkind IN ('r', 'v', 'p')) AS jobs_locks,
       left(a.query, 200) AS query
  FROM pg_stat_activity AS a
 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
 ORDER BY a.xact_start NULLS LAST
"""


def _sessions(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return "\n".join(repr(row) for row in conn.execute(SESSIONS_SQL).fetchall())


@dataclass
class Load:
    """Enqueues every few ms and samples caps and lock waits, on threads of their own."""

    dsn: str
    stop: threading.Event = field(default_factory=threading.Event)
    enqueued: list[int] = field(default_factory=list)
    enqueue_waits: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    over: list[Any] = field(default_factory=list)
    waits: dict[str, tuple[float, str]] = field(default_factory=dict)  # longest per session kind
    errors: list[str] = field(default_factory=list)
    samples: int = 0
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._enqueue, self._sample)]
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        assert not any(t.is_alive() for t in self.threads), "the load's threads did not stop"
        assert not self.errors, f"the load saw errors: {self.errors[:5]}"

    def _enqueue(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                n = 0
                while not self.stop.is_set():
                    n += 1
                    sent = time.monotonic()
                    if n % 3 == 0:
                        sql, params = (
                            "SELECT id FROM jobs.enqueue('keyed', concurrency_key => %s)",
                            (f"tenant-{n % TENANTS}",),
                        )
                    elif n % 5 == 0:  # a key enqueued twice: the second returns the first's run
                        sql, params = (
                            "SELECT id FROM jobs.enqueue('adhoc', unique_key => %s)",
                            (f"u{n // 10}",),
                        )
                    else:
                        sql, params = (
                            "SELECT id FROM jobs.enqueue('adhoc', payload => %s)",
                            (f'{{"n": {n}}}',),
                        )
                    row = conn.execute(sql, params).fetchone()
                    assert row is not None
                    self.enqueued.append(int(row[0]))
                    self.enqueue_waits.append((sent, time.monotonic() - sent))
                    self.stop.wait(0.01)
        except Exception as exc:
            self.errors.append(f"enqueue: {exc!r}")

    def _sample(self) -> None:
        try:
            with (
                psycopg.connect(self.dsn, autocommit=True) as activity,
                psycopg.connect(self.dsn, autocommit=True) as caps,
            ):
                caps.execute("SET lock_timeout = '200ms'")  # a locked jobs.runs changes nothing meanwhile
                while not self.stop.is_set():
                    for name, seconds, query in activity.execute(WAITS_SQL).fetchall():
                        who = name.split(" ")[0]
                        if seconds > self.waits.get(who, (0.0, ""))[0]:
                            self.waits[who] = (seconds, query)
                    try:
                        self.over.extend(caps.execute(OVER_SQL).fetchall())
                        self.samples += 1
                    except psycopg.errors.LockNotAvailable:
                        pass
                    self.stop.wait(0.02)
        except Exception as exc:
            self.errors.append(f"sampler: {exc!r}")


# --- what the database says at the end ------------------------------------------------------


def _runs(conn: Conn) -> list[dict[str, Any]]:
    cursor = conn.execute(
        """
        SELECT r.id, r.kind, d.name AS definition, r.scheduled_for, r.status::text AS status,
               r.attempt, r.retry_of, r.origin, r.failure_reason, r.worker,
               (SELECT count(*) FROM public.executions AS e WHERE e.run_id = r.id) AS executions
          FROM jobs.runs AS r LEFT JOIN jobs.definitions AS d ON d.id = r.definition_id
         ORDER BY r.id
        """
    )
    names = [c.name for c in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _settled(conn: Conn, cut_off: datetime) -> bool:
    """Every run due before the cut-off, and every retry of one, has finished."""
    return not scalar(
        conn,
        "SELECT count(*) FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING')"
        " AND (scheduled_for < %s OR retry_of IN (SELECT id FROM jobs.runs WHERE scheduled_for < %s))",
        (cut_off, cut_off),
    )


def _check_runs(
    runs: list[dict[str, Any]], enqueued: list[int], cut_off: datetime, coalesced: list[Any]
) -> None:
    by_id = {r["id"]: r for r in runs}
    due = [r for r in runs if r["scheduled_for"] < cut_off and r["retry_of"] is None]
    due += [r for r in runs if r["retry_of"] is not None and by_id[r["retry_of"]]["scheduled_for"] < cut_off]
    twice = [r for r in runs if r["executions"] > 1]
    assert not twice, f"runs executed more than once: {twice}"
    lost = [i for i in set(enqueued) if by_id[i]["status"] != "COMPLETED" or by_id[i]["executions"] != 1]
    assert not lost, f"ad-hoc runs not completed exactly once: {[by_id[i] for i in sorted(lost)][:10]}"
    reaped = [r for r in runs if r["failure_reason"] not in (None, "Error")]
    assert not reaped, f"runs reaped, timed out or skipped: {reaped}"
    for r in due:
        if r["kind"] == "retried" and r["attempt"] == 1:
            assert (r["status"], r["failure_reason"], r["executions"]) == ("FAILED", "Error", 1), r
            retry = [x for x in runs if x["retry_of"] == r["id"]]
            assert len(retry) == 1, f"run {r['id']} has retries {retry}"
            assert (retry[0]["status"], retry[0]["executions"]) == ("COMPLETED", 1), retry[0]
        elif r["status"] != "COMPLETED" or r["executions"] != 1:
            raise AssertionError(f"run due before the cut-off not completed exactly once: {r}")
    for name in DEFINITIONS:
        times = sorted(
            r["scheduled_for"] for r in runs if r["definition"] == name and r["origin"] == "schedule"
        )
        times = [t for t in times if t < cut_off]
        assert len(times) >= 10, f"{name}: too few occurrences: {times}"
        doubled = [t for t, n in Counter(times).items() if n > 1]
        assert not doubled, f"{name}: occurrences materialized more than once: {doubled}"
        gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=1)]
        gaps = [(a, b) for a, b in gaps if not any(a < first and last <= b for first, last in coalesced)]
        assert not gaps, f"{name}: occurrences skipped (no catch-up coalesced them): {gaps}"


def _no_errors_logged(procs: Processes) -> None:
    for proc in procs.started:
        text = proc.log()
        bad = [line for line in text.splitlines() if re.search(r"Traceback|CRITICAL| ERROR ", line)]
        assert not bad, f"{proc.label} logged errors or tracebacks:\n" + "\n".join(bad[:20])


def test_a_rolling_upgrade_under_load_loses_doubles_and_skips_nothing(deployment: Deployment) -> None:
    d = deployment
    with psycopg.connect(d.db.dsn, autocommit=True) as conn:
        conn.execute("SELECT jobs.set_limit('kind', 'keyed', max_running => 1, per_key => true)")
        leader = d.start("old-leader", old=True)
        workers = [d.start(f"old-worker{i}", "--no-scheduler", old=True) for i in (1, 2)]
        for proc in [leader, *workers]:
            assert proc.worker_id
        load = Load(d.db.dsn)
        load.start()
        try:
            for proc in (leader, *workers):
                _works(conn, proc)
            _seconds_pass(conn, 3)
            migrating = time.monotonic()
            result = d.migrate()
            migrated = time.monotonic()
            assert result.returncode == 0, f"pgtick migrate failed: {result.stdout}{result.stderr}"
            assert migrate.applied_versions(conn) == {m.version for m in migrate.migrations()}
            # A rolling deploy: each old process replaced by a new one, the leader last.
            for old, label, extra in (
                (workers[0], "new-worker1", ("--no-scheduler",)),
                (workers[1], "new-worker2", ("--no-scheduler",)),
                (leader, "new-leader", ()),
            ):
                _seconds_pass(conn, 2)
                new = d.start(label, *extra, old=False)
                _works(conn, new)
                _stop(old)
            _seconds_pass(conn, 3)
        finally:
            load.finish()
        cut_off: datetime = scalar(conn, "SELECT clock_timestamp()")
        wait_for("every run due before the cut-off to finish", lambda: _settled(conn, cut_off), 90)
        for proc in d.procs.started:
            if proc.popen.poll() is None:
                _stop(proc)
        runs = _runs(conn)
        coalesced = [(r[0], r[1]) for r in conn.execute("SELECT first_late, last_late FROM jobs.catch_ups")]
    detail = f"\n{d.procs.tails()}"
    _check_runs(runs, load.enqueued, cut_off, coalesced)
    assert not load.over, f"caps or limits exceeded (group, running, runs, workers): {load.over}{detail}"
    assert load.samples > 50, f"too few samples of caps and limits: {load.samples}"
    _no_errors_logged(d.procs)
    waits = [w for at, w in load.enqueue_waits if migrating - 1 <= at <= migrated]
    report = {
        "migrate_seconds": round(migrated - migrating, 2),
        "longest_enqueue_during_migrate": round(max(waits, default=0.0), 3),
        "longest_lock_waits": {k: (round(v[0], 3), v[1]) for k, v in sorted(load.waits.items())},
        "migrate_said": [line for line in result.stderr.splitlines() if "lock" in line],
        # A claim that the deadlock detector failed (the worker retries it): a lock cycle of a
        # claim with the migration's re-creation of the views that the claim reads.
        "claims_failed": [
            line
            for proc in d.procs.started
            for line in proc.log().splitlines()
            if re.search(r"deadlock|database error", line)
        ],
        "runs": len(runs),
        "samples": load.samples,
    }
    print(f"upgrade under load: {report}")


#: How long the operator's transaction holds the migration up: well past the run's heartbeat
#: timeout.
STALL_SECONDS = 4 * SHORT_HEARTBEAT


def _migrator_waits(conn: Conn) -> bool:
    return bool(
        scalar(
            conn,
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'pgtick' AND wait_event_type = 'Lock'",
        )
    )


def test_a_migration_held_up_longer_than_the_heartbeat_timeout_takes_no_run_from_a_live_worker(
    deployment: Deployment,
) -> None:
    """An operator's psql session left in a transaction that read the workers' view holds the
    migration up (it waits for the worker registry), and every session that touches what the
    migration has locked or waits for would queue behind it, for longer than the heartbeat
    timeout of a run that a live worker of the previous release is working (its heartbeat
    stamps the worker registry first, and waits for it; its reaper goes on meanwhile). The run
    must not be reaped: it completes once, on its first attempt, and the migration commits
    once the operator's transaction has ended."""
    d = deployment
    with psycopg.connect(d.db.dsn, autocommit=True) as conn:
        worker = d.start("old-worker", old=True)
        assert worker.worker_id
        run_id, pid = start_sleepy_run(conn, STALL_SECONDS + 6)
        wait_for(
            f"run {run_id} to heartbeat",
            lambda: scalar(conn, "SELECT heartbeat_at > started_at FROM jobs.runs WHERE id = %s", (run_id,)),
            timeout=60,
        )
        with psycopg.connect(d.db.dsn) as operator:
            operator.execute("SELECT * FROM jobs.workers").fetchall()
            results: list[subprocess.CompletedProcess[str]] = []
            migrator = threading.Thread(target=lambda: results.append(d.migrate()), daemon=True)
            migrator.start()
            wait_for("the migration to wait for the operator", lambda: _migrator_waits(conn), 90)
            held = time.monotonic()
            status = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,))
            assert status == "RUNNING", f"run {run_id} was {status} before the stall"
            time.sleep(max(0.0, held + STALL_SECONDS - time.monotonic()))
            assert not results, f"the migration did not wait for the operator's transaction: {results}"
            operator.rollback()
        migrator.join(240)
        assert results and results[0].returncode == 0, f"pgtick migrate failed: {results}"
        assert "waits for a lock" in results[0].stderr, f"the migration did not say it waited: {results}"
        status = wait_finished(conn, run_id, timeout=90)
        tries = attempts(conn, run_id)
        executions = conn.execute(
            "SELECT run_id, attempt, pid, outcome FROM public.executions WHERE kind = 'sleepy' ORDER BY id"
        ).fetchall()
    detail = f"attempts={tries} executions={executions}\n{d.procs.tails()}"
    assert status == "COMPLETED", f"a live worker's run was reaped during the migration: {detail}"
    assert len(tries) == 1, f"a retry of a live worker's run was queued: {detail}"
    assert [(e[0], e[2]) for e in executions] == [(run_id, pid)], detail
    _no_errors_logged(d.procs)


def test_a_migration_through_a_pooler_held_up_by_a_lock_holds_no_worker_up_behind_it(
    pg: Server, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    """Through a transaction-mode pooler `pgtick migrate` installs in one transaction; held up
    by an operator's transaction that read the workers' view, it must not keep a worker's
    write to the worker registry (what a previous release's heartbeat waits for) waiting
    behind it for longer than its bounded lock wait, and it commits once the operator ends."""
    script, _ = _previous_release(tmp_path / "previous")
    database = pg.create_empty_database()
    try:
        installed = psql_file(database.dsn, script)
        assert installed.returncode == 0, f"installing the previous release: {installed.stderr}"
        with (
            psycopg.connect(database.dsn, autocommit=True) as conn,
            database.connect(autocommit=False) as operator,
        ):
            operator.execute("SELECT * FROM jobs.workers").fetchall()
            results: list[subprocess.CompletedProcess[str]] = []
            migrator = threading.Thread(
                target=lambda: results.append(
                    pgtick("migrate", "--dsn", pgbouncer.dsn(database), timeout=240)
                ),
                daemon=True,
            )
            migrator.start()
            wait_for(
                "the migration to wait for the operator",
                lambda: (
                    results
                    or scalar(
                        conn,
                        "SELECT count(*) > 0 FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    )
                ),
                90,
            )
            assert not results, f"the migration did not wait for the operator's transaction: {results}"
            held = time.monotonic()
            longest = 0.0
            # Bounded, so that a write stuck behind the migration cannot hold the test up too.
            conn.execute(f"SET lock_timeout = '{STALL_SECONDS / 2}s'")
            while time.monotonic() < held + STALL_SECONDS:
                sent = time.monotonic()
                try:
                    conn.execute("UPDATE jobs.worker_registry SET last_seen_at = last_seen_at WHERE false")
                except psycopg.errors.LockNotAvailable:
                    pass
                longest = max(longest, time.monotonic() - sent)
                time.sleep(0.1)
            assert not results, f"the migration did not wait for the operator's transaction: {results}"
            operator.rollback()
        migrator.join(240)
        assert longest < STALL_SECONDS / 2, (
            f"a write to the worker registry waited {longest:.1f}s behind the held-up migration"
        )
        assert results and results[0].returncode == 0, f"pgtick migrate failed: {results}"
        assert "waits for a lock" in results[0].stderr, f"the migration did not say it waited: {results}"
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            assert migrate.applied_versions(conn) == {m.version for m in migrate.migrations()}
    finally:
        pg.drop_database(database)
