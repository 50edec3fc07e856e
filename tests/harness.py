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

``Processes`` starts real processes (`pgtick run` replicas, `pgtick lock`), each
in its own session (process group) with stderr logged to a file under the
test's tmp dir; it kills whatever is still alive when the test ends, whatever
happened, and failing tests quote the log tails. Replicas run with short
timings (tick/poll 0.2 s, heartbeat 0.3 s) and with ``PGTICK_APP_DSN`` set so
job code in tests/apps can record itself.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.sql import SQL, Identifier

from pgtick import migrate

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

    @contextmanager
    def worker_login(self, label: str) -> Iterator[str]:
        """A LOGIN role that is a member of jobs_worker and nothing else, dropped at the end."""
        name = f"pgtick_t_{label}_{os.getpid()}"
        with self.connect() as admin:
            admin.execute(SQL("DROP ROLE IF EXISTS {}").format(Identifier(name)))
            admin.execute(SQL("CREATE ROLE {} LOGIN").format(Identifier(name)))
            admin.execute(SQL("GRANT jobs_worker TO {}").format(Identifier(name)))
        try:
            yield name
        finally:
            with self.connect() as admin:
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


def enqueue(conn: Conn, kind: str = "k", payload: str = "{}", run_at: str = "now()") -> int:
    return int(scalar(conn, f"SELECT id FROM jobs.enqueue(%s, %s::jsonb, {run_at})", (kind, payload)))


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


def run_row(conn: Conn, run_id: int) -> dict[str, Any]:
    """One jobs.runs row as a dict (column name -> value)."""
    cur = conn.execute("SELECT * FROM jobs.runs WHERE id = %s", (run_id,))
    row = cur.fetchone()
    assert row is not None, f"run {run_id} does not exist"
    assert cur.description is not None
    return {col.name: value for col, value in zip(cur.description, row, strict=True)}


def digest(conn: Conn) -> dict[str, Any]:
    """Row counts and content hashes of every jobs table: equal digests mean nothing changed."""
    out: dict[str, Any] = {}
    for table in ("runs", "definitions", "retry_policies", "config", "leases"):
        count, md5 = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM jobs.{table} AS t"
        ).fetchone() or (None, None)
        out[table] = (count, md5)
    return out


def expect_error(
    conn: Conn,
    sql: str,
    params: Sequence[Any] | None,
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
