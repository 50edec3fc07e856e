"""Test app: kinds with ``isolation="process"``. Job code records its entry and exit
(recording.py) from the child process it runs in."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from recording import create_tables, record_compensation, recorded

from pgtick.app import App, Context

create_tables()
app = App("test-isolated")


@app.job("stuck", isolation="process", timeout=2)
@recorded
def stuck(ctx: Context) -> None:
    """Code that never reaches a checkpoint."""
    time.sleep(3600)


@app.job("stuck-mutating", isolation="process", mutating=True, compensate=record_compensation)
@recorded
def stuck_mutating(ctx: Context) -> None:
    time.sleep(3600)


class LedgerLocked(RuntimeError):
    """An error with a class chain the retry policy can match."""


@app.job(
    "isolated-fails", isolation="process", retry_on=[RuntimeError], max_attempts=2, backoff=0.2, jitter=0.0
)
@recorded
def isolated_fails(ctx: Context) -> None:
    raise LedgerLocked(f"ledger locked for run {ctx.run_id}")


@app.job("isolated-returns", isolation="process")
@recorded
def isolated_returns(ctx: Context) -> dict[str, Any]:
    ctx.checkpoint()
    ctx.logger.info("echo %s from the job process", ctx.payload.get("echo"))
    return {"pid": os.getpid(), "echo": ctx.payload.get("echo")}


@app.job(
    "memory-capped",
    isolation="process",
    memory_limit=200 * 2**20,
    retry_on=[MemoryError],
    max_attempts=2,
    backoff=0.2,
    jitter=0.0,
)
def memory_capped(ctx: Context) -> dict[str, int]:
    """Allocates one ``bytearray`` of the payload's ``allocate`` bytes (untouched past its
    zeroing, and not even that when the allocation is refused)."""
    block = bytearray(int(ctx.payload["allocate"]))
    return {"pid": os.getpid(), "allocated": len(block)}


@app.job("stuck-memory-capped", isolation="process", memory_limit=200 * 2**20)
@recorded
def stuck_memory_capped(ctx: Context) -> None:
    time.sleep(3600)


class TwoPartError(Exception):
    """An error that pickles but cannot be unpickled: pickle rebuilds it from ``args``, which
    holds one of the two arguments its ``__init__`` requires."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what)
        self.detail = detail


@app.job("isolated-returns-unpicklable", isolation="process")
def isolated_returns_unpicklable(ctx: Context) -> Any:
    """A result pickle refuses: a function (not JSON either), or a dict of a class local to
    this call (JSON all the same); or one that pickles but cannot be unpickled (not JSON)."""

    class Local(dict[str, Any]):
        pass

    if ctx.payload.get("what") == "function":
        return lambda: None
    if ctx.payload.get("what") == "unloadable":
        return {"error": TwoPartError("ledger locked", "by run 7")}
    return Local(pid=os.getpid())


@app.job("appends", isolation="process", never_retry=[], max_attempts=2, backoff=0.2, jitter=0.0)
@recorded
def appends(ctx: Context) -> None:
    """Code without checkpoints: appends "attempt epoch-seconds" to the file at ``path`` every
    50 ms for ``seconds`` (a retry: ``retry_seconds``)."""
    key = "seconds" if ctx.attempt == 1 else "retry_seconds"
    deadline = time.monotonic() + float(ctx.payload.get(key, 1))
    with open(ctx.payload["path"], "a") as out:
        while time.monotonic() < deadline:
            out.write(f"{ctx.attempt} {time.time()}\n")
            out.flush()
            time.sleep(0.05)


class Unprintable(RuntimeError):
    """An error whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise ValueError("no text")


@app.job("isolated-unprintable", isolation="process", never_retry=[Unprintable], max_attempts=3, backoff=0.2)
@recorded
def isolated_unprintable(ctx: Context) -> None:
    raise Unprintable()


#: A process that beats: it writes its id to the file named by argv[1] (whole when it appears),
#: then appends its id, one line, to the file argv[2] every 50 ms for ten minutes (or argv[4]
#: seconds). With argv[3]
#: "daemon" it first leaves its parent as a daemon does (fork, setsid, fork; the first two
#: exit); with "hopping" it starts a session of its own, then every 5 ms forks and exits, its
#: child beating on (a moving target for whoever means to stop it).
HEARTBEAT = """
import os, sys, time
pid_file, beats, how = sys.argv[1:4]
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 600
if how == "daemon":
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
if how == "hopping":
    os.setsid()
with open(pid_file + ".new", "w") as out:
    out.write(str(os.getpid()))
os.replace(pid_file + ".new", pid_file)
give_up = time.monotonic() + seconds
beat = 0.0
with open(beats, "a") as out:
    while time.monotonic() < give_up:
        if time.monotonic() >= beat:
            out.write(f"{os.getpid()}\\n")
            out.flush()
            beat = time.monotonic() + 0.05
        if how != "hopping":
            time.sleep(0.05)
        elif os.fork():
            os._exit(0)
        else:
            time.sleep(0.005)
"""


def starts_sleeper(ctx: Context) -> None:
    """Starts a process that beats (``HEARTBEAT``) into the payload's ``beats`` file for ten
    minutes after writing its id to the ``sleeper`` file, and waits for it (no checkpoint),
    or with ``exit`` in the payload ends its own process once the id is written
    (``os._exit``). ``how`` says how the process is started: ``subprocess`` (a child in the
    job's process group), ``new-session`` (``start_new_session=True``), ``daemon`` (a child
    that double-forks into a session of its own and exits) or ``hopping`` (one that moves to a
    new process every beat)."""
    how = ctx.payload.get("how", "subprocess")
    pid_file = Path(ctx.payload["sleeper"])
    args = [sys.executable, "-c", HEARTBEAT, str(pid_file), ctx.payload["beats"], how]
    beating = subprocess.Popen(args, start_new_session=how == "new-session")
    give_up = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < give_up:
        time.sleep(0.02)
    if ctx.payload.get("exit"):
        os._exit(3)
    beating.wait()  # a daemon's parent exits at once, a hopping one at its first hop
    time.sleep(600)


app.job("starts-sleeper", isolation="process")(starts_sleeper)
# (The timeout counts from the claim, so it covers starting a job process and the sleeper's
# interpreter, which take seconds on a busy machine.)
app.job("starts-sleeper-timeout", isolation="process", timeout=10)(starts_sleeper)


@app.job("leaves-a-daemon", isolation="process")
def leaves_a_daemon(ctx: Context) -> int:
    """Starts a daemon (double fork, ``setsid``) that beats for half a second, and returns its
    id once it has written it to the payload's ``sleeper`` file."""
    pid_file = Path(ctx.payload["sleeper"])
    args = [sys.executable, "-c", HEARTBEAT, str(pid_file), ctx.payload["beats"], "daemon", "0.5"]
    subprocess.run(args, check=True)
    give_up = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < give_up:
        time.sleep(0.02)
    return int(pid_file.read_text())
