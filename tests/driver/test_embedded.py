"""The embedded PostgreSQL on a data directory it did not leave cleanly, or cannot open."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from harness import PGTICK, ROOT, free_port, wait_for
from pgtick.embedded import EmbeddedPostgres, _bundled_major


@pytest.fixture
def home() -> Iterator[Path]:
    """A PGTICK_HOME outside pytest's base directory (as root the server runs as its own user,
    which pytest's private directories would lock out)."""
    path = Path(tempfile.mkdtemp(prefix="pgtick-embedded-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_data_directory_of_another_postgresql_major_version_is_refused_in_one_line(home: Path) -> None:
    """Data that the wheel's PostgreSQL cannot open (another major version: an older pgserver
    made it): every command that would start the server says so, in one line, with what to do,
    not in pg_ctl's traceback."""
    (home / "pgdata").mkdir()
    (home / "pgdata" / "PG_VERSION").write_text("9\n")
    done = _dsn_under(home)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert "is of PostgreSQL 9, and the installed pgserver runs PostgreSQL" in done.stderr, done.stderr
    assert "pg_upgrade" in done.stderr, done.stderr


def test_a_data_directory_the_server_cannot_start_on_is_said_in_one_line(home: Path) -> None:
    """A data directory of the right version that the server still cannot open (here, all but
    its PG_VERSION lost): the command says why from the server's log, not pg_ctl's traceback."""
    (home / "pgdata").mkdir()
    (home / "pgdata" / "PG_VERSION").write_text(f"{_bundled_major()}\n")
    done = _dsn_under(home)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # not pgserver's own log lines besides (the log is in the data)
    assert lines[0].startswith(f"pgtick dsn: error: the embedded PostgreSQL did not start on {home}"), lines
    assert "postgresql.conf" in lines[0], lines


def test_a_stale_postmaster_pid_that_another_process_now_has_does_not_keep_the_server_down(
    home: Path,
) -> None:
    """The server killed with -9, then its pid reused by another process (a restart of the
    machine or container): the next start must see that process is not the server, rather
    than hand out a socket nothing listens on (every command then failed after a minute)."""
    data = home / "pgdata"
    first = EmbeddedPostgres(data)
    first.start()
    stranger: subprocess.Popen[bytes] | None = None
    second: EmbeddedPostgres | None = None
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        postmaster = psutil.Process(int(lines[0]))
        processes = [postmaster, *postmaster.children()]
        postmaster.send_signal(signal.SIGKILL)
        wait_for(
            "the killed server's processes to be gone",
            lambda: all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in processes),
            timeout=120,
        )
        stranger = subprocess.Popen(["sleep", "600"])
        lines[0] = str(stranger.pid)
        (data / "postmaster.pid").write_text("\n".join(lines) + "\n")
        socket_lock = Path(lines[4]) / f".s.PGSQL.{lines[3]}.lock"
        if socket_lock.exists():
            held = socket_lock.read_text().splitlines()
            socket_lock.write_text("\n".join([str(stranger.pid), *held[1:]]) + "\n")
        second = EmbeddedPostgres(data)
        with psycopg.connect(second.start(), connect_timeout=30) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert stranger.poll() is None, "the process that had the stale pid was touched"
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait(30)
        for server in (second, first):
            if server is not None:
                server.stop()


@pytest.mark.timeout(400)
def test_a_server_a_command_started_stays_up_for_psql_and_the_next_web_stops_it(home: Path) -> None:
    """`psql "$(pgtick dsn)"` connects after `pgtick dsn` has exited: a command other than
    `run` and `web` leaves the server it started running, and the next `run` or `web` on the
    same data stops it when it exits (docs/cli.md)."""
    env = _home_env(home)
    done = _pgtick(env, "dsn")
    assert done.returncode == 0, done
    pidfile = home / "pgdata" / "postmaster.pid"
    with psycopg.connect(done.stdout.strip(), connect_timeout=30) as conn:
        assert conn.execute("SELECT count(*) FROM jobs.definitions").fetchone() == (0,)
    assert pidfile.exists()
    port = free_port()
    web = subprocess.Popen(
        [*PGTICK, "web", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert web.stdout is not None
        first = web.stdout.readline()
        assert "dashboard on" in first, first + web.stdout.read()
    finally:
        web.send_signal(signal.SIGINT)
        assert web.wait(120) in (0, 130)  # 130: stopped by Ctrl-C
    wait_for("the embedded server to stop", lambda: not pidfile.exists(), timeout=60, interval=0.2)


def _pgtick(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PGTICK, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _home_env(home: Path) -> dict[str, str]:
    """This environment with `$PGTICK_HOME` set to ``home`` and no DSN: commands use the
    embedded server there."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env["PGTICK_HOME"] = str(home)
    return env


def _dsn_under(home: Path) -> subprocess.CompletedProcess[str]:
    """`pgtick dsn` with the embedded server under ``home``."""
    return _pgtick(_home_env(home), "dsn")


def _dsn_connects(home: Path) -> None:
    """`pgtick dsn` under ``home`` starts the server without a traceback and its DSN connects."""
    done = _dsn_under(home)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done
    with psycopg.connect(done.stdout.strip(), connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_dsn_names_the_servers_port_and_survives_a_data_path_with_uri_characters(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server started by a command under `$PGPORT` (its socket is `.s.PGSQL.5999`), then
    `pgtick status` and `psql "$(pgtick dsn)"` from a shell without it, or with another one (a
    second PostgreSQL's): the DSN carries the port, and the socket directory percent-encoded (a
    `%`, `#` or `&` in the path is not the URI's)."""
    odd = home / "a%41#b"
    odd.mkdir()
    odd.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN", "PGPORT")}
    env["PGTICK_HOME"] = str(odd)
    server = EmbeddedPostgres(odd / "pgdata")
    try:
        started = _pgtick({**env, "PGPORT": "5999"}, "dsn")
        assert started.returncode == 0, started
        assert (odd / "pgdata" / ".s.PGSQL.5999").exists()
        status = _pgtick(env, "status")
        assert status.returncode == 0, status
        again = _pgtick({**env, "PGPORT": "5433"}, "dsn")
        assert again.returncode == 0, again
        monkeypatch.setenv("PGPORT", "5433")
        for dsn in (started.stdout.strip(), again.stdout.strip()):
            with psycopg.connect(dsn, connect_timeout=30) as conn:
                assert conn.execute("SELECT current_setting('data_directory')").fetchone() == (
                    str(odd / "pgdata"),
                )
    finally:
        server.start()
        server.stop()


@pytest.mark.parametrize(
    "left", ["", "4242\n", "4242\n{data}\n1700000000\n5432\n"], ids=["empty", "pid", "half"]
)
def test_a_postmaster_pid_the_server_did_not_finish_writing_does_not_wedge_every_command(
    home: Path, left: str
) -> None:
    """The server killed while it wrote its postmaster.pid (at start, or on a full disk): a file
    empty or short of its eight lines, with no server behind it. Every command stopped on it
    with a traceback until the file was removed by hand; the next start removes it."""
    data = home / "pgdata"
    server = EmbeddedPostgres(data)
    server.start()
    server.stop()
    assert not (data / "postmaster.pid").exists()
    nobody = subprocess.Popen(["true"])
    nobody.wait(30)  # a pid that is gone
    (data / "postmaster.pid").write_text(left.replace("4242", str(nobody.pid)).format(data=data))
    try:
        _dsn_connects(home)
    finally:
        server.start()
        server.stop()


@pytest.mark.parametrize("name", ["my data", "a&b", "it's"])
def test_a_data_directory_path_the_server_cannot_be_given_is_refused_saying_why(
    home: Path, name: str
) -> None:
    """pgserver hands the socket directory (the data directory) to the server through a shell,
    unquoted: a space or a shell character in its path broke the start with the server's
    `Try "postgres --help"`, or ran what followed an `&`. The command says what is wrong."""
    odd = home / name
    odd.mkdir()
    odd.chmod(0o755)
    done = _dsn_under(odd)
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"cannot run on {odd / 'pgdata'}" in lines[0], lines
    assert "PGTICK_HOME" in lines[0], lines


@pytest.mark.parametrize("left", ["", "[12, 3", '{"pid": 1}'], ids=["empty", "cut", "not-a-list"])
def test_a_list_of_server_users_left_unreadable_does_not_wedge_every_command(home: Path, left: str) -> None:
    """pgserver keeps the processes on the server in `.handle_pids.json`, rewritten in place: a
    full disk or a crash as it writes leaves it empty or cut. Every command then stopped with
    a JSONDecodeError traceback; the next start begins a new list."""
    data = home / "pgdata"
    server = EmbeddedPostgres(data)
    server.start()
    server.stop()
    (data / ".handle_pids.json").write_text(left)
    try:
        _dsn_connects(home)
    finally:
        server.start()
        server.stop()
    assert not (data / "postmaster.pid").exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounts a small tmpfs: root")
def test_a_full_disk_is_said_with_the_servers_reason_not_a_log_that_is_not_there(home: Path) -> None:
    """initdb on a full disk: it says why on its stderr and leaves no log. The command named a
    log that did not exist; it says the disk is full."""
    full = home / "full"
    full.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=755", "tmpfs", str(full)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        done = _dsn_under(full)
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        said = f"pgtick dsn: error: the embedded PostgreSQL did not start on {full}"
        assert lines[0].startswith(said), lines
        assert "No space left on device" in lines[0], lines
    finally:
        subprocess.run(["umount", str(full)], check=True, timeout=60)


def test_a_user_pid_now_the_servers_own_process_does_not_keep_the_server_up(home: Path) -> None:
    """A process on the server killed with -9 stays on pgserver's list of its users; when its pid
    is reused by one of the server's own processes (in a container, pids are few and the
    server's come next), the last pgtick out took that for a user and left the server running."""
    data = home / "pgdata"
    server = EmbeddedPostgres(data)
    server.start()
    try:
        postmaster = int((data / "postmaster.pid").read_text().splitlines()[0])
        backends = [p.pid for p in psutil.Process(postmaster).children()]
        users = json.loads((data / ".handle_pids.json").read_text())
        (data / ".handle_pids.json").write_text(json.dumps([*users, postmaster, *backends]))
    finally:
        server.stop()
    wait_for("the server to stop", lambda: not (data / "postmaster.pid").exists(), timeout=60, interval=0.2)


@pytest.mark.timeout(400)
def test_a_server_slower_to_start_than_pgservers_ten_seconds_is_waited_for(home: Path) -> None:
    """pgserver gives `pg_ctl start` ten seconds; a server in crash recovery, or on a loaded
    machine, takes longer and still comes up. The command failed meanwhile; it waits."""
    data = home / "pgdata"
    first = EmbeddedPostgres(data)
    first.start()
    first.stop()
    held: list[int] = []

    def hold_the_postmaster() -> None:  # stopped before it is ready, for longer than ten seconds
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not held:
            try:
                pid = int((data / "postmaster.pid").read_text().splitlines()[0])
            except (FileNotFoundError, IndexError, ValueError):
                time.sleep(0.005)
                continue
            os.kill(pid, signal.SIGSTOP)
            held.append(pid)
        if held:
            time.sleep(15)
            os.kill(held[0], signal.SIGCONT)

    holder = threading.Thread(target=hold_the_postmaster)
    holder.start()
    second = EmbeddedPostgres(data)
    try:
        dsn = second.start()
        holder.join(60)
        assert held, "the postmaster was never seen starting"
        with psycopg.connect(dsn, connect_timeout=30) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        holder.join(60)
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        second.start()
        second.stop()
