"""pgtick.aio without a database: async jobs as tasks on one loop thread.

The outcome of every run comes back through ``done`` (as the worker's reporter gets it);
cancellation and the timeout interrupt a job at whatever it awaits.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from harness import task_factory_breaking_app
from pgtick import aio, instrumentation
from pgtick.aio import EventLoop
from pgtick.app import App, Context
from pgtick.errors import Cancelled, UsageError
from pgtick.execution import Outcome


def _context(app: App, kind: str, run_id: int, timeout: float | None = None) -> Context:
    run = {
        "id": run_id,
        "attempt": 1,
        "kind": kind,
        "payload": {},
        "scheduled_for": datetime.now(UTC),
        "definition_id": None,
    }
    return Context(run, app.jobs[kind], "test-worker", timeout)


def _outcomes(loop: EventLoop, contexts: list[Context], timeout: float = 30) -> list[Outcome]:
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    for ctx in contexts:
        loop.submit(ctx, done.put)
    return sorted((done.get(timeout=timeout) for _ in contexts), key=lambda o: o.ctx.run_id)


def test_async_jobs_run_at_once_as_tasks_of_one_loop_on_one_thread() -> None:
    app = App()
    seen: list[tuple[int, int]] = []
    entered = 0
    count = 20

    @app.job("gather")
    async def gather(ctx: Context) -> int:
        nonlocal entered
        seen.append((id(asyncio.get_running_loop()), threading.get_ident()))
        entered += 1
        while entered < count:  # finishes only if all are running at the same time
            await asyncio.sleep(0.01)
        return ctx.run_id

    loop = EventLoop()
    loop.start()
    try:
        outcomes = _outcomes(loop, [_context(app, "gather", i) for i in range(count)])
    finally:
        loop.stop()
    assert [(o.action, o.result) for o in outcomes] == [("complete", i) for i in range(count)]
    assert set(seen) == {(id(loop.loop), loop.thread.ident)}, seen


def test_a_cancel_interrupts_the_await_and_compensation_runs_once_off_the_loop() -> None:
    app = App()
    compensated: list[str] = []
    started = threading.Event()

    def compensate(ctx: Context) -> None:
        compensated.append(threading.current_thread().name)

    @app.job("waits", mutating=True, compensate=compensate)
    async def waits(ctx: Context) -> None:
        started.set()
        await asyncio.sleep(3600)

    loop = EventLoop()
    loop.start()
    try:
        ctx = _context(app, "waits", 1)
        done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        loop.submit(ctx, done.put)
        assert started.wait(30)
        ctx.request_cancel()  # what the heartbeat thread does
        outcome = done.get(timeout=30)
    finally:
        loop.stop()
    assert outcome.action == "cancel", outcome
    assert len(compensated) == 1 and compensated[0] != loop.thread.name, compensated


def _sleeps_and_quick() -> App:
    """An app with two kinds: ``sleeps`` awaits an hour, ``quick`` checkpoints and returns."""
    app = App()

    @app.job("sleeps")
    async def sleeps(ctx: Context) -> None:
        await asyncio.sleep(3600)

    @app.job("quick")
    async def quick(ctx: Context) -> str:
        await ctx.checkpoint()
        return "done"

    return app


def test_the_timeout_interrupts_the_await_and_other_jobs_go_on() -> None:
    app = _sleeps_and_quick()
    loop = EventLoop()
    loop.start()
    began = time.monotonic()
    try:
        outcomes = _outcomes(loop, [_context(app, "sleeps", 1, timeout=0.2), _context(app, "quick", 2)])
    finally:
        loop.stop()
    stopped, finished = outcomes
    assert (stopped.action, stopped.reason) == ("fail", "Timeout"), stopped
    assert stopped.classes is not None and stopped.classes[0] == "JobTimeout", stopped
    assert time.monotonic() - began >= 0.2
    assert (finished.action, finished.result) == ("complete", "done"), finished


def test_each_jobs_timeout_and_doubt_end_it_on_time_whatever_the_order_the_jobs_start_in() -> None:
    """The loop's jobs share one timer: a job that starts after one with a later instant (a
    long timeout), after one that ended, or after one interrupted, still ends at its own."""
    app = _sleeps_and_quick()
    loop = EventLoop()
    loop.start()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    ended: dict[int, tuple[Outcome, float]] = {}

    def until(run_id: int) -> tuple[Outcome, float]:
        while run_id not in ended:
            outcome = done.get(timeout=30)
            ended[outcome.ctx.run_id] = (outcome, time.monotonic())
        return ended[run_id]

    try:
        loop.submit(_context(app, "sleeps", 1, timeout=600), done.put)  # the timer: 10 minutes on
        loop.submit(_context(app, "quick", 2), done.put)
        assert until(2)[0].action == "complete"
        began = time.monotonic()
        loop.submit(_context(app, "sleeps", 3, timeout=0.3), done.put)
        timed_out, at = until(3)
        assert (timed_out.action, timed_out.reason) == ("fail", "Timeout"), timed_out
        assert 0.3 <= at - began < 60, f"run 3 timed out {at - began:.3f}s after it started"
        # After an interruption the timer is back at run 1's instant; a run in doubt comes first.
        doubtful = _context(app, "sleeps", 4, timeout=600)
        confirmed = time.monotonic()
        doubtful.owned(confirmed, 0.3)
        loop.submit(doubtful, done.put)
        abandoned, at = until(4)
        assert abandoned.action == "abandon", abandoned
        after = at - confirmed
        assert 0.3 <= after < 60, f"run 4 was let go {after:.3f}s after its last confirmation"
        assert 1 not in ended, ended[1]
    finally:
        loop.stop()


def test_a_checkpoint_in_an_async_job_sees_the_cancel_and_compensates_on_the_loop() -> None:
    app = App()
    where: list[Any] = []

    @app.job("steps", mutating=True, compensate=lambda ctx: where.append(threading.get_ident()))
    async def steps(ctx: Context) -> None:
        ctx.request_cancel()
        await ctx.checkpoint()  # raises before it awaits: the checkpoint sees the cancel first

    loop = EventLoop()
    loop.start()
    try:
        [outcome] = _outcomes(loop, [_context(app, "steps", 1)])
    finally:
        loop.stop()
    assert outcome.action == "cancel", outcome
    assert where == [loop.thread.ident]


def test_a_hook_failing_around_an_async_job_fails_that_run_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the guard the task's exception is only logged by asyncio: the run would
    never be reported (RUNNING with live heartbeats) and its slot never freed."""

    class BrokenHook(instrumentation.Instrumentation):
        @contextmanager
        def execute(self, ctx: Context) -> Iterator[Callable[[Outcome], None]]:
            if ctx.run_id == 1:
                raise RuntimeError("the execution hook is broken")
            with super().execute(ctx) as ended:
                yield ended

    monkeypatch.setattr(instrumentation, "current", BrokenHook())
    app = App()

    @app.job("answer")
    async def answer(ctx: Context) -> int:
        return 42

    loop = EventLoop()
    loop.start()
    try:
        outcomes = _outcomes(loop, [_context(app, "answer", 1), _context(app, "answer", 2)], timeout=10)
    finally:
        loop.stop()
    summary = [(o.action, o.message, o.result) for o in outcomes]
    assert summary == [
        ("fail", "the worker could not run the job: RuntimeError: the execution hook is broken", None),
        ("complete", None, 42),
    ], summary


#: Run in a process of its own: a SystemExit let out of a thread's event loop leaves this
#: CPython's parser state askew for the rest of the process (the next ast.parse fails).
SYSTEM_EXIT_SCRIPT = """
import asyncio, queue, sys
from datetime import UTC, datetime
from pgtick.aio import EventLoop
from pgtick.app import App, Context

app = App()

@app.job("spawns")
async def spawns(ctx):
    async def stray():
        raise SystemExit(9)
    asyncio.get_running_loop().create_task(stray())
    await asyncio.sleep(0.2)
    return "spawned"

@app.job("later")
async def later(ctx):
    await asyncio.sleep(0.01)
    return ctx.run_id

def context(kind, run_id):
    run = {"id": run_id, "attempt": 1, "kind": kind, "payload": {}, "scheduled_for": datetime.now(UTC),
           "definition_id": None}
    return Context(run, app.jobs[kind], "test-worker", None)

loop = EventLoop()
loop.start()
done = queue.SimpleQueue()
loop.submit(context("spawns", 1), done.put)
first = done.get(timeout=30)
loop.submit(context("later", 2), done.put)
try:
    second = done.get(timeout=10)
except queue.Empty:
    second = None
alive = loop.thread.is_alive()
loop.stop()
print(first.action, first.result, second and second.action, second and second.result, alive)
"""


def test_a_system_exit_in_a_task_a_job_spawned_does_not_stop_the_loop() -> None:
    """asyncio lets SystemExit out of the loop: without care one job's stray task would stop
    every async job of the worker."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SYSTEM_EXIT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["complete", "spawned", "complete", "2", "True"], done.stdout + done.stderr


def test_a_run_in_doubt_cancels_an_async_job_that_awaits_elsewhere_and_lets_a_checkpoint_wait() -> None:
    """Both runs were last confirmed (claim or heartbeat) now, with a heartbeat timeout of
    0.3 s, and no heartbeat follows. Past that instant the job awaiting a one-hour sleep is
    cancelled and abandoned (nothing reported); the job that checkpoints every 10 ms waits at
    its checkpoint instead, and goes on once a heartbeat confirms its run."""
    app = App()
    release = threading.Event()

    @app.job("sleeps")
    async def sleeps(ctx: Context) -> None:
        await asyncio.sleep(3600)

    @app.job("checkpoints")
    async def checkpoints(ctx: Context) -> str:
        while not release.is_set():
            await ctx.checkpoint()
            await asyncio.sleep(0.01)
        return "done"

    loop = EventLoop()
    loop.start()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    stuck, waiting = _context(app, "sleeps", 1), _context(app, "checkpoints", 2)
    confirmed = time.monotonic()
    for ctx in (stuck, waiting):
        ctx.owned(confirmed, 0.3)
        loop.submit(ctx, done.put)
    try:
        first = done.get(timeout=30)
        cancelled_after = time.monotonic() - confirmed
        parked = waiting._confirming and waiting._in_doubt()
        waiting.owned(time.monotonic())  # a heartbeat gets through: the run is still ours
        release.set()
        second = done.get(timeout=30)
    finally:
        loop.stop()
    assert (first.ctx.run_id, first.action) == (1, "abandon"), first
    assert cancelled_after >= 0.3, f"cancelled {cancelled_after:.3f}s after the last confirmation"
    assert parked, "the checkpointing job was not waiting at its checkpoint for a confirmation"
    assert (second.ctx.run_id, second.action, second.result) == (2, "complete", "done"), second


def test_a_job_that_stops_the_loop_stops_neither_the_loop_nor_the_other_jobs() -> None:
    """``loop.stop()`` from job code ends the loop's run_forever; only ``EventLoop.stop``
    ends the loop: the other async jobs go on, and so does the job that called it."""
    app = App()

    @app.job("stops")
    async def stops(ctx: Context) -> str:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.05)
        return "after stop"

    @app.job("waits")
    async def waits(ctx: Context) -> int:
        await asyncio.sleep(0.3)
        return ctx.run_id

    loop = EventLoop()
    loop.start()
    try:
        outcomes = _outcomes(loop, [_context(app, "waits", 1), _context(app, "stops", 2)])
        later = _outcomes(loop, [_context(app, "waits", 3)])
    finally:
        loop.stop()
    assert [(o.action, o.result) for o in outcomes + later] == [
        ("complete", 1),
        ("complete", "after stop"),
        ("complete", 3),
    ]
    assert not loop.thread.is_alive()


def test_a_job_that_raises_cancelled_error_fails_saying_so() -> None:
    app = App()

    @app.job("cancels-itself")
    async def cancels_itself(ctx: Context) -> None:
        raise asyncio.CancelledError()

    loop = EventLoop()
    loop.start()
    try:
        [outcome] = _outcomes(loop, [_context(app, "cancels-itself", 1)])
    finally:
        loop.stop()
    assert outcome.action == "fail" and "cancelled by job code" in (outcome.message or ""), outcome


def test_a_run_whose_task_cannot_be_made_fails_and_the_rest_of_its_batch_runs() -> None:
    """A job installed a task factory that raises (once): the next run of the batch the claim
    hands over fails with that error; the runs after it in the same batch run."""
    app = task_factory_breaking_app()

    loop = EventLoop()
    loop.start()
    try:
        [broke] = _outcomes(loop, [_context(app, "breaks-the-next-task", 1)])
        done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        loop.submit_many([_context(app, "answer", i) for i in (2, 3, 4)], done.put)
        outcomes = sorted((done.get(timeout=30) for _ in range(3)), key=lambda o: o.ctx.run_id)
    finally:
        loop.stop()
    assert broke.action == "complete", broke
    summary = [(o.ctx.run_id, o.action, o.message, o.result) for o in outcomes]
    assert summary == [
        (2, "fail", "the worker could not start the job's task: RuntimeError: no task today", None),
        (3, "complete", None, 3),
        (4, "complete", None, 4),
    ], summary


def test_an_async_def_compensation_is_refused_where_it_is_registered_not_skipped_at_a_cancel() -> None:
    """Compensation is called as a plain function (in a thread, or at a checkpoint): an
    ``async def`` one would return a coroutine nobody awaits, and the run would end CANCELLED
    with nothing compensated."""
    app = App()

    async def refund(ctx: Context) -> None:
        pass

    with pytest.raises(UsageError, match=r"job pays: compensate= takes a plain function, not async def"):
        app.job("pays", mutating=True, compensate=refund)  # type: ignore[arg-type]
    assert "pays" not in app.jobs

    @app.job("books", mutating=True)
    async def books(ctx: Context) -> None:
        pass

    ctx = _context(app, "books", 1)
    with pytest.raises(UsageError, match=r"job books: on_cancel takes a plain function, not async def"):
        ctx.on_cancel(refund)  # type: ignore[arg-type]
    ctx.request_cancel()
    with pytest.raises(Cancelled):
        ctx._check()  # compensates: nothing registered, nothing awaited


def test_a_cancel_ends_async_jobs_while_job_code_holds_every_thread_of_the_loops_executor() -> None:
    """Job code may fill the loop's default executor with blocking calls (asyncio.to_thread),
    which a cancel does not stop: the cancelled runs, mutating (compensated) or not, end
    CANCELLED all the same, without waiting for a thread of that executor."""
    app = App()
    release = threading.Event()
    holding = threading.Event()
    compensated: list[int] = []

    @app.job("holds")
    async def holds(ctx: Context) -> None:
        holding.set()
        await asyncio.to_thread(release.wait, 60)

    @app.job("books", mutating=True, compensate=lambda ctx: compensated.append(ctx.run_id))
    async def books(ctx: Context) -> None:
        await asyncio.sleep(3600)

    @app.job("reads")
    async def reads(ctx: Context) -> None:
        await asyncio.sleep(3600)

    loop = EventLoop()
    loop.loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
    loop.start()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    try:
        contexts = [_context(app, "holds", 1), _context(app, "books", 2), _context(app, "reads", 3)]
        for ctx in contexts:
            loop.submit(ctx, done.put)
        assert holding.wait(30)
        for ctx in contexts:
            ctx.request_cancel()  # what the heartbeat thread does
        ended: list[tuple[int, str]] = []
        try:
            while len(ended) < len(contexts):
                outcome = done.get(timeout=20)
                ended.append((outcome.ctx.run_id, outcome.action))
        except queue.Empty:
            pass
    finally:
        release.set()
        loop.stop()
    assert sorted(ended) == [(1, "cancel"), (2, "cancel"), (3, "cancel")], (
        f"cancelled runs that ended while the executor was held: {ended}"
    )
    assert compensated == [2], compensated


def test_a_job_that_ignores_its_cancellation_is_said_to_hold_its_slot(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that catches CancelledError and goes on cannot be stopped: its run ends by its
    timeout, and the worker says once that the job still runs and holds a slot; a job that
    lets the cancellation end it is not named."""
    monkeypatch.setattr(aio, "IGNORED_CANCEL_AFTER", 0.3)
    app = App()
    release = threading.Event()

    @app.job("deaf")
    async def deaf(ctx: Context) -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass

    @app.job("heeds")
    async def heeds(ctx: Context) -> None:
        await asyncio.sleep(3600)

    loop = EventLoop()
    loop.start()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    try:
        with caplog.at_level("WARNING", logger="pgtick.worker"):
            loop.submit(_context(app, "deaf", 1, timeout=0.2), done.put)
            loop.submit(_context(app, "heeds", 2, timeout=0.2), done.put)
            heeded = done.get(timeout=30)
            deadline = time.monotonic() + 30
            while "ignored its cancellation" not in caplog.text:
                assert time.monotonic() < deadline, f"no warning: {caplog.text}"
                time.sleep(0.05)
            release.set()
            ignored = done.get(timeout=30)
    finally:
        release.set()
        loop.stop()
    assert (heeded.ctx.run_id, heeded.reason) == (2, "Timeout"), heeded
    assert (ignored.ctx.run_id, ignored.action) == (1, "complete"), ignored
    warned = [r.getMessage() for r in caplog.records if "ignored its cancellation" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("run=1 kind=deaf"), warned
