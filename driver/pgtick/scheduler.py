"""The scheduler: a leader-elected tick that turns definitions into runs.

Every ``tick_interval`` seconds, on one dedicated session connection:

1. ``jobs.try_lead()`` — a session advisory lock; only the leader goes on;
2. initialize the cursors of new recurring definitions (first occurrence >= their creation,
   or the change or resume that reset them); one that appeared since this leader's previous
   tick gets a run for each of its occurrences already past, whatever its misfire policy;
3. materialize recurring definitions due within the lookahead: compute the
   occurrences here (RRULE/cron in the definition's time zone, misfire policy)
   and hand a batch of them to ``jobs.materialize_many``, a compare-and-set on
   every cursor plus the inserts in one statement, so a second leader in the
   same instant adds nothing. A definition whose runs the database refuses (a
   trigger, a constraint, a refused value) is isolated there: recorded in
   ``jobs.definitions.materialize_error``, retried with backoff, logged here by
   name; the others are materialized and the leader keeps its lock;
4. ``jobs.materialize_one_shots()``, then pending ``jobs.backfill()`` windows;
5. ``jobs.reap()``;
6. ``jobs.archive()`` every minute: finished runs older than ``jobs.config.archive_after``
   move to the day-partitioned history (a backlog a few batches per tick);
7. ``jobs.prune()`` now and then: whole days of history past the retention are dropped.

Definitions back from downtime (a cursor older than the misfire grace) are planned
after the on-time ones, within a budget per tick of missed occurrences walked and
seconds spent walking; a catch-up that needs more commits its cursor where it
stopped and goes on next tick, and the walk that reaches the present settles it
as one walk would (``settle_late``). A definition whose schedule raises anything
while read or planned gets a ``schedule_error`` and the others go on.

The work of a tick is proportional to what is due: only definitions whose
cursor falls within the horizon are read (an index), parsed schedules are
cached by (schedule, zone, anchor) and plans shared by definitions with the
same schedule and cursor. Without an explicit ``lookahead`` the horizon adapts:
it covers the time the leader needs to materialize the largest group of
definitions due at one instant (measured), so a minute boundary with 100,000
occurrences finds them inserted well before it.

Each phase is its own transaction, and a phase that fails on a healthy session is
logged while the next phases still run (a materialization that keeps failing never
stops the reaper). A failing tick logs one line and the loop sleeps and goes on;
a lost connection means lost leadership, contested again on the next tick (an
error the database reports on a healthy session keeps it).

Leadership takes one of two forms (``leadership``):

* ``lock``: the session advisory lock of step 1, for a direct (or session-pooled)
  connection; a crashed leader's lock goes with its session, so a follower takes
  over on its next tick;
* ``lease``: the lease ``pgtick:leader`` in ``jobs.leases``, taken with
  ``jobs.acquire_lease`` and renewed on every tick with ``jobs.renew_lease`` (and
  between the statements of a tick once half the TTL has passed, so a long tick leads
  to its end); it needs no session, so it works through a transaction-mode pooler
  (PgBouncer), where a session lock would be handed to other clients. A crashed
  leader's lease expires after ``lease_ttl``, then a follower takes it. The leader's
  own writes are fenced by the lease: a tick stops between statements once the lease
  may have expired (measured on this process's monotonic clock from before the last
  granted renewal was sent; the database's clock decides whether a renewal is granted),
  so a deposed leader does no more than finish the statement in flight, and that one
  is harmless: materialization is a compare-and-set, reaping and pruning are idempotent.
* ``auto`` (default): ``lease`` when the connection goes through a pooler
  (``pgtick.db.behind_pooler``), else ``lock``. Every replica of a deployment
  should reach PostgreSQL the same way, or be given the same mode: a lock leader
  and a lease leader do not see each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.datetime import TimestamptzLoader

from pgtick import calls as sql
from pgtick.db import behind_pooler, connect_dicts
from pgtick.schedule import (
    Plan,
    Schedule,
    ScheduleError,
    anchor_for,
    first_cursor,
    parse_schedule,
    plan_materialization,
)
from pgtick.schedule.rrule import keeping_alive
from pgtick.schedule.zones import load_zone
from pgtick.terminal import compact_duration, counted

log = logging.getLogger("pgtick.scheduler")

_BEHIND = timedelta(minutes=1)
#: The longest tick (a day), and the longest leader lease (a year, as jobs.acquire_lease allows).
MAX_TICK = 86_400.0
MAX_LEASE_TTL = 365 * 86_400.0
_EARLIEST = datetime.min.replace(tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)


class _EdgeOfTimeLoader(TimestamptzLoader):
    """timestamptz values Python cannot hold (``-infinity``, ``infinity``, years before 1 or
    after 9999) load as the edges of datetime on the leader's connection, so one value
    edited in psql cannot make every read of the definitions fail."""

    def load(self, data: Any) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            return _EARLIEST if text.startswith(b"-") or text.endswith(b" BC") else _LATEST


@dataclass
class TickReport:
    """What one tick did (the leader's tick; a follower's is empty)."""

    leading: bool = False
    initialized: int = 0
    runs_created: int = 0
    stale: int = 0
    one_shots: int = 0
    reaped: list[dict[str, Any]] = field(default_factory=list)
    archived: int = 0
    pruned: int = 0
    schedule_errors: int = 0
    materialize_errors: int = 0
    backfilled: int = 0
    catching_up: int = 0  # definitions whose catch-up goes on next tick (the budget ran out)
    phase_errors: list[str] = field(default_factory=list)


class ScheduleCache:
    """Parsed schedules by (schedule text, zone, anchor, DST policy), least recently used out.

    Definitions that share a schedule share one parsed object (and so their plans)."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], Schedule] = OrderedDict()

    @staticmethod
    def key(d: dict[str, Any], anchor: datetime) -> tuple[Any, ...]:
        return (d["schedule"], d["timezone"], anchor, d.get("dst_gap"), d.get("dst_repeat"))

    def get(self, key: tuple[Any, ...]) -> Schedule | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: tuple[Any, ...], schedule: Schedule) -> None:
        self._items[key] = schedule
        if len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class Horizon:
    """The adaptive lookahead: long enough to materialize the largest group of definitions
    due at one instant before that instant comes, with a safety factor.

    It learns two things as the leader works: the seconds per definition of a batch
    (fetch, plan, insert; a moving average) and the burst (the most definitions whose
    cursor moved to one instant; decaying slowly so a quiet minute does not forget it).
    """

    def __init__(
        self, base: timedelta, tick_interval: float, per_tick: int, maximum: timedelta, fixed: bool
    ) -> None:
        self.base = base
        self.tick_interval = tick_interval
        self.per_tick = per_tick
        self.maximum = maximum
        self.fixed = fixed
        self.seconds_per_definition = 0.0
        self.burst = 0.0
        self._counts: Counter[datetime] = Counter()

    def observe_batch(self, definitions: int, seconds: float) -> None:
        if definitions <= 0:
            return
        sample = seconds / definitions
        if self.seconds_per_definition == 0.0:
            self.seconds_per_definition = sample
        else:
            self.seconds_per_definition = 0.8 * self.seconds_per_definition + 0.2 * sample

    def observe_cursors(self, cursors: list[datetime | None]) -> None:
        """Count the cursors moved to each instant, across batches and ticks (a boundary's
        definitions arrive over several batches): the largest count is the burst."""
        self._counts.update(c for c in cursors if c is not None)
        if len(self._counts) > 10_000:  # keep the latest instants
            for old in sorted(self._counts)[: len(self._counts) - 5_000]:
                del self._counts[old]
        biggest = max(self._counts.values(), default=0)
        self.burst = max(self.burst * 0.999, float(biggest))

    @property
    def lookahead(self) -> timedelta:
        if self.fixed:
            return self.base
        ticks = -(-self.burst // self.per_tick)  # ticks needed at the per-tick bound
        need = 3.0 * (self.burst * self.seconds_per_definition + ticks * self.tick_interval)
        return min(self.maximum, max(self.base, timedelta(seconds=self.base.total_seconds() + need)))


class Scheduler:
    """Leader election plus the materialize / reap / prune phases."""

    def __init__(
        self,
        dsn: str,
        *,
        owner: str,
        tick_interval: float = 1.0,
        lookahead: float | None = None,
        max_lookahead: float = 120.0,
        misfire_grace: float = 60.0,
        max_catch_up: int = 100,
        catch_up_budget: int = 20_000,
        catch_up_seconds: float | None = None,
        batch: int = 1000,
        batches_per_tick: int = 20,
        prune_every: float = 3600.0,
        prune_batch: int = 10_000,
        prune_batches_per_tick: int = 10,
        archive_every: float = 60.0,
        clock: Callable[[], datetime] | None = None,
        leadership: str = "auto",
        lease_ttl: float | None = None,
    ) -> None:
        if leadership not in ("auto", "lock", "lease"):
            raise ValueError(f"leadership must be auto, lock or lease, got {leadership!r}")
        # The leader's session idles at most ten ticks (an idle_session_timeout, whose range
        # ends near 24 days) and its lease lasts at most a year (jobs.acquire_lease).
        if not 0 < tick_interval <= MAX_TICK:
            raise ValueError(
                f"tick_interval must be positive and at most {MAX_TICK:g} s, got {tick_interval!r}"
            )
        if lease_ttl is not None and not 0 < lease_ttl <= MAX_LEASE_TTL:
            raise ValueError(f"lease_ttl must be positive and at most {MAX_LEASE_TTL:g} s, got {lease_ttl!r}")
        self.dsn = dsn
        self.leadership = leadership
        self.mode = leadership if leadership != "auto" else "lock"  # settled when connected
        self.lease_ttl = timedelta(
            seconds=lease_ttl if lease_ttl is not None else max(5.0, 5 * tick_interval)
        )
        self._lease_until = float("-inf")  # monotonic instant the renewed lease may expire
        self.owner = owner
        self.tick_interval = tick_interval
        self.misfire_grace = timedelta(seconds=misfire_grace)
        self.max_catch_up = max_catch_up
        # Catch-up after downtime is bounded per tick (missed occurrences and seconds spent
        # walking them), so the session never idles long between statements, and reaping
        # and the on-time definitions are never held up by a long catch-up.
        self.catch_up_budget = catch_up_budget
        self.catch_up_seconds = (
            catch_up_seconds if catch_up_seconds is not None else min(2.0, max(0.1, tick_interval / 2))
        )
        self._catching_up: dict[int, Progress] = {}
        #: Set once the first tick has run (or the loop ended): a worker in the same process
        #: waits for it, so a catch-up supersedes the runs made ahead before a downtime before
        #: that worker can claim them.
        self.first_tick_done = threading.Event()
        self.batch = batch
        self.batches_per_tick = batches_per_tick
        # The horizon adapts unless it is given (or time is the caller's: a test clock).
        self.horizon = Horizon(
            timedelta(seconds=lookahead if lookahead is not None else 2 * tick_interval),
            tick_interval,
            batch * batches_per_tick,
            timedelta(seconds=max(max_lookahead, lookahead or 0.0)),
            fixed=lookahead is not None or clock is not None,
        )
        self.prune_every = prune_every
        # A backlog of finished runs is pruned over several ticks, a few batches each, so
        # pruning never holds up materialization and reaping for minutes.
        self.prune_batch = prune_batch
        self.prune_batches_per_tick = prune_batches_per_tick
        self._prune_more = False
        self.archive_every = archive_every
        self._archive_more = False
        self._last_archive = float("-inf")
        self.clock = clock
        self.leading = False
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._idle_seconds = 0.0  # the leader session's idle_session_timeout (0: none)
        self._last_prune = float("-inf")  # prune on the first tick as leader
        self._parsed = ScheduleCache()
        self._zones_checked: set[str] = set()  # compared with the server's time zone database
        #: The instant of this leader's previous materialization, while it leads without a
        #: break (None: it has just started leading, or its last tick is too long ago).
        self._planned_at: datetime | None = None
        #: How long that materialization took (a slow tick is not a break in the leading).
        self._planning_took = timedelta(0)
        #: The instant this leader began leading without a break: an occurrence from then on
        #: that it finds late is late by its own ticks, not by a downtime.
        self._leading_from: datetime | None = None

    @property
    def lookahead(self) -> timedelta:
        """How far ahead occurrences are materialized now (see ``Horizon``)."""
        return self.horizon.lookahead

    # -- loop ---------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop``; never dies of a database error."""
        log.info("scheduler owner=%s tick=%.2fs", self.owner, self.tick_interval)
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self.tick()
                except Exception as exc:  # the loop must survive anything a tick meets
                    log.warning("scheduler tick failed (will retry): %s", _one_line(exc))
                    if not self._session_healthy():
                        self._drop_connection()
                self.first_tick_done.set()
                stop.wait(max(0.0, self.tick_interval - (time.monotonic() - started)))
        finally:
            self.first_tick_done.set()
            self.close()

    def close(self) -> None:
        """Resign explicitly and close the leader connection."""
        if self._conn is not None and not self._conn.closed:
            try:
                if self.leading and self.mode == "lease":
                    sql.release_lease(self._conn, sql.LEADER_LEASE, self.owner)
                    self.leading = False
                    log.info("scheduler owner=%s resigned (lease released)", self.owner)
                elif self.leading:
                    sql.resign(self._conn)
                    self.leading = False
                    log.info("scheduler owner=%s resigned", self.owner)
            except psycopg.Error:
                pass
        self._drop_connection()

    def _session_healthy(self) -> bool:
        """True when the leader session survived the error (an error the database reported on
        a working connection): keeping it keeps the session lock, hence leadership. A leader by
        lease holds no session (behind a transaction pooler each statement may reach another
        backend): its connection answering is enough."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return False
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            return self._backend_pid(conn) == self._pid or self.mode == "lease"
        except psycopg.Error:
            return False

    def _drop_connection(self) -> None:
        if self.leading:
            log.warning("scheduler owner=%s lost leadership (connection gone)", self.owner)
        self.leading = False
        self._planned_at = None
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self.leading = False
            self._conn = connect_dicts(self.dsn, application_name=f"pgtick-leader {self.owner}")
            self._conn.adapters.register_loader("timestamptz", _EdgeOfTimeLoader)
            if self.leadership == "auto":
                mode = "lease" if behind_pooler(self._conn) else "lock"
                if mode != self.mode or self._pid is None:
                    log.info("scheduler owner=%s leads by %s", self.owner, mode)
                self.mode = mode
            if self.mode == "lock":
                self._limit_idle_session(self._conn)
            self._idle_seconds = sql.idle_session_timeout(self._conn)
            self._pid = self._backend_pid(self._conn)
        return self._conn

    def _limit_idle_session(self, conn: psycopg.Connection[Any]) -> None:
        """A leader frozen for long (SIGSTOP, swap) loses its session, hence the lock: an
        idle_session_timeout of ten ticks (at least 30 s), unless the operator set a shorter
        one (on the role or the database), which is kept: the leader never idles longer
        than a tick between statements. (Never through a pooler: a session setting would
        reach other clients.)"""
        idle = max(30, int(self.tick_interval * 10))
        current = sql.idle_session_timeout(conn)
        if 0 < current <= idle:
            if current < 2 * self.tick_interval + self.catch_up_seconds:
                log.warning(
                    "scheduler owner=%s idle_session_timeout %.1fs is shorter than two ticks: "
                    "the leader's session may be ended between ticks",
                    self.owner,
                    current,
                )
            return
        sql.set_idle_session_timeout(conn, idle)

    @staticmethod
    def _backend_pid(conn: psycopg.Connection[Any]) -> int:
        return sql.backend_pid(conn)

    # -- one tick -----------------------------------------------------------------
    def tick(self) -> TickReport:
        conn = self._connection()
        report = TickReport()
        if self.mode == "lease":
            return self._tick_by_lease(conn, report)
        leading = sql.try_lead(conn, self.owner)
        if leading and self._backend_pid(conn) != self._pid:
            log.error(
                "scheduler owner=%s backend pid changed between statements: the leader "
                "connection goes through a transaction-mode pooler; use a direct connection",
                self.owner,
            )
            self._drop_connection()
            return report
        if leading != self.leading:
            log.info("scheduler owner=%s %s", self.owner, "is leader" if leading else "follows")
        self.leading = report.leading = leading
        if not leading:
            self._lost_lead()
            return report
        return self._lead(conn, report)

    def _tick_by_lease(self, conn: psycopg.Connection[Any], report: TickReport) -> TickReport:
        """Renew the leader lease (or take it when free or expired), then lead while it holds."""
        sent = time.monotonic()
        # Renew first even when not known to lead: after a reconnect the lease may still be ours.
        leading = sql.renew_lease(conn, sql.LEADER_LEASE, self.owner, self.lease_ttl)
        if self.leading and not leading:
            log.warning("scheduler owner=%s lost the leader lease (expired or taken)", self.owner)
            self._lost_lead()  # a break in the leading, even if the lease is taken again below
        if not leading:
            sent = time.monotonic()
            leading = sql.acquire_lease(conn, sql.LEADER_LEASE, self.owner, self.lease_ttl)
        if leading:
            self._lease_until = sent + self.lease_ttl.total_seconds()
        if leading != self.leading:
            log.info("scheduler owner=%s %s (lease)", self.owner, "is leader" if leading else "follows")
        self.leading = report.leading = leading
        if not leading:
            self._lost_lead()
            return report
        return self._lead(conn, report)

    def _lost_lead(self) -> None:
        """Forget what only an unbroken leading vouches for: occurrences that fell due before
        leading again are a downtime (settled by the misfire policy), and another leader may
        have moved the cursors of a catch-up meanwhile."""
        self._catching_up.clear()
        self._planned_at = None

    def _fenced(self) -> bool:
        """Lease mode: the lease may have expired by now. Asked before each phase and each
        statement of the materialization that writes, so a deposed leader stops writing within
        one statement. Past half its TTL (and before it may have expired) the lease is renewed
        first: a tick longer than the lease (a burst of definitions due at one instant, a
        loaded machine) goes on leading without a break, instead of stopping before its
        reaping and meeting its own late occurrences next tick as if nobody had led (a
        downtime, for the misfire policy)."""
        if self.mode != "lease":
            return False
        if (
            self.leading
            and self._lease_until - self.lease_ttl.total_seconds() / 2 <= time.monotonic() < self._lease_until
        ):
            self._renew_mid_tick()
        if time.monotonic() >= self._lease_until:
            if self.leading:
                log.warning(
                    "scheduler owner=%s lease may have expired mid-tick: stopping the tick", self.owner
                )
            self.leading = False
            self._planned_at = None
            return True
        return False

    def _renew_mid_tick(self) -> None:
        """Renew the leader lease between two statements of a tick. The database's clock
        decides: a renewal succeeds only while the lease is still this owner's and unexpired
        there, so nobody else can have led meanwhile. A refused renewal leaves the lease to
        run out on this process's clock (``_fenced`` then stops the tick)."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        sent = time.monotonic()
        try:
            renewed = sql.renew_lease(conn, sql.LEADER_LEASE, self.owner, self.lease_ttl)
        except psycopg.Error as exc:
            if not self._session_healthy():
                raise
            log.warning(
                "scheduler owner=%s could not renew the leader lease mid-tick: %s", self.owner, _one_line(exc)
            )
            return
        if renewed:
            self._lease_until = sent + self.lease_ttl.total_seconds()
        else:
            log.warning("scheduler owner=%s lost the leader lease mid-tick (expired or taken)", self.owner)
            self._lease_until = float("-inf")

    def _lead(self, conn: psycopg.Connection[Any], report: TickReport) -> TickReport:
        """The leader's phases; in lease mode each starts only while the lease holds.

        A phase that fails on a healthy session (a statement timeout, a row the database
        refuses) is logged and the next phase still runs: a materialization that keeps
        failing never stops the reaper."""
        if self._fenced():
            return report
        self.materialize_due(report)
        if self._fenced():
            return report
        self._phase("reap", lambda: self._reap(conn, report), report)
        due = self._archive_more or time.monotonic() - self._last_archive >= self.archive_every
        if due and not self._fenced():
            self._phase("archive", lambda: self._archive_now(conn, report), report)
        due = self._prune_more or time.monotonic() - self._last_prune >= self.prune_every
        if due and not self._fenced():
            self._phase("prune", lambda: self._prune_now(conn, report), report)
        if report.runs_created or report.one_shots:
            log.debug(
                "tick: %s materialized, %s",
                counted(report.runs_created, "run"),
                counted(report.one_shots, "one-shot"),
            )
        return report

    def _phase(self, name: str, work: Callable[[], object], report: TickReport) -> None:
        """Run one phase of the tick; an error the database reports on a healthy session is
        logged and recorded in the report, a lost connection ends the tick."""
        try:
            work()
        except Exception as exc:
            if not self._session_healthy():
                raise
            report.phase_errors.append(f"{name}: {_one_line(exc)}")
            log.warning("scheduler %s failed (the tick goes on; retried next tick): %s", name, _one_line(exc))

    def _reap(self, conn: psycopg.Connection[Any], report: TickReport) -> None:
        report.reaped = sql.reap(conn)
        for r in report.reaped:
            retry = "" if r["retry_run_id"] is None else f" retry={r['retry_run_id']}"
            log.warning(
                "run=%s kind=%s worker=%s reaped reason=%s%s",
                r["run_id"],
                r["kind"] or "-",
                r["worker"] or "-",
                r["reason"],
                retry,
            )

    def _archive_now(self, conn: psycopg.Connection[Any], report: TickReport) -> None:
        if not self._archive_more:
            self._last_archive = time.monotonic()
        self._archive_more = False
        report.archived = self.archive(conn, max_batches=self.prune_batches_per_tick)

    def _prune_now(self, conn: psycopg.Connection[Any], report: TickReport) -> None:
        if not self._prune_more:
            self._last_prune = time.monotonic()  # a failing prune waits for its next turn too
        self._prune_more = False
        report.pruned = self.prune(conn, max_batches=self.prune_batches_per_tick)

    def materialize_due(self, report: TickReport | None = None) -> TickReport:
        """The materialization phases alone (cursors, recurring, one-shots).

        The tick calls this only while leading; tests and benchmarks call it
        directly, for instance from two processes at once, to show that the
        compare-and-set keeps every occurrence single without the leader lock.
        """
        report = report or TickReport()
        conn = self._connection()
        began = time.monotonic()
        now = self._now(conn)
        # Led without a break since a recent tick (however long that tick took): a definition
        # that starts after that tick (less a grace for its transaction) has occurrences late
        # by this tick, not by downtime.
        previous, self._planned_at = self._planned_at, now
        steady = max(self.misfire_grace, timedelta(seconds=2 * self.tick_interval)) + self._planning_took
        on_time_from = None
        if previous is not None and previous <= now <= previous + steady:
            on_time_from = previous - self.misfire_grace
        else:
            self._leading_from = now
        # A schedule walk that takes long (a COUNT rule counted from its start) pings the
        # session well within its idle_session_timeout, so it is not ended mid-tick.
        every = self._idle_seconds / 3 if self._idle_seconds > 0 else 60.0
        if self.mode == "lease":  # ... and keeps the lease renewed (see _fenced)
            every = min(every, self.lease_ttl.total_seconds() / 4)
        with keeping_alive(lambda: self._keep_alive(conn), every):
            self._phase(
                "cursor initialization", lambda: self._init_cursors(conn, now, on_time_from, report), report
            )
            if not self._fenced():
                self._phase("materialization", lambda: self._materialize_recurring(conn, now, report), report)
        if not self._fenced():
            self._phase("one-shots", lambda: self._one_shots(conn, report), report)
        if not self._fenced():
            self._phase("backfills", lambda: self._backfills(conn, report), report)
        self._planning_took = timedelta(seconds=time.monotonic() - began)
        return report

    def _keep_alive(self, conn: psycopg.Connection[Any]) -> None:
        """Called now and then during a long schedule walk: a statement, so the session is not
        idle, and in lease mode the lease renewed once half its TTL has passed, so a walk
        longer than the lease does not stop the tick before it writes what it walked."""
        sql.ping(conn)
        if self.mode == "lease":
            self._fenced()

    def _one_shots(self, conn: psycopg.Connection[Any], report: TickReport) -> None:
        report.one_shots = sql.materialize_one_shots(conn, self.lookahead, self.misfire_grace)

    def _backfills(self, conn: psycopg.Connection[Any], report: TickReport) -> None:
        report.backfilled = materialize_backfills(conn)

    def _now(self, conn: psycopg.Connection[Any]) -> datetime:
        if self.clock is not None:
            return self.clock()
        return sql.clock_timestamp(conn)

    def _schedule(
        self, conn: psycopg.Connection[Any], d: dict[str, Any], report: TickReport
    ) -> Schedule | None:
        try:
            key = _schedule_key(d)
            cached = self._parsed.get(key)
            if cached is not None:
                return cached
            parsed = definition_schedule(d)
        except ScheduleError as exc:
            self._unusable(conn, d, str(exc), report)
            return None
        except Exception as exc:  # a value out of range (a creation time near the year 1), ...
            self._unusable(conn, d, f"schedule: cannot be read: {_one_line(exc)}", report)
            return None
        self._parsed.put(key, parsed)
        if d["timezone"] not in self._zones_checked:
            self._zones_checked.add(d["timezone"])
            try:
                disagreement = zone_disagreement(conn, d["timezone"], self._now(conn))
            except Exception as exc:  # a diagnostic: it never stops the tick
                if conn.broken:
                    raise
                log.debug("time zone %s not compared with the server's: %s", d["timezone"], _one_line(exc))
            else:
                if disagreement:
                    log.warning("%s", disagreement)
        return parsed

    def _parsed_schedule(self, d: dict[str, Any]) -> Schedule | None:
        return self._parsed.get(_schedule_key(d))

    def _init_cursors(
        self, conn: psycopg.Connection[Any], now: datetime, on_time_from: datetime | None, report: TickReport
    ) -> None:
        """Set the cursors of new (or reset) recurring definitions. One that starts at or after
        ``on_time_from`` appeared while this leader ticked: the occurrences between its start
        and now are late only by the tick, and each is materialized here, whatever its misfire
        policy (which is for a downtime; a long tick may exceed the grace of a short period)."""
        # per shared schedule object and start: same answer
        firsts: dict[tuple[int, datetime], datetime | None] = {}
        plans: dict[tuple[int, datetime, str], Plan] = {}
        for _ in range(self.batches_per_tick):  # bounded: the next tick continues
            if self._fenced():
                return
            began = time.monotonic()
            rows = sql.new_definitions(conn, self.batch)
            batch: list[Call] = []
            for d in rows:
                schedule = self._schedule(conn, d, report)
                if schedule is None:
                    continue
                # A changed or resumed schedule starts where the change was made (cursor_from),
                # not at this tick: an occurrence in between is materialized (once), not lost.
                start = min(d["cursor_from"] or now, now)
                if (id(schedule), start) not in firsts:
                    try:
                        firsts[id(schedule), start] = first_cursor(schedule, start)
                    except Exception as exc:  # one definition never stops the others
                        self._unplannable(conn, d, exc, report)
                        continue
                first = firsts[id(schedule), start]
                if first is not None and first <= now and on_time_from is not None and start >= on_time_from:
                    shared = (id(schedule), first, d["misfire_policy"])  # same schedule and first: same plan
                    try:
                        if shared not in plans:
                            plans[shared] = plan_materialization(
                                schedule,
                                first,
                                now,
                                misfire_policy=d["misfire_policy"],
                                lookahead=self.lookahead,
                                misfire_grace=now - first,
                                max_runs=self.max_catch_up,
                            )
                        plan = plans[shared]
                    except Exception as exc:  # one definition never stops the others
                        self._unplannable(conn, d, exc, report)
                        continue
                    runs, first = plan.run_times, plan.next_cursor
                else:
                    runs = []
                batch.append(Call(d["id"], d["name"], None, runs, first, d["revision"]))
            if batch:
                self._materialize(conn, batch, report)
                report.initialized += len(batch)
            self.horizon.observe_batch(len(rows), time.monotonic() - began)
            if len(rows) < self.batch:
                return

    def _materialize_recurring(
        self, conn: psycopg.Connection[Any], now: datetime, report: TickReport
    ) -> None:
        lookahead = self.lookahead
        horizon = now + lookahead
        # shared schedule, same cursor: same plan
        plans: dict[tuple[int, datetime, str, bool], tuple[Plan, CatchUp | None]] = {}
        budget = Budget(self.catch_up_budget, self.catch_up_seconds)
        walks: dict[tuple[int, datetime, str, timedelta], Plan] = {}  # the catch-up's plans
        for _ in range(self.batches_per_tick):  # bounded: the next tick continues
            if self._fenced():
                return
            began = time.monotonic()
            rows = sql.due_definitions(conn, horizon, self.batch)
            batch: list[Call] = []
            late: list[tuple[Call, CatchUp]] = []
            behind: list[tuple[dict[str, Any], Schedule]] = []
            for d in rows:
                if d["next_run_at"] == _EARLIEST:
                    detail = "schedule: next_run_at is before the year 1 or -infinity; define it again"
                    self._unusable(conn, d, detail, report)
                    continue
                schedule = self._schedule(conn, d, report)
                if schedule is None:
                    continue
                if self._behind(d, now):
                    behind.append((d, schedule))  # after the on-time ones, within the budget
                    continue
                led = self._led(d)
                memo = (id(schedule), d["next_run_at"], d["misfire_policy"], led)
                planned = plans.get(memo)
                if planned is None:
                    try:
                        planned = self._plan(schedule, d["next_run_at"], now, d["misfire_policy"], led)
                    except Exception as exc:  # one definition never stops the others
                        self._unplannable(conn, d, exc, report)
                        continue
                    plans[memo] = planned
                plan, catch_up = planned
                call = Call(
                    d["id"], d["name"], d["next_run_at"], plan.run_times, plan.next_cursor, d["revision"]
                )
                if catch_up is None:
                    batch.append(call)
                else:
                    late.append((call, catch_up))
            if batch:
                self._materialize(conn, batch, report)
            if behind and not self._fenced():
                self._catch_up(conn, behind, now, budget, walks, late, report)
            if late and not self._fenced():
                self._materialize_late(conn, late, report)
            self.horizon.observe_batch(len(rows), time.monotonic() - began)
            if len(rows) < self.batch:
                return

    def _behind(self, d: dict[str, Any], now: datetime) -> bool:
        """Back from downtime (its cursor is older than the misfire grace, or a minute) or in
        the middle of such a catch-up: planned within the tick's catch-up budget. (A
        cursor younger than a minute has at most 60 occurrences to walk.)"""
        if d["id"] in self._catching_up:
            return True
        return not self._led(d) and bool(d["next_run_at"] < now - min(self.misfire_grace, _BEHIND))

    def _led(self, d: dict[str, Any]) -> bool:
        """Whether the definition's cursor came due while this leader led without a break: its
        occurrences are late only by this leader's own ticks (a tick slower than the grace, a
        definition row another transaction held), never misfires, so each is materialized,
        late, whatever the misfire policy (which is for a downtime), up to max_catch_up runs a
        tick. A definition in the middle of a catch-up from a downtime finishes that first."""
        return (
            d["id"] not in self._catching_up
            and self._leading_from is not None
            and d["next_run_at"] >= self._leading_from
        )

    def _catch_up(
        self,
        conn: psycopg.Connection[Any],
        behind: list[tuple[dict[str, Any], Schedule]],
        now: datetime,
        budget: Budget,
        walks: dict[tuple[int, datetime, str, timedelta], Plan],
        late: list[tuple[Call, CatchUp]],
        report: TickReport,
    ) -> None:
        """Plan the definitions that are behind, each as far as the tick's budget goes.

        A walk the budget stopped among missed occurrences commits what it found (catch_up
        runs, the cursor moved to the first occurrence not walked) and remembers its counts,
        so the next tick continues from there; the walk that reaches the present settles
        the whole catch-up as its misfire policy says, exactly as one unbounded walk would
        (one coalesced run, one record of every late occurrence). Planned late ones join
        `late`; chunks are materialized here, in one statement."""
        chunks: list[Call] = []
        going_on: dict[int, Progress] = {}
        graces: dict[tuple[int, datetime], timedelta] = {}
        for d, schedule in behind:
            cursor, policy = d["next_run_at"], d["misfire_policy"]
            before = self._catching_up.get(d["id"])
            if before is not None and not before.continues(d):
                before = None  # redefined, paused, or moved by another leader meanwhile
            try:
                if before:
                    grace = before.grace
                else:  # definitions that share a schedule and cursor: one expansion
                    shared = (id(schedule), cursor)
                    if shared not in graces:
                        graces[shared] = misfire_grace_for(schedule, cursor, self.misfire_grace)
                    grace = graces[shared]
                memo = (id(schedule), cursor, policy, grace)
                plan = walks.get(memo)  # definitions that share a schedule and cursor: free
                if plan is None:
                    if budget.spent():
                        budget.deferred.add(d["id"])  # its turn comes next tick
                        continue
                    plan = walks[memo] = self._walk(schedule, cursor, now, policy, grace, budget)
            except Exception as exc:  # one definition never stops the others
                self._unplannable(conn, d, exc, report)
                continue
            self._catching_up.pop(d["id"], None)
            budget.deferred.discard(d["id"])
            call = Call(d["id"], d["name"], cursor, plan.run_times, plan.next_cursor, d["revision"])
            if plan.partial:
                chunks.append(call)
                going_on[d["id"]] = Progress.after(before, d, plan, now, grace)
                continue
            plan, catch_up = settle_late(plan, now, policy, before)
            call = Call(d["id"], d["name"], cursor, plan.run_times, plan.next_cursor, d["revision"])
            if catch_up is None:
                chunks.append(call)
            else:
                late.append((call, catch_up))
        if chunks:
            advanced = self._materialize(conn, chunks, report)
            for definition_id, progress in going_on.items():
                if definition_id in advanced:
                    self._catching_up[definition_id] = progress
                    log.info("definition=%s %s", progress.name, progress.sentence(now))
        report.catching_up = len(budget.deferred) + len(self._catching_up)

    def _unplannable(
        self, conn: psycopg.Connection[Any], d: dict[str, Any], exc: Exception, report: TickReport
    ) -> None:
        """A schedule that parsed but fails to plan (an error deep in the rule, a cursor out of
        range)."""
        where = f"from cursor {d['next_run_at']}" if d["next_run_at"] else "its first occurrence"
        self._unusable(conn, d, f"schedule: cannot plan {where}: {_one_line(exc)}", report)

    def _unusable(
        self, conn: psycopg.Connection[Any], d: dict[str, Any], detail: str, report: TickReport
    ) -> None:
        """Recorded as the definition's schedule error (health and status show it, the log
        names it), so it is skipped until redefined; the others go on."""
        report.schedule_errors += 1
        log.error("definition=%s schedule unusable: %s", d["name"], detail)
        self._catching_up.pop(d["id"], None)
        sql.mark_schedule_error(conn, d["id"], d["revision"], detail)

    def _plan(
        self, schedule: Schedule, cursor: datetime, now: datetime, misfire_policy: str, led: bool
    ) -> tuple[Plan, CatchUp | None]:
        """The plan for one cursor, with late occurrences settled honestly (see ``settle_late``);
        ``led``: late only by this leader, so none is a misfire (see ``_led``)."""
        grace = misfire_grace_for(schedule, cursor, self.misfire_grace)
        if led:
            grace = max(grace, now - cursor)
        return settle_late(self._walk(schedule, cursor, now, misfire_policy, grace), now, misfire_policy)

    def _walk(
        self,
        schedule: Schedule,
        cursor: datetime,
        now: datetime,
        misfire_policy: str,
        grace: timedelta,
        budget: Budget | None = None,
    ) -> Plan:
        plan = plan_materialization(
            schedule,
            cursor,
            now,
            misfire_policy=misfire_policy,
            lookahead=self.lookahead,
            misfire_grace=grace,
            max_runs=self.max_catch_up,
            budget=budget.left if budget else None,
            deadline=budget.start_walk() if budget else None,
        )
        if budget:
            budget.end_walk(plan.missed)
        return plan

    def _materialize(
        self,
        conn: psycopg.Connection[Any],
        batch: list[Call],
        report: TickReport,
        catch_ups: list[CatchUp] | None = None,
    ) -> set[int]:
        """One jobs.materialize_many statement for the whole batch; refused definitions are
        logged by name (the database recorded them and backs them off). With ``catch_ups``
        (one per call), each advanced definition's catch-up is recorded in the same statement.
        Returns the definitions whose cursor moved; none once the lease may have expired (the
        reads and the planning before this statement can outlast it)."""
        if self._fenced():
            return set()
        run_ids = [c.definition_id for c in batch for _ in c.run_times]
        run_times = [t for c in batch for t in c.run_times]
        materialize: tuple[list[Any], ...] = (
            [c.definition_id for c in batch],
            [c.expected for c in batch],
            [c.new_next for c in batch],
            [c.revision for c in batch],
            run_ids,
            run_times,
        )
        if catch_ups is None:
            rows = sql.materialize_many(conn, *materialize)
        else:
            records = [
                (c.definition_id, u.misfire_policy, u.first_late, u.last_late, u.occurrences, u.runs)
                for c, u in zip(batch, catch_ups, strict=True)
            ]
            rows = sql.materialize_catch_ups(conn, materialize, records)
        self.horizon.observe_cursors([c.new_next for c in batch])
        answered = {}
        for row in rows:
            answered[int(row["definition_id"])] = row
        advanced: set[int] = set()
        for c in batch:
            row = answered.get(c.definition_id)
            if row is None:
                if c.run_times:
                    report.stale += 1  # another leader (or a define/pause) got there first
                continue
            if row["error"] is not None:
                report.materialize_errors += 1
                log.error("definition=%s runs not inserted (retried with backoff): %s", c.name, row["error"])
                continue
            advanced.add(c.definition_id)
            report.runs_created += int(row["created"])
            if int(row["created"]) == 0 and c.run_times:
                report.stale += 1
            if row.get("recorded"):
                log.warning("definition=%s %s", c.name, row["recorded"])
        return advanced

    def _materialize_late(
        self, conn: psycopg.Connection[Any], late: list[tuple[Call, CatchUp]], report: TickReport
    ) -> None:
        """Definitions back from downtime: their runs and the records of their catch-ups in one
        statement (one commit, before workers hear of the new runs), however many there are."""
        self._materialize(conn, [call for call, _ in late], report, [catch_up for _, catch_up in late])

    def prune(
        self,
        conn: psycopg.Connection[Any] | None = None,
        batch: int | None = None,
        max_batches: int | None = None,
    ) -> int:
        """jobs.prune in batches until a short one, or `max_batches` of them (then the tick
        prunes again on the next tick); returns runs pruned."""
        total, self._prune_more = _in_batches(
            lambda n: sql.prune(conn or self._connection(), n), batch or self.prune_batch, max_batches
        )
        if total:
            log.info(
                "pruned %s%s", counted(total, "finished run"), " (more next tick)" if self._prune_more else ""
            )
        return total

    def archive(
        self,
        conn: psycopg.Connection[Any] | None = None,
        batch: int | None = None,
        max_batches: int | None = None,
    ) -> int:
        """jobs.archive in batches until a short one, or `max_batches` of them (then the tick
        archives again on the next tick); returns runs moved to history."""
        total, self._archive_more = _in_batches(
            lambda n: sql.archive(conn or self._connection(), n), batch or self.prune_batch, max_batches
        )
        if total:
            log.info(
                "moved %s to history%s",
                counted(total, "finished run"),
                " (more next tick)" if self._archive_more else "",
            )
        return total


def _in_batches(call: Callable[[int], int], batch: int, max_batches: int | None) -> tuple[int, bool]:
    """Call ``call(batch)`` until it returns less than ``batch`` or ``max_batches`` calls were
    made; returns the total and whether a full last batch left more to do."""
    total = calls = 0
    while True:
        n = call(batch)
        total += n
        calls += 1
        if n < batch:
            return total, False
        if max_batches is not None and calls >= max_batches:
            return total, True


@dataclass(frozen=True)
class Call:
    """One definition's part of a jobs.materialize_many batch."""

    definition_id: int
    name: str
    expected: datetime | None
    run_times: list[datetime]
    new_next: datetime | None
    revision: int


def zone_disagreement(conn: psycopg.Connection[Any], zone: str, now: datetime) -> str | None:
    """Whether the server's time zone database reads `zone` as the driver's does over the
    next two years (a sample every week); the first difference as a sentence, else None.

    Runs are computed by the driver; what SQL shows in local time (jobs.definition_health's
    next_run_local, the dashboard) is the server's reading, so one of the two databases is
    out of date when they differ (a zone that changed its rules: Paraguay in 2024)."""
    instants = [now + timedelta(days=7 * week) for week in range(105)]
    ours = load_zone(zone)
    for instant, theirs in zip(instants, sql.server_local_times(conn, zone, instants), strict=True):
        local = instant.astimezone(ours).replace(tzinfo=None)
        if local != theirs:
            return (
                f"time zone {zone}: the server's time zone database reads {instant:%Y-%m-%d %H:%M}Z as "
                f"{theirs:%Y-%m-%d %H:%M} local, the driver's as {local:%Y-%m-%d %H:%M}: runs follow the "
                "driver's, while jobs.definition_health.next_run_local and the dashboard show the "
                "server's; bring the older one up to date (PostgreSQL's, or the system's tz database "
                "or the tzdata package)"
            )
    return None


def _schedule_key(d: dict[str, Any]) -> tuple[str, str, datetime, str | None, str | None]:
    anchor = anchor_for(d["created_at"], d["timezone"])
    return (d["schedule"], d["timezone"], anchor, d.get("dst_gap"), d.get("dst_repeat"))


def definition_schedule(d: dict[str, Any]) -> Schedule:
    """A stored definition's schedule exactly as the scheduler reads it: anchored at local
    midnight of its creation day, with its DST policy.  `d` is a jobs.definitions row."""
    return parse_schedule(
        d["schedule"],
        d["timezone"],
        anchor=anchor_for(d["created_at"], d["timezone"]),
        dst_gap=d.get("dst_gap"),
        dst_repeat=d.get("dst_repeat"),
        definition=d["name"],
    )


#: ``progress(what, fraction)`` of a backfill: what it is doing, and how much of its window
#: has been walked (0.0 to 1.0).
BackfillProgress = Callable[[str, float], None]


def materialize_backfills(
    conn: psycopg.Connection[Any],
    *,
    limit: int = 100,
    progress: BackfillProgress | None = None,
    occurrences: dict[int, int] | None = None,
) -> int:
    """Insert the occurrences of pending jobs.backfill() windows; returns runs created.

    Each request is finished once (jobs.finish_backfill fences on its done_at), and an
    occurrence that already has its run is not inserted again. ``progress`` hears of the
    walk through each window every thousand occurrences, and of the insert;
    ``occurrences`` gets, per backfill id, how many occurrences its window held.
    """
    created = 0
    for b in sql.pending_backfills(conn, limit):
        error: str | None = None
        times: list[datetime] = []
        start, end = b["window_from"], b["window_to"]
        span = max((end - start).total_seconds(), 1e-6)
        try:
            # A window before the definition was created has the occurrences the schedule
            # would have had then (an RRULE without DTSTART otherwise starts at its creation).
            schedule = definition_schedule(b).reaching_back(start)
            for occurrence in schedule.occurrences(start, inclusive=True):
                assert occurrence.at is not None
                if occurrence.at > end:
                    break
                if len(times) >= 100_000:
                    error = "the window holds more than 100000 occurrences; backfill smaller windows"
                    times = []
                    break
                times.append(occurrence.at)
                if progress is not None and len(times) % 1000 == 0:
                    walked = (occurrence.at - start).total_seconds() / span
                    progress(f"{b['name']}: {len(times)} occurrences", walked)
            if not times and error is None and schedule.kind == "rrule":
                error = _before_first_occurrence(schedule, end)
        except (ScheduleError, ValueError, LookupError) as exc:
            error = str(exc)
        if progress is not None:
            progress(f"{b['name']}: inserting {counted(len(times), 'run')}", 1.0)
        if occurrences is not None:
            occurrences[b["backfill_id"]] = len(times)
        n = sql.finish_backfill(conn, b["backfill_id"], times, error)
        created += n
        suffix = f" error={error}" if error else ""
        log.info("definition=%s backfill=%s runs=%d%s", b["name"], b["backfill_id"], n, suffix)
    return created


def _before_first_occurrence(schedule: Schedule, end: datetime) -> str | None:
    """Why a backfill window ending at ``end`` holds no occurrence of an RRULE, when the rule
    starts after it: a DTSTART after the window, or a COUNT rule without DTSTART (counted from
    the day its definition was created; other rules reach back for a backfill)."""
    first = schedule.next_after(datetime(1, 1, 2, tzinfo=UTC), inclusive=True)
    if first is None or first <= end:
        return None
    local = first.astimezone(schedule.zone).strftime("%Y-%m-%d %H:%M %Z")
    why = (
        ""
        if "DTSTART" in schedule.text.upper()
        else ": a COUNT rule without DTSTART counts from the day its definition was created;"
        " give it a DTSTART line to backfill before that"
    )
    return f"the window ends before the schedule's first occurrence, {local}{why}"


@dataclass(frozen=True)
class CatchUp:
    """Occurrences found late after downtime, and how many runs the misfire policy made of them
    (``jobs.record_catch_up`` records it and says it as a sentence)."""

    misfire_policy: str
    first_late: datetime
    last_late: datetime
    occurrences: int
    runs: int


def misfire_grace_for(schedule: Schedule, cursor: datetime, configured: timedelta) -> timedelta:
    """The misfire grace for a schedule at its cursor: the configured one, but at most one
    period (the gap from the cursor to the following occurrence), so an every-10-seconds
    job that was down for minutes does not replay the occurrences of the last minute."""
    following = schedule.next_after(cursor, inclusive=False)
    if following is None:
        return configured
    return min(configured, following - cursor)


def settle_late(
    plan: Plan, now: datetime, misfire_policy: str, before: Progress | None = None
) -> tuple[Plan, CatchUp | None]:
    """After downtime (the plan found missed occurrences), count every late occurrence
    (cursor <= t <= now, up to where the plan stops; with `before`, those of the earlier
    parts of a catch-up too) and keep the policy's promise for all of them: ``coalesce``
    makes exactly one run, at the latest late occurrence (the plan alone coalesces those
    past the grace but still runs the recent ones one by one, which an overlap cap then
    records as skipped for a false reason); ``catch_up`` runs each; ``skip`` runs only
    those still within the grace. Occurrences after now are planned as usual."""
    if not plan.missed and before is None:
        return plan, None
    occurrences = plan.late + (before.occurrences if before else 0)
    first_late = before.first_late if before else plan.first_late
    last_late = plan.last_late or (before.last_late if before else None)
    if not occurrences or first_late is None or last_late is None:
        return plan, None
    late_runs = [t for t in plan.run_times if t <= now]
    future = [t for t in plan.run_times if t > now]
    if misfire_policy == "coalesce":
        # The run is at the latest late occurrence, which lies in this part of the walk.
        run_times = [plan.last_late, *future] if plan.last_late else future
        runs = 1 if plan.last_late else 0
    else:
        run_times = plan.run_times
        runs = len(late_runs) + (before.runs if before else 0)
    catch_up = CatchUp(misfire_policy, first_late, last_late, occurrences, runs)
    return Plan(run_times, plan.next_cursor, plan.missed), catch_up


@dataclass(frozen=True)
class Progress:
    """A catch-up that goes on over several ticks: where the cursor was committed, and what
    the earlier parts of the walk counted (kept by the leader that walked them)."""

    name: str
    revision: int
    misfire_policy: str
    cursor: datetime | None
    grace: timedelta  # the grace of the catch-up's first cursor, kept to its end
    first_late: datetime | None
    last_late: datetime | None
    occurrences: int
    runs: int

    @staticmethod
    def after(
        before: Progress | None, d: dict[str, Any], plan: Plan, now: datetime, grace: timedelta
    ) -> Progress:
        return Progress(
            name=d["name"],
            revision=d["revision"],
            misfire_policy=d["misfire_policy"],
            cursor=plan.next_cursor,
            grace=grace,
            first_late=before.first_late if before else plan.first_late,
            last_late=plan.last_late or (before.last_late if before else None),
            occurrences=plan.late + (before.occurrences if before else 0),
            runs=sum(1 for t in plan.run_times if t <= now) + (before.runs if before else 0),
        )

    def sentence(self, now: datetime) -> str:
        """Where a catch-up stands, as one log line between its ticks."""
        behind = f", {compact_duration(now - self.cursor)} behind" if self.cursor is not None else ""
        return (
            f"catching up ({self.misfire_policy}): {counted(self.occurrences, 'late occurrence')} walked, "
            f"{counted(self.runs, 'run')} so far{behind}"
        )

    def continues(self, d: dict[str, Any]) -> bool:
        return bool(
            d["revision"] == self.revision
            and d["misfire_policy"] == self.misfire_policy
            and d["next_run_at"] == self.cursor
        )


class Budget:
    """What one tick may spend walking catch-ups: missed occurrences and seconds of walking
    (statements do not count: they keep the session busy, not idle)."""

    def __init__(self, occurrences: int, seconds: float) -> None:
        self.left = max(1, occurrences)
        self.seconds = seconds
        self.deferred: set[int] = set()  # definitions left for the next tick
        self._began = 0.0

    def start_walk(self) -> float:
        """The deadline of the walk that starts now."""
        self._began = time.monotonic()
        return self._began + self.seconds

    def end_walk(self, walked: int) -> None:
        self.left = max(0, self.left - walked)
        self.seconds -= time.monotonic() - self._began

    def spent(self) -> bool:
        return self.left <= 0 or self.seconds <= 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
