"""Through PgBouncer in transaction mode: the client, the CLI and `pgtick run` replicas.

Behind a transaction pooler a session is not the client's: the driver detects the
pooler, leads by the lease `pgtick:leader` instead of a session lock, polls instead of
LISTEN, and never prepares statements. A real PgBouncer (tests/harness.py: PgBouncer)
sits between every pgtick connection and the test server; job code records itself
over a direct connection.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from datetime import datetime
from typing import Any

import psycopg
import pytest

from harness import (
    APPS,
    FAST,
    Conn,
    Database,
    PgBouncer,
    Processes,
    Server,
    assert_each_occurrence_once,
    catch_up_windows,
    claim,
    enqueue,
    leader_to_kill,
    occurrences,
    pgtick,
    pid_of_owner,
    scalar,
    settle_after_failover,
    wait_for,
)
from pgtick import App, AsyncClient, Client, Context, calls
from pgtick.db import behind_pooler, connect
from pgtick.scheduler import Scheduler

TTL = 2.0

# This database's advisory locks (other tests may share the server).
ADVISORY_HERE = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


@pytest.fixture
def pooled(db: Database, pgbouncer: PgBouncer) -> str:
    return pgbouncer.dsn(db)


def lease_owners(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT owner FROM jobs.leases"
        " WHERE name = %s AND owner IS NOT NULL AND expires_at > clock_timestamp()",
        (calls.LEADER_LEASE,),
    ).fetchall()
    return [row[0] for row in rows]


def test_the_driver_tells_a_pooled_connection_from_a_direct_one(db: Database, pooled: str) -> None:
    with db.connect() as direct, connect(pooled) as through:
        assert not behind_pooler(direct)
        assert behind_pooler(through)
        assert through.prepare_threshold is None, "statements must not be prepared behind a pooler"


def test_pgtick_pooler_overrides_what_the_ports_say(
    db: Database, pooled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooler on the server's own port number (on another host) looks direct: the user says
    so, and the driver then prepares nothing, leads by lease and polls."""
    monkeypatch.setenv("PGTICK_POOLER", "1")
    with db.connect() as direct:
        assert behind_pooler(direct)
    with connect(db.dsn) as told:
        assert told.prepare_threshold is None, "a connection through a pooler must prepare nothing"
    monkeypatch.setenv("PGTICK_POOLER", "0")
    with connect(pooled) as through:
        assert not behind_pooler(through)


def test_pgtick_pooler_keeps_the_clients_of_both_kinds_from_preparing_statements(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection a Client or an AsyncClient opens from a conninfo (and each of the ASGI
    integration's pool) prepares nothing once PGTICK_POOLER says a pooler sits in front, as
    the driver's own connections do: a pooler on the server's port number looks direct."""
    monkeypatch.setenv("PGTICK_POOLER", "1")

    async def async_threshold() -> int | None:
        async with AsyncClient(db.dsn) as client:
            await client.enqueue("k")
            assert client._own is not None
            return client._own.prepare_threshold

    with Client(db.dsn) as client:
        client.enqueue("k")
        assert client._own is not None
        sync_threshold = client._own.prepare_threshold
    assert (sync_threshold, asyncio.run(async_threshold())) == (None, None), (
        "(Client, AsyncClient) prepare_threshold with PGTICK_POOLER=1: statements would be prepared"
    )


def test_client_enqueues_through_the_pooler_in_the_callers_transaction(db: Database, pooled: str) -> None:
    with Client(pooled) as client:
        ids = [client.enqueue("k", {"i": i}).id for i in range(12)]  # past psycopg's prepare threshold
    with psycopg.connect(pooled, prepare_threshold=None) as conn:
        client = Client(conn)
        kept = client.enqueue("k", {"tx": "commit"}, conn=conn)
        conn.commit()
        dropped = client.enqueue("k", {"tx": "rollback"}, conn=conn)
        conn.rollback()
    with db.connect() as direct:
        found = {r[0] for r in direct.execute("SELECT id FROM jobs.runs").fetchall()}
    assert found == {*ids, kept.id}, f"rolled back run {dropped.id} exists, or a committed one is missing"


def test_the_testing_helpers_run_due_jobs_through_the_pooler(db: Database, pooled: str) -> None:
    """pgtick.testing's tester claims and reports many runs on one connection through the
    pooler. Each job holds a transaction of another client open, so the server session the
    tester used last is busy and its next statement runs on another one: a statement it had
    prepared would not exist there."""
    # Imported here: tests/driver/test_testing.py loads it as a pytest plugin, and a module
    # imported before that could not have its asserts rewritten.
    from pgtick.testing import JobsTester

    app = App("through-the-pooler")
    held: list[psycopg.Connection[Any]] = []

    @app.job("holds-a-session")
    def holds_a_session(ctx: Context) -> int:
        other = psycopg.connect(pooled, prepare_threshold=None)
        held.append(other)
        other.execute("SELECT 1")  # its transaction stays open: its server session is taken
        return int(ctx.payload["i"])

    tester = JobsTester(pooled)
    try:
        for i in range(12):  # past psycopg's prepare threshold (5)
            tester.enqueue("holds-a-session", {"i": i})
        outcomes = tester.run_due(app)
    finally:
        for other in held:
            other.close()
        tester.close()
    assert [(o.status, o.result) for o in outcomes] == [("COMPLETED", i) for i in range(12)], outcomes


def test_cli_migrates_and_reports_through_the_pooler(pg: Server, pgbouncer: PgBouncer) -> None:
    empty = pg.create_empty_database()
    try:
        dsn = pgbouncer.dsn(empty)
        for argv in (["migrate"], ["migrate"], ["enqueue", "k"], ["status"], ["runs"]):
            result = pgtick(*argv, "--dsn", dsn)
            assert result.returncode == 0, f"pgtick {argv}: {result.stderr}"
        with empty.connect() as conn:
            assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1
            assert scalar(conn, "SELECT schema_version FROM jobs.version()") is not None
            locks = scalar(conn, ADVISORY_HERE)
        assert locks == 0, "a migrator left a session advisory lock on a pooled server connection"
    finally:
        pg.drop_database(empty)


def test_a_scheduler_behind_the_pooler_leads_by_lease_and_releases_it(db: Database, pooled: str) -> None:
    first = Scheduler(pooled, owner="first", tick_interval=0.2, lease_ttl=TTL)
    second = Scheduler(pooled, owner="second", tick_interval=0.2, lease_ttl=TTL)
    try:
        assert first.tick().leading and first.mode == "lease"
        assert not second.tick().leading
        assert first.tick().leading, "the leader renews its own lease"
        with db.connect() as conn:
            assert lease_owners(conn) == ["first"]
            held = scalar(conn, ADVISORY_HERE)
            assert held == 0, "a lease leader holds no session lock"
            # jobs.leader (the view the metrics, alerts and dashboard read) shows it, pid NULL.
            assert conn.execute("SELECT pid, owner FROM jobs.leader").fetchall() == [(None, "first")]
        first.close()
        with db.connect() as conn:
            assert conn.execute("SELECT * FROM jobs.leader").fetchall() == [], "released: nobody leads"
        assert second.tick().leading, "a released lease is free at once"
    finally:
        first.close()
        second.close()


def _start(procs: Any, label: str, dsn: str) -> Any:
    args = [
        "run",
        str(APPS / "ticker_app.py"),
        "--dsn",
        dsn,
        *FAST,
        "--grace",
        "5s",
        "--lease-ttl",
        f"{TTL}s",
    ]
    return procs.start(label, args)


def test_replicas_through_the_pooler_fail_over_within_the_lease_ttl(
    pooled: str, procs: Processes, conn: Conn
) -> None:
    # The job code records itself over the direct DSN; pgtick itself only sees PgBouncer.
    replicas = [_start(procs, f"replica{i}", pooled) for i in range(3)]
    workers = {r.pid: r.worker_id for r in replicas}
    for r in replicas:
        r.wait_log(r"leads by lease")
        r.wait_log(r"behind a pooler: polling")
    old, victim = leader_to_kill(procs, conn, lease_owners, workers)

    victim.send(signal.SIGKILL)
    killed = time.monotonic()
    samples: list[tuple[float, list[str]]] = []
    while True:
        owners = lease_owners(conn)
        elapsed = time.monotonic() - killed
        samples.append((round(elapsed, 3), owners))
        assert len(owners) <= 1, f"two leaders at once: {samples[-5:]}"
        if owners and owners != old:
            break
        assert elapsed < 20, f"no new leader 20 s after killing {old}: {samples[-5:]}\n{procs.tails()}"
        time.sleep(0.02)
    failover = elapsed
    since: datetime = scalar(conn, "SELECT clock_timestamp()")
    assert victim.wait(30) == -signal.SIGKILL
    settled_before = settle_after_failover(conn, since, workers[victim.pid])  # it goes on
    codes = procs.stop_all()
    runs = occurrences(conn)
    coalesced = catch_up_windows(conn)
    advisory = scalar(conn, ADVISORY_HERE)
    logs = procs.tails()

    print(f"\nfailover through PgBouncer after kill -9 of the lease leader: {failover:.3f}s (ttl {TTL}s)")
    survivors = {pid for pid in workers if pid != victim.pid}
    assert pid_of_owner(owners[0]) in survivors, f"new leader {owners} is not a survivor {survivors}"
    # The lease outlives its killed holder by at most its TTL; a follower takes it on its next
    # tick after that. The margin is for a loaded machine, where ticks come late.
    assert failover <= TTL + 4.0, f"new leader only after {failover:.2f}s (ttl {TTL}s): {samples[-5:]}"
    assert all(code == 0 for _, code in codes), f"exit codes {codes}\n{logs}"
    assert advisory == 0, "a replica behind the pooler took a session advisory lock"
    assert_each_occurrence_once(runs, settled_before, dead_worker=workers[victim.pid], coalesced=coalesced)
    assert not re.search(r"prepared statement .* does not exist", logs), logs


def test_no_listen_polls_on_a_direct_connection(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("ticker_app.py", "replica", "--no-listen")
    replica.wait_log(r"worker=\S+ started")
    wait_for(
        "a completed tick",
        lambda: scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'COMPLETED'"),
        20,
    )
    listening = scalar(
        conn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pgtick-listen%'",
    )
    procs.stop_all()
    assert listening == 0, "--no-listen still opened a listener connection"


def test_a_lease_leader_stops_its_tick_once_the_lease_may_have_expired(db: Database) -> None:
    """Fencing: the phases after materialization run only while the lease renewed at the
    start of the tick still holds (here a 1 ms lease, granted by a statement that takes
    20 ms, has lapsed by then, on both clocks: nothing is reaped and no renewal is
    tried); a lease that holds lets the same tick reap."""
    with db.connect() as conn:
        (run_id,) = (enqueue(conn), claim(conn))[1]
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (run_id,))
        conn.execute(
            "CREATE FUNCTION public.slow_lease() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(0.02); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER slow_lease BEFORE INSERT OR UPDATE ON jobs.leases"
            " FOR EACH ROW EXECUTE FUNCTION public.slow_lease()"
        )
    lapsing = Scheduler(db.dsn, owner="lapsing", tick_interval=0.2, leadership="lease", lease_ttl=0.001)
    holding = Scheduler(db.dsn, owner="holding", tick_interval=0.2, leadership="lease", lease_ttl=TTL)
    try:
        report = lapsing.tick()
        assert report.leading and report.reaped == [], report
        assert not lapsing.leading, "a leader whose lease may have lapsed no longer counts itself leading"
        with db.connect() as conn:
            assert scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,)) == "RUNNING"
        report = holding.tick()
        assert report.leading and [r["run_id"] for r in report.reaped] == [run_id], report
    finally:
        lapsing.close()
        holding.close()


def test_a_failing_phase_behind_the_pooler_is_reported_and_the_tick_goes_on(
    db: Database, pooled: str
) -> None:
    """Behind a transaction pooler each statement may reach another server connection, so a
    failing phase (here the reaper, refused by an operator's trigger) is judged by the
    connection alone, not by the backend pid it had at connect: the error is reported, the
    later phases run, and the leader keeps its lease and its unbroken leading."""
    with db.connect() as conn:
        (run_id,) = (enqueue(conn), claim(conn))[1]
        conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (run_id,))
        conn.execute(
            "CREATE FUNCTION public.no_reaping() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN IF NEW.status = 'FAILED' THEN RAISE EXCEPTION 'no_reaping: refused'; END IF;"
            " RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER no_reaping BEFORE UPDATE ON jobs.runs"
            " FOR EACH ROW EXECUTE FUNCTION public.no_reaping()"
        )
    scheduler = Scheduler(pooled, owner="pooled", tick_interval=0.2, lease_ttl=60)
    try:
        first = scheduler.tick()
        assert first.leading and scheduler.mode == "lease"
        assert [e.split(":")[0] for e in first.phase_errors] == ["reap"], first.phase_errors
        # Another client holds a server connection in a transaction (the pooler hands out the
        # most recently used one first: the leader's), so the leader's next statements reach
        # another backend.
        with psycopg.connect(pooled, autocommit=False, prepare_threshold=None) as other:
            other.execute("SELECT 1")
            report = scheduler.tick()
            assert report.leading and scheduler.leading, report
            assert [e.split(":")[0] for e in report.phase_errors] == ["reap"], report.phase_errors
            assert "no_reaping: refused" in report.phase_errors[0], report.phase_errors
            other.rollback()
        with db.connect() as conn:
            assert lease_owners(conn) == ["pooled"]
    finally:
        scheduler.close()
