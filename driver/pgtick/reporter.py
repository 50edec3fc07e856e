"""Reporting outcomes: the worker's completer.

Executor threads hand finished runs' outcomes to the ``Reporter``; the claim
loop asks it to report them. Failures, cancellations and completions with a
result each get their own fenced call here; plain completions (no result) are
handed back so the worker sends them in one ``jobs.complete_many`` alongside
its next claim (on the completer's own connection). An outcome that cannot be
reported (database down) is kept and retried: the fenced SQL makes a repeat
harmless.
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
from pgtick.events import WorkerListener
from pgtick.execution import Outcome
from pgtick.logs import log_outcome

log = logging.getLogger("pgtick.worker")

#: The status each applied action leaves the run in.
_STATUS = {"complete": "COMPLETED", "fail": "FAILED", "cancel": "CANCELLED", "abandon": "ABANDONED"}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value


class Reporter:
    """Holds outcomes until reported and settles each: events, logs, and ``release`` of the run."""

    def __init__(
        self,
        worker_id: str,
        events: WorkerListener,
        release: Callable[[Context], None],
        *,
        claim_token: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.claim_token = claim_token  # what the runs were claimed with (a secret)
        self.events = events
        self.release = release  # the run is no longer this worker's to hold
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        self._pending: set[int] = set()

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

    def report(self, conn: psycopg.Connection[Any]) -> list[Outcome]:
        """Report the outcomes that need a call of their own and return the plain
        completions, for the caller to send with its next claim. On a database
        error the unreported ones are kept."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        if not outcomes:
            return []
        plain = [o for o in outcomes if o.plain]
        pending = [o for o in outcomes if not o.plain]
        try:
            for o in list(pending):
                self._report_one(conn, o)
                pending.remove(o)
        except BaseException:
            pending += plain
            raise
        finally:
            if pending:
                self.requeue(pending)
        return plain

    def _report_one(self, conn: psycopg.Connection[Any], o: Outcome) -> None:
        ctx = o.ctx
        if o.action == "abandon" or ctx.abandoned:
            self.events.on_outcome(ctx.kind, "abandon")
            log.info("run=%s kind=%s abandoned: result not reported", ctx.run_id, ctx.kind)
            self._forget(ctx)
        elif o.action == "complete":
            self.settle(
                o,
                calls.complete(
                    conn, ctx.run_id, self.worker_id, Jsonb(_jsonable(o.result)), self.claim_token
                ),
            )
        elif o.action == "cancel":
            self.settle(
                o, calls.acknowledge_cancel(conn, ctx.run_id, self.worker_id, o.message, self.claim_token)
            )
        else:
            message = (o.message or "")[:10000]
            failed = calls.fail(
                conn, ctx.run_id, self.worker_id, o.classes, message, o.reason, self.claim_token
            )
            retry = failed[0] if failed is not None and failed[1] == "QUEUED" else None
            self.settle(o, failed is not None, retry_run_id=retry)

    def settle(self, o: Outcome, applied: bool, retry_run_id: int | None = None) -> None:
        """The database answered for this outcome: applied, or fenced. Logs one line."""
        ctx = o.ctx
        self.events.on_outcome(ctx.kind, o.action if applied else "fenced")
        status = _STATUS[o.action] if applied else "FENCED"
        error = None
        if not applied:
            error = f"{o.action} not applied: no longer RUNNING for this worker (reaped or fenced)"
        elif o.action == "fail":
            error = f"{o.reason}: {o.message}" if o.reason != "Error" else o.message
        log_outcome(
            run_id=ctx.run_id,
            kind=ctx.kind,
            definition=ctx.run.get("definition"),
            status=status,
            attempt=ctx.attempt,
            duration=time.monotonic() - ctx.started,
            worker=self.worker_id,
            error=error,
            retry_run_id=retry_run_id,
        )
        self._forget(ctx)

    def _forget(self, ctx: Context) -> None:
        self.release(ctx)
        with self._lock:
            self._pending.discard(ctx.run_id)
