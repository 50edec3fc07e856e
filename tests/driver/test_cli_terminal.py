"""The CLI under a real pseudo-terminal (colour, marks, progress bars) and without one
(plain text, one-line summaries), its log lines, and shell completion."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from harness import (
    PGTICK,
    ROOT,
    Database,
    env_for,
    in_pty,
    migrated_server,
    pgtick,
    pgtick_in_foreground,
    scalar,
    tty_env,
    wait_for,
)
from pgtick.embedded import EmbeddedPostgres
from pgtick.scheduler import materialize_backfills

SCHEMAS = ROOT / "docs" / "schemas"


def add_history(conn: Any, finished: int) -> None:
    conn.execute(
        "INSERT INTO jobs.runs (kind, status, started_at, finished_at, scheduled_for)"
        " SELECT 'k', 'COMPLETED', now() - interval '3 days', now() - interval '3 days',"
        " now() - interval '3 days' FROM generate_series(1, %s)",
        (finished,),
    )
    conn.execute("SELECT jobs.define('nightly', 'k', schedule => '0 3 * * *', timezone => 'Europe/Sofia')")
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, status, started_at, finished_at, failure_reason, error)"
        " SELECT id, 'k', 'FAILED', now() - interval '1 minute', now(), 'Error', 'boom'"
        " FROM jobs.definitions WHERE name = 'nightly'"
    )


def test_status_on_a_terminal_has_colour_and_marks(db: Database) -> None:
    with db.connect() as conn:
        add_history(conn, 1)
    code, out = in_pty(["status", "--dsn", db.dsn], tty_env())
    assert code == 0, out
    assert "\033[" in out, f"colour on a terminal:\n{out!r}"
    assert "✗" in out, out


def test_status_on_a_terminal_with_no_color_has_letters_and_no_escapes(db: Database) -> None:
    with db.connect() as conn:
        add_history(conn, 1)
    code, out = in_pty(["status", "--dsn", db.dsn], tty_env(NO_COLOR="1"))
    assert code == 0, out
    assert "\033[" not in out and "✗" not in out, out
    assert " F FAILED" in out, out


def test_status_piped_is_plain(db: Database) -> None:
    with db.connect() as conn:
        add_history(conn, 1)
    result = pgtick("status", "--dsn", db.dsn)
    assert result.returncode == 0, result.stderr
    assert "\033[" not in result.stdout and "✗ FAILED" in result.stdout, result.stdout
    assert result.stderr == "", "nothing on stderr but diagnostics"


def test_prune_draws_a_progress_bar_on_a_terminal_and_one_line_when_piped(db: Database) -> None:
    with db.connect() as conn:
        add_history(conn, 20000)
    code, out = in_pty(["prune", "--older-than", "1d", "--batch", "500", "--dsn", db.dsn], tty_env())
    assert code == 0, out
    assert "prune" in out and "━" in out, f"a progress bar:\n{out!r}"
    assert "deleted 20000 finished runs" in out, out
    with db.connect() as conn:
        add_history(conn, 3000)
        assert (
            scalar(conn, "SELECT count(*) FROM jobs.runs WHERE finished_at < now() - interval '1 day'")
            == 3000
        )
    result = pgtick("prune", "--older-than", "1d", "--batch", "500", "--dsn", db.dsn)
    assert (result.returncode, result.stdout, result.stderr) == (0, "deleted 3000 finished runs\n", "")


def test_migrate_draws_a_progress_bar_on_a_terminal(db: Database, pg: Any) -> None:
    empty = pg.create_empty_database()
    try:
        code, out = in_pty(["migrate", "--dsn", empty.dsn], tty_env())
        assert code == 0, out
        assert "migrate" in out and "━" in out, f"a progress bar:\n{out!r}"
        assert "applied migrations: 0001" in out, out
        piped = pgtick("migrate", "--dsn", empty.dsn)
        assert (piped.returncode, piped.stdout, piped.stderr) == (0, "schema up to date\n", "")
    finally:
        pg.drop_database(empty)


def test_backfill_draws_a_progress_bar_on_a_terminal_and_one_line_when_piped(db: Database) -> None:
    """A backfill of thousands of occurrences: a bar over the window on a terminal, the
    summary line alone on stdout (and nothing on stderr) when piped."""
    with db.connect() as conn:
        for name in ("minutely", "minutely-2"):
            conn.execute("SELECT jobs.define(%s, 'k', schedule => '* * * * *')", (name,))
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=1)
    window = ["--from", (end - timedelta(days=5)).isoformat(), "--to", end.isoformat()]
    occurrences = 5 * 24 * 60 + 1
    code, out = in_pty(["backfill", "minutely", *window, "--dsn", db.dsn], tty_env(), timeout=180)
    assert code == 0, out
    assert "backfill" in out and "━" in out and "%" in out, f"a progress bar:\n{out!r}"
    assert f"runs={occurrences} " in out, out
    quiet = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"}  # the default: WARNING
    piped = subprocess.run(
        [*PGTICK, "backfill", "minutely-2", *window, "--dsn", db.dsn],
        capture_output=True,
        text=True,
        timeout=180,
        env=quiet,
        cwd=ROOT,
    )
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert len(piped.stdout.splitlines()) == 1 and f"runs={occurrences} " in piped.stdout, piped.stdout


def test_a_reader_that_leaves_early_gets_no_traceback(db: Database) -> None:
    """`pgtick runs | head -1`: the pipe closes before the CLI writes; it stops quietly
    (exit 1, nothing on stderr) instead of printing a BrokenPipeError traceback."""
    with db.connect() as conn:
        add_history(conn, 5)
    quiet = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"}
    proc = subprocess.Popen(
        [*PGTICK, "runs", "--dsn", db.dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=quiet,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the CLI has even connected
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, err
    assert err == "", f"nothing on stderr when the reader left:\n{err}"


def test_a_reader_that_leaves_in_the_middle_of_the_install_script_gets_exit_1() -> None:
    """`pgtick migrate --sql | head -c 10`: the script is larger than a pipe holds, so the
    reader leaves while it is being written; the command says so by its exit code, 1, as a
    list does, with nothing on stderr."""
    quiet = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"}
    proc = subprocess.Popen(
        [*PGTICK, "migrate", "--sql"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=quiet, cwd=ROOT
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b"-- pgtick ", "the script starts with its comment"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, err
    assert err == "", f"nothing on stderr when the reader left:\n{err}"


def _interrupted(code: str, *args: str, env: dict[str, str] | None = None) -> tuple[bytes, int, bytes, bytes]:
    """Run ``python -c code args``, send it SIGINT once it has written its first line on
    stderr; its first line, exit code, stdout and the rest of its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell does
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return first, proc.returncode, out, err


def test_ctrl_c_while_the_command_line_is_read_ends_quietly(db: Database) -> None:
    """Ctrl-C while the parser is built and the arguments are read, before the command runs,
    is exit 130 and nothing on stderr, as it is later. The process says when it starts to
    build the parser and gets SIGINT right then (a loaded machine may let the command finish
    first: exit 0)."""
    code = (
        "import sys; from pgtick import cli; build = cli.build_parser\n"
        "def announced():\n"
        "    print('parsing', file=sys.stderr, flush=True)\n"
        "    return build()\n"
        "cli.build_parser = announced; cli.entry()"
    )
    quiet = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"}
    for _ in range(3):
        first, code_, _, err = _interrupted(code, "runs", "--dsn", db.dsn, env=quiet)
        shown = f"exit {code_}\nstderr: {(first + err).decode(errors='replace')}"
        assert first == b"parsing\n", shown
        assert code_ in (130, 0) and err == b"", shown


def test_ctrl_c_while_the_command_loads_its_modules_ends_quietly() -> None:
    """The ``pgtick`` command (and ``python -m pgtick``) loads psycopg and the driver before it
    reads its arguments: a Ctrl-C then is exit 130 and nothing on stderr. The import of psycopg
    is held until the signal comes, so the signal lands inside it."""
    code = (
        "import sys, time, importlib.abc\n"
        "class Hold(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'psycopg':\n"
        "            print('loading', file=sys.stderr, flush=True)\n"
        "            time.sleep(60)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hold())\n"
        "from pgtick.__main__ import main\n"
        "main()"
    )
    first, code_, out, err = _interrupted(code, "--version")
    shown = f"exit {code_}\nstderr: {(first + err).decode(errors='replace')}"
    assert first == b"loading\n", shown
    assert (code_, out, err) == (130, b"", b""), shown


def _watch_into_a_pipe(db: Database, options: list[str], enough: Callable[[bytes], bool]) -> bytes:
    """What `pgtick status --watch 0.2 OPTIONS` writes into a pipe until ``enough`` of it has
    come (or 60 s have passed); the command is stopped then."""
    with db.connect() as conn:
        add_history(conn, 1)
    quiet = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"}
    proc = subprocess.Popen(
        [*PGTICK, "status", "--watch", "0.2", *options, "--dsn", db.dsn],
        stdout=subprocess.PIPE,
        env=quiet,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + 60
    try:
        while not enough(out) and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                out += os.read(proc.stdout.fileno(), 65536)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


def test_status_watch_into_a_pipe_prints_snapshots_without_screen_codes(db: Database) -> None:
    text = _watch_into_a_pipe(db, [], lambda out: out.count(b"DEFINITION") >= 2).decode()
    assert text.count("DEFINITION") >= 2, f"two snapshots within 60 s:\n{text}"
    assert "\033[" not in text, f"no screen codes into a pipe:\n{text!r}"


def test_status_watch_json_prints_one_document_per_line_valid_against_the_schema(db: Database) -> None:
    """`status --watch N --json` is JSON lines: each snapshot one `status --json` document on
    a line of its own, so that a script reads them as they come."""
    out = _watch_into_a_pipe(db, ["--json"], lambda out: out.count(b"\n") >= 2)
    lines = out.decode().splitlines()[:2]
    assert len(lines) == 2, f"two snapshots within 60 s:\n{out!r}"
    schema = json.loads((SCHEMAS / "status.json").read_text())
    for line in lines:
        jsonschema.validate(json.loads(line), schema, cls=jsonschema.Draft202012Validator)


def test_run_logs_one_json_line_per_outcome(db: Database, tmp_path: Path) -> None:
    """`pgtick run --log-format json`: every stderr line is a JSON object valid against the
    documented schema, and each run outcome is one line with its id, kind, definition,
    status, attempt and duration."""
    app = tmp_path / "outcomes_app.py"
    app.write_text(
        "from pgtick.app import App\n"
        "app = App('outcomes')\n"
        "@app.job('ok')\n"
        "def ok(ctx):\n    ctx.logger.info('hello from the job')\n"
        "@app.job('bad')\n"
        "def bad(ctx):\n    raise ValueError('nope')\n"
    )
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('often', 'ok', schedule => '* * * * *')")
        ok_run = scalar(conn, "SELECT id FROM jobs.run_now('often')")
        bad_run = scalar(conn, "SELECT id FROM jobs.enqueue('bad')")
    env = env_for(None)
    env.pop("PGTICK_LOG", None)
    env["PGTICK_LOG_FORMAT"] = "json"
    log = tmp_path / "run.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*PGTICK, "run", str(app), "--dsn", db.dsn, "--no-scheduler"],
            stdout=subprocess.PIPE,
            stderr=sink,
            env=env,
            cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if log.read_text().count('"event": "run_outcome"') >= 2:
                    break
                time.sleep(0.2)
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=60)
    assert out == b"", "pgtick run prints nothing on stdout"
    schema = json.loads((SCHEMAS / "log-line.json").read_text())
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    for line in lines:
        jsonschema.validate(line, schema)
    outcomes = {o["run_id"]: o for o in lines if o.get("event") == "run_outcome"}
    assert outcomes[ok_run]["status"] == "COMPLETED" and outcomes[ok_run]["definition"] == "often"
    assert outcomes[bad_run]["status"] == "FAILED" and outcomes[bad_run]["kind"] == "bad"
    assert outcomes[bad_run]["error"] == "ValueError: nope"
    assert {"attempt", "duration_s", "worker"} <= set(outcomes[ok_run])
    (said,) = [line for line in lines if line["message"] == "hello from the job"]
    assert (said["logger"], said["run_id"], said["kind"]) == ("pgtick.job", ok_run, "ok")
    # Start and stop, at the default level: the worker id an operator watches a drain by.
    worker = outcomes[ok_run]["worker"]
    said = [line["message"] for line in lines if line["logger"] == "pgtick.worker"]
    assert any(m.startswith(f"worker={worker} started kinds=bad,ok") for m in said), said
    assert f"worker={worker} stopped" in said, said


def test_completion_offers_the_commands(tmp_path: Path) -> None:
    """Shell completion (argcomplete): what bash, zsh and fish get for `pgtick st<TAB>`."""
    out = tmp_path / "completions"
    line = "pgtick st"
    env = env_for(None) | {
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    subprocess.run([*PGTICK], env=env, cwd=ROOT, timeout=60, check=False, capture_output=True)
    assert set(out.read_text().split()) == {"status"}, out.read_text()


class OnPty:
    """A command that never ends by itself (``status --watch``) on a pseudo-terminal of
    ``rows`` x ``columns``: read what it writes until a condition holds, then interrupt it as
    Ctrl-C does."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int, columns: int) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
        self.master = master
        self.out = b""
        self.proc = subprocess.Popen(
            [*PGTICK, *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=ROOT,
            # As a shell starts a foreground command: Ctrl-C interrupts it, even where this test
            # runs with SIGINT ignored (a background job of a script), which a child inherits.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.close(slave)

    def read_until(self, done: Any, timeout: float = 60) -> bool:
        """Read until ``done(all output so far)`` holds (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while not done(self.out):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return bool(done(self.out))
            if select.select([self.master], [], [], 0.5)[0]:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:  # EIO: the command is gone
                    return bool(done(self.out))
        return True

    def interrupt(self) -> int:
        """Ctrl-C; the exit code, once all it wrote is read."""
        self.proc.send_signal(signal.SIGINT)
        # Read on while it stops: a redraw it writes meanwhile would fill the terminal's buffer
        # and block it in the write, never to exit.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                self.out += chunk
                if chunk:
                    continue
            if self.proc.poll() is not None:
                break
        code = self.proc.wait(timeout=5)
        while select.select([self.master], [], [], 0.5)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.out += chunk
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def watch_in_pty(argv: list[str], env: dict[str, str], rows: int, columns: int, until: bytes) -> str:
    """Run a command that never ends by itself on a pseudo-terminal until its output holds
    ``until`` three times (or 60 s), then interrupt it as Ctrl-C does: exit 130. Returns all
    it wrote."""
    command = OnPty(argv, env, rows, columns)
    try:
        command.read_until(lambda out: out.count(until) >= 3)
        assert command.interrupt() == 130
    finally:
        command.close()
    return command.out.decode()


def define_forty(db: Database) -> None:
    with db.connect() as conn:
        conn.execute(
            "SELECT jobs.define('definition-' || i, 'k', schedule => '0 3 * * *')"
            " FROM generate_series(1, 40) AS i"
        )


def test_status_watch_on_a_short_terminal_draws_what_fits_and_ends_on_a_new_line(db: Database) -> None:
    """`pgtick status --watch` on a terminal shorter than the status: each redraw fills the
    screen from the top (the leader and the table's header stay in sight) and says how many
    lines it left out, instead of scrolling them away and filling the scrollback with a copy
    per refresh; Ctrl-C leaves the last screen there and the prompt on a line of its own."""
    define_forty(db)
    rows, columns = 12, 60
    out = watch_in_pty(
        ["status", "--watch", "0.2", "--dsn", db.dsn], tty_env(), rows, columns, until=b"\033[2J\033[H"
    )
    text = re.sub(r"\033\[[0-9;]*m", "", out)
    frames = text.split("\033[2J\033[H")[1:]
    assert len(frames) >= 3, f"three redraws within 60 s:\n{text!r}"
    for frame in frames[:-1]:
        lines = frame.split("\r\n")
        screen_rows = sum(max(1, -(-len(line) // columns)) for line in lines)
        assert screen_rows <= rows, f"a redraw {screen_rows} rows high on a {rows}-row screen:\n{frame}"
        assert lines[0].startswith("leader") and any(line.startswith("DEFINITION") for line in lines), frame
        assert re.fullmatch(r"… \d+ more lines: .*", lines[-1]), frame
    assert text.endswith("\r\n"), f"the prompt starts on a line of its own:\n{text[-200:]!r}"


@pytest.fixture
def own_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A server of this test's own, since it is stopped and started."""
    with migrated_server("SELECT jobs.define('nightly', 'k', schedule => '0 3 * * *')") as own:
        yield own


CLEAR = b"\033[2J\033[H"
LOST = re.compile(r"connection lost at \d\d:\d\d:\d\d UTC, \w+ ago: .+; next try in ")


def frames(out: bytes) -> list[str]:
    """The screens drawn so far, colour codes removed."""
    return re.sub(r"\033\[[0-9;]*m", "", out.decode(errors="replace")).split(CLEAR.decode())[1:]


@pytest.mark.parametrize("interrupted", ["while-lost", "once-back"])
def test_status_watch_keeps_its_screen_through_a_server_restart(own_server: Any, interrupted: str) -> None:
    """The server goes away under `pgtick status --watch` (a restart, a failover): the watch
    does not end; the last screen stays, headed by one line saying since when the connection
    is lost; when the server is back the status is drawn again. Ctrl-C ends it, during the
    outage as after it, leaving the prompt on a line of its own."""
    server, dsn = own_server
    rows, columns = 30, 100
    watch = OnPty(["status", "--watch", "0.2", "--dsn", dsn], tty_env(), rows, columns)
    try:
        assert watch.read_until(lambda out: len(frames(out)) >= 2), f"no status drawn:\n{watch.out!r}"
        server.halt()
        lost_at = len(frames(watch.out))

        def lost_screens(out: bytes) -> list[str]:
            return [f for f in frames(out)[lost_at:] if LOST.match(f)]

        assert watch.read_until(lambda out: len(lost_screens(out)) >= 3), f"{watch.out[-2000:]!r}"
        assert watch.proc.poll() is None, f"the watch ended with the connection:\n{watch.out[-2000:]!r}"
        for screen in lost_screens(watch.out):
            lines = screen.split("\r\n")
            assert len(lines[0]) <= columns, lines[0]
            assert lines[1].startswith("leader") and "nightly" in screen, f"last screen kept:\n{screen}"
        if interrupted == "while-lost":
            assert watch.interrupt() == 130
            assert LOST.match(frames(watch.out)[-1]), "the last screen says the connection is lost"
            assert watch.out.endswith(b"\r\n"), "the prompt starts on a line of its own"
            return
        server.start()
        back = len(frames(watch.out))
        assert watch.read_until(
            lambda out: any(f.startswith("leader") for f in frames(out)[back:]), timeout=90
        ), f"no status drawn once the server is back:\n{watch.out[-2000:]!r}"
        assert watch.interrupt() == 130
    finally:
        watch.close()
    assert watch.out.endswith(b"\r\n"), "the prompt starts on a line of its own"


def lines_of(stream: Any) -> list[bytes]:
    """The lines a pipe delivers, appended as they come by a thread of their own."""
    lines: list[bytes] = []

    def read() -> None:
        for line in iter(stream.readline, b""):
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_status_watch_into_a_pipe_says_on_stderr_when_the_connection_is_lost_and_back(
    own_server: Any,
) -> None:
    """Into a pipe the snapshots go on after an outage; stderr gets one line when the
    connection is lost and one when it is back."""
    server, dsn = own_server
    quiet = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"}
    proc = subprocess.Popen(
        [*PGTICK, "status", "--watch", "0.2", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=quiet,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell does
    )
    try:
        out, err = lines_of(proc.stdout), lines_of(proc.stderr)

        def snapshots() -> int:
            return sum(1 for line in list(out) if line.startswith(b"leader"))

        wait_for("a snapshot", lambda: snapshots() >= 1, 60)
        server.halt()
        wait_for("a line on stderr", lambda: err, 60)
        lost = err[0].decode()
        assert re.fullmatch(r"pgtick status: warning: connection lost at \S+Z: .+; retrying\n", lost), lost
        assert proc.poll() is None, "the watch ended with the connection"
        server.start()
        wait_for("a second line on stderr", lambda: len(err) >= 2, 90)
        back = err[1].decode()
        assert re.fullmatch(r"pgtick status: warning: connection back after \S+\n", back), back
        before = snapshots()
        wait_for("a snapshot once the server is back", lambda: snapshots() > before, 60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert len(err) == 2, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_dumb_terminal_gets_no_control_codes(db: Database) -> None:
    """TERM=dumb (an Emacs shell buffer) is a terminal that cannot clear its screen or draw
    a bar: `status --watch` prints one snapshot after another as into a pipe, and migrate
    prints its summary alone, with no control codes shown as text."""
    define_forty(db)
    out = watch_in_pty(
        ["status", "--watch", "0.2", "--dsn", db.dsn],
        {**tty_env(), "TERM": "dumb"},
        24,
        80,
        until=b"DEFINITION",
    )
    assert "\033" not in out, f"control codes on a dumb terminal:\n{out[:400]!r}"
    assert out.count("leader  none") >= 3, out[:400]
    code, out = in_pty(["migrate", "--dsn", db.dsn], {**tty_env(), "TERM": "dumb"})
    assert (code, out) == (0, "schema up to date\r\n")


def test_a_run_outcome_line_writes_the_errors_control_characters_out(caplog: Any) -> None:
    """The human outcome line of `pgtick run` shows the first line of a failed run's error
    with its control characters written out (``^[``): on a terminal an escape sequence in it
    would recolour the log, and journald shows a line holding one as "[blob data]". The
    JSON field keeps the error as it was."""
    from pgtick.logs import log_outcome

    error = "CalledProcessError: \033[31mFAILED\033[0m\x07 tests\nTraceback (most recent call last):"
    with caplog.at_level("INFO", logger="pgtick.outcome"):
        log_outcome(
            run_id=7,
            kind="k",
            definition=None,
            status="FAILED",
            attempt=1,
            duration=0.5,
            worker="w",
            error=error,
        )
    (record,) = [r for r in caplog.records if r.name == "pgtick.outcome"]
    line = record.getMessage()
    assert line.endswith(" error=CalledProcessError: ^[[31mFAILED^[[0m^G tests"), line
    assert record.fields["error"] == error


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_an_output_that_is_not_utf8_gets_no_traceback(db: Database, encoding: str) -> None:
    """A legacy locale's output cannot encode a Chinese or accented name: the table shows
    "?" for what it cannot write (and letters for marks), JSON escapes it and loses nothing;
    neither ends in a UnicodeEncodeError traceback."""
    name = "每日报表-café-🚀"
    with db.connect() as conn:
        conn.execute("SELECT jobs.define(%s, 'k', schedule => '0 3 * * *')", (name,))
        conn.execute(
            "INSERT INTO jobs.runs (definition_id, kind, status, started_at, finished_at, failure_reason,"
            " error) SELECT id, kind, 'FAILED', now(), now(), 'Error', '错误 …' FROM jobs.definitions"
        )
    env = {k: v for k, v in env_for(None).items() if k != "PGTICK_LOG"} | {"PYTHONIOENCODING": encoding}

    def run(*argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*PGTICK, *argv, "--dsn", db.dsn], capture_output=True, env=env, cwd=ROOT, timeout=60
        )

    for argv in (["definitions"], ["runs"], ["status"], ["show", "1"], ["runs", "--format", "csv"]):
        result = run(*argv)
        assert (result.returncode, result.stderr) == (0, b""), (argv, result.stderr.decode(errors="replace"))
        assert b"?" in result.stdout, (argv, result.stdout)
    for argv in (["definitions", "--json"], ["show", "1", "--json"]):
        result = run(*argv)
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout.decode("ascii"))
        assert (data[0]["name"] if isinstance(data, list) else data["definition"]) == name


def ascii_locale_env(columns: int) -> dict[str, str]:
    """A terminal whose locale's encoding is ASCII (no UTF-8 mode, no locale coercion)."""
    env = tty_env(LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    env["COLUMNS"] = str(columns)
    for name in ("PYTHONIOENCODING", "LANG", "LC_CTYPE"):
        env.pop(name, None)
    return env


def test_tables_in_an_ascii_locale_fit_and_stay_aligned(db: Database) -> None:
    """What the output cannot write is a "?" there, and it is measured as one: a Chinese
    character or an emoji then takes one column, an accent one of its own. Every row fits
    the terminal, every column starts where its header does, and a cut is marked with "~"
    (not a "?" that reads as part of the name)."""
    names = [
        "报表-每日-汇总-报表-每日-汇总",
        "cafe\u0301-cafe\u0301-cafe\u0301-cafe\u0301-cafe\u0301-x",
        "party-🎉🎉🎉-launch-🎉🎉🎉-long-name",
        "plain",
    ]
    with db.connect() as conn:
        for name in names:
            conn.execute("SELECT jobs.define(%s, 'k-报表', schedule => '0 3 * * *')", (name,))
    code, out = in_pty(["definitions", "--dsn", db.dsn], ascii_locale_env(60))
    assert code == 0, out
    lines = re.sub(r"\033\[[0-9;?]*[a-zA-Z]", "", out).replace("\r\n", "\n").splitlines()
    assert all(line.isascii() for line in lines), lines
    too_wide = [line for line in lines if len(line) > 60]
    assert not too_wide, f"rows wider than 60 columns: {too_wide}"
    header, rows = lines[0], lines[1:]
    assert len(rows) == len(names), lines
    kind_at = header.index("KIND")
    drifted = [row for row in rows if row[kind_at:].split()[0] != "k-??"]
    assert not drifted, f"KIND does not start at column {kind_at} in:\n{out}"
    assert any("~" in row for row in rows), f"no name was cut with '~':\n{out}"


def test_a_non_ascii_argument_in_an_ascii_locale_is_read_as_utf8(db: Database) -> None:
    """Under LC_ALL=C Python keeps the bytes of "é" undecoded; they are UTF-8, so the
    argument is accepted as the text it is. Bytes that are not UTF-8 are still refused."""
    env = {k: v for k, v in ascii_locale_env(100).items() if k != "PGTICK_LOG"}
    accepted = subprocess.run(
        [*PGTICK, "enqueue", "café-报表", "--dsn", db.dsn], capture_output=True, env=env, cwd=ROOT, timeout=60
    )
    assert accepted.returncode == 0, accepted.stderr.decode(errors="replace")
    with db.connect() as conn:
        assert scalar(conn, "SELECT kind FROM jobs.runs") == "café-报表"
    refused = subprocess.run(
        [*PGTICK, "enqueue", b"k\xff", "--dsn", db.dsn], capture_output=True, env=env, cwd=ROOT, timeout=60
    )
    assert refused.returncode == 2, refused.stderr
    assert b"not valid UTF-8" in refused.stderr and len(refused.stderr.splitlines()) == 1, refused.stderr


def test_an_interrupted_prune_says_how_far_it_got(db: Database) -> None:
    """Ctrl-C in the middle of `pgtick prune`: the batches done are committed, so it says on
    stderr how many runs it deleted of how many before exiting 130; the bar is gone and the
    cursor shown again."""
    with db.connect() as conn:
        add_history(conn, 100000)
    out = watch_in_pty(
        ["prune", "--older-than", "1d", "--batch", "20", "--dsn", db.dsn], tty_env(), 24, 100, until=b"prune"
    )
    found = re.search(r"pgtick prune: warning: interrupted after deleting (\d+) of 100000 finished runs", out)
    assert found, f"no word of how far it got:\n{out[-600:]!r}"
    with db.connect() as conn:
        left = scalar(conn, "SELECT count(*) FROM jobs.runs WHERE finished_at < now() - interval '1 day'")
    assert left == 100000 - int(found.group(1)) and left > 0, left
    assert out.rfind("\033[?25h") > out.rfind("\033[?25l"), "the cursor is shown again"


def test_ctrl_c_during_a_backfill_withdraws_its_request_and_says_so(db: Database) -> None:
    """Ctrl-C while `pgtick backfill` inserts its window: the insert is rolled back and the
    request withdrawn (done, with the reason, no runs), so that no scheduler inserts the
    runs later behind the operator's back; one line on stderr says so, exit 130."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('minutely', 'k', schedule => '* * * * *')")
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=1)
    window = ["--from", (end - timedelta(hours=1)).isoformat(), "--to", end.isoformat()]
    with db.connect(autocommit=False) as holder, db.connect() as observer:
        holder.execute("LOCK TABLE jobs.runs IN SHARE MODE")  # the backfill's insert waits for it
        proc = pgtick_in_foreground("backfill", "minutely", *window, "--dsn", db.dsn)
        try:
            wait_for(
                "the backfill's insert to wait for the lock",
                lambda: scalar(
                    observer,
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%%finish_backfill%%'",
                ),
                timeout=60,
            )
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)  # the lock still held: withdrawing needs none
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert err == "pgtick backfill: warning: interrupted: backfill 1 withdrawn, no run inserted\n", err
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0
        request = conn.execute(
            "SELECT done_at IS NOT NULL, runs_created, error FROM jobs.backfills"
        ).fetchall()
        assert len(request) == 1 and request[0][:2] == (True, 0), request
        assert "interrupted" in request[0][2], request
        assert materialize_backfills(conn) == 0, "a scheduler found the withdrawn window pending"
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def _controls(text: str) -> list[str]:
    """The control characters in ``text`` a terminal would act on (all but line feed)."""
    return [c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F]


def test_an_error_line_that_quotes_the_input_writes_its_control_characters_out(
    db: Database, tmp_path: Path
) -> None:
    """A refused name is quoted in the error line: its escape sequences (ESC, BEL, CSI as
    U+009B) and line breaks are written out as text, on the one line, so a crafted file
    can neither retitle nor clear the operator's terminal."""
    jsonl = tmp_path / "escapes.jsonl"
    jsonl.write_text(
        json.dumps({"name": "x\033]0;PWNED\007\033[2J\x9b2K", "kind": "k", "schedule": "@daily"}) + "\n"
    )
    csv = tmp_path / "escapes.csv"
    csv.write_bytes(b'name,kind,schedule\n"x\x1b[31mred\nsecond line",k,@daily\n')
    for path, shown in ((jsonl, "x^[]0;PWNED^G^[[2J\\x9b2K"), (csv, "x^[[31mred^Jsecond line")):
        result = pgtick("define", "--from-file", str(path), "--dsn", db.dsn)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and not _controls(result.stderr), repr(result.stderr)
        assert shown in result.stderr, result.stderr
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


def test_show_escapes_the_c1_controls_of_a_payload_and_a_result(db: Database) -> None:
    """JSON escapes C0 controls but not DEL or C1 (U+009B is CSI, an escape sequence's
    start) nor the characters that hide or turn text around (HIDDEN_CHARACTERS): `show` and
    --json write those as ``\\u009b``, the same JSON value."""
    payload = {
        "a": "x\x9b2Jy\x7f",
        "b": "\x1b[31m",
        "c": "abc\u202edef\u2067g",
        "d": "zero\u200bwidth\U000e0001",
    }
    result = {"out": "\x9b31mred\x85"}
    with db.connect() as conn:
        run = scalar(conn, "SELECT id FROM jobs.enqueue('k', payload => %s::jsonb)", (json.dumps(payload),))
        conn.execute(
            "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now(), finished_at = now(),"
            " result = %s::jsonb WHERE id = %s",
            (json.dumps(result), run),
        )
    text = pgtick("show", str(run), "--dsn", db.dsn)
    assert text.returncode == 0, text.stderr
    assert not _controls(text.stdout), repr(text.stdout)
    assert '"a": "x\\u009b2Jy\\u007f"' in text.stdout and '"out": "\\u009b31mred\\u0085"' in text.stdout, (
        text.stdout
    )
    # A bidirectional override would show the rest of its line reversed: escaped as well.
    assert '"c": "abc\\u202edef\\u2067g"' in text.stdout, text.stdout
    # And the characters that show nothing, past U+FFFF as a surrogate pair (the same JSON value).
    assert '"d": "zero\\u200bwidth\\udb40\\udc01"' in text.stdout, text.stdout
    as_json = pgtick("show", str(run), "--json", "--dsn", db.dsn)
    assert as_json.returncode == 0, as_json.stderr
    assert not _controls(as_json.stdout.replace("\t", "")), repr(as_json.stdout)
    data = json.loads(as_json.stdout)
    assert (data["payload"], data["result"]) == (payload, result)


def test_a_bad_pgtick_now_refuses_a_change_before_making_it(db: Database) -> None:
    """PGTICK_NOW is read before the command does anything: a value that is no time is exit 2
    and nothing written, not an enqueue committed and then an error that says it was refused
    (run again, it would queue a second run)."""
    env = {**env_for(None), "PGTICK_NOW": "yesterday"}
    result = subprocess.run(
        [*PGTICK, "enqueue", "report", "--dsn", db.dsn], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2, result
    assert result.stderr.startswith("pgtick enqueue: error: PGTICK_NOW must be"), result.stderr
    assert result.stdout == "", result.stdout
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def test_a_run_the_overlap_policy_skipped_is_skipped_wherever_it_is_shown(db: Database) -> None:
    """The last outcome in `status` and an attempt in `show`'s chain say ↷ SKIPPED for a run
    the overlap policy skipped, as the strip of marks, `runs` and `show`'s first line do, not
    ⊘ CANCELLED beside a ↷ for the same run."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('busy', 'k', schedule => '* * * * *')")
        skipped = scalar(
            conn,
            "INSERT INTO jobs.runs (definition_id, kind, status, finished_at, failure_reason, error)"
            " SELECT id, 'k', 'CANCELLED', now(), 'Skipped',"
            " 'skipped: definition at max_concurrent_runs (overlap_policy skip)'"
            " FROM jobs.definitions WHERE name = 'busy' RETURNING id",
        )
        retry = scalar(conn, "SELECT id FROM jobs.retry(%s)", (skipped,))
    status = pgtick("status", "--dsn", db.dsn)
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if line.startswith("busy"))
    assert "↷ SKIPPED" in row and "CANCELLED" not in row, status.stdout
    show = pgtick("show", str(retry), "--dsn", db.dsn)
    assert show.returncode == 0, show.stderr
    first = next(line for line in show.stdout.splitlines() if f"run {skipped} " in line)
    assert "↷ SKIPPED" in first and "CANCELLED" not in first, show.stdout


def test_a_run_of_a_deleted_definition_is_not_shown_as_ad_hoc(db: Database) -> None:
    """After `pgtick undefine`, the runs it kept as history still came from a definition:
    `runs` and `show` say it was deleted (and its id), not "(ad-hoc)" / "(kind)" as for a
    run that never had one."""
    with db.connect() as conn:
        define_id = scalar(conn, "SELECT id FROM jobs.define('gone', 'k', schedule => '* * * * *')")
        run = scalar(
            conn,
            "INSERT INTO jobs.runs (definition_id, kind, status, started_at, finished_at, origin)"
            " VALUES (%s, 'k', 'COMPLETED', now(), now(), 'schedule') RETURNING id",
            (define_id,),
        )
        adhoc = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
    assert pgtick("undefine", "gone", "--dsn", db.dsn).returncode == 0
    runs = pgtick("runs", "--dsn", db.dsn)
    assert runs.returncode == 0, runs.stderr
    lines = {int(line.split()[0]): line for line in runs.stdout.splitlines()[1:]}
    assert f"#{define_id} (deleted)" in lines[run] and "(k)" not in lines[run], runs.stdout
    assert "(k)" in lines[adhoc], runs.stdout
    show = pgtick("show", str(run), "--dsn", db.dsn)
    assert show.returncode == 0, show.stderr
    assert f"  definition  #{define_id} (deleted)\n" in show.stdout, show.stdout
    shown = json.loads(pgtick("show", str(run), "--json", "--dsn", db.dsn).stdout)
    assert (shown["definition"], shown["definition_id"]) == (None, define_id), shown
    jsonschema.validate(shown, json.loads((SCHEMAS / "show.json").read_text()))
    listed = json.loads(pgtick("runs", "--json", "--dsn", db.dsn).stdout)
    jsonschema.validate(listed, json.loads((SCHEMAS / "runs.json").read_text()))
    assert [(r["id"], r["definition_id"]) for r in listed] == [(adhoc, None), (run, define_id)], listed


#: What a payload may hold and job code may log: an escape that clears the screen, C1's CSI
#: (U+009B) and a line break followed by a forged outcome line.
HOSTILE_TEXT = "A\033[2JB\x9b31mC\n05:00:00 run=1 kind=forged status=COMPLETED"

TALKING_APP = """\
import logging
from pgtick.app import App
app = App('talking')
@app.job('talk')
def talk(ctx):
    ctx.logger.warning('the payload says %s', ctx.payload['text'])
    try:
        raise ValueError(ctx.payload['text'].split(chr(10))[0])
    except ValueError:
        logging.getLogger('shop').exception('the shop says %s', ctx.payload['text'])
"""


@pytest.mark.parametrize("where", ["terminal", "file", "json"])
def test_what_job_code_logs_reaches_the_log_with_its_control_characters_written_out(
    db: Database, tmp_path: Path, where: str
) -> None:
    """`pgtick run` logs what job code logs (``ctx.logger``, any logger, a traceback), and
    job code logs what its payload holds. In the human format every control character of a
    message is written out (``^[``, ``\\x9b``, a line break as ``^J``) and those of a traceback
    but its line breaks: an escape cannot clear the operator's screen, and a payload cannot
    forge a log line of its own. In JSON the message is kept whole, C1 controls escaped as
    ``\\u009b`` as in every other JSON the CLI writes."""
    app = tmp_path / "talking_app.py"
    app.write_text(TALKING_APP)
    with db.connect() as conn:
        run_id = scalar(
            conn, "SELECT id FROM jobs.enqueue('talk', jsonb_build_object('text', %s::text))", (HOSTILE_TEXT,)
        )
    argv = ["run", str(app), "--dsn", db.dsn, "--no-scheduler"]
    done = f"run={run_id} kind=talk".encode()
    if where == "terminal":
        command = OnPty(argv, tty_env(), 40, 200)
        try:
            assert command.read_until(lambda out: done in out), command.out[-2000:]
            assert command.interrupt() == 0
        finally:
            command.close()
        out = command.out.decode()
    else:
        env = env_for(None)
        env.pop("PGTICK_LOG", None)
        env["PGTICK_LOG_FORMAT"] = "json" if where == "json" else "human"
        log = tmp_path / "run.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen([*PGTICK, *argv], stdout=subprocess.PIPE, stderr=sink, env=env, cwd=ROOT)
            try:
                key = f'"run_id": {run_id}, "kind": "talk"' if where == "json" else done.decode()
                wait_for("the run's outcome line", lambda: key in log.read_text() or None, 60)
            finally:
                proc.terminate()
                proc.communicate(timeout=60)
        out = log.read_text()
    assert "\033[2J" not in out and "\x9b" not in out, f"a control sequence reached the log:\n{out!r}"
    if where == "json":
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        said = {line["logger"]: line for line in lines}
        assert said["pgtick.job"]["message"] == f"the payload says {HOSTILE_TEXT}"
        assert said["shop"]["message"] == f"the shop says {HOSTILE_TEXT}"
        assert said["shop"]["exception"].endswith("ValueError: A\033[2JB\x9b31mC")
        return
    forged = [line for line in out.splitlines() if "kind=forged" in line and "says" not in line]
    assert not forged, f"a payload forged a log line:\n{out}"
    written_out = "A^[[2JB\\x9b31mC^J05:00:00 run=1 kind=forged status=COMPLETED"
    assert f"the payload says {written_out}" in out, out
    assert f"the shop says {written_out}" in out, out
    assert "ValueError: A^[[2JB\\x9b31mC" in out, out


def test_stored_text_the_sql_api_let_through_is_shown_with_its_control_characters_written_out(
    db: Database,
) -> None:
    """A database written to by hand, or before the SQL API checked names and schedules,
    holds names, kinds, schedules and worker ids with control characters in them (and the
    scheduler records why it cannot read such a schedule). `status`, `definitions`, `runs`
    and `show` show each with its control characters written out (``^[``), in a pipe and on a
    terminal: no escape sequence in stored text reaches the operator's screen. `--json`
    keeps it as stored."""
    hostile = "\033[2J\033]0;owned\a"
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('odd-rule', 'k', schedule => 'FREQ=DAILY')")
        odd = f"FREQ=DAILY;X-A={hostile}"
        conn.execute("UPDATE jobs.definitions SET schedule = %s WHERE name = 'odd-rule'", (odd,))
        conn.execute(
            "SELECT jobs.mark_schedule_error(id, revision, %s) FROM jobs.definitions WHERE name = 'odd-rule'",
            (f"cannot read {hostile}",),
        )
        conn.execute("SELECT jobs.define('old-name', 'k', schedule => '0 3 * * *')")
        conn.execute("UPDATE jobs.definitions SET name = %s WHERE name = 'old-name'", (f"old{hostile}",))
        run = scalar(
            conn,
            "INSERT INTO jobs.runs (definition_id, kind, status, worker, started_at, finished_at, error,"
            " failure_reason) SELECT id, %s, 'FAILED', %s, now(), now(), 'boom', 'Error'"
            " FROM jobs.definitions WHERE name LIKE 'old%%' RETURNING id",
            (f"kind{hostile}", f"worker{hostile}"),
        )
    commands = [
        ["status"], ["status", "--wide"], ["definitions"], ["definitions", "--wide"],
        ["runs"], ["runs", "--wide"], ["show", str(run)], ["workers", "--all"],
    ]  # fmt: skip
    for argv in commands:
        piped = pgtick(*argv, "--dsn", db.dsn)
        assert piped.returncode == 0, (argv, piped.stderr)
        assert not _controls(piped.stdout.replace("\t", "")), (argv, piped.stdout)
        code, out = in_pty([*argv, "--dsn", db.dsn], tty_env())
        assert code == 0, (argv, out)
        assert "\033[2J" not in out and "\033]0;" not in out and "\a" not in out, (argv, out)
    shown = pgtick("definitions", "--wide", "--dsn", db.dsn).stdout
    assert "FREQ=DAILY;X-A=^[[2J^[]0;owned^G" in shown, shown
    shown = pgtick("show", str(run), "--dsn", db.dsn).stdout
    assert "kind        kind^[[2J^[]0;owned^G" in shown and "worker      worker^[[2J" in shown, shown
    as_json = json.loads(pgtick("show", str(run), "--json", "--dsn", db.dsn).stdout)
    assert (as_json["kind"], as_json["worker"]) == (f"kind{hostile}", f"worker{hostile}")


def test_show_on_a_narrow_terminal_cuts_names_in_the_middle_as_tables_do(db: Database) -> None:
    """`show` cuts a definition name, kind or worker id too long for its line in the middle,
    as a table does: two definitions that differ only at the end (the region, the worker's
    pid and random part) stay apart."""
    worker = "ip-10-20-130-44.eu-west-1.compute.internal-48211-a1b2c3d4"
    with db.connect() as conn:
        for region in ("eu-west", "us-east"):
            conn.execute(
                "SELECT jobs.define(%s, 'billing.reconcile_invoices_for_region', schedule => '0 6 * * 1')",
                (f"customer-invoice-reconciliation-{region}-nightly",),
            )
        run = scalar(
            conn,
            "INSERT INTO jobs.runs (definition_id, kind, status, started_at, finished_at, worker)"
            " SELECT id, kind, 'COMPLETED', now(), now(), %s FROM jobs.definitions"
            " WHERE name LIKE '%%eu-west%%' RETURNING id",
            (worker,),
        )
    env = {**tty_env(NO_COLOR="1"), "COLUMNS": "44"}
    code, out = in_pty(["show", str(run), "--dsn", db.dsn], env)
    out = out.replace("\r\n", "\n")
    assert code == 0, out
    fields = {
        line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and "  " in line[2:]
    }
    assert all(len(line) <= 44 for line in out.splitlines()), out
    assert fields["definition"].endswith("west-nightly"), out
    assert fields["kind"].endswith("region"), out
    assert fields["worker"].endswith("a1b2c3d4"), out
