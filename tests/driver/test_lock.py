"""`pgtick lock NAME --ttl D -- CMD`: skip-if-running for any cron command.

* while one invocation holds the lease (renewed past its TTL), another prints one
  line `pgtick lock: skipped: lease NAME held by OWNER until T` on standard error (standard
  output is CMD's) and exits 75 without running CMD;
* a holder killed with -9 keeps the lease until its TTL runs out, then the next
  invocation takes it; its command (a shell line and what it started) is stopped before
  that expiry, not left running beside the next holder; so is a holder's frozen (SIGSTOP)
  in the middle of its command;
* CMD's exit status passes through, and the lease is released when CMD ends
  (normally, failing, or stopped by SIGTERM or SIGHUP, passed on to CMD);
* Ctrl-C on the terminal reaches CMD once: the terminal signals its whole foreground
  process group, so pgtick does not pass it on again.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import PGTICK, ROOT, Conn, Database, Processes, env_for, pgtick, pid_of_owner, scalar, wait_for

TTL = 2.0


def lease(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT owner, expires_at > clock_timestamp() AS live FROM jobs.leases WHERE name = %s", (name,)
    ).fetchone()


def lock(dsn: str, name: str, *cmd: str, ttl: float = TTL) -> list[str]:
    return ["lock", name, "--ttl", f"{ttl}s", "--dsn", dsn, "--", *cmd]


def test_second_lock_skips_while_held_and_takes_over_after_the_holder_is_killed(
    db: Database, procs: Processes, conn: Conn
) -> None:
    holder = procs.start("holder", lock(db.dsn, "nightly", "sleep", "60"))
    owner = wait_for("the holder to take the lease", lambda: (lease(conn, "nightly") or (None,))[0], 60)
    assert pid_of_owner(owner) == holder.pid, f"lease owner {owner!r} is not pid {holder.pid}"
    time.sleep(TTL + 0.5)  # past the TTL: only renewal keeps the lease now

    second = pgtick(*lock(db.dsn, "nightly", "sh", "-c", "echo RAN"))
    assert second.returncode == 75, second
    assert second.stdout == "", f"a skip must leave standard output, the command's, empty: {second}"
    lines = second.stderr.splitlines()
    assert len(lines) == 1, f"a skip must print exactly one line: {second}"
    assert re.fullmatch(
        rf"pgtick lock: skipped: lease nightly held by {re.escape(owner)} until \d{{4}}-\d\d-\d\dT\S+Z",
        lines[0],
    ), lines
    assert "RAN" not in second.stdout + second.stderr, second
    assert holder.popen.poll() is None, f"the holder died:\n{holder.tail()}"

    holder.send(signal.SIGKILL)
    killed = time.monotonic()
    assert holder.wait(30) == -signal.SIGKILL
    # Dead: no renewal any more. Its lease lasts until this, on the server's clock.
    dead_until = scalar(conn, "SELECT expires_at FROM jobs.leases WHERE name = 'nightly'")
    attempts: list[tuple[float, int, str]] = []
    slowest = 0.0  # the longest attempt (a CLI start and its statements)
    while True:
        began = time.monotonic() - killed
        result = pgtick(*lock(db.dsn, "nightly", "sh", "-c", "exit 3"))
        attempts.append((round(began, 2), result.returncode, result.stderr.strip()))
        slowest = max(slowest, time.monotonic() - killed - began)
        if result.returncode != 75:
            break
        assert began < TTL + 60, f"lease never freed after the holder died: {attempts}"
        time.sleep(0.1)
    after = conn.execute("SELECT owner, consecutive_skips FROM jobs.leases WHERE name = 'nightly'").fetchone()
    taken_at = scalar(conn, "SELECT acquired_at FROM jobs.leases WHERE name = 'nightly'")

    context = (
        f"attempts after kill -9 (t, exit, stderr): {attempts}; lease after {after}; "
        f"dead holder's lease until {dead_until}, taken over at {taken_at}"
    )
    # On the server's clock (a CLI start on a busy machine can outlast the whole TTL): never
    # before the crashed holder's lease expired, and by the first attempt that came after.
    assert taken_at >= dead_until, f"a crashed holder's lease must last until its TTL: {context}"
    assert result.returncode == 3, f"CMD's exit status must pass through: {context} {result}"
    assert all(code == 75 for _, code, _ in attempts[:-1]), f"skips before the takeover: {context}"
    late = (taken_at - dead_until).total_seconds()
    assert late <= slowest + 2.0, (
        f"took over {late:.2f}s after expiry, the slowest attempt took {slowest:.2f}s: {context}"
    )
    assert after == (None, 0), f"lease not released (or skips not reset) after CMD ended: {context}"
    print(f"\nlease taken over {attempts[-1][0]:.2f}s after kill -9 of its holder (ttl {TTL}s)")


def test_a_renewal_that_does_not_answer_stops_the_command_before_the_lease_expires(
    db: Database, procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """Every renewal waits on a row lock this test holds, as a renewal sent into a network
    partition or to a stuck server waits for an answer: the command must stop before the
    lease's last expiry (when another invocation may take it), not when the renewal returns."""
    ticks, pidfile = tmp_path / "ticks", tmp_path / "pid"
    script = f"echo $$ > {pidfile}; while :; do date +%s.%N >> {ticks}; sleep 0.05; done"
    holder = procs.start("holder", lock(db.dsn, "stuck", "sh", "-c", script))
    wait_for("the holder to take the lease", lambda: (lease(conn, "stuck") or (None,))[0], 60)
    started = wait_for("the command to start", lambda: pidfile.exists() and pidfile.read_text().strip(), 60)
    command = int(str(started))
    with db.connect(autocommit=False) as blocker:
        expires_at = scalar(blocker, "SELECT expires_at FROM jobs.leases WHERE name = 'stuck' FOR UPDATE")
        wait_for(f"the command (pid {command}) to stop", lambda: not Path(f"/proc/{command}").exists(), 60)
        blocker.rollback()
    code = holder.wait(30)
    last_tick = max(float(t) for t in ticks.read_text().split())
    log = holder.log()

    late = last_tick - expires_at.timestamp()
    assert late < 0, f"the command ran {late:.2f}s past the lease's expiry at {expires_at}:\n{log}"
    assert code == 128 + signal.SIGTERM, f"exit {code}:\n{log}"
    assert log.splitlines() == [
        "pgtick lock: lease stuck not renewed within its ttl (the database did not answer);"
        " stopping the command"
    ], log
    assert lease(conn, "stuck") == (None, False), "the lease was not released once the database answered"


#: A process that ignores SIGTERM, says its pid and sleeps: started by a shell command line,
#: it is a grandchild of pgtick.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_a_lost_lease_stops_the_whole_command_even_a_grandchild_that_ignores_sigterm(
    db: Database, procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """The lease expires under the holder (as after a pause longer than its ttl): its renewal
    fails, and the command, a shell line whose child ignores SIGTERM, must end whole: the
    shell alone dying would leave the child running beside the next holder."""
    script, pidfile = tmp_path / "stubborn.py", tmp_path / "pid"
    script.write_text(STUBBORN)
    line = f"{sys.executable} {script} {pidfile}; true"
    holder = procs.start("holder", lock(db.dsn, "nightly", "sh", "-c", line))
    said = wait_for("the command to start", lambda: pidfile.read_text() if pidfile.exists() else None, 60)
    grandchild = int(said)
    conn.execute("UPDATE jobs.leases SET expires_at = clock_timestamp() - interval '1 second'")

    wait_for(f"the grandchild (pid {grandchild}) to end", lambda: not _alive(grandchild) or None, 60)
    code = holder.wait(30)
    log = holder.log()
    assert code != 0, f"a command stopped for a lost lease must not exit 0:\n{log}"
    assert "pgtick lock: lease nightly lost; stopping the command" in log, log


def test_what_the_command_leaves_running_ends_before_the_lease_is_released(
    db: Database, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    result = pgtick(*lock(db.dsn, "report", "sh", "-c", f"sleep 120 & echo $! > {pidfile}", ttl=600))
    left = int(pidfile.read_text())
    assert result.returncode == 0, result
    assert not _alive(left), f"the command's background process (pid {left}) outlived the lease"


def test_a_holder_killed_with_9_has_its_command_stopped_before_its_lease_expires(
    db: Database, procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """Killed with -9, pgtick can neither stop its command nor renew the lease, which the next
    invocation takes at its expiry: the command (a shell line ticking, and a child of it that
    ignores SIGTERM) must have ended by then, or two copies run at once."""
    ticks, pidfile, script = tmp_path / "ticks", tmp_path / "pid", tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    line = f"{sys.executable} {script} {pidfile} & while :; do date +%s.%N >> {ticks}; sleep 0.05; done"
    holder = procs.start("holder", lock(db.dsn, "nightly", "sh", "-c", line, ttl=6.0))
    wait_for("the holder to take the lease", lambda: (lease(conn, "nightly") or (None,))[0], 60)
    said = wait_for("the command to start", lambda: pidfile.read_text() if pidfile.exists() else None, 60)
    child = int(said)
    wait_for("the command to tick", lambda: ticks.exists() and ticks.read_text().strip(), 60)

    group = os.getpgid(child)
    try:
        holder.send(signal.SIGKILL)
        assert holder.wait(30) == -signal.SIGKILL
        expires_at = scalar(conn, "SELECT expires_at FROM jobs.leases WHERE name = 'nightly'")
        wait_for(f"the command's child (pid {child}) to end", lambda: not _alive(child) or None, 60)
        last = max(float(t) for t in ticks.read_text().split())
        time.sleep(0.5)  # a tick still running would have written again by now
        assert max(float(t) for t in ticks.read_text().split()) == last, "the command still ticks"
    finally:
        try:
            os.killpg(group, signal.SIGKILL)  # what a failure left running
        except ProcessLookupError:
            pass
    late = last - expires_at.timestamp()
    assert late < 0, f"the command ran {late:.2f}s past the dead holder's lease expiry at {expires_at}"


def test_a_frozen_holder_has_its_command_stopped_before_its_lease_expires(
    db: Database, procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """Frozen (SIGSTOP, a debugger, a suspended VM), pgtick neither renews the lease nor
    dies, so its pipe to the watchdog stays open: the watchdog must still see the renewals
    stop and end the command (and a child of it that ignores SIGTERM) before the lease
    expires, or the next invocation runs a second copy beside it."""
    ticks, pidfile, script = tmp_path / "ticks", tmp_path / "pid", tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    line = f"{sys.executable} {script} {pidfile} & while :; do date +%s.%N >> {ticks}; sleep 0.05; done"
    holder = procs.start("holder", lock(db.dsn, "nightly", "sh", "-c", line, ttl=6.0))
    wait_for("the holder to take the lease", lambda: (lease(conn, "nightly") or (None,))[0], 60)
    said = wait_for("the command to start", lambda: pidfile.read_text() if pidfile.exists() else None, 60)
    child = int(said)
    wait_for("the command to tick", lambda: ticks.exists() and ticks.read_text().strip(), 60)

    group = os.getpgid(child)
    try:
        holder.send(signal.SIGSTOP)
        wait_for(f"the command's child (pid {child}) to end", lambda: not _alive(child) or None, 60)
        last = max(float(t) for t in ticks.read_text().split())
        time.sleep(0.5)  # a tick still running would have written again by now
        assert max(float(t) for t in ticks.read_text().split()) == last, "the command still ticks"
        # Read once the command has ended: a renewal in flight at the freeze may have moved it.
        expires_at = scalar(conn, "SELECT expires_at FROM jobs.leases WHERE name = 'nightly'")
        assert holder.popen.poll() is None, "the frozen holder was killed, not its command"
    finally:
        holder.send(signal.SIGCONT)
        try:
            os.killpg(group, signal.SIGKILL)  # what a failure left running
        except ProcessLookupError:
            pass
    late = last - expires_at.timestamp()
    assert late < 0, f"the command ran {late:.2f}s past the frozen holder's lease expiry at {expires_at}"
    code = holder.wait(60)
    log = holder.log()
    assert code != 0, f"a holder whose command was stopped for want of renewals must not exit 0:\n{log}"
    assert "pgtick lock: pgtick did not renew the lease in time; stopping the command" in log, log


def test_a_group_left_with_only_ended_processes_counts_as_gone(tmp_path: Path) -> None:
    """A process that has ended stays in its process group until its parent reaps it, and a
    parent may never do so (pgtick lock as a container's PID 1 inherits the command's orphans
    and reaps none): such a group counts as gone, or every exit of pgtick lock would wait out
    its grace and a SIGKILL to processes that have already ended."""
    from pgtick.lock import _gone

    ended = subprocess.Popen(["true"], process_group=0)  # not reaped until the end of the test
    running = subprocess.Popen(["sleep", "60"], process_group=0)
    try:
        wait_for(f"pid {ended.pid} to end", lambda: not _alive(ended.pid) or None, 60)
        assert _gone(ended.pid), "a group whose only member has ended (a zombie) counts as running"
        assert not _gone(running.pid), "a group with a running member counts as gone"
    finally:
        running.kill()
        running.wait()
        ended.wait()
    assert _gone(running.pid) and _gone(ended.pid)


def test_lock_passes_the_exit_status_through_and_releases_on_exit(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        failed = pgtick(*lock(db.dsn, "report", "sh", "-c", "echo out; exit 3", ttl=600))
        released_after_failure = lease(conn, "report")
        ok = pgtick(*lock(db.dsn, "report", "sh", "-c", "echo again", ttl=600))
        released = lease(conn, "report")

    # A 10-minute TTL: the second run could only start because the first released the lease.
    assert (failed.returncode, failed.stdout) == (3, "out\n"), failed
    assert released_after_failure == (None, False), released_after_failure
    assert (ok.returncode, ok.stdout) == (0, "again\n"), ok
    assert released == (None, False), released
    assert failed.stderr == ok.stderr == "", (failed.stderr, ok.stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_is_passed_on_and_the_lease_released_when_the_command_ends(
    db: Database, procs: Processes, conn: Conn, signum: signal.Signals
) -> None:
    """SIGTERM, or a hangup (the terminal closed, a `kill -HUP`, which used to kill pgtick
    alone and leave the command running with nobody renewing its lease)."""
    holder = procs.start("holder", lock(db.dsn, "backup", "sleep", "60", ttl=600))
    wait_for("the holder to take the lease", lambda: (lease(conn, "backup") or (None,))[0], 60)
    holder.send(signum)
    code = holder.wait(30)
    after = lease(conn, "backup")

    assert code == 128 + signum, f"exit {code}:\n{holder.tail()}"
    assert after == (None, False), f"lease not released on {signum.name}: {after}"


def test_sigterm_the_moment_the_lease_is_taken_still_releases_it(
    db: Database, procs: Processes, conn: Conn
) -> None:
    """SIGTERM sent the instant the lease row appears (polled without pause), five times: the
    signal handlers are in place before the lease is taken, so each time the command stops
    with 128 + SIGTERM and the lease is released, never left held until its ttl."""
    for attempt in range(5):
        holder = procs.start(f"holder{attempt}", lock(db.dsn, "edge", "sleep", "60", ttl=600))
        deadline = time.monotonic() + 60
        while not (lease(conn, "edge") or (None,))[0]:
            assert time.monotonic() < deadline, f"attempt {attempt}: the lease was never taken"
        holder.send(signal.SIGTERM)
        code = holder.wait(30)
        after = lease(conn, "edge")
        assert code == 128 + signal.SIGTERM, f"attempt {attempt}: exit {code}:\n{holder.tail()}"
        assert after in (None, (None, False)), f"attempt {attempt}: lease left held: {after}"


#: A command that counts the SIGINTs it gets while it cleans up after the first one.
COUNTER = """
import signal, sys, time
seen = []
signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
open(sys.argv[1], "w").write("ready")
while not seen:
    time.sleep(0.05)
time.sleep(1.5)  # cleaning up: a second SIGINT would come now
open(sys.argv[1], "w").write(str(len(seen)))
sys.exit(4)
"""


def test_ctrl_c_on_a_terminal_reaches_the_command_once(db: Database, conn: Conn, tmp_path: Path) -> None:
    script, marks = tmp_path / "counter.py", tmp_path / "marks"
    script.write_text(COUNTER)
    master, slave = pty.openpty()
    args = lock(db.dsn, "tty", sys.executable, str(script), str(marks), ttl=600)
    proc = subprocess.Popen(
        [*PGTICK, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env_for(None),
        cwd=ROOT,
        start_new_session=True,  # a session of its own, whose controlling terminal is the pty
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(slave)
    try:
        wait_for(
            "the command to start", lambda: (marks.exists() and marks.read_text() == "ready") or None, 60
        )
        os.write(master, b"\x03")  # Ctrl-C: the terminal sends SIGINT to its foreground group
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert marks.read_text() == "1", f"the command got {marks.read_text()} SIGINTs for one Ctrl-C"
    assert code == 4, f"exit {code}"
    assert lease(conn, "tty") == (None, False)


def test_a_skip_names_a_holder_from_another_language_with_its_control_characters_written_out(
    db: Database,
) -> None:
    """`jobs.acquire_lease` takes any owner text, so a lease taken from another language may
    name its holder with an escape sequence in it: the skip line (and the warning after many
    skips) shows it written out (``^[``), and the operator's terminal or a cron mail stays as
    it was."""
    with db.connect() as conn:
        owner = "job\033[2J\033]0;x\a-7"
        conn.execute("SELECT jobs.acquire_lease('report', %s, interval '1 hour')", (owner,))
        conn.execute("UPDATE jobs.leases SET consecutive_skips = 100 WHERE name = 'report'")
    skipped = pgtick(*lock(db.dsn, "report", "true", ttl=600))
    assert skipped.returncode == 75, skipped
    assert "held by job^[[2J^[]0;x^G-7 until" in skipped.stderr, skipped.stderr
    assert "is job^[[2J^[]0;x^G-7 stuck?" in skipped.stderr, skipped.stderr
    for text in (skipped.stdout, skipped.stderr):
        assert "\033" not in text and "\a" not in text, repr(text)
