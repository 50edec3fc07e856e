"""The Python API checks what application code hands it before any SQL is sent: numbers in
the SQL API's documented range, durations finite and bounded, text without NUL, times with a
zone. A refusal is an ``InvalidArgument`` (also a ``ValueError``) naming the argument. A naive
time with a zone is wall time there, whatever the session's TimeZone."""

from __future__ import annotations

import asyncio
import logging
from collections import UserDict
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from functools import partial
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
import pytz

from harness import Database, scalar
from pgtick import App, AsyncClient, Client, Run
from pgtick.definitions import sync_app
from pgtick.errors import InvalidArgument, PgtickError, UsageError, WrongTransaction

NOWHERE = "postgresql://nobody@127.0.0.1:1/x"  # nothing listens: a call that sent SQL would fail to connect

CASES: list[tuple[str, Callable[[Client], Any], str]] = [
    ("cancel-past-bigint", lambda c: c.cancel(2**63), "run_id"),
    ("cancel-zero", lambda c: c.cancel(0), "run_id"),
    ("get-run-past-bigint", lambda c: c.get_run(2**64), "run_id"),
    ("priority-past-integer", lambda c: c.enqueue("k", priority=2**31), "priority"),
    ("priority-float", lambda c: c.enqueue("k", priority=1.5), "priority"),  # type: ignore[arg-type]
    ("max-attempts-bool", lambda c: c.enqueue("k", max_attempts=True), "max_attempts"),
    ("max-attempts-past-integer", lambda c: c.enqueue("k", max_attempts=2147483648), "max_attempts"),
    ("timeout-infinite", lambda c: c.enqueue("k", timeout=float("inf")), "timeout"),
    ("timeout-nan", lambda c: c.enqueue("k", timeout=float("nan")), "timeout"),
    ("timeout-huge", lambda c: c.enqueue("k", timeout=1e300), "timeout"),
    ("heartbeat-timeout-max", lambda c: c.enqueue("k", heartbeat_timeout=timedelta.max), "heartbeat_timeout"),
    ("depends-on-past-bigint", lambda c: c.enqueue("k", depends_on=[1, 2**63]), "depends_on"),
    # one id where the function takes a list: an int is not iterable, text iterates its digits
    ("depends-on-one-id", lambda c: c.enqueue("k", depends_on=5), "depends_on"),  # type: ignore[arg-type]
    ("depends-on-text", lambda c: c.enqueue("k", depends_on="12"), "depends_on"),  # type: ignore[arg-type]
    ("kind-with-nul", lambda c: c.enqueue("a\x00b"), "kind"),
    # a kind of only whitespace: no one can tell it in a log line or a table (app.job refuses it)
    ("kind-spaces", lambda c: c.enqueue("   "), "kind"),
    ("kind-tab", lambda c: c.enqueue("\t"), "kind"),
    ("kind-empty", lambda c: c.enqueue(""), "kind"),
    ("enqueue-many-kind-spaces", lambda c: c.enqueue_many(" ", [{}]), "kind"),
    ("define-kind-spaces", lambda c: c.define("x", "  ", "* * * * *"), "kind"),
    ("define-kind-unicode-spaces", lambda c: c.define("x", "\u00a0\u3000", "* * * * *"), "kind"),
    ("payload-nan", lambda c: c.enqueue("k", {"a": float("nan")}), "payload"),
    ("payload-nul-key", lambda c: c.enqueue("k", {"a\x00": 1}), "payload"),
    # half of a UTF-16 pair is not a character: no PostgreSQL text or jsonb holds it
    ("payload-lone-surrogate", lambda c: c.enqueue("k", {"a": "x\ud800"}), "payload"),
    ("payload-lone-surrogate-key", lambda c: c.enqueue("k", {"\udfff": 1}), "payload"),
    ("payloads-lone-surrogate", lambda c: c.enqueue_many("k", [{}, {"a": ["\udc80"]}]), "payloads"),
    ("kind-lone-surrogate", lambda c: c.enqueue("k\udc80"), "kind"),
    ("payload-nested", lambda c: c.enqueue("k", {"a": _nested(100_000)}), "payload"),
    ("payloads-infinite", lambda c: c.enqueue_many("k", [{}, {"a": float("-inf")}]), "payloads"),
    ("payloads-not-a-list", lambda c: c.enqueue_many("k", 5), "payloads"),  # type: ignore[arg-type]
    ("naive-run-at", lambda c: c.enqueue("k", run_at=datetime(2031, 1, 1)), "run_at"),
    ("run-at-a-date", lambda c: c.enqueue("k", run_at=date(2031, 1, 1), tz="UTC"), "run_at"),  # type: ignore[arg-type]
    ("run-at-epoch-seconds", lambda c: c.enqueue("k", run_at=1_900_000_000), "run_at"),  # type: ignore[arg-type]
    (
        "define-run-at-a-date",
        lambda c: c.define("x", "k", run_at=date(2031, 1, 1), timezone="UTC"),  # type: ignore[arg-type]
        "run_at",
    ),
    (
        "run-at-past-year-9999",
        lambda c: c.enqueue("k", run_at=datetime(9999, 12, 31, 23), tz="America/New_York"),
        "run_at",
    ),
    (
        "cap-past-limit",
        lambda c: c.define("x", "k", "* * * * *", max_concurrent_runs=10**6),
        "max_concurrent_runs",
    ),
    ("jitter-nan", lambda c: c.define("x", "k", "* * * * *", jitter=float("nan")), "jitter"),
    # a schedule is checked as pgtick define and an app's schedules check it
    ("jitter-over-spacing", lambda c: c.define("x", "k", "*/5 * * * *", jitter=600), "jitter"),
    (  # both readings of 01:30 on a fall-back day run an hour apart: 3 h would let them swap
        "jitter-over-the-spacing-of-a-repeated-hour",
        lambda c: c.define(
            "x", "k", "30 1 * * *", timezone="America/New_York", dst_repeat="both", jitter=3 * 3600
        ),
        "jitter",
    ),
    (  # a yearly rule half an hour off a daily one: the two meet once a year, past the 50th run
        "jitter-over-the-spacing-of-two-rules",
        lambda c: c.define(
            "x",
            "k",
            "RRULE:FREQ=DAILY;BYHOUR=0;BYMINUTE=30\nRRULE:FREQ=YEARLY;BYMONTH=6;BYMONTHDAY=1;BYHOUR=0;BYMINUTE=0",
            jitter=2 * 3600,
        ),
        "jitter",
    ),
    ("dst-gap-unknown", lambda c: c.define("x", "k", "0 9 * * *", dst_gap="later"), "dst_gap"),
    ("schedule-bad", lambda c: c.define("x", "k", "0 25 * * *"), "schedule"),
    ("timezone-unknown", lambda c: c.define("x", "k", "0 9 * * *", timezone="Mars/Base"), "timezone"),
    # None where the SQL API has no default: refused by name, not sent without it
    ("kind-none", lambda c: c.enqueue(None), "kind"),  # type: ignore[arg-type]
    ("run-now-none", lambda c: c.run_now(None), "name"),  # type: ignore[arg-type]
    ("define-name-none", lambda c: c.define(None, "k", "* * * * *"), "name"),  # type: ignore[arg-type]
    ("define-kind-none", lambda c: c.define("x", None, "* * * * *"), "kind"),  # type: ignore[arg-type]
    ("cancel-none", lambda c: c.cancel(None), "run_id"),  # type: ignore[arg-type]
    ("pause-queue-none", lambda c: c.pause_queue(None), "name"),  # type: ignore[arg-type]
    ("schedule-a-number", lambda c: c.define("x", "k", 5), "schedule"),  # type: ignore[arg-type]
    ("tz-a-number", lambda c: c.enqueue("k", run_at=datetime(2031, 1, 1), tz=5), "tz"),  # type: ignore[arg-type]
    ("timezone-a-number", lambda c: c.define("x", "k", "0 9 * * *", timezone=5), "timezone"),  # type: ignore[arg-type]
    (
        "pause-after-huge",
        lambda c: c.define("x", "k", "* * * * *", pause_after_failures=10**20),
        "pause_after_failures",
    ),
]


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("call", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_argument_is_refused_by_name_before_any_sql(call: Callable[[Client], Any], field: str) -> None:
    with Client(NOWHERE) as client, pytest.raises(InvalidArgument) as caught:
        call(client)
    assert caught.value.field == field, (
        f"refused naming {caught.value.field!r}, not {field!r}: {caught.value}"
    )
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is None, f"the refusal came from the database: {caught.value.__cause__!r}"


DATABASE_CASES = [
    ("payload-too-deep", lambda c: c.enqueue("k", {"a": _nested(150)}), "payload"),
    ("payloads-empty", lambda c: c.enqueue_many("k", []), "payloads"),
    ("payloads-too-big", lambda c: c.enqueue_many("k", [{}, {"x": "a" * 1_100_000}]), "payloads"),
    ("depends-on-unknown", lambda c: c.enqueue("k", depends_on=[10**15]), "depends_on"),
    (
        "unique-and-idempotent",
        lambda c: c.enqueue("k", unique_key="u", idempotency_key="i"),
        "idempotency_key",
    ),
    ("on-conflict-without-key", lambda c: c.enqueue("k", on_conflict="replace"), "unique_key"),
    ("define-neither", lambda c: c.define("x", "k"), "schedule"),
    ("idempotency-key-blank", lambda c: c.enqueue("k", idempotency_key="  "), "idempotency_key"),
    ("unique-key-blank", lambda c: c.enqueue("k", unique_key="\u00a0"), "unique_key"),
    ("concurrency-key-blank", lambda c: c.enqueue_many("k", [{}], concurrency_key=" "), "concurrency_key"),
]


@pytest.mark.parametrize(
    ("call", "field"), [c[1:] for c in DATABASE_CASES], ids=[c[0] for c in DATABASE_CASES]
)
def test_a_refusal_by_the_database_names_the_argument(
    db: Database, call: Callable[[Client], Any], field: str
) -> None:
    with Client(db.dsn) as client, pytest.raises(PgtickError) as caught:
        call(client)
    assert getattr(caught.value, "field", None) == field, f"refused naming {caught.value!r}"
    assert caught.value.__cause__ is not None, "the database refused it"


def test_a_client_of_a_database_whose_default_isolation_is_serializable_enqueues(db: Database) -> None:
    """The connection the client opens from a conninfo runs pgtick's calls, which need READ
    COMMITTED, whatever default_transaction_isolation the database, role or DSN set."""
    from psycopg.conninfo import make_conninfo

    dsn = make_conninfo(db.dsn, options="-c default_transaction_isolation=serializable")
    with Client(dsn) as client:
        first = client.enqueue("k", idempotency_key="order-42")
        assert client.enqueue("k", idempotency_key="order-42").id == first.id

    async def main() -> int:
        async with AsyncClient(dsn) as client:
            return (await client.enqueue("k", unique_key="order-43")).id

    assert asyncio.run(main()) > first.id


def test_a_connection_whose_setup_was_interrupted_is_not_used_unprepared(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's connection is made fit for its calls right after it is opened (READ
    COMMITTED here). When that setup is interrupted (a cancelled task, a timeout, Ctrl-C) the
    call fails; the next call must not go on the half-set-up connection, where every
    idempotent enqueue then failed as WrongTransaction for the life of the client."""
    from psycopg.conninfo import make_conninfo

    from pgtick.db import prepare, prepare_async

    dsn = make_conninfo(db.dsn, options="-c default_transaction_isolation=serializable")

    def interrupted_once(conn: psycopg.Connection[Any]) -> bool:
        monkeypatch.setattr("pgtick.client.prepare", prepare)
        raise KeyboardInterrupt("the first setup was interrupted")

    async def interrupted_once_async(conn: psycopg.AsyncConnection[Any]) -> bool:
        monkeypatch.setattr("pgtick.client.prepare_async", prepare_async)
        raise asyncio.CancelledError("the first setup was interrupted")

    monkeypatch.setattr("pgtick.client.prepare", interrupted_once)
    with Client(dsn) as client:
        with pytest.raises(KeyboardInterrupt):
            client.enqueue("k", idempotency_key="order-44")
        first = client.enqueue("k", idempotency_key="order-44")
        assert client.enqueue("k", idempotency_key="order-44").id == first.id

    monkeypatch.setattr("pgtick.client.prepare_async", interrupted_once_async)

    async def main() -> int:
        async with AsyncClient(dsn) as client:
            with pytest.raises(asyncio.CancelledError):
                await client.enqueue("k", unique_key="order-45")
            return (await client.enqueue("k", unique_key="order-45")).id

    assert asyncio.run(main()) > first.id


def test_the_async_client_refuses_the_same_before_any_sql() -> None:
    async def main() -> None:
        async with AsyncClient(NOWHERE) as client:
            with pytest.raises(InvalidArgument, match="run_id must be between 1 and"):
                await client.cancel(2**63)
            with pytest.raises(InvalidArgument, match="timeout"):
                await client.enqueue("k", timeout=float("inf"))
            blank = "kind must be a non-empty text, not only whitespace"
            with pytest.raises(InvalidArgument, match=blank):
                await client.enqueue("   ")
            with pytest.raises(InvalidArgument, match=blank):
                await client.enqueue_many("\t", [{}])
            with pytest.raises(InvalidArgument, match=blank):
                await client.define("x", " \n ", "* * * * *")

    asyncio.run(main())


UNKNOWN_KEYWORDS: list[tuple[str, Callable[[Any], Any]]] = [
    ("enqueue", lambda c: c.enqueue("k", {}, prority=1)),
    ("enqueue_many", lambda c: c.enqueue_many("k", [{}], prority=1)),
    ("enqueue_many", lambda c: c.enqueue_many("k", [{}], unique_key="u")),  # an enqueue option only
    ("define", lambda c: c.define("x", "k", "* * * * *", misfire="skip")),
]


@pytest.mark.parametrize(
    ("method", "call"), UNKNOWN_KEYWORDS, ids=[f"{c[0]}-{i}" for i, c in enumerate(UNKNOWN_KEYWORDS)]
)
def test_an_unknown_keyword_is_a_type_error_naming_it_before_any_sql(
    method: str, call: Callable[[Any], Any]
) -> None:
    """As Python refuses a keyword a function does not take, in both clients (the async one
    when awaited); the declared keywords are the methods' signature."""
    import inspect

    with Client(NOWHERE) as client, pytest.raises(TypeError) as caught:
        call(client)
    assert str(caught.value).startswith(f"Client.{method}() got an unexpected keyword argument"), caught.value

    async def main() -> None:
        async with AsyncClient(NOWHERE) as client:
            with pytest.raises(TypeError, match=rf"^AsyncClient\.{method}\(\) got an unexpected keyword"):
                await call(client)

    asyncio.run(main())
    for cls in (Client, AsyncClient):
        parameters = inspect.signature(getattr(cls, method)).parameters
        assert "options" not in parameters and "run_at" in parameters and "conn" in parameters, (
            f"{cls.__name__}.{method}{inspect.signature(getattr(cls, method))}"
        )


def _in_auckland(db: Database) -> str:
    return f"{db.dsn} options='-c TimeZone=Pacific/Auckland'"


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("send\x00receipt", "control characters"),
        ("send\treceipt", "control characters"),
        ("send\ud800receipt", "control characters"),
        ("send\x85receipt", "control characters"),
        ("send\u202ereceipt", "invisible or text-direction characters, got U\\+202E"),
        ("\ufeffsend", "invisible or text-direction characters, got U\\+FEFF"),
    ],
)
def test_a_job_kind_the_sql_api_refuses_is_refused_when_registered(kind: str, rule: str) -> None:
    """A kind with a control character (NUL, a tab, C1), a lone surrogate or a character that
    hides or turns text around is refused by @app.job itself, naming the rule, not later by
    the database with a bare driver error."""
    app = App()
    with pytest.raises(UsageError, match=rule):
        app.job(kind)(lambda ctx: None)
    assert kind not in app.jobs
    app.job("send-réceipt ✉")(lambda ctx: None)


def test_a_time_zone_given_as_a_tzinfo_is_read_as_the_zone_it_names(db: Database) -> None:
    """tz may be a tzinfo: a ZoneInfo, a fixed offset, or a pytz zone (read as the IANA zone it
    names: pytz's own zones put on a naive datetime give the zone's local mean time, +01:33 for
    Sofia); a pytz zone that names no zone is refused, naming tz."""
    eve = datetime(2031, 12, 24, 18, 0)
    expected = datetime(2031, 12, 24, 16, 0, tzinfo=UTC)
    with Client(_in_auckland(db)) as client:
        for tz in (ZoneInfo("Europe/Sofia"), pytz.timezone("Europe/Sofia"), timezone(timedelta(hours=2))):
            run = client.enqueue("k", run_at=eve, tz=tz)
            assert run.scheduled_for == expected, f"{tz!r}: {run.scheduled_for}"
        summer = client.enqueue("k", run_at=datetime(2031, 7, 1, 9, 0), tz=pytz.timezone("Europe/Sofia"))
        assert summer.scheduled_for == datetime(2031, 7, 1, 6, 0, tzinfo=UTC), "summer time: UTC+3"
        nameless = pytz.timezone("Europe/Sofia")
        nameless.zone = None  # as a hand-built pytz zone may be
        with pytest.raises(InvalidArgument, match="pytz zone") as refused:
            client.enqueue("k", run_at=eve, tz=nameless)
        assert refused.value.field == "tz"


def test_a_naive_time_in_a_dst_gap_or_repeat_is_read_as_a_daily_schedule_reads_it(db: Database) -> None:
    with Client(_in_auckland(db)) as client:
        gap = client.enqueue("k", run_at=datetime(2031, 3, 30, 3, 30), tz="Europe/Sofia")  # no 03:30 that day
        twice = client.enqueue("k", run_at=datetime(2031, 10, 26, 3, 30), tz="Europe/Sofia")  # two 03:30s
        one_shot = client.define("eve", "k", run_at=datetime(2031, 12, 24, 18, 0), timezone="Europe/Sofia")
    assert gap.scheduled_for == datetime(2031, 3, 30, 1, 30, tzinfo=UTC), (
        "a gap time keeps the offset before it"
    )
    assert twice.scheduled_for == datetime(2031, 10, 26, 0, 30, tzinfo=UTC), "a repeated time is its first"
    assert one_shot.run_at == datetime(2031, 12, 24, 16, 0, tzinfo=UTC)


def test_app_schedule_reads_a_naive_run_at_in_its_zone_not_the_sessions(db: Database) -> None:
    app = App("t")
    app.schedule("eve", "k", tz="Europe/Sofia", run_at=datetime(2031, 12, 24, 18, 0))
    app.schedule("utc-eve", "k", run_at=datetime(2031, 12, 24, 18, 0))  # the definition's zone: UTC
    app.schedule(
        "loaded", "k", tz="Europe/Sofia", run_at=datetime(2031, 12, 24, 18, 0), priority=5, jitter=None
    )
    with psycopg.connect(_in_auckland(db), autocommit=True) as conn:
        sync_app(app, conn)
    with db.connect() as conn:
        found = dict(conn.execute("SELECT name, run_at FROM jobs.definitions").fetchall())
    expected = {
        "eve": datetime(2031, 12, 24, 16, 0, tzinfo=UTC),
        "utc-eve": datetime(2031, 12, 24, 18, 0, tzinfo=UTC),
        "loaded": datetime(2031, 12, 24, 16, 0, tzinfo=UTC),
    }
    assert found == expected, f"run_at read in the session's zone (Pacific/Auckland)? {found}"
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def test_a_payload_json_cannot_hold_is_refused_by_name_and_nothing_is_queued(db: Database) -> None:
    """Values neither the standard encoder nor psycopg's configured dumps can serialize."""
    with Client(db.dsn) as client:
        with pytest.raises(InvalidArgument) as one:
            client.enqueue("k", {"tags": {"a", "b"}})
        with pytest.raises(InvalidArgument) as many:
            client.enqueue_many("k", [{"n": 1}, {"amount": Decimal("1.5")}])
        with pytest.raises(InvalidArgument) as define:
            client.define("x", "k", "0 9 * * *", payload={"at": datetime(2031, 1, 1)})
    assert (one.value.field, many.value.field, define.value.field) == ("payload", "payloads", "payload")
    assert "JSON-serializable" in str(one.value) and "set" in str(one.value), one.value
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


def test_any_mapping_is_a_json_object_payload(db: Database) -> None:
    with Client(db.dsn) as client:
        proxied = client.enqueue("k", MappingProxyType({"a": 1}))
        user = client.run_now(client.define("x", "k", "0 9 * * *").name, UserDict({"b": 2}))
    assert (proxied.payload, user.payload) == ({"a": 1}, {"b": 2})


def test_a_naive_time_marked_as_a_repeated_hours_second_pass_is_read_so(db: Database) -> None:
    """Python's ``fold=1`` names the second 03:30 of a fall-back night; ``dst_repeat`` would
    override it, but enqueue's default reads the first."""
    with Client(db.dsn) as client:
        first = client.enqueue("k", run_at=datetime(2031, 10, 26, 3, 30), tz="Europe/Sofia")
        second = client.enqueue("k", run_at=datetime(2031, 10, 26, 3, 30, fold=1), tz="Europe/Sofia")
        shot = client.define("x", "k", run_at=datetime(2031, 10, 26, 3, 30, fold=1), timezone="Europe/Sofia")
    assert first.scheduled_for == datetime(2031, 10, 26, 0, 30, tzinfo=UTC)
    assert second.scheduled_for == datetime(2031, 10, 26, 1, 30, tzinfo=UTC)
    assert shot.run_at == datetime(2031, 10, 26, 1, 30, tzinfo=UTC)


def test_a_call_in_a_repeatable_read_transaction_is_refused_as_a_pgtick_error(db: Database) -> None:
    with db.connect() as other:
        other.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with Client(db.dsn) as client, pytest.raises(WrongTransaction) as caught:
            client.enqueue("k", unique_key="u", conn=other)
        other.rollback()
    assert caught.value.sqlstate == "25000" and "READ COMMITTED" in str(caught.value), caught.value
    assert isinstance(caught.value, PgtickError)


JOB_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("retry-on-a-number", {"retry_on": [1]}, "retry_on"),
    ("never-retry-a-blank-name", {"never_retry": [" "]}, "never_retry"),
    ("max-attempts-float", {"max_attempts": 2.5}, "max_attempts"),
    ("max-attempts-zero", {"max_attempts": 0}, "max_attempts"),
    ("backoff-negative", {"backoff": -1}, "backoff"),
    ("backoff-factor-zero", {"backoff_factor": 0}, "backoff_factor"),
    ("backoff-max-nan", {"backoff_max": float("nan")}, "backoff_max"),
    # A cap below the first delay would make every delay the cap; the default cap is named.
    ("backoff-max-below-backoff", {"backoff": 10, "backoff_max": 5}, "backoff_max must be at least backoff"),
    ("backoff-above-the-default-max", {"backoff": 7200}, "got backoff_max 3600 s and backoff 7200 s"),
    ("jitter-over-one", {"jitter": 5}, "jitter"),
    ("timeout-nan", {"timeout": float("nan")}, "timeout"),
    ("timeout-text", {"timeout": "30"}, "timeout"),
    # A memory limit caps a job process; a thread or async job shares the worker's memory.
    ("memory-limit-on-a-thread-job", {"memory_limit": 2**30}, "memory_limit needs isolation='process'"),
    ("memory-limit-zero", {"isolation": "process", "memory_limit": 0}, "memory_limit must be between"),
    ("memory-limit-negative", {"isolation": "process", "memory_limit": -1}, "memory_limit must be between"),
    # Megabytes meant for bytes: below what the interpreter alone takes.
    (
        "memory-limit-in-megabytes",
        {"isolation": "process", "memory_limit": 512},
        "memory_limit must be between",
    ),
    ("memory-limit-past-any-address-space", {"isolation": "process", "memory_limit": 2**60}, "memory_limit"),
    ("memory-limit-text", {"isolation": "process", "memory_limit": "512MB"}, "memory_limit must be a whole"),
    ("memory-limit-float", {"isolation": "process", "memory_limit": 2.5e8}, "memory_limit must be a whole"),
    ("memory-limit-true", {"isolation": "process", "memory_limit": True}, "memory_limit must be a whole"),
]


@pytest.mark.parametrize(("options", "field"), [c[1:] for c in JOB_OPTIONS], ids=[c[0] for c in JOB_OPTIONS])
def test_a_job_declared_with_a_bad_option_is_refused_at_declaration(
    options: dict[str, Any], field: str
) -> None:
    app = App("t")
    with pytest.raises(UsageError, match=field):
        app.job("k", **options)(lambda ctx: None)
    assert "k" not in app.jobs


def _takes_nothing() -> None:
    pass


def _needs_two(ctx: Any, order: int) -> None:
    pass


def _keyword_only(*, ctx: Any) -> None:
    pass


def _sends(ctx: Any) -> None:
    pass


def _yields(ctx: Any) -> Any:
    yield ctx.payload


async def _yields_async(ctx: Any) -> Any:
    yield ctx.payload


JOB_FUNCTIONS: list[tuple[str, Any, dict[str, Any], str]] = [
    ("not-callable", "send_receipt", {}, r"must be a function taking the run's Context, got 'send_receipt'"),
    ("no-argument", _takes_nothing, {}, r"_takes_nothing\(\) cannot take it: too many positional arguments"),
    ("two-arguments", _needs_two, {}, r"_needs_two\(ctx: 'Any', order: 'int'\) cannot take it: .*'order'"),
    ("keyword-only", _keyword_only, {}, r"_keyword_only\(\*, ctx: 'Any'\) cannot take it"),
    ("generator", _yields, {}, r"must return its result, not yield it: '_yields' is a generator function"),
    ("async-generator", _yields_async, {}, r"not yield it: '_yields_async' is a generator function"),
    ("process-lambda", lambda ctx: None, {"isolation": "process"}, r"module-level function .*<lambda>"),
    ("compensate-not-callable", _keyword_only, {"mutating": True, "compensate": 1}, r"compensate= must be a"),
    ("compensate-no-argument", _sends, {"mutating": True, "compensate": _takes_nothing}, r"compensate="),
]


@pytest.mark.parametrize(
    ("fn", "options", "said"), [c[1:] for c in JOB_FUNCTIONS], ids=[c[0] for c in JOB_FUNCTIONS]
)
def test_a_job_function_the_worker_cannot_call_is_refused_at_registration(
    fn: Any, options: dict[str, Any], said: str
) -> None:
    """The worker calls a job (and its compensation) as ``fn(ctx)``: a function that cannot
    take that call, or whose body would not run (a generator function), or a local function
    that a job process cannot import, is refused where it is registered, naming the kind,
    not by a TypeError failing every run of it."""
    app = App("t")
    with pytest.raises(UsageError, match=f"^job k: .*{said}"):
        app.job("k", **options)(fn)
    assert "k" not in app.jobs


def test_a_job_function_is_registered_whatever_form_takes_the_context() -> None:
    """What can be called with one argument is a job: a default or ``*args`` after it, a
    partial, a bound method, an object with ``__call__``, a builtin without a signature."""

    class Sender:
        def __call__(self, ctx: Any) -> None:
            pass

        async def send(self, ctx: Any, retries: int = 3) -> None:
            pass

    app = App("t")
    forms: list[Callable[..., Any]] = [
        _sends, lambda *args: None, lambda ctx, more=1: None, Sender(), Sender().send, print
    ]  # fmt: skip
    for i, fn in enumerate(forms):
        app.job(f"k{i}")(fn)
    app.job("partial")(partial(_needs_two, order=1))
    assert len(app.jobs) == 7


def test_app_job_without_its_kind_says_the_kind_is_missing() -> None:
    """``@app.job`` written bare hands it the function as the kind: the error says to give
    the kind, rather than that a function is not 1..200 characters."""
    app = App("t")
    with pytest.raises(
        UsageError, match=r'^@app.job needs the job\'s kind: write @app.job\("kind"\) above _sends'
    ):
        app.job(_sends)  # type: ignore[arg-type]
    assert app.jobs == {}


def test_a_kind_registered_by_two_decorators_made_before_either_is_refused() -> None:
    """``app.job(kind)`` twice before either decorates: the second registration is refused,
    not silently put in place of the first."""
    app = App("t")
    first, second = app.job("k"), app.job("k")
    first(_sends)
    with pytest.raises(UsageError, match="job kind 'k' is registered twice"):
        second(lambda ctx: None)
    assert app.jobs["k"].fn is _sends


def test_retry_on_takes_one_class_or_name_as_a_list_of_one() -> None:
    app = App("t")
    app.job("by-name", retry_on="ValueError")(lambda ctx: None)
    app.job("by-class", retry_on=TimeoutError, never_retry=KeyError)(lambda ctx: None)
    assert app.jobs["by-name"].retry_on == ["ValueError"], "a name is not split into its letters"
    assert (app.jobs["by-class"].retry_on, app.jobs["by-class"].never_retry) == (
        ["TimeoutError"],
        ["KeyError"],
    )


def test_a_call_in_a_failed_transaction_is_refused_until_it_is_rolled_back(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A statement of the caller's transaction raised an error and was not rolled back: no
    call (nor its savepoint) can run in it. The call says so as a ``WrongTransaction``, not
    as psycopg's InFailedSqlTransaction and a logged failed rollback of a savepoint; after
    a rollback the same connection works. The same through ``conn=`` and ``Client(conn)``,
    and for the AsyncClient."""

    def fail(conn: psycopg.Connection[Any]) -> None:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")

    refused: list[WrongTransaction] = []
    with db.connect(autocommit=False) as conn, Client(db.dsn) as client, Client(conn) as over_conn:
        calls: list[Callable[[], Run]] = [
            lambda: client.enqueue("k", conn=conn),
            lambda: over_conn.enqueue("k"),
        ]
        for call in calls:
            fail(conn)
            with pytest.raises(WrongTransaction) as caught:
                call()
            refused.append(caught.value)
            conn.rollback()
            assert call().kind == "k", "the rolled-back connection is usable again"
            conn.commit()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db.dsn) as aconn:
            async with AsyncClient(db.dsn) as client, AsyncClient(aconn) as over_conn:
                calls: list[Callable[[], Awaitable[Run]]] = [
                    lambda: client.enqueue("k", conn=aconn),
                    lambda: over_conn.enqueue("k"),
                ]
                for call in calls:
                    with pytest.raises(psycopg.errors.DivisionByZero):
                        await aconn.execute("SELECT 1/0")
                    with pytest.raises(WrongTransaction) as caught:
                        await call()
                    refused.append(caught.value)
                    await aconn.rollback()
                    assert (await call()).kind == "k"
                    await aconn.commit()

    asyncio.run(main())
    for error in refused:
        assert error.sqlstate == "25P02" and "roll it back first" in str(error), error
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not logged, f"a failed rollback was logged: {logged}"
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 4, "only the calls after the rollbacks"


SCHEDULE_MISTAKES: list[tuple[str, Callable[[App], Any], str]] = [
    ("tz-a-zoneinfo", lambda a: a.schedule("x", "k", "0 9 * * *", tz=ZoneInfo("Europe/Sofia")), "tz"),  # type: ignore[arg-type]
    ("tz-a-number", lambda a: a.schedule("x", "k", "0 9 * * *", tz=2), "tz"),  # type: ignore[arg-type]
    ("tz-unknown", lambda a: a.schedule("x", "k", "0 9 * * *", tz="Mars/Base"), "tz"),
    (
        "payload-decimal",
        lambda a: a.schedule("x", "k", "0 9 * * *", payload={"a": Decimal("1.5")}),
        "payload",
    ),
    ("payload-nan", lambda a: a.schedule("x", "k", "0 9 * * *", payload={"a": float("nan")}), "payload"),
    ("payload-nul", lambda a: a.schedule("x", "k", "0 9 * * *", payload={"a": "\x00"}), "payload"),
    ("schedule-bad-cron", lambda a: a.schedule("x", "k", "0 25 * * *"), "schedule"),
    ("schedule-a-number", lambda a: a.schedule("x", "k", 5), "schedule"),  # type: ignore[arg-type]
    ("name-a-number", lambda a: a.schedule(5, "k", "0 9 * * *"), "name"),  # type: ignore[arg-type]
    ("kind-blank", lambda a: a.schedule("x", " ", "0 9 * * *"), "kind"),
    ("neither-schedule-nor-run-at", lambda a: a.schedule("x", "k"), "schedule"),
    (
        "both-schedule-and-run-at",
        lambda a: a.schedule("x", "k", "0 9 * * *", run_at=datetime(2031, 1, 1, tzinfo=UTC)),
        "schedule",
    ),
    ("run-at-a-date", lambda a: a.schedule("x", "k", run_at=date(2031, 1, 1)), "run_at"),  # type: ignore[arg-type]
    ("cap-zero", lambda a: a.schedule("x", "k", "0 9 * * *", max_concurrent_runs=0), "max_concurrent_runs"),
    ("timeout-nan", lambda a: a.schedule("x", "k", "0 9 * * *", timeout=float("nan")), "timeout"),
    ("dst-gap-unknown", lambda a: a.schedule("x", "k", "0 9 * * *", dst_gap="later"), "dst_gap"),
    ("jitter-over-spacing", lambda a: a.schedule("x", "k", "*/5 * * * *", jitter=600), "jitter"),
]


@pytest.mark.parametrize(
    ("declare", "field"), [c[1:] for c in SCHEDULE_MISTAKES], ids=[c[0] for c in SCHEDULE_MISTAKES]
)
def test_a_schedule_declared_with_a_mistake_is_refused_at_declaration_naming_the_field(
    declare: Callable[[App], Any], field: str
) -> None:
    """``app.schedule`` checks what ``Client.define`` checks before it sends anything, when it
    is declared (the app has no database): not later, when ``pgtick run`` writes it."""
    app = App("t", dsn=NOWHERE)
    with pytest.raises(InvalidArgument) as caught:
        declare(app)
    assert caught.value.field == field, (
        f"refused naming {caught.value.field!r}, not {field!r}: {caught.value}"
    )
    assert not isinstance(caught.value.__cause__, psycopg.Error), "the refusal came from a database"
    assert app.schedules == {}, "a refused schedule was declared"


def test_a_schedule_declared_with_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    app = App("t")
    with pytest.raises(
        TypeError, match=r"^App\.schedule\(\) got an unexpected keyword argument 'max_concurent_runs'"
    ):
        app.schedule("x", "k", "0 9 * * *", max_concurent_runs=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'timezone'"):  # app.schedule takes the zone as tz=
        app.schedule("x", "k", "0 9 * * *", timezone="Europe/Sofia")  # type: ignore[call-arg]
    assert app.schedules == {}


def test_a_schedule_name_declared_twice_is_refused_and_the_first_declaration_stays() -> None:
    app = App("t")
    app.schedule("nightly", "report", "0 3 * * *")
    with pytest.raises(UsageError, match="schedule 'nightly' is declared twice"):
        app.schedule("nightly", "export", "0 4 * * *")
    assert app.schedules["nightly"].kind == "report"


def test_a_schedule_declared_right_is_written_by_sync_as_declared(db: Database) -> None:
    """What the checks let through is what ``pgtick run`` writes: any mapping as the payload,
    a zone by name, a one-shot's naive time read in it."""
    app = App("t")
    app.schedule(
        "weekday", "report", "0 9 * * 1-5", tz="Europe/Sofia", payload=MappingProxyType({"team": "sofia"})
    )
    app.schedule("eve", "report", run_at=datetime(2031, 12, 24, 18, 0), tz="Europe/Sofia", priority=5)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        sync_app(app, conn)
        rows = conn.execute(
            "SELECT name, timezone, payload, priority FROM jobs.definitions ORDER BY name"
        ).fetchall()
    assert rows == [
        ("eve", "Europe/Sofia", {}, 5),
        ("weekday", "Europe/Sofia", {"team": "sofia"}, 0),
    ], rows


def test_app_takes_only_a_sync_client_and_says_why() -> None:
    """``App(client=...)`` refuses what ``app.use()`` refuses, before the app exists: an
    AsyncClient (``app.enqueue`` is synchronous: it would return a coroutine no one awaits)
    and a conninfo string (that is ``dsn=``)."""
    with pytest.raises(
        TypeError,
        match=r"App\(client=\.\.\.\) takes a pgtick.Client, got AsyncClient \(app.enqueue is synchronous",
    ):
        App(client=AsyncClient(NOWHERE))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got str \(give a conninfo string as dsn=\)"):
        App(client=NOWHERE)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        App(client=5432)  # type: ignore[arg-type]
    with Client(NOWHERE) as client:
        assert App(client=client).client is client


@pytest.mark.parametrize(
    "zone", ["localtime", "posixrules", "Factory", "posix/Europe/Sofia", "right/UTC", "CET", "WET"]
)
def test_a_time_zone_name_of_no_place_is_refused_before_any_sql(db: Database, zone: str) -> None:
    """localtime reads a naive time in this host's zone, which the database and the scheduler
    on other hosts do not share; Factory, posixrules and the posix/ and right/ copies name no
    place; PostgreSQL reads CET and WET as fixed offsets. Refused naming the argument, for an
    enqueue's tz as for a definition's zone."""
    with Client(db.dsn) as client:
        with pytest.raises(InvalidArgument) as enqueue:
            client.enqueue("k", run_at=datetime(2031, 1, 1, 9, 0), tz=zone)
        with pytest.raises(InvalidArgument) as define:
            client.define("d", "k", "0 9 * * *", timezone=zone)
    assert (enqueue.value.field, define.value.field) == ("tz", "timezone")
    said = str(enqueue.value)
    assert "place" in said or "not a known" in said or "fixed offset" in said, enqueue.value
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


@pytest.mark.parametrize(
    "payload", [{True: 1, "true": 2}, {1: "a", "1": "b"}, {"outer": [{None: 1, "null": 2}]}]
)
def test_a_payload_two_of_whose_keys_json_writes_alike_is_refused(db: Database, payload: Any) -> None:
    """JSON writes every key as text: True and "true" would become one key, and one value
    would be lost without a word. Refused naming the payload; distinct keys of other types
    are taken as JSON writes them."""
    with Client(db.dsn) as client:
        with pytest.raises(InvalidArgument, match="two keys that JSON writes alike") as refused:
            client.enqueue("k", payload)
        assert refused.value.field == "payload"
        distinct: Any = {1: "a", 2: "b", None: "c"}  # keys of other types than text, on purpose
        run = client.enqueue("k", distinct)
    assert run.payload == {"1": "a", "2": "b", "null": "c"}
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1
