"""Reporting outcomes: the worker's completer.

Executor threads hand finished runs' outcomes to the ``Reporter``; the claim
loop asks it to report them. Failures, cancellations and completions with a
result each get their own fenced call here; plain completions (no result) are
handed back so the worker sends them in one ``jobs.complete_many`` alongside
its next claim (on the completer's own connection); those of a batch the database
refused are reported one at a time here, so a refusal fails only its run. An
outcome that cannot be reported (database down) is kept and retried: the fenced
SQL makes a repeat harmless.

An outcome whose values are refused is not an outage, and is never retried as
it is: a result that is not JSON (NaN, an object, whatever its encoding raises),
or that the database refuses (a NUL character, a lone surrogate, over
``jobs.config.max_payload_bytes``, an operator's trigger), is recorded as a
failure saying the result could not be stored and why. Error texts are made
storable before they are sent (``storable``): NUL and text that is not valid
UTF-8 become escapes, and they are cut to a bounded length.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgtick import calls
from pgtick.app import Context
from pgtick.client import MERGED_KEYS, merged_keys
from pgtick.events import WorkerListener
from pgtick.execution import Outcome, cut, describe, escaped, failure, message_of
from pgtick.logs import log_outcome

log = logging.getLogger("pgtick.worker")

#: The status each applied action leaves the run in.
_STATUS = {
    "complete": "COMPLETED",
    "fail": "FAILED",
    "cancel": "CANCELLED",
    "abandon": "ABANDONED",
    "snooze": "SNOOZED",
}

#: The error a run gets when its job snoozed after its cancellation was requested.
SNOOZED_WHILE_CANCELLED = "cancelled: its job snoozed after its cancellation was requested"


#: The ``error`` of an ABANDONED outcome line.
ABANDONED = "result not reported: the run is no longer this worker's"

#: Longest error text sent (jobs.fail keeps as much).
MAX_MESSAGE = 10000
#: Longest account of why an outcome could not be stored.
MAX_REFUSAL = 2000
#: SQLSTATE classes of a refused value: data exception, integrity constraint
#: violation, program limit exceeded (too large, nested too deep), and a PL/pgSQL RAISE
#: (P0001 is what an operator's trigger raises unless it names another code).
_REFUSED_CLASSES = ("22", "23", "54", "P0")


def storable(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as PostgreSQL text takes it: NUL and what is not valid UTF-8 (lone
    surrogates, undecodable bytes decoded with surrogateescape) shown as backslash
    escapes, cut to ``limit`` characters with a note of how much was cut."""
    return cut(escaped(text), limit)


class NotJSON(ValueError):
    """A result that cannot be encoded as JSON; the message says why (the encoder's error)."""


def result_json(value: Any) -> Jsonb:
    """The result as jsonb, or a ValueError saying why it is not JSON: NaN or Infinity, or
    ``NotJSON`` carrying whatever else the encoding raised (an object JSON has no form for, a
    mapping whose ``items()`` raises, MemoryError): it is about this one result."""
    try:
        text = json.dumps(value, allow_nan=False)
    except Exception as exc:
        if isinstance(exc, ValueError):
            try:
                json.dumps(value)
            except Exception:
                pass  # the problem is not (only) a float
            else:
                raise ValueError("it holds a float JSON cannot represent (NaN or Infinity)") from None
        raise NotJSON(describe(exc)) from exc
    if merged_keys(value):
        raise ValueError(MERGED_KEYS)
    return Jsonb(value, dumps=lambda _: text)


def refused(exc: BaseException) -> bool:
    """True when ``exc`` says the values of a call were refused, by the driver or the
    database, rather than the call failing (a lost connection): sending the same values
    again fails the same way."""
    if isinstance(exc, psycopg.Error):
        return isinstance(exc, psycopg.DataError) or (exc.sqlstate or "")[:2] in _REFUSED_CLASSES
    return isinstance(exc, (ValueError, TypeError, OverflowError, RecursionError))


def refusal_text(exc: BaseException) -> str:
    """The refusal in one line: the database's message and detail, or the Python error."""
    if isinstance(exc, NotJSON):
        return message_of(exc)
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        detail = exc.diag.message_detail
        return exc.diag.message_primary + (f" ({detail})" if detail else "")
    return describe(exc)


def log_run_outcome(
    ctx: Context,
    worker_id: str,
    status: str,
    error: str | None = None,
    retry_run_id: int | None = None,
    snoozed_for: float | None = None,
) -> None:
    """The one line a run's outcome gets (``pgtick.logs.log_outcome``), its duration counted
    from when its job began; the reporter writes it, and the heartbeat loop for a run it fails
    past its kind's timeout."""
    log_outcome(
        run_id=ctx.run_id,
        kind=ctx.kind,
        definition=ctx.run.get("definition"),
        status=status,
        attempt=ctx.attempt,
        duration=time.monotonic() - ctx.started,
        worker=worker_id,
        error=error,
        retry_run_id=retry_run_id,
        snoozed_for=snoozed_for,
    )


class Reporter:
    """Holds outcomes until reported and settles each: events, logs, and ``release`` of the run."""

    def __init__(
        self,
        worker_id: str,
        events: WorkerListener,
        release: Callable[[Context], None],
        *,
        claim_token: str | None = None,
        left: Callable[[Context], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.claim_token = claim_token  # what the runs were claimed with (a secret)
        self.events = events
        self.release = release  # the run is no longer this worker's to hold
        # Called for a run let go with no outcome recorded: it may still be RUNNING for this
        # worker until the reaper ends it.
        self.left = left
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        self._pending: set[int] = set()
        # Runs their worker failed as Timeout while their job ran on (under _lock): settled,
        # so their late return is neither reported nor counted again.
        self._timed_out: set[int] = set()
        # Plain completions whose batch the database refused: each is reported alone, so
        # the refusal stays with the run it is about.
        self._alone: set[int] = set()

    def add(self, outcome: Outcome) -> None:
        """An executor finished a run: keep its outcome until reported."""
        with self._lock:
            self._pending.add(outcome.ctx.run_id)
            self._outcomes.append(outcome)

    def is_pending(self, run_id: int) -> bool:
        """True while the run's outcome waits to be reported."""
        with self._lock:
            return run_id in self._pending

    def requeue(self, outcomes: list[Outcome]) -> None:
        """Report these again on the next call (their call failed)."""
        with self._lock:
            self._outcomes[:0] = outcomes

    def requeue_alone(self, outcomes: list[Outcome]) -> None:
        """The database refused the batch these plain completions went in: report each with a
        call of its own (``report``), so a refusal fails only the run it is about."""
        with self._lock:
            self._alone.update(o.ctx.run_id for o in outcomes)
            self._outcomes[:0] = outcomes

    def _batched(self, o: Outcome) -> bool:
        return o.plain and o.ctx.run_id not in self._alone

    def take_plain(self) -> list[Outcome]:
        """The plain completions waiting (no result to store), taken for one
        ``jobs.complete_many`` call; the caller settles them or requeues them."""
        with self._lock:
            plain = [o for o in self._outcomes if self._batched(o)]
            if plain:
                self._outcomes = [o for o in self._outcomes if not self._batched(o)]
        return plain

    def report(self, conn: psycopg.Connection[Any]) -> None:
        """Report the outcomes that need a call of their own (the plain completions stay,
        for ``take_plain``). On a database error the unreported ones are kept."""
        with self._lock:
            pending = [o for o in self._outcomes if not self._batched(o)]
            if not pending:
                return
            self._outcomes = [o for o in self._outcomes if self._batched(o)]
        try:
            for o in list(pending):
                self._report_one(conn, o)
                pending.remove(o)
        finally:
            if pending:
                self.requeue(pending)

    def _report_one(self, conn: psycopg.Connection[Any], o: Outcome) -> None:
        """Report one outcome. One whose values are refused is reported instead as the
        failure that says why; if even that is refused, as a failure with a fixed text;
        if that too is refused, the run is let go (the reaper fails it)."""
        ctx = o.ctx
        if self._late(ctx):
            return
        if o.action == "abandon" or ctx.abandoned:
            self.events.on_outcome(ctx.kind, "abandon")
            log_run_outcome(ctx, self.worker_id, "ABANDONED", ABANDONED)
            self._forget(ctx, left=True)
            return
        what = {
            "complete": "completion" if o.plain else "result",
            "cancel": "cancellation",
            "snooze": "snooze",
        }
        why = f"the {what.get(o.action, 'error')} could not be stored"
        attempts = [o]
        while attempts:
            outcome = attempts.pop(0)
            try:
                applied, retry = self._send(conn, outcome)
            except Exception as exc:
                if not refused(exc):
                    raise
                log.warning("run=%s kind=%s %s: %s", ctx.run_id, ctx.kind, why, refusal_text(exc))
                if outcome is o:
                    instead = failure(ctx, storable(f"{why}: {refusal_text(exc)}", MAX_REFUSAL))
                    if o.action == "fail":  # the job's error classes still choose the retry
                        instead.classes, instead.reason = o.classes, o.reason
                    attempts = [instead, failure(ctx, why)]
                continue
            self.settle(outcome, applied, retry_run_id=retry)
            return
        log.error("run=%s kind=%s no outcome could be stored: left to the reaper", ctx.run_id, ctx.kind)
        self._forget(ctx, left=True)

    def _send(self, conn: psycopg.Connection[Any], o: Outcome) -> tuple[bool, int | None]:
        """The fenced call for ``o``: (applied, the retry's run id if one was queued)."""
        ctx = o.ctx
        if o.plain:  # a completion whose batch was refused, sent alone
            done = self._complete_alone(conn, ctx.run_id)
            return done, None
        if o.action == "complete":
            return calls.complete(
                conn, ctx.run_id, self.worker_id, result_json(o.result), self.claim_token
            ), None
        if o.action == "snooze":
            return self._snooze(conn, o), None
        if o.action == "cancel":
            message = None if o.message is None else storable(o.message)
            return calls.acknowledge_cancel(conn, ctx.run_id, self.worker_id, message, self.claim_token), None
        classes = None if o.classes is None else [storable(c, 200) for c in o.classes]
        failed = calls.fail(
            conn, ctx.run_id, self.worker_id, classes, storable(o.message or ""), o.reason, self.claim_token
        )
        retry = failed[0] if failed is not None and failed[1] == "QUEUED" else None
        return failed is not None, retry

    def _snooze(self, conn: psycopg.Connection[Any], o: Outcome) -> bool:
        """``jobs.snooze`` for ``o``: whether it was applied. Refused because the run's
        cancellation was requested (the worker had not heard yet), the run ends CANCELLED
        instead (``o`` becomes that cancellation); refused because the run is no longer this
        worker's, it is fenced."""
        ctx = o.ctx
        assert o.delay is not None
        if calls.snooze(conn, ctx.run_id, self.worker_id, o.delay, self.claim_token):
            return True
        why = SNOOZED_WHILE_CANCELLED
        if calls.acknowledge_cancel(conn, ctx.run_id, self.worker_id, why, self.claim_token):
            o.action, o.message = "cancel", SNOOZED_WHILE_CANCELLED
            return True
        return False

    def timed_out(self, ctx: Context) -> None:
        """Its worker failed the run as Timeout (the heartbeat loop wrote its outcome line):
        counted as a failure now; whatever its job returns later is dropped."""
        with self._lock:
            self._timed_out.add(ctx.run_id)
        self.events.on_outcome(ctx.kind, "fail")

    def _late(self, ctx: Context) -> bool:
        """True (and the run let go) when its worker failed the run as Timeout: that failure
        was its outcome, counted and logged; what its job returned afterwards is dropped."""
        with self._lock:
            timed_out = ctx.run_id in self._timed_out
            self._timed_out.discard(ctx.run_id)
        if timed_out:
            log.info(
                "run=%s kind=%s worker=%s returned after its timeout: result not reported",
                ctx.run_id,
                ctx.kind,
                self.worker_id,
            )
            self._forget(ctx)
        return timed_out

    def settle(self, o: Outcome, applied: bool, retry_run_id: int | None = None) -> None:
        """The database answered for this outcome: applied, or fenced. Logs one line. A
        completion sent while its worker failed the run as Timeout (the job returned just as
        its deadline passed) is fenced by that failure: not counted or logged a second time."""
        ctx = o.ctx
        if not applied and self._late(ctx):
            return
        self.events.on_outcome(ctx.kind, o.action if applied else "fenced")
        status = _STATUS[o.action] if applied else "FENCED"
        error = None
        if not applied:
            error = f"{o.action} not applied: no longer RUNNING for this worker (reaped or fenced)"
        elif o.action == "fail":
            message = None if o.message is None else storable(o.message)
            error = f"{o.reason}: {message}" if o.reason != "Error" else message
        snoozed_for = o.delay.total_seconds() if applied and o.action == "snooze" and o.delay else None
        log_run_outcome(ctx, self.worker_id, status, error, retry_run_id, snoozed_for)
        self._forget(ctx)

    def _complete_alone(self, conn: psycopg.Connection[Any], run_id: int) -> bool:
        """``jobs.complete_many`` for one run: whether it was completed (or had been)."""
        rows = conn.execute(calls.COMPLETE_MANY, ([run_id], self.worker_id, self.claim_token)).fetchall()
        return bool(rows)

    def _forget(self, ctx: Context, *, left: bool = False) -> None:
        if left and self.left is not None:
            self.left(ctx)
        self.release(ctx)
        with self._lock:
            self._pending.discard(ctx.run_id)
            self._alone.discard(ctx.run_id)
            self._timed_out.discard(ctx.run_id)
