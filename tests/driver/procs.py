"""Real processes for the driver tests: `pgtick run` replicas, `pgtick lock`, one-shot CLI calls.

Every process starts in its own session (process group) with stderr logged to a
file under the test's tmp dir; ``Processes`` kills whatever is still alive when
the test ends, whatever happened, and failing tests quote the log tails.

Replicas run with short timings (tick/poll 0.2 s, heartbeat 0.3 s) and with
``PGTICK_APP_DSN`` set so job code in tests/driver/apps can record itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from harness import wait_for as wait_for  # shared poller, re-exported for these tests

APPS = Path(__file__).resolve().parent / "apps"
ROOT = Path(__file__).resolve().parents[2]
PGTICK = [sys.executable, "-m", "pgtick.cli"]
FAST = ["--tick", "0.2s", "--poll", "0.2s", "--heartbeat", "0.3s"]

T = TypeVar("T")


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

    def wait_log(self, pattern: str, timeout: float = 15) -> re.Match[str]:
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
        """`pgtick run tests/driver/apps/APP --dsn DSN` with the fast timings."""
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


def scalar(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]
