"""pgtick.Client against a real database: an enqueue with ``conn=`` commits or rolls back with
the caller's transaction (over a conninfo, a Connection and a pool), every method calls its SQL
function with the arguments given, and bad input arrives as InvalidArgument / NotFound."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from harness import Database, end_client_sessions, notifications_until_sentinel, wait_for
from pgtick import AsyncClient, Client, Run
from pgtick.client import Definition
from pgtick.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PgtickError,
    ReadOnly,
    SchemaMismatch,
    UsageError,
)


def count_runs(db: Database, kind: str) -> int:
    with db.connect() as c:
        row = c.execute("SELECT count(*) FROM jobs.runs WHERE kind = %s", (kind,)).fetchone()
    assert row is not None
    return int(row[0])


def has_parameter(db: Database, function: str, parameter: str) -> bool:
    with db.connect() as c:
        row = c.execute(
            "SELECT bool_or(%s = ANY(p.proargnames)) FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'jobs' AND p.proname = %s",
            (parameter, function),
        ).fetchone()
    return bool(row and row[0])


@pytest.fixture
def client(db: Database) -> Iterator[Client]:
    with Client(db.dsn) as c:
        yield c


@pytest.fixture(params=["conninfo", "connection", "pool"])
def any_client(request: pytest.FixtureRequest, db: Database) -> Iterator[Client]:
    """A client over each kind of source."""
    if request.param == "conninfo":
        with Client(db.dsn) as c:
            yield c
    elif request.param == "connection":
        with db.connect(autocommit=True) as conn:
            yield Client(conn)
    else:
        with ConnectionPool(db.dsn, min_size=1, max_size=2, open=True) as pool:
            yield Client(pool)


# -- transactions ---------------------------------------------------------------------


def test_an_enqueue_with_conn_rolls_back_with_the_callers_transaction(
    any_client: Client, db: Database
) -> None:
    with db.connect(autocommit=False) as conn:
        conn.execute("CREATE TEMP TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        run = any_client.enqueue("receipt", {"order": 1}, conn=conn)
        assert run.status == "QUEUED"
        assert count_runs(db, "receipt") == 0, "the run is visible before the caller committed"
        conn.rollback()
    assert count_runs(db, "receipt") == 0, f"run {run.id} survived the caller's rollback"


def test_an_enqueue_with_conn_commits_with_the_callers_transaction(any_client: Client, db: Database) -> None:
    with db.connect(autocommit=False) as conn:
        run = any_client.enqueue("receipt", {"order": 2}, conn=conn)
        assert count_runs(db, "receipt") == 0, "the run is visible before the caller committed"
        conn.commit()
    assert count_runs(db, "receipt") == 1
    assert any_client.get_run(run.id).payload == {"order": 2}


def test_an_exception_in_a_transaction_block_takes_the_enqueue_with_it(client: Client, db: Database) -> None:
    with pytest.raises(RuntimeError), db.connect() as conn, conn.transaction():
        client.enqueue("receipt", conn=conn)
        raise RuntimeError("the order could not be saved")
    assert count_runs(db, "receipt") == 0


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_refused_call_with_conn_leaves_the_callers_transaction_usable(
    client: Client, db: Database, autocommit: bool
) -> None:
    """The call runs in a savepoint of the caller's transaction: a NotFound or InvalidArgument
    it catches rolls back the call only, and what it did before and after commits."""
    with db.connect(autocommit=autocommit) as conn:
        with conn.transaction() if autocommit else nullcontext():
            client.enqueue("receipt", {"order": 3}, conn=conn)
            with pytest.raises(NotFound):
                client.cancel(424242, conn=conn)
            with pytest.raises(InvalidArgument):
                client.enqueue("receipt", queue="", conn=conn)
            client.enqueue("receipt", {"order": 4}, conn=conn)
            assert count_runs(db, "receipt") == 0, "committed before the caller did"
        if not autocommit:
            conn.commit()
    assert count_runs(db, "receipt") == 2


def _jobs_notifications(db: Database, act: Callable[[], object]) -> list[str]:
    """The payloads NOTIFY jobs sent while ``act`` ran, up to a sentinel sent after it (in
    commit order, so nothing of ``act`` comes later)."""
    with db.connect() as listener:
        listener.execute("LISTEN jobs")
        act()
        with db.connect() as c:
            c.execute("SELECT pg_notify('jobs', 'sentinel')")
        return notifications_until_sentinel(listener)


#: The client's NOTIFY after the commit, told apart here by its payload.
MARKED_WAKE = "SELECT set_config('synchronous_commit', 'off', true), pg_notify('jobs', 'after')"


def test_an_enqueue_on_the_clients_own_connection_notifies_once_after_its_commit(
    client: Client, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's own transaction defers the NOTIFY and the client sends it after the
    commit, in a transaction of its own (so concurrent enqueuers share their WAL flushes): the
    workers are woken once, by that later NOTIFY, and the run is committed when they are."""
    monkeypatch.setattr("pgtick.client.WAKE", MARKED_WAKE)
    client.define("nightly", "k", "0 3 * * *", timezone="UTC")
    runs: list[Run] = []
    assert _jobs_notifications(db, lambda: runs.append(client.enqueue("k"))) == ["after"]
    assert _jobs_notifications(db, lambda: runs.extend(client.enqueue_many("k", [{}, {}]))) == ["after"]
    assert _jobs_notifications(db, lambda: runs.append(client.run_now("nightly"))) == ["after"]
    assert count_runs(db, "k") == len(runs) == 4
    # A call that queues nothing sends no NOTIFY; an idempotent repeat wakes nobody for nothing.
    assert _jobs_notifications(db, lambda: client.get_run(runs[0].id)) == []
    first = client.enqueue("k", idempotency_key="once")
    assert _jobs_notifications(db, lambda: client.enqueue("k", idempotency_key="once")) in ([], ["after"])
    assert client.enqueue("k", idempotency_key="once").id == first.id


@pytest.mark.parametrize("source", ["connection", "pool"])
def test_an_enqueue_on_a_given_connection_or_pool_notifies_with_its_commit(
    source: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection or pool the application hands in may sit behind a pooler the client cannot
    see: its transactions notify as any transaction does, with their commit."""
    monkeypatch.setattr("pgtick.client.WAKE", MARKED_WAKE)
    with (
        db.connect(autocommit=True) as conn,
        ConnectionPool(db.dsn, min_size=1, max_size=2, open=True) as pool,
    ):
        c = Client(conn) if source == "connection" else Client(pool)
        assert _jobs_notifications(db, lambda: c.enqueue("k")) == [""]
    assert count_runs(db, "k") == 1


def test_an_enqueue_in_the_callers_transaction_notifies_with_its_commit(client: Client, db: Database) -> None:
    with db.connect(autocommit=False) as caller:

        def enqueue_uncommitted() -> None:
            client.enqueue("k", conn=caller)

        assert _jobs_notifications(db, enqueue_uncommitted) == [], "woken before the caller's commit"
        assert _jobs_notifications(db, caller.commit) == [""]
    assert count_runs(db, "k") == 1


def test_a_refused_enqueue_on_the_clients_own_connection_changes_nothing_and_wakes_nobody(
    client: Client, db: Database
) -> None:
    """Refused by the database, in the pipelined transaction: the error is the call's, the
    transaction rolled back, no NOTIFY, and the connection goes on."""

    def refused() -> None:
        with pytest.raises(NotFound, match="depends_on"):
            client.enqueue("k", depends_on=[987654321])

    assert _jobs_notifications(db, refused) == []
    assert count_runs(db, "k") == 0
    assert client.enqueue("k").status == "QUEUED"


def test_a_wake_that_fails_after_the_commit_returns_the_run_and_says_so(
    client: Client, db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run is committed when the NOTIFY is sent: a failure then is logged, not raised (a
    caller told the enqueue failed would queue the run again)."""
    monkeypatch.setattr("pgtick.client.WAKE", "SELECT pg_notify('', '')")  # refused: empty channel
    with caplog.at_level("WARNING", logger="pgtick.client"):
        run = client.enqueue("k")
    assert count_runs(db, "k") == 1 and run.status == "QUEUED"
    assert any("could not wake the workers" in r.getMessage() for r in caplog.records), caplog.text
    assert client.enqueue("k").id > run.id  # the connection is still usable


def test_arguments_of_the_wrong_type_are_invalid_arguments_naming_them(client: Client) -> None:
    """Not a schema mismatch (which the server's 'function does not exist' would suggest)."""
    loose: Any = client  # called as an untyped caller may
    cases: list[tuple[Any, str]] = [
        (lambda: loose.run_now(5), "name must be text, got int"),
        (lambda: loose.enqueue("k", queue=5), "queue must be text, got int"),
        (lambda: loose.enqueue("k", idempotency_key=42), "idempotency_key must be text"),
        (lambda: loose.pause_queue(7), "name must be text"),
        (lambda: loose.define("n", "k", "* * * * *", enabled=1), "enabled must be True or False"),
        (lambda: loose.define("n", "k", "* * * * *", enabled="no"), "enabled must be True or False"),
        (lambda: loose.enqueue_many("k", [1]), "payloads[0] must be a JSON object"),
        (lambda: loose.enqueue_many("k", {"a": 1}), "payloads must be a list"),
    ]
    for attempt, message in cases:
        with pytest.raises(InvalidArgument) as caught:
            attempt()
        assert message in str(caught.value)


def test_without_conn_each_call_is_its_own_transaction(any_client: Client, db: Database) -> None:
    run = any_client.enqueue("solo")
    assert count_runs(db, "solo") == 1, "a call without conn= did not commit"
    with pytest.raises(InvalidArgument):
        any_client.enqueue("solo", priority=5000)
    assert count_runs(db, "solo") == 1
    assert any_client.get_run(run.id).id == run.id  # the client is still usable after an error


# -- every method -----------------------------------------------------------------------


def test_enqueue_passes_every_argument_of_jobs_enqueue(client: Client) -> None:
    at = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
    run = client.enqueue(
        "mail",
        {"to": "a@example.com"},
        run_at=at,
        priority=7,
        idempotency_key="order-9",
        max_attempts=4,
        timeout=30,
        heartbeat_timeout=timedelta(seconds=20),
    )
    assert isinstance(run, Run)
    assert (run.kind, run.payload, run.scheduled_for, run.priority) == (
        "mail",
        {"to": "a@example.com"},
        at,
        7,
    )
    assert (run.idempotency_key, run.max_attempts, run.origin) == ("order-9", 4, "manual")
    assert (run.timeout, run.heartbeat_timeout) == (timedelta(seconds=30), timedelta(seconds=20))
    again = client.enqueue("mail", {"to": "b@example.com"}, idempotency_key="order-9")
    assert again.id == run.id and again.payload == {"to": "a@example.com"}


def test_a_naive_run_at_is_read_in_the_zone_given_with_tz(client: Client) -> None:
    run = client.enqueue("mail", run_at=datetime(2031, 7, 1, 9, 0), tz="Europe/Sofia")
    assert run.scheduled_for == datetime(2031, 7, 1, 6, 0, tzinfo=UTC)  # EEST is UTC+3
    run = client.enqueue("mail", run_at=datetime(2031, 1, 1, 9, 0), tz=ZoneInfo("America/New_York"))
    assert run.scheduled_for == datetime(2031, 1, 1, 14, 0, tzinfo=UTC)


def test_a_naive_run_at_without_tz_is_refused_before_anything_is_written(
    client: Client, db: Database
) -> None:
    with pytest.raises(InvalidArgument, match=r"run_at is a naive datetime.*tz=") as caught:
        client.enqueue("mail", run_at=datetime(2031, 7, 1, 9, 0))
    assert caught.value.field == "run_at"
    with pytest.raises(InvalidArgument, match="Mars/Olympus"):
        client.enqueue("mail", run_at=datetime(2031, 7, 1, 9, 0), tz="Mars/Olympus")
    with pytest.raises(InvalidArgument, match=r"run_at is a naive datetime.*timezone="):
        client.define("launch", "announce", run_at=datetime(2031, 7, 1, 9, 0))
    assert count_runs(db, "mail") == 0


def test_a_misspelt_tz_is_refused_even_without_a_run_at_to_read_in_it(client: Client, db: Database) -> None:
    """tz= alone reads nothing, but a zone that does not exist is a caller's mistake (a typo
    meant for a run_at forgotten or mistyped): refused by name, nothing written."""
    for call in (
        lambda: client.enqueue("mail", tz="Europe/Pariss"),
        lambda: client.enqueue_many("mail", [{}], tz="Europe/Pariss"),
        lambda: client.enqueue("mail", run_at=datetime(2031, 7, 1, 9, 0, tzinfo=UTC), tz="Europe/Pariss"),
    ):
        with pytest.raises(InvalidArgument, match="Europe/Pariss") as caught:
            call()
        assert caught.value.field == "tz"
    assert count_runs(db, "mail") == 0
    assert client.enqueue("mail", tz="Europe/Paris").kind == "mail"


def test_depends_on_takes_the_runs_the_client_returned_as_well_as_their_ids(client: Client) -> None:
    """A run just enqueued is at hand as a Run: it names itself in depends_on. A refusal names
    a Run by its id, never with its payload (the caller's data, and long)."""
    first = client.enqueue("step", {"secret": "x" * 500})
    second = client.enqueue("step")
    after = client.enqueue("step", depends_on=[first, second.id])
    assert after.depends_on == [first.id, second.id] and after.blocked
    with pytest.raises(
        InvalidArgument, match=rf"list of run ids or Runs, got Run Run\(id={first.id}\)"
    ) as caught:
        client.enqueue("step", depends_on=first)  # type: ignore[arg-type]
    assert caught.value.field == "depends_on" and "secret" not in str(caught.value)


def test_a_run_given_where_a_run_id_goes_is_refused_by_its_id_not_its_payload(client: Client) -> None:
    """cancel(run), retry(run), get_run(run): a refusal goes to logs and error trackers, and
    printed the whole Run, payload and all (the caller's data: a card number, a token)."""
    run = client.enqueue("charge", {"card": "4111 1111 1111 1111", "note": "x" * 500})
    for method in (client.cancel, client.retry, client.get_run):
        with pytest.raises(
            InvalidArgument, match=rf"run_id must be an integer .*, got Run\(id={run.id}\)"
        ) as caught:
            method(run)  # type: ignore[arg-type]
        assert caught.value.field == "run_id"
        assert "4111" not in str(caught.value) and len(str(caught.value)) < 200, caught.value
    assert client.get_run(run.id).status == "QUEUED"


def test_enqueue_many_takes_its_payloads_from_any_iterable(client: Client, db: Database) -> None:
    runs = client.enqueue_many("gen", ({"i": i} for i in range(3)))
    assert [r.payload for r in runs] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert count_runs(db, "gen") == 3


def test_define_run_now_and_cancel(client: Client) -> None:
    definition = client.define(
        "nightly",
        "report",
        "0 3 * * *",
        timezone="Europe/Sofia",
        payload={"full": True},
        max_concurrent_runs=1,
        priority=3,
        max_attempts=2,
        misfire_policy="skip",
        overlap_policy="skip",
        timeout=600,
        heartbeat_timeout=60,
        enabled=False,
    )
    assert isinstance(definition, Definition)
    assert (definition.name, definition.schedule, definition.timezone) == (
        "nightly",
        "0 3 * * *",
        "Europe/Sofia",
    )
    assert (definition.max_concurrent_runs, definition.priority, definition.enabled) == (1, 3, False)
    assert (definition.misfire_policy, definition.overlap_policy) == ("skip", "skip")
    assert definition.timeout == timedelta(minutes=10)

    run = client.run_now("nightly", {"full": False})
    assert (run.definition_id, run.payload, run.status) == (definition.id, {"full": False}, "QUEUED")
    assert client.cancel(run.id) == "CANCELLED"
    assert client.get_run(run.id).status == "CANCELLED"

    one_shot = client.define(
        "launch", "announce", run_at=datetime(2031, 12, 24, 18, 0), timezone="Europe/Sofia"
    )
    assert one_shot.run_at == datetime(2031, 12, 24, 16, 0, tzinfo=UTC)


def test_cancel_of_a_running_run_requests_cancellation(client: Client, conn: psycopg.Connection[Any]) -> None:
    run = client.enqueue("long")
    conn.execute("SELECT * FROM jobs.claim(1, 'w1')")
    assert client.cancel(run.id) == "RUNNING"
    assert client.get_run(run.id).cancel_requested is True


def test_a_bad_schedule_is_refused_by_the_driver_naming_the_definition(client: Client) -> None:
    with pytest.raises(InvalidArgument, match="nightly") as caught:
        client.define("nightly", "report", "61 * * * *")
    assert caught.value.field == "schedule"


def test_options_of_newer_schemas_are_passed_by_name_or_refused_clearly(client: Client, db: Database) -> None:
    """queue=, enqueue_many and the queue controls exist on schemas that have queues; on one
    without them the call says the schema is older than the driver instead of misbehaving."""
    if has_parameter(db, "enqueue", "queue"):
        assert client.enqueue("mail", queue="emails").queue == "emails"
    else:
        with pytest.raises(SchemaMismatch, match="pgtick migrate"):
            client.enqueue("mail", queue="emails")
    if has_parameter(db, "enqueue_many", "payloads"):
        runs = client.enqueue_many("mail", [{"n": 1}, {"n": 2}])
        assert [r.payload for r in runs] == [{"n": 1}, {"n": 2}]
    else:
        with pytest.raises(SchemaMismatch):
            client.enqueue_many("mail", [{"n": 1}, {"n": 2}])
    if has_parameter(db, "pause_queue", "name"):
        client.pause_queue("emails")
        client.resume_queue("emails")
    else:
        with pytest.raises(SchemaMismatch):
            client.pause_queue("emails")


# -- errors -------------------------------------------------------------------------------


def test_invalid_arguments_name_the_field_and_keep_the_sql_message(client: Client) -> None:
    with pytest.raises(InvalidArgument) as caught:
        client.enqueue("mail", priority=5000)
    err = caught.value
    assert (err.sqlstate, err.field) == ("22023", "priority")
    assert "priority must be between -1000 and 1000" in str(err)
    assert err.__cause__ is None, "the driver refuses a number out of range before sending it"

    with pytest.raises(InvalidArgument) as caught:
        client.enqueue("mail", queue="")
    assert (caught.value.sqlstate, caught.value.field) == ("22023", "queue")
    assert isinstance(caught.value.__cause__, psycopg.Error), "the SQL API's refusal, translated"

    with pytest.raises(InvalidArgument) as caught:
        client.define("x", "k", run_at=datetime(2031, 1, 1, tzinfo=UTC), timezone="Mars/Olympus")
    assert caught.value.field == "timezone"
    assert caught.value.hint is not None and "Europe/Sofia" in caught.value.hint


def test_unknown_names_and_ids_raise_not_found_naming_the_argument(client: Client) -> None:
    with pytest.raises(NotFound, match="'nope'") as caught:
        client.run_now("nope")
    assert (caught.value.sqlstate, caught.value.field) == ("P0002", "name")
    with pytest.raises(NotFound, match="424242") as caught:
        client.cancel(424242)
    assert caught.value.field == "run_id"
    with pytest.raises(NotFound, match="424242") as caught:
        client.get_run(424242)
    assert caught.value.field == "run_id"


def test_a_client_refuses_what_it_cannot_connect_with() -> None:
    with pytest.raises(TypeError, match="conninfo string"):
        Client(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("client_class", [Client, AsyncClient])
@pytest.mark.parametrize(
    ("conninfo", "why"),
    [
        ("postgresql://shop:s3cret@[::1/shop", "IPv6 host address"),
        ("postgresql://shop:s3cret@db.internal/shop?sslmod=require", 'invalid URI query parameter: "sslmod"'),
        ("shop database", 'missing "="'),
    ],
)
def test_a_conninfo_libpq_cannot_read_is_refused_when_the_client_is_made_with_no_password_in_it(
    client_class: type[Client] | type[AsyncClient], conninfo: str, why: str
) -> None:
    """At the client's making, not at its first call, and without the password libpq's
    message quotes with the URL (an application's logs and error reports keep it)."""
    with pytest.raises(InvalidArgument, match="not a connection string or URL") as caught:
        client_class(conninfo)
    assert caught.value.field == "conninfo"
    assert why in str(caught.value)
    chain = [caught.value, caught.value.__cause__, caught.value.__context__]
    assert not any("s3cret" in str(e) for e in chain if e is not None), f"the password is in {chain}"


def test_conn_of_the_other_kind_is_a_type_error_saying_which_client_takes_it(db: Database) -> None:
    import asyncio

    from pgtick import AsyncClient

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db.dsn) as async_conn:
            with (
                Client(db.dsn) as client,
                pytest.raises(TypeError, match=r"takes a psycopg\.Connection .*\(use AsyncClient"),
            ):
                client.enqueue("mixed", conn=async_conn)  # type: ignore[arg-type]
        with db.connect() as sync_conn:
            async with AsyncClient(db.dsn) as async_client:
                with pytest.raises(TypeError, match=r"takes a psycopg\.AsyncConnection .*\(use Client"):
                    await async_client.enqueue("mixed", conn=sync_conn)  # type: ignore[arg-type]
            assert sync_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE, "nothing was sent"
        with Client(db.dsn) as client, pytest.raises(TypeError, match=r"conn= takes .* got str"):
            client.cancel(1, conn=db.dsn)  # type: ignore[arg-type]

    asyncio.run(main())
    assert count_runs(db, "mixed") == 0


def test_threads_share_one_client(any_client: Client, db: Database) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        runs = list(pool.map(lambda i: any_client.enqueue("fan", {"i": i}), range(40)))
    assert len({r.id for r in runs}) == 40
    assert count_runs(db, "fan") == 40


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_threads_enqueueing_in_one_callers_transaction_each_succeed_and_share_its_outcome(
    any_client: Client, db: Database, outcome: str
) -> None:
    """Calls from many threads on one caller's connection go one at a time: interleaved, each
    one's savepoint ended another's out of order, and every call raised while its run stayed in
    the transaction (committed with it, though the caller was told it failed)."""
    from concurrent.futures import ThreadPoolExecutor

    with db.connect(autocommit=False) as conn:
        with ThreadPoolExecutor(max_workers=8) as pool:
            calls = [pool.submit(any_client.enqueue, "shared", {"i": i}, conn=conn) for i in range(80)]
        failed = [(i, call.exception()) for i, call in enumerate(calls) if call.exception() is not None]
        assert failed == [], f"{len(failed)} of 80 calls raised, the first: {failed[:1]}"
        assert len({call.result().id for call in calls}) == 80
        assert count_runs(db, "shared") == 0, "committed before the caller did"
        conn.commit() if outcome == "commit" else conn.rollback()
    assert count_runs(db, "shared") == (80 if outcome == "commit" else 0)


def forked(work: Callable[[], None]) -> int:
    """Run ``work`` in a child forked from this process; the child's pid. It exits 0 if
    ``work`` returned, 1 if it raised (the traceback on its stderr), and never returns here."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def exit_codes(pids: list[int], timeout: float = 120) -> dict[int, int | str]:
    """Each child's exit code, or "hung" for one still running at the deadline (then killed)."""
    codes: dict[int, int | str] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in set(pids) - set(codes):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                codes[pid] = "hung"
        time.sleep(0.05)
    return codes


def test_processes_forked_from_a_client_in_use_each_call_on_a_connection_of_their_own(db: Database) -> None:
    """A client whose connection was opened before a fork (a web server forking its workers
    from a parent that enqueued) opens a connection in each child: sharing the parent's
    socket, the children read each other's answers (or hang), and a child's close() would
    end the parent's session."""
    client = Client(db.dsn)
    client.enqueue("parent")

    def child(n: int) -> Callable[[], None]:
        def work() -> None:
            for i in range(30):
                run = client.enqueue(f"child-{n}", {"i": i})
                assert (run.kind, run.payload) == (f"child-{n}", {"i": i}), f"child {n} got {run}"
            client.close()

        return work

    codes = exit_codes([forked(child(n)) for n in range(3)])
    assert set(codes.values()) == {0}, f"children failed (exit code or hung): {codes}"
    assert [count_runs(db, f"child-{n}") for n in range(3)] == [30, 30, 30]
    client.enqueue("parent")  # on its session of before: a child's close() would have ended it
    assert count_runs(db, "parent") == 2
    client.close()


def test_a_process_forked_while_another_thread_is_in_a_call_can_call(db: Database) -> None:
    """A fork while a thread of the parent waits in a call (here for a unique key another
    transaction holds): the child, which has no such thread, is not held by its lock."""
    client = Client(db.dsn)
    with db.connect(autocommit=False) as holder:
        holder.execute("SELECT jobs.enqueue('held', unique_key => 'k')")
        waiting = threading.Thread(target=lambda: client.enqueue("held", unique_key="k"))
        waiting.start()
        with db.connect() as watch:
            wait_for(
                "the parent's call to wait for the unique key",
                lambda: watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pgtick-client'"
                    " AND wait_event_type = 'Lock'"
                ).fetchone(),
                timeout=60,
            )
        codes = exit_codes([forked(lambda: print(client.enqueue("child").id))], timeout=60)
        holder.rollback()
    waiting.join(60)
    assert list(codes.values()) == [0], f"the child failed (exit code or hung): {codes}"
    assert count_runs(db, "child") == 1
    client.close()


def test_a_call_after_the_server_ended_the_idle_connection_goes_on_a_new_one(
    client: Client, db: Database
) -> None:
    """The server ended the client's connection while it was idle (a restart, a terminated
    session): nothing was sent on it since, so the next call goes on a new connection rather
    than failing with the lost one."""
    client.enqueue("before")
    end_client_sessions(db)
    run = client.enqueue("after")
    assert client.get_run(run.id).kind == "after"
    assert count_runs(db, "after") == 1


def test_a_process_with_many_files_open_keeps_its_connection_from_call_to_call(db: Database) -> None:
    """A busy web server holds more than 1,024 descriptors, so the client's socket gets a
    number select() refuses; the check for a connection the server ended while idle must not
    take that for an ended connection and open a new one at every call."""
    held: list[int] = []
    try:
        while len(held) < 1100:  # the next socket is numbered above FD_SETSIZE
            held.append(os.open(os.devnull, os.O_RDONLY))
        with Client(db.dsn) as client:
            first = client.enqueue("many-files")
            pid = backend_pid(client)
            assert client._own is not None and client._own.fileno() > 1024
            for _ in range(3):
                client.enqueue("many-files")
            assert backend_pid(client) == pid, "the client opened a new connection for a call"
            assert client.get_run(first.id).kind == "many-files"
    finally:
        for fd in held:
            os.close(fd)
    assert count_runs(db, "many-files") == 4


def backend_pid(client: Client) -> int:
    """The server process of the client's own connection."""
    assert client._own is not None
    return client._own.info.backend_pid


SQL_FUNCTIONS = {
    "enqueue": "enqueue",
    "enqueue_many": "enqueue_many",
    "run_now": "run_now",
    "cancel": "cancel",
    "retry": "retry",
    "define": "define",
    "pause_queue": "pause_queue",
    "resume_queue": "resume_queue",
}


def test_retry_queues_a_finished_run_again_in_the_callers_transaction(
    any_client: Client, db: Database
) -> None:
    """Client.retry is jobs.retry: the next attempt of a CANCELLED (or FAILED) run, now; with
    conn= it commits or rolls back with the caller; what cannot be retried is refused by name."""
    run = any_client.enqueue("charge", {"order": 7})
    with pytest.raises(InvalidArgument) as refused:
        any_client.retry(run.id)  # still QUEUED
    assert refused.value.sqlstate == "22023"
    any_client.cancel(run.id)
    with db.connect(autocommit=False) as conn:
        any_client.retry(run.id, conn=conn)
        conn.rollback()
    assert count_runs(db, "charge") == 1, "a retry survived the caller's rollback"
    again = any_client.retry(run.id)
    assert (again.status, again.attempt, again.retry_of, again.payload) == ("QUEUED", 2, run.id, {"order": 7})
    assert any_client.get_run(again.id) == again
    with pytest.raises(NotFound) as missing:
        any_client.retry(424242)
    assert missing.value.field == "run_id"
    with pytest.raises(InvalidArgument) as bad:
        any_client.retry(0)
    assert bad.value.field == "run_id"


@pytest.mark.parametrize("method", sorted(SQL_FUNCTIONS))
def test_every_parameter_of_the_sql_function_is_a_client_argument(
    method: str, conn: psycopg.Connection[Any]
) -> None:
    """On this database's schema: a parameter the SQL function has and the client lacks
    (in Client or AsyncClient) fails here, naming it."""
    import inspect

    from pgtick import AsyncClient

    rows = conn.execute(
        "SELECT unnest(p.proargnames) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'jobs' AND p.proname = %s",
        (SQL_FUNCTIONS[method],),
    ).fetchall()
    sql_parameters = {r[0] for r in rows}
    for cls in (Client, AsyncClient):
        python_parameters = set(inspect.signature(getattr(cls, method)).parameters)
        missing = sql_parameters - python_parameters
        assert not missing, f"{cls.__name__}.{method} lacks jobs.{SQL_FUNCTIONS[method]} parameters {missing}"


def test_arguments_are_sent_by_name_and_only_when_given(conn: psycopg.Connection[Any]) -> None:
    from pgtick.client import call

    query, params = call(
        "enqueue",
        {
            "kind": "k",
            "payload": None,
            "queue": "q",
            "unique_for": 60,
            "depends_on": [1, 2],
            "priority": None,
        },
    )
    text = query.as_string(conn)
    assert text == (
        'SELECT * FROM jobs."enqueue"("kind" => %(kind)s, "queue" => %(queue)s, '
        '"unique_for" => %(unique_for)s, "depends_on" => %(depends_on)s)'
    ), text
    assert params["unique_for"] == timedelta(minutes=1)


def test_app_enqueue_goes_through_the_apps_client(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgtick import App
    from pgtick.errors import UsageError

    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("PGTICK_DSN", raising=False)
    with pytest.raises(UsageError, match=r"App\(dsn=\.\.\.\)"):
        App("shop").enqueue("receipt")

    app = App("shop", dsn=db.dsn)
    with db.connect(autocommit=False) as conn:
        app.enqueue("receipt", {"order": 1}, conn=conn)
        conn.rollback()
    assert count_runs(db, "receipt") == 0
    run = app.enqueue("receipt", {"order": 2}, priority=1)
    assert (run.payload, run.priority) == ({"order": 2}, 1)

    monkeypatch.setenv("DATABASE_URL", db.dsn)
    from_env = App("from-env")
    assert from_env.enqueue("receipt").kind == "receipt"
    from_env.client.close()
    app.client.close()
    with Client(db.dsn) as client:
        app.use(client)
        assert app.client is client
    assert count_runs(db, "receipt") == 2


def client_sessions(db: Database) -> int:
    """The server sessions a ``pgtick.Client`` holds on this test's database."""
    with db.connect() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'pgtick-client'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("target", ["dsn", "client"])
def test_app_use_closes_the_connection_the_app_opened(db: Database, target: str) -> None:
    """``app.use(...)`` after ``app.enqueue`` over the app's own DSN: the connection the app
    opened for it is closed then and there (its server session ends), not left to the garbage
    collector with a ResourceWarning; a client handed to the app stays open, its giver's."""
    from pgtick import App

    gc.collect()
    gc.disable()  # what is closed must be closed by app.use(), not by a collection meanwhile
    try:
        with warnings.catch_warnings(record=True) as caught, Client(db.dsn) as given:
            warnings.simplefilter("always", ResourceWarning)
            app = App("shop", dsn=db.dsn)
            app.enqueue("receipt")
            wait_for("the app's session", lambda: client_sessions(db) == 1, 30)
            app.use(db.dsn if target == "dsn" else given)
            wait_for("the app's session to end", lambda: client_sessions(db) == 0, 30)
            app.enqueue("receipt")  # through what it now uses
            app.use(db.dsn)
            if target == "dsn":  # a closed session leaves pg_stat_activity a moment later
                wait_for("the session the app opened to end", lambda: client_sessions(db) == 0, 30)
            else:
                assert client_sessions(db) == 1, "a given client stays open"
                given.enqueue("receipt")  # and usable
            app.client.close()
            del app
        leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert not leaked, leaked
    finally:
        gc.enable()
    assert count_runs(db, "receipt") == (3 if target == "client" else 2)


def test_jobs_that_app_enqueue_at_once_share_one_client(db: Database, monkeypatch: Any) -> None:
    """Job code on several worker threads calls ``app.enqueue`` for the first time at once
    (``pgtick run`` gives the app its DSN, the client is made on first use): one client, one
    connection, none left to the garbage collector. Making a client is slowed so that the
    threads are all inside the first use together."""
    import pgtick.client
    from pgtick import App

    made = pgtick.client.Client.__init__

    def slowly(self: Client, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        made(self, *args, **kwargs)

    monkeypatch.setattr(pgtick.client.Client, "__init__", slowly)
    app = App("shop", dsn=db.dsn)
    start = threading.Barrier(4)

    def job() -> None:
        start.wait(30)
        app.enqueue("receipt")

    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            threads = [threading.Thread(target=job) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert client_sessions(db) == 1
            app.client.close()
            threads.clear()  # the threads' frames: what they made is unreferenced now
            gc.collect()
        leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert not leaked, leaked
    finally:
        gc.enable()
    assert count_runs(db, "receipt") == 4


def test_app_use_refuses_what_app_enqueue_cannot_write_through_and_changes_nothing(db: Database) -> None:
    """``app.use()`` of an AsyncClient (``app.enqueue`` is synchronous), of something else or
    of an empty DSN is refused at the call, naming what it takes; the app keeps its database
    and its connection."""
    from pgtick import App, AsyncClient

    app = App("shop", dsn=db.dsn)
    app.enqueue("receipt")
    with pytest.raises(TypeError, match=r"app.use\(\) takes .* got AsyncClient \(app.enqueue is synchronous"):
        app.use(AsyncClient(db.dsn))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        app.use(5432)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must not be empty"):
        app.use(" ")
    assert app.dsn == db.dsn and client_sessions(db) == 1, "a refused app.use() changed the app"
    app.enqueue("receipt")
    app.client.close()
    assert count_runs(db, "receipt") == 2


@pytest.mark.parametrize("source", ["conninfo", "connection", "pool"])
def test_a_closed_client_refuses_every_call_and_opens_no_connection(db: Database, source: str) -> None:
    """After ``close()`` every method raises UsageError saying the client is closed, with
    ``conn=`` or without, and nothing is sent: a client over a conninfo does not open a new
    session. What the client was given (a connection, a pool) stays open, the giver's."""
    with db.connect(autocommit=True) as given_conn, ConnectionPool(db.dsn, min_size=1, open=True) as pool:
        sources: dict[str, str | psycopg.Connection[Any] | ConnectionPool[Any]] = {
            "conninfo": db.dsn,
            "connection": given_conn,
            "pool": pool,
        }
        client = Client(sources[source])
        run = client.enqueue("closing")
        client.close()
        client.close()  # idempotent
        assert client.closed
        wait_for("the client's own session to end", lambda: client_sessions(db) == 0, 30)
        calls: dict[str, Callable[[], object]] = {
            "enqueue": lambda: client.enqueue("closing"),
            "enqueue_many": lambda: client.enqueue_many("closing", [{}]),
            "run_now": lambda: client.run_now("nightly"),
            "cancel": lambda: client.cancel(run.id),
            "define": lambda: client.define("nightly", "closing", "0 3 * * *"),
            "pause_queue": lambda: client.pause_queue("default"),
            "resume_queue": lambda: client.resume_queue("default"),
            "get_run": lambda: client.get_run(run.id),
        }
        for method, refused in calls.items():
            with pytest.raises(UsageError, match=r"this Client is closed \(close\(\) was called on it\)"):
                refused()
            assert client_sessions(db) == 0, f"{method} after close() opened a connection"
        with db.connect(autocommit=False) as callers, pytest.raises(UsageError, match="Client is closed"):
            client.enqueue("closing", conn=callers)
        with client, pytest.raises(UsageError, match="Client is closed"):  # a with block after close()
            client.enqueue("closing")
        assert not given_conn.closed, "close() closed a connection the client was given"
        with pool.connection() as pooled:
            assert pooled.execute("SELECT 1").fetchone() == (1,), "close() closed the pool it was given"
    assert count_runs(db, "closing") == 1
    assert client_sessions(db) == 0


def test_close_waits_for_a_call_in_progress_and_the_calls_after_it_are_refused(db: Database) -> None:
    """A close() on another thread while a call holds the client's own connection: that call
    finishes (its run is queued), the connection is closed after it, and the next call is
    refused rather than served by a new connection."""
    client = Client(db.dsn)
    client.enqueue("closing")  # the client's connection is open
    with db.connect(autocommit=False) as locker:
        locker.execute("LOCK TABLE jobs.runs IN EXCLUSIVE MODE")  # the next enqueue waits for it
        started = threading.Thread(target=lambda: client.enqueue("closing", {"during": True}))
        started.start()
        wait_for(
            "the enqueue to wait for the lock",
            lambda: locker.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'pgtick-client' AND wait_event_type = 'Lock'"
            ).fetchone(),
            30,
        )
        closer = threading.Thread(target=client.close)
        closer.start()
        closer.join(0.5)
        assert closer.is_alive(), "close() did not wait for the call in progress"
        locker.rollback()
    started.join(30)
    closer.join(30)
    assert client.closed and count_runs(db, "closing") == 2
    with pytest.raises(UsageError, match="Client is closed"):
        client.enqueue("closing")
    assert client_sessions(db) == 0


def test_app_close_closes_the_connection_the_app_opened_and_app_enqueue_then_refuses(db: Database) -> None:
    """``app.close()`` ends the server session of the client the app made from its DSN; after
    it ``app.enqueue`` raises UsageError naming the app (it opens no new connection) until
    ``app.use(...)`` points the app at a database again. ``close()`` twice is harmless, and
    an app used as a context manager is closed at the end of the block."""
    from pgtick import App

    app = App("shop", dsn=db.dsn)
    app.close()  # nothing opened yet
    app.use(db.dsn)
    app.enqueue("receipt")
    wait_for("the app's session", lambda: client_sessions(db) == 1, 30)
    app.close()
    app.close()
    assert app.closed
    wait_for("the app's session to end", lambda: client_sessions(db) == 0, 30)
    with pytest.raises(UsageError, match=r"app 'shop' is closed \(app.close\(\) was called\)"):
        app.enqueue("receipt")
    with pytest.raises(UsageError, match="app 'shop' is closed"):
        app.client  # noqa: B018 (the property is what refuses)
    assert client_sessions(db) == 0, "app.enqueue after app.close() opened a connection"

    app.use(db.dsn)
    assert not app.closed
    app.enqueue("receipt")
    with app:
        app.enqueue("receipt")
        assert client_sessions(db) == 1
    assert app.closed
    wait_for("the app's session to end", lambda: client_sessions(db) == 0, 30)
    assert count_runs(db, "receipt") == 3


def test_app_close_leaves_a_client_it_was_given_open(db: Database) -> None:
    """A client handed to the app is the giver's: ``app.close()`` does not close it, and the
    closed app refuses ``app.enqueue`` all the same."""
    from pgtick import App

    with Client(db.dsn) as given:
        app = App("shop", client=given)
        app.enqueue("receipt")
        app.close()
        with pytest.raises(UsageError, match="app 'shop' is closed"):
            app.enqueue("receipt")
        assert not given.closed
        given.enqueue("receipt")
        assert client_sessions(db) == 1, "app.close() closed the client it was given"
    assert count_runs(db, "receipt") == 2


def test_app_enqueue_after_run_due_writes_through_a_new_connection_of_the_app(db: Database) -> None:
    """``pgtick.testing``'s run_due points the app at the test client and back: the app's own
    client, closed on the way, is not used closed; the app opens a new one over its DSN."""
    from pgtick import App, Context
    from pgtick.testing import JobsTester

    app = App("shop", dsn=db.dsn)

    @app.job("receipt")
    def receipt(ctx: Context) -> None:
        app.enqueue("log-receipt")

    app.enqueue("receipt")
    tester = JobsTester(db.dsn)
    try:
        [outcome] = tester.run_due(app)
        assert outcome.status == "COMPLETED", outcome.error
        app.enqueue("receipt")
        assert client_sessions(db) == 1, "the app's former client is open, or none was opened"
    finally:
        tester.close()
        app.close()
    assert (count_runs(db, "receipt"), count_runs(db, "log-receipt")) == (2, 1)


def test_a_client_over_a_connection_in_a_transaction_joins_it(db: Database) -> None:
    """Documented: on a connection with a transaction open, a call without conn= is a
    savepoint in it; on an idle one, a transaction of its own."""
    with db.connect(autocommit=False) as conn:
        client = Client(conn)
        client.enqueue("joined")  # idle connection: its own transaction, committed
        assert count_runs(db, "joined") == 1
        conn.execute("SELECT 1")  # the caller opens a transaction
        client.enqueue("joined")
        assert count_runs(db, "joined") == 1, "the call committed the caller's open transaction"
        conn.rollback()
    assert count_runs(db, "joined") == 1


def test_the_operator_role_is_enough_for_every_client_call(db: Database) -> None:
    with Client(db.dsn_as("pgtick_t_operator")) as client:
        run = client.enqueue("mail", {"n": 1})
        assert client.get_run(run.id).status == "QUEUED"
        client.define("nightly", "report", "0 3 * * *")
        assert client.cancel(client.run_now("nightly").id) == "CANCELLED"
    with Client(db.dsn_as("pgtick_t_reader")) as reader:
        assert reader.get_run(run.id).id == run.id
        with pytest.raises(PermissionDenied, match=r"GRANT jobs_operator TO pgtick_t_reader\)$"):
            reader.enqueue("mail")


def test_get_run_finds_a_run_moved_to_history(client: Client, db: Database) -> None:
    run = client.enqueue("report", {"day": "2026-01-01"}, idempotency_key="report-2026-01-01")
    client.cancel(run.id)
    with db.connect() as conn:
        conn.execute("UPDATE jobs.runs SET finished_at = now() - interval '3 days' WHERE id = %s", (run.id,))
        assert conn.execute("SELECT jobs.archive()").fetchone() == (1,)
    moved = client.get_run(run.id)
    assert (moved.id, moved.status, moved.payload) == (run.id, "CANCELLED", {"day": "2026-01-01"})
    again = client.enqueue("report", {"day": "2026-01-01"}, idempotency_key="report-2026-01-01")
    assert again.id == run.id, "the key still returns the moved run"


# -- what the session may do ---------------------------------------------------------------------


def test_a_login_without_pgticks_roles_is_told_which_role_to_grant(db: Database) -> None:
    """42501 (insufficient_privilege) reached the caller as a raw psycopg error with no word of
    what to grant; it is a PermissionDenied naming the role the call needs and the login to
    grant it to, with the SQLSTATE and the psycopg error as its cause. Nothing is written."""
    with db.login_without_grants("nogrant") as login:
        with Client(db.dsn_as(login)) as client:
            with pytest.raises(PermissionDenied) as caught:
                client.enqueue("mail", {"n": 1})
            err = caught.value
            assert (err.sqlstate, err.role) == ("42501", "jobs_operator"), vars(err)
            assert str(err).startswith("permission denied for "), str(err)
            assert str(err).endswith(
                f"(Client.enqueue needs a login granted jobs_operator: GRANT jobs_operator TO {login})"
            ), str(err)
            assert isinstance(err.__cause__, psycopg.errors.InsufficientPrivilege)
            assert isinstance(err, PgtickError) and not isinstance(err, UsageError), "not bad input"
            with pytest.raises(
                PermissionDenied,
                match=f"Client.get_run needs a login granted jobs_reader: GRANT jobs_reader TO {login}",
            ):
                client.get_run(1)
            for method in (lambda: client.define("nightly", "report", "0 3 * * *"), lambda: client.cancel(1)):
                with pytest.raises(PermissionDenied, match="GRANT jobs_operator TO"):
                    method()
        with db.connect(user=login, autocommit=False) as conn:  # the caller's transaction
            conn.execute("SELECT 1")
            with pytest.raises(PermissionDenied, match=f"GRANT jobs_operator TO {login}"):
                Client(db.dsn).enqueue_many("mail", [{"n": 2}], conn=conn)
            assert conn.execute("SELECT 2").fetchone() == (2,), "the caller's transaction is still usable"
    assert count_runs(db, "mail") == 0


def test_a_call_in_a_read_only_transaction_says_it_needs_a_read_write_one(db: Database) -> None:
    """25006 (read_only_sql_transaction) reached the caller as a raw psycopg error; it is a
    ReadOnly that says the transaction only reads and what to do, with the SQLSTATE and the
    psycopg error as its cause; the caller's transaction is still usable and nothing is written.
    The same on the client's own connection to a session that defaults to read-only."""
    with db.connect(autocommit=False) as conn, Client(db.dsn) as client:
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(ReadOnly) as caught:
            client.enqueue("mail", {"n": 1}, conn=conn)
        err = caught.value
        assert (err.sqlstate, err.standby) == ("25006", False), vars(err)
        assert str(err) == (
            "cannot execute INSERT in a read-only transaction (the transaction is READ ONLY"
            " (SET TRANSACTION READ ONLY, or default_transaction_read_only on): call it in a"
            " read-write transaction)"
        ), str(err)
        assert isinstance(err.__cause__, psycopg.errors.ReadOnlySqlTransaction)
        with pytest.raises(NotFound):  # a call that only reads goes on in it
            client.get_run(1, conn=conn)
        assert conn.execute("SELECT 1").fetchone() == (1,), "the caller's transaction is still usable"
    read_only = make_conninfo(db.dsn, options="-c default_transaction_read_only=on")
    with Client(read_only) as client:
        with pytest.raises(ReadOnly, match=r"read-only transaction \(the transaction is READ ONLY"):
            client.define("nightly", "report", "0 3 * * *")
        with pytest.raises(ReadOnly):
            client.cancel(1)
    assert count_runs(db, "mail") == 0


# -- the caller's session settings -------------------------------------------------------------

#: Session settings a caller's connection may have that change how the server writes times and
#: durations as text (and reads durations: sql_standard gives a leading sign to every field).
SESSION_STYLES = [
    "DateStyle = 'SQL, DMY'",
    "DateStyle = 'German'",
    "DateStyle = 'Postgres, MDY'",
    "IntervalStyle = 'postgres_verbose'",
    "IntervalStyle = 'sql_standard'",
    "IntervalStyle = 'iso_8601'",
]
#: A time and durations with every field set, microseconds included, so that a field lost or
#: misread on the way shows.
STYLED_AT = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=ZoneInfo("Europe/Sofia"))
STYLED_TIMEOUT = timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=7)
STYLED_HEARTBEAT = timedelta(minutes=2, microseconds=500_001)


def stored_times(db: Database, run_id: int) -> tuple[Any, ...] | None:
    """What the database holds for a run, read on a connection of the default styles."""
    with db.connect() as c:
        return c.execute(
            "SELECT scheduled_for, timeout, heartbeat_timeout, status FROM jobs.runs WHERE id = %s", (run_id,)
        ).fetchone()


@pytest.mark.parametrize("style", SESSION_STYLES)
@pytest.mark.parametrize("given", ["conn=", "Client(conn)", "conn= binding on the client"])
def test_a_callers_connection_of_any_date_and_interval_style_gets_exact_times_and_durations(
    db: Database, style: str, given: str
) -> None:
    """psycopg reads times only in the ISO DateStyle and durations only in the postgres
    IntervalStyle: a caller's connection set otherwise failed every call that returns a run
    or a definition (NotImplementedError), after its statement had run. The client reads
    them whatever the session says, sends them so that the server reads them exactly, and
    leaves the caller's settings as they were; also on a connection whose cursors bind on
    the client (Django's)."""
    factory = psycopg.ClientCursor if given.endswith("client") else psycopg.Cursor
    with db.connect(autocommit=False, cursor_factory=factory) as conn:
        conn.execute(f"SET {style}")
        conn.commit()
        shown = conn.execute(f"SHOW {style.split()[0]}").fetchone()
        client = Client(conn) if given == "Client(conn)" else Client(db.dsn)
        on = None if given == "Client(conn)" else conn
        run = client.enqueue(
            "styled", {"n": 1}, run_at=STYLED_AT, timeout=STYLED_TIMEOUT, heartbeat_timeout=STYLED_HEARTBEAT,
            unique_key="styled-1", unique_for=STYLED_TIMEOUT, conn=on,
        )  # fmt: skip
        assert (run.scheduled_for, run.timeout, run.heartbeat_timeout, run.status) == (
            STYLED_AT, STYLED_TIMEOUT, STYLED_HEARTBEAT, "QUEUED"
        ), run  # fmt: skip
        assert run.created_at is not None and abs(run.created_at - datetime.now(UTC)) < timedelta(hours=1)
        [many] = client.enqueue_many("styled", [{"n": 2}], run_at=STYLED_AT, timeout=STYLED_TIMEOUT, conn=on)
        assert (many.scheduled_for, many.timeout) == (STYLED_AT, STYLED_TIMEOUT)
        again = client.get_run(run.id, conn=on)
        assert (again.scheduled_for, again.timeout, again.heartbeat_timeout) == (
            STYLED_AT, STYLED_TIMEOUT, STYLED_HEARTBEAT
        )  # fmt: skip
        defined = client.define(
            "styled-once", "styled", run_at=STYLED_AT, timeout=STYLED_TIMEOUT,
            heartbeat_timeout=STYLED_HEARTBEAT, conn=on,
        )  # fmt: skip
        assert (defined.run_at, defined.timeout, defined.heartbeat_timeout) == (
            STYLED_AT, STYLED_TIMEOUT, STYLED_HEARTBEAT
        )  # fmt: skip
        nightly = client.define("styled-nightly", "styled", "0 3 * * *", jitter=STYLED_HEARTBEAT, conn=on)
        assert nightly.jitter == STYLED_HEARTBEAT and nightly.created_at is not None
        assert client.cancel(many.id, conn=on) == "CANCELLED"
        assert client.retry(many.id, conn=on).timeout == STYLED_TIMEOUT
        assert conn.execute(f"SHOW {style.split()[0]}").fetchone() == shown, "the caller's setting changed"
        conn.commit()
        client.close()
    assert stored_times(db, run.id) == (STYLED_AT, STYLED_TIMEOUT, STYLED_HEARTBEAT, "QUEUED")


@pytest.mark.parametrize("given", ["conn=", "Client(conn)"])
def test_a_callers_connection_in_another_encoding_gets_its_payloads_back(db: Database, given: str) -> None:
    """psycopg reads JSON as UTF-8 whatever the connection's encoding, and the server sends it in
    that encoding: on a caller's connection in LATIN1 a payload with an ``ü`` failed the call
    (UnicodeDecodeError) after its statement had run. The client reads it back as it was sent,
    and leaves the connection's encoding as it was."""
    payload = {"city": "Zürich", "note": "naïve"}
    with db.connect(autocommit=False, client_encoding="LATIN1") as conn:
        client = Client(conn) if given == "Client(conn)" else Client(db.dsn)
        on = None if given == "Client(conn)" else conn
        run = client.enqueue("receipt", payload, conn=on)
        assert run.payload == payload, run.payload
        assert client.get_run(run.id, conn=on).payload == payload
        [many] = client.enqueue_many("receipt", [payload], conn=on)
        assert many.payload == payload
        assert conn.info.encoding == "iso8859-1", "the caller's encoding changed"
        conn.commit()
        client.close()
    with db.connect() as c:
        assert c.execute("SELECT payload FROM jobs.runs WHERE id = %s", (run.id,)).fetchone() == (payload,)


@pytest.mark.parametrize("given", ["conn=", "Client(conn)"])
def test_text_the_callers_connection_encoding_cannot_carry_is_refused_by_name(
    db: Database, given: str
) -> None:
    """A text argument with a character the caller's connection encoding has no byte for (a
    euro sign on a LATIN1 connection) is an InvalidArgument naming the argument and its
    encoding, not psycopg's UnicodeEncodeError; nothing is sent, and the caller's transaction
    goes on."""
    with db.connect(autocommit=False, client_encoding="LATIN1") as conn:
        client = Client(conn) if given == "Client(conn)" else Client(db.dsn)
        on = None if given == "Client(conn)" else conn
        conn.execute("CREATE TEMP TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        refused: list[tuple[str, Callable[[], Any]]] = [
            ("kind", lambda: client.enqueue("receipt\u20ac", conn=on)),
            ("queue", lambda: client.enqueue("receipt", queue="\u20ac", conn=on)),
            ("unique_key", lambda: client.enqueue("receipt", unique_key="order-1-\u20ac", conn=on)),
            ("kind", lambda: client.enqueue_many("receipt\u20ac", [{}], conn=on)),
            ("name", lambda: client.run_now("nightly-\u20ac", conn=on)),
            ("name", lambda: client.pause_queue("\u20ac", conn=on)),
        ]
        for field, call in refused:
            with pytest.raises(InvalidArgument) as caught:
                call()
            assert caught.value.field == field, caught.value
            assert "LATIN1" in str(caught.value) and "\u20ac" in str(caught.value), caught.value
        run = client.enqueue("receipt", {"order": 1}, queue="caf\u00e9", conn=on)  # LATIN1 has an é
        assert run.queue == "caf\u00e9"
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        conn.commit()
        client.close()
    assert count_runs(db, "receipt") == 1


def test_a_column_of_a_type_the_driver_cannot_read_does_not_fail_the_call(
    client: Client, db: Database
) -> None:
    """A newer schema's (or an operator's) column of jobs.runs goes to Run.extra: one of a type
    psycopg has no binary loader for, and which is not an enum (whose label is read as text),
    comes as its bytes rather than failing the call."""
    run = client.enqueue("report")
    with db.connect() as conn:
        conn.execute("ALTER TABLE jobs.runs ADD COLUMN spot point")
        conn.execute("UPDATE jobs.runs SET spot = '(1, 2)' WHERE id = %s", (run.id,))
    got = client.get_run(run.id)
    assert got.status == "QUEUED"
    assert got.extra["spot"] == b"?\xf0" + bytes(6) + b"@" + bytes(7), got.extra
