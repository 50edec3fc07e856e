"""The worker: claims runs with jobs.claim, runs job code on a bounded pool of
threads, heartbeats all its runs in one call, and reports outcomes (fenced).

Threads, each with its own connection where it talks to PostgreSQL:

* the claim loop (``Worker.run``): reports finished runs, claims as many runs as
  it has free slots, then waits for the first of a NOTIFY on channel ``jobs``,
  a finished job, the poll interval, or stop;
* ``HeartbeatLoop``: stamps every run this worker holds on a fixed cadence;
  a run missing from the answer is no longer ours (abandoned: its result is
  not reported), a run flagged cancel_requested is cancelled at its next
  checkpoint; failures are logged, never fatal to the jobs;
* the listener: LISTEN jobs, so a new run starts within milliseconds;
* ``concurrency`` executor threads running job code.

On stop the worker claims nothing more, lets running jobs finish within the
grace period, reports them, then stops heartbeating whatever is left so the
reaper hands it on. Outcomes that cannot be reported (database down) are kept
and retried until the database answers: the fenced SQL makes a repeat harmless.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import queue
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from pgtick.app import App, Context, error_classes
from pgtick.db import DB_ERRORS, connect, connect_dicts
from pgtick.errors import Abandoned, Cancelled, JobTimeout

log = logging.getLogger("pgtick.worker")

# heartbeat => true: the claim itself stamps heartbeat_at, so no extra heartbeat round
# trip is needed right after it, and a crash just after claiming is reaped by timeout.
# queues => NULL claims from every queue.
CLAIM_SQL = "SELECT * FROM jobs.claim(%s, %s, %s, true, %s)"


def new_worker_id() -> str:
    """Unique per process: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class Outcome:
    """How a run ended in this process, waiting to be reported."""

    ctx: Context
    action: str  # complete | fail | cancel | abandon
    result: Any = None
    classes: list[str] | None = None
    message: str | None = None
    reason: str = "Error"


class WorkerListener(Protocol):
    """Receives the worker's events (the metrics endpoint implements it)."""

    def on_claim(self, kinds: list[str], seconds: float) -> None: ...
    def on_outcome(self, kind: str, outcome: str) -> None: ...
    def on_heartbeat_failure(self) -> None: ...


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    abandoned: int = 0
    fenced: int = 0
    heartbeat_failures: int = 0


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value


class HeartbeatLoop:
    """One heartbeat call for all of a worker's runs, on a fixed cadence."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.now = threading.Event()  # set to heartbeat at once
        self.waiting = float("inf")  # the wait in progress, seconds
        self.stopped = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._loop, name="pgtick-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.now.set()
        self._thread.join(timeout=10)
        if self._conn is not None:
            self._conn.close()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            self.waiting = self.worker.heartbeat_interval()
            self.now.wait(self.waiting)
            self.now.clear()
            if self.stopped.is_set():
                return
            self.beat()

    def beat(self) -> None:
        w = self.worker
        held = w.held()
        if not held:
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(w.dsn, application_name=f"pgtick-heartbeat {w.worker_id}")
            rows = self._conn.execute(
                "SELECT run_id, cancel_requested FROM jobs.heartbeat(%s, %s)",
                (list(held), w.worker_id),
            ).fetchall()
        except Exception as exc:
            w.stats.heartbeat_failures += 1
            if w.listener is not None:
                w.listener.on_heartbeat_failure()
            log.warning("worker=%s heartbeat failed (runs keep going): %s", w.worker_id, exc)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return
        alive = {int(run_id): bool(cancel) for run_id, cancel in rows}
        still_held = w.held()  # runs reported meanwhile are gone from the answer too
        for run_id, ctx in held.items():
            if run_id not in still_held:
                continue
            if run_id not in alive:
                if w.is_finished(ctx):
                    continue  # its outcome is on its way; the fenced SQL call decides
                if not ctx.abandoned:
                    log.warning(
                        "run=%s kind=%s worker=%s abandoned: no longer ours (reaped or fenced)",
                        run_id,
                        ctx.kind,
                        w.worker_id,
                    )
                ctx.abandon()
            elif alive[run_id] and not ctx.cancel_requested:
                log.info("run=%s kind=%s cancel requested", run_id, ctx.kind)
                ctx.request_cancel()


class Worker:
    """Claims and executes runs of the kinds registered in ``app``."""

    def __init__(
        self,
        app: App,
        dsn: str,
        *,
        worker_id: str | None = None,
        concurrency: int = 10,
        batch_size: int | None = None,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        shutdown_grace: float = 30.0,
        listen: bool = True,
        listener: WorkerListener | None = None,
        queues: list[str] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app = app
        self.dsn = dsn
        self.worker_id = worker_id or new_worker_id()
        self.concurrency = concurrency
        self.batch_size = min(batch_size or concurrency, 1000)
        self.poll_interval = poll_interval
        self.base_heartbeat_interval = heartbeat_interval
        self.shutdown_grace = shutdown_grace
        self.listen = listen
        self.listener = listener
        self.kinds = sorted(app.jobs)
        self.queues = sorted(set(queues)) if queues else None  # None: every queue
        self.stats = WorkerStats()
        self.default_heartbeat_timeout = 60.0
        self._lock = threading.Lock()
        self._active: dict[int, Context] = {}
        self._finished: set[int] = set()
        self._outcomes: list[Outcome] = []
        self._wake = threading.Event()
        self._tasks: queue.SimpleQueue[Context | None] = queue.SimpleQueue()
        self._heartbeat = HeartbeatLoop(self)
        self._threads: list[threading.Thread] = []

    # -- state shared with the heartbeat loop ---------------------------------
    def held(self) -> dict[int, Context]:
        with self._lock:
            return dict(self._active)

    def is_finished(self, ctx: Context) -> bool:
        with self._lock:
            return ctx.run_id in self._finished

    def heartbeat_interval(self) -> float:
        """The cadence: the configured interval, or a third of the shortest heartbeat timeout held."""
        with self._lock:
            timeouts = [
                _seconds(c.run.get("heartbeat_timeout")) or self.default_heartbeat_timeout
                for c in self._active.values()
            ]
        shortest = min(timeouts, default=self.default_heartbeat_timeout)
        return max(0.05, min(self.base_heartbeat_interval, shortest / 3))

    # -- running ----------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set, then drain within the grace period."""
        if not self.kinds:
            log.warning("worker=%s has no job kinds registered: nothing to claim", self.worker_id)
        self._start_threads(stop)
        log.info(
            "worker=%s started kinds=%s concurrency=%d batch=%d",
            self.worker_id,
            ",".join(self.kinds),
            self.concurrency,
            self.batch_size,
        )
        conn: psycopg.Connection[Any] | None = None
        failures = 0
        try:
            while not stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    full = self._cycle(conn)
                    failures = 0
                except DB_ERRORS as exc:
                    failures += 1
                    log.warning("worker=%s database error (retrying): %s", self.worker_id, exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    stop.wait(min(0.2 * 2**failures, 5.0))
                    continue
                if full:
                    continue  # a full batch: there may be more due right now
                self._wake.wait(self.poll_interval)
                self._wake.clear()
            conn = self._drain(conn)
        finally:
            self._heartbeat.stop()
            for _ in self._threads:
                self._tasks.put(None)
            if conn is not None:
                conn.close()
            log.info("worker=%s stopped", self.worker_id)

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        conn = connect_dicts(self.dsn, application_name=f"pgtick-worker {self.worker_id}")
        row = conn.execute("SELECT heartbeat_timeout FROM jobs.config").fetchone()
        if row is not None:
            self.default_heartbeat_timeout = row["heartbeat_timeout"].total_seconds()
        return conn

    def _start_threads(self, stop: threading.Event) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._execute_loop, name=f"pgtick-job-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._heartbeat.start()
        if self.listen:
            threading.Thread(target=self._listen, args=(stop,), name="pgtick-listen", daemon=True).start()

    def _listen(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with connect(self.dsn, application_name=f"pgtick-listen {self.worker_id}") as conn:
                    conn.execute("LISTEN jobs")
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self._wake.set()
            except Exception as exc:
                log.warning("worker=%s listener lost (polling meanwhile): %s", self.worker_id, exc)
                stop.wait(1.0)

    def _cycle(self, conn: psycopg.Connection[Any], *, claim: bool = True) -> bool:
        """Report finished runs and claim for the free slots in one round trip.

        Plain completions (no result) and the claim travel in one pipeline, each
        still its own transaction; the slots the completions free are claimed at
        once. Returns True if the claim came back full (there may be more due).
        Draining calls it with ``claim=False``.
        """
        plain = self._report(conn)
        with self._lock:
            free = self.concurrency - len(self._active) + len(plain)
        want = min(free, self.batch_size) if claim else 0
        if not plain and want <= 0:
            return False
        began = time.monotonic()
        try:
            with conn.pipeline():
                done_cur = (
                    conn.execute(
                        "SELECT run_id FROM jobs.complete_many(%s, %s)",
                        ([o.ctx.run_id for o in plain], self.worker_id),
                    )
                    if plain
                    else None
                )
                claim_cur = (
                    conn.execute(CLAIM_SQL, (want, self.worker_id, self.kinds, self.queues))
                    if want > 0
                    else None
                )
            done = {row["run_id"] for row in done_cur.fetchall()} if done_cur is not None else set()
            rows = claim_cur.fetchall() if claim_cur is not None else []
        except BaseException:
            with self._lock:
                self._outcomes[:0] = plain  # report them again on the next cycle
            raise
        for o in plain:
            self._settled(o, o.ctx.run_id in done)
        if want <= 0:
            return False
        return self._dispatch(rows, want, began)

    def _dispatch(self, rows: list[dict[str, Any]], want: int, began: float) -> bool:
        """Start the claimed runs; True if the batch came back full."""
        if self.listener is not None:
            self.listener.on_claim([r["kind"] for r in rows], time.monotonic() - began)
        if not rows:
            return False
        contexts = []
        for run in rows:
            spec = self.app.jobs[run["kind"]]
            timeout = _seconds(run["timeout"]) or spec.timeout
            contexts.append(Context(run, spec, self.worker_id, timeout))
        with self._lock:
            for ctx in contexts:
                self._active[ctx.run_id] = ctx
        self.stats.claimed += len(contexts)
        # The claim stamped heartbeat_at; only a run whose heartbeat timeout is shorter than
        # the wait in progress (timeouts/3) needs the heartbeat loop woken to re-plan.
        shortest = min(
            _seconds(c.run.get("heartbeat_timeout")) or self.default_heartbeat_timeout for c in contexts
        )
        if shortest / 3 < self._heartbeat.waiting:
            self._heartbeat.now.set()
        for ctx in contexts:
            log.debug("run=%s kind=%s worker=%s started", ctx.run_id, ctx.kind, self.worker_id)
            self._tasks.put(ctx)
        return len(rows) == want

    def _execute_loop(self) -> None:
        while True:
            ctx = self._tasks.get()
            if ctx is None:
                return
            outcome = self._execute(ctx)
            with self._lock:
                self._finished.add(ctx.run_id)
                self._outcomes.append(outcome)
            self._wake.set()

    def _execute(self, ctx: Context) -> Outcome:
        fn = ctx.spec.fn
        try:
            if inspect.iscoroutinefunction(fn):
                result = asyncio.run(fn(ctx))
            else:
                result = fn(ctx)
        except Cancelled as exc:
            return Outcome(ctx, "cancel", message=str(exc))
        except Abandoned:
            return Outcome(ctx, "abandon")
        except JobTimeout as exc:
            return Outcome(ctx, "fail", classes=error_classes(exc), message=str(exc), reason="Timeout")
        except BaseException as exc:
            # Exception, and also SystemExit/KeyboardInterrupt raised by job code: uncaught
            # they would end this executor thread silently and leave the run RUNNING with
            # live heartbeats (never reaped) and one slot fewer.
            message = f"{type(exc).__name__}: {exc}"
            return Outcome(ctx, "fail", classes=error_classes(exc), message=message)
        return Outcome(ctx, "complete", result=result)

    # -- reporting ----------------------------------------------------------------
    def _report(self, conn: psycopg.Connection[Any]) -> list[Outcome]:
        """Report the finished runs that need a call of their own (failures, cancellations,
        results) and return the plain completions, which ``_cycle`` sends in one batch with
        the next claim. On a database error the unreported ones are kept."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        if not outcomes:
            return []
        pending = list(outcomes)
        plain = [o for o in pending if o.action == "complete" and o.result is None]
        plain = [o for o in plain if not o.ctx.abandoned]
        for o in plain:
            pending.remove(o)
        try:
            for o in list(pending):
                self._report_one(conn, o)
                pending.remove(o)
        except BaseException:
            pending += plain
            raise
        finally:
            if pending:
                with self._lock:
                    self._outcomes[:0] = pending
        return plain

    def _report_one(self, conn: psycopg.Connection[Any], o: Outcome) -> None:
        ctx = o.ctx
        if o.action == "abandon" or ctx.abandoned:
            self.stats.abandoned += 1
            if self.listener is not None:
                self.listener.on_outcome(ctx.kind, "abandon")
            log.info("run=%s kind=%s abandoned: result not reported", ctx.run_id, ctx.kind)
            self._forget(ctx)
            return
        if o.action == "complete":
            row = conn.execute(
                "SELECT jobs.complete(%s, %s, %s) AS ok",
                (ctx.run_id, self.worker_id, Jsonb(_jsonable(o.result))),
            ).fetchone()
            self._settled(o, bool(row and row["ok"]))
        elif o.action == "cancel":
            row = conn.execute(
                "SELECT jobs.acknowledge_cancel(%s, %s, %s) AS ok",
                (ctx.run_id, self.worker_id, o.message),
            ).fetchone()
            self._settled(o, bool(row and row["ok"]))
        else:
            row = conn.execute(
                "SELECT (f).id, (f).status::text AS status FROM jobs.fail(%s, %s, %s, %s, %s) AS f",
                (ctx.run_id, self.worker_id, o.classes, (o.message or "")[:10000], o.reason),
            ).fetchone()
            fenced = row is None or row["id"] is None
            self._settled(o, not fenced)
            if not fenced and row is not None and row["status"] == "QUEUED":
                log.info("run=%s kind=%s retry queued as run=%s", ctx.run_id, ctx.kind, row["id"])

    def _settled(self, o: Outcome, applied: bool) -> None:
        ctx = o.ctx
        if self.listener is not None:
            self.listener.on_outcome(ctx.kind, o.action if applied else "fenced")
        elapsed = time.monotonic() - ctx.started
        if not applied:
            self.stats.fenced += 1
            log.warning(
                "run=%s kind=%s %s not applied: no longer RUNNING for worker=%s (fenced)",
                ctx.run_id,
                ctx.kind,
                o.action,
                self.worker_id,
            )
        elif o.action == "complete":
            self.stats.completed += 1
            log.debug("run=%s kind=%s completed in %.3fs", ctx.run_id, ctx.kind, elapsed)
        elif o.action == "cancel":
            self.stats.cancelled += 1
            log.info("run=%s kind=%s cancelled after %.3fs", ctx.run_id, ctx.kind, elapsed)
        else:
            self.stats.failed += 1
            log.info(
                "run=%s kind=%s failed reason=%s after %.3fs: %s",
                ctx.run_id,
                ctx.kind,
                o.reason,
                elapsed,
                o.message,
            )
        self._forget(ctx)

    def _forget(self, ctx: Context) -> None:
        with self._lock:
            self._active.pop(ctx.run_id, None)
            self._finished.discard(ctx.run_id)

    def _drain(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
        """Claim nothing more; report what finishes within the grace period."""
        deadline = time.monotonic() + self.shutdown_grace
        log.info(
            "worker=%s stopping: %d runs in flight, grace %.0fs",
            self.worker_id,
            len(self.held()),
            self.shutdown_grace,
        )
        while time.monotonic() < deadline:
            with self._lock:
                if not self._active:
                    break
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                self._cycle(conn, claim=False)
            except DB_ERRORS as exc:
                log.warning("worker=%s database error while draining: %s", self.worker_id, exc)
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.5)
            self._wake.wait(0.05)
            self._wake.clear()
        left = self.held()
        if left:
            log.warning(
                "worker=%s grace over; leaving runs=%s to the reaper",
                self.worker_id,
                ",".join(map(str, sorted(left))),
            )
        return conn
