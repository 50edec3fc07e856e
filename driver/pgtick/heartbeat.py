"""The worker's heartbeat: one ``jobs.heartbeat`` call for all its runs (up to
MAX_CALL_IDS a call), on a cadence.

The loop knows nothing of the worker beyond ``HeartbeatOwner``: which runs to
stamp and how often, what to do with a run that is no longer ours, and where a
failed call is reported. A run flagged cancel_requested is asked to stop at its
next checkpoint. A run whose row another transaction holds locked is skipped by the
database, not waited for, and answered as still ours but not stamped. A failed call
(the database) is logged and tried again on the next beat, never fatal to the jobs;
any other error ends the loop and is handed to the owner (``heartbeat_died``), which cannot go on without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import psycopg

from pgtick import calls
from pgtick.app import Context, error_classes
from pgtick.db import DB_ERRORS, connect
from pgtick.errors import JobTimeout
from pgtick.reporter import log_run_outcome

log = logging.getLogger("pgtick.worker")

#: Most run ids one call on a worker's runs takes (jobs.heartbeat, complete_many, unclaim):
#: more go in several calls, each its own transaction.
MAX_CALL_IDS = 10000

#: Longest wait (seconds) of jobs.worker_seen for a lock on the worker registry; at most half
#: the heartbeat interval, so the runs' next heartbeat is never held up by it.
SEEN_LOCK_WAIT = 1.0

T = TypeVar("T")


def chunks(items: Sequence[T], size: int = MAX_CALL_IDS) -> Iterator[list[T]]:
    """``items`` in consecutive lists of at most ``size``."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


class HeartbeatOwner(Protocol):
    """What the heartbeat loop needs from whoever holds the runs."""

    def held(self) -> Mapping[int, Context]:
        """The runs to stamp, by id."""
        ...

    def heartbeat_interval(self) -> float:
        """Seconds until the next heartbeat."""
        ...

    def lost(self, ctx: Context) -> None:
        """A held run missing from the answer: reaped or fenced, no longer ours."""
        ...

    def heartbeat_failed(self, exc: Exception) -> None:
        """The heartbeat call failed (the runs keep going)."""
        ...

    def timed_out(self, ctx: Context, message: str) -> None:
        """A held run this loop has failed as Timeout (``message``, its error): settled (a
        failure), and let go."""
        ...

    def heartbeat_died(self, exc: BaseException) -> None:
        """The loop ended on an error that is not the database's: nothing heartbeats any more."""
        ...

    def server_heartbeat_timeout(self, seconds: float) -> None:
        """``jobs.config.heartbeat_timeout`` as read at a beat: the timeout of the runs that have
        none of their own, which the cadence must stay well inside."""
        ...

    def overdue(self) -> list[Context]:
        """Held runs past a timeout only this worker knows (the kind's, when the run has none of
        its own for the server to enforce): the loop fails them as Timeout."""
        ...


class HeartbeatLoop:
    """One heartbeat call for all of an owner's runs, on its cadence, on its own connection."""

    def __init__(
        self, dsn: str, worker_id: str, owner: HeartbeatOwner, *, claim_token: str | None = None
    ) -> None:
        self.dsn = dsn
        self.worker_id = worker_id
        self.claim_token = claim_token  # what the runs were claimed with (a secret)
        self.owner = owner
        self.now = threading.Event()  # set to heartbeat at once
        self.waiting = float("inf")  # the wait in progress, seconds
        self.stopped = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._seen_blocked = False  # the last jobs.worker_seen gave up waiting for a lock
        self._thread = threading.Thread(target=self._loop, name="pgtick-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.now.set()
        self._thread.join(timeout=10)
        if self._conn is not None:
            self._conn.close()

    def _loop(self) -> None:
        try:
            while not self.stopped.is_set():
                self.waiting = self.owner.heartbeat_interval()
                self.now.wait(self.waiting)
                self.now.clear()
                if self.stopped.is_set():
                    return
                self.beat()
        except BaseException as exc:
            self.owner.heartbeat_died(exc)

    def beat(self) -> None:
        held = dict(self.owner.held())
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, application_name=f"pgtick-heartbeat {self.worker_id}")
            # The runs first: only their heartbeat keeps them from the reaper, and one that waits
            # behind a table lock keeps them from it all the while (jobs.heartbeat).
            sent = time.monotonic()  # the database stamps the runs after this instant
            alive = self._stamp(self._conn, list(held)) if held else {}
        except DB_ERRORS as exc:
            self._failed(exc)
            return
        if held:
            self._settle(held, alive, sent)
        try:
            if self._conn is not None and not self._conn.closed:
                self._seen(self._conn)
        except DB_ERRORS as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """A call failed: reported, and the next beat connects again."""
        self.owner.heartbeat_failed(exc)
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _settle(self, held: Mapping[int, Context], alive: Mapping[int, bool | None], sent: float) -> None:
        """Act on the answer of a heartbeat sent at ``sent`` (monotonic) for ``held``."""
        self._expire(self.owner.overdue())
        still_held = self.owner.held()  # runs reported meanwhile are gone from the answer too
        for run_id, ctx in held.items():
            if run_id not in still_held:
                continue
            if run_id not in alive:
                self.owner.lost(ctx)
                continue
            if alive[run_id] is None:
                continue  # another transaction holds its row: still ours, not stamped this time
            ctx.owned(sent)
            if alive[run_id] and not ctx.cancel_requested:
                log.info("run=%s kind=%s cancel requested", run_id, ctx.kind)
                ctx.request_cancel()

    def _seen(self, conn: psycopg.Connection[Any]) -> None:
        """``jobs.worker_seen``, the worker's own sign of life, and the server's heartbeat
        timeout, waiting at most half a beat for a lock on the worker registry or the settings:
        a table held locked (a migration, an operator's LOCK TABLE) must not hold up the next
        heartbeat of the runs. Not seen this time is harmless: ``jobs.workers`` may show the
        worker lost until the lock is released, and the timeout read at the next beat."""
        try:
            with conn.transaction():
                calls.local_lock_timeout(conn, min(SEEN_LOCK_WAIT, self.owner.heartbeat_interval() / 2))
                # The server's heartbeat timeout, read at every beat: one an operator lowers
                # reaches the cadence at the next beat, not when the worker next connects.
                timeout = calls.heartbeat_timeout_seconds(conn)
                if timeout is not None:
                    self.owner.server_heartbeat_timeout(timeout)
                calls.worker_seen(conn, self.worker_id)
        except psycopg.errors.LockNotAvailable:
            if not self._seen_blocked:
                log.warning(
                    "worker=%s not stamped seen: jobs.worker_registry or jobs.config is locked (the"
                    " heartbeats of its runs go on)",
                    self.worker_id,
                )
            self._seen_blocked = True
            return
        self._seen_blocked = False

    def _stamp(self, conn: psycopg.Connection[Any], run_ids: list[int]) -> dict[int, bool | None]:
        """``jobs.heartbeat`` for these runs, in calls of at most MAX_CALL_IDS: run id -> cancel
        requested for each run still ours, None for one not stamped because another transaction
        holds its row (it stays ours; the next beat stamps it)."""
        alive: dict[int, bool | None] = {}
        for part in chunks(sorted(run_ids)):
            rows = conn.execute(calls.HEARTBEAT, (part, self.worker_id, self.claim_token)).fetchall()
            alive.update({int(run_id): None if cancel is None else bool(cancel) for run_id, cancel in rows})
        return alive

    def _expire(self, overdue: list[Context]) -> None:
        """Fail runs past their kind's timeout (fenced, retried by policy) and let them go: a job
        that never reaches a checkpoint cannot hold its slot, caps and limits for ever, even where
        the server does not know the timeout. Its late return is not reported."""
        for ctx in overdue:
            message = (
                f"run {ctx.run_id} exceeded its timeout of {ctx.timeout:g}s without reaching a"
                " checkpoint; failed by its worker"
            )
            try:
                assert self._conn is not None
                failed = calls.fail(
                    self._conn,
                    ctx.run_id,
                    self.worker_id,
                    error_classes(JobTimeout(message)),  # as a checkpoint reports it
                    message,
                    "Timeout",
                    self.claim_token,
                )
            except DB_ERRORS as exc:
                self.owner.heartbeat_failed(exc)
                return
            if failed is None:
                self.owner.lost(ctx)
                continue
            log.warning("run=%s kind=%s worker=%s %s", ctx.run_id, ctx.kind, self.worker_id, message)
            retry = failed[0] if failed[1] == "QUEUED" else None
            log_run_outcome(ctx, self.worker_id, "FAILED", f"Timeout: {message}", retry)
            self.owner.timed_out(ctx, message)
