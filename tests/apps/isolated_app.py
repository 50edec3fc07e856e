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
    return {"pid": os.getpid(), "echo": ctx.payload.get("echo")}


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


def starts_sleeper(ctx: Context) -> None:
    """Starts a process that sleeps ten minutes, writes its id to the payload's ``sleeper``
    file, and waits for it, or with ``exit`` in the payload ends its own process at once
    (``os._exit``)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    written = Path(ctx.payload["sleeper"] + ".new")
    written.write_text(str(sleeper.pid))
    written.replace(ctx.payload["sleeper"])  # whole when it appears
    if ctx.payload.get("exit"):
        os._exit(3)
    sleeper.wait()


app.job("starts-sleeper", isolation="process")(starts_sleeper)
app.job("starts-sleeper-timeout", isolation="process", timeout=2)(starts_sleeper)
