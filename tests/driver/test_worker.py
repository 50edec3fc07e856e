"""The worker heartbeats each run often enough for that run's own heartbeat timeout,
even when the loop was idling on the default cadence when the run arrived."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from harness import (
    Conn,
    Database,
    WorkerThread,
    add_definition,
    add_runs,
    materialize_occurrences,
    pgtick,
    runs_in,
    scalar,
    wait_for,
    worker_thread,
)
from pgtick import calls
from pgtick.app import App, Context
from pgtick.errors import UsageError
from pgtick.worker import CAPPED_CLAIMERS, Worker


def test_short_per_run_heartbeat_timeout_is_honoured(db: Database) -> None:
    app = App()
    started = threading.Event()

    @app.job("slow")
    def slow(ctx: Context) -> None:
        started.set()
        time.sleep(3.0)

    worker = Worker(app, db.dsn, poll_interval=0.1, heartbeat_interval=5.0)
    reaped = []
    with worker_thread(worker):
        time.sleep(0.5)  # the heartbeat loop is now in a 5 s wait (jobs.config: 60 s timeout)
        with db.connect() as conn:
            run = conn.execute(
                "SELECT id FROM jobs.enqueue('slow', heartbeat_timeout => '1 second')"
            ).fetchone()
            assert run is not None and started.wait(10)
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:  # a leader's reaper, as eager as can be
                reaped += conn.execute("SELECT run_id FROM jobs.reap()").fetchall()
                time.sleep(0.1)

            def done() -> bool:
                row = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", run).fetchone()
                return row == ("COMPLETED",)

            wait_for("the run to complete", done, timeout=60)
    assert reaped == [], f"reaped while its worker was alive: {reaped}"
    assert worker.stats.completed == 1 and worker.stats.fenced == 0, worker.stats


def test_a_server_heartbeat_timeout_lowered_while_a_run_is_held_reaches_the_cadence(db: Database) -> None:
    """jobs.config.heartbeat_timeout is the timeout of every run without one of its own. An
    operator lowering it while a worker holds a run must not leave the worker beating at the
    old cadence, past the new timeout, where the reaper would take the run from a live worker:
    the worker reads it at every beat and beats within a third of it."""
    app = App()
    started = threading.Event()
    release = threading.Event()

    @app.job("long")
    def long(ctx: Context) -> None:
        started.set()
        release.wait(120)

    worker = Worker(app, db.dsn, poll_interval=0.1, heartbeat_interval=1.0)
    with worker_thread(worker), db.connect() as conn:
        try:
            conn.execute("SELECT jobs.enqueue('long')")
            assert started.wait(30)
            assert worker.heartbeat_interval() == 1.0  # jobs.config: 60 s, a third is 20 s
            conn.execute("UPDATE jobs.config SET heartbeat_timeout = interval '1.5 seconds'")
            wait_for(
                "the worker to beat within a third of the new timeout",
                lambda: worker.heartbeat_interval() <= 0.5,
                timeout=60,
            )
        finally:
            release.set()


def test_unknown_kind_waits_visibly_and_crashes_nothing(db: Database) -> None:
    """A run whose kind no worker knows stays QUEUED (no worker claims kinds it
    does not have) and shows in jobs.queue_stats with a growing oldest age."""
    app = App()
    done = threading.Event()

    @app.job("known")
    def known(ctx: Context) -> None:
        done.set()

    with db.connect() as conn:
        orphan = conn.execute("SELECT id FROM jobs.enqueue('nobody-knows-me')").fetchone()
        conn.execute("SELECT jobs.enqueue('known')")
    with worker_thread(Worker(app, db.dsn, poll_interval=0.1), join=10):
        assert done.wait(10)
        time.sleep(0.5)
    with db.connect() as conn:
        status = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", orphan).fetchone()
        stats = conn.execute(
            "SELECT queued, oldest_queued_age > interval '0' FROM jobs.queue_stats"
            " WHERE kind = 'nobody-knows-me'"
        ).fetchone()
    assert status == ("QUEUED",)
    assert stats == (1, True)


def test_a_worker_registers_the_queues_it_claims_from(db: Database) -> None:
    """A worker of some queues says so in the registry, so a kind's runs in another queue show
    in jobs.kinds_without_worker while it runs the kind elsewhere; one of every queue registers
    NULL and serves them all."""
    app = App()
    done = threading.Event()

    @app.job("mail")
    def mail(ctx: Context) -> None:
        done.set()

    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('mail', queue => 'outbox')")
        conn.execute("SELECT jobs.enqueue('mail', queue => 'bulk')")
    worker = Worker(app, db.dsn, poll_interval=0.1, queues=["outbox"])
    with worker_thread(worker, join=10):
        assert done.wait(30)
        with db.connect() as conn:
            registered = conn.execute(
                "SELECT queues FROM jobs.workers WHERE worker = %s", (worker.worker_id,)
            )
            assert registered.fetchone() == (["outbox"],)
            unserved = conn.execute("SELECT kind, queued, queues FROM jobs.kinds_without_worker").fetchall()
            assert unserved == [("mail", 1, ["bulk"])]
    every = Worker(app, db.dsn, poll_interval=0.1)
    with worker_thread(every, join=10):
        with db.connect() as conn:
            wait_for(
                "the bulk run to complete",
                lambda: scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status = 'COMPLETED'") == 2,
                30,
            )
            registered = conn.execute("SELECT queues FROM jobs.workers WHERE worker = %s", (every.worker_id,))
            assert registered.fetchone() == (None,)


def test_batch_larger_than_concurrency_claims_ahead_and_runs_one_at_a_time(db: Database) -> None:
    """With batch_size above concurrency the worker holds runs claimed ahead, but never
    executes more than concurrency at once, and every run completes exactly once."""
    app = App()
    lock = threading.Lock()
    running = 0
    most = 0
    seen: list[int] = []

    @app.job("step")
    def step(ctx: Context) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            seen.append(ctx.run_id)
        time.sleep(0.05)
        with lock:
            running -= 1

    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('step') FROM generate_series(1, 12)")
    worker = Worker(app, db.dsn, concurrency=2, batch_size=6, poll_interval=0.1)
    assert worker.capacity == 6
    with worker_thread(worker), db.connect() as conn:
        wait_for("all 12 runs to complete", lambda: runs_in(conn, "COMPLETED") == 12, timeout=60)
    assert most <= 2, f"{most} runs executed at once with concurrency 2"
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 12, seen
    assert worker.stats.completed == 12 and worker.stats.fenced == 0, worker.stats


class ClaimThreads:
    """A worker listener that notes which thread handed out each non-empty claim."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_claim(self, kinds: list[str], seconds: float) -> None:
        if kinds:
            self.names.append(threading.current_thread().name)

    def on_outcome(self, kind: str, outcome: Any) -> None:
        pass

    def on_heartbeat_failure(self) -> None:
        pass


def test_extra_claimers_claim_beside_the_claim_loop_within_concurrency(db: Database) -> None:
    """With claimers > 1 and a backlog, batches are claimed on several connections, yet the
    worker never holds more than concurrency claimed runs whose job has not finished
    (sampled from the database throughout), and every run completes exactly once."""
    app = App()
    lock = threading.Lock()
    seen: list[int] = []
    finished: set[int] = set()

    @app.job("step")
    def step(ctx: Context) -> None:
        with lock:
            seen.append(ctx.run_id)
        time.sleep(0.02)
        with lock:
            finished.add(ctx.run_id)

    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('step') FROM generate_series(1, 400)")
    threads = ClaimThreads()
    worker = Worker(
        app, db.dsn, concurrency=16, batch_size=4, claimers=4, poll_interval=0.1, listener=threads
    )
    most = 0
    with worker_thread(worker), db.connect() as conn:

        def drained() -> bool:
            nonlocal most
            running = scalar(
                conn,
                "SELECT coalesce(array_agg(id), '{}') FROM jobs.runs"
                " WHERE status = 'RUNNING' AND worker = %s",
                (worker.worker_id,),
            )
            with lock:  # read after the database: a run finished in between only lowers the count
                unfinished = set(running) - finished
            most = max(most, len(unfinished))
            return runs_in(conn, "COMPLETED") == 400

        wait_for("all 400 runs to complete", drained, timeout=120, interval=0.005)
    assert most <= 16, f"{most} claimed runs waited or ran at once with concurrency 16"
    assert len(seen) == 400 and len(set(seen)) == 400, "a run executed twice or not at all"
    assert worker.stats.completed == 400 and worker.stats.fenced == 0, worker.stats
    extra = {name for name in threads.names if name.startswith("pgtick-claim-")}
    assert extra, f"only the claim loop claimed: {sorted(set(threads.names))}"


def check_claimers_bounded_then_lifted(db: Database, app: App, more: str, bound: str, free: str) -> None:
    """Run a worker with 8 claimers over the 600 runs queued (``bound``: what holds them),
    then over the 3,000 that the statement ``more`` queues (``free``: what holds those): in
    the first phase only the extra claimers below CAPPED_CLAIMERS may claim, in the second
    one past them must."""
    threads = ClaimThreads()
    worker = Worker(
        app, db.dsn, concurrency=40, batch_size=4, claimers=8, poll_interval=0.1, listener=threads
    )

    def claimed_by_extra(names: list[str]) -> set[int]:
        return {int(n.rsplit("-", 1)[1]) for n in names if n.startswith("pgtick-claim-")}

    with worker_thread(worker), db.connect() as conn:
        wait_for("the first 600 runs to complete", lambda: runs_in(conn, "COMPLETED") == 600, timeout=120)
        first = claimed_by_extra(threads.names)
        seen = len(threads.names)
        conn.execute(more)
        wait_for("the next 3,000 runs to complete", lambda: runs_in(conn, "COMPLETED") == 3600, timeout=180)
        after = claimed_by_extra(threads.names[seen:])
    assert worker.stats.completed == 3600 and worker.stats.fenced == 0, worker.stats
    assert first and max(first) < CAPPED_CLAIMERS, (
        f"{bound}: extra claimers {sorted(first)} claimed (at most {CAPPED_CLAIMERS - 1} may)"
    )
    assert max(after, default=0) >= CAPPED_CLAIMERS, (
        f"{free}: only extra claimers {sorted(after)} claimed, the bound was never lifted"
    )


def test_batches_of_capped_definitions_keep_at_most_capped_claimers_claims_in_flight(db: Database) -> None:
    """A claim holds the dispatch locks of the capped definitions it starts runs of until it
    commits, so while the claimed batches hold such runs only the claim loop and the first
    CAPPED_CLAIMERS - 1 extra claimers claim; a backlog of uncapped runs brings the rest back."""
    app = App()

    @app.job("step")
    def step(ctx: Context) -> None:
        time.sleep(0.002)

    with db.connect() as conn:
        capped = add_definition(conn, "roomy-cap", kind="step", cap=100_000)
        add_runs(conn, 600, kind="step", definition_id=capped)
    check_claimers_bounded_then_lifted(
        db, app, "SELECT jobs.enqueue('step') FROM generate_series(1, 3000)", "under caps", "without caps"
    )


@pytest.mark.parametrize(
    "limit",
    [
        "jobs.set_limit('queue', 'tight', max_running => 499)",
        # below 500 starts per period, so locked exclusively, and over the shortest period
        # jobs.set_limit takes, so it holds the 600 runs back for about a second at most
        "jobs.set_limit('kind', 'held', rate_limit => 499, rate_period => '1 second')",
        "jobs.set_limit('kind', 'held', max_running => 400, per_key => true)",
    ],
    ids=["queue-below-roomy", "kind-rate", "per-key"],
)
def test_batches_under_tight_limits_keep_at_most_capped_claimers_claims_in_flight(
    db: Database, limit: str
) -> None:
    """A tight limit's dispatch lock (below 500 running or 500 starts per period) is held by one claim
    at a time until it commits, as a capped definition's is: while the claimed batches hold
    runs under one, only the claim loop and the first CAPPED_CLAIMERS - 1 extra claimers
    claim. A roomy limit's lock is shared, so a backlog under one brings the rest back."""
    app = App()

    def step(ctx: Context) -> None:
        time.sleep(0.002)

    app.job("held")(step)
    app.job("free")(step)
    with db.connect() as conn:
        conn.execute(f"SELECT {limit}")
        conn.execute("SELECT jobs.set_limit('queue', 'roomy', max_running => 500)")
        conn.execute(
            "SELECT jobs.enqueue('held', queue => 'tight', concurrency_key => 'tenant-' || g % 7)"
            " FROM generate_series(1, 600) AS g"
        )
    check_claimers_bounded_then_lifted(
        db,
        app,
        "SELECT jobs.enqueue('free', queue => 'roomy') FROM generate_series(1, 3000)",
        f"under {limit}",
        "under a roomy limit",
    )


def test_a_worker_with_extra_claimers_stops_with_nothing_left_running(db: Database) -> None:
    """Stopped in the middle of a backlog, a worker with extra claimers finishes what its
    claims in flight took, completes it, and closes every connection it opened."""
    app = App()
    seen: list[int] = []

    @app.job("step")
    def step(ctx: Context) -> None:
        seen.append(ctx.run_id)
        time.sleep(0.01)

    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('step') FROM generate_series(1, 2000)")
        worker = Worker(app, db.dsn, concurrency=12, batch_size=3, claimers=3, poll_interval=0.1)
        with worker_thread(worker):
            wait_for("some runs to complete", lambda: runs_in(conn, "COMPLETED") >= 100, timeout=120)
        assert runs_in(conn, "RUNNING") == 0, "runs left RUNNING after the worker stopped"
        completed = runs_in(conn, "COMPLETED")
        assert completed < 2000, "the backlog was drained before the stop: nothing was tested"
        assert len(seen) == len(set(seen)) == completed, "executions and completions differ"

        def closed() -> bool:
            return not scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (f"pgtick-worker {worker.worker_id}",),
            )

        wait_for("the worker's connections to close", closed, timeout=60)


def test_a_stopping_worker_does_not_call_its_listener_lost_when_the_server_stops_too(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """`pgtick run` on the embedded server stops the server as soon as the worker has drained:
    the listener's connection then breaks while the worker is stopping, which is no outage to
    warn about. (The listener looks at the stop every second; a stop it saw before its
    connection broke proves nothing, so that case is tried again, up to three times.)"""
    app = App()
    app.job("idle")(lambda ctx: None)
    broken = 0
    with caplog.at_level(logging.WARNING, logger="pgtick"), db.connect() as conn:
        for _ in range(3):
            worker = Worker(app, db.dsn, listen=True, poll_interval=0.1)
            listener = f"pgtick-listen {worker.worker_id}"
            running = WorkerThread(worker)
            running.thread.start()
            try:
                wait_for(
                    "the listener to listen",
                    partial(
                        scalar,
                        conn,
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE application_name = %s AND query ILIKE 'LISTEN%%'",
                        (listener,),
                    ),
                    timeout=60,
                )
            finally:
                running.stop.set()
            broken += scalar(
                conn,
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (listener,),
            )
            running.thread.join(30)
            for t in threading.enumerate():
                if t.name == "pgtick-listen":
                    t.join(30)
            assert not running.raised, running.raised
            if broken:
                break
    assert broken, "in three tries the listener's connection was never there to break"
    assert "listener lost" not in caplog.text, caplog.text


@pytest.mark.parametrize("bad", [0, 17])
def test_claimers_out_of_range_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=f"claimers must be 1 to 16, got {bad}"):
        Worker(App(), "postgresql://unused", claimers=bad)


@pytest.mark.parametrize(
    ("count", "said"),
    [
        (0, "app 'kinds' registers no job kinds: a worker would have nothing to claim"),
        (1001, "app 'kinds' registers 1001 job kinds: a worker claims at most 1000 (jobs.claim's kinds)"),
    ],
)
def test_a_worker_for_no_kinds_or_more_than_a_claim_names_is_refused_up_front(count: int, said: str) -> None:
    """jobs.claim takes 1 to 1000 kind names: a worker that could only have its first claim
    refused (and stop on it) is refused when it is made, saying why."""
    app = App("kinds")
    for i in range(count):
        app.job(f"k{i}")(lambda ctx: None)
    with pytest.raises(UsageError) as refused:
        Worker(app, "postgresql://unused")
    assert str(refused.value).startswith(said), refused.value


@pytest.mark.parametrize("processes", ["1", "2"])
def test_pgtick_run_of_an_app_without_kinds_is_one_line(db: Database, tmp_path: Path, processes: str) -> None:
    """Its worker would have nothing to claim: one line and exit 2, before anything starts
    (with several processes too: not a line per child, restarted by the supervisor)."""
    app = tmp_path / "empty_app.py"
    app.write_text("from pgtick import App\n\napp = App('empty')\n")
    result = pgtick("run", str(app), "--dsn", db.dsn, "--processes", processes, timeout=120)
    shown = f"exit {result.returncode}\nstderr: {result.stderr!r}"
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, shown
    assert "app 'empty' registers no job kinds" in result.stderr and "--no-worker" in result.stderr, shown


def test_run_cancelled_while_waiting_for_a_slot_never_starts(db: Database) -> None:
    """A run claimed ahead whose cancel arrives before a slot frees is acknowledged as
    CANCELLED without its job code running."""
    app = App()
    release = threading.Event()
    started: list[int] = []

    @app.job("hold")
    def hold(ctx: Context) -> None:
        started.append(ctx.run_id)
        assert release.wait(60)

    with db.connect() as conn:
        first = conn.execute("SELECT id FROM jobs.enqueue('hold', priority => 1)").fetchone()
        second = conn.execute("SELECT id FROM jobs.enqueue('hold')").fetchone()
    assert first is not None and second is not None
    worker = Worker(app, db.dsn, concurrency=1, batch_size=2, poll_interval=0.1, heartbeat_interval=0.1)
    with worker_thread(worker), db.connect() as conn:
        try:
            wait_for("both runs to be claimed", lambda: runs_in(conn, "RUNNING") == 2, timeout=60)
            conn.execute("SELECT jobs.cancel(%s)", second)
            wait_for(  # (the claim commits before the worker holds what it returned)
                "the waiting run to be held and see its cancel",
                lambda: (held := worker.held().get(second[0])) is not None and held.cancel_requested,
                timeout=60,
            )
            release.set()

            def cancelled() -> bool:
                row = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", second).fetchone()
                return row == ("CANCELLED",)

            wait_for("the waiting run to be CANCELLED", cancelled, timeout=60)
        finally:
            release.set()
    assert started == [first[0]], f"job code ran for {started}; only {first[0]} should have started"


def test_a_completion_waiting_to_commit_does_not_hold_back_the_next_run(db: Database) -> None:
    """A finished run's slot is claimed for at once: while the commit of its completion
    waits (here on a row lock), the next queued run starts on that slot; the completion
    is reported once the lock goes, exactly once."""
    app = App()
    finish = threading.Event()
    second_ran = threading.Event()

    @app.job("first")
    def first(ctx: Context) -> None:
        assert finish.wait(60)

    @app.job("second")
    def second(ctx: Context) -> None:
        second_ran.set()

    with db.connect() as conn:
        held = conn.execute("SELECT id FROM jobs.enqueue('first')").fetchone()
    assert held is not None
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=30.0)
    with worker_thread(worker), db.connect() as conn, db.connect(autocommit=False) as locker:
        wait_for("the first run to start", lambda: runs_in(conn, "RUNNING") == 1, timeout=60)
        try:
            _hold_its_completion(conn, locker, held, finish)
            conn.execute("SELECT jobs.enqueue('second')")
            started = second_ran.wait(30)
            first_status = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", held)
        finally:
            locker.rollback()
        assert started, "the next run did not start while the first one's completion waited to commit"
        assert first_status == "RUNNING", f"the first run was {first_status} while its completion waited"
        wait_for("both runs to complete", lambda: runs_in(conn, "COMPLETED") == 2, timeout=60)
    assert worker.stats.completed == 2 and worker.stats.fenced == 0, worker.stats


def _one_waiting_run(db: Database) -> tuple[App, threading.Event, Sequence[Any]]:
    """An app whose one kind waits for ``finish``, and one run of it enqueued (its id row)."""
    app = App()
    finish = threading.Event()

    @app.job("first")
    def first(ctx: Context) -> None:
        assert finish.wait(60)

    with db.connect() as conn:
        held = conn.execute("SELECT id FROM jobs.enqueue('first')").fetchone()
    assert held is not None
    return app, finish, held


def test_a_finished_runs_completion_commits_while_the_claim_loop_waits_on_its_claim(db: Database) -> None:
    """A run counts against its caps and limits until its completion commits, so the
    completion goes as the run finishes, not with the claim loop's next cycle: here the claim
    loop's claim waits on a lock (the limits table locked by an open transaction), and the run
    that finished meanwhile is COMPLETED while that claim still waits."""
    app, finish, held = _one_waiting_run(db)
    claim_waits = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database()"
        " AND application_name LIKE 'pgtick-worker %%' AND wait_event_type = 'Lock'"
    )
    worker = Worker(app, db.dsn, concurrency=2, poll_interval=0.1, heartbeat_interval=30.0)
    with worker_thread(worker), db.connect() as conn, db.connect(autocommit=False) as locker:
        wait_for("the run to start", lambda: runs_in(conn, "RUNNING") == 1, timeout=60)
        try:
            locker.execute("LOCK TABLE jobs.limits IN ACCESS EXCLUSIVE MODE")
            # A slot is free and the poll is short: the claim loop's next claim waits.
            wait_for("the claim loop's claim to wait on the lock", lambda: scalar(conn, claim_waits) == 1, 60)
            finish.set()
            status = "SELECT status::text FROM jobs.runs WHERE id = %s"
            wait_for("the finished run to complete", lambda: scalar(conn, status, held) == "COMPLETED", 60)
            still_waiting = scalar(conn, claim_waits)
        finally:
            locker.rollback()
        assert still_waiting == 1, "the claim stopped waiting before the completion was seen (no proof)"
    assert worker.stats.completed == 1 and worker.stats.fenced == 0, worker.stats


def _hold_its_completion(conn: Conn, locker: Conn, run_id: Sequence[Any], finish: threading.Event) -> None:
    """Lock the run's row in locker's open transaction, let its job return, and wait until the
    worker's completion of it waits on that lock."""
    locker.execute("SELECT 1 FROM jobs.runs WHERE id = %s FOR UPDATE", run_id)
    finish.set()
    waiting = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database()"
        " AND application_name LIKE 'pgtick-complete %%' AND wait_event_type = 'Lock'"
    )
    wait_for("the completion to wait on the lock", lambda: scalar(conn, waiting) == 1, timeout=60)


def _idle_worker(db: Database, started: list[str]) -> Worker:
    """A worker whose poll is far longer than any test: only its timer or a NOTIFY starts runs."""
    app = App()

    @app.job("timed")
    def timed(ctx: Context) -> None:
        started.append(ctx.payload.get("name", ""))

    return Worker(app, db.dsn, poll_interval=600.0)


def test_an_idle_worker_wakes_for_a_future_run_without_polling(db: Database) -> None:
    """The worker learns when the next QUEUED run is due and sleeps until then: a run
    enqueued for a few seconds ahead starts although the poll interval is ten minutes."""
    started: list[str] = []
    worker = _idle_worker(db, started)
    with worker_thread(worker) as running, db.connect() as conn:
        wait_for("the worker to be idle", lambda: worker.stats.claimed == 0 and running.thread.is_alive(), 60)
        time.sleep(0.5)  # past its first claim: now asleep on the ten-minute poll
        conn.execute("SELECT jobs.enqueue('timed', '{\"name\": \"later\"}', now() + interval '2 seconds')")
        wait_for("the future run to start on its timer", lambda: started == ["later"], timeout=120)
        late = conn.execute("SELECT started_at >= scheduled_for FROM jobs.runs").fetchone()
        assert late == (True,), "a run must never start before its time"


class _ClaimCounter:
    """A worker listener that counts the claims sent (one that took nothing too)."""

    def __init__(self) -> None:
        self.claims = 0

    def on_claim(self, kinds: list[str], seconds: float) -> None:
        self.claims += 1

    def on_started(self, kind: str, definition_id: int | None, lateness: float) -> None: ...

    def on_outcome(self, kind: str, outcome: Any) -> None: ...

    def on_heartbeat_failure(self) -> None: ...


def _completed_at_least(conn: Conn, n: int) -> bool:
    return runs_in(conn, "COMPLETED") >= n


def test_runs_that_trickle_in_are_claimed_once_each(db: Database) -> None:
    """Runs queued one at a time, each after the last completed, to an idle worker with free
    slots: each NOTIFY brings one claim. A finished run's slot is not claimed for again (that
    claim found every run there was, and a new run signals), nor is the completion's answer."""
    app = App()

    @app.job("trickle")
    def trickle(ctx: Context) -> None:
        pass

    counter = _ClaimCounter()
    worker = Worker(app, db.dsn, concurrency=10, poll_interval=600.0, listener=counter)
    with worker_thread(worker) as running, db.connect() as conn:
        wait_for("the first claim", lambda: counter.claims >= 1 and running.thread.is_alive(), 60)
        before = counter.claims
        for n in range(1, 21):
            conn.execute("SELECT jobs.enqueue('trickle')")
            wait_for(f"run {n} to complete", partial(_completed_at_least, conn, n), timeout=60)
        wait_for("the last completion to be settled", lambda: worker.stats.completed == 20, timeout=60)
        claims = counter.claims - before
    # One claim per run; a few more where a NOTIFY came while a claim was in flight. Waking for
    # each finished run's slot and again for its completion's answer made it three per run.
    assert claims <= 25, f"{claims} claims for 20 runs that came one at a time"


def test_a_run_queued_while_no_slot_is_free_starts_when_one_frees(db: Database) -> None:
    """Its NOTIFY finds no free slot; the slot that frees is claimed for at once, not at the
    next poll (ten minutes here)."""
    app = App()
    release = threading.Event()
    started: list[str] = []

    @app.job("hold")
    def hold(ctx: Context) -> None:
        started.append(ctx.payload["name"])
        if ctx.payload["name"] == "first":
            assert release.wait(120)

    worker = Worker(app, db.dsn, concurrency=1, poll_interval=600.0)
    with worker_thread(worker), db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('hold', '{\"name\": \"first\"}')")
        wait_for("the first run to start", lambda: started == ["first"], timeout=60)
        conn.execute("SELECT jobs.enqueue('hold', '{\"name\": \"second\"}')")
        time.sleep(0.5)  # its NOTIFY came while the only slot was taken
        release.set()
        wait_for("the second run to start", lambda: started == ["first", "second"], timeout=60)


def test_a_run_queued_before_the_listener_listens_starts_without_waiting_for_the_poll(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener connects beside the claim loop: a run queued after the first claim came back
    empty and before the LISTEN took notified no one here. Once listening, the worker claims
    again at once, not at the next poll (ten minutes here)."""
    app = _no_op_app("early")
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=600.0)
    listen = calls.listen

    def late(conn: Any) -> None:
        wait_for("the first claim to come back empty", lambda: worker._claimed_none, timeout=60)
        with db.connect() as other:
            other.execute("SELECT jobs.enqueue('early')")  # its NOTIFY: nobody listens yet
        listen(conn)

    monkeypatch.setattr(calls, "listen", late)
    with worker_thread(worker), db.connect() as conn:
        wait_for("the run to complete", partial(_completed_at_least, conn, 1), timeout=60)


def _no_op_app(kind: str) -> App:
    """An app with one job of ``kind`` that does nothing."""
    app = App()
    app.job(kind)(lambda ctx: None)
    return app


def test_runs_a_roomy_limit_holds_back_start_as_completions_make_room(db: Database) -> None:
    """A kind limit of 500 running (roomy: claimers lock it shared) with 499 of its runs RUNNING
    on another worker: each claim starts one run and comes back short, and each completion
    makes room for the next run, which is claimed for at once, not at the next poll (ten
    minutes here)."""
    app = _no_op_app("roomy")
    with db.connect() as conn:
        conn.execute("SELECT jobs.set_limit('kind', 'roomy', max_running => 500)")
        conn.execute("INSERT INTO jobs.runs (kind) SELECT 'roomy' FROM generate_series(1, 499)")
        while runs_in(conn, "RUNNING") < 499:  # a roomy limit's claimer starts at most 20 of its runs
            conn.execute("SELECT count(*) FROM jobs.claim(20, 'elsewhere')")
        conn.execute("SELECT jobs.enqueue('roomy') FROM generate_series(1, 10)")
        worker = Worker(app, db.dsn, concurrency=5, poll_interval=600.0)
        with worker_thread(worker):
            wait_for("the ten runs to complete", partial(_completed_at_least, conn, 10), timeout=60)
        most = scalar(
            conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'roomy' AND status IN ('RUNNING', 'COMPLETED')"
        )
    assert most == 509, f"{most} runs of the kind started, past its limit or short of the ten"
    assert worker.stats.completed == 10, worker.stats


def test_a_worker_stopped_while_a_completion_waits_to_commit_reports_it_once(db: Database) -> None:
    """Stopping while a finished run's completion waits to commit (here on a row lock): the
    worker stays within its grace period until the database answers, then counts the run
    completed once and stops."""
    app, finish, held = _one_waiting_run(db)
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, heartbeat_interval=30.0)
    running = WorkerThread(worker)
    running.thread.start()
    try:
        with db.connect() as conn, db.connect(autocommit=False) as locker:
            wait_for("the run to start", lambda: runs_in(conn, "RUNNING") == 1, timeout=60)
            try:
                _hold_its_completion(conn, locker, held, finish)
                running.stop.set()
                time.sleep(0.5)  # the worker is draining now
                alive = running.thread.is_alive()
            finally:
                locker.rollback()
            assert alive, "the worker stopped before its completion was answered"
            running.thread.join(60)
            assert not running.thread.is_alive(), "the worker did not stop once the completion was answered"
            status = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", held)
    finally:
        finish.set()
        running.finish(60)
    assert not running.raised, running.raised
    assert status == "COMPLETED", status
    assert worker.stats.completed == 1 and worker.stats.fenced == 0, worker.stats


def test_a_worker_done_with_a_burst_wakes_for_the_next_future_run(db: Database) -> None:
    """While its claims come back full the worker does not ask when the next run is due;
    the claim that comes back short asks, so after a burst it still sleeps until the next
    future run (the poll is ten minutes, notifications are off)."""
    started: list[str] = []
    app = App()

    @app.job("timed")
    def timed(ctx: Context) -> None:
        started.append(ctx.payload.get("name", ""))

    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('timed', '{\"name\": \"now\"}') FROM generate_series(1, 5)")
        conn.execute("SELECT jobs.enqueue('timed', '{\"name\": \"later\"}', now() + interval '3 seconds')")
    # One slot: every claim but the last comes back full, and the last one comes back empty.
    worker = Worker(app, db.dsn, concurrency=1, poll_interval=600.0, listen=False)
    with worker_thread(worker), db.connect() as conn:
        wait_for("the burst and the future run to start", lambda: len(started) == 6, timeout=120)
        assert started[-1] == "later", started
        ok = conn.execute("SELECT bool_and(started_at >= scheduled_for) FROM jobs.runs").fetchone()
        assert ok == (True,), "a run must never start before its time"


def test_a_scheduler_notification_rearms_a_sleeping_worker(db: Database) -> None:
    """A run the scheduler materializes for a few seconds ahead arrives with its time in the
    NOTIFY payload: the sleeping worker re-arms its timer and starts it then."""
    started: list[str] = []
    with worker_thread(_idle_worker(db, started)), db.connect() as conn:
        definition = conn.execute(
            "SELECT id FROM jobs.define('ahead', 'timed', schedule => '* * * * *',"
            ' payload => \'{"name": "ahead"}\')'
        ).fetchone()
        assert definition is not None
        time.sleep(0.5)
        at = conn.execute("SELECT date_trunc('second', now()) + interval '3 seconds'").fetchone()
        assert at is not None
        conn.execute(
            "SELECT * FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
            ([definition[0]], [None], [at[0] + timedelta(minutes=1)], [None], [definition[0]], [at[0]]),
        )
        wait_for("the materialized run to start on its re-armed timer", lambda: started == ["ahead"], 120)
        ok = conn.execute("SELECT started_at >= scheduled_for FROM jobs.runs").fetchone()
        assert ok == (True,)


def _break_heartbeats(worker: Worker) -> None:
    """Make the worker's heartbeat loop die at once (its cadence raises)."""

    def broken() -> float:
        raise RuntimeError("no cadence")

    worker.heartbeat_interval = broken  # type: ignore[method-assign]
    worker._heartbeat.now.set()


def test_heartbeat_loop_that_dies_stops_the_worker_and_fails_what_it_holds(db: Database) -> None:
    """Without heartbeats the worker cannot go on: it stops, says why, and fails the runs it
    holds (the one waiting for a slot at once, the running one after the grace period)
    rather than leaving them RUNNING until the reaper finds them."""
    app = App()
    release = threading.Event()
    started = threading.Event()

    @app.job("hold")
    def hold(ctx: Context) -> None:
        started.set()
        release.wait(30)

    worker = Worker(app, db.dsn, concurrency=1, batch_size=2, poll_interval=0.1, shutdown_grace=1.0)
    with db.connect() as conn:
        ids = [scalar(conn, "SELECT id FROM jobs.enqueue('hold')") for _ in range(2)]
    with worker_thread(worker, may_raise=True) as running, db.connect() as conn:
        try:
            assert started.wait(10), "the first run never started"
            wait_for("both runs claimed", lambda: len(worker.held()) == 2, timeout=10)
            _break_heartbeats(worker)
            running.thread.join(timeout=30)
            runs = conn.execute(
                "SELECT id, status::text, failure_reason, error FROM jobs.runs ORDER BY id"
            ).fetchall()
        finally:
            release.set()
    raised = running.raised
    context = f"raised {raised!r}, runs {runs}"
    assert not running.thread.is_alive() and running.stop.is_set(), context
    assert len(raised) == 1 and "the heartbeat loop ended: RuntimeError: no cadence" in str(raised[0]), (
        context
    )
    assert [r[0] for r in runs] == ids, context
    for _, status, reason, error in runs:
        assert (status, reason) == ("FAILED", "Error"), context
        assert error.startswith("the worker stopped on an internal error: RuntimeError: the heartbeat"), (
            context
        )


def test_job_code_sees_the_occurrence_its_run_is_for(db: Database) -> None:
    """A scheduled run delayed by its definition's jitter starts after its occurrence; the job
    gets the occurrence itself (ctx.occurrence_at) beside when the run was due; an ad-hoc run
    has none."""
    app = App()
    seen: dict[int, tuple[object, object]] = {}

    @app.job("report")
    def report(ctx: Context) -> None:
        seen[ctx.run_id] = (ctx.occurrence_at, ctx.scheduled_for)

    with db.connect() as conn:
        definition_id = scalar(
            conn, "SELECT id FROM jobs.define('hourly', 'report', '0 * * * *', jitter => '30 minutes')"
        )
        occurrence = scalar(conn, "SELECT date_trunc('hour', now()) - interval '1 hour'")
        materialize_occurrences(conn, definition_id, [occurrence], occurrence + timedelta(hours=1))
        scheduled = scalar(conn, "SELECT id FROM jobs.runs WHERE definition_id = %s", (definition_id,))
        due = scalar(conn, "SELECT scheduled_for FROM jobs.runs WHERE id = %s", (scheduled,))
        ad_hoc = scalar(conn, "SELECT id FROM jobs.enqueue('report')")
    with worker_thread(Worker(app, db.dsn, poll_interval=0.1)), db.connect() as conn:
        wait_for("both runs to complete", lambda: runs_in(conn, "COMPLETED") == 2, timeout=60)
    assert seen[scheduled] == (occurrence, due), f"occurrence {occurrence}, due {due}: job saw {seen}"
    assert seen[ad_hoc][0] is None, seen


def test_a_worker_with_extra_claimers_that_cannot_go_on_fails_every_run_it_claimed(db: Database) -> None:
    """The same stop with three claim connections: every run any of them claimed ends
    FAILED, none is left RUNNING, and what nobody claimed stays QUEUED."""
    app = App()
    release = threading.Event()

    @app.job("hold")
    def hold(ctx: Context) -> None:
        release.wait(30)

    worker = Worker(
        app, db.dsn, concurrency=6, batch_size=2, claimers=3, poll_interval=0.1, shutdown_grace=1.0
    )
    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('hold') FROM generate_series(1, 12)")
    with worker_thread(worker, may_raise=True) as running, db.connect() as conn:
        try:
            wait_for("six runs claimed", lambda: len(worker.held()) == 6, timeout=30)
            _break_heartbeats(worker)
            running.thread.join(timeout=60)
            counts = dict(conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall())
        finally:
            release.set()
    assert not running.thread.is_alive() and len(running.raised) == 1, running.raised
    assert counts == {"FAILED": 6, "QUEUED": 6}, counts


def test_the_timer_for_the_next_due_run_counts_from_the_question_not_the_answer(db: Database) -> None:
    """jobs.next_due is asked in the round trip of a claim, and answered with it: when that
    claim takes 2 s (a trigger of the operator's that sleeps), the next run still starts at
    its time, not 2 s late. The poll interval (30 s) and LISTEN are out of the way."""
    app = App()
    release = threading.Event()

    @app.job("slow-to-claim")
    def slow_to_claim(ctx: Context) -> None:
        release.wait(60)  # holds its slot: its completion would make the worker ask again

    @app.job("on-time")
    def on_time(ctx: Context) -> None:
        pass

    with db.connect() as conn:
        conn.execute(
            """
            CREATE FUNCTION public.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_catalog.pg_sleep(2);
                RETURN NEW;
            END
            $$;
            CREATE TRIGGER slow_claim BEFORE UPDATE OF status ON jobs.runs FOR EACH ROW
            WHEN (new.kind = 'slow-to-claim' AND new.status = 'RUNNING')
            EXECUTE FUNCTION public.slow_claim();
            """
        )
        conn.execute("SELECT jobs.enqueue('slow-to-claim')")
        conn.execute("SELECT jobs.enqueue('on-time', run_at => now() + interval '10 seconds')")
    worker = Worker(app, db.dsn, concurrency=4, batch_size=4, poll_interval=30.0, listen=False)
    with worker_thread(worker), db.connect() as conn:
        try:
            wait_for("the on-time run to complete", lambda: runs_in(conn, "COMPLETED") == 1, timeout=40)
        finally:
            release.set()  # before the worker stops: it waits for its running jobs
        row = conn.execute(
            """
            SELECT (SELECT started_at FROM jobs.runs WHERE kind = 'slow-to-claim')
                   + interval '2 seconds' AS claim_ended,
                   scheduled_for AS due,
                   extract(epoch FROM started_at - scheduled_for) AS late
              FROM jobs.runs WHERE kind = 'on-time'
            """
        ).fetchone()
    assert row is not None
    claim_ended, due, late = row
    assert claim_ended < due, "the slow claim ran past the next run's time: nothing was measured"
    assert late < 1.0, f"the on-time run started {late:.3f} s after its time"


def test_a_worker_whose_own_runs_fill_a_limit_claims_again_when_they_complete(db: Database) -> None:
    """A kind limited to one running run, four due, a poll interval of 30 s: each claim after
    a run finishes takes nothing (the finished run counts until its completion commits), and
    the completion committing makes the worker claim again, not the next poll."""
    app = _no_op_app("one-at-a-time")
    with db.connect() as conn:
        conn.execute("SELECT jobs.set_limit('kind', 'one-at-a-time', max_running => 1)")
        conn.execute("SELECT jobs.enqueue('one-at-a-time') FROM generate_series(1, 4)")
    worker = Worker(app, db.dsn, concurrency=4, poll_interval=30.0, listen=False)
    with worker_thread(worker), db.connect() as conn:
        wait_for("all four runs to complete", lambda: runs_in(conn, "COMPLETED") == 4, timeout=25)


def test_a_worker_whose_completion_waits_to_commit_stops_claiming_at_its_bound(db: Database) -> None:
    """Finished runs waiting for their completion to be sent free their slots only up to
    ``max_unreported`` of them: while one completion waits to commit (here on a row lock), a
    worker holds at most capacity + max_unreported runs and leaves the rest of the queue QUEUED
    for others, instead of claiming it all. Once the lock goes, every run completes once."""
    app, finish, held = _one_waiting_run(db)
    ran: list[int] = []

    @app.job("quick")
    def quick(ctx: Context) -> None:
        ran.append(ctx.run_id)

    worker = Worker(app, db.dsn, concurrency=2, poll_interval=0.1, heartbeat_interval=30.0)
    bound = worker.capacity + worker.max_unreported
    most = 0
    with worker_thread(worker), db.connect() as conn, db.connect(autocommit=False) as locker:
        wait_for("the first run to start", lambda: runs_in(conn, "RUNNING") == 1, timeout=60)
        try:
            _hold_its_completion(conn, locker, held, finish)
            conn.execute("SELECT jobs.enqueue('quick') FROM generate_series(1, 50)")
            wait_for(f"{bound - 1} quick runs to run", lambda: len(ran) >= bound - 1, timeout=60)
            # Past the bound the worker claims nothing more: watch it for a while (many polls).
            watch_until = time.monotonic() + 2.0
            while time.monotonic() < watch_until:
                most = max(most, len(worker.held()), runs_in(conn, "RUNNING"))
                time.sleep(0.05)
            queued = runs_in(conn, "QUEUED")
        finally:
            locker.rollback()
        assert most <= bound, f"{most} runs held at once by a worker bounded at {bound}"
        assert queued == 50 - (bound - 1), f"{queued} runs left QUEUED, ran {sorted(ran)}"
        wait_for("all 51 runs to complete", lambda: runs_in(conn, "COMPLETED") == 51, timeout=120)
    assert sorted(ran) == sorted(set(ran)) and len(ran) == 50, ran
    assert worker.stats.completed == 51 and worker.stats.fenced == 0, worker.stats


def test_a_locked_run_does_not_hold_up_the_heartbeat_of_the_workers_other_runs(db: Database) -> None:
    """An application's transaction that cancelled one of a worker's runs and stays open holds
    that run's row: the worker's heartbeats go on stamping its other run meanwhile (the locked
    one is skipped, not waited for), the locked run is not taken for lost, and once the
    transaction commits it is cancelled at its checkpoint while the other completes."""
    app = App()
    finish = threading.Event()
    abandoned: list[int] = []

    @app.job("long")
    def long(ctx: Context) -> None:
        while not finish.is_set():
            if ctx.abandoned:
                abandoned.append(ctx.run_id)
                return
            ctx.checkpoint()
            time.sleep(0.05)

    with db.connect() as conn:
        enqueue = "SELECT id FROM jobs.enqueue('long', heartbeat_timeout => '1 hour')"
        locked, other = (scalar(conn, enqueue) for _ in range(2))
    worker = Worker(app, db.dsn, concurrency=2, poll_interval=0.1, heartbeat_interval=0.2)
    beat = "SELECT heartbeat_at FROM jobs.runs WHERE id = %s"
    with worker_thread(worker), db.connect() as conn, db.connect(autocommit=False) as app_tx:
        wait_for("both runs to start", lambda: runs_in(conn, "RUNNING") == 2, timeout=60)
        try:
            app_tx.execute("SELECT jobs.cancel(%s)", (locked,))
            since = scalar(conn, "SELECT now()")
            for n in (1, 2):  # two heartbeats after the lock was taken
                wait_for(
                    f"heartbeat {n} of run {other} while run {locked} is locked",
                    partial(lambda after: scalar(conn, beat, (other,)) > after, since),
                    timeout=60,
                )
                since = scalar(conn, beat, (other,))
            locked_beat = scalar(conn, beat, (locked,))
            assert locked_beat < since, f"run {locked} stamped through another transaction's lock"
        finally:
            app_tx.commit()
        status = "SELECT status::text FROM jobs.runs WHERE id = %s"
        wait_for(f"run {locked} to be cancelled", lambda: scalar(conn, status, (locked,)) == "CANCELLED", 60)
        finish.set()
        wait_for(f"run {other} to complete", lambda: scalar(conn, status, (other,)) == "COMPLETED", 60)
    assert abandoned == [], f"runs taken for lost while only locked: {abandoned}"
    assert worker.stats.fenced == 0, worker.stats


_PICKY_TRIGGERS = {
    code: "CREATE TRIGGER no_picky BEFORE UPDATE ON jobs.runs"
    f" FOR EACH ROW EXECUTE FUNCTION public.no_picky('{code}')"
    for code in ("check_violation", "raise_exception")
}


@pytest.mark.parametrize("errcode", sorted(_PICKY_TRIGGERS))
def test_a_completion_refused_by_the_database_fails_only_its_run(db: Database, errcode: str) -> None:
    """jobs.complete_many is all or nothing: when an operator's trigger refuses one run's
    completion (with a constraint's SQLSTATE, or a plain RAISE EXCEPTION: P0001), the batch
    is sent again one run at a time, so only that run fails (saying why) while its batch
    neighbour completes, and the worker goes on claiming."""
    app, finish, held = _one_waiting_run(db)
    ran: list[str] = []

    @app.job("picky")
    def picky(ctx: Context) -> None:
        ran.append("picky")

    @app.job("fine")
    def fine(ctx: Context) -> None:
        ran.append("fine")

    with db.connect() as conn:
        conn.execute("""
            CREATE FUNCTION public.no_picky() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'COMPLETED' AND NEW.kind = 'picky' THEN
                    RAISE EXCEPTION 'picky runs may not complete' USING ERRCODE = TG_ARGV[0];
                END IF;
                RETURN NEW;
            END $$;
        """)
        conn.execute(_PICKY_TRIGGERS[errcode])
    worker = Worker(app, db.dsn, concurrency=3, poll_interval=0.1, heartbeat_interval=30.0)
    with worker_thread(worker), db.connect() as conn, db.connect(autocommit=False) as locker:
        wait_for("the first run to start", lambda: runs_in(conn, "RUNNING") == 1, timeout=60)
        try:  # the two finish while a completion is in flight: they go in one batch
            _hold_its_completion(conn, locker, held, finish)
            ids = [scalar(conn, "SELECT id FROM jobs.enqueue(%s)", (kind,)) for kind in ("picky", "fine")]
            wait_for("both jobs to run", lambda: len(ran) == 2, timeout=60)
        finally:
            locker.rollback()
        wait_for("all three runs to end", lambda: runs_in(conn, "RUNNING") + runs_in(conn, "QUEUED") == 0, 60)
        after = scalar(conn, "SELECT id FROM jobs.enqueue('fine')")
        wait_for("a later run to complete", lambda: runs_in(conn, "COMPLETED") == 3, timeout=60)
        runs = conn.execute(
            "SELECT id, status::text, error FROM jobs.runs WHERE id = ANY(%s) ORDER BY id", ([*ids, after],)
        ).fetchall()
    assert runs == [
        (ids[0], "FAILED", "the completion could not be stored: picky runs may not complete"),
        (ids[1], "COMPLETED", None),
        (after, "COMPLETED", None),
    ], runs


def test_a_run_claimed_ahead_and_asked_to_cancel_is_cancelled_while_every_thread_is_held_by_a_hung_job(
    db: Database,
) -> None:
    """A run waiting for a slot that is asked to cancel would be cancelled by the thread that
    takes it; while every thread is held by a hung job none will, so the worker cancels it
    itself rather than keep it RUNNING, heartbeated, until a thread comes back."""
    app = App()
    release = threading.Event()
    ran: list[int] = []

    @app.job("hang", timeout=8)
    def hang(ctx: Context) -> None:
        release.wait(120)  # no checkpoint

    @app.job("quick")
    def quick(ctx: Context) -> None:
        ran.append(ctx.run_id)

    with db.connect() as conn:
        hung = scalar(conn, "SELECT id FROM jobs.enqueue('hang', priority => 10)")
        waiting = scalar(conn, "SELECT id FROM jobs.enqueue('quick')")
    stuck = Worker(app, db.dsn, concurrency=1, batch_size=2, poll_interval=0.1, heartbeat_interval=0.5)
    status = "SELECT status::text FROM jobs.runs WHERE id = %s"
    try:
        with worker_thread(stuck), db.connect() as conn:
            wait_for("both runs claimed", lambda: len(stuck.held()) == 2, timeout=60)
            conn.execute("SELECT jobs.cancel(%s)", (waiting,))
            wait_for(
                "the worker to see the cancel request",
                lambda: (ctx := stuck.held().get(waiting)) is not None and ctx.cancel_requested,
                timeout=60,
            )
            assert scalar(conn, status, (hung,)) == "RUNNING", "the hang timed out before the test began"
            wait_for(
                f"run {waiting} to be cancelled", lambda: scalar(conn, status, (waiting,)) == "CANCELLED", 60
            )
            wait_for(f"run {hung} to have timed out", lambda: scalar(conn, status, (hung,)) == "FAILED", 60)
            release.set()
            wait_for("the worker to let its runs go", lambda: not stuck.held(), timeout=60)
            later = scalar(conn, "SELECT id FROM jobs.enqueue('quick')")
            wait_for(f"run {later} to complete", lambda: scalar(conn, status, (later,)) == "COMPLETED", 60)
    finally:
        release.set()
    assert ran == [later], f"the cancelled run ran: {ran}"


def test_runs_claimed_ahead_go_back_to_the_queue_when_every_thread_is_held_by_a_hung_job(
    db: Database,
) -> None:
    """A job past its kind's timeout that never reaches a checkpoint is failed by its worker,
    but keeps its thread: with every thread so held, the runs claimed ahead of a slot go back
    to the queue (same attempt) and another worker runs them; the stuck worker claims nothing
    until its thread returns, then works again."""
    app = App()
    release = threading.Event()
    ran: dict[int, str] = {}

    @app.job("hang", timeout=1)
    def hang(ctx: Context) -> None:
        release.wait(120)  # no checkpoint

    @app.job("quick")
    def quick(ctx: Context) -> None:
        ran[ctx.run_id] = ctx.worker_id

    with db.connect() as conn:
        hung = scalar(conn, "SELECT id FROM jobs.enqueue('hang', priority => 10)")
        ahead = [scalar(conn, "SELECT id FROM jobs.enqueue('quick')") for _ in range(2)]
    stuck = Worker(app, db.dsn, concurrency=1, batch_size=3, poll_interval=0.1, heartbeat_interval=0.5)
    other = Worker(app, db.dsn, concurrency=1, poll_interval=0.1)
    status = "SELECT status::text FROM jobs.runs WHERE id = %s"
    try:
        with worker_thread(stuck), db.connect() as conn:
            wait_for("all three runs claimed", lambda: len(stuck.held()) == 3, timeout=60)
            wait_for(f"run {hung} to time out", lambda: scalar(conn, status, (hung,)) == "FAILED", timeout=60)
            with worker_thread(other):
                wait_for(
                    f"runs {ahead} to be run by the other worker",
                    lambda: sorted(r for r, w in ran.items() if w == other.worker_id) == ahead,
                    timeout=60,
                )
            assert sorted(stuck.held()) == [hung], stuck.held()
            release.set()
            wait_for("the stuck worker to let its run go", lambda: not stuck.held(), timeout=60)
            later = scalar(conn, "SELECT id FROM jobs.enqueue('quick')")
            wait_for(
                f"run {later} to run on the worker that was stuck and complete",
                lambda: later in ran and scalar(conn, status, (later,)) == "COMPLETED",
                timeout=60,
            )
            runs = conn.execute(
                "SELECT id, status::text, failure_reason, attempt FROM jobs.runs"
                " WHERE id = ANY(%s) ORDER BY id",
                ([hung, *ahead, later],),
            ).fetchall()
    finally:
        release.set()
    assert runs == [
        (hung, "FAILED", "Timeout", 1),
        (ahead[0], "COMPLETED", None, 1),
        (ahead[1], "COMPLETED", None, 1),
        (later, "COMPLETED", None, 1),
    ], runs
    assert ran[later] == stuck.worker_id, ran


@pytest.mark.parametrize("answer", ["handed-back", "call-cut"])
def test_a_run_handed_back_at_stop_is_not_also_counted_abandoned(
    db: Database, caplog: pytest.LogCaptureFixture, answer: str
) -> None:
    """A stopping worker hands back the runs claimed ahead that have not begun. A job thread
    that comes free while that hand back waits for the database (here on a row lock) takes
    those runs from its queue and lets them be: each run is counted and logged once, as
    handed back when the call answers, as abandoned when it fails (its session ended), never
    both."""
    app = App()
    started, release = threading.Event(), threading.Event()

    @app.job("hold")
    def hold(ctx: Context) -> None:
        started.set()
        release.wait(120)

    @app.job("quick")
    def quick(ctx: Context) -> None:
        pass

    with db.connect() as conn:
        first = scalar(conn, "SELECT id FROM jobs.enqueue('hold', priority => 10)")
        ahead = [r[0] for r in conn.execute("SELECT (jobs.enqueue('quick')).id FROM generate_series(1, 2)")]
    worker = Worker(app, db.dsn, concurrency=1, batch_size=3, poll_interval=0.1, heartbeat_interval=30.0)
    running = WorkerThread(worker)
    unclaim = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%unclaim%'"
    with caplog.at_level(logging.INFO), db.connect() as conn, db.connect(autocommit=False) as locker:
        running.thread.start()
        try:
            wait_for("all three runs claimed", lambda: len(worker.held()) == 3, timeout=60)
            assert started.wait(60), "the first run never began"
            locker.execute("SELECT 1 FROM jobs.runs WHERE id = %s FOR UPDATE", (ahead[-1],))
            running.stop.set()
            pid = wait_for("the hand back to wait for the locked run", lambda: scalar(conn, unclaim), 60)
            release.set()  # the job thread comes free and takes the runs waiting in its queue
            wait_for("the job thread to take the waiting runs", worker._tasks.empty, timeout=60)
            if answer == "call-cut":
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            locker.rollback()
            running.thread.join(60)
        finally:
            release.set()
            locker.rollback()
            running.finish(60)
        runs = conn.execute(
            "SELECT id, status::text, attempt, worker FROM jobs.runs WHERE id = ANY(%s) ORDER BY id",
            ([first, *ahead],),
        ).fetchall()
    lines = [r.getMessage() for r in caplog.records]
    abandoned = [line for line in lines if "status=ABANDONED" in line]
    handed = [line for line in lines if "handed back runs=" in line]
    context = f"runs {runs}; stats {worker.stats}\n" + "\n".join(lines)
    assert not running.raised, running.raised
    assert runs[0] == (first, "COMPLETED", 1, worker.worker_id), context
    if answer == "handed-back":
        assert runs[1:] == [(r, "QUEUED", 1, None) for r in ahead], context
        assert handed and all(",".join(map(str, ahead)) in line for line in handed), context
        assert abandoned == [] and worker.stats.abandoned == 0, f"handed back and abandoned: {context}"
    else:  # still RUNNING for the worker: the reaper ends them
        assert runs[1:] == [(r, "RUNNING", 1, worker.worker_id) for r in ahead], context
        assert handed == [], context
        assert [sum(f"run={r} " in line for line in abandoned) for r in ahead] == [1, 1], context
        assert worker.stats.abandoned == 2, context
