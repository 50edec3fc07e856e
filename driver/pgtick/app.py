"""The application object: a registry of job kinds, their retry policies and schedules.

    app = App()

    @app.job("send-report", retry_on=[TimeoutError], never_retry=[ValueError], timeout=300)
    def send_report(ctx: Context) -> dict[str, int]:
        for part in parts(ctx.payload):
            ctx.checkpoint()          # cancellation and timeouts are observed here
            ...
        return {"sent": n}

    app.schedule("weekday-report", "send-report",
                 "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0", tz="Europe/Sofia")

``pgtick run module:app`` syncs the policies and schedules to the database and
runs the scheduler and a worker for the registered kinds.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import threading
import time
import unicodedata
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Unpack

from pgtick.errors import Abandoned, Cancelled, InvalidArgument, JobTimeout, Snooze, UsageError
from pgtick.terminal import HIDDEN_CHARACTERS

if TYPE_CHECKING:
    from pgtick.client import Client, DefinitionOptions, EnqueueWithConnOptions, Run

JobFunction = Callable[["Context"], Any]
Compensation = Callable[["Context"], None]
#: Where a job's code runs: a thread of the worker (default; ``async def`` jobs on the
#: worker's event loop), or a child process that can be killed (``pgtick.isolation``).
Isolation = Literal["thread", "process"]
ISOLATIONS: tuple[Isolation, ...] = ("thread", "process")

log = logging.getLogger("pgtick.job")

#: How often a checkpoint that waits for its run's ownership to be confirmed looks again (s).
CONFIRM_POLL = 0.25


def is_coroutine_function(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine to await: an ``async def`` function, or an
    object whose ``__call__`` is one (``inspect.iscoroutinefunction`` says no to those)."""
    call = inspect.getattr_static(type(fn), "__call__", None)  # the class's, as a call finds it
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def error_classes(exc: BaseException) -> list[str]:
    """The exception's class and its bases, most specific first, e.g.
    ['BudgetExhausted', 'RuntimeError', 'Exception'] (the retry policy matches any)."""
    return [k.__name__ for k in type(exc).__mro__ if k not in (BaseException, object)]


def _class_names(
    kind: str,
    field_name: str,
    classes: Iterable[type[BaseException] | str] | type[BaseException] | str | None,
) -> list[str] | None:
    """The error class names a retry policy lists: one class or name, or a list of them."""
    if classes is None:
        return None
    if isinstance(classes, str | type):
        classes = [classes]
    if not isinstance(classes, Iterable):
        raise UsageError(f"job {kind}: {field_name} must list exception classes or names, got {classes!r}")
    names = []
    for c in classes:
        if isinstance(c, type) and issubclass(c, BaseException):
            names.append(c.__name__)
        elif isinstance(c, str) and c.strip():
            names.append(c)
        else:
            raise UsageError(f"job {kind}: {field_name} must list exception classes or names, got {c!r}")
    return names


def _number(kind: str, field_name: str, value: Any, low: float, high: float) -> float:
    """A finite number of the policy within [low, high], else a UsageError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise UsageError(
            f"job {kind}: {field_name} must be a number between {low:.0f} and {high:.0f}, got {value!r}"
        )
    return float(value)


def _seconds(value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise UsageError(f"timeout must be seconds or a timedelta, got {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"timeout must be positive and finite, got {value!r}")
    return seconds


def _check_takes_context(kind: str, what: str, fn: object) -> None:
    """A UsageError unless ``fn`` can be called as the worker calls it, ``fn(ctx)``: a
    callable that takes one positional argument. A function that cannot would fail every run
    with a TypeError (retried by its policy) instead of failing the import that registers it;
    a generator function's body would never run (its call makes a generator, not a result)."""
    if not callable(fn):
        raise UsageError(f"job {kind}: {what} must be a function taking the run's Context, got {fn!r}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise UsageError(
            f"job {kind}: {what} must return its result, not yield it: "
            f"{getattr(fn, '__qualname__', fn)!r} is a generator function"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): the call will tell
    try:
        signature.bind(None)
    except TypeError as exc:
        shown = signature.replace(return_annotation=inspect.Signature.empty)
        raise UsageError(
            f"job {kind}: {what} is called with one argument, the run's Context, but "
            f"{getattr(fn, '__qualname__', fn)}{shown} cannot take it: {exc}"
        ) from None


def _check_importable(kind: str, fn: object) -> None:
    """A UsageError unless ``fn`` can be pickled by reference to a child process: a lambda or
    a function defined inside another cannot be found there by its name."""
    name = getattr(fn, "__qualname__", None)
    if inspect.isfunction(fn) and isinstance(name, str) and ("<lambda>" in name or "<locals>" in name):
        raise UsageError(
            f"job {kind}: isolation='process' needs a module-level function (the job process "
            f"imports it by name), got {name!r}"
        )


#: The bounds of ``memory_limit``: the interpreter, pgtick and psycopg alone take some 30 MB of
#: a job process's data memory, so a limit below 64 MiB fails every job; x86-64 gives a process
#: 128 TiB of address space, so a limit above it is no limit (a unit mistaken, bytes meant).
MIN_MEMORY_LIMIT = 64 * 2**20
MAX_MEMORY_LIMIT = 2**47


def size_text(size: int) -> str:
    """``size`` bytes as read in a message: ``209715200 bytes (200 MiB)``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size} bytes ({size / scale:.4g} {unit})"
    return f"{size} bytes"


def _check_memory_limit(kind: str, memory_limit: object, isolation: str) -> None:
    """A UsageError unless ``memory_limit`` is a whole number of bytes within bounds, given to a
    process job (a thread or async job shares the worker's memory: no limit of its own)."""
    if isolation != "process":
        raise UsageError(
            f"job {kind}: memory_limit needs isolation='process' (a {isolation} job shares the "
            "worker process's memory, which no limit of its own can cap)"
        )
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, int):
        raise UsageError(f"job {kind}: memory_limit must be a whole number of bytes, got {memory_limit!r}")
    if not MIN_MEMORY_LIMIT <= memory_limit <= MAX_MEMORY_LIMIT:
        raise UsageError(
            f"job {kind}: memory_limit must be between {MIN_MEMORY_LIMIT} bytes (64 MiB) and "
            f"{MAX_MEMORY_LIMIT} bytes (128 TiB), got {memory_limit!r}"
        )
    try:
        import resource  # noqa: F401  (POSIX only)
    except ImportError:
        raise UsageError(f"job {kind}: memory_limit needs the resource module (POSIX), absent here") from None


def _check_database(call: str, target: object, *, conninfo: bool) -> None:
    """A TypeError unless ``target`` is something ``app.enqueue`` writes through: a
    ``pgtick.Client``, or with ``conninfo`` a conninfo string; it says why an ``AsyncClient``
    is not (``app.enqueue`` is synchronous)."""
    from pgtick.client import AsyncClient, Client

    if isinstance(target, Client) or (conninfo and isinstance(target, str)):
        return
    if isinstance(target, AsyncClient):
        why = " (app.enqueue is synchronous: give it a pgtick.Client)"
    elif isinstance(target, str):
        why = " (give a conninfo string as dsn=)"
    else:
        why = ""
    takes = "a conninfo string or a pgtick.Client" if conninfo else "a pgtick.Client"
    raise TypeError(f"{call} takes {takes}, got {type(target).__name__}{why}")


@dataclass(frozen=True)
class JobSpec:
    """One registered kind: its code and the rules the database applies to it."""

    kind: str
    fn: JobFunction
    retry_on: list[str] | None
    never_retry: list[str]
    max_attempts: int
    backoff_initial: float
    backoff_factor: float
    backoff_max: float
    jitter: float
    timeout: float | None
    mutating: bool
    compensate: Compensation | None
    isolation: Isolation = "thread"
    memory_limit: int | None = None

    @cached_property
    def is_async(self) -> bool:
        """An ``async def`` job: it runs on the worker's event loop (``pgtick.aio``)."""
        return is_coroutine_function(self.fn)


@dataclass(frozen=True)
class ScheduleSpec:
    """A definition declared in code; ``App.sync`` upserts it with jobs.define()."""

    name: str
    kind: str
    schedule: str | None
    timezone: str
    run_at: datetime | None
    options: dict[str, Any] = field(default_factory=dict)


class App:
    """Registry of job kinds and declared schedules.

    ``dsn`` or ``client`` tell ``app.enqueue`` where to write; with neither, it uses
    $DATABASE_URL (or $PGTICK_DSN) on first use. ``pgtick run`` does not need them, and
    gives an app without them its own DSN, so job code can ``app.enqueue`` follow-ups.
    ``close()`` (or a ``with`` block) closes the connection the app opened for them.
    ``client`` must be a ``pgtick.Client`` (``app.enqueue`` is synchronous), else TypeError.
    """

    def __init__(self, name: str = "pgtick", *, dsn: str | None = None, client: Client | None = None) -> None:
        if client is not None:
            _check_database("App(client=...)", client, conninfo=False)
        self.name = name
        self.jobs: dict[str, JobSpec] = {}
        self.schedules: dict[str, ScheduleSpec] = {}
        self.dsn = dsn
        self._client = client
        self._own_client: Client | None = None  # the one made from the DSN: this app closes it
        self._closed = False  # app.close() was called, and no app.use() since
        self._client_lock = threading.Lock()  # jobs on many threads app.enqueue at once: one client

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client the app made from its DSN (its server session ends now); a
        client given to the app stays open, the giver's to close. ``app.enqueue`` then
        raises ``UsageError`` until ``app.use(...)`` points the app at a database again; the
        registered jobs and schedules stay. Idempotent."""
        with self._client_lock:
            self._closed = True
            if self._own_client is not None:
                self._own_client.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (and no ``use()`` since)."""
        return self._closed

    def _usable(self, client: Client) -> bool:
        """Whether ``app.enqueue`` writes through ``client`` as it is: not when the app is
        closed, nor when it is the client the app made and closed (``use()`` closes it, and
        may be undone by restoring it): the app then makes a new one over its DSN. A client
        that was given stays the giver's, open or closed."""
        return not self._closed and not (client is self._own_client and client.closed)

    @property
    def client(self) -> Client:
        """The ``pgtick.Client`` behind ``app.enqueue``: the one given, else one over the DSN."""
        client = self._client
        if client is not None and self._usable(client):
            return client
        from pgtick.client import Client

        with self._client_lock:  # made once: a second one would open a connection no one closes
            if self._closed:
                raise UsageError(
                    f"app {self.name!r} is closed (app.close() was called): "
                    "app.use(...) points it at a database again"
                )
            client = self._client
            if client is None or not self._usable(client):
                dsn = self.dsn or os.environ.get("DATABASE_URL") or os.environ.get("PGTICK_DSN")
                if not dsn:
                    raise UsageError(
                        f"app {self.name!r} does not know its database: give App(dsn=...) or "
                        "App(client=...), call app.use(...), or set $DATABASE_URL"
                    )
                client = self._client = self._own_client = Client(dsn)
            return client

    @property
    def has_database(self) -> bool:
        """Whether ``dsn`` or ``client`` was given (``pgtick run`` fills in its own DSN if not)."""
        return self.dsn is not None or self._client is not None

    def use(self, target: str | Client) -> None:
        """Point ``app.enqueue`` at a DSN or a ``pgtick.Client`` (e.g. in tests); a closed app
        is open again. The client the app made itself from its former DSN is closed (its
        server session ends now); a client that was given to it is the giver's to close.
        Anything else is refused before the app changes: an ``AsyncClient`` (``app.enqueue``
        is synchronous), an empty DSN."""
        from pgtick.client import Client

        _check_database("app.use()", target, conninfo=True)
        if isinstance(target, str) and not target.strip():
            raise InvalidArgument("app.use(): the DSN must not be empty", field="target")
        with self._client_lock:
            own = self._own_client
            if own is not None and own is not target:
                own.close()
            if isinstance(target, Client):
                self._client, self.dsn = target, None
            else:
                self._client, self.dsn = None, target
            self._closed = False

    def enqueue(
        self, kind: str, payload: Mapping[str, Any] | None = None, **options: Unpack[EnqueueWithConnOptions]
    ) -> Run:
        """``self.client.enqueue(kind, payload, **options)``: the same arguments, ``conn=``
        included (the run then commits or rolls back with the caller's transaction)."""
        return self.client.enqueue(kind, payload, **options)

    def job(
        self,
        kind: str,
        *,
        retry_on: Sequence[type[BaseException] | str] | type[BaseException] | str | None = None,
        never_retry: Sequence[type[BaseException] | str] | type[BaseException] | str = (),
        max_attempts: int | None = None,
        backoff: float = 10.0,
        backoff_factor: float = 2.0,
        backoff_max: float = 3600.0,
        jitter: float = 0.2,
        timeout: float | timedelta | None = None,
        mutating: bool = False,
        compensate: Compensation | None = None,
        isolation: Isolation = "thread",
        memory_limit: int | None = None,
    ) -> Callable[[JobFunction], JobFunction]:
        """Register ``fn`` as the code of ``kind``.

        retry_on: error classes (or names) that may be retried, one or a list; None
        retries any class not in never_retry. never_retry always wins. max_attempts defaults
        to 3 when retry_on or never_retry is given, else 1 (no retries).
        The delay before attempt n+1 is ``backoff * backoff_factor**(n-1)`` seconds, at most
        ``backoff_max`` (which must not be below ``backoff``), spread by +-``jitter``.
        timeout (seconds) is enforced at ``ctx.checkpoint()``; a job that never
        reaches one has its run failed as Timeout by its worker soon after (the
        thread itself runs on, its result unreported). For a mutating
        kind, ``compensate`` (and hooks added with ``ctx.on_cancel``) run when a
        checkpoint observes cancellation, before the run is stamped CANCELLED.

        An ``async def`` function runs on the worker's one event loop; its timeout and
        cancellation also interrupt it at whatever it awaits. ``isolation="process"``
        runs the function in a child process that is killed at its timeout or on
        cancel, for code that never reaches a checkpoint (``pgtick.isolation``); its
        function and ``compensate`` must be importable (module-level) functions.
        ``memory_limit`` (bytes, with ``isolation="process"`` only) caps the data memory of
        the job's process while the job runs: past it an allocation raises ``MemoryError``
        and the run fails as ``pgtick.errors.MemoryLimitExceeded``.
        """
        if callable(kind):  # @app.job without its kind: the function came in as the kind
            raise UsageError(
                f'@app.job needs the job\'s kind: write @app.job("kind") above '
                f"{getattr(kind, '__qualname__', kind)}, not @app.job"
            )
        if not isinstance(kind, str) or not kind.strip() or len(kind) > 200:
            raise UsageError(f"job kind must be 1..200 characters, got {kind!r}")
        if any(unicodedata.category(c) in ("Cc", "Cs") for c in kind):  # as jobs._check_name refuses
            raise UsageError(f"job kind must not contain control characters, got {kind!r}")
        hidden = next((c for c in kind if c in HIDDEN_CHARACTERS), None)
        if hidden is not None:
            raise UsageError(
                f"job kind must not contain invisible or text-direction characters, got U+{ord(hidden):04X}"
            )
        if kind in self.jobs:
            raise UsageError(f"job kind {kind!r} is registered twice")
        allow = _class_names(kind, "retry_on", retry_on)
        deny = _class_names(kind, "never_retry", never_retry) or []
        if max_attempts is None:
            max_attempts = 3 if (allow is not None or deny) else 1
        from pgtick.client import MAX_DURATION, check_int  # the SQL API's bounds, as the client checks them

        try:
            max_attempts = check_int("max_attempts", max_attempts)
        except InvalidArgument as exc:
            raise UsageError(f"job {kind}: {exc}") from None
        longest = MAX_DURATION.total_seconds()
        backoff = _number(kind, "backoff", backoff, 0, longest)
        backoff_max = _number(kind, "backoff_max", backoff_max, 0, longest)
        backoff_factor = _number(kind, "backoff_factor", backoff_factor, 1, 100)
        if backoff_max < backoff:  # every delay would be backoff_max (jobs.set_retry_policy refuses it too)
            raise UsageError(
                f"job {kind}: backoff_max must be at least backoff, got backoff_max {backoff_max:g} s and"
                f" backoff {backoff:g} s (backoff_max is 3600 s when not given): every retry delay would be"
                " backoff_max; give both, or a smaller backoff"
            )
        jitter = _number(kind, "jitter", jitter, 0, 1)
        seconds = _seconds(timeout)
        if compensate is not None and not mutating:
            raise UsageError(f"job {kind}: compensate= needs mutating=True")
        if inspect.iscoroutinefunction(compensate):  # called plainly: its coroutine would never run
            raise UsageError(f"job {kind}: compensate= takes a plain function, not async def")
        if isolation not in ISOLATIONS:
            raise UsageError(f"job {kind}: isolation must be 'thread' or 'process', got {isolation!r}")
        if memory_limit is not None:
            _check_memory_limit(kind, memory_limit, isolation)

        if compensate is not None:
            _check_takes_context(kind, "compensate=", compensate)

        def register(fn: JobFunction) -> JobFunction:
            if kind in self.jobs:  # registered since app.job(kind) was called
                raise UsageError(f"job kind {kind!r} is registered twice")
            _check_takes_context(kind, "the job", fn)
            if isolation == "process" and is_coroutine_function(fn):
                raise UsageError(f"job {kind}: isolation='process' takes a plain function, not async def")
            if isolation == "process":
                _check_importable(kind, fn)
            self.jobs[kind] = JobSpec(
                kind=kind,
                fn=fn,
                retry_on=allow,
                never_retry=deny,
                max_attempts=max_attempts,
                backoff_initial=backoff,
                backoff_factor=backoff_factor,
                backoff_max=backoff_max,
                jitter=jitter,
                timeout=seconds,
                mutating=mutating,
                compensate=compensate,
                isolation=isolation,
                memory_limit=memory_limit,
            )
            return fn

        return register

    def schedule(
        self,
        name: str,
        kind: str,
        schedule: str | None = None,
        *,
        tz: str = "UTC",
        run_at: datetime | None = None,
        **options: Unpack[DefinitionOptions],
    ) -> None:
        """Declare a definition (recurring with ``schedule``, or one-shot with ``run_at``).

        ``options`` are jobs.define() parameters: payload, max_concurrent_runs,
        priority, max_attempts, misfire_policy, overlap_policy (queue, skip, buffer_one,
        cancel_other), timeout, heartbeat_timeout, dst_gap (shift, end, skip) and
        dst_repeat (first, second, both; None = auto), jitter (a timedelta),
        pause_after_failures, enabled, queue, concurrency_key.

        Checked here as ``Client.define`` checks its arguments before it sends anything, so
        a mistake is refused at the declaration, not when ``pgtick run`` writes it: a keyword
        not listed above is a TypeError; a bad value an ``InvalidArgument`` naming it (``tz``
        that is not an IANA zone name such as 'Europe/Sofia', a payload JSON cannot hold,
        schedule text that does not parse, neither or both of ``schedule`` and ``run_at``);
        a name declared twice a ``UsageError``.
        """
        from pgtick.client import DefineOptions, DefinitionOptions, check_definition, check_keywords

        check_keywords("App.schedule", DefinitionOptions.__annotations__, options)
        define = DefineOptions(**options, timezone=tz, run_at=run_at)
        check_definition(name, kind, schedule, define, zone_name="tz")
        if (schedule is None) == (run_at is None):
            raise InvalidArgument(
                f"definition {name!r}: give exactly one of schedule (recurring) or run_at (one-shot)",
                field="schedule",
            )
        if name in self.schedules:
            raise UsageError(f"schedule {name!r} is declared twice")
        declared: dict[str, Any] = dict(options)
        if isinstance(declared.get("payload"), Mapping):  # any mapping, written as a JSON object
            declared["payload"] = dict(declared["payload"])
        self.schedules[name] = ScheduleSpec(name, kind, schedule, tz, run_at, declared)


class Context:
    """What job code receives: the run's facts, ``checkpoint()`` and a logger."""

    def __init__(
        self,
        run: dict[str, Any],
        spec: JobSpec,
        worker_id: str,
        timeout: float | None,
    ) -> None:
        self.run = run
        self.spec = spec
        self.run_id: int = run["id"]
        self.attempt: int = run["attempt"]
        self.kind: str = run["kind"]
        self.payload: dict[str, Any] = run["payload"]
        self.scheduled_for: datetime = run["scheduled_for"]
        # The occurrence a scheduled run (or its retry) is for, before the jitter; else None.
        self.occurrence_at: datetime | None = run.get("occurrence_at")
        self.definition_id: int | None = run["definition_id"]
        self.worker_id = worker_id
        self.timeout = timeout
        self.started = time.monotonic()
        # When ``timeout`` counts from (monotonic): the job's start for a kind's timeout; for a
        # run's own timeout, which the server counts from the claim (started_at), the worker
        # sets the instant its claim was sent, so no checkpoint passes after the reaper may
        # have failed the run as Timeout and queued its retry.
        self.timeout_from = self.started
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None
        # Set once by another thread and only read after: a plain attribute is enough (no Event
        # per run; nothing waits on them).
        self._cancel = False
        self._abandoned = False
        self._interrupt: Callable[[], None] | None = None  # set by pgtick.aio for async jobs
        self._compensations: list[Compensation] = []
        self._compensated = False
        # Until when (monotonic) the run is surely still this worker's: the last claim or
        # heartbeat the database answered for it, sent at that instant, plus the run's
        # heartbeat timeout (no reaper can fail it sooner). None: not tracked (run inline).
        self._owned_until: float | None = None
        self._heartbeat_timeout = 0.0
        # Set on a confirmation, a cancel or an abandon; made only when a checkpoint waits
        # (rare), since making and setting one for every run costs a drain a few percent.
        self._news: threading.Event | None = None
        self._doubt_logged = False
        # An async job waits at a checkpoint for a heartbeat to confirm the run (its task is
        # parked there, running no job code: pgtick.aio lets it wait rather than cancel it).
        self._confirming = False

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry the run id, kind and attempt."""
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                log, {"run": self.run_id, "kind": self.kind, "attempt": self.attempt}
            )
        return self._logger

    @property
    def cancel_requested(self) -> bool:
        return self._cancel

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def request_cancel(self) -> None:
        self._cancel = True
        self._interrupted()

    def abandon(self) -> None:
        self._abandoned = True
        self._interrupted()

    def owned(self, sent: float, heartbeat_timeout: float | None = None) -> None:
        """The database answered that the run is this worker's to a claim or heartbeat sent at
        ``sent`` (monotonic), which stamped its heartbeat: no reaper fails it before ``sent +
        heartbeat_timeout``. Past that instant without a newer answer (the database out of
        reach) the run may have been reaped and retried elsewhere: ``checkpoint()`` waits.
        ``heartbeat_timeout`` (seconds) is given with the claim; a heartbeat keeps it."""
        if heartbeat_timeout is not None:
            self._heartbeat_timeout = heartbeat_timeout
        until = sent + self._heartbeat_timeout
        if self._owned_until is None or until > self._owned_until:
            self._owned_until = until
        self._wake()

    def _in_doubt(self) -> bool:
        """Whether the run may have been reaped: its ownership not confirmed within its
        heartbeat timeout."""
        left = self._owned_for()
        return left is not None and left < 0

    def _owned_for(self) -> float | None:
        """Seconds until the run's ownership falls in doubt unless a heartbeat confirms it
        (negative once it has); None when it is not tracked."""
        until = self._owned_until
        return None if until is None else until - time.monotonic()

    def _wake(self) -> None:
        news = self._news
        if news is not None:
            news.set()

    def _interrupted(self) -> None:
        self._wake()
        interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def on_cancel(self, hook: Compensation) -> None:
        """Register compensation for a mutating kind; hooks run last-registered first (the
        kind's ``compensate`` last of all), each even when one before it raised; the run then
        fails with the first error raised (not retried: its cancel was requested)."""
        if not self.spec.mutating:
            raise UsageError(f"job {self.kind}: on_cancel needs a kind registered with mutating=True")
        if inspect.iscoroutinefunction(hook):  # called plainly: its coroutine would never run
            raise UsageError(f"job {self.kind}: on_cancel takes a plain function, not async def")
        self._compensations.append(hook)

    def snooze(self, delay: float | timedelta) -> NoReturn:
        """Stop here and run again later: raises ``pgtick.Snooze(delay)``, which puts the run
        back to QUEUED, due ``delay`` (seconds or a timedelta, at most 365 days) from now, with
        the same attempt. Not a failure: no retry policy is asked. A bad ``delay`` raises
        ``InvalidArgument`` naming it instead."""
        raise Snooze(delay)

    def checkpoint(self) -> Awaitable[None]:
        """Stop here if the run was cancelled, timed out, or is no longer ours.

        The checks happen when it is called; in an ``async def`` job, ``await
        ctx.checkpoint()`` also yields to the event loop once, so other jobs run.

        When no heartbeat of the run has reached the database for longer than its heartbeat
        timeout (the database or the network is down), the run may have been reaped and
        retried elsewhere: the checkpoint waits (``await`` it in an ``async def`` job) until a
        heartbeat gets through, then goes on if the run is still this worker's and raises
        ``Abandoned`` if not, so job code never goes on beside its own retry."""
        self._check()
        if self._in_doubt():
            if self.spec.is_async:
                return _Confirmation(self)
            self._wait_owned()
        return _YIELD

    def await_ownership(self) -> None:
        """Return at once while the run is surely this worker's; else wait as a checkpoint
        does for a heartbeat to confirm it (raising ``Abandoned`` if it is lost)."""
        if self._in_doubt():
            self._wait_owned()

    def _wait_owned(self) -> None:
        self._log_doubt()
        if self._news is None:
            self._news = threading.Event()
        news = self._news
        while True:
            news.clear()
            if not self._in_doubt():
                break
            self._check()
            news.wait(CONFIRM_POLL)  # (a wake missed before the Event existed: one poll late)
        self._check()

    async def _await_owned(self) -> None:
        self._log_doubt()
        self._confirming = True
        try:
            while self._in_doubt():
                self._check()
                await asyncio.sleep(CONFIRM_POLL / 5)
        finally:
            self._confirming = False
        self._check()
        await asyncio.sleep(0)

    def _log_doubt(self) -> None:
        if self._doubt_logged:  # once per run: a heartbeat timeout near the round trip recurs
            return
        self._doubt_logged = True
        self.logger.warning(
            "run=%s waits at a checkpoint: no heartbeat has reached the database within its"
            " heartbeat timeout of %gs, so it may have been reaped; it goes on once a heartbeat"
            " confirms it is still this worker's",
            self.run_id,
            self._heartbeat_timeout,
        )

    def _check(self) -> None:
        if self._abandoned:
            raise Abandoned(f"run {self.run_id} is no longer owned by this worker")
        if self._cancel:
            self._compensate()
            raise Cancelled(f"run {self.run_id} cancelled")
        if self.timeout is not None and time.monotonic() - self.timeout_from > self.timeout:
            raise JobTimeout(f"run {self.run_id} exceeded its timeout of {self.timeout:g}s")

    def _compensate(self) -> None:
        if not self.spec.mutating or self._compensated:
            return
        self._compensated = True
        hooks = list(self._compensations)
        if self.spec.compensate is not None:
            hooks.insert(0, self.spec.compensate)
        failed: BaseException | None = None
        for hook in reversed(hooks):
            self.logger.info("run=%s compensating after cancellation", self.run_id)
            try:
                hook(self)
            except BaseException as exc:  # the other hooks still undo their part
                from pgtick.execution import describe

                self.logger.warning(
                    "run=%s compensation %s failed: %s",
                    self.run_id,
                    getattr(hook, "__qualname__", hook),
                    describe(exc),
                )
                failed = failed or exc
        if failed is not None:
            raise failed


class _Yield:
    """What ``checkpoint()`` returns: ignored by plain code; awaited, it yields to the loop once."""

    def __await__(self) -> Generator[Any, None, None]:
        return asyncio.sleep(0).__await__()


_YIELD = _Yield()


class _Confirmation:
    """What ``checkpoint()`` returns to an ``async def`` job whose run's ownership is in doubt:
    awaited, it waits for a heartbeat to confirm it (or raises ``Abandoned``)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    def __await__(self) -> Generator[Any, None, None]:
        return self._ctx._await_owned().__await__()
