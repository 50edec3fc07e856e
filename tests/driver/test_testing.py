"""pgtick.testing used the way an application's own test suite uses it: opt into the plugin,
enqueue, run the due jobs inline, look at the outcomes. The first test is the README's example."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgtick import App, Context

if TYPE_CHECKING:  # imported by the plugin below; importing it here first would skip assert rewriting
    from pgtick.testing import JobsTester

pytest_plugins = ["pgtick.testing"]

app = App("shop")
sent: list[int] = []


@app.job("send-receipt", retry_on=[ConnectionError], max_attempts=2, backoff=60)
def send_receipt(ctx: Context) -> dict[str, int]:
    if ctx.payload.get("smtp_down"):
        raise ConnectionError("smtp server did not answer")
    sent.append(ctx.payload["order"])
    app.enqueue("log-receipt", {"order": ctx.payload["order"]})
    return {"order": ctx.payload["order"]}


@app.job("log-receipt")
async def log_receipt(ctx: Context) -> str:
    return f"logged {ctx.payload['order']}"


def test_a_receipt_is_sent_once_the_job_runs(pgtick_jobs: JobsTester) -> None:
    pgtick_jobs.enqueue("send-receipt", {"order": 42})
    assert sent == []  # enqueued, not run yet

    receipt, log_entry = pgtick_jobs.run_due(app)

    assert receipt.status == "COMPLETED"
    assert receipt.run.result == {"order": 42}
    assert sent == [42]
    assert (log_entry.run.kind, log_entry.result) == ("log-receipt", "logged 42")


def test_a_failure_is_retried_by_the_apps_policy(pgtick_jobs: JobsTester) -> None:
    pgtick_jobs.enqueue("send-receipt", {"order": 7, "smtp_down": True})

    [first] = pgtick_jobs.run_due(app)
    assert (first.status, first.error) == ("FAILED", "ConnectionError: smtp server did not answer")
    assert first.retry is not None and first.retry.attempt == 2
    assert pgtick_jobs.run_due(app) == [], "the retry ran before its backoff"

    [second] = pgtick_jobs.run_due(app, include_future=True)
    assert (second.run.id, second.status) == (first.retry.id, "FAILED")
    assert second.retry is None, "max_attempts=2 allows no third attempt"


@app.job("odd-result")
def odd_result(ctx: Context) -> object:
    return {"ratio": float("nan")} if ctx.payload.get("nan") else {"when": object()}


def test_a_result_that_is_not_json_fails_the_run_as_a_worker_would(pgtick_jobs: JobsTester) -> None:
    pgtick_jobs.enqueue("odd-result", {"nan": True})
    pgtick_jobs.enqueue("odd-result", {})
    outcomes = pgtick_jobs.run_due(app)
    got = [(o.status, o.error) for o in outcomes]
    assert [status for status, _ in got] == ["FAILED", "FAILED"], got
    assert all(error and error.startswith("the result could not be stored: ") for _, error in got), got
    assert "NaN" in str(got[0][1]) and "object" in str(got[1][1]), got


@app.job("stops-itself")
def stops_itself(ctx: Context) -> None:
    from pgtick.errors import Abandoned, Cancelled

    raise (Cancelled if ctx.payload["raise"] == "Cancelled" else Abandoned)("job code raised it")


def test_job_code_raising_cancelled_or_abandoned_itself_fails_as_a_worker_would(
    pgtick_jobs: JobsTester,
) -> None:
    """No cancel was asked for and the run was not lost: the worker fails such a run like any
    other error, and so does the tester."""
    for name in ["Cancelled", "Abandoned"]:
        pgtick_jobs.enqueue("stops-itself", {"raise": name})
        [outcome] = pgtick_jobs.run_due(app)
        assert (outcome.status, outcome.error) == ("FAILED", f"{name}: job code raised it"), name


snoozed: set[int] = set()


@app.job("snoozes-once", max_attempts=1)
def snoozes_once(ctx: Context) -> str:
    if ctx.run_id not in snoozed:
        snoozed.add(ctx.run_id)
        ctx.snooze(3600)
    return "done"


def test_a_job_that_snoozes_is_queued_again_with_the_same_attempt_as_a_worker_would(
    pgtick_jobs: JobsTester,
) -> None:
    """Not a failure: the run is QUEUED again an hour on, same attempt, no retry row; only a
    run_due that takes runs not yet due runs it again."""
    pgtick_jobs.enqueue("snoozes-once")
    [first] = pgtick_jobs.run_due(app)
    assert (first.status, first.run.attempt, first.error, first.retry) == ("QUEUED", 1, None, None), first
    assert type(first.exception).__name__ == "Snooze"
    assert pgtick_jobs.run_due(app) == [], "the snoozed run ran before its delay"
    [again] = pgtick_jobs.run_due(app, include_future=True)
    assert (again.run.id, again.status, again.run.attempt, again.result) == (
        first.run.id,
        "COMPLETED",
        1,
        "done",
    )


@app.job("cancels-its-own-task")
async def cancels_its_own_task(ctx: Context) -> None:
    import asyncio

    raise asyncio.CancelledError("job code cancelled its task")


def test_an_async_job_that_raises_cancelled_error_itself_fails_as_a_worker_would(
    pgtick_jobs: JobsTester,
) -> None:
    """No cancel was asked for: the worker fails the run (CancelledError is a BaseException,
    not an Exception), and the tester reports the same outcome rather than letting it out of
    run_due with the run left RUNNING."""
    run = pgtick_jobs.enqueue("cancels-its-own-task")
    outcomes = pgtick_jobs.run_due(app)
    got = [(o.run.id, o.status, o.error) for o in outcomes]
    assert got == [(run.id, "FAILED", "CancelledError: job code cancelled its task")], got


compensated: list[int] = []


@app.job("cancelled-while-running", mutating=True, compensate=lambda ctx: compensated.append(ctx.run_id))
def cancelled_while_running(ctx: Context) -> str:
    app.client.cancel(ctx.run_id)  # what an operator's or the application's cancel does meanwhile
    ctx.checkpoint()
    return "went on past its cancel"


@app.job("cancelled-while-awaiting")
async def cancelled_while_awaiting(ctx: Context) -> str:
    app.client.cancel(ctx.run_id)
    await ctx.checkpoint()
    return "went on past its cancel"


def test_a_cancel_requested_while_a_job_runs_stops_it_at_its_checkpoint_as_a_worker_would(
    pgtick_jobs: JobsTester,
) -> None:
    """A worker's heartbeat tells a running job of its cancel, and its next checkpoint raises
    Cancelled: the run ends CANCELLED after the kind's compensation. run_due gives the job the
    same news at its checkpoint, rather than completing a cancelled run."""
    from pgtick.errors import Cancelled

    compensated.clear()
    for kind in ["cancelled-while-running", "cancelled-while-awaiting"]:
        run = pgtick_jobs.enqueue(kind)
        [outcome] = pgtick_jobs.run_due(app)
        assert (outcome.run.id, outcome.status, outcome.result) == (run.id, "CANCELLED", None), outcome
        assert isinstance(outcome.exception, Cancelled), outcome.exception
        if kind == "cancelled-while-running":
            assert compensated == [run.id], "the kind's compensation did not run"


class Unprintable(Exception):
    """An error whose message cannot be had: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("the message depends on a closed resource")


@app.job("fails-unprintably")
def fails_unprintably(ctx: Context) -> None:
    raise Unprintable()


def test_an_error_whose_message_cannot_be_read_fails_the_run_as_a_worker_would(
    pgtick_jobs: JobsTester,
) -> None:
    """A worker fails such a run saying the message could not be read; run_due did not report
    it at all, raising the __str__'s error out of run_due with the run left RUNNING."""
    run = pgtick_jobs.enqueue("fails-unprintably")
    [outcome] = pgtick_jobs.run_due(app)
    assert (outcome.run.id, outcome.status) == (run.id, "FAILED"), outcome
    assert outcome.error == (
        "Unprintable: (the error message could not be read:"
        " RuntimeError: the message depends on a closed resource)"
    ), outcome.error
    assert isinstance(outcome.exception, Unprintable)


loops: list[object] = []


@app.job("notes-its-loop")
async def notes_its_loop(ctx: Context) -> None:
    import asyncio

    loops.append(asyncio.get_running_loop())


def test_async_jobs_run_on_one_event_loop_as_on_a_worker(pgtick_jobs: JobsTester) -> None:
    """A worker runs every async job on one event loop per process, so job code may keep what
    is bound to the loop (a client library's connection, a lock) from one run to the next.
    run_due gave each job a loop of its own, and the second run of such code failed with
    "attached to a different loop"."""
    loops.clear()
    pgtick_jobs.enqueue("notes-its-loop")
    pgtick_jobs.enqueue("notes-its-loop")
    assert [o.status for o in pgtick_jobs.run_due(app)] == ["COMPLETED", "COMPLETED"]
    pgtick_jobs.enqueue("notes-its-loop")
    assert [o.status for o in pgtick_jobs.run_due(app)] == ["COMPLETED"]
    assert len(loops) == 3 and all(loop is loops[0] for loop in loops), loops


def plainly_decorated(fn: Callable[[Context], Any]) -> Callable[[Context], Any]:
    """A decorator as many are written: a plain function that returns what the job returns."""

    @functools.wraps(fn)
    def job(ctx: Context) -> Any:
        return fn(ctx)

    return job


@app.job("decorated-receipt")
@plainly_decorated
async def decorated_receipt(ctx: Context) -> str:
    return f"decorated {ctx.payload['order']}"


def test_an_async_job_behind_a_plain_decorator_runs_its_body_as_a_worker_would(
    pgtick_jobs: JobsTester,
) -> None:
    pgtick_jobs.enqueue("decorated-receipt", {"order": 7})
    (outcome,) = pgtick_jobs.run_due(app)
    assert (outcome.status, outcome.result) == ("COMPLETED", "decorated 7"), outcome


def test_the_tester_works_where_workers_must_present_a_claim_token(pgtick_jobs: JobsTester) -> None:
    import psycopg

    with psycopg.connect(pgtick_jobs.dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobs.config SET require_claim_token = true")
    try:
        pgtick_jobs.enqueue("send-receipt", {"order": 9})
        [receipt, _] = pgtick_jobs.run_due(app)
        assert receipt.status == "COMPLETED", receipt
    finally:
        with psycopg.connect(pgtick_jobs.dsn, autocommit=True) as conn:
            conn.execute("UPDATE jobs.config SET require_claim_token = false")


def test_each_test_starts_with_empty_jobs_tables(pgtick_jobs: JobsTester) -> None:
    assert pgtick_jobs.runs() == []
    assert pgtick_jobs.run_due(app) == []


def test_reset_empties_every_table_of_application_state(pgtick_jobs: JobsTester) -> None:
    """A paused queue, a limit and its recorded starts, a worker scope, a backfill and audit
    entries left by one test would change what the next one claims or sees."""
    import psycopg

    from pgtick.testing import KEPT_TABLES, STATE_TABLES

    with psycopg.connect(pgtick_jobs.dsn, autocommit=True) as conn:
        tables = {
            f"jobs.{r[0]}"
            for r in conn.execute(
                "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'jobs' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        }
        assert tables == set(STATE_TABLES) | set(KEPT_TABLES), "a table is neither state nor kept"
        conn.execute("SELECT jobs.pause_queue('mail')")
        conn.execute("SELECT jobs.set_limit('kind', 'send-receipt', rate_limit => 1, rate_period => '1 day')")
        conn.execute("SELECT jobs.audit('tester', 'probe', NULL, '{}')")
    pgtick_jobs.enqueue("send-receipt", {"order": 1})
    assert [o.status for o in pgtick_jobs.run_due(app)] == ["COMPLETED", "COMPLETED"]
    pgtick_jobs.enqueue("send-receipt", {"order": 2})
    assert pgtick_jobs.run_due(app) == [], "the rate limit holds within the test"

    pgtick_jobs.reset()
    with psycopg.connect(pgtick_jobs.dsn, autocommit=True) as conn:
        left = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone() for t in STATE_TABLES}
    assert {t: n for t, n in left.items() if n != (0,)} == {}
    pgtick_jobs.enqueue("send-receipt", {"order": 3}, queue="mail")
    assert [o.status for o in pgtick_jobs.run_due(app)] == ["COMPLETED", "COMPLETED"]


def test_the_readme_shows_the_first_test_of_this_file() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    start = readme.index("def test_a_receipt_is_sent_once_the_job_runs(pgtick_jobs):")
    shown = readme[start : readme.index("```", start)].strip()
    here = Path(__file__).read_text().replace("(pgtick_jobs: JobsTester) -> None:", "(pgtick_jobs):")
    assert shown.replace("  # and the run it enqueued", "") in here, "README example and test drifted apart"
