"""The worker: claims runs with jobs.claim, runs job code on a bounded pool of
threads, heartbeats all its runs in one call, and reports outcomes (fenced).

Threads, each with its own connection where it talks to PostgreSQL:

* the claim loop (``Worker.run``): reports finished runs, claims as many runs as
  it has free slots, and, unless its last claim came back full, learns in the same
  round trip when the next QUEUED run becomes due (``jobs.next_due``); then sleeps
  until the first of: that instant (a timer), a NOTIFY on channel ``jobs``, a
  finished job while more may be due (``_slot_wanted``), the poll interval (the safety
  net), or stop. A full batch claims again at once;
* ``HeartbeatLoop`` (``pgtick.heartbeat``): stamps every run this worker holds
  on a fixed cadence; a run missing from the answer is no longer ours
  (abandoned: its result is not reported), a run flagged cancel_requested is
  cancelled at its next checkpoint; failures are logged, never fatal to the jobs;
* the listener: LISTEN jobs, so a new run starts within milliseconds (not behind a
  transaction pooler, nor with ``listen=False``: then polling every ``poll_interval``).
  A notification whose payload is a time (epoch seconds, sent by the scheduler for the
  earliest run it inserted) only re-arms the timer when it is sooner than the one set;
  an empty payload (a run due now) wakes the claim loop;
* the completer: sends the plain completions (``jobs.complete_many``) on a
  connection of its own as the runs finish, one call in flight at a time (the
  runs that finish meanwhile go in the next call, sent as it answers), so its
  commits overlap the claims' (PostgreSQL flushes them together) and a finished
  run stops counting against its caps and limits without waiting for the claim
  loop's claim. The claim loop does not wait for it either: the finished runs'
  slots are claimed for at once, up to ``concurrency`` finished runs waiting to be
  reported (past that a slot frees when its outcome is settled, so a completion that
  cannot commit stops the claims rather than letting the worker take the whole
  queue), and the outcomes are settled (logged, counted, let go) when the claim
  loop next looks, woken for it when it sleeps. Run ids go at most MAX_CALL_IDS a call;
* ``concurrency`` executor threads, each calling ``pgtick.execution.execute``
  and handing the outcome to the ``Reporter`` (``pgtick.reporter``); the claim
  loop reports the outcomes that need a call of their own (a result, a failure,
  a cancellation), the completer the plain ones;
* when the app has ``async def`` kinds, one event loop thread (``pgtick.aio``)
  running those jobs as tasks, their outcomes reported the same way. Thread and
  async jobs share the ``concurrency`` slots.

Events (claims, outcomes, heartbeat failures) go to the listeners: the
worker's own ``WorkerStats`` and, when given, one more (the metrics endpoint).

A job let go (failed past its kind's timeout, or reaped) that never returns keeps its
thread: when every thread is so held, the runs claimed ahead of a slot go back to the
queue (``jobs.unclaim``) and the worker claims nothing until a thread returns.

On stop the worker claims nothing more, lets running jobs finish within the
grace period, reports them, then stops heartbeating whatever is left so the
reaper hands it on. Outcomes that cannot be reported (database down) are kept
and retried until the database answers: the fenced SQL makes a repeat harmless.

A claim that fails without an answer may have committed all the same (the connection
broke after the commit): its runs are then RUNNING for this worker, which does not know
them. The claim loop's next cycle, with no other claim of the worker in flight (the extra
claimers wait for it), hands back every run RUNNING for its id and claim token that it does
not hold (``jobs.hand_back_unheld``, which waits for a claim still in progress on the
server): QUEUED as before, same attempt, so no attempt is spent on work that never ran.

What goes wrong with one run stays with that run: a claimed row the driver
cannot read (a payload nested too deeply to decode, an interval beyond Python's
``timedelta``) fails that run with a message naming the column, and the rest of
its batch runs; an outcome the database refuses is recorded as a failure saying
why (``pgtick.reporter``), and a batch of plain completions the database refuses is
sent again one run at a time, so only the refused run fails; an error around the job code (an instrumentation
hook) fails that run and its executor thread goes on. What goes wrong with the
worker itself (an unexpected error in the claim loop, the heartbeat loop ending,
the database refusing the worker's own arguments such as its queues) stops it:
``run`` sets ``stop``, fails at once the runs it holds that have not started, lets
the running ones finish within the grace period, fails what is left, and raises
(``pgtick run`` then exits 1). The listener, on an error that is not the
database's, stops listening and the worker polls.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import abc
from psycopg.adapt import Buffer, Loader
from psycopg.pq import Format

from pgtick import calls, instrumentation, isolation
from pgtick.aio import EventLoop
from pgtick.app import App, Context, error_classes
from pgtick.db import DB_ERRORS, behind_pooler, connect, connect_dicts
from pgtick.errors import JobTimeout, UsageError
from pgtick.events import Listeners, WorkerListener, WorkerStats
from pgtick.execution import Outcome, describe, execute, failure, one_line
from pgtick.heartbeat import MAX_CALL_IDS, HeartbeatLoop, chunks
from pgtick.identity import new_claim_token, new_worker_id
from pgtick.reporter import MAX_REFUSAL, Reporter, refusal_text, refused, storable
from pgtick.terminal import counted

__all__ = ["Outcome", "Worker", "WorkerListener", "WorkerStats"]

log = logging.getLogger("pgtick.worker")

#: Most runs let go with no outcome recorded that the worker keeps out of a hand back after a
#: lost claim (the most recent ones; jobs.hand_back_unheld takes up to 10,000 held ids).
MAX_LEFT = 5000
#: Longest a sleeping claim loop goes without looking at its stop event (seconds).
STOP_CHECK = 0.5
#: Most claim connections one worker keeps (its claim loop's and the extra claimers').
MAX_CLAIMERS = 16
#: Most job kinds one worker claims (jobs.claim takes at most 1000 kind names).
MAX_KINDS = 1000
#: Most claims in flight while the claimed batches hold runs of capped definitions or runs
#: under tight limits (jobs.tight_limits: below 500 running or 500 starts per period): such a claim
#: holds those groups' dispatch locks until it commits, and each other claim whose pool meets
#: them finds them busy and takes the longer way (docs/performance.md). The database lets at most
#: as many such claims be in progress at once across every worker (jobs._claim_slot); the others
#: would wait there for a slot, each holding a connection.
CAPPED_CLAIMERS = 3
#: How long what the worker learnt about definitions (names, which are capped) and limits
#: (which are tight) is kept.
DEFINITION_FACTS_TTL = 60.0
#: Past a run's kind timeout, how long the job's own checkpoint (or the kill of its child
#: process) has to report it before the worker fails the run as Timeout (seconds).
TIMEOUT_GRACE = 1.0


def _seconds(value: object) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else None


def claimable_kinds(app: App) -> list[str]:
    """The kinds a worker of ``app`` claims, sorted; ``UsageError`` when there are none (it
    would have nothing to claim) or more than MAX_KINDS (more than one claim can name)."""
    kinds = sorted(app.jobs)
    if not kinds:
        raise UsageError(
            f"app {app.name!r} registers no job kinds: a worker would have nothing to claim"
            " (register one with @app.job; `pgtick run --no-worker` runs the scheduler alone)"
        )
    if len(kinds) > MAX_KINDS:
        raise UsageError(
            f"app {app.name!r} registers {len(kinds)} job kinds: a worker claims at most {MAX_KINDS}"
            " (jobs.claim's kinds); register them in several apps and run a worker for each"
        )
    return kinds


class Unreadable:
    """A value of a row the driver cannot convert (an interval beyond ``timedelta``, JSON
    nested too deeply to decode): stands in for it, saying why."""

    #: How many were ever made in this process: a claimed batch is searched for them only
    #: when this has moved since the last search.
    made = 0

    def __init__(self, why: str) -> None:
        self.why = why
        Unreadable.made += 1

    def __repr__(self) -> str:
        return f"Unreadable({self.why!r})"


#: The types whose conversion can fail on a value PostgreSQL holds.
_FRAGILE_TYPES = ("interval", "json", "jsonb", "timestamptz", "timestamp", "date")


def read_tolerantly(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn`` load an ``Unreadable`` instead of raising for a value of a fragile type,
    so that one run's absurd value cannot make a whole claimed batch unreadable (it has
    committed by then: the runs are RUNNING for this worker)."""
    for name in _FRAGILE_TYPES:
        info = conn.adapters.types.get(name)
        if info is None:
            continue
        conn.adapters.register_loader(info.oid, _tolerant(conn.adapters.get_loader(info.oid, Format.TEXT)))


def _tolerant(base: type[abc.Loader] | None) -> type[Loader]:
    class Tolerant(Loader):
        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._base = base(oid, context) if base is not None else None

        def load(self, data: Buffer) -> Any:
            if self._base is None:
                return bytes(data).decode("utf-8", "replace")
            try:
                return self._base.load(data)
            except (psycopg.DataError, ValueError, OverflowError, RecursionError) as exc:
                return Unreadable(describe(exc))

    return Tolerant


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
        claimers: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 1 <= claimers <= MAX_CLAIMERS:
            raise ValueError(f"claimers must be 1 to {MAX_CLAIMERS}, got {claimers}")
        self.kinds = claimable_kinds(app)
        self.app = app
        self.dsn = dsn
        self.worker_id = worker_id or new_worker_id()
        self.claim_token = new_claim_token()  # a secret: never logged
        self.concurrency = concurrency
        self.batch_size = min(batch_size or concurrency, 1000)
        # Runs held at once: the executing ones plus, when batch_size is larger than
        # concurrency, up to batch_size - concurrency claimed ahead and waiting for a slot,
        # so that claiming overlaps running (their server-side timeout starts at the claim).
        self.capacity = max(self.concurrency, self.batch_size)
        # Finished runs whose outcome waits to be reported free their slots up to this many
        # (reports go one call at a time, and a busy worker finishes several batches while a
        # call is out); past it, a slot frees once its run is reported (``_free_slots``).
        self.max_unreported = 4 * self.capacity
        # Claims in flight at once while claims come back full: the claim loop's own and
        # claimers - 1 more, each on its own connection and only for a batch's worth of
        # free slots, so that their commits overlap instead of following one another.
        self.claimers = claimers
        self.poll_interval = poll_interval
        self.base_heartbeat_interval = heartbeat_interval
        self.shutdown_grace = shutdown_grace
        self.listen = listen
        self.listener = listener
        self.queues = sorted(set(queues)) if queues else None  # None: every queue
        self.stats = WorkerStats()
        self.events = Listeners([self.stats, listener])
        self.default_heartbeat_timeout = 60.0
        self._lock = threading.Lock()
        self._active: dict[int, Context] = {}
        self._wake = threading.Event()
        self._hurry = threading.Event()  # end the drain now (see hurry)
        # The timer: when the next QUEUED run is due (monotonic), and whether a wake-up
        # means work (a finished job, a run due now) or only a re-armed timer.
        self._due_at: float | None = None
        self._work_signalled = False
        self._db_offset = 0.0  # server clock minus this clock, seconds
        self._tasks: queue.SimpleQueue[Context | None] = queue.SimpleQueue()
        self.reporter = Reporter(
            self.worker_id,
            self.events,
            self._release,
            claim_token=self.claim_token,
            left=self._left_to_reaper,
        )
        self._heartbeat = HeartbeatLoop(dsn, self.worker_id, self, claim_token=self.claim_token)
        self._threads: list[threading.Thread] = []
        self._completer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgtick-complete")
        # Plain completions sent to the completer and not yet settled, in the order sent
        # (under _lock: whichever thread sends appends; the claim loop settles), whether
        # one call is in flight (the finished runs wait for its answer, then go in one
        # call), and whether sending is over (the worker stops).
        self._completing: list[tuple[list[Outcome], Future[set[int]]]] = []
        self._sending = False
        self._sending_closed = False
        self._claimed_full = False  # the last claim came back full: more is due now
        # The last claim took nothing: when it was held back by a cap or a limit that this
        # worker's own runs filled, their completion committing is what makes room. With
        # the count of completions answered (both under _lock), a completion that commits
        # while an empty claim is in flight is seen whichever answer arrives first.
        self._claimed_none = False
        self._completions_answered = 0
        # Work signals counted (a NOTIFY, a run due now, an outcome to report...), and the count
        # when the last claim that came back short was sent (both under _lock): a slot a finished
        # run frees is claimed for at once only while more may be due (_slot_wanted).
        self._signals = 0
        self._signals_looked = 0
        self._unreadable_seen = Unreadable.made
        self._done_conn: psycopg.Connection[Any] | None = None  # used by the completer thread only
        # What the claimed runs' definitions are: a name for the outcome log, and which are
        # capped; read when first met and again after DEFINITION_FACTS_TTL. The limits'
        # (scope, name) and whether each is tight, read at the first batch and again after
        # DEFINITION_FACTS_TTL.
        self._names: dict[int, str] = {}
        self._capped: set[int] = set()
        self._limits: dict[tuple[str, str], bool] | None = None
        self._facts_read = time.monotonic()
        self._started: set[int] = set()  # held runs whose job code has begun
        # Runs a hand back (jobs.unclaim) is giving back, each with whether a job thread took
        # it from its queue meanwhile (under _lock): the thread lets it be, and once the call
        # has answered, a run the server did not take back is reported abandoned in its stead,
        # so each run is counted once: handed back, or abandoned.
        self._handing_back: dict[int, bool] = {}
        self._dispatching: set[int] = set()  # claimed runs not yet held
        # Runs let go with no outcome recorded (abandoned while their ownership was in doubt,
        # or no outcome could be stored), most recent last (under _lock): they may still be
        # RUNNING for this worker until the reaper ends them, and their job began, so a hand
        # back after a lost claim must not queue them again as if they never had.
        self._left: dict[int, None] = {}
        # A claim failed without an answer (under _lock): it may have committed, leaving runs
        # RUNNING for this worker that it does not know of. Until the claim loop has handed
        # them back (_hand_back_unheld), the extra claimers start no claim.
        self._claim_unsure = False
        self._hung_said = False  # the claim loop has logged that every job thread is held
        # Slot accounting shared by the claim loop and the extra claimers (under _lock):
        # slots promised to claims in flight, and held runs whose job code has finished
        # (held until their outcome is reported, but no longer using a slot).
        self._reserved = 0
        self._done_held: set[int] = set()
        self._backlog = False  # the last claim came back full: the extra claimers claim too
        self._room = threading.Condition(self._lock)  # slots freed, or a backlog found
        # The last batch claimed held runs of a capped definition or under a tight limit: the
        # extra claimers past CAPPED_CLAIMERS wait (on _caps_lifted) until a batch without one
        # is claimed.
        self._under_caps = False
        self._caps_lifted = threading.Condition(self._lock)
        # The last batch claimed held runs under a limit, roomy ones included (under _lock): a
        # claim that came back short may have been held back by it, and a finished run's slot is
        # then claimed for at once (_slot_wanted), since its completion makes room under it.
        self._under_limits = False
        self._dispatch_lock = threading.Lock()  # one claimed batch handed out at a time
        self._claim_threads: list[threading.Thread] = []
        self._fault: BaseException | None = None  # set by another thread: the worker cannot go on
        self.event_loop = EventLoop() if any(s.is_async for s in app.jobs.values()) else None
        # This worker's job processes (isolation="process"), started as its jobs need them:
        # other workers in the same Python process have theirs, which its stop leaves alone.
        self.processes = isolation.ProcessPool(reuse=isolation.POOL.reuse)

    # -- what the heartbeat loop asks (pgtick.heartbeat.HeartbeatOwner) ----------
    def held(self) -> Mapping[int, Context]:
        with self._lock:
            return dict(self._active)

    def lost(self, ctx: Context) -> None:
        if self.reporter.is_pending(ctx.run_id):
            return  # its outcome is on its way; the fenced SQL call decides
        if not ctx.abandoned:
            log.warning(
                "run=%s kind=%s worker=%s abandoned: no longer ours (reaped or fenced)",
                ctx.run_id,
                ctx.kind,
                self.worker_id,
            )
            self._given_up(Outcome(ctx, "abandon"))
            ctx.abandon()
            self.signal_work()  # its job may never return: the runs waiting behind it (_cycle)

    def timed_out(self, ctx: Context, message: str) -> None:
        # Counted now, as the failure it is: its job may never return, and when it does its
        # result is not reported (the reporter counts it no more).
        self.reporter.timed_out(ctx)
        error = JobTimeout(message)
        self._given_up(Outcome(ctx, "fail", classes=error_classes(error), message=message, reason="Timeout"))
        ctx.abandon()
        self.signal_work()  # its job may never return: the runs waiting behind it (_cycle)

    def _given_up(self, outcome: Outcome) -> None:
        """The run is no longer this worker's to report (failed past its timeout, or reaped)
        while its job may still run, and may never return: what the instrumentation began for
        it (a span) ends now, with ``outcome``."""
        ctx = outcome.ctx
        try:
            instrumentation.current.given_up(ctx, outcome)
        except Exception as exc:  # a hook's fault: not the heartbeat loop's, nor the run's
            log.error(
                "run=%s kind=%s instrumentation failed: %s", ctx.run_id, ctx.kind, describe(exc), exc_info=exc
            )

    def heartbeat_failed(self, exc: Exception) -> None:
        self.events.on_heartbeat_failure()
        log.warning("worker=%s heartbeat failed (runs keep going): %s", self.worker_id, one_line(exc))

    def server_heartbeat_timeout(self, seconds: float) -> None:
        if seconds > 0:
            self.default_heartbeat_timeout = seconds

    def heartbeat_died(self, exc: BaseException) -> None:
        self.fault(RuntimeError(f"the heartbeat loop ended: {describe(exc)}"), exc)

    def fault(self, exc: BaseException, cause: BaseException | None = None) -> None:
        """Another thread of the worker failed in a way it cannot go on from: the claim
        loop stops the worker (see ``run``)."""
        exc.__cause__ = cause
        with self._lock:
            if self._fault is None:
                self._fault = exc
        self.signal_work()

    def heartbeat_interval(self) -> float:
        """The cadence: the configured interval, or a third of the shortest heartbeat timeout held,
        or sooner when a run only this worker can time out reaches its deadline."""
        with self._lock:
            held = list(self._active.values())
            begun = [c for c in held if c.run_id in self._started]
        timeouts = [self._heartbeat_timeout_of(c.run) for c in held]
        shortest = min(timeouts, default=self.default_heartbeat_timeout)
        now = time.monotonic()
        until_deadline = [deadline - now for c in begun if (deadline := self._deadline(c)) is not None]
        return max(0.05, min(self.base_heartbeat_interval, shortest / 3, *until_deadline))

    def _heartbeat_timeout_of(self, run: Mapping[str, Any]) -> float:
        """Seconds the reaper gives a run without a heartbeat: its own, else the server's."""
        return _seconds(run.get("heartbeat_timeout")) or self.default_heartbeat_timeout

    @staticmethod
    def _deadline(ctx: Context) -> float | None:
        """When the worker fails a run as Timeout: only for a timeout the server does not know
        (the kind's, the run having none: the server's reap enforces the run's own), with a grace
        for the job's checkpoint (or the killed child process) to report it first."""
        if ctx.timeout is None or ctx.run.get("timeout") is not None or ctx.abandoned:
            return None
        return ctx.started + ctx.timeout + TIMEOUT_GRACE

    def overdue(self) -> list[Context]:
        """The runs past their kind's timeout, counted from when their job began (a run still
        waiting for a free slot has not begun)."""
        now = time.monotonic()
        with self._lock:
            held = [c for c in self._active.values() if c.run_id in self._started]
        return [
            c
            for c in held
            if (deadline := self._deadline(c)) is not None
            and deadline <= now
            and not self.reporter.is_pending(c.run_id)
        ]

    # -- running ----------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set, then drain within the grace period.

        On an error it cannot go on from, set ``stop``, hand back what it holds (failed
        at once when not started, after the grace period when running) and raise it."""
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
                if self._fault is not None:
                    raise self._fault
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    full = self._cycle(conn)
                    failures = 0
                except DB_ERRORS as exc:
                    if refused(exc):  # its own arguments (queues, worker id): retrying cannot help
                        raise
                    failures += 1
                    log.warning("worker=%s database error (retrying): %s", self.worker_id, one_line(exc))
                    if conn is not None:
                        conn.close()
                    conn = None
                    self._claimed_full = False  # ask jobs.next_due again
                    stop.wait(min(0.2 * 2**failures, 5.0))
                    continue
                if full:
                    continue  # a full batch (there may be more due right now), or a cycle to redo
                self._sleep(stop)
            self._join_claimers()
            conn = self._drain(conn)
            if self._fault is not None:  # while draining
                raise self._fault
        except BaseException as exc:
            conn = self._give_up(conn, exc, stop)
            raise
        finally:
            self._join_claimers()
            self._heartbeat.stop()
            self._stop_runners()
            for _ in self._threads:
                self._tasks.put(None)
            with self._lock:
                self._sending_closed = True
            self._completer.submit(self._close_done_conn)
            self._completer.shutdown(wait=True)
            try:
                self._settle_completions(wait=True)
            except Exception as error:
                log.error("worker=%s completions not settled: %s", self.worker_id, describe(error))
            if conn is not None:
                try:
                    calls.worker_stopped(conn, self.worker_id)
                except DB_ERRORS:
                    pass  # it shows as lost instead of stopped
                conn.close()
            log.info("worker=%s stopped", self.worker_id)

    def _sleep(self, stop: threading.Event) -> None:
        """Wait for work: the next due run's instant, a work signal, or the poll interval."""
        give_up = time.monotonic() + self.poll_interval
        while not stop.is_set():
            now = time.monotonic()
            with self._lock:
                until = give_up if self._due_at is None else min(give_up, self._due_at)
            if now >= until:
                break
            # In slices: the caller's stop event cannot wake this wait, so a stop is seen
            # within STOP_CHECK seconds even when the next due run is far away.
            self._wake.wait(min(until - now, STOP_CHECK))
            with self._lock:
                self._wake.clear()
                if self._work_signalled:
                    self._work_signalled = False
                    break
            # Only the timer was re-armed, or completions came back: settle those, and
            # sleep again until the (sooner) instant.
            self._settle_completions()
        with self._lock:
            self._due_at = None  # the next cycle learns it again

    def signal_work(self) -> None:
        """Wake the claim loop now (a finished job to report, or a run due now)."""
        with self._lock:
            self._work_signalled = True
            self._signals += 1
        self._wake.set()

    def rearm(self, epoch: float) -> None:
        """A run becomes due at ``epoch`` (server clock): wake for it unless woken sooner anyway."""
        delay = epoch - (time.time() + self._db_offset)
        if delay <= 0.001:
            self.signal_work()
            return
        at = time.monotonic() + delay
        with self._lock:
            if self._due_at is not None and self._due_at <= at:
                return
            self._due_at = at
        self._wake.set()

    def _learn_next_due(self, row: Any, sent: float, sent_mono: float) -> None:
        """Arm the timer from jobs.next_due's answer (its instant and the server clock).

        ``sent`` and ``sent_mono`` are this clock and the monotonic one just before the
        question was sent. The server read its clock after that and before the answer came
        back, which may be much later: the claim sent behind the question (and its commit)
        is answered first. Measured from the sending, the timer fires at most the question's
        way to the server early, where measured from the answer it fired as late as that
        claim took; an early claim finds nothing due and learns the instant again."""
        if row is None:
            return
        next_at, db_now = row["next_at"], row["db_now"]
        if not isinstance(db_now, datetime):
            return
        if not isinstance(next_at, datetime):
            next_at = None  # unreadable: the poll interval is the safety net
        self._db_offset = db_now.timestamp() - sent
        with self._lock:
            if next_at is not None:
                # A millisecond past the instant: the claim's now() must have reached it.
                learned = sent_mono + (next_at - db_now).total_seconds() + 0.001
                # A NOTIFY may have re-armed the timer for a run committed after this answer
                # was computed: keep the sooner of the two.
                self._due_at = learned if self._due_at is None else min(self._due_at, learned)

    def _give_up(
        self, conn: psycopg.Connection[Any] | None, exc: BaseException, stop: threading.Event
    ) -> psycopg.Connection[Any] | None:
        """The worker cannot go on: stop, fail the held runs not started at once, give the
        running ones the grace period, then fail what is left (not left to the reaper)."""
        why = storable(f"the worker stopped on an internal error: {describe(exc)}", MAX_REFUSAL)
        log.error("worker=%s %s", self.worker_id, why, exc_info=exc)
        stop.set()
        self._join_claimers()  # what their claims in flight took is held before it is counted
        with self._lock:  # the lock an executor takes to begin a run: none begins after this
            waiting = [c for c in self._active.values() if c.run_id not in self._started]
            idle = {c.run_id for c in waiting} | set(self._dispatching)
            for ctx in waiting:
                ctx.abandon()  # an executor that takes it now only reports it abandoned
        conn = self._fail_runs(conn, idle, why)
        try:
            conn = self._drain(conn)
        except Exception as error:
            log.error("worker=%s cannot report while stopping: %s", self.worker_id, describe(error))
        try:
            self._settle_completions(wait=True)
        except Exception as error:
            log.error("worker=%s completions not settled while stopping: %s", self.worker_id, describe(error))
        left = self.held()
        for ctx in left.values():
            ctx.abandon()
        return self._fail_runs(conn, set(left), why)

    def _claim_lost(self) -> None:
        """A claim failed without an answer: it may have committed all the same (the
        connection broke after the commit), and its runs are then RUNNING for this worker,
        which does not know them. The claim loop hands them back on its next cycle (woken
        for it, when an extra claimer's claim failed)."""
        with self._lock:
            self._claim_unsure = True
            self._work_signalled = True
        self._wake.set()

    def _hand_back_unheld(self, conn: psycopg.Connection[Any]) -> None:
        """After a claim that failed without an answer, put back in the queue (same attempt,
        same scheduled_for, at once) the runs RUNNING for this worker and its claim token that
        it does not hold (``jobs.hand_back_unheld``): what that claim took, if it committed.
        Only while no other claim of this worker is in flight (the extra claimers start none
        meanwhile), so every run a claim returned is held by then; the server waits for a
        claim still in progress on the lost connection. Until it has succeeded, it is tried
        again each cycle; the runs are fenced to this worker meanwhile."""
        with self._lock:
            if not self._claim_unsure or self._reserved:
                return
            holding = self._active.keys() | self._dispatching
            # The most recent runs let go, as many as one call takes beside those held.
            room = max(MAX_CALL_IDS - len(holding), 0)
            left = [run_id for run_id in self._left if run_id not in holding]
            held = sorted(holding | set(left[len(left) - room :] if room else []))
        if len(held) > MAX_CALL_IDS:  # more than one call can name: the reaper ends what it took
            log.warning("worker=%s holds %d runs: what a lost claim took is left to the reaper",
                        self.worker_id, len(held))  # fmt: skip
            with self._room:
                self._claim_unsure = False
                self._room.notify_all()
            return
        try:
            back = calls.hand_back_unheld(conn, held, self.worker_id, self.claim_token)
        except psycopg.errors.LockNotAvailable as exc:  # the lost claim is still in progress
            log.warning("worker=%s runs of a lost claim not handed back yet (trying again): %s",
                        self.worker_id, describe(exc))  # fmt: skip
            return
        with self._room:
            self._claim_unsure = False
            self._room.notify_all()
        if back:
            log.warning(
                "worker=%s handed back runs=%s: claimed by a claim whose answer was lost, never started",
                self.worker_id,
                ",".join(f"{run_id}" if status == "QUEUED" else f"{run_id}({status})"
                         for run_id, status in sorted(back.items())),
            )  # fmt: skip

    def _hand_back(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
        """A stopping worker puts the runs it holds but has not begun (claimed ahead, waiting
        for a slot) back in the queue at once, as the claim found them (``jobs.unclaim``: same
        attempt, same ``scheduled_for``, so each keeps its place in the claim order and its
        lateness): no attempt is spent and no cap held for work that never started. Each is
        marked abandoned first, under the lock the executors take to begin a run, so none
        begins after it was handed back. One the server refuses stays with the reaper."""
        conn, _, handed = self._unclaim_waiting(conn)
        if handed:
            log.info("worker=%s stopping: handed back runs=%s (not begun)", self.worker_id,
                     ",".join(map(str, handed)))  # fmt: skip
        return conn

    def _hand_back_stranded(self, conn: psycopg.Connection[Any]) -> None:
        """While every job thread is taken by a job already let go that does not return (see
        ``_threads_hung``), the runs claimed ahead and waiting for a thread go back to the
        queue as ``_hand_back`` puts them, for another worker to run; this one claims nothing
        until a thread comes back (``_free_slots``)."""
        with self._lock:
            hung = self._threads_hung()
        if hung != self._hung_said:  # said once when it starts and once when it ends
            self._hung_said = hung
            if hung:
                log.warning(
                    "worker=%s every job thread (%d) is held by jobs let go (past their timeout, or"
                    " reaped) whose code has not returned: claiming nothing until one returns"
                    ' (isolation="process" stops such code)',
                    self.worker_id,
                    self.concurrency,
                )
            else:
                log.info("worker=%s a job thread has returned: claiming again", self.worker_id)
        if not hung:
            return
        # Those asked to cancel while they waited are cancelled here, as a thread taking them
        # would: no thread will (marked as begun, so one that comes back passes them over).
        with self._lock:
            cancelled = [
                c
                for c in self._active.values()
                if c.run_id not in self._started and c.cancel_requested and not c.abandoned
            ]
            self._started.update(c.run_id for c in cancelled)
        for ctx in cancelled:
            self._finished(Outcome(ctx, "cancel"))
        _, waiting, handed = self._unclaim_waiting(conn)
        if not waiting:
            return
        log.warning(
            "worker=%s handed back runs=%s (not begun): no job thread is free to run them",
            self.worker_id,
            ",".join(map(str, handed)) or "-",
        )
        kept = sorted(set(waiting) - set(handed))
        if kept:  # asked to cancel, fenced, or the call failed: no thread will take them
            log.warning("worker=%s runs=%s not begun left to the reaper", self.worker_id,
                        ",".join(map(str, kept)))  # fmt: skip
            self._leave(kept)
            with self._lock:
                for run_id in kept:
                    self._active.pop(run_id, None)

    def _unclaim_waiting(
        self, conn: psycopg.Connection[Any] | None
    ) -> tuple[psycopg.Connection[Any] | None, list[int], list[int]]:
        """Put the held runs that have not begun back in the queue (``jobs.unclaim``), each
        marked abandoned first under the lock the executors take to begin a run (an executor
        that takes one later lets it be); the ids tried and those handed back. One the server
        refuses (fenced) or that the call could not reach stays held.

        An executor that takes one from its queue while the call is out lets it be too: one
        handed back is counted and logged as that alone (by the caller), and one that stays
        held is reported abandoned here, as the executor would have, never both."""
        with self._lock:
            waiting = [
                c
                for c in self._active.values()
                if c.run_id not in self._started and not c.cancel_requested and not c.abandoned
            ]
            for ctx in waiting:
                ctx.abandon()
                self._handing_back[ctx.run_id] = False
        if not waiting:
            return conn, [], []
        handed: list[int] = []
        taken: list[Context] = []
        try:
            if conn is None or conn.closed:
                conn = self._connect()
            for part in chunks(sorted(c.run_id for c in waiting)):
                handed += calls.unclaim(conn, part, self.worker_id, self.claim_token)
        except DB_ERRORS as exc:
            log.warning("worker=%s cannot hand back runs that did not begin (the reaper will): %s",
                        self.worker_id, exc)  # fmt: skip
        finally:
            with self._lock:
                for run_id in handed:
                    self._active.pop(run_id, None)
                back = set(handed)
                for ctx in waiting:
                    if self._handing_back.pop(ctx.run_id, False) and ctx.run_id not in back:
                        taken.append(ctx)
        for ctx in taken:  # held still, and its executor let it be: reported as it would have
            self._finished(Outcome(ctx, "abandon"))
        return conn, [c.run_id for c in waiting], handed

    def _fail_runs(
        self, conn: psycopg.Connection[Any] | None, run_ids: set[int], why: str
    ) -> psycopg.Connection[Any] | None:
        """Fail these runs of this worker (fenced) and let them go."""
        if not run_ids:
            return conn
        failed: set[int] = set()
        try:
            if conn is None or conn.closed:
                conn = self._connect()
            for run_id in sorted(run_ids):
                calls.fail(conn, run_id, self.worker_id, None, why, "Error", self.claim_token)
                failed.add(run_id)
        except DB_ERRORS as exc:
            log.warning(
                "worker=%s cannot fail runs=%s (the reaper will): %s",
                self.worker_id,
                ",".join(map(str, sorted(run_ids - failed))),
                exc,
            )
        self._leave(run_ids - failed)  # may still be RUNNING for this worker: never handed back
        with self._lock:
            for run_id in run_ids:
                self._active.pop(run_id, None)
                self._started.discard(run_id)
                self._done_held.discard(run_id)
        return conn

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        conn = connect_dicts(self.dsn, application_name=f"pgtick-worker {self.worker_id}")
        read_tolerantly(conn)
        calls.register_worker(
            conn, self.worker_id, self.kinds, socket.gethostname(), os.getpid(), self.queues
        )
        timeout = calls.default_heartbeat_timeout(conn)
        if isinstance(timeout, timedelta):
            self.default_heartbeat_timeout = timeout.total_seconds()
        elif timeout is not None:
            log.warning("worker=%s jobs.config.heartbeat_timeout cannot be read: %s", self.worker_id, timeout)
        return conn

    def _start_threads(self, stop: threading.Event) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._execute_loop, name=f"pgtick-job-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._heartbeat.start()
        if self.event_loop is not None:
            self.event_loop.start()
        if self.listen:
            threading.Thread(target=self._listen, args=(stop,), name="pgtick-listen", daemon=True).start()
        for i in range(1, self.claimers):
            name = f"pgtick-claim-{i}"
            t = threading.Thread(target=self._claim_more, args=(stop, i), name=name, daemon=True)
            t.start()
            self._claim_threads.append(t)

    def _listen(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with connect(self.dsn, application_name=f"pgtick-listen {self.worker_id}") as conn:
                    if behind_pooler(conn):  # a transaction pooler delivers no notifications
                        log.info(
                            "worker=%s behind a pooler: polling every %.2fs",
                            self.worker_id,
                            self.poll_interval,
                        )
                        return
                    calls.listen(conn)
                    # A run queued before the LISTEN took (the worker's start, a reconnect)
                    # notified no one here: claim once more now, not at the next poll.
                    self.signal_work()
                    while not stop.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            self._notified(note.payload)
            except DB_ERRORS as exc:
                if stop.is_set():  # the worker is stopping: its server may be stopping with it
                    return
                log.warning("worker=%s listener lost (polling meanwhile): %s", self.worker_id, one_line(exc))
                stop.wait(1.0)
            except Exception as exc:
                log.error(
                    "worker=%s listener failed: polling every %.2fs from now on: %s",
                    self.worker_id,
                    self.poll_interval,
                    describe(exc),
                    exc_info=exc,
                )
                return

    def _notified(self, payload: str) -> None:
        try:
            epoch = float(payload) if payload else None
        except ValueError:
            epoch = None
        if epoch is None or not math.isfinite(epoch):
            self.signal_work()
        else:
            self.rearm(epoch)

    def _cycle(self, conn: psycopg.Connection[Any], *, claim: bool = True) -> bool:
        """Report finished runs and claim for the free slots.

        Plain completions (no result) go to the completer as the runs finish (see
        ``_send_completions``); the cycle settles the answered ones and sends any left
        behind. While claims come back full, the cycle only claims;
        otherwise it asks jobs.next_due just before the claim (one pipeline, each its
        own transaction), so a run that falls due in between is either claimed or
        reported as due (a cycle at once), never missed. Returns True to cycle again at
        once: the claim came back full (there may be more due), it came back short
        without jobs.next_due having been asked, or it came back empty while a completion
        committed (the room it made may not have been seen). Draining calls it with
        ``claim=False``.
        """
        self._settle_completions()
        self.reporter.report(conn)
        self._send_completions()
        self._hand_back_unheld(conn)
        if claim:
            self._hand_back_stranded(conn)
        with self._lock:
            want = min(self._free_slots(), self.batch_size) if claim else 0
            self._reserved += max(want, 0)
            signals = self._signals
        if want <= 0:
            return False
        try:
            began, sent = time.monotonic(), time.time()
            ask_due = not self._claimed_full
            with self._lock:
                answered_before = self._completions_answered
            try:
                with conn.pipeline():
                    due_cur = conn.execute(calls.NEXT_DUE, (self.kinds, self.queues)) if ask_due else None
                    claim_cur = conn.execute(
                        calls.CLAIM, (want, self.worker_id, self.kinds, self.queues, self.claim_token)
                    )
                if due_cur is not None:
                    self._learn_next_due(due_cur.fetchone(), sent, began)
                rows = claim_cur.fetchall()
            except DB_ERRORS:
                self._claim_lost()
                raise
            with self._lock:
                self._claimed_none = not rows
                # A completion answered while this claim was in flight may have committed
                # after the claim's snapshot: the room it made was not seen. Claim again.
                missed_room = not rows and self._completions_answered != answered_before
            full = self._take(conn, rows, want, began)
        finally:
            with self._lock:
                self._reserved -= want
        self._claimed_full = full
        if not full:  # every run signalled before it was sent was due for it to see
            with self._lock:
                self._signals_looked = max(self._signals_looked, signals)
        self._found_backlog(full)
        return full or missed_room or not ask_due

    def _take(
        self, conn: psycopg.Connection[Any], rows: list[dict[str, Any]], want: int, began: float
    ) -> bool:
        """Hold and start a claimed batch; True if it came back full."""
        with self._lock:
            self._dispatching.update(r["id"] for r in rows)
        capped, limited = self._name_definitions(conn, rows)
        if rows:
            with self._lock:
                lifted = self._under_caps and not capped
                self._under_caps = capped
                self._under_limits = limited
                if lifted:
                    self._caps_lifted.notify_all()
        with self._dispatch_lock:
            return self._dispatch(rows, want, began)

    def _found_backlog(self, full: bool) -> None:
        """A claim came back full (more is due now) or short. A full one wakes one extra
        claimer, whose full claim wakes the next: claims in flight grow while they keep
        coming back full, and a claim held back by a cap or a limit sends no crowd after it."""
        if self.claimers > 1:
            with self._room:
                self._backlog = full
                if full:
                    self._room.notify()

    def _claim_more(self, stop: threading.Event, index: int) -> None:
        """An extra claimer: while claims come back full, claim a batch whenever a batch's
        worth of slots is free, on a connection of its own. Idle, it waits: the claim loop
        alone polls, follows jobs.next_due and reports outcomes. While the batches claimed
        hold runs of capped definitions or under tight limits, only the first
        CAPPED_CLAIMERS - 1 claim."""
        conn: psycopg.Connection[Any] | None = None
        failures = 0
        try:
            while True:
                with self._room:
                    while not (stop.is_set() or self._fault is not None):
                        if self._under_caps and index >= CAPPED_CLAIMERS:
                            self._caps_lifted.wait(STOP_CHECK)
                        elif (
                            self._backlog
                            and self._free_slots() >= self.batch_size
                            and not self._claim_unsure  # the claim loop hands back a lost claim's runs first
                        ):
                            break
                        else:
                            self._room.wait(STOP_CHECK)
                    if stop.is_set() or self._fault is not None:
                        return
                    want = self.batch_size
                    self._reserved += want
                full = False
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    began = time.monotonic()
                    try:
                        rows = conn.execute(
                            calls.CLAIM, (want, self.worker_id, self.kinds, self.queues, self.claim_token)
                        ).fetchall()
                    except DB_ERRORS:
                        self._claim_lost()
                        raise
                    full = self._take(conn, rows, want, began)
                    failures = 0
                except DB_ERRORS as exc:
                    if refused(exc):
                        self.fault(exc)
                        return
                    failures += 1
                    log.warning("worker=%s extra claim failed (retrying): %s", self.worker_id, one_line(exc))
                    if conn is not None:
                        conn.close()
                    conn = None
                    stop.wait(min(0.2 * 2**failures, 5.0))
                finally:
                    with self._lock:
                        self._reserved -= want
                self._found_backlog(full)
        except BaseException as exc:
            self.fault(RuntimeError(f"an extra claimer failed: {describe(exc)}"), exc)
        finally:
            if conn is not None:
                conn.close()

    def _free_slots(self) -> int:
        """Slots neither held by a run whose job code is still going nor promised to a
        claim in flight (under _lock). A finished run frees its slot while its outcome waits
        to be reported, but only up to ``max_unreported`` such runs: past that, each frees its
        slot once reported, so a worker whose reports cannot get through (a completion waiting
        on a lock, a slow trigger) stops claiming instead of taking the whole queue. It holds
        at most ``capacity + max_unreported`` runs."""
        if self._threads_hung():
            return 0  # what it claimed would wait for a thread that may never come back
        finished = min(len(self._done_held), self.max_unreported)
        return self.capacity - len(self._active) + finished - self._reserved

    def _threads_hung(self) -> bool:
        """Every job thread is taken by a run already let go (failed past its kind's timeout,
        or reaped) whose job code has not returned: a job stuck where no checkpoint is reached.
        Runs waiting for a thread would wait until one does (under _lock)."""
        if len(self._started) - len(self._done_held) < self.concurrency:
            return False
        hung = 0
        for run_id in self._started:
            ctx = self._active.get(run_id)
            if (
                ctx is not None
                and ctx.abandoned
                and run_id not in self._done_held
                and not (ctx.spec.is_async and self.event_loop is not None)
            ):
                hung += 1
        return hung >= self.concurrency

    def _join_claimers(self) -> None:
        """Wait for the extra claimers to stop (the stop event is set): a claim in flight
        is let finish, so what it claimed is held and drained like the rest."""
        for t in self._claim_threads:
            t.join(timeout=30)
            if t.is_alive():
                log.warning("worker=%s %s did not stop", self.worker_id, t.name)
        self._claim_threads = []

    def _send_completions(self) -> None:
        """Send the plain completions waiting to the completer in one ``jobs.complete_many``
        call, unless a call is in flight: its answer sends those that finished meanwhile. A
        run counts against its caps and limits until its completion commits, so they go as
        the runs finish, not with the claim loop's next cycle (which waits for its claim)."""
        with self._lock:
            if self._sending or self._sending_closed:
                return
            plain = self.reporter.take_plain()
            if not plain:
                return
            self._sending = True
            done = self._completer.submit(self._complete_many, [o.ctx.run_id for o in plain])
            self._completing.append((plain, done))
        done.add_done_callback(self._completion_answered)

    def _completion_answered(self, done: Future[set[int]]) -> None:
        """In the completer thread: send the completions that finished meanwhile (after a
        failed call, the claim loop's cycle does, once it has settled it), and wake the
        claim loop, if it sleeps, to settle the answer; after a claim that took nothing,
        also to claim again: the runs just completed may be what held the others back (a
        cap or limit counts a run until its completion commits, and nothing else would
        wake the worker before its next poll)."""
        with self._lock:
            self._sending = False
            self._completions_answered += 1
            # Or the finished runs waiting to be reported were what kept the claim loop from
            # claiming (_free_slots): settled, their slots are free.
            claim_again = self._claimed_none or len(self._done_held) >= self.concurrency
        if not done.cancelled() and done.exception() is None:
            self._send_completions()
        if claim_again:
            self.signal_work()
        else:
            self._wake.set()

    def _settle_completions(self, *, wait: bool = False) -> None:
        """Settle the completions the completer has answered (with ``wait``, all of them),
        in the order they were sent; on a database error they are kept for the next cycle."""
        while True:
            with self._lock:
                if not self._completing or not (wait or self._completing[0][1].done()):
                    return
                plain, done = self._completing.pop(0)
            self._settle_plain(plain, done)

    def _complete_many(self, run_ids: list[int]) -> set[int]:
        """In the completer thread: complete these runs (MAX_CALL_IDS a call); the ids that were
        still ours. Should one call fail, all are sent again: a repeat is answered as done."""
        done: set[int] = set()
        try:
            if self._done_conn is None or self._done_conn.closed:
                self._done_conn = connect_dicts(
                    self.dsn, application_name=f"pgtick-complete {self.worker_id}"
                )
            for part in chunks(run_ids):
                rows = self._done_conn.execute(
                    calls.COMPLETE_MANY, (part, self.worker_id, self.claim_token)
                ).fetchall()
                done.update(row["run_id"] for row in rows)
        except BaseException:
            self._close_done_conn()
            raise
        return done

    def _close_done_conn(self) -> None:
        if self._done_conn is not None:
            self._done_conn.close()
            self._done_conn = None

    def _settle_plain(self, plain: list[Outcome], done: Future[set[int]]) -> None:
        """Settle the completions the completer sent; on a database error keep them for the next cycle."""
        try:
            applied = done.result()
        except DB_ERRORS as exc:
            if refused(exc):  # by one of the runs (an operator's trigger, a constraint)
                log.warning("worker=%s completing runs=%s refused (each is reported alone): %s",
                            self.worker_id, ",".join(str(o.ctx.run_id) for o in plain),
                            refusal_text(exc))  # fmt: skip
                self.reporter.requeue_alone(plain)
                self.signal_work()
                return
            log.warning("worker=%s completing runs failed (retrying): %s", self.worker_id, one_line(exc))
            self.reporter.requeue(plain)
            return
        except BaseException:
            self.reporter.requeue(plain)
            raise
        for o in plain:
            self.reporter.settle(o, o.ctx.run_id in applied)

    def _name_definitions(
        self, conn: psycopg.Connection[Any], rows: list[dict[str, Any]]
    ) -> tuple[bool, bool]:
        """Put each claimed run's definition name in its row (for the outcome log line).
        Returns whether a run is of a capped definition or under a tight limit, and whether
        one is of a capped definition or under any limit. What a definition is gets looked up
        when first met, the limits at the first batch, and both again once
        DEFINITION_FACTS_TTL has passed (a cap or a limit may have changed)."""
        if time.monotonic() - self._facts_read > DEFINITION_FACTS_TTL:
            self._names, self._capped, self._limits = {}, set(), None
            self._facts_read = time.monotonic()
        if self._limits is None and rows:
            try:
                self._limits = calls.limits(conn)
            except DB_ERRORS as exc:  # read again after DEFINITION_FACTS_TTL
                log.warning("worker=%s limits not read: %s", self.worker_id, one_line(exc))
                self._limits = {}
        limits = self._limits or {}
        names, capped = self._names, self._capped
        unknown = sorted({r["definition_id"] for r in rows if r["definition_id"]} - set(names))
        if unknown:
            try:
                facts = calls.definition_facts(conn, unknown)
            except DB_ERRORS as exc:  # the claim has committed: run the batch without the names
                log.warning("worker=%s definitions not read: %s", self.worker_id, one_line(exc))
                facts = {}
            for definition_id, (name, is_capped) in facts.items():
                names[definition_id] = name
                if is_capped:
                    capped.add(definition_id)
        tight = limited = False
        for r in rows:
            r["definition"] = names.get(r["definition_id"]) if r["definition_id"] else None
            in_capped = r["definition_id"] in capped
            queue, kind = limits.get(("queue", r["queue"])), limits.get(("kind", r["kind"]))
            tight = tight or in_capped or bool(queue) or bool(kind)
            limited = limited or in_capped or queue is not None or kind is not None
        return tight, limited

    def _dispatch(self, rows: list[dict[str, Any]], want: int, began: float) -> bool:
        """Start the claimed runs; True if the batch came back full. A run with a value the
        driver cannot read fails alone."""
        contexts = []
        for run in rows:
            spec = self.app.jobs[run["kind"]]
            timeout = _seconds(run["timeout"]) or spec.timeout
            ctx = Context(run, spec, self.worker_id, timeout)
            # The claim stamped its heartbeat after ``began``: ours at least that long.
            ctx.owned(began, self._heartbeat_timeout_of(run))
            if run["timeout"] is not None:  # the server's: from started_at, which is after ``began``
                ctx.timeout_from = began
            contexts.append(ctx)
        with self._lock:
            for ctx in contexts:
                self._active[ctx.run_id] = ctx
            self._dispatching.difference_update(ctx.run_id for ctx in contexts)
        unreadable = {}
        if Unreadable.made != self._unreadable_seen:  # the batch was read after it moved
            self._unreadable_seen = Unreadable.made
            for ctx in contexts:
                bad = [f"{column}: {v.why}" for column, v in ctx.run.items() if isinstance(v, Unreadable)]
                if bad:
                    unreadable[ctx.run_id] = f"the driver cannot read this run's {'; '.join(bad)}"
        self.events.on_claim([r["kind"] for r in rows], time.monotonic() - began)
        instrumentation.current.claimed(self.worker_id, rows, time.monotonic() - began)
        if not rows:
            return False
        for r in rows:
            if isinstance(r["started_at"], datetime) and isinstance(r["scheduled_for"], datetime):
                late = (r["started_at"] - r["scheduled_for"]).total_seconds()
                self.events.on_started(r["kind"], r["definition_id"], late)
        if unreadable:
            for ctx in contexts:
                if ctx.run_id in unreadable:
                    log.warning("run=%s kind=%s %s", ctx.run_id, ctx.kind, unreadable[ctx.run_id])
                    self._finished(failure(ctx, storable(unreadable[ctx.run_id], MAX_REFUSAL)))
            contexts = [c for c in contexts if c.run_id not in unreadable]
            if not contexts:
                return len(rows) == want
        # The claim stamped heartbeat_at; only a run whose heartbeat timeout is shorter than
        # the wait in progress (timeouts/3) needs the heartbeat loop woken to re-plan.
        shortest = min(self._heartbeat_timeout_of(c.run) for c in contexts)
        if shortest / 3 < self._heartbeat.waiting:
            self._heartbeat.now.set()
        tasks = []
        for ctx in contexts:
            log.debug("run=%s kind=%s worker=%s started", ctx.run_id, ctx.kind, self.worker_id)
            if ctx.spec.is_async and self.event_loop is not None:
                tasks.append(ctx)
                with self._lock:
                    self._started.add(ctx.run_id)
            else:
                self._tasks.put(ctx)
        if tasks and self.event_loop is not None:
            self.event_loop.submit_many(tasks, self._finished)
        return len(rows) == want

    def _execute_loop(self) -> None:
        while True:
            ctx = self._tasks.get()
            if ctx is None:
                return
            with self._lock:  # decided under the lock a stopping worker takes to hand runs back
                if ctx.run_id in self._handing_back:  # its hand back, in flight, decides (_unclaim_waiting)
                    self._handing_back[ctx.run_id] = True
                    continue
                handed_back = ctx.run_id not in self._active
                taken = ctx.run_id in self._started  # cancelled while every thread hung
                waited_out = ctx.abandoned or ctx.cancel_requested  # while it waited for a slot
                if not waited_out:
                    self._started.add(ctx.run_id)
                    ctx.started = time.monotonic()
                    if ctx.run.get("timeout") is None:  # a kind's timeout counts from here
                        ctx.timeout_from = ctx.started
            if taken or (handed_back and waited_out):
                continue  # handed back (_hand_back), or its cancellation sent (_hand_back_stranded)
            if waited_out:
                self._finished(Outcome(ctx, "abandon") if ctx.abandoned else Outcome(ctx, "cancel"))
                continue
            try:
                outcome = execute(ctx, self.processes)
            except BaseException as exc:  # around the job code (a hook): the run fails, the thread goes on
                log.error("run=%s kind=%s could not be run", ctx.run_id, ctx.kind, exc_info=exc)
                outcome = failure(ctx, "the worker could not run the job", exc)
            self._finished(outcome)

    def _finished(self, outcome: Outcome) -> None:
        with self._room:
            self._done_held.add(outcome.ctx.run_id)  # its slot is free (see _free_slots)
            self._room.notify()
        self.reporter.add(outcome)
        if outcome.plain:
            self._send_completions()
            if not self._slot_wanted():
                return  # the completer reports it; its answer wakes the claim loop to settle it
        self.signal_work()

    def _slot_wanted(self) -> bool:
        """Whether the slot a finished run frees is worth a claim now: the last claim came back
        full (more is due), a signal came after the last claim that came back short was sent (a
        run queued while no slot was free, say), or the last batch held runs of capped
        definitions or under limits, roomy ones included (a short claim may have been held back
        by one, and the completion makes room under it). Otherwise that claim found every run
        there was to start, and a run queued since signals on its own: a worker whose runs
        trickle in claims once per run, not again for each slot that frees."""
        with self._lock:
            return (
                self._claimed_full
                or self._signals != self._signals_looked
                or self._under_caps
                or self._under_limits
            )

    def _stop_runners(self) -> None:
        """Stop the event loop and this worker's job processes (runs left go to the reaper)."""
        if self.event_loop is not None:
            self.event_loop.stop()
        self.processes.close()

    def hurry(self) -> None:
        """End the drain now, the grace period or not (a second stop signal): what still runs
        is left to the reaper, as when the grace runs out, and the job processes are killed."""
        self._hurry.set()
        self._wake.set()

    def _left_to_reaper(self, ctx: Context) -> None:
        self._leave([ctx.run_id])

    def _leave(self, run_ids: Iterable[int]) -> None:
        """Remember runs let go with no outcome recorded (the most recent MAX_LEFT): their job
        began and they may still be RUNNING for this worker, so no hand back may queue them."""
        with self._lock:
            for run_id in run_ids:
                self._left[run_id] = None
            while len(self._left) > MAX_LEFT:
                del self._left[next(iter(self._left))]

    def _release(self, ctx: Context) -> None:
        with self._room:
            self._active.pop(ctx.run_id, None)
            self._started.discard(ctx.run_id)
            self._done_held.discard(ctx.run_id)
            self._room.notify_all()  # a slot may be free now (see _free_slots)

    def _drain(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
        """Claim nothing more; hand back the runs whose job has not begun; report what
        finishes within the grace period."""
        try:
            if self._claim_unsure:
                if conn is None or conn.closed:
                    conn = self._connect()
                self._hand_back_unheld(conn)
        except DB_ERRORS as exc:
            log.warning("worker=%s cannot hand back what a lost claim took (the reaper will): %s",
                        self.worker_id, exc)  # fmt: skip
        conn = self._hand_back(conn)
        deadline = time.monotonic() + self.shutdown_grace
        log.info(
            "worker=%s stopping: %s in flight, grace %.0fs",
            self.worker_id,
            counted(len(self.held()), "run"),
            self.shutdown_grace,
        )
        while time.monotonic() < deadline and not self._hurry.is_set():
            with self._lock:
                if not self._active:
                    break
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                self._cycle(conn, claim=False)
            except DB_ERRORS as exc:
                log.warning("worker=%s database error while draining: %s", self.worker_id, one_line(exc))
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.5)
            self._wake.wait(0.05)
            self._wake.clear()
        with self._lock:
            self._sending_closed = True  # nothing more goes out: what is held now stays held
        self._settle_completions(wait=True)  # sent before the grace ran out: their answers
        left = self.held()
        if left:
            log.warning(
                "worker=%s %s; leaving runs=%s to the reaper",
                self.worker_id,
                "told to stop now" if self._hurry.is_set() else "grace over",
                ",".join(map(str, sorted(left))),
            )
        return conn
