"""``pgtick lock NAME --ttl D -- CMD``: run an existing cron command under a lease.

Acquire the lease (skip with one line and exit 75 if someone holds it), run
CMD as a child, renew the lease from a background thread every ttl/3 and stop
CMD if renewal fails, or if no renewal has answered by the time the lease could
expire (another holder could take over), release in ``finally``
(also on SIGTERM, SIGINT, SIGHUP or SIGQUIT, and when CMD fails), and exit with
CMD's status.

Those signals are passed on to CMD, and pgtick waits for it to end: dying first would
leave CMD running with nobody renewing its lease. SIGINT, SIGQUIT and SIGHUP that a
terminal sends reach its whole foreground process group, CMD included, so while pgtick
is in the foreground of its terminal they are not passed on a second time.

Outside a terminal's foreground (cron, systemd, a script) CMD runs in a process group of its
own, and what pgtick sends goes to the whole group: a shell command line's own children
stop with it. When the lease is lost, CMD (its group) gets SIGTERM and, if it is still there
after a grace of a sixth of the ttl (at most 5 s), SIGKILL; and whatever of its group
outlives CMD is stopped the same way before the lease is released, so nothing of it runs
beside the next holder. In a terminal's foreground CMD stays in pgtick's group, so that it
keeps the terminal; there the loss of the lease still ends CMD itself with SIGKILL after
the grace.

pgtick itself killed (``kill -9``, the OOM killer) can neither stop CMD nor renew its lease,
which another invocation takes once its ttl runs out: a watchdog, a small process of its own
session started before CMD, sees pgtick's end (its pipe from pgtick closes without the word
that CMD has ended) and stops CMD (its group, outside a terminal's foreground) the same way,
SIGTERM then SIGKILL after the grace, well within the ttl. pgtick frozen (SIGSTOP, a
debugger) neither dies nor renews: pgtick tells the watchdog after each renewal until when
the lease is surely held, and the watchdog stops CMD when that time comes without a newer
one, by the time pgtick's own check would have, and kills it before the lease may expire.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from types import FrameType

import psycopg

from pgtick import calls
from pgtick.db import connect
from pgtick.identity import new_worker_id
from pgtick.terminal import iso, printable_line

SKIP_WARN_AFTER = 3
#: The longest grace between SIGTERM and SIGKILL when the lease is lost (else ttl / 6).
KILL_GRACE_MAX = 5.0
#: Signals passed on to CMD.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: Those a terminal sends to its whole foreground process group.
FROM_TERMINAL = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _in_terminal_foreground() -> bool:
    """Whether this process is in its terminal's foreground process group."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):  # not a terminal, or closed
            continue
    return False


def _gone(pgid: int) -> bool:
    """Whether no process of the group ``pgid`` is left running. A process that has ended
    stays a member until its parent reaps it, and a parent may never do so (pgtick lock as a
    container's PID 1 inherits every orphan and reaps none): such members do not count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a member changed its user: it is there
        return False
    return not _running_members(pgid)


def _running_members(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` runs (or may: true where /proc cannot tell)."""
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return True
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile, or not ours to read
            continue
        # After the name: state, ppid, pgrp. Z and X: ended, not yet reaped (or being reaped).
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(pgid: int, grace: float) -> None:
    """SIGTERM to what is left of the group, then SIGKILL after ``grace`` seconds."""
    if _gone(pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    until = time.monotonic() + grace
    while time.monotonic() < until:
        if _gone(pgid):
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    until = time.monotonic() + 5.0
    while time.monotonic() < until and not _gone(pgid):
        time.sleep(0.05)


#: The watchdog (run as ``python -I -S -c WATCHDOG``, so it needs nothing of pgtick) reads
#: lines from its standard input, the pipe pgtick holds: ``PID GROUP GRACE`` once CMD runs;
#: ``until STOP KILL`` at the start and after each renewal that answered; ``quiet`` once
#: pgtick itself stops CMD; ``done`` once CMD has ended. STOP and KILL are ``time.monotonic()``
#: instants (one clock for every process of the machine): by STOP, unless a later ``until``
#: came, CMD gets SIGTERM, and by KILL SIGKILL, which is before the lease may expire. End of
#: input without ``done`` means pgtick died; an ``until`` passed means pgtick stopped renewing
#: without dying (frozen by SIGSTOP or a debugger, its machine suspended). Another invocation
#: may then take the lease, so CMD is stopped; ``quiet`` only leaves out the line saying so.
WATCHDOG = """
import os, select, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
data, cmd, stop, kill, quiet = b"", None, None, None, False
why = "pgtick ended before the command"
while True:
    wait = None if stop is None else max(0.0, stop - time.monotonic())
    if not select.select([0], [], [], wait)[0]:
        why = "pgtick did not renew the lease in time"
        break
    chunk = os.read(0, 4096)
    if not chunk:
        kill = None
        break
    data += chunk
    *lines, data = data.split(b"\\n")
    for line in lines:
        words = line.split()
        if words == [b"done"]:
            sys.exit(0)
        elif words == [b"quiet"]:
            quiet = True
        elif len(words) == 3 and words[0] == b"until":
            stop, kill = float(words[1]), float(words[2])
        elif len(words) == 3:
            cmd = int(words[0]), words[1] == b"1", float(words[2])
if cmd is None:
    sys.exit(0)
pid, group, grace = cmd
def send(signum):
    try:
        os.killpg(pid, signum) if group else os.kill(pid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False
if send(signal.SIGTERM):
    if not quiet:
        print("pgtick lock: " + why + "; stopping the command", file=sys.stderr)
    until = time.monotonic() + grace if kill is None else kill
    while time.monotonic() < until and send(0):
        time.sleep(0.05)
    send(signal.SIGKILL)
"""


def _start_watchdog() -> subprocess.Popen[bytes] | None:
    """The watchdog that stops CMD if pgtick dies first (None if it cannot be started: CMD
    then runs as it did before there was one)."""
    if not sys.executable:
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHDOG],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # neither a terminal's nor a group kill of pgtick reaches it
        )
    except OSError as exc:
        print(f"pgtick lock: cannot start the watchdog: {exc.strerror}", file=sys.stderr)
        return None


def _tell(watchdog: subprocess.Popen[bytes] | None, words: str) -> None:
    if watchdog is None or watchdog.stdin is None:
        return
    try:
        watchdog.stdin.write(words.encode() + b"\n")
        watchdog.stdin.flush()
    except (OSError, ValueError):  # the watchdog is gone (or its pipe closed): CMD runs on unwatched
        pass


def _renew(dsn: str, name: str, owner: str, ttl: timedelta) -> bool:
    with connect(dsn, application_name="pgtick-lock") as conn:
        return calls.renew_lease(conn, name, owner, ttl)


def _release(dsn: str, name: str, owner: str) -> bool:
    with connect(dsn, application_name="pgtick-lock") as conn:
        return calls.release_lease(conn, name, owner)


def run_locked(
    dsn: str,
    name: str,
    ttl: float,
    cmd: list[str],
    *,
    owner: str | None = None,
    skipped_exit: int = 75,
) -> int:
    owner = owner or new_worker_id()
    ttl_interval = timedelta(seconds=ttl)
    child: subprocess.Popen[bytes] | None = None
    lost = threading.Event()
    done = threading.Event()
    # Until when (monotonic) the lease is surely ours: the last acquire or renewal that
    # answered, as sent (the database counts its ttl from a later instant), plus the ttl.
    held_until = [time.monotonic() + ttl]
    grace = min(ttl / 6, KILL_GRACE_MAX)
    # CMD's own process group, unless pgtick is in its terminal's foreground (see above).
    own_group = not _in_terminal_foreground()
    kill_at: list[float] = []  # when a lost lease's SIGTERM turns into SIGKILL

    def send(signum: int) -> None:
        if child is None or child.poll() is not None:
            return
        if own_group:
            _signal_group(child.pid, signum)
        else:
            child.send_signal(signum)

    def watch_until() -> None:
        # The watchdog acts a little after pgtick's own check would (which then tells it to keep
        # quiet) and kills by the lease's conservative end, like pgtick's own grace does.
        stop_at = held_until[0] - ttl / 6
        _tell(watchdog, f"until {stop_at + min(0.5, grace / 2)} {stop_at + grace}")

    def stop_command(why: str) -> None:
        if lost.is_set():
            return
        _tell(watchdog, "quiet")
        print(f"pgtick lock: lease {name} {why}; stopping the command", file=sys.stderr)
        kill_at.append(time.monotonic() + grace)
        lost.set()
        send(signal.SIGTERM)

    def renew() -> None:
        while not done.wait(ttl / 3):
            sent = time.monotonic()
            try:
                ok = _renew(dsn, name, owner, ttl_interval)
            except (psycopg.Error, Exception) as exc:
                print(f"pgtick lock: renewing lease {name} failed: {exc}", file=sys.stderr)
                if time.monotonic() < held_until[0] - ttl / 6:
                    continue
                ok = False
            if not ok:
                stop_command("lost")
                return
            held_until[0] = sent + ttl
            watch_until()

    early: list[int] = []  # signals that came before CMD was started

    def forward(signum: int, frame: FrameType | None) -> None:
        if child is None:
            early.append(signum)
        elif own_group or not (signum in FROM_TERMINAL and _in_terminal_foreground()):
            send(signum)

    # The handlers are in place before the lease is taken: a signal that comes just after
    # the lease commits is kept (and the lease released), never the default death that
    # would leave the lease held until its ttl runs out.
    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    renewer = threading.Thread(target=renew, name="pgtick-lease", daemon=True)
    acquired = False
    watchdog: subprocess.Popen[bytes] | None = None
    try:
        with connect(dsn, application_name="pgtick-lock") as conn:
            sent = time.monotonic()
            acquired = calls.acquire_lease(conn, name, owner, ttl_interval)
            held_until[0] = sent + ttl
            if not acquired:
                held = calls.lease_holder(conn, name)
                holder, until, skips = held if held else ("?", None, 0)
                # Any owner text another language gave jobs.acquire_lease: shown, never obeyed.
                holder = printable_line(str(holder))
                # On standard error: standard output is the command's (`-- pg_dump > x.sql`),
                # and a skip must not leave a file that reads as its output.
                print(
                    f"pgtick lock: skipped: lease {name} held by {holder} until {iso(until) or '?'}",
                    file=sys.stderr,
                    flush=True,
                )
                if skips >= SKIP_WARN_AFTER:
                    print(
                        f"pgtick lock: warning: lease {name} skipped {skips} times in a row;"
                        f" is {holder} stuck?",
                        file=sys.stderr,
                    )
                return skipped_exit
        if early:  # stopped before CMD started: do not start it
            return 128 + early[0]
        watchdog = _start_watchdog()
        try:
            child = subprocess.Popen(cmd, process_group=0 if own_group else None)
        except OSError as exc:
            print(f"pgtick lock: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
            # As a shell says it: 127 not found, 126 found but not run (not executable, say).
            return 127 if isinstance(exc, FileNotFoundError) else 126
        _tell(watchdog, f"{child.pid} {int(own_group)} {grace}")
        watch_until()
        for signum in early:  # came while Popen ran, before `child` was set
            send(signum)
        renewer.start()
        while True:
            try:
                # Woken in time for the check below, a sixth of the ttl before the lease's end.
                due = held_until[0] - ttl / 6 - time.monotonic()
                code = child.wait(timeout=max(0.01, min(grace, 1.0, due if due > 0 else 1.0)))
                break
            except subprocess.TimeoutExpired:
                # A renewal that does not answer (a partition, a lock wait) cannot stop the
                # command from its thread: it stops here, a sixth of the ttl before the lease
                # may expire and another holder start (as when renewals fail).
                if time.monotonic() > held_until[0] - ttl / 6:
                    stop_command("not renewed within its ttl (the database did not answer)")
                if kill_at and time.monotonic() > kill_at[0]:
                    send(signal.SIGKILL)
        if lost.is_set() and code == 0:
            code = 1
        return 128 - code if code < 0 else code
    finally:
        if child is not None and own_group:
            # What CMD started in its group and left running stops before the lease goes, and
            # the lease is renewed until it has (an ended process may stay a member until its
            # new parent reaps it).
            _stop_group(child.pid, grace if lost.is_set() else KILL_GRACE_MAX)
        done.set()
        if watchdog is not None:
            _tell(watchdog, "done")  # CMD has ended: nothing for the watchdog to stop
            if watchdog.stdin is not None:
                watchdog.stdin.close()
            try:
                watchdog.wait(5)
            except subprocess.TimeoutExpired:
                watchdog.kill()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if acquired:
            try:
                _release(dsn, name, owner)
            except Exception as exc:  # the TTL frees it anyway
                print(f"pgtick lock: releasing lease {name} failed: {exc}", file=sys.stderr)
