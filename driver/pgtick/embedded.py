"""Embedded PostgreSQL for ``pgtick run`` without a DSN, and for tests.

The ``pgserver`` package ships PostgreSQL binaries in a wheel; this module
starts one on a data directory (persistent under the user's data directory by
default, or a throwaway one), returns its DSN, and stops it cleanly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import psycopg

from pgtick.errors import PgtickError

log = logging.getLogger("pgtick.embedded")


class EmbeddedServerError(PgtickError):
    """The embedded PostgreSQL cannot run on its data directory (one line, for the CLI)."""


def default_data_dir() -> Path:
    """Where ``pgtick run`` keeps its embedded database: $PGTICK_HOME or the XDG data dir."""
    home = os.environ.get("PGTICK_HOME")
    if home:
        return Path(home).expanduser() / "pgdata"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pgtick" / "pgdata"


class EmbeddedPostgres:
    """A PostgreSQL server from the ``pgserver`` wheel on one data directory.

    ``ephemeral=True`` puts the data in a fresh temporary directory that is
    deleted on ``stop()``; ``fast=True`` turns off fsync and synchronous
    commit (for tests: durability traded for speed).
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        ephemeral: bool = False,
        fast: bool = False,
        max_connections: int = 200,
    ) -> None:
        self.ephemeral = ephemeral
        self.fast = fast
        self.max_connections = max_connections
        if ephemeral and data_dir is None:
            self._tmp: str | None = tempfile.mkdtemp(prefix="pgtick-pg-")
            data_dir = Path(self._tmp) / "pgdata"
        else:
            self._tmp = None
        self.data_dir = (data_dir or default_data_dir()).expanduser().resolve()
        self._server: Any = None

    @property
    def dsn(self) -> str:
        """The server's socket directory, percent-encoded (a data directory's path may hold
        ``%`` or ``#``), and its port: the socket's name has it (``.s.PGSQL.5432``), and a
        ``$PGPORT`` set when the server started, or when a client connects, must not point
        the DSN at a socket that is not there."""
        if self._server is None:
            raise RuntimeError("embedded PostgreSQL is not running")
        info = self._server.get_postmaster_info()
        if info.socket_dir is None:  # pgserver listens on TCP on Windows only
            return str(self._server.get_uri())
        host = quote(str(info.socket_dir), safe="/")
        return f"postgresql://postgres:@/postgres?host={host}&port={info.port}"

    def start(self) -> str:
        """Start (or attach to) the server; returns a DSN for the ``postgres`` database."""
        with warnings.catch_warnings():  # pgserver warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from pgserver.postgres_server import PostgresServer, get_server  # slow import: late

        unsafe = sorted({c for c in str(self.data_dir) if c.isspace() or c in _SHELL_CHARACTERS})
        if unsafe:  # pgserver passes the socket directory (this one) to pg_ctl -o unquoted
            raise EmbeddedServerError(
                f"the embedded PostgreSQL cannot run on {self.data_dir}: its path has"
                f" {' '.join(map(repr, unsafe))}, which the server's start command does not quote;"
                " set $PGTICK_HOME to a directory whose path has none"
            )
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self._tmp is not None:
            os.chmod(self._tmp, 0o755)  # pgserver runs postgres as its own user when root
        self._refuse_another_major()
        with PostgresServer._lock:
            _forget_stale_postmaster(self.data_dir)
            _forget_unreadable_users(self.data_dir)
        # pgserver caches handles per directory; a stopped one must not be reused.
        PostgresServer._instances.pop(self.data_dir, None)
        failed = _FailedCommands()
        try:
            with failed:
                try:
                    self._server = get_server(self.data_dir, cleanup_mode=None)
                except subprocess.TimeoutExpired:
                    # pgserver gives pg_ctl start ten seconds; a server in crash recovery, or
                    # on a loaded machine, takes longer and still comes up: wait for it.
                    if not _ready(self.data_dir, timeout=300):
                        raise
                    PostgresServer._instances.pop(self.data_dir, None)
                    self._server = get_server(self.data_dir, cleanup_mode=None)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            # initdb says why on its stderr (a full disk) and writes no log; pg_ctl in the log.
            why = _fatal(failed.stderr) or _why(self.data_dir / "log")
            raise EmbeddedServerError(
                f"the embedded PostgreSQL did not start on {self.data_dir}: {why}"
            ) from exc
        if self._settings_differ():
            # Two pgtick commands started at once on a fresh directory must not both
            # restart the server: pgserver's machine-wide lock lets one configure it.
            with PostgresServer._lock:
                if self._settings_differ():
                    self._configure()
        log.info('embedded PostgreSQL, data in %s; watch it with: psql "%s"', self.data_dir, self.dsn)
        return self.dsn

    def _refuse_another_major(self) -> None:
        """Raise EmbeddedServerError when the data directory is of another PostgreSQL major
        version than the pgserver wheel's (made by another pgserver release, or by hand):
        its server cannot open it, and pgtick does not upgrade it."""
        try:
            theirs = (self.data_dir / "PG_VERSION").read_text().strip()
        except FileNotFoundError:  # a new directory: initdb makes it
            return
        ours = _bundled_major()
        if ours is not None and theirs != ours:
            raise EmbeddedServerError(
                f"the embedded PostgreSQL data in {self.data_dir} is of PostgreSQL {theirs}, and"
                f" the installed pgserver runs PostgreSQL {ours}: upgrade the data with pg_upgrade,"
                " or move the directory aside (or set $PGTICK_HOME) to start anew"
            )

    def _wanted(self) -> dict[str, str]:
        wanted = {"max_connections": str(self.max_connections)}
        if self.fast:
            wanted.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        return wanted

    def _settings_differ(self) -> bool:
        deadline = time.monotonic() + 60
        while True:  # another process may be restarting the server right now
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    for name, value in self._wanted().items():
                        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
                        if row is None or row[0] != value:
                            return True
                return False
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _configure(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for name, value in self._wanted().items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")  # names are ours, not input
        self.restart()

    def restart(self) -> None:
        """Restart the server process (same data, same socket)."""
        self._pg_ctl(["-w", "-m", "fast", "-l", str(self.data_dir / "log"), "restart"])

    def halt(self) -> None:
        """Stop the server but keep its data (``start()`` brings it back): outage drills."""
        self._pg_ctl(["-w", "-m", "fast", "stop"])

    def _pg_ctl(self, args: list[str]) -> None:
        from pgserver import _commands

        _commands.pg_ctl(  # type: ignore[attr-defined]  # generated at import
            args, pgdata=self.data_dir, user=self._server.system_user, timeout=60
        )

    def stop(self) -> None:
        """Stop the server, unless another live process still uses it (a second ``pgtick run``
        or ``pgtick web`` on the same data directory: the last one out stops it); an
        ephemeral one is always stopped and loses its data directory."""
        if self._server is not None:
            others = [] if self._tmp is not None else self._other_users()
            if others:
                log.info(
                    "embedded PostgreSQL left running: still used by pid %s",
                    ", ".join(map(str, others)),
                )
            else:
                try:
                    self._pg_ctl(["-w", "-m", "fast", "stop"])
                except Exception as exc:  # already stopped: nothing to do
                    log.debug("pg_ctl stop: %s", exc)
            self._server = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _other_users(self) -> list[int]:
        """Take this process off the server's list of users (pgserver keeps one in the data
        directory, under its machine-wide lock); the other processes on it that still live
        (one killed with -9 never took itself off; its pid, reused by one of the server's own
        processes, is no user)."""
        from pgserver.postgres_server import PostgresServer

        me = os.getpid()
        with PostgresServer._lock:
            users = self._server.global_process_id_list.get_and_remove(me)
        return [pid for pid in users if pid != me and _alive(pid) and not _postgres(pid)]

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


#: What a shell reads in an unquoted word (besides white space).
_SHELL_CHARACTERS = frozenset("&;|$`'\"\\()<>*?[]{}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _ready(data_dir: Path, timeout: float) -> bool:
    """Wait for the server starting on data_dir to say it is ready in its postmaster.pid; False
    when it stops (or its file goes) first, or after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            lines = (data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
            pid = int(lines[0])
        except (FileNotFoundError, IndexError, ValueError):
            return False
        if not _alive(pid):
            return False
        if len(lines) == _POSTMASTER_PID_LINES and lines[-1].strip() == "ready":
            return True
        time.sleep(0.2)
    return False


def _postgres(pid: int) -> bool:
    """Whether pid is a PostgreSQL server process (the postmaster or a backend)."""
    import psutil

    try:
        return bool(psutil.Process(pid).name() == "postgres")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _bundled_major() -> str | None:
    """The major version of the pgserver wheel's PostgreSQL ("16"), or None if it cannot say."""
    with warnings.catch_warnings():  # pgserver warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH

    try:
        out = subprocess.run(
            [str(POSTGRES_BIN_PATH / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\(PostgreSQL\) (\d+)", out)
    return match.group(1) if match else None


def _forget_stale_postmaster(data_dir: Path) -> None:
    """Remove the lock files of a server that no longer runs when PostgreSQL or pgserver would
    not start beside them: its pid now another process's (a server killed with -9, then a
    restart of the machine or container reuses its pid: pgserver would take that process for
    the server and hand out a socket nothing listens on, and PostgreSQL would refuse to start),
    or a file short of its eight lines (the server killed as it wrote it, or a full disk:
    pgserver cannot read it, PostgreSQL refuses an empty one). A complete file whose pid is
    gone is PostgreSQL's to see stale; one whose pid is a postgres of this data directory is
    the server, left alone. Called under pgserver's machine-wide lock, so no other pgtick is
    starting the server meanwhile."""
    import psutil

    pidfile = data_dir / "postmaster.pid"
    try:
        lines = pidfile.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return
    complete = len(lines) == _POSTMASTER_PID_LINES
    try:
        pid: int | None = int(lines[0])
    except (IndexError, ValueError):
        pid = None
    if pid is None:
        running = _postgres_on(data_dir)
        if running is not None:
            raise EmbeddedServerError(
                f"PostgreSQL pid {running} runs on {data_dir} but its postmaster.pid is not complete:"
                " it is starting or stopping; try again"
            )
    else:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE and str(data_dir) in process.cmdline():
                if complete:
                    return  # the server itself
                raise EmbeddedServerError(
                    f"PostgreSQL pid {pid} on {data_dir} is starting or stopping; try again"
                )
        except psutil.NoSuchProcess:
            if complete:
                return
        except psutil.AccessDenied:  # another user's process: perhaps the server, left alone
            return
    log.warning("embedded PostgreSQL: removing the stale postmaster.pid of pid %s (not the server)", pid)
    if pid is not None and len(lines) > 4 and lines[3].strip() and lines[4].strip():  # port, socket dir
        socket_lock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock"
        try:
            if socket_lock.read_text().splitlines()[:1] == [str(pid)]:
                socket_lock.unlink()
        except (OSError, UnicodeDecodeError):  # none left, or not readable: PostgreSQL will say
            pass
    pidfile.unlink(missing_ok=True)


def _forget_unreadable_users(data_dir: Path) -> None:
    """Start a new list of the processes on the server when pgserver's is not a JSON list of
    pids (it rewrites the file in place: a full disk or a crash as it writes leaves it empty or
    cut, and pgserver then fails every start on it). Called under pgserver's machine-wide lock."""
    users = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(users.read_text(errors="replace"))
    except FileNotFoundError:
        return
    except ValueError:
        pids = None
    if isinstance(pids, list) and all(type(pid) is int for pid in pids):
        return
    log.warning("embedded PostgreSQL: %s is not a list of pids: starting a new one", users)
    users.write_text("[]")


#: pid, data directory, start time, port, socket directory, listen address, shared memory, status.
_POSTMASTER_PID_LINES = 8


def _postgres_on(data_dir: Path) -> int | None:
    """The pid of a postgres process started on data_dir, if one runs."""
    import psutil

    for process in psutil.process_iter(attrs=["name", "cmdline"]):
        if process.info["name"] == "postgres" and str(data_dir) in (process.info["cmdline"] or []):
            return int(process.pid)
    return None


class _FailedCommands(logging.Handler):
    """The stderr of the PostgreSQL commands pgserver ran and saw fail, taken from its ERROR
    log record (pgserver keeps it nowhere else), while pgtick's logging drops those records."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.stderr: list[str] = []
        self._logger = logging.getLogger("pgserver")
        self._saved = (self._logger.level, self._logger.propagate)

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Failed postgres command") and isinstance(record.args, tuple):
            self.stderr.extend(line for line in str(record.args[-1]).splitlines() if line.strip())

    def __enter__(self) -> None:
        self._saved = (self._logger.level, self._logger.propagate)
        if not self._logger.isEnabledFor(logging.ERROR):  # to be seen here, not shown
            self._logger.setLevel(logging.ERROR)
            self._logger.propagate = False
        self._logger.addHandler(self)

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved[0])
        self._logger.propagate = self._saved[1]


def _fatal(lines: list[str]) -> str | None:
    """The last FATAL line (and the DETAIL line after it) of a server's output, if any."""
    for at in range(len(lines) - 1, -1, -1):
        if "FATAL:" in lines[at]:
            why = lines[at].split("FATAL:", 1)[1].strip()
            if at + 1 < len(lines) and "DETAIL:" in lines[at + 1]:
                why += f" ({lines[at + 1].split('DETAIL:', 1)[1].strip()})"
            return why
    return None


def _why(server_log: Path) -> str:
    """The server log's last FATAL line (and its DETAIL), else its last line, else where to
    read the log."""
    try:
        lines = [line for line in server_log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    fatal = _fatal(lines)
    if fatal is not None:
        return fatal
    return lines[-1].strip() if lines else f"see its log, {server_log}"
