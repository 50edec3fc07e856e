"""Running job code: one plain function from a claimed run to a typed outcome.

``execute`` never raises: whatever the job does, it returns an ``Outcome`` that
the reporter sends to the database (``pgtick.reporter``).
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pgtick import instrumentation
from pgtick.app import Context, error_classes
from pgtick.errors import Abandoned, Cancelled, JobTimeout

if TYPE_CHECKING:
    from pgtick.isolation import ProcessPool

#: How a run ended in this process.
Action = Literal["complete", "fail", "cancel", "abandon"]

#: What became of an outcome once reported: its action, or "fenced" when the
#: database no longer had the run RUNNING for this worker.
Settlement = Literal["complete", "fail", "cancel", "abandon", "fenced"]


@dataclass
class Outcome:
    """How a run ended in this process, waiting to be reported."""

    ctx: Context
    action: Action
    result: Any = None
    classes: list[str] | None = None
    message: str | None = None
    reason: str = "Error"

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
    would stay RUNNING until the reaper failed it as HeartbeatLost)."""
    if isinstance(exc, Cancelled) and ctx.cancel_requested:
        return Outcome(ctx, "cancel", message=message_of(exc))
    if isinstance(exc, Abandoned) and ctx.abandoned:
        return Outcome(ctx, "abandon")
    if isinstance(exc, JobTimeout):
        return Outcome(ctx, "fail", classes=error_classes(exc), message=message_of(exc), reason="Timeout")
    return Outcome(ctx, "fail", classes=error_classes(exc), message=describe(exc))


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
