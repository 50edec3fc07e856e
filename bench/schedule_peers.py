"""The peers of the schedule benchmark, and the PostgreSQL 15 cluster they share with pgtick.

Each system is driven through a ``Driver``: ``setup`` creates the N schedules (timed),
``start`` launches its processes, ``starts_sql`` reads back one row per occurrence it
started or materialized, ``stop`` ends its processes and ``cleanup`` removes what it left
in the database. ``bench/schedule.py`` observes every driver the same way.

Where each peer's start instant comes from (all stamped by the one server's clock):

- pg_cron 1.4: ``cron.job_run_details.start_time``, which its launcher stamps once the
  job's background worker has started (``cron.use_background_workers = on``). pg_cron does
  not record which minute a run was for, so a run counts for the minute it started in
  (``date_trunc('minute', start_time)``): a run more than a minute late is
  indistinguishable from the next minute's run, so its own minute counts as missed.
- procrastinate: ``procrastinate_events.at`` of the job's ``started`` event (the fetch
  transaction's ``now()``); the scheduled instant is the ``timestamp`` argument the periodic
  deferrer gives each job (``procrastinate_jobs.args``; ``procrastinate_periodic_defers``
  keeps only the latest defer of a schedule), its materialization the ``deferred`` event.
- DBOS: ``workflow_status.started_at_epoch_ms``, which the queue claim stamps with the
  database clock when it dequeues the scheduled workflow; the scheduled instant is the
  one DBOS puts in the workflow's id (``sched-<schedule>-<ISO time>``, also the time it
  passes to the workflow); materialization is ``created_at``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from bench.harness import Server  # noqa: E402

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
PG_CRON_SO = Path("/usr/lib/postgresql/15/lib/pg_cron.so")
PG_CRON_DB = "sched_pg_cron"
#: pg_cron's README, for ``cron.use_background_workers = on``: raise max_worker_processes
#: from 8 to 20; ``cron.max_running_jobs`` stays at its default (32).
PG_CRON_SETTINGS = {
    "shared_preload_libraries": "'pg_cron'",
    "cron.database_name": f"'{PG_CRON_DB}'",
    "cron.use_background_workers": "on",
    "max_worker_processes": "20",
    "cron.max_running_jobs": "32",
}

#: Processes the benchmark started: killed on exit whatever happens.
CHILDREN: list[subprocess.Popen[bytes]] = []


def log(message: str) -> None:
    print(f"[schedule-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def spawn(
    argv: list[str],
    env: dict[str, str] | None = None,
    logfile: Path | None = None,
    ready_line: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a child (stderr to ``logfile``; stdout piped when it prints a ready line),
    remembered so that it is stopped on exit."""
    err = logfile.open("ab") if logfile is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if ready_line else subprocess.DEVNULL,
        stderr=err,
        start_new_session=True,  # Ctrl-C reaches the benchmark, which stops them in order
    )
    CHILDREN.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """Stop a child and what it started (its own session, see ``spawn``): SIGTERM to its
    process group, SIGKILL if the child has not exited within ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, sig)  # the child leads its group while it is alive
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    if proc.stdout is not None:
        proc.stdout.close()
    if proc in CHILDREN:
        CHILDREN.remove(proc)


def stop_all() -> None:
    for proc in list(CHILDREN):
        stop(proc, grace=5.0)


def wait_ready(proc: subprocess.Popen[bytes], name: str, timeout: float, logfile: Path) -> dict[str, Any]:
    """The first stdout line of a child that prints one JSON object when it is set up."""
    box: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not box or not box[0].strip():
        tail = logfile.read_text(errors="replace").strip().splitlines()[-3:] if logfile.exists() else []
        raise RuntimeError(f"{name} process did not get ready within {timeout:.0f}s: {' | '.join(tail)}")
    ready: dict[str, Any] = json.loads(box[0])
    return ready


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (Linux /proc), seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the PostgreSQL 15 cluster ----------------------------------------------------------


class Pg15Cluster:
    """A throwaway PostgreSQL 15 cluster (Debian's binaries) with pg_cron preloaded, run as
    the ``postgres`` OS user on a temporary data directory and socket directory, on its own
    port and no TCP listener. Durable: fsync and synchronous_commit stay on."""

    def __init__(self, with_pg_cron: bool) -> None:
        self.with_pg_cron = with_pg_cron
        self.tmp = Path(tempfile.mkdtemp(prefix="pgtick-sched-pg15-"))
        self.data = self.tmp / "data"
        self.sock = self.tmp / "sock"
        self.port = 54000 + os.getpid() % 1000
        self.running = False

    @staticmethod
    def unavailable() -> str | None:
        """Why the cluster cannot be made here, or None."""
        if not (PG15_BIN / "initdb").exists():
            return f"PostgreSQL 15 binaries not found in {PG15_BIN} (apt-get install postgresql-15)"
        if os.geteuid() == 0 and shutil.which("su") is None:
            return "running as root without su to become the postgres user"
        return None

    def _run(self, command: str) -> None:
        if os.geteuid() == 0:
            argv = ["su", "postgres", "-s", "/bin/sh", "-c", command]
        else:
            argv = ["/bin/sh", "-c", command]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{command.split()[0]} failed: {(done.stderr or done.stdout).strip()[-800:]}")

    def start(self) -> str:
        self.sock.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres")
            shutil.chown(self.sock, "postgres")
        self._run(f"{PG15_BIN}/initdb -D {self.data} -U postgres --auth=trust -E UTF8 --no-instructions")
        settings = {
            "listen_addresses": "''",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sock}'",
            "max_connections": "300",
            "timezone": "'UTC'",
        }
        if self.with_pg_cron:
            settings.update(PG_CRON_SETTINGS)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        self._run(f"{PG15_BIN}/pg_ctl -D {self.data} -l {self.tmp}/server.log -w -t 120 start")
        self.running = True
        return f"host={self.sock} port={self.port} user=postgres dbname=postgres"

    def stop(self) -> None:
        if self.running:
            try:
                self._run(f"{PG15_BIN}/pg_ctl -D {self.data} -m fast -w -t 60 stop")
            except RuntimeError:
                self._run(f"{PG15_BIN}/pg_ctl -D {self.data} -m immediate -w stop")
            self.running = False
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- drivers ----------------------------------------------------------------------------


@dataclass
class Driver:
    """One system under the schedule benchmark (see the module docstring)."""

    system: str
    server: Server
    count: int
    schedule: str
    concurrency: int
    workdir: Path
    #: SQL with %(from)s / %(to)s: one row per materialized or started occurrence, columns
    #: (key text, scheduled_for timestamptz, started_at timestamptz, created_at timestamptz).
    starts_sql: str = ""
    dbname: str = ""
    leader_pids: list[int] = field(default_factory=list)
    worker_pids: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    setup_seconds: float = 0.0
    #: What the CPU columns cover, for systems whose leader and worker are one process.
    cpu_note: str = ""

    @property
    def dsn(self) -> str:
        return self.server.dsn(self.dbname)

    def setup(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.procs = []

    def cleanup(self) -> None:
        self.server.drop_database(self.dbname)

    def _child(self, name: str, *argv: str, ready_timeout: float = 300.0) -> dict[str, Any]:
        """Start ``bench/schedule_peers.py <name> ...``; wait for its ready line."""
        logfile = self.workdir / f"{self.system}-{name}.log"
        proc = spawn([sys.executable, str(Path(__file__)), name, *argv], logfile=logfile, ready_line=True)
        self.procs.append(proc)
        return wait_ready(proc, name, ready_timeout, logfile)


class PgCronDriver(Driver):
    """pg_cron: N jobs ``cron.schedule('sN', '* * * * *', 'SELECT 1')`` in its database."""

    def setup(self) -> None:
        self.dbname = PG_CRON_DB
        with self.server.admin() as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_CRON_DB,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{PG_CRON_DB}"')
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
            self._clear(conn)
            began = time.monotonic()
            conn.execute(
                "SELECT count(cron.schedule(format('s%%s', lpad(i::text, 6, '0')), %s, 'SELECT 1'))"
                "  FROM generate_series(0, %s - 1) AS i",
                (self.schedule, self.count),
            )
            self.setup_seconds = time.monotonic() - began
            deadline = time.monotonic() + 30
            while True:  # the launcher connects once the database and extension exist
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type ILIKE '%%cron%%launcher%%'"
                ).fetchone()
                if row or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        self.leader_pids = [int(row[0])] if row else []
        self.cpu_note = "leader: the pg_cron launcher (a server process); jobs run in background workers"
        self.starts_sql = """
            SELECT jobid::text AS key, date_trunc('minute', start_time) AS scheduled_for,
                   start_time AS started_at, NULL::timestamptz AS created_at
              FROM cron.job_run_details
             WHERE start_time IS NOT NULL
               AND date_trunc('minute', start_time) BETWEEN %(from)s AND %(to)s
        """

    def start(self) -> None:
        """The launcher runs inside the server: nothing to start."""

    def stop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SELECT count(cron.unschedule(jobid)) FROM cron.job")

    def cleanup(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self._clear(conn)

    @staticmethod
    def _clear(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT count(cron.unschedule(jobid)) FROM cron.job")
        conn.execute("TRUNCATE cron.job_run_details")


class ProcrastinateDriver(Driver):
    """procrastinate: one task with N ``app.periodic(cron=..., periodic_id=...)``
    registrations (its documented way to schedule one task several times), run by one
    ``run_worker_async`` worker (which also runs the periodic deferrer)."""

    def setup(self) -> None:
        self.dbname = "sched_procrastinate"
        self.server.fresh_database(self.dbname)
        from bench.sys_peers import procrastinate_install

        procrastinate_install(self.dsn)
        self.starts_sql = """
            SELECT j.args ->> 'schedule' AS key,
                   to_timestamp((j.args ->> 'timestamp')::bigint) AS scheduled_for,
                   (SELECT min(e.at) FROM procrastinate_events e
                     WHERE e.job_id = j.id AND e.type = 'started') AS started_at,
                   (SELECT min(e.at) FROM procrastinate_events e
                     WHERE e.job_id = j.id AND e.type = 'deferred') AS created_at
              FROM procrastinate_jobs j
             WHERE j.task_name = 'tick'
               AND to_timestamp((j.args ->> 'timestamp')::bigint) BETWEEN %(from)s AND %(to)s
        """
        self.cpu_note = "one process: periodic deferrer and worker"

    def start(self) -> None:
        ready = self._child("procrastinate", self.dsn, str(self.count), self.schedule, str(self.concurrency))
        self.setup_seconds = float(ready["setup_seconds"])
        self.worker_pids = [self.procs[-1].pid]


class DbosDriver(Driver):
    """DBOS: one workflow, N schedules created with ``DBOS.apply_schedules`` (DBOS 3 replaced
    the ``@DBOS.scheduled`` decorator with named schedules), one process, its defaults."""

    def setup(self) -> None:
        self.dbname = "sched_dbos"
        self.server.drop_database(self.dbname)  # DBOS creates its system database itself
        self.starts_sql = """
            SELECT schedule_name AS key, scheduled_for,
                   to_timestamp(started_at_epoch_ms / 1000.0) AS started_at,
                   to_timestamp(created_at / 1000.0) AS created_at
              FROM (SELECT schedule_name, started_at_epoch_ms, created_at,
                           substr(workflow_uuid, length('sched-' || schedule_name || '-') + 1)::timestamptz
                               AS scheduled_for
                      FROM dbos.workflow_status
                     WHERE schedule_name IS NOT NULL
                       AND workflow_uuid LIKE 'sched-%%') AS w
             WHERE scheduled_for BETWEEN %(from)s AND %(to)s
        """
        self.cpu_note = "one process: scheduler threads and queue executor"

    def start(self) -> None:
        ready = self._child("dbos", sqlalchemy_url(self.dsn), str(self.count), self.schedule)
        self.setup_seconds = float(ready["setup_seconds"])
        self.worker_pids = [self.procs[-1].pid]


def sqlalchemy_url(dsn: str) -> str:
    """A ``postgresql+psycopg://`` URL (what DBOS takes) for a libpq DSN (socket dir or host)."""
    from urllib.parse import quote, urlencode

    info = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    user = quote(info.pop("user", "postgres"))
    password = info.pop("password", None)
    dbname = quote(info.pop("dbname", "postgres"))
    auth = f"{user}:{quote(password)}@" if password else f"{user}@"
    query = urlencode(info)
    return f"postgresql+psycopg://{auth}/{dbname}" + (f"?{query}" if query else "")


PEERS: dict[str, Callable[..., Driver]] = {
    "pg_cron": PgCronDriver,
    "procrastinate": ProcrastinateDriver,
    "dbos": DbosDriver,
}


def peer_unavailable(system: str, server_has_pg_cron: bool) -> str | None:
    """Why ``system`` cannot run in this environment, or None."""
    if system == "pg_cron":
        if not server_has_pg_cron:
            reason = Pg15Cluster.unavailable()
            if reason is None and not PG_CRON_SO.exists():
                reason = (
                    f"pg_cron for PostgreSQL 15 not installed ({PG_CRON_SO} missing;"
                    " apt-get install postgresql-15-cron)"
                )
            return reason or "the server given (--dsn or --embedded) does not preload pg_cron"
        return None
    module = {"procrastinate": "procrastinate", "dbos": "dbos"}[system]
    try:
        __import__(module)
    except ImportError as exc:
        return f"{module} not installed ({exc}; pip install -e '.[bench]')"
    return None


def server_preloads_pg_cron(server: Server) -> bool:
    return "pg_cron" in server.settings().get("shared_preload_libraries", "")


# -- the peers' processes (python bench/schedule_peers.py <system> ...) ----------------


def _ready(**values: Any) -> None:
    """Tell the benchmark this process is set up; later output goes to stderr (the log)."""
    sys.stdout.write(json.dumps({"ready": True, **values}) + "\n")
    sys.stdout.flush()
    os.dup2(2, 1)


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)


def run_procrastinate(dsn: str, count: int, cron: str, concurrency: int) -> None:
    import asyncio

    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn))

    @app.task(name="tick")
    async def tick(timestamp: int, schedule: str) -> None:
        """A no-op: the benchmark measures when it starts."""

    began = time.monotonic()
    for i in range(count):
        name = f"s{i:06}"
        app.periodic(cron=cron, periodic_id=name, task_kwargs={"schedule": name})(tick)
    setup = time.monotonic() - began

    async def main() -> None:
        async with app.open_async():
            _ready(setup_seconds=round(setup, 3))
            await app.run_worker_async(concurrency=concurrency)

    asyncio.run(main())


def run_dbos(url: str, count: int, cron: str) -> None:
    from dbos import DBOS

    DBOS(config={"name": "pgtick-schedule-bench", "system_database_url": url})

    @DBOS.workflow()
    def tick(scheduled: Any, context: Any) -> None:
        """A no-op: the benchmark measures when it starts."""

    DBOS.launch()
    began = time.monotonic()
    DBOS.apply_schedules(
        [{"schedule_name": f"s{i:06}", "workflow_fn": tick, "schedule": cron} for i in range(count)]
    )
    _ready(setup_seconds=round(time.monotonic() - began, 3))
    threading.Event().wait()


def child_main(argv: list[str]) -> int:
    _stop_on_sigterm()
    system, *args = argv
    if system == "procrastinate":
        run_procrastinate(args[0], int(args[1]), args[2], int(args[3]))
    elif system == "dbos":
        run_dbos(args[0], int(args[1]), args[2])
    else:
        print(f"unknown system {system!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))
