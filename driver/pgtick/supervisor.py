"""``pgtick run --processes N``: N worker processes under one supervisor.

The supervisor process syncs the app and runs the scheduler (the only scheduler
candidate of the group, unless ``--no-scheduler``); each child is ``pgtick run`` again,
with the same arguments plus ``--dsn`` (the supervisor's), ``--no-scheduler`` and
``--processes 1``, and runs a worker. A child with ``--metrics-port P`` serves on
``P + its index``; child 0's ``pgtick_leader`` is the supervisor's scheduler's (the
supervisor serves no metrics), so the group reports its leader once.

* A child that exits while the supervisor is not stopping is logged with its exit code
  and started again (after a pause that doubles, up to 30 s, while children keep dying
  within 10 s of their start). Its runs are the reaper's: failed with HeartbeatLost and
  retried by their retry policy.
* SIGTERM or SIGINT to the supervisor: it closes every child's stdin, which a child
  reads as "stop": claim nothing more and drain within the grace period, as on its own
  SIGTERM. The supervisor waits for them (grace plus 15 s, then kills what is left) and
  stops its scheduler; it exits 0 when each child alive at the stop stopped cleanly (a
  child that had died before, waiting for its restart, was logged then and is not
  counted). A second signal kills the children at once. A signal sent to the whole
  process group (Ctrl-C in a terminal, systemd) reaches the children too; they drain the
  same way.
* If the supervisor dies (kill -9), the children see their stdin close and drain too.

The children are re-run from ``sys.argv``: the supervisor must be started from the
command line (``pgtick run ...`` or ``python -m pgtick.cli run ...``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from types import FrameType

from pgtick.app import App
from pgtick.errors import UsageError
from pgtick.identity import new_worker_id
from pgtick.terminal import counted

log = logging.getLogger("pgtick.supervisor")

#: Set in a child's environment to its index (0..N-1).
CHILD_VARIABLE = "PGTICK_SUPERVISED"
#: Set in child 0's environment to the owner id the supervisor's scheduler leads as.
SCHEDULER_VARIABLE = "PGTICK_SUPERVISOR_SCHEDULER"

QUICK_DEATH = 10.0  # a child that dies sooner than this is restarted after a growing pause
MAX_PAUSE = 30.0


def child_index() -> int | None:
    """This process's index under a supervisor, or None when it is not a supervised child."""
    value = os.environ.get(CHILD_VARIABLE)
    return int(value) if value is not None and value.isdigit() else None


def group_scheduler() -> str | None:
    """In child 0 of a supervisor that schedules: the owner id its scheduler leads as."""
    if child_index() != 0:
        return None
    return os.environ.get(SCHEDULER_VARIABLE) or None


def stop_when_supervisor_says() -> threading.Event:
    """In a child: an event set when stdin closes (the supervisor stops or is gone)."""
    stop = threading.Event()

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(1024):
                pass
        except (OSError, ValueError):
            pass
        if not stop.is_set():
            log.info("supervisor stopping or gone: stopping (claiming nothing more, draining)")
        stop.set()

    threading.Thread(target=watch, name="pgtick-supervised", daemon=True).start()
    return stop


@dataclass
class Child:
    index: int
    popen: subprocess.Popen[bytes]
    started: float
    pause: float = 0.0  # before the next restart after a quick death


class Supervisor:
    """Starts ``processes`` children running ``command`` and keeps them running until stop."""

    def __init__(
        self, command: list[str], processes: int, grace: float, scheduler: str | None = None
    ) -> None:
        self.command = command
        self.processes = processes
        self.grace = grace
        self.scheduler = scheduler  # the owner id the supervisor's scheduler leads as
        self.children: list[Child] = []

    def _start(self, index: int, extra: list[str], pause: float = 0.0) -> Child:
        env = {k: v for k, v in os.environ.items() if k != SCHEDULER_VARIABLE}
        env[CHILD_VARIABLE] = str(index)
        if index == 0 and self.scheduler is not None:
            env[SCHEDULER_VARIABLE] = self.scheduler
        popen = subprocess.Popen([*self.command, *extra], stdin=subprocess.PIPE, env=env)
        log.info("worker process %d started pid=%d", index, popen.pid)
        return Child(index, popen, time.monotonic(), pause)

    def run(self, stop: threading.Event, extra: list[list[str]]) -> int:
        """Run the children until ``stop``; ``extra[i]`` are child i's extra arguments."""
        self.children = [self._start(i, extra[i]) for i in range(self.processes)]
        restarts: dict[int, float] = {}  # index -> when to start it again
        while not stop.is_set():
            now = time.monotonic()
            for slot, child in enumerate(self.children):
                if child.index in restarts:
                    if now >= restarts[child.index]:
                        del restarts[child.index]
                        self.children[slot] = self._start(child.index, extra[child.index], child.pause)
                    continue
                code = child.popen.poll()
                if code is None:
                    continue
                lived = now - child.started
                child.pause = min(max(1.0, 2 * child.pause), MAX_PAUSE) if lived < QUICK_DEATH else 0.2
                log.warning(
                    "worker process %d (pid %d) exited with code %d after %.1fs; restarting in %.1fs",
                    child.index,
                    child.popen.pid,
                    code,
                    lived,
                    child.pause,
                )
                restarts[child.index] = now + child.pause
            stop.wait(0.2)
        return self._stop()

    def _stop(self) -> int:
        """Stop the children alive now; 0 when each of them stopped cleanly. One that had died
        before (logged, and waiting for its restart) is no part of the stop's outcome."""
        alive = [c for c in self.children if c.popen.poll() is None]
        log.info(
            "stopping %s (grace %.0fs)", counted(len(alive), "worker process", "worker processes"), self.grace
        )
        for child in alive:
            self._close_stdin(child)
        for child in self.children:
            if child not in alive:
                log.info(
                    "worker process %d (pid %d) had exited with code %d before the stop",
                    child.index,
                    child.popen.pid,
                    child.popen.returncode,
                )
        deadline = time.monotonic() + self.grace + 15.0
        codes = []
        for child in alive:
            try:
                code = child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "worker process %d (pid %d) did not stop: killing it", child.index, child.popen.pid
                )
                child.popen.kill()
                code = child.popen.wait()
            codes.append(code)
            log.info("worker process %d (pid %d) exited with code %d", child.index, child.popen.pid, code)
        return 0 if all(c == 0 for c in codes) else 1

    @staticmethod
    def _close_stdin(child: Child) -> None:
        if child.popen.stdin is not None:
            try:
                child.popen.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """The second signal: kill every child now."""
        for child in self.children:
            if child.popen.poll() is None:
                child.popen.kill()


def run_supervised(app: App, dsn: str, options: object, processes: int) -> int:
    """``pgtick run --processes N`` (N >= 2): the supervisor's side."""
    from pgtick.runner import RunOptions, run_app

    assert isinstance(options, RunOptions)
    if not options.worker:
        raise UsageError("--processes needs workers: it cannot be used with --no-worker")
    command = [sys.executable, "-m", "pgtick.cli", *sys.argv[1:]]
    extra = []
    for i in range(processes):
        args = ["--dsn", dsn, "--no-scheduler", "--processes", "1"]
        if options.metrics_port is not None:
            args += ["--metrics-port", str(options.metrics_port + i)]
        extra.append(args)
    owner = new_worker_id() if options.scheduler else None
    supervisor = Supervisor(command, processes, options.shutdown_grace, scheduler=owner)
    stop = threading.Event()
    _install_signal_handlers(stop, supervisor)
    scheduler = None
    scheduled: list[int] = []  # the scheduler's exit code, once it returns
    if options.scheduler:
        scheduling = replace(options, worker=False, metrics_port=None, owner=owner)

        def schedule() -> None:
            try:
                scheduled.append(run_app(app, dsn, scheduling, stop))  # a failure sets stop
            except BaseException as exc:
                log.error("the scheduler failed: %s", exc, exc_info=exc)
                scheduled.append(1)
                stop.set()

        scheduler = threading.Thread(target=schedule, name="pgtick-scheduling", daemon=True)
        scheduler.start()
    log.info("supervisor pid=%d: %s", os.getpid(), counted(processes, "worker process", "worker processes"))
    try:
        code = supervisor.run(stop, extra)
    finally:
        stop.set()
        if scheduler is not None:
            scheduler.join(timeout=30)
    log.info("supervisor stopped")
    return max(code, *scheduled) if scheduled else code


#: Seconds within which the stop signal, delivered again, is the same stop: ``timeout`` (without
#: ``--foreground``) sends its signal to the process and then to its process group, so the
#: process gets it twice at once, which would otherwise read as the second signal.
REPEAT_WINDOW = 0.5


class StopSignals:
    """Which signal stopped the process, and when: tells a second signal from the first one
    delivered twice."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None

    def is_repeat(self, signum: int) -> bool:
        """Record ``signum``; whether it is the first signal again within REPEAT_WINDOW."""
        now = time.monotonic()
        if self.first is None:
            self.first = (signum, now)
            return False
        return self.first[0] == signum and now - self.first[1] < REPEAT_WINDOW


def _install_signal_handlers(stop: threading.Event, supervisor: Supervisor) -> None:
    signals = StopSignals()

    def handle(signum: int, frame: FrameType | None) -> None:
        if signals.is_repeat(signum):
            return
        if stop.is_set():
            log.warning("second signal: killing the worker processes")
            supervisor.kill()
            return
        log.info("signal %s: stopping the worker processes (draining)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
