"""What every test uses: a real PostgreSQL server, a migrated template, one database per
test; queries and seeding; races that start together; real ``pgtick`` processes.

The server comes from ``PGTICK_TEST_DSN`` (any database on a server where we
may create databases and roles) or, without it, an embedded throwaway server
from the ``pgserver`` wheel running with fsync off. The fixtures built on it
(``pg``, ``db``, ``conn``) live in tests/fixtures/, listed in tests/conftest.py.

Seeding goes straight into the tables as the superuser (the fixtures' DSN), so
a test sets up exactly the state it needs; everything under test goes through
the public ``jobs.*`` functions. Processes started with ``run_in_processes``
meet at a start gate (an advisory lock) so a race really is a race and does not
depend on how fast each child spawns.

``Processes`` (the ``procs`` fixture, tests/fixtures/processes.py) starts real
processes (`pgtick run` replicas, `pgtick lock`), each in its own session (process
group) with stderr logged to a file under the test's tmp dir; it kills whatever is
still alive when the test ends, whatever happened, and failing tests quote the log
tails. The job code of tests/apps records each execution in the test database;
``wait_started``, ``wait_finished``, ``executions``, ``compensations`` and
``cancel_a_running_job`` read it back. Replicas run with short
timings (tick/poll 0.2 s, heartbeat 0.3 s) and with ``PGTICK_APP_DSN`` set so
job code in tests/apps can record itself.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.sql import SQL, Identifier

from pgtick import migrate

if TYPE_CHECKING:
    from pgtick.embedded import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent
#: The job modules `pgtick run` loads in the process tests.
APPS = ROOT / "tests" / "apps"
PGTICK = [sys.executable, "-m", "pgtick.cli"]
FAST = ["--tick", "0.2s", "--poll", "0.2s", "--heartbeat", "0.3s"]
Conn = psycopg.Connection[Any]

#: Advisory lock key of the start gate (any key the SQL core does not use).
GATE_KEY = 740_011

#: Far-future run_at for definitions that only exist to carry a cap or a policy.
NEVER = "2999-01-01 00:00:00+00"
TEST_ROLES = {
    "pgtick_t_reader": "jobs_reader",
    "pgtick_t_worker": "jobs_worker",
    "pgtick_t_operator": "jobs_operator",
    "pgtick_t_nobody": None,
}
_counter = itertools.count()
T = TypeVar("T")


def dsn_for(base: str, dbname: str, **extra: Any) -> str:
    return make_conninfo(base, dbname=dbname, **extra)


@dataclass
class Database:
    """One test database cloned from the migrated template."""

    name: str
    dsn: str

    def connect(self, *, autocommit: bool = True, **kw: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=autocommit, **kw)

    def dsn_as(self, user: str) -> str:
        return make_conninfo(self.dsn, user=user)

    def worker_login(self, label: str) -> AbstractContextManager[str]:
        """A LOGIN role that is a member of jobs_worker and nothing else, dropped at the end."""
        return self._login(label, grant="jobs_worker")

    def login_without_grants(self, label: str) -> AbstractContextManager[str]:
        """A LOGIN role granted none of pgtick's roles, dropped at the end."""
        return self._login(label)

    @contextmanager
    def _login(self, label: str, *, grant: str | None = None) -> Iterator[str]:
        """A LOGIN role, a member of ``grant`` if given; at the end its sessions are ended and
        it is dropped."""
        name = f"pgtick_t_{label}_{os.getpid()}"
        with self.connect() as admin:
            admin.execute(SQL("DROP ROLE IF EXISTS {}").format(Identifier(name)))
            admin.execute(SQL("CREATE ROLE {} LOGIN").format(Identifier(name)))
            if grant is not None:
                admin.execute(SQL("GRANT {} TO {}").format(Identifier(grant), Identifier(name)))
        try:
            yield name
        finally:
            with self.connect() as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
                )
                admin.execute(SQL("DROP ROLE IF EXISTS {}").format(Identifier(name)))

    def psql(self, sql: str, *, user: str | None = None, check: bool = True) -> str:
        """Run SQL through the psql binary (tuples only, unaligned, '|' separated)."""
        dsn = self.dsn_as(user) if user else self.dsn
        proc = subprocess.run(
            [psql_binary(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"psql failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout.strip() if check else proc.stdout + proc.stderr


def psql_binary() -> str:
    found = os.environ.get("PGTICK_PSQL") or shutil.which("psql")
    if found:
        return found
    from pgserver._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / "psql")


def psql_script_args(dsn: str, script: Path) -> list[str]:
    """psql running ``script`` against ``dsn``, stopping at the first error."""
    return [psql_binary(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)]


def psql_file(dsn: str, script: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``script`` through psql to completion (check ``returncode``; stderr says why)."""
    return subprocess.run(psql_script_args(dsn, script), capture_output=True, text=True, timeout=timeout)


class Server:
    """A PostgreSQL server the tests may create databases on."""

    def __init__(self, admin_dsn: str, embedded: Any = None) -> None:
        self.admin_dsn = admin_dsn
        self.embedded = embedded
        self.template = f"pgtick_tpl_{os.getpid()}"

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_dsn, autocommit=True)

    def version(self) -> int:
        with self.admin() as conn:
            row = conn.execute("SHOW server_version_num").fetchone()
        assert row is not None
        return int(row[0]) // 10000

    def build_template(self) -> None:
        # Roles are cluster-wide: test sessions sharing one server (pytest -n with
        # PGTICK_TEST_DSN) build their templates one at a time, under a lock in the admin
        # database they all connect to, held until this connection closes.
        with self.admin() as lock:
            lock.execute("SELECT pg_advisory_lock(hashtextextended('pgtick tests: template', 0))")
            with self.admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{self.template}"')
            with psycopg.connect(dsn_for(self.admin_dsn, self.template), autocommit=True) as conn:
                migrate.apply(conn)
            with self.admin() as conn:
                for role, member_of in TEST_ROLES.items():
                    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                    if not exists:
                        conn.execute(f"CREATE ROLE {role} LOGIN")
                    if member_of:
                        conn.execute(f"GRANT {member_of} TO {role}")

    def create_database(self, template: str | None = None) -> Database:
        name = f"pgtick_t_{os.getpid()}_{next(_counter)}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template or self.template}"')
        return Database(name, dsn_for(self.admin_dsn, name))

    def create_empty_database(self) -> Database:
        name = f"pgtick_e_{os.getpid()}_{next(_counter)}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return Database(name, dsn_for(self.admin_dsn, name))

    @contextmanager
    def database(self) -> Iterator[Database]:
        """A database cloned from the migrated template, dropped when the block ends."""
        database = self.create_database()
        try:
            yield database
        finally:
            self.drop_database(database)

    def drop_database(self, db: Database) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')

    def close(self) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        if self.embedded is not None:
            self.embedded.stop()


@contextmanager
def server() -> Iterator[Server]:
    dsn = os.environ.get("PGTICK_TEST_DSN")
    if dsn:
        srv = Server(dsn)
    else:
        from pgtick.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(ephemeral=True, fast=True)
        srv = Server(embedded.start(), embedded)
    try:
        srv.build_template()
        yield srv
    finally:
        srv.close()


@contextmanager
def migrated_server(*setup: str) -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A migrated embedded server of the caller's own, for a test that stops, freezes or
    restarts it, and its DSN; `setup` statements run once after migrating."""
    from pgtick.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(ephemeral=True, fast=True)
    dsn = embedded.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.apply(conn)
            for statement in setup:
                conn.execute(statement.encode())
        yield embedded, dsn
    finally:
        embedded.stop()


def notifications_until_sentinel(listener: psycopg.Connection[Any]) -> list[str]:
    """The payloads of the notifications a listener of channel jobs gets up to a NOTIFY whose
    payload is 'sentinel', sent after what is being watched (notifications arrive in commit
    order: what arrives before the sentinel was committed before it)."""
    got: list[str] = []
    for n in listener.notifies(timeout=30.0):
        if n.payload == "sentinel":
            return got
        got.append(n.payload)
    raise AssertionError(f"the sentinel never arrived; got {got}")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def _call(payload: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    fn, args = payload
    return fn(*args)


def run_in_processes(
    fn: Callable[..., Any], arg_tuples: Iterable[tuple[Any, ...]], *, timeout: float = 240
) -> list[Any]:
    """Run ``fn(*args)`` for each args tuple in its own spawned process, all at once.

    ``fn`` must be a module-level function. Returns the results in order; an
    exception in any child is re-raised here.
    """
    jobs = list(arg_tuples)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=len(jobs)) as pool:
        pending = pool.map_async(_call, [(fn, args) for args in jobs])
        return list(pending.get(timeout=timeout))


def race(
    dsn: str, fn: Callable[..., Any], arg_tuples: Iterable[tuple[Any, ...]], *, timeout: float = 240
) -> list[Any]:
    """``run_in_processes`` behind the start gate: every child calls ``wait_at_gate`` on its
    connection (or connects with ``gated``), and all of them are let go at once when the last
    one waits there."""
    jobs = list(arg_tuples)
    with start_gate(dsn, len(jobs)):
        return run_in_processes(fn, jobs, timeout=timeout)


def race_parts(
    dsn: str, parts: Iterable[tuple[Callable[..., Any], tuple[Any, ...]]], *, timeout: float = 240
) -> list[Any]:
    """``race`` of different roles: each part is a module-level function and its arguments."""
    return race(dsn, _call, [(part,) for part in parts], timeout=timeout)


def repeat_for(dsn: str, seconds: float, step: Callable[[Conn], int]) -> int:
    """Call ``step`` again and again on one autocommit connection to ``dsn`` until ``seconds``
    have passed; the sum of what it returned (what the calls did, for a race's report)."""
    done = 0
    deadline = time.monotonic() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            done += step(conn)
    return done


def scalar(conn: Conn, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
    """First column of the first row; None when there is no row (a condition not met yet)."""
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def rows(conn: Conn, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """All rows as dicts."""
    cur = conn.execute(sql, params)
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def one(conn: Conn, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> dict[str, Any]:
    """Exactly one row as a dict."""
    got = rows(conn, sql, params)
    assert len(got) == 1, f"{sql!r} returned {len(got)} rows: {got!r}"
    return got[0]


def enqueue(conn: Conn, kind: str = "k", payload: str = "{}", run_at: str = "now()", **named: str) -> int:
    """jobs.enqueue; ``run_at`` and the ``named`` arguments are SQL expressions."""
    rest = "".join(f", {name} => {value}" for name, value in named.items())
    return int(scalar(conn, f"SELECT id FROM jobs.enqueue(%s, %s::jsonb, {run_at}{rest})", (kind, payload)))


def claim(conn: Conn, worker: str = "w", batch: int = 1, kinds: list[str] | None = None) -> list[int]:
    got = conn.execute("SELECT id FROM jobs.claim(%s, %s, %s)", (batch, worker, kinds)).fetchall()
    return [int(r[0]) for r in got]


def finish_old(
    conn: Conn,
    count: int,
    *,
    age: str,
    status: str = "COMPLETED",
    kind: str = "k",
    definition_id: int | None = None,
) -> list[int]:
    """Insert ``count`` runs that reached ``status`` ``age`` ago (oldest first, 1 s apart)."""
    reason = "'Error'" if status == "FAILED" else "NULL"
    got = conn.execute(
        f"""
        INSERT INTO jobs.runs (definition_id, kind, status, scheduled_for, created_at, started_at,
                               finished_at, worker, failure_reason)
        SELECT %s, %s, %s::jobs.run_status, t - interval '1 minute', t - interval '1 minute',
               t - interval '30 seconds', t, 'old-worker', {reason}
          FROM (SELECT now() - %s::interval - (%s - g) * interval '1 second' AS t, g
                  FROM generate_series(1, %s) AS g) AS s
         ORDER BY g
        RETURNING id
        """,
        (definition_id, kind, status, age, count, count),
    ).fetchall()
    return sorted(int(r[0]) for r in got)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """Kill a test's child process (and its process group) if it is still alive."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def terminate(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then ``grace`` seconds to exit before SIGKILL."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


def add_definition(
    conn: Conn,
    name: str,
    *,
    kind: str | None = None,
    cap: int | None = None,
    overlap: str = "queue",
    priority: int = 0,
) -> int:
    """A disabled one-shot definition far in the future: a holder for a cap and a policy."""
    return int(
        scalar(
            conn,
            """
            INSERT INTO jobs.definitions
                (name, kind, run_at, enabled, max_concurrent_runs, overlap_policy, priority)
            VALUES (%s, %s, %s, false, %s, %s, %s)
            RETURNING id
            """,
            (name, kind or name, NEVER, cap, overlap, priority),
        )
    )


def add_runs(
    conn: Conn,
    count: int,
    *,
    kind: str = "k",
    definition_id: int | None = None,
    priority: int = 0,
    origin: str = "manual",
    start: str = "1 hour",
) -> list[int]:
    """Insert ``count`` due QUEUED runs; scheduled_for rises with the id (now() - start + n ms)."""
    rows = conn.execute(
        """
        INSERT INTO jobs.runs (definition_id, kind, priority, origin, scheduled_for)
        SELECT %s, %s, %s, %s, now() - %s::interval + g * interval '1 millisecond'
          FROM generate_series(1, %s) AS g
        ORDER BY g
        RETURNING id
        """,
        (definition_id, kind, priority, origin, start, count),
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


def materialize_occurrences(conn: Conn, definition_id: int, occurrences: list[Any], cursor: Any) -> None:
    """The scheduler's two calls for a definition: its cursor set at the first occurrence, then
    the runs of these occurrences (each delayed by the definition's jitter), the cursor left at
    ``cursor``."""
    conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (definition_id, occurrences[0]))
    conn.execute(
        "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)",
        (definition_id, occurrences[0], occurrences, cursor),
    )


def runs_in(conn: Conn, status: str) -> int:
    """How many runs have ``status``."""
    return int(scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = %s::jobs.run_status", (status,)))


def run_row(conn: Conn, run_id: int) -> dict[str, Any]:
    """One jobs.runs row as a dict (column name -> value)."""
    cur = conn.execute("SELECT * FROM jobs.runs WHERE id = %s", (run_id,))
    row = cur.fetchone()
    assert row is not None, f"run {run_id} does not exist"
    assert cur.description is not None
    return {col.name: value for col, value in zip(cur.description, row, strict=True)}


def spring_forward_zone(conn: Conn, *, ahead: bool = False) -> str:
    """A POSIX time zone (UTC in winter, UTC+1 in summer) whose clocks went forward twelve
    hours before the server's now(): in a session set to it, ``now() - interval '1 day'`` is
    23 hours back, not 24 (PostgreSQL steps back a calendar day in the session's zone). With
    ``ahead``, the clocks go forward twelve hours after now(): ``now() + interval '1 day'`` is
    23 hours on."""
    now: datetime = scalar(conn, "SELECT now()")
    at = now.astimezone(UTC) + timedelta(hours=12 if ahead else -12)
    day = at.timetuple().tm_yday - 1  # POSIX n: the day of the year from 0, February 29 counted
    zone = f"XST0XDT,{day}/{at.hour},{(day + 180) % 365}/0"
    step = "(now() + interval '1 day') - now()" if ahead else "now() - (now() - interval '1 day')"
    with conn.transaction():
        conn.execute(f"SET LOCAL TIME ZONE '{zone}'")
        gap = scalar(conn, f"SELECT {step}")
    assert gap == timedelta(hours=23), (
        f"zone {zone}: a day {'on' if ahead else 'back'} is {gap}, not 23 hours"
    )
    return zone


def digest(conn: Conn) -> dict[str, Any]:
    """Row counts and content hashes of every jobs table: equal digests mean nothing changed."""
    out: dict[str, Any] = {}
    for table in ("runs", "definitions", "retry_policies", "config", "leases", "limits", "paused_queues"):
        count, md5 = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM jobs.{table} AS t"
        ).fetchone() or (None, None)
        out[table] = (count, md5)
    return out


def expect_error(
    conn: Conn,
    sql: str,
    params: Sequence[Any] | dict[str, Any] | None,
    sqlstate: str,
    *mentions: str,
) -> psycopg.Error:
    """Run sql, expect it to fail with sqlstate and a message naming each of ``mentions``."""
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, params)
    err = info.value
    message = err.diag.message_primary or str(err)
    assert err.sqlstate == sqlstate, (
        f"{sql} {params!r}: expected SQLSTATE {sqlstate}, got {err.sqlstate}: {message}"
    )
    for word in mentions:
        assert word in message, f"{sql} {params!r}: message {message!r} does not name {word!r}"
    return err


@contextmanager
def start_gate(dsn: str, parties: int, timeout: float = 90) -> Iterator[None]:
    """Hold the gate shut until ``parties`` sessions wait at it (see ``wait_at_gate``).

    Children take a shared lock on GATE_KEY, which blocks while we hold it
    exclusively; a watcher thread opens the gate once all of them are queued.
    """
    holder = psycopg.connect(dsn, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))

    def open_when_all_wait() -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as watch:
            while time.monotonic() < deadline:
                waiting = scalar(
                    watch,
                    """
                    SELECT count(*) FROM pg_locks AS l
                     WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = %s
                       AND l.database = (SELECT oid FROM pg_database
                                          WHERE datname = current_database())
                    """,
                    (GATE_KEY,),
                )
                if waiting >= parties:
                    break
                time.sleep(0.01)
        holder.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))

    opener = threading.Thread(target=open_when_all_wait, name="start-gate", daemon=True)
    opener.start()
    try:
        yield
    finally:
        opener.join(timeout)
        holder.close()


def wait_at_gate(conn: Conn) -> None:
    """Block until the test's start gate opens (returns at once if there is none)."""
    conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE_KEY,))
    conn.execute("SELECT pg_advisory_unlock_shared(%s)", (GATE_KEY,))


def gated(dsn: str) -> Conn:
    """A child's autocommit connection, returned once the start gate has opened."""
    conn = psycopg.connect(dsn, autocommit=True)
    wait_at_gate(conn)
    return conn


def waits_on_lock(conn: Conn, pid: int) -> bool:
    """Whether the backend ``pid`` is waiting for a lock right now."""
    return bool(scalar(conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)))


class BlockedCall:
    """``call()`` on a thread, using ``session``, which must end up waiting for a lock: the
    constructor returns once ``observer`` sees ``session`` wait. ``outcome`` then holds what
    the call returned or the database error it raised."""

    def __init__(self, observer: Conn, session: Conn, call: Callable[[], Any], what: str) -> None:
        pid = session.info.backend_pid
        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()
        wait_for(what, lambda: waits_on_lock(observer, pid), timeout=60)

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.outcome.append(call())
        except psycopg.Error as exc:
            self.outcome.append(exc)

    def join(self, timeout: float) -> list[Any]:
        """Wait for the call to end; its outcome (empty when it is still running)."""
        self.thread.join(timeout)
        return self.outcome


@dataclass
class WaitedClaim:
    """One claim that polled a busy group: what it started, how long it took, and what the
    ``later`` call returned while the claim was not committed yet."""

    runs: list[int]
    seconds: float
    later: Any = None


def claim_after_a_wait(
    db: Database,
    observer: Conn,
    *,
    hold: Callable[[Conn], object],
    claim: Callable[[Conn], list[int]],
    meanwhile: Callable[[], object] = lambda: None,
    later: Callable[[Conn], object] | None = None,
    setup: Callable[[], object] = lambda: None,
    tries: int = 5,
) -> WaitedClaim:
    """A claim that waits for a group a holder has, and what happens while it waits.

    ``hold(holder)`` takes a group's lock in a transaction; ``claim(claimer)`` runs on a thread
    in a transaction of its own; once ``observer`` sees it poll (``PgSleep``), ``meanwhile()``
    runs and the holder commits, so the claim gets the group. Then, the claim's transaction
    still open, ``later`` runs on a third session; then the claim commits. A claim gives up a
    second after its first wait, and a try in which it gave up before the holder committed
    proves nothing, so ``setup()`` runs before each of up to ``tries`` tries and the first try
    that got the group in time is returned."""
    attempts: list[WaitedClaim | BaseException] = []
    for _ in range(tries):
        setup()
        outcome: list[WaitedClaim | BaseException] = []
        with (
            db.connect(autocommit=False) as holder,
            db.connect(autocommit=False) as claimer,
            db.connect() as third,
        ):
            hold(holder)

            def run(claimer: Conn = claimer, outcome: list[WaitedClaim | BaseException] = outcome) -> None:
                started = time.monotonic()
                try:
                    runs = claim(claimer)
                except BaseException as exc:  # reported by the caller's thread below
                    outcome.append(exc)
                else:
                    outcome.append(WaitedClaim(runs, time.monotonic() - started))

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                polling = "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = %s"
                polls = functools.partial(scalar, observer, polling, (claimer.info.backend_pid,))
                wait_for("the claim to poll the busy group", polls, 60, 0.005)
                meanwhile()
                holder.commit()
            finally:
                thread.join(120)
            if not outcome:
                raise AssertionError("the claim did not return within two minutes")
            result = outcome[0]
            if isinstance(result, BaseException):
                raise AssertionError(f"the claim failed: {result}") from result
            if later is not None:
                result.later = later(third)
            claimer.commit()
        attempts.append(result)
        if result.seconds < 0.9:
            return result
    raise AssertionError(f"the claim never got the group before giving up, in {tries} tries: {attempts}")


#: Runs not finished yet: a claim race is over when there are none.
LIVE_SQL = "SELECT count(*) FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING')"


@dataclass
class Tally:
    """What one process of a claim race saw: the runs it claimed, the groups it saw above
    their bound (rows of an ``*_SQL`` check query), the calls that failed."""

    worker: str
    claimed: list[int] = field(default_factory=list)
    violations: list[tuple[Any, ...]] = field(default_factory=list)
    errors: list[tuple[str, str | None, str]] = field(default_factory=list)
    samples: int = 0

    def claim(self, conn: Conn, batch: int, columns: str = "id") -> list[tuple[Any, ...]]:
        """jobs.claim(batch) as this worker: ``columns`` of the runs it got (the first: id)."""
        got = conn.execute(f"SELECT {columns} FROM jobs.claim(%s, %s)", (batch, self.worker)).fetchall()
        self.claimed.extend(int(r[0]) for r in got)
        return got

    def check(self, conn: Conn, over_sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run the check query now; record each group it finds above its bound."""
        who = "probe" if self.worker == "probe" else f"after claim by {self.worker}"
        self.violations.extend((who, *over) for over in conn.execute(over_sql, params).fetchall())
        self.samples += 1

    def failed(self, exc: psycopg.Error) -> bool:
        """Record a failed call; whether so many failed that the process should stop."""
        self.errors.append((self.worker, exc.sqlstate, str(exc).splitlines()[0]))
        return len(self.errors) > 20

    def result(self, **extra: Any) -> dict[str, Any]:
        """What the process returns to the test (plain data: it crosses a process boundary)."""
        return {
            "worker": self.worker,
            "claimed": self.claimed,
            "violations": self.violations,
            "errors": self.errors,
            "samples": self.samples,
            **extra,
        }


def probe(
    conn: Conn, seconds: float, over_sql: str, params: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run the check query continuously, beside the claimers, until no run is live."""
    tally = Tally("probe")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tally.check(conn, over_sql, params)
        if scalar(conn, LIVE_SQL) == 0:
            break
    return tally.result()


#: Every definition above its cap right now, with the offending runs and their workers.
OVER_CAP_SQL = """
SELECT d.id, d.max_concurrent_runs, count(*),
       array_agg(r.id ORDER BY r.id), array_agg(r.worker ORDER BY r.id)
  FROM jobs.runs AS r
  JOIN jobs.definitions AS d ON d.id = r.definition_id
 WHERE r.status = 'RUNNING' AND d.max_concurrent_runs IS NOT NULL
   AND (%(defs)s::bigint[] IS NULL OR d.id = ANY (%(defs)s::bigint[]))
 GROUP BY d.id
HAVING count(*) > d.max_concurrent_runs
"""


def env_for(dsn: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env.update(PGTICK_LOG="INFO", PYTHONUNBUFFERED="1")
    if dsn is not None:
        env["PGTICK_APP_DSN"] = dsn
    return env


def pgtick_in_foreground(*args: str) -> subprocess.Popen[str]:
    """A CLI call started as a shell starts a foreground command: Ctrl-C interrupts it, even
    where the test runs with SIGINT ignored (a background job of a script), which a child
    inherits. Its output piped as text, without the INFO log."""
    return subprocess.Popen(
        [*PGTICK, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"},
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def pgtick(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """One CLI call to completion (no embedded server: callers pass --dsn)."""
    return subprocess.run(
        [*PGTICK, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_for(None),
        cwd=ROOT,
    )


def pid_of_owner(owner: str | None) -> int | None:
    """The pid inside a worker/owner id host-PID-rand (hosts may contain dashes)."""
    match = re.search(r"-(\d+)-[0-9a-f]{6}$", owner or "")
    return int(match.group(1)) if match else None


class Proc:
    """A started process, its log file, and helpers to wait on both."""

    def __init__(self, label: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.label = label
        self.popen = popen
        self.log_path = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 25) -> str:
        return "\n".join(f"  {self.label}| {line}" for line in self.log().splitlines()[-lines:])

    def wait_log(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """Wait until the log has a line matching ``pattern``; fail with the log tail."""
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            if self.popen.poll() is not None:
                match = regex.search(self.log())
                if match:
                    return match
                raise AssertionError(
                    f"{self.label} (pid {self.pid}) exited {self.popen.returncode} before logging "
                    f"{pattern!r}:\n{self.tail()}"
                )
            return regex.search(self.log())

        try:
            return wait_for(f"{self.label} to log {pattern!r}", found, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None

    @property
    def worker_id(self) -> str:
        return self.wait_log(r"worker=(\S+) started").group(1)

    def send(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.label} (pid {self.pid}) still running after {timeout:.1f}s:\n{self.tail()}"
            ) from None

    def stdout(self) -> str:
        assert self.popen.stdout is not None
        return self.popen.stdout.read().decode(errors="replace")


class Processes:
    """Starts processes for one test and kills every leftover at the end."""

    def __init__(self, directory: Path, dsn: str) -> None:
        self.directory = directory
        self.dsn = dsn
        self.started: list[Proc] = []

    def start(self, label: str, args: list[str], *, stdout: bool = False) -> Proc:
        log = self.directory / f"{label}.log"
        with log.open("wb") as stderr:
            popen = subprocess.Popen(
                [*PGTICK, *args],
                stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                stderr=stderr,
                env=env_for(self.dsn),
                cwd=ROOT,
                start_new_session=True,  # its own process group: children die with it
            )
        proc = Proc(label, popen, log)
        self.started.append(proc)
        return proc

    def replica(self, app: str, label: str, *extra: str, grace: str = "5s") -> Proc:
        """`pgtick run tests/apps/APP --dsn DSN` with the fast timings."""
        args = ["run", str(APPS / app), "--dsn", self.dsn, *FAST, "--grace", grace, *extra]
        return self.start(label, args)

    def by_pid(self, pid: int | None) -> Proc | None:
        return next((p for p in self.started if p.pid == pid), None)

    def tails(self) -> str:
        return "\n".join(p.tail() for p in self.started)

    def stop_all(self) -> list[tuple[str, int]]:
        """SIGTERM every process still running; (label, exit code) of each."""
        alive = [p for p in self.started if p.popen.poll() is None]
        for p in alive:
            p.send(signal.SIGTERM)
        return [(p.label, p.wait(15)) for p in alive]

    def kill_all(self) -> None:
        for proc in self.started:
            try:  # the whole group, even when its leader is gone: a lock's orphaned child too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()


@contextmanager
def processes(directory: Path, dsn: str) -> Iterator[Processes]:
    procs = Processes(directory, dsn)
    try:
        yield procs
    finally:
        procs.kill_all()


# --- Runs worked by replicas: what the job code in tests/apps recorded ---------------


def finished_status(conn: Conn, run_id: int) -> str | None:
    """The run's status once it has finished (finished_at set); None while it has not."""
    value = scalar(
        conn, "SELECT status::text FROM jobs.runs WHERE id = %s AND finished_at IS NOT NULL", (run_id,)
    )
    return None if value is None else str(value)


def wait_finished(conn: Conn, run_id: int, timeout: float = 60) -> str:
    """Wait until the run has finished; its status."""
    return wait_for(f"run {run_id} to end", lambda: finished_status(conn, run_id), timeout)


def wait_started(conn: Conn, run_id: int, timeout: float = 60) -> int:
    """Wait until the run's job code has recorded its entry; the pid it runs in. (The test app
    makes public.executions when it starts, which may be after this begins to wait.)"""

    def pid() -> Any:
        try:
            return scalar(conn, "SELECT pid FROM public.executions WHERE run_id = %s", (run_id,))
        except psycopg.errors.UndefinedTable:
            return None

    return int(wait_for(f"run {run_id} to start", pid, timeout))


#: The heartbeat timeout of a run whose worker a test kills: the reaper may take it this soon.
SHORT_HEARTBEAT = 2.0


def start_sleepy_run(conn: Conn, seconds: float) -> tuple[int, int]:
    """A `sleepy` run of tests/apps/work_app.py (``seconds`` of work, its retry 0.3 s) with the
    SHORT_HEARTBEAT timeout, once its job code has started: the run and the pid it runs in."""
    payload = f'{{"seconds": {seconds}, "retry_seconds": 0.3}}'
    run_id = enqueue(conn, "sleepy", payload, heartbeat_timeout=f"make_interval(secs => {SHORT_HEARTBEAT})")
    return run_id, wait_started(conn, run_id)


def wait_retry_completed(conn: Conn, run_id: int, columns: str = "id", timeout: float = 60) -> Any:
    """Wait until the retry of ``run_id`` has COMPLETED; its row (``columns`` of jobs.runs)."""
    return wait_for(
        f"the retry of run {run_id} to complete",
        lambda: conn.execute(
            f"SELECT {columns} FROM jobs.runs WHERE retry_of = %s AND status = 'COMPLETED'", (run_id,)
        ).fetchone(),
        timeout,
    )


def compensations(conn: Conn, run_id: int) -> list[tuple[Any, ...]]:
    """(pid, worker, at) of each compensation hook call recorded for the run."""
    return conn.execute(
        "SELECT pid, worker, at FROM public.compensations WHERE run_id = %s", (run_id,)
    ).fetchall()


def attempts(conn: Conn, run_id: int) -> list[tuple[Any, ...]]:
    """The run and its retries, oldest first: (id, attempt, status, failure_reason, worker)."""
    return conn.execute(
        "SELECT id, attempt, status::text, failure_reason, worker FROM jobs.runs"
        " WHERE id = %s OR retry_of = %s ORDER BY id",
        (run_id, run_id),
    ).fetchall()


def executions(conn: Conn, columns: str = "run_id, outcome") -> list[tuple[Any, ...]]:
    """``columns`` of every recorded execution, in the order they started."""
    return conn.execute(f"SELECT {columns} FROM public.executions ORDER BY id").fetchall()


@dataclass
class Cancelled:
    """What a cancel from psql did to a running run of a mutating kind."""

    run_id: int
    pid: int  # where its job code ran
    answer: str  # what jobs.cancel said
    asked_at: datetime  # the server's clock just after jobs.cancel returned
    status: str
    worker: str | None
    finished_at: datetime
    cancel_requested: bool
    compensations: list[tuple[Any, ...]]

    def check_compensated_first(self, replica: Proc, context: str) -> None:
        """Cancelled while RUNNING on the replica's worker; the compensation ran once, in the
        replica, and committed before the run was stamped CANCELLED."""
        worker = replica.worker_id
        assert self.answer == "RUNNING", f"jobs.cancel said {self.answer!r}: {context}"
        assert (self.status, self.worker, self.cancel_requested) == ("CANCELLED", worker, True), context
        assert len(self.compensations) == 1, f"compensation must run exactly once: {context}"
        pid, by, at = self.compensations[0]
        assert (pid, by) == (replica.pid, worker), f"compensation not in the worker: {context}"
        assert at <= self.finished_at, f"stamped CANCELLED before compensation ran: {context}"


def cancel_a_running_job(
    procs: Processes, db: Database, conn: Conn, app: str, kind: str, payload: str = "{}"
) -> tuple[Proc, Cancelled]:
    """A replica of ``app`` runs a ``kind`` job; once its job code has started, it is cancelled
    through psql. The replica, and what the cancel did once the run ended."""
    replica = procs.replica(app, "replica")
    assert replica.worker_id  # started
    return replica, cancel_from_psql(db, conn, enqueue(conn, kind, payload))


def cancel_from_psql(db: Database, conn: Conn, run_id: int) -> Cancelled:
    """Once the run's job code has started, cancel it through psql and wait for it to end."""
    pid = wait_started(conn, run_id)
    answer = db.psql(f"SELECT jobs.cancel({run_id})")
    asked_at = scalar(conn, "SELECT clock_timestamp()")
    status = wait_finished(conn, run_id)
    run = one(conn, "SELECT worker, finished_at, cancel_requested FROM jobs.runs WHERE id = %s", (run_id,))
    return Cancelled(run_id, pid, answer, asked_at, status, **run, compensations=compensations(conn, run_id))


# --- A Worker's run loop on a thread of the test --------------------------------------


class WorkerThread:
    """``worker.run(stop)`` on a thread; whatever it raised is kept in ``raised``."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.stop = threading.Event()
        self.raised: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="test-worker")

    def _run(self) -> None:
        try:
            self.worker.run(self.stop)
        except BaseException as exc:
            self.raised.append(exc)

    def finish(self, timeout: float = 30) -> None:
        self.stop.set()
        self.thread.join(timeout)


@contextmanager
def worker_thread(worker: Any, *, join: float = 30, may_raise: bool = False) -> Iterator[WorkerThread]:
    """Run the worker for the block, then stop it and wait ``join`` seconds for it to end.

    Unless ``may_raise``, a worker that raised fails the test with what it raised.
    """
    running = WorkerThread(worker)
    running.thread.start()
    try:
        yield running
    finally:
        running.finish(join)
    assert may_raise or not running.raised, f"the worker raised: {running.raised!r}"


# --- The per-second schedule of tests/apps/ticker_app.py, worked by several replicas ----


def occurrences(conn: Conn) -> list[dict[str, Any]]:
    """Every run of the per-second definition with the executions that recorded it."""
    rows = conn.execute(
        """
        SELECT r.id, r.scheduled_for, r.status::text AS status, r.worker, r.origin,
               coalesce(array_agg(e.pid ORDER BY e.id) FILTER (WHERE e.id IS NOT NULL), '{}') AS pids,
               coalesce(array_agg(e.worker ORDER BY e.id) FILTER (WHERE e.id IS NOT NULL), '{}')
                   AS workers,
               count(e.exited) AS exits,
               bool_and(e.scheduled_for = r.scheduled_for AND e.definition_id = r.definition_id)
                   AS facts_match
          FROM jobs.runs AS r
          JOIN jobs.definitions AS d ON d.id = r.definition_id AND d.name = 'every-second'
          LEFT JOIN public.executions AS e ON e.run_id = r.id
         GROUP BY r.id
         ORDER BY r.scheduled_for, r.id
        """
    ).fetchall()
    keys = ("id", "scheduled_for", "status", "worker", "origin", "pids", "workers", "exits", "facts_match")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def catch_up_windows(conn: Conn) -> list[tuple[datetime, datetime]]:
    """The late occurrences a leader coalesced after a gap in leadership (jobs.catch_ups)."""
    return [(r[0], r[1]) for r in conn.execute("SELECT first_late, last_late FROM jobs.catch_ups")]


def assert_each_occurrence_once(
    runs: list[dict[str, Any]],
    settled_before: datetime,
    dead_worker: str | None = None,
    coalesced: list[tuple[datetime, datetime]] | None = None,
) -> None:
    """One run per occurrence, consecutive seconds, each executed at most once; the ones
    due well before ``settled_before`` COMPLETED and executed exactly once by their worker
    (except runs claimed by ``dead_worker``, killed before it could report them). A gap is
    allowed only where a recorded catch-up coalesced the occurrences inside it (a failover
    slower than the schedule's period: misfire_policy coalesce, grace one period)."""
    assert len(runs) >= 3, f"too few occurrences materialized: {runs}"
    per_time = Counter(r["scheduled_for"] for r in runs)
    duplicated = [r for r in runs if per_time[r["scheduled_for"]] > 1]
    assert not duplicated, f"an occurrence materialized more than once: {duplicated}"
    assert all(r["origin"] == "schedule" for r in runs), runs
    gaps = [(a["scheduled_for"], b["scheduled_for"]) for a, b in pairwise(runs)]
    gaps = [(a, b) for a, b in gaps if b - a != timedelta(seconds=1)]
    gaps = [(a, b) for a, b in gaps if not any(a < first and last <= b for first, last in coalesced or [])]
    assert not gaps, f"occurrences not one second apart (gap or misalignment), none coalesced: {gaps}"
    twice = [r for r in runs if len(r["pids"]) > 1]
    assert not twice, f"runs executed more than once (run, pids, workers): {twice}"
    for r in runs:
        if r["worker"] is not None and r["worker"] == dead_worker and r["status"] != "COMPLETED":
            assert r["status"] == "RUNNING", f"a dead worker's unfinished run is not RUNNING: {r}"
            continue
        if r["status"] == "COMPLETED" or r["scheduled_for"] < settled_before:
            assert r["status"] == "COMPLETED", f"run due before the stop did not complete: {r}"
            assert len(r["pids"]) == 1 and r["exits"] == 1, f"completed run not executed once: {r}"
            assert r["facts_match"], f"job saw other facts than its run row: {r}"
            assert r["workers"] == [r["worker"]], f"executed by another worker than the claimer: {r}"
            assert r["pids"] == [pid_of_owner(r["worker"])], f"executed in another process: {r}"


def wait_for_occurrences(conn: Conn, n: int) -> None:
    """Until the per-second schedule has ``n`` runs (a busy machine starts replicas slowly)."""
    wait_for(f"{n} occurrences", lambda: len(occurrences(conn)) >= n, timeout=60)


def settle_after_failover(conn: Conn, since: datetime, dead_worker: str) -> datetime:
    """Wait until the new leader's occurrences after ``since`` complete, then until every
    occurrence due before a cut-off taken then has finished (but the dead worker's); return
    the cut-off. Everything before it is settled, however slowly a busy machine ran it."""

    def settled() -> bool:
        runs = occurrences(conn)
        after = sum(1 for r in runs if r["scheduled_for"] > since and r["status"] == "COMPLETED")
        # Three at least in all: the old leader may have made the two it was killed after
        # ahead of time, due after the failover, and the new leader has to make one too.
        return after >= 2 and len(runs) >= 3

    wait_for("occurrences after the failover to complete", settled, timeout=60)
    return settle_occurrences(conn, dead_worker)


def settle_occurrences(conn: Conn, dead_worker: str | None = None) -> datetime:
    """Take a cut-off now and wait until every occurrence due before it has finished (but the
    dead worker's); return the cut-off."""
    cut_off: datetime = scalar(conn, "SELECT clock_timestamp()")
    wait_for(
        "every occurrence due before the cut-off to finish (but the dead worker's)",
        lambda: all(
            r["status"] == "COMPLETED" or (dead_worker is not None and r["worker"] == dead_worker)
            for r in occurrences(conn)
            if r["scheduled_for"] < cut_off
        ),
        timeout=60,
    )
    return cut_off


def leader_to_kill(
    procs: Processes, conn: Conn, owners: Callable[[Conn], list[Any]], workers: dict[int, str]
) -> tuple[list[Any], Proc]:
    """Once there is one leader (``owners`` lists them) and a few occurrences under it: the
    leader's owners and the replica that is the leader."""
    wait_for("a leader", lambda: owners(conn), timeout=60)
    wait_for_occurrences(conn, 2)  # a few under the first leader
    old = owners(conn)
    assert len(old) == 1, old
    victim = procs.by_pid(pid_of_owner(old[0]))
    assert victim is not None, f"leader {old} is none of the replicas {workers}"
    return old, victim


# --- PgBouncer in transaction mode in front of the test server ------------------------


class PgBouncer:
    """A PgBouncer process in transaction mode, on a free port, in front of the test server.

    Clients connect without a password (``auth_type = any``); PgBouncer logs in to the
    server with the credentials of the server's admin DSN (the embedded server's socket or
    ``PGTICK_TEST_DSN``), for any database name (the ``*`` fallback entry).
    """

    def __init__(self, srv: Server) -> None:
        # Its own directory under /tmp: PgBouncer runs as another user when we are root,
        # and must reach its files (pytest's tmp dirs are private to us).
        directory = Path(tempfile.mkdtemp(prefix="pgtick-pgbouncer-"))
        self.directory = directory
        binary = os.environ.get("PGTICK_PGBOUNCER") or shutil.which("pgbouncer")
        if binary is None:
            for candidate in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"):
                if os.path.exists(candidate):
                    binary = candidate
        if binary is None:
            raise RuntimeError("pgbouncer not found: apt-get install -y pgbouncer (or set PGTICK_PGBOUNCER)")
        with srv.admin() as conn:
            info = conn.info
            target = {"host": info.host, "port": str(info.port), "user": info.user}
            if info.password:
                target["password"] = info.password
        self.port = free_port()
        os.chmod(directory, 0o755)
        server = " ".join(f"{k}={v}" for k, v in target.items())
        config = directory / "pgbouncer.ini"
        self.log_path = directory / "pgbouncer.log"
        config.write_text(
            f"""[databases]
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {self.log_path}
"""
        )
        self.log_path.touch()
        for path in (config, self.log_path):
            os.chmod(path, 0o666)
        user: list[str] = []
        if os.geteuid() == 0:  # PgBouncer refuses root; run as whoever may reach the server
            host = target["host"]
            owner = Path(host).stat().st_uid if host.startswith("/") else None
            import pwd

            name = pwd.getpwuid(owner).pw_name if owner is not None else "nobody"
            user = ["-u", name]
        self.stderr_path = directory / "stderr.log"
        with self.stderr_path.open("wb") as stderr:
            self.popen = subprocess.Popen(
                [binary, *user, str(config)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        wait_for(f"pgbouncer on port {self.port}", self._accepting, timeout=60)

    def _accepting(self) -> bool:
        if self.popen.poll() is not None:
            err = self.stderr_path.read_text(errors="replace")
            raise RuntimeError(f"pgbouncer exited {self.popen.returncode}: {err}\n{self.log()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def dsn(self, db: Database) -> str:
        """The DSN of ``db`` through PgBouncer."""
        params = conninfo_to_dict(db.dsn)
        for key in ("hostaddr", "password", "passfile"):
            params.pop(key, None)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


# -- a scheduler under a clock the test moves -------------------------------------------


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def define(conn: psycopg.Connection[Any], name: str, schedule: str, **kw: Any) -> int:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    row = conn.execute(
        f"SELECT id FROM jobs.define(%(name)s, 'k', %(schedule)s{', ' if kw else ''}{args})",
        {"name": name, "schedule": schedule, **kw},
    ).fetchone()
    assert row is not None
    return int(row[0])


def refuse_runs_of(conn: psycopg.Connection[Any], definition_id: int, name: str, message: str) -> None:
    """An operator's BEFORE INSERT trigger on jobs.runs (an audit, a quota) that rejects the
    runs of one definition with "<name>: <message>"."""
    conn.execute(
        f"""
        CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.definition_id = {int(definition_id)} THEN
                RAISE EXCEPTION '{name}: {message}';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER {name} BEFORE INSERT ON jobs.runs FOR EACH ROW EXECUTE FUNCTION public.{name}();
        """
    )


# -- the CLI on a pseudo-terminal ------------------------------------------------------------


def in_pty(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on a pseudo-terminal; return (code, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*PGTICK, *argv], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    code = proc.wait(timeout=10)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def tty_env(**extra: str) -> dict[str, str]:
    env = env_for(None)
    env.pop("NO_COLOR", None)
    env.update(TERM="xterm-256color", COLUMNS="100", LINES="40", PYTHONIOENCODING="utf-8", **extra)
    env.pop("PGTICK_LOG", None)
    return env


# --- A worker cut off from the database while a job that never checkpoints runs ---------


@dataclass
class CutOff:
    """What became of an ``appends`` job (tests/apps) whose worker was cut off mid-run."""

    run_id: int
    pid: int  # where its job code ran
    victim: Proc
    victim_worker: str
    first: tuple[Any, ...]  # the run's status, failure_reason, worker
    retry_finished: datetime
    appended: list[tuple[int, datetime]]  # the (attempt, time) lines the jobs appended
    after_worker: str | None  # who ran the run enqueued once the victim could connect again
    alive: bool  # whether the victim was still running then
    context: str


def refuse_login(conn: Conn, login: str) -> None:
    """Cut a worker login off the database, as a network partition would: refuse new sessions
    (CONNECTION LIMIT 0) and end every session it has, waiting until none is left."""
    conn.execute(SQL("ALTER ROLE {} CONNECTION LIMIT 0").format(Identifier(login)))
    wait_for(
        f"every session of {login} to end",
        lambda: (
            not scalar(
                conn,
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE usename = %s",
                (login,),
            )
        ),
        timeout=30,
    )


def cut_off_mid_job(
    db: Database,
    procs: Processes,
    conn: Conn,
    path: Path,
    app: str,
    kind: str,
    after_kind: str,
    stopped: Callable[[int, int], bool],
) -> CutOff:
    """A victim worker of ``app`` (its own login, no scheduler) runs a ``kind`` job that appends
    to ``path`` every 50 ms without a checkpoint, with the SHORT_HEARTBEAT timeout. Its login is
    refused and its sessions ended; a survivor replica reaps the run and completes its retry.
    Still cut off, the victim must stop the job by itself: ``stopped(run_id, pid)`` is waited for.
    Then the victim may connect again, the survivor stops, and an ``after_kind`` run is enqueued."""
    with db.worker_login("cutoff") as login:
        victim = procs.start(
            "victim", ["run", str(APPS / app), "--dsn", db.dsn_as(login), "--no-scheduler", *FAST]
        )
        victim_worker = victim.worker_id
        payload = f'{{"seconds": 600, "retry_seconds": 1, "path": "{path}"}}'
        run_id = enqueue(conn, kind, payload, heartbeat_timeout=f"make_interval(secs => {SHORT_HEARTBEAT})")
        pid = wait_started(conn, run_id)
        wait_for(
            f"run {run_id} to heartbeat",
            lambda: scalar(conn, "SELECT heartbeat_at > started_at FROM jobs.runs WHERE id = %s", (run_id,)),
            timeout=60,
        )
        refuse_login(conn, login)
        survivor = procs.replica(app, "survivor")
        retry_id, retry_started, retry_finished = wait_retry_completed(
            conn, run_id, "id, started_at, finished_at", timeout=90
        )
        wait_for(f"the job of run {run_id} to stop", lambda: stopped(run_id, pid) or None, timeout=60)
        first = conn.execute(
            "SELECT status::text, failure_reason, worker FROM jobs.runs WHERE id = %s", (run_id,)
        ).fetchone()
        lines = [line.split() for line in path.read_text().splitlines()]
        appended = [
            (int(a), datetime.fromtimestamp(float(t)).astimezone())
            for a, t in (x for x in lines if len(x) == 2)
        ]
        conn.execute(SQL("ALTER ROLE {} CONNECTION LIMIT -1").format(Identifier(login)))
        survivor.send(signal.SIGTERM)
        survivor.wait(30)
        after = enqueue(conn, after_kind)
        wait_finished(conn, after, timeout=90)
        after_worker = scalar(conn, "SELECT worker FROM jobs.runs WHERE id = %s", (after,))
        alive = victim.popen.poll() is None
        last = max((t for a, t in appended if a == 1), default=None)
        context = (
            f"run {run_id}: {first}; job pid {pid}; retry {retry_id} ran {retry_started} .."
            f" {retry_finished}; the first attempt's last line {last}\n{procs.tails()}"
        )
    assert first is not None, context
    return CutOff(
        run_id, pid, victim, victim_worker, first, retry_finished, appended, after_worker, alive, context
    )


def task_factory_breaking_app() -> Any:
    """An app of two async kinds: ``breaks-the-next-task`` installs a task factory on the
    worker's loop that raises once (so the next task cannot be made), ``answer`` returns its
    run id."""
    import asyncio

    from pgtick import App, Context

    app = App()

    @app.job("breaks-the-next-task")
    async def breaks_the_next_task(ctx: Context) -> None:
        def refuse(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            loop.set_task_factory(None)
            raise RuntimeError("no task today")

        asyncio.get_running_loop().set_task_factory(refuse)

    @app.job("answer")
    async def answer(ctx: Context) -> int:
        await asyncio.sleep(0)
        return ctx.run_id

    return app


def checkout_schema(ref: str, into: Path) -> Path:
    """sql/ and migrations/ as they were at git revision ``ref``, extracted into ``into``;
    returns that install.sql (for psql: the schema a user who installed then has)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "sql", "migrations"],
        cwd=migrate.schema_root(),
        capture_output=True,
    )
    assert archive.returncode == 0, archive.stderr.decode()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "sql" / "install.sql"


def commits_adding(migration: str) -> list[str]:
    """The commits on the checkout's first-parent line (newest first) that added
    migrations/``migration``: none while it is not committed."""
    repo = migrate.schema_root()
    added = subprocess.run(
        ["git", "log", "--first-parent", "--diff-filter=A", "--format=%H", "--", f"migrations/{migration}"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    if added.returncode != 0:
        pytest.fail(f"this test needs the git history of {repo}: {added.stderr.strip()}")
    return added.stdout.split()


def revision_before(migration: str) -> str:
    """The git revision just before migrations/``migration`` was added (the checkout itself
    while that migration is not committed): what a user who installed then has."""
    added = commits_adding(migration)
    return f"{added[-1]}^" if added else "HEAD"


def schema_before(migration: str, into: Path) -> Path:
    """sql/ and migrations/ as they were just before migrations/``migration`` was added,
    extracted into ``into``; returns that install.sql."""
    return checkout_schema(revision_before(migration), into)


def end_client_sessions(db: Database) -> None:
    """End the server sessions of this database's clients (pg_terminate_backend, as a restart
    or idle_session_timeout would) and wait until they are gone."""
    query = "FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgtick-client'"
    with db.connect() as conn:
        ended = conn.execute(f"SELECT count(pg_terminate_backend(pid)) {query}").fetchone()
        assert ended is not None and ended[0] >= 1, "no client session to end"
        wait_for("the ended sessions to go", lambda: scalar(conn, f"SELECT count(*) = 0 {query}"), 60)
