"""Async jobs: one event loop per worker process, on a thread of its own.

The claim loop hands every claimed run of an ``async def`` kind to ``EventLoop.start``;
the run becomes a task on the loop, and its outcome goes to the same ``done`` callback
the executor threads use (the reporter), so heartbeats, fencing and reporting are the
thread jobs' own. No executor thread is held while an async job runs: the worker's
``concurrency`` bounds thread and async jobs together, because it claims only as many
runs as it has free slots.

Stopping an async job:

* ``await ctx.checkpoint()`` checks for cancellation, the timeout and lost ownership
  like a thread job's checkpoint (compensation runs there, on the loop thread) and
  yields to the loop once;
* besides, cancellation (from the heartbeat), lost ownership and the timeout cancel the
  job's task, so an ``await`` anywhere in the job raises ``asyncio.CancelledError``;
  the run then ends CANCELLED (after compensation, run on a thread so the loop goes on),
  abandoned, or failed with reason ``Timeout``. So does ownership in doubt: once no
  heartbeat has confirmed the run within its heartbeat timeout (the worker cut off from
  the database), a reaper may have failed it and its retry may be running; a job that
  reaches a checkpoint within ``CHECKPOINT_GRACE`` waits there (and goes on if a heartbeat
  confirms the run), any other has its task cancelled, and nothing is reported. Code that
  blocks the loop without awaiting cannot be interrupted this way: use a thread job or
  ``isolation="process"``. It holds up the loop's other jobs (not heartbeats, which have a
  thread of their own); a watchdog thread logs a warning naming its run once the loop has
  run nothing else for ``LOOP_BLOCKED_AFTER``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pgtick import instrumentation
from pgtick.app import CONFIRM_POLL, Context
from pgtick.errors import JobTimeout
from pgtick.execution import Outcome, describe, failure, outcome_of

log = logging.getLogger("pgtick.worker")

#: How long past the instant its run's ownership falls in doubt an async job has to reach a
#: checkpoint (which waits there for a heartbeat to confirm the run) before its task is
#: cancelled (seconds).
CHECKPOINT_GRACE = 0.25

#: How long the worker's event loop may run nothing (one callback holding it: an async job
#: that calls ``time.sleep``, blocking I/O or long CPU work without awaiting) before the worker
#: says which run blocks it (seconds).
LOOP_BLOCKED_AFTER = 5.0

#: How long a job whose task was cancelled (its cancel, timeout or loss) may go on before the
#: worker says that it ignored the cancellation and still holds a slot (seconds).
IGNORED_CANCEL_AFTER = 5.0


class EventLoop:
    """An asyncio loop running forever on its own thread, until ``stop``."""

    def __init__(self, name: str = "pgtick-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopping = threading.Event()  # set by ``stop``: any other stop of the loop is a job's
        # The run of each job's task (which this also keeps referenced while it runs).
        self._contexts: dict[asyncio.Task[Outcome], Context] = {}
        self._last_turn = time.monotonic()  # when the loop last ran the watchdog's callback
        self._job_watch = JobWatch()  # the jobs' timeouts and ownership, on one timer

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()
        threading.Thread(target=self._watch, name=f"{self._thread.name}-watch", daemon=True).start()

    def _turned(self) -> None:
        self._last_turn = time.monotonic()

    def _watch(self, every: float = 1.0) -> None:
        """Heartbeats run on a thread of their own, so a job that blocks the loop does not stop
        them; but the loop's other jobs wait meanwhile, and no cancel or timeout interrupts
        them. Say so, once a blockage, naming the run whose task holds the loop."""
        said = False
        while not self._stopping.wait(every):
            if self.loop.is_closed():
                return
            try:
                self.loop.call_soon_threadsafe(self._turned)
            except RuntimeError:  # closed meanwhile
                return
            idle = time.monotonic() - self._last_turn
            if idle < LOOP_BLOCKED_AFTER:
                said = False
            elif not said:
                said = True
                task = asyncio.current_task(self.loop)
                ctx = self._contexts.get(task) if task is not None else None
                who = "" if ctx is None else f"run={ctx.run_id} kind={ctx.kind} worker={ctx.worker_id} "
                log.warning(
                    "%sblocks the worker's event loop: it has run nothing else for %.0fs (a call that"
                    " does not await: time.sleep, blocking I/O, CPU work); the other async jobs"
                    " wait, and no cancel or timeout interrupts them, until it yields (run such"
                    " code with asyncio.to_thread, or make the kind a thread job)",
                    who or "an async job ",
                    idle,
                )

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                except (SystemExit, KeyboardInterrupt) as exc:
                    # Raised in a task a job spawned (the job's own task reports its exit as
                    # a failure): asyncio lets it out of the loop, which would stop every async
                    # job of the worker. The loop goes on.
                    log.error("an async task raised %s: the worker's event loop goes on", describe(exc))
                    continue
                if self._stopping.is_set():
                    break  # stopped (``stop``)
                # A job called loop.stop(): it stops its own await, not every async job.
                log.error("an async job stopped the worker's event loop: it goes on")
        finally:
            try:
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def submit(self, ctx: Context, done: Callable[[Outcome], None]) -> None:
        """Run ``ctx``'s job as a task on the loop; ``done(outcome)`` is called when it ends
        (on the loop thread). Callable from any thread."""
        self.submit_many([ctx], done)

    def submit_many(self, contexts: list[Context], done: Callable[[Outcome], None]) -> None:
        """``submit`` for a claimed batch: one wake-up of the loop for all of them."""
        self.loop.call_soon_threadsafe(self._create_all, contexts, done)

    def _create_all(self, contexts: list[Context], done: Callable[[Outcome], None]) -> None:
        for ctx in contexts:
            self._create(ctx, done)

    def _create(self, ctx: Context, done: Callable[[Outcome], None]) -> None:
        """Make ``ctx``'s run a task; if that fails (a task factory a job installed raises), the
        run fails with the error and the rest of its batch goes on."""
        job = run_job(ctx, self._job_watch)
        try:
            task = self.loop.create_task(job, name=f"pgtick-run-{ctx.run_id}")
        except BaseException as exc:
            job.close()  # never awaited
            log.error("run=%s kind=%s could not be started as a task", ctx.run_id, ctx.kind, exc_info=exc)
            done(failure(ctx, "the worker could not start the job's task", exc))
            return
        self._contexts[task] = ctx

        def finished(t: asyncio.Task[Outcome]) -> None:
            self._contexts.pop(t, None)
            if t.cancelled():  # the loop shuts down, or job code cancelled its own task
                why = (
                    "the worker's event loop stopped"
                    if self._stopping.is_set()
                    else "the job's task was cancelled by job code (CancelledError)"
                )
                done(outcome_of(ctx, asyncio.CancelledError(why)))
                return
            error = t.exception()
            if error is None:
                done(t.result())
            else:  # around the job code (a hook): the run fails, the loop goes on
                log.error("run=%s kind=%s could not be run", ctx.run_id, ctx.kind, exc_info=error)
                done(failure(ctx, "the worker could not run the job", error))

        task.add_done_callback(finished)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the loop (tasks still running are cancelled) and wait for its thread, a
        moment only: the worker's grace is over, and a job that blocks the loop would hold
        the process past what its supervisor allows (the thread is a daemon)."""
        if self.loop.is_closed():
            return
        self._stopping.set()
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        elif not self._thread.ident:
            self.loop.close()


class JobWatch:
    """The instants at which a loop's async jobs must be interrupted, on one timer: each job's
    timeout, and the instant its run's ownership falls in doubt (no heartbeat confirmed it
    within its heartbeat timeout: a reaper may have failed it and its retry may be running).
    A job that does not reach a checkpoint (where it waits for a confirmation) within
    CHECKPOINT_GRACE of that instant has its task cancelled.

    The timer is set for the earliest of those instants. A job that starts later than the
    others, as each new one does, sets nothing, and one that ends leaves the timer as it is
    (when it fires it finds nothing due and sets itself again for what is left), so a job's
    start and end cost a dictionary entry, not a timer each. Used on the loop's thread only."""

    __slots__ = ("_at", "_jobs", "_timer")

    def __init__(self) -> None:
        self._jobs: dict[asyncio.Task[Any], _Watched] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0  # the monotonic instant the timer fires at, while it is set

    def add(
        self,
        task: asyncio.Task[Any],
        ctx: Context,
        interrupt: Callable[[str], None],
        deadline: float | None,
    ) -> None:
        self._jobs[task] = _Watched(ctx, interrupt, deadline)
        owned_until = ctx._owned_until
        at = deadline
        if owned_until is not None and (at is None or owned_until < at):
            at = owned_until + 0.001  # (a millisecond past the instant: surely past it)
        if at is not None and (self._timer is None or at < self._at):
            self._set(at)

    def discard(self, task: asyncio.Task[Any]) -> None:
        self._jobs.pop(task, None)

    def _set(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = asyncio.get_running_loop().call_later(max(at - time.monotonic(), 0.0), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = time.monotonic()
        earliest: float | None = None
        for task, job in list(self._jobs.items()):
            at = self._look(task, job, now)
            if at is None:
                continue
            earliest = at if earliest is None else min(earliest, at)
        if earliest is not None:
            self._set(earliest)

    def _look(self, task: asyncio.Task[Any], job: _Watched, now: float) -> float | None:
        """Interrupt the job if it is due; else the instant to look at it again (None: never)."""
        ctx, deadline = job.ctx, job.deadline
        if task.done():
            return None
        if deadline is not None and now >= deadline:
            del self._jobs[task]
            job.interrupt("timeout")
            return None
        owned_for = ctx._owned_for()
        if owned_for is None:
            return deadline
        if owned_for >= 0 or ctx._confirming:
            job.grace = None
            at = now + owned_for + 0.001 if owned_for >= 0 else now + CONFIRM_POLL
        else:
            if job.grace is None:
                job.grace = now + CHECKPOINT_GRACE
            at = job.grace
            if now >= at:
                del self._jobs[task]
                log.warning(
                    "run=%s kind=%s worker=%s job cancelled: no heartbeat has reached the database"
                    " within its heartbeat timeout of %gs, so it may have been reaped and retried"
                    " elsewhere; nothing is reported (the reaper ends the run)",
                    ctx.run_id,
                    ctx.kind,
                    ctx.worker_id,
                    ctx._heartbeat_timeout,
                )
                job.interrupt("abandoned")
                return None
        return at if deadline is None else min(at, deadline)


class _Watched:
    """One job in a ``JobWatch``: its run, its interrupt, the instant of its timeout, and the
    instant it is cancelled unless it reaches a checkpoint (set once its run falls in doubt)."""

    __slots__ = ("ctx", "deadline", "grace", "interrupt")

    def __init__(self, ctx: Context, interrupt: Callable[[str], None], deadline: float | None) -> None:
        self.ctx = ctx
        self.interrupt = interrupt
        self.deadline = deadline
        self.grace: float | None = None


async def run_job(ctx: Context, watch: JobWatch) -> Outcome:
    """Await the job's coroutine; cancellation, lost ownership and the timeout cancel it.
    Instrumented like ``pgtick.execution.execute``."""
    with instrumentation.current.execute(ctx) as ended:
        outcome = await _run_job(ctx, watch)
        ended(outcome)
    return outcome


async def _run_job(ctx: Context, watch: JobWatch) -> Outcome:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    why: list[str] = []  # the first reason the task was interrupted
    heeded: list[bool] = []  # the job let the cancellation end it

    def interrupt_here(reason: str) -> None:
        if not why and not task.done():
            why.append(reason)
            task.cancel()
            loop.call_later(IGNORED_CANCEL_AFTER, say_if_ignored)

    def say_if_ignored() -> None:
        """A job that catches CancelledError and goes on keeps one of the worker's slots (its
        run already ended as cancelled, timed out or let go): said once, as for a thread job
        past its timeout."""
        if not heeded and not task.done():
            log.warning(
                "run=%s kind=%s worker=%s job ignored its cancellation (%s) for %gs and still runs:"
                " it holds one of the worker's slots until it returns (let asyncio.CancelledError"
                " end the job)",
                ctx.run_id, ctx.kind, ctx.worker_id, why[0], IGNORED_CANCEL_AFTER,
            )  # fmt: skip

    def interrupt() -> None:  # from the heartbeat thread
        reason = "abandoned" if ctx.abandoned else "cancel"
        loop.call_soon_threadsafe(interrupt_here, reason)

    # Called once the task runs (a run in doubt already waits in the checkpoint below by then).
    watch.add(task, ctx, interrupt_here, None if ctx.timeout is None else ctx.timeout_from + ctx.timeout)
    ctx._interrupt = interrupt
    if ctx.cancel_requested or ctx.abandoned:
        interrupt()
    try:
        if ctx._in_doubt():  # reaped while it waited for a slot? (see execution._run)
            await ctx._await_owned()
        result: Any = await ctx.spec.fn(ctx)
    except asyncio.CancelledError as exc:
        if not why:
            raise  # not ours: the loop is shutting down
        heeded.append(True)
        task.uncancel()
        return await _interrupted(ctx, why[0], exc)
    except BaseException as exc:
        return outcome_of(ctx, exc)
    finally:
        ctx._interrupt = None
        watch.discard(task)
    return Outcome(ctx, "complete", result=result)


async def _interrupted(ctx: Context, reason: str, exc: asyncio.CancelledError) -> Outcome:
    if reason == "abandoned" or ctx.abandoned:
        return Outcome(ctx, "abandon")
    if reason == "timeout":
        timeout = ctx.timeout or 0.0
        return outcome_of(ctx, JobTimeout(f"run {ctx.run_id} exceeded its timeout of {timeout:g}s"))
    try:
        if ctx.spec.mutating:  # (nothing else to compensate: no thread needed)
            await _in_a_thread_of_its_own(ctx._compensate)
    except BaseException as error:
        log.warning("run=%s kind=%s compensation failed: %s", ctx.run_id, ctx.kind, error)
        return outcome_of(ctx, error)
    return Outcome(ctx, "cancel", message=f"run {ctx.run_id} cancelled")


async def _in_a_thread_of_its_own(fn: Callable[[], None]) -> None:
    """Run ``fn`` on a new thread, so the loop goes on: not on the loop's default executor,
    which job code may have filled with blocking calls (``asyncio.to_thread``) that a cancel
    does not stop, and which would hold the compensation, and so the cancel, until one
    returns."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    context = contextvars.copy_context()  # as asyncio.to_thread does

    def settle(error: BaseException | None) -> None:
        if ended.done():
            return  # the task was cancelled meanwhile (the loop stops)
        if error is None:
            ended.set_result(None)
        else:
            ended.set_exception(error)

    def target() -> None:
        error: BaseException | None = None
        try:
            context.run(fn)
        except BaseException as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:
            pass  # the loop is closed: the worker has stopped

    threading.Thread(target=target, name="pgtick-compensation", daemon=True).start()
    await ended
