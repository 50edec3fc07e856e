"""The worker's parts on their own: execute() says how a run ended, WorkerStats counts events."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from harness import Database
from pgtick.aio import EventLoop
from pgtick.app import App, Context
from pgtick.events import Listeners, WorkerStats
from pgtick.execution import Outcome, execute
from pgtick.reporter import Reporter, storable


def _context(app: App, kind: str, timeout: float | None = None) -> Context:
    run = {
        "id": 7,
        "attempt": 1,
        "kind": kind,
        "payload": {},
        "scheduled_for": datetime(2030, 1, 1, tzinfo=UTC),
        "definition_id": None,
    }
    return Context(run, app.jobs[kind], "w", timeout)


def test_execute_names_how_each_run_ended() -> None:
    app = App()

    @app.job("ok")
    def ok(ctx: Context) -> Any:
        return {"n": 1}

    @app.job("plain")
    def plain(ctx: Context) -> None:
        return None

    @app.job("async")
    async def run_async(ctx: Context) -> int:
        await asyncio.sleep(0)
        return 2

    @app.job("boom")
    def boom(ctx: Context) -> None:
        raise KeyError("x")

    @app.job("exit")
    def leave(ctx: Context) -> None:
        raise SystemExit(3)

    @app.job("checkpoint")
    def checkpoint(ctx: Context) -> None:
        ctx.checkpoint()

    got = execute(_context(app, "ok"))
    assert (got.action, got.result, got.plain) == ("complete", {"n": 1}, False)
    got = execute(_context(app, "plain"))
    assert (got.action, got.plain) == ("complete", True)
    assert execute(_context(app, "async")).result == 2
    got = execute(_context(app, "boom"))
    assert (got.action, got.reason, got.classes) == (
        "fail",
        "Error",
        ["KeyError", "LookupError", "Exception"],
    )
    assert got.message == "KeyError: 'x'"
    assert execute(_context(app, "exit")).action == "fail", "SystemExit from job code must not escape"

    cancelled = _context(app, "checkpoint")
    cancelled.request_cancel()
    assert execute(cancelled).action == "cancel"
    lost = _context(app, "checkpoint")
    lost.abandon()
    got = execute(lost)
    assert (got.action, got.plain) == ("abandon", False)
    late = _context(app, "checkpoint", timeout=1e-9)
    got = execute(late)
    assert (got.action, got.reason) == ("fail", "Timeout")


@pytest.mark.parametrize("kind", ["thread", "async", "checkpoint-free"])
@pytest.mark.parametrize("news", ["still ours", "lost"])
def test_a_checkpoint_past_the_heartbeat_timeout_waits_for_a_heartbeat_to_say_whose_run_it_is(
    kind: str, news: str
) -> None:
    """The last heartbeat the database answered is older than the run's heartbeat timeout:
    the run may have been reaped and retried elsewhere, so the job stops at its checkpoint
    until a heartbeat answers: it goes on if the run is still ours, raises Abandoned if not."""
    app = App()
    passed = threading.Event()

    @app.job("thread")
    def thread_job(ctx: Context) -> None:
        ctx.checkpoint()
        passed.set()

    @app.job("async")
    async def async_job(ctx: Context) -> None:
        await ctx.checkpoint()
        passed.set()

    @app.job("checkpoint-free")
    def checkpoint_free(ctx: Context) -> None:
        passed.set()

    fresh = _context(app, kind)
    fresh.owned(time.monotonic(), 60.0)
    assert execute(fresh).action == "complete", "a run heartbeated within its timeout goes on"
    assert passed.is_set()
    passed.clear()
    assert execute(_context(app, kind)).action == "complete", "a run not tracked (run inline) goes on"
    passed.clear()

    ctx = _context(app, kind)
    ctx.owned(time.monotonic() - 10.0, 1.0)  # answered 10 s ago; reapable after 1 s
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(execute, ctx)
        # A job that has not begun (claimed ahead, waiting for a slot) does not begin either.
        assert not passed.wait(1.0), "the job went past its checkpoint on a run that may have been reaped"
        if news == "still ours":
            ctx.owned(time.monotonic())
        else:
            ctx.abandon()
        outcome = running.result(timeout=30)
    if news == "still ours":
        assert (outcome.action, passed.is_set()) == ("complete", True)
    else:
        assert (outcome.action, passed.is_set()) == ("abandon", False)


@pytest.mark.parametrize("news", ["still ours", "lost"])
def test_an_async_job_on_the_workers_loop_does_not_begin_on_a_run_that_may_have_been_reaped(
    news: str,
) -> None:
    app = App()
    began = threading.Event()

    @app.job("async")
    async def async_job(ctx: Context) -> None:
        began.set()

    ctx = _context(app, "async")
    ctx.owned(time.monotonic() - 10.0, 1.0)
    outcomes: list[Outcome] = []
    ended = threading.Event()

    def done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        ended.set()

    loop = EventLoop()
    loop.start()
    try:
        loop.submit(ctx, done)
        assert not began.wait(1.0), "the job began on a run that may have been reaped"
        if news == "still ours":
            ctx.owned(time.monotonic())
        else:
            ctx.abandon()
        assert ended.wait(30)
    finally:
        loop.stop()
    expected = ("complete", True) if news == "still ours" else ("abandon", False)
    assert (outcomes[0].action, began.is_set()) == expected


def test_stats_count_what_the_listeners_hear() -> None:
    stats = WorkerStats()
    heard: list[tuple[str, str]] = []

    class Recorder:
        def on_claim(self, kinds: list[str], seconds: float) -> None:
            heard.append(("claim", ",".join(kinds)))

        def on_outcome(self, kind: str, outcome: str) -> None:
            heard.append((kind, outcome))

        def on_heartbeat_failure(self) -> None:
            heard.append(("heartbeat", "failed"))

    events = Listeners([stats, Recorder(), None])
    events.on_claim(["a", "b"], 0.01)
    for outcome in ("complete", "complete", "fail", "cancel", "abandon", "fenced"):
        events.on_outcome("a", outcome)
    events.on_heartbeat_failure()
    assert stats == WorkerStats(
        claimed=2, completed=2, failed=1, cancelled=1, abandoned=1, fenced=1, heartbeat_failures=1
    )
    assert heard[0] == ("claim", "a,b") and heard[-1] == ("heartbeat", "failed") and len(heard) == 8


@pytest.mark.parametrize("outcome", ["complete", "fail", "cancel", "abandon", "fenced"])
def test_every_settlement_is_counted_once(outcome: str) -> None:
    stats = WorkerStats()
    stats.on_outcome("k", outcome)  # type: ignore[arg-type]
    counted = {k: v for k, v in vars(stats).items() if v}
    assert len(counted) == 1 and next(iter(counted.values())) == 1, counted


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("plain", "plain"),
        ("nul\x00here", "nul\\x00here"),
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
        (b"bytes \xff".decode("utf-8", "surrogateescape"), "bytes \\udcff"),
    ],
)
def test_storable_text_keeps_what_postgresql_takes_and_escapes_the_rest(text: str, stored: str) -> None:
    assert storable(text) == stored
    assert "\x00" not in stored
    stored.encode("utf-8")  # valid UTF-8: PostgreSQL text takes it


def test_storable_text_is_cut_to_its_limit_with_a_note() -> None:
    cut = storable("x" * 50_000, limit=1000)
    assert len(cut) <= 1000 and cut.endswith("… (49040 more characters)"), cut[-60:]


def test_runs_a_worker_could_not_fail_are_never_handed_back_after_a_lost_claim() -> None:
    """A worker that stops on an error fails the runs it holds; those whose failure does not
    get through (the database out of reach) began and may still be RUNNING for it, so they
    join the runs a hand back after a lost claim keeps out (the reaper ends them)."""
    from pgtick.worker import Worker

    app = App()
    app.job("k")(lambda ctx: None)
    worker = Worker(app, "host=/nonexistent-pgtick-socket-dir dbname=none connect_timeout=2")
    worker._fail_runs(None, {41, 42}, "stopping")
    assert set(worker._left) == {41, 42}


def test_a_worker_sends_more_run_ids_than_one_call_takes_in_several_calls(db: Database) -> None:
    """jobs.heartbeat and jobs.complete_many take at most 10,000 run ids a call: a worker
    holding more splits them, instead of having every heartbeat and completion refused."""
    from pgtick.heartbeat import MAX_CALL_IDS
    from pgtick.worker import Worker

    many = list(range(1, MAX_CALL_IDS + 2))  # none of them ours: each call answers none
    app = App()
    app.job("k")(lambda ctx: None)
    worker = Worker(app, db.dsn)
    try:
        assert worker._complete_many(many) == set()
    finally:
        worker._close_done_conn()
    with db.connect() as conn:
        assert worker._heartbeat._stamp(conn, many) == {}


def test_a_completion_fenced_by_its_timeout_failure_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The job returns just as its worker fails the run as Timeout: its plain completion,
    already on its way, comes back fenced by that failure. The failure was the run's
    outcome: counted once, one outcome line, no FENCED."""
    app = App()

    @app.job("slow")
    def slow(ctx: Context) -> None:
        return None

    ctx = _context(app, "slow", timeout=1)
    stats = WorkerStats()
    released: list[int] = []
    reporter = Reporter("w", stats, lambda c: released.append(c.run_id))
    completion = Outcome(ctx, "complete")
    assert completion.plain
    reporter.add(completion)
    sent = reporter.take_plain()  # the completer sends it ...
    assert sent == [completion]
    reporter.timed_out(ctx)  # ... while the heartbeat loop fails the run as Timeout
    with caplog.at_level(logging.INFO, logger="pgtick"):
        reporter.settle(completion, applied=False)
    assert (stats.failed, stats.fenced, stats.completed) == (1, 0, 0), stats
    assert "status=FENCED" not in caplog.text, caplog.text
    assert "returned after its timeout" in caplog.text, caplog.text
    assert released == [ctx.run_id]
    assert not reporter.is_pending(ctx.run_id)
