"""pgtick.AsyncClient under asyncio: the same transaction rules as Client (an enqueue with
``conn=`` commits or rolls back with the caller), over a conninfo, an AsyncConnection and an
AsyncConnectionPool, and the same errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

from harness import Database, end_client_sessions
from pgtick import AsyncClient, Run
from pgtick.errors import InvalidArgument, NotFound, PermissionDenied, ReadOnly, UsageError

pytestmark = pytest.mark.asyncio


async def count_runs(db: Database, kind: str) -> int:
    async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as c:
        cur = await c.execute("SELECT count(*) FROM jobs.runs WHERE kind = %s", (kind,))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest_asyncio.fixture(params=["conninfo", "connection", "pool"])
async def client(request: pytest.FixtureRequest, db: Database) -> AsyncIterator[AsyncClient]:
    """An async client over each kind of source."""
    if request.param == "conninfo":
        async with AsyncClient(db.dsn) as c:
            yield c
    elif request.param == "connection":
        async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as conn:
            yield AsyncClient(conn)
    else:
        async with AsyncConnectionPool(db.dsn, min_size=1, max_size=2, open=False) as pool:
            yield AsyncClient(pool)


async def test_an_async_enqueue_with_conn_rolls_back_with_the_callers_transaction(
    client: AsyncClient, db: Database
) -> None:
    async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
        run = await client.enqueue("receipt", {"order": 1}, conn=conn)
        assert run.status == "QUEUED"
        assert await count_runs(db, "receipt") == 0, "the run is visible before the caller committed"
        await conn.rollback()
    assert await count_runs(db, "receipt") == 0, f"run {run.id} survived the caller's rollback"


async def test_a_refused_async_call_with_conn_leaves_the_callers_transaction_usable(
    client: AsyncClient, db: Database
) -> None:
    async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
        await client.enqueue("receipt", {"order": 3}, conn=conn)
        with pytest.raises(NotFound):
            await client.cancel(424242, conn=conn)
        await client.enqueue("receipt", {"order": 4}, conn=conn)
        assert await count_runs(db, "receipt") == 0, "committed before the caller did"
        await conn.commit()
    assert await count_runs(db, "receipt") == 2


async def test_an_async_enqueue_with_conn_commits_with_the_callers_transaction(
    client: AsyncClient, db: Database
) -> None:
    async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
        run = await client.enqueue("receipt", {"order": 2}, conn=conn)
        assert await count_runs(db, "receipt") == 0, "the run is visible before the caller committed"
        await conn.commit()
    assert await count_runs(db, "receipt") == 1
    assert (await client.get_run(run.id)).payload == {"order": 2}


async def test_every_async_method_calls_its_sql_function(client: AsyncClient, db: Database) -> None:
    at = datetime(2031, 7, 1, 9, 0)
    run = await client.enqueue("mail", {"n": 1}, run_at=at, tz="Europe/Sofia", priority=2, max_attempts=3)
    assert isinstance(run, Run)
    assert (run.scheduled_for, run.priority, run.max_attempts) == (datetime(2031, 7, 1, 6, tzinfo=UTC), 2, 3)
    assert await count_runs(db, "mail") == 1, "a call without conn= did not commit"

    definition = await client.define("nightly", "report", "0 3 * * *", timezone="Europe/Sofia", priority=4)
    assert (definition.name, definition.priority) == ("nightly", 4)
    queued = await client.run_now("nightly")
    assert queued.definition_id == definition.id
    assert await client.cancel(queued.id) == "CANCELLED"
    assert (await client.get_run(queued.id)).status == "CANCELLED"
    again = await client.retry(queued.id)
    assert (again.status, again.attempt, again.retry_of) == ("QUEUED", 2, queued.id)


async def test_async_errors_are_mapped(client: AsyncClient) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue("mail", priority=-5000)
    assert caught.value.field == "priority"
    with pytest.raises(InvalidArgument, match="naive"):
        await client.enqueue("mail", run_at=datetime(2031, 1, 1))
    with pytest.raises(NotFound, match="'nope'"):
        await client.run_now("nope")
    with pytest.raises(NotFound, match="424242"):
        await client.get_run(424242)


async def test_concurrent_async_enqueues_share_one_client(client: AsyncClient, db: Database) -> None:
    runs = await asyncio.gather(*(client.enqueue("fan", {"i": i}) for i in range(20)))
    assert len({r.id for r in runs}) == 20
    assert await count_runs(db, "fan") == 20


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_gathered_enqueues_in_one_callers_transaction_each_succeed_and_share_its_outcome(
    client: AsyncClient, db: Database, outcome: str
) -> None:
    """The tasks of an asyncio.gather on one caller's connection go one at a time: interleaved,
    each one's savepoint ended another's out of order, and every call raised while its run
    stayed in the transaction (committed with it, though the caller was told it failed)."""
    async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
        calls = [client.enqueue("shared", {"i": i}, conn=conn) for i in range(20)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
        assert failed == [], f"{len(failed)} of 20 calls raised, the first: {failed[:1]}"
        assert len({r.id for r in results if isinstance(r, Run)}) == 20
        assert await count_runs(db, "shared") == 0, "committed before the caller did"
        await (conn.commit() if outcome == "commit" else conn.rollback())
    assert await count_runs(db, "shared") == (20 if outcome == "commit" else 0)


async def test_an_async_call_after_the_server_ended_the_idle_connection_goes_on_a_new_one(
    db: Database,
) -> None:
    """As Client: the next call after the server ended the idle connection does not fail."""
    async with AsyncClient(db.dsn) as client:
        await client.enqueue("before")
        await asyncio.to_thread(end_client_sessions, db)
        run = await client.enqueue("after")
        assert (await client.get_run(run.id)).kind == "after"
    assert await count_runs(db, "after") == 1


async def test_one_client_serves_one_event_loop_after_another(client: AsyncClient, db: Database) -> None:
    """A client kept across event loops (a module-level client under asyncio.run per call, a
    test loop per test) still takes concurrent calls in each loop."""

    async def three(loop_number: int) -> list[Run]:
        return list(await asyncio.gather(*(client.enqueue("loops", {"loop": loop_number}) for _ in range(3))))

    assert len(await three(0)) == 3
    for loop_number in (1, 2):  # each a new event loop, in a thread while this one waits
        runs = await asyncio.to_thread(asyncio.run, three(loop_number))
        assert [r.payload for r in runs] == [{"loop": loop_number}] * 3
    assert await count_runs(db, "loops") == 9


@pytest.mark.parametrize("source", ["conninfo", "connection"])
async def test_a_second_event_loop_is_refused_while_another_has_a_call_in_progress(
    db: Database, source: str
) -> None:
    """One connection serves one call at a time: a call from another loop (another thread)
    while one is in progress is refused with UsageError at once, never left to hang or to
    drive the connection with the first; once the first ends, that loop may call."""
    async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as given:
        client = AsyncClient(db.dsn) if source == "conninfo" else AsyncClient(given)
        async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as holder:
            async with holder.transaction():
                await holder.execute("SELECT pg_advisory_xact_lock(jobs._unique_key('held', 'k'))")
                first = asyncio.create_task(client.enqueue("held", unique_key="k"))
                waiting = (  # in this test's database: other tests share the server
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                )
                deadline = asyncio.get_running_loop().time() + 60
                while (await (await holder.execute(waiting)).fetchone()) != (1,):  # the first call waits
                    assert asyncio.get_running_loop().time() < deadline, "the first call never waited"
                    await asyncio.sleep(0.01)

                def other_loop() -> BaseException | None:
                    try:
                        asyncio.run(client.enqueue("other"))
                    except BaseException as exc:  # handed back to the test
                        return exc
                    return None

                refused = await asyncio.wait_for(asyncio.to_thread(other_loop), 60)
            assert isinstance(refused, UsageError) and "another event loop" in str(refused), refused
            assert (await asyncio.wait_for(first, 60)).kind == "held"
        assert (await asyncio.to_thread(asyncio.run, client.enqueue("other"))).kind == "other"
        await client.close()
    assert await count_runs(db, "other") == 1


async def client_sessions(db: Database) -> int:
    """The server sessions a ``pgtick.AsyncClient`` holds on this test's database."""
    async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'pgtick-client'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("source", ["conninfo", "connection", "pool"])
async def test_a_closed_async_client_refuses_every_call_and_opens_no_connection(
    db: Database, source: str
) -> None:
    """As ``Client``: after ``await close()`` every method raises UsageError saying the
    client is closed, with ``conn=`` or without, and nothing is sent; what it was given stays
    open, the giver's."""
    async with (
        await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as given_conn,
        AsyncConnectionPool(db.dsn, min_size=1, open=False) as pool,
    ):
        sources: dict[str, str | psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any]] = {
            "conninfo": db.dsn,
            "connection": given_conn,
            "pool": pool,
        }
        client = AsyncClient(sources[source])
        run = await client.enqueue("closing")
        await client.close()
        await client.close()  # idempotent
        assert client.closed
        for _ in range(600):  # the server ends the session a moment after the client closed it
            if await client_sessions(db) == 0:
                break
            await asyncio.sleep(0.05)
        assert await client_sessions(db) == 0, "close() left the client's own session open"
        calls: dict[str, Callable[[], Awaitable[object]]] = {
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
            with pytest.raises(UsageError, match=r"this AsyncClient is closed \(close\(\) was called on it"):
                await refused()
            assert await client_sessions(db) == 0, f"{method} after close() opened a connection"
        async with await psycopg.AsyncConnection.connect(db.dsn) as callers:
            with pytest.raises(UsageError, match="AsyncClient is closed"):
                await client.enqueue("closing", conn=callers)
        assert not given_conn.closed, "close() closed a connection the client was given"
        async with pool.connection() as pooled:
            cur = await pooled.execute("SELECT 1")
            assert await cur.fetchone() == (1,), "close() closed the pool it was given"
    assert await count_runs(db, "closing") == 1


async def test_an_async_enqueue_on_the_clients_own_connection_notifies_after_its_commit(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the sync client: the NOTIFY deferred past the commit and sent on its own (told apart
    here by its payload); a refusal by the database wakes nobody and the connection goes on."""
    monkeypatch.setattr("pgtick.client.WAKE", "SELECT pg_notify('jobs', 'after')")
    async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as listener:
        await listener.execute("LISTEN jobs")
        async with AsyncClient(db.dsn) as client:
            await client.enqueue("k")
            with pytest.raises(NotFound, match="depends_on"):
                await client.enqueue("k", depends_on=[987654321])
            await client.enqueue_many("k", [{}, {}])
        await listener.execute("SELECT pg_notify('jobs', 'sentinel')")
        got: list[str] = []
        async for n in listener.notifies(timeout=30.0):
            if n.payload == "sentinel":
                break
            got.append(n.payload)
    assert got == ["after", "after"]
    assert await count_runs(db, "k") == 3


@pytest.mark.parametrize(
    "style",
    [
        "DateStyle = 'SQL, DMY'",
        "DateStyle = 'German'",
        "IntervalStyle = 'sql_standard'",
        "IntervalStyle = 'postgres_verbose'",
    ],
)
async def test_an_async_callers_connection_of_any_date_and_interval_style_gets_exact_times_and_durations(
    db: Database, style: str
) -> None:
    """As for Client: the async client reads times and durations whatever the caller's session
    says (it failed every call that returns a run), sends them exactly, and changes no setting."""
    at = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    timeout = timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=7)
    jitter = timedelta(minutes=2, microseconds=500_001)
    async with await psycopg.AsyncConnection.connect(db.dsn) as conn:
        await conn.execute(f"SET {style}")
        await conn.commit()
        show = f"SHOW {style.split()[0]}"
        shown = await (await conn.execute(show)).fetchone()
        for client, on in ((AsyncClient(db.dsn), conn), (AsyncClient(conn), None)):
            run = await client.enqueue(
                "styled", run_at=at, timeout=timeout, heartbeat_timeout=timeout, conn=on
            )
            assert (run.scheduled_for, run.timeout, run.heartbeat_timeout, run.status) == (
                at, timeout, timeout, "QUEUED"
            )  # fmt: skip
            got = await client.get_run(run.id, conn=on)
            assert (got.scheduled_for, got.timeout) == (at, timeout)
            assert await client.cancel(run.id, conn=on) == "CANCELLED"
            defined = await client.define("styled", "styled", "0 3 * * *", jitter=jitter, conn=on)
            assert defined.jitter == jitter and defined.created_at is not None
            await client.close()
        assert await (await conn.execute(show)).fetchone() == shown, "the caller's setting changed"
        await conn.commit()


async def test_an_async_call_refused_a_privilege_or_in_a_read_only_transaction_says_what_to_do(
    db: Database,
) -> None:
    """As for Client: 42501 is a PermissionDenied naming the role to grant and the login, 25006
    a ReadOnly saying the transaction only reads; both keep the SQLSTATE and the psycopg
    error, and leave the caller's transaction usable."""
    with db.login_without_grants("nogrant_async") as login:
        async with AsyncClient(db.dsn_as(login)) as client:
            with pytest.raises(PermissionDenied) as denied:
                await client.enqueue("mail")
            assert (denied.value.sqlstate, denied.value.role) == ("42501", "jobs_operator")
            assert str(denied.value).endswith(
                f"(AsyncClient.enqueue needs a login granted jobs_operator: GRANT jobs_operator TO {login})"
            ), str(denied.value)
            assert isinstance(denied.value.__cause__, psycopg.errors.InsufficientPrivilege)
            with pytest.raises(PermissionDenied, match=f"GRANT jobs_reader TO {login}"):
                await client.get_run(1)
    async with await psycopg.AsyncConnection.connect(db.dsn) as conn, AsyncClient(conn) as client:
        await conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(ReadOnly, match="call it in a read-write transaction") as read_only:
            await client.enqueue("mail", conn=conn)
        assert (read_only.value.sqlstate, read_only.value.standby) == ("25006", False)
        assert isinstance(read_only.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,), "the transaction is usable"
    assert await count_runs(db, "mail") == 0


async def test_an_async_callers_connection_in_another_encoding_gets_its_payloads_back(db: Database) -> None:
    """As for Client: a payload with an ``ü`` on a caller's LATIN1 connection is read back as sent."""
    payload = {"city": "Zürich"}
    async with (
        await psycopg.AsyncConnection.connect(db.dsn, client_encoding="LATIN1") as conn,
        AsyncClient(db.dsn) as client,
    ):
        run = await client.enqueue("receipt", payload, conn=conn)
        assert run.payload == payload and (await client.get_run(run.id, conn=conn)).payload == payload


async def test_text_an_async_callers_connection_encoding_cannot_carry_is_refused(db: Database) -> None:
    """As for Client: a euro sign in the kind on a caller's LATIN1 connection is an
    InvalidArgument naming the kind, and the caller's transaction goes on."""
    async with (
        await psycopg.AsyncConnection.connect(db.dsn, client_encoding="LATIN1") as conn,
        AsyncClient(db.dsn) as client,
    ):
        with pytest.raises(InvalidArgument, match="LATIN1") as caught:
            await client.enqueue("receipt\u20ac", conn=conn)
        assert caught.value.field == "kind"
        await client.enqueue("receipt", conn=conn)
        await conn.commit()
    assert await count_runs(db, "receipt") == 1
