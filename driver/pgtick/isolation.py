"""Process isolation: ``@app.job(..., isolation="process")`` runs the job in a child process.

A thread cannot be stopped from outside, so a thread job that never reaches
``ctx.checkpoint()`` runs past its timeout and past a cancel. An isolated job runs in
a child process instead, and the executor thread that waits for it kills the child
(SIGKILL) when

* the run's timeout passes: the run fails with reason ``Timeout``;
* a cancel reaches the worker (through its heartbeat): the kind's ``compensate``
  function then runs in the worker process, in the executor thread that waited, and
  the run ends CANCELLED;
* the run is no longer this worker's (reaped or fenced): nothing is reported;
* no heartbeat has confirmed the run within its heartbeat timeout (the worker cut off
  from the database): a reaper may have failed it and its retry may be running, so the
  child is killed at that instant (where a thread job's checkpoint would wait), and
  nothing is reported: the reaper ends the run.

Each child leads a process group of its own, and the kill reaches the whole group: a
process the job started (a ``subprocess`` it waits for) is stopped with it, not left to run
on past the timeout or cancel; so is it when the child dies before reporting (a crash,
``os._exit``) and when the worker process dies. On Linux the kill also reaches the processes
that left the group: a process started in a session of its own (``start_new_session=True``,
``os.setsid()``) and a daemon that double-forked away from its parent. There the child is a
guard: a child subreaper (``PR_SET_CHILD_SUBREAPER``) whose own child, the job process, runs
the jobs, so every process the jobs start stays the guard's descendant, orphaned or not, even
once the job process is gone. A kill stops the guard, its descendants and their process
groups (SIGSTOP, walked through the parent links in ``/proc`` until no new one appears, so
none forks past the walk), then SIGKILLs them all. The guard reaps the orphans that end (the
job process, reused, is not left holding their exits); when the job process ends other than
by a clean exit (a crash, ``os._exit``, a kill from outside) or the worker process dies, it
stops and kills what is left below it, then exits as the job process did. Elsewhere (or
where ``prctl`` is refused) the child runs the jobs itself and the kill reaches its process
group alone.

What travels (pickled over a pipe): to the child, the job's spec (its function and
``compensate`` by reference, so both must be importable module-level functions) and
the run's row; back, the result or the
exception's class chain (for the retry policy), its message and its traceback text
(appended to the run's ``error``), both bounded in the child (``error_message``,
``traceback_text``): a huge message comes back as its head, saying it was shortened, and
the traceback still fits after it. In the child, ``ctx.checkpoint()`` still enforces
the timeout; cancellation is the parent's kill, so ``ctx.on_cancel`` hooks registered
in the child never run (use the kind's ``compensate=``).

The children form a small pool of the worker's own, one per isolated job running at once
(so at most the worker's concurrency): a child runs one job after another and is killed
and replaced only when a job is stopped or kills it. Several workers in one Python process
(one per queue, say) each have their pool: stopping one stops its children only. Children
ignore SIGINT/SIGTERM (the worker decides when they stop) and exit when the worker process
dies. Job code in a child shares module-level state with the jobs that ran before it in
that child, as it does in a thread. A worker inside a daemonic ``multiprocessing`` process
cannot start job processes (Python forbids it): such runs fail with the reason in their
error.

A kind's ``memory_limit`` caps the job process's data memory (``RLIMIT_DATA``, the soft
limit) while its job runs, and is lifted after it for the next job: past it an allocation
raises ``MemoryError``, which the run's error reports as ``MemoryLimitExceeded`` naming the
limit; a job process that dies instead fails its run as ``JobProcessExited``, the error
naming the limit too.

Measured costs are in the README ("Running jobs: threads, async, processes").
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NoReturn

from pgtick.app import Context, JobSpec, error_classes, size_text
from pgtick.errors import JobTimeout, MemoryLimitExceeded, Snooze
from pgtick.execution import Outcome, error_message, failure, message_of, outcome_of, traceback_text
from pgtick.reporter import MAX_REFUSAL, refusal_text, result_json, storable

log = logging.getLogger("pgtick.worker")

SPAWN = multiprocessing.get_context("spawn")


class JobProcessExited(Exception):
    """The job's process ended without reporting (killed from outside, or os._exit)."""


class JobProcess:
    """One child process that runs isolated jobs one at a time."""

    def __init__(self) -> None:
        self.conn, child = SPAWN.Pipe()
        self.process = SPAWN.Process(
            target=_child_main,
            args=(child, _logging_setup()),
            name="pgtick-job-process",
            daemon=True,  # killed if the worker exits without closing it
        )
        self.process.start()
        child.close()
        self.job_pid: int | None = None  # the process the jobs run in, once it has said so
        self._wake_r, self._wake_w = os.pipe()  # written to interrupt the wait (cancel)
        os.set_blocking(self._wake_w, False)

    @property
    def pid(self) -> int | None:
        """The id of the process the jobs run in (on Linux, a child of the guard ``process``)."""
        return self.job_pid or self.process.pid

    def interrupt(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # already written (pipe full) or closed: the waiter wakes either way

    def run(self, ctx: Context) -> tuple[Outcome, bool]:
        """Run ``ctx``'s job in this process; returns its outcome and whether the
        process can run another job."""
        timeout = None if ctx.timeout is None else ctx.timeout - (time.monotonic() - ctx.timeout_from)
        spec = replace(ctx.spec, compensate=None)  # compensation runs here, not in the child
        try:
            self.conn.send((spec, ctx.run, ctx.worker_id, timeout))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            message = f"isolation='process' needs an importable module-level job function: {exc}"
            return outcome_of(ctx, TypeError(message)), True
        ctx._interrupt = self.interrupt
        try:
            return self._wait(ctx)
        finally:
            ctx._interrupt = None

    def _wait(self, ctx: Context) -> tuple[Outcome, bool]:
        deadline = None if ctx.timeout is None else ctx.timeout_from + ctx.timeout
        while True:
            if ctx.abandoned:
                self.kill()
                return Outcome(ctx, "abandon"), False
            if ctx.cancel_requested:
                self.kill()
                return _cancelled(ctx), False
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.kill()
                error = JobTimeout(
                    f"run {ctx.run_id} exceeded its timeout of {ctx.timeout:g}s; its process was killed"
                )
                return outcome_of(ctx, error), False
            owned_for = ctx._owned_for()
            if owned_for is not None and owned_for < 0:
                # No heartbeat has confirmed the run within its heartbeat timeout: a reaper may
                # have failed it and its retry may be running. A checkpoint would wait here for
                # a heartbeat; the child would not, so it is stopped, and nothing is reported.
                self.kill()
                log.warning(
                    "run=%s kind=%s worker=%s job process pid %s killed: no heartbeat has reached"
                    " the database within its heartbeat timeout of %gs, so it may have been reaped"
                    " and retried elsewhere; nothing is reported (the reaper ends the run)",
                    ctx.run_id,
                    ctx.kind,
                    ctx.worker_id,
                    self.pid,
                    ctx._heartbeat_timeout,
                )
                return Outcome(ctx, "abandon"), False
            waits = [t for t in (None if deadline is None else deadline - now, owned_for) if t is not None]
            wait = min(waits) if waits else None
            ready = multiprocessing.connection.wait(
                [self.conn, self.process.sentinel, self._wake_r], timeout=wait
            )
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
            if self.conn in ready:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    return self._exited(ctx), False
                if message[0] == "pid":  # sent once, as the process begins
                    self.job_pid = message[1]
                    continue
                return _outcome(ctx, message), True
            if self.process.sentinel in ready:
                return self._exited(ctx), False

    def _exited(self, ctx: Context) -> Outcome:
        if self.job_pid not in (None, self.process.pid):
            # A guard: it ends what the job started, then exits as the job process did.
            self.process.join(_SETTLE + 5)
        self.kill_tree()  # what its job started ends with it (the child, not yet reaped, holds its id)
        self.process.join(5)
        code = self.process.exitcode
        said = f"job process pid {self.pid} exited with code {code} before reporting"
        if ctx.spec.memory_limit is not None:
            # Code that aborts when an allocation fails (a C extension) ends so, not raising.
            said += (
                f"; it ran under its kind's memory limit of {size_text(ctx.spec.memory_limit)},"
                " which an allocation that ended it may have exceeded"
            )
        error = JobProcessExited(said)
        return outcome_of(ctx, error)

    def kill(self) -> None:
        """SIGKILL the child and what the job started in it (a hard stop), and reap it."""
        self.kill_tree()
        self.process.join(10)
        self.close()

    def kill_tree(self) -> None:
        """SIGKILL the child, its descendants and its process group: the processes its job
        started (a ``subprocess`` it waits for, one in a session of its own, a daemon) would
        run on, orphaned, past the timeout or cancel that stopped the job. Called before the
        child is reaped, so its id is not yet reused."""
        pid = self.process.pid
        if pid is not None:
            # Stopped, the child and its group fork no more while its tree is walked. Not yet
            # a group of its own (killed before it began): the child alone.
            _signal(pid, signal.SIGSTOP, group=True)
            _signal(pid, signal.SIGSTOP)
            kill_descendants(pid, stopped_root=True)
            _signal(pid, signal.SIGKILL, group=True)
        if self.process.is_alive():
            self.process.kill()

    def close(self) -> None:
        """Tell an idle child to exit; kill it if it does not; release the pipes."""
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(2)
            if self.process.is_alive():
                self.kill_tree()
                self.process.join(5)
        self.conn.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1


def _cancelled(ctx: Context) -> Outcome:
    """The child is dead; compensate here (this executor thread), then report CANCELLED."""
    try:
        ctx._compensate()
    except BaseException as exc:
        log.warning("run=%s kind=%s compensation failed: %s", ctx.run_id, ctx.kind, exc)
        return outcome_of(ctx, exc)
    return Outcome(ctx, "cancel", message=f"run {ctx.run_id} cancelled; its process was killed")


def _outcome(ctx: Context, message: tuple[Any, ...]) -> Outcome:
    if message[0] == "ok":
        return Outcome(ctx, "complete", result=message[1])
    if message[0] == "snooze":  # the job raised pgtick.Snooze: its delay
        return Outcome(ctx, "snooze", delay=message[1])
    if message[0] == "unstorable":
        why = f"the result could not be stored: {message[1]}"
        log.warning("run=%s kind=%s %s", ctx.run_id, ctx.kind, why)
        return failure(ctx, storable(why, MAX_REFUSAL))
    _, classes, text, trace, timed_out = message
    if timed_out:
        return Outcome(ctx, "fail", classes=classes, message=text, reason="Timeout")
    return Outcome(ctx, "fail", classes=classes, message=f"{text}\n\n{trace}".rstrip())


class ProcessPool:
    """The job processes of one worker: idle ones are kept for the next job.

    ``reuse=False`` starts a fresh process for every job (one spawn per job: the
    slower alternative the README measures)."""

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self._lock = threading.Lock()
        self._idle: list[JobProcess] = []
        self._busy: set[JobProcess] = set()
        self.started = 0

    def execute(self, ctx: Context) -> Outcome:
        try:
            proc = self._take()
        except Exception as exc:  # e.g. a daemonic worker process may not start children
            log.warning("run=%s kind=%s cannot start a job process: %s", ctx.run_id, ctx.kind, exc)
            return outcome_of(ctx, exc)
        keep = False
        try:
            outcome, keep = proc.run(ctx)
            return outcome
        finally:
            keep = keep and self.reuse
            with self._lock:
                self._busy.discard(proc)
                if keep:
                    self._idle.append(proc)
            if not keep:
                proc.close()

    def _take(self) -> JobProcess:
        with self._lock:
            while self._idle:
                proc = self._idle.pop()
                if proc.process.is_alive():
                    self._busy.add(proc)
                    return proc
                proc.close()
            self.started += 1
        proc = JobProcess()
        with self._lock:
            self._busy.add(proc)
        return proc

    def close(self) -> None:
        """Stop the idle children and kill the busy ones (their runs go to the reaper)."""
        with self._lock:
            procs, self._idle = self._idle + list(self._busy), []
            busy = set(self._busy)
        for proc in procs:
            if proc in busy:
                if proc.process.is_alive():
                    proc.kill_tree()  # its executor thread reaps it
            else:
                proc.close()


#: The job processes of runs executed outside a worker (``pgtick.execution.execute`` called
#: without a pool). A ``Worker`` has a pool of its own, which keeps its children for the
#: next job when this one does (``POOL.reuse``: the setting for the whole Python process).
POOL = ProcessPool()


def close_idle_processes() -> None:
    """Stop the children of ``POOL`` (a worker's own are stopped with the worker)."""
    POOL.close()


# -- the child ------------------------------------------------------------------------------


def _logging_setup() -> tuple[int, logging.Formatter | None, dict[str, int]]:
    """The worker's logging as a job process repeats it: the root level, the format, and the
    levels set on named loggers (``pgtick run`` shows ``pgtick.job`` at INFO, what job code
    logs through ``ctx.logger``, under a root at WARNING)."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    try:
        pickle.dumps(formatter)
    except Exception:
        formatter = None
    levels = {
        name: logger.level
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
    }
    return root.getEffectiveLevel(), formatter, levels


def _child_main(
    conn: multiprocessing.connection.Connection, logging_setup: tuple[int, Any, dict[str, int]]
) -> None:
    # A process group of its own, led by the child: the worker's kill reaches the processes
    # its jobs start too (JobProcess.kill_tree).
    try:
        os.setpgid(0, 0)
    except OSError:  # refused (a sandbox): the kill reaches the child alone, as it did
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when a job stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A guard: the jobs run in a child of this process, a child subreaper, so the processes
    # they start that leave the group (a new session, a daemon's double fork) stay its
    # descendants, even once the job process is gone.
    if _become_subreaper():
        guard = os.getpid()
        job = os.fork()
        if job:
            conn.close()
            _guard(job)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the guard killed from outside: so is the job
        if os.getppid() != guard:
            os._exit(1)
        code = 1
        try:
            _serve(conn, logging_setup, exit_with_parent=False)  # the guard watches the worker
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)
    _serve(conn, logging_setup, exit_with_parent=True)


def _guard(job: int) -> NoReturn:
    """Reap every child (the job process, and the orphans of what its jobs started); once the
    job process has ended other than by a clean exit, kill what is left of its jobs' processes;
    then end as the job process did."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == job:
            break
    code = os.waitstatus_to_exitcode(status)
    _ending.acquire()  # a kill for the worker's death under way: it ends this process
    gone = parent is not None and bool(multiprocessing.connection.wait([parent.sentinel], 0))
    if code != 0 or gone:  # killed, crashed, os._exit, or its worker is gone: so are its jobs
        kill_descendants(os.getpid(), stopped_root=False)
    if code < 0:  # killed by a signal: so is the guard, for the worker to read the same code
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: not to be caught anyway
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 1)


def _serve(
    conn: multiprocessing.connection.Connection,
    logging_setup: tuple[int, Any, dict[str, int]],
    *,
    exit_with_parent: bool,
) -> None:
    """Run the jobs the worker sends, one after another, until it sends None or goes."""
    conn.send(("pid", os.getpid()))
    level, formatter, levels = logging_setup
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter or logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    for name, named_level in levels.items():
        logging.getLogger(name).setLevel(named_level)
    parent = multiprocessing.parent_process()
    if parent is not None and exit_with_parent:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        spec, run, worker_id, timeout = job
        conn.send(_run_here(spec, run, worker_id, timeout))


#: Held by whichever thread ends the process: the watch for the worker's death, or the guard.
_ending = threading.Lock()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    _ending.acquire()
    try:
        # The worker process is gone: so is its job, and what it started.
        kill_descendants(os.getpid(), stopped_root=False)
        if os.getpgid(0) == os.getpid():  # the group is the child's own (not the worker's)
            os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(1)


# -- a job process's tree ----------------------------------------------------------------------

#: prctl(2) options: orphaned descendants reparent to this process rather than to init; a
#: signal this process gets when its parent ends.
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1

#: How long a kill waits for the processes it stopped to be stopped before its last walk.
_SETTLE = 2.0


def _become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): a process its jobs start that leaves its
    parent (a daemon's double fork) stays its descendant, within reach of ``kill_descendants``."""
    return sys.platform.startswith("linux") and _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` through the C library (Linux); whether it was done."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _signal(pid: int, sig: int, *, group: bool = False) -> None:
    """Send ``sig`` to ``pid`` (or to the process group ``pid`` leads) if it is there."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(path: str) -> list[bytes] | None:
    """The fields of a ``/proc`` stat file after the command name (state, ppid, pgrp, ...)."""
    try:
        with open(path, "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None


def _descendants(root: int) -> dict[int, int] | None:
    """The processes below ``root``, each with its process group, by the parent links in
    ``/proc`` (None without it)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    children: dict[int, list[tuple[int, int]]] = {}
    for name in names:
        if name.isdigit():
            fields = _stat(f"/proc/{name}/stat")
            if fields is not None and len(fields) > 2:
                children.setdefault(int(fields[1]), []).append((int(name), int(fields[2])))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for child, group in children.get(todo.pop(), ()):
            if child not in found:
                found[child] = group
                todo.append(child)
    return found


def _settled(pid: int) -> bool:
    """Whether no thread of ``pid`` runs: all stopped, dead, or in an uninterruptible wait (a
    ``vfork`` parent waiting for its child's exec). A settled process forks no more."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        fields = _stat(f"/proc/{pid}/task/{tid}/stat")
        if fields and fields[0] in (b"R", b"S"):
            return False
    return True


def kill_descendants(root: int, *, stopped_root: bool) -> None:
    """SIGKILL every descendant of ``root`` and every process group one of them is in (but the
    caller's own): nothing without ``/proc``.

    First each is stopped (SIGSTOP to it and to its group, so a member of the group forking
    or exiting as the signal comes is stopped too), and the tree walked again until a walk
    made once every process stopped so far had stopped (``root`` too when ``stopped_root``)
    finds no new one: a fork completes before its parent stops, so no process forked during
    the walk escapes it. A process that does not stop within ``_SETTLE`` seconds ends the
    wait, not the kill."""
    own = os.getpgid(0)
    stopped: set[int] = set()
    groups: set[int] = set()
    deadline = time.monotonic() + _SETTLE
    settled = False
    while True:
        found = _descendants(root)
        if found is None:
            break
        new = found.keys() - stopped
        for group in {found[pid] for pid in new} - groups - {own}:
            _signal(group, signal.SIGSTOP, group=True)
            groups.add(group)
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= new
        if new:
            settled = False
        elif settled:
            break
        if time.monotonic() > deadline:
            break
        if not new:
            watched = stopped | {root} if stopped_root else stopped
            settled = all(_settled(pid) for pid in watched)
            if not settled:
                time.sleep(0.005)
    for group in groups:
        _signal(group, signal.SIGKILL, group=True)
    for pid in stopped:
        _signal(pid, signal.SIGKILL)


@contextmanager
def _memory_limit(limit: int | None) -> Iterator[None]:
    """Cap this process's data memory at ``limit`` bytes while the job runs (the soft limit
    alone: the process's own settles it back after the job, for the next job of the pool).

    RLIMIT_DATA, not RLIMIT_AS: the address space counts what is reserved, not used. Measured
    on Linux 6.18 with CPython 3.11, eight threads that each allocated a kilobyte took a process
    from 58 MB of address space to 634 MB (a 64 MiB malloc arena and an 8 MiB stack reserved
    per thread) and from 26 MB of data to 91 MB; under RLIMIT_AS at 200 MiB, starting them
    failed with MemoryError in the thread machinery and hung the process. RLIMIT_DATA (Linux
    4.7 and later: private writable memory, the heap and anonymous mappings, thread stacks
    included) refuses a 1 GiB bytearray as RLIMIT_AS does, with MemoryError before a page of
    it is touched, and lets the threads start. Memory mapped from a file or shared is not
    counted, nor what the processes the job starts use (each inherits the limit, its own)."""
    if limit is None:
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    capped = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (capped, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _over_limit(ctx: Context, limit: int, exc: MemoryError) -> MemoryLimitExceeded:
    """The MemoryError of a job past its kind's memory limit, as the run's error says it."""
    detail = message_of(exc)
    said = f" ({detail})" if detail else ""
    error = MemoryLimitExceeded(
        f"run {ctx.run_id} exceeded its memory limit of {size_text(limit)}: an allocation in its"
        f" job process failed{said}"
    )
    return error.with_traceback(exc.__traceback__)


def _run_here(spec: JobSpec, run: dict[str, Any], worker_id: str, timeout: float | None) -> tuple[Any, ...]:
    ctx = Context(run, spec, worker_id, timeout)
    try:
        with _memory_limit(spec.memory_limit):
            result = spec.fn(ctx)
            if inspect.iscoroutine(result):  # an async def job behind a plain decorator
                result = asyncio.run(result)
    except Snooze as exc:
        return ("snooze", exc.delay)
    except BaseException as exc:
        if spec.memory_limit is not None and isinstance(exc, MemoryError):
            if not isinstance(exc, MemoryLimitExceeded):
                exc = _over_limit(ctx, spec.memory_limit, exc)
        # Bounded here, before the pipe: a message of a million characters comes back as its
        # head, saying it was shortened, and the traceback after it as its innermost frames.
        # Both are read even if the error's __str__ raises.
        text = message_of(exc) if isinstance(exc, JobTimeout) else error_message(exc)
        trace = f"job process pid {os.getpid()}:\n" + traceback_text(exc)
        return ("error", error_classes(exc), text, trace, isinstance(exc, JobTimeout))
    try:
        # Unpickled here too: what pickles but cannot be unpickled (an exception whose
        # __init__ takes other arguments than its args) would fail in the worker's recv.
        pickle.loads(pickle.dumps(result))
    except Exception:
        # What cannot be pickled is not JSON either: the run fails as a thread job's does.
        try:
            result_json(result)
        except Exception as exc:
            return ("unstorable", refusal_text(exc))
        result = json.loads(json.dumps(result))  # JSON that pickle refused (a dict subclass)
    return ("ok", result)
