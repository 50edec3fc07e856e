"""Running job code: one plain function from a claimed run to a typed outcome.

``execute`` never raises: whatever the job does, it returns an ``Outcome`` that
the reporter sends to the database (``pgtick.reporter``).
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pgtick import instrumentation
from pgtick.app import Context, error_classes
from pgtick.errors import Abandoned, Cancelled, JobTimeout, Snooze

if TYPE_CHECKING:
    from pgtick.isolation import ProcessPool

#: Most characters of a job error's ``Class: message`` that its run's error keeps: the head,
#: then a note saying the message was shortened, so that what follows it (a process job's
#: traceback) is kept too. The same in a thread, on the event loop and in a job process.
MAX_ERROR_MESSAGE = 4000
#: Most characters of a process job's traceback kept after its message: its end (the
#: innermost frames and the error's own line), whole entries, with a note of what was left out.
MAX_TRACEBACK = 5000
#: Most characters of one entry of a traceback (a frame, an error's line) kept.
MAX_TRACEBACK_ENTRY = 1000

#: How a run ended in this process.
Action = Literal["complete", "fail", "cancel", "abandon", "snooze"]

#: What became of an outcome once reported: its action, or "fenced" when the
#: database no longer had the run RUNNING for this worker.
Settlement = Literal["complete", "fail", "cancel", "abandon", "snooze", "fenced"]


@dataclass
class Outcome:
    """How a run ended in this process, waiting to be reported."""

    ctx: Context
    action: Action
    result: Any = None
    classes: list[str] | None = None
    message: str | None = None
    reason: str = "Error"
    #: How long a snoozed run waits before it is due again (action "snooze").
    delay: timedelta | None = None

    @property
    def plain(self) -> bool:
        """A completion without a result: sent in one batch with the next claim."""
        return self.action == "complete" and self.result is None and not self.ctx.abandoned


def execute(ctx: Context, processes: ProcessPool | None = None) -> Outcome:
    """Run the job's function for ``ctx`` and say how it ended.

    The worker sends ``async def`` jobs to its event loop (``pgtick.aio``) and
    process-isolated ones to a child process of its pool ``processes``
    (``pgtick.isolation``); called here directly, an ``async def`` job gets a loop of
    its own, and a process-isolated one a child of the module's pool."""
    with instrumentation.current.execute(ctx) as ended:
        outcome = _run(ctx, processes)
        ended(outcome)
    return outcome


def _run(ctx: Context, processes: ProcessPool | None) -> Outcome:
    try:
        # A run claimed ahead of a free slot may have been reaped while it waited (its worker
        # cut off from the database): its job does not begin until a heartbeat says it is ours.
        ctx.await_ownership()
    except BaseException as exc:
        return outcome_of(ctx, exc)
    if ctx.spec.isolation == "process":
        if processes is None:
            from pgtick import isolation

            processes = isolation.POOL
        return processes.execute(ctx)
    fn = ctx.spec.fn
    try:
        if ctx.spec.is_async:
            result = asyncio.run(fn(ctx))
        else:
            result = fn(ctx)
            if inspect.iscoroutine(result):
                # An ``async def`` job behind a plain decorator (one that calls it and returns
                # what it returns): its body is the coroutine, run here, on a loop of its own.
                result = asyncio.run(result)
    except BaseException as exc:
        # Exception, and also SystemExit/KeyboardInterrupt raised by job code: uncaught
        # they would end the executor thread silently and leave the run RUNNING with
        # live heartbeats (never reaped) and one slot fewer.
        return outcome_of(ctx, exc)
    return Outcome(ctx, "complete", result=result)


def outcome_of(ctx: Context, exc: BaseException) -> Outcome:
    """The outcome of a run whose job code raised ``exc``.

    ``Cancelled`` ends the run CANCELLED, and ``Abandoned`` lets it go unreported, only when
    the worker has seen the run's cancel requested or lost (so a checkpoint raised it): job
    code that raises either on its own fails its run like any other error, retried by policy
    (cancelled, it would be refused, the database having no cancel requested; abandoned, it
    would stay RUNNING until the reaper failed it as HeartbeatLost). ``Snooze`` puts the run
    back to QUEUED for later (``jobs.snooze``): not a failure."""
    if isinstance(exc, Snooze):
        return Outcome(ctx, "snooze", delay=exc.delay)
    if isinstance(exc, Cancelled) and ctx.cancel_requested:
        return Outcome(ctx, "cancel", message=message_of(exc))
    if isinstance(exc, Abandoned) and ctx.abandoned:
        return Outcome(ctx, "abandon")
    if isinstance(exc, JobTimeout):
        return Outcome(ctx, "fail", classes=error_classes(exc), message=message_of(exc), reason="Timeout")
    return Outcome(ctx, "fail", classes=error_classes(exc), message=error_message(exc))


def escaped(text: str) -> str:
    """``text`` as PostgreSQL text takes it: NUL and what is not valid UTF-8 (lone surrogates,
    undecodable bytes decoded with surrogateescape) shown as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def cut(text: str, limit: int, what: str = "") -> str:
    """``text`` if it has at most ``limit`` characters, else its head and a note of how many
    more there were (``what`` names what was shortened), ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    note = f"({what}{' shortened: ' if what else ''}"
    keep = max(limit - len(note) - 39, 0)  # room for the note
    return f"{text[:keep]}… {note}{len(text) - keep} more characters)"


def error_message(exc: BaseException) -> str:
    """``describe(exc)`` as a run's error keeps it: escaped (``escaped``) and, past
    MAX_ERROR_MESSAGE characters, its head with a note saying the message was shortened."""
    return cut(escaped(describe(exc)), MAX_ERROR_MESSAGE, "message")


def traceback_text(exc: BaseException) -> str:
    """The traceback of ``exc`` as a run's error keeps it after its message: escaped, each
    entry (a frame, an error's line, a note) cut to MAX_TRACEBACK_ENTRY characters, and of
    the whole the last entries that fit in MAX_TRACEBACK (the innermost frames and the
    error's line), after a note of how many characters before them were left out."""
    try:
        entries = traceback.format_exception(exc)
    except Exception as error:  # whatever formatting it raises: not the run's error
        return f"(the traceback could not be formatted: {describe(error)})\n"
    entries = [escaped(e) for e in entries]
    entries = [e if len(e) <= MAX_TRACEBACK_ENTRY else cut(e, MAX_TRACEBACK_ENTRY) + "\n" for e in entries]
    kept: list[str] = []
    size = 0
    for entry in reversed(entries):
        if size + len(entry) > MAX_TRACEBACK - 80:  # room for the note
            left_out = sum(map(len, entries)) - size
            kept.append(f"(… {left_out} characters of the traceback before these left out)\n")
            break
        kept.append(entry)
        size += len(entry)
    return "".join(reversed(kept))


def describe(exc: BaseException) -> str:
    """``Class: message`` for any exception, even one whose ``__str__`` raises."""
    return f"{type(exc).__name__}: {message_of(exc)}"


def one_line(exc: BaseException) -> str:
    """``message_of(exc)`` on one line (libpq's messages take two or three), for a log line: a
    line of its own would read as an event of its own, with no time, level or worker."""
    return " ".join(message_of(exc).split())


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note saying why it could not be had: an error's own text must
    not take down the thread that reports it."""
    try:
        return str(exc)
    except BaseException as error:  # whatever __str__ raises, SystemExit too: not the run's error
        try:
            why = f"{type(error).__name__}: {error}"
        except BaseException:
            why = type(error).__name__
        return f"(the error message could not be read: {why})"


def failure(ctx: Context, why: str, exc: BaseException | None = None) -> Outcome:
    """A run that fails for a reason outside its job code: ``why``, then the error if any."""
    message = why if exc is None else f"{why}: {describe(exc)}"
    return Outcome(ctx, "fail", classes=None if exc is None else error_classes(exc), message=message)
