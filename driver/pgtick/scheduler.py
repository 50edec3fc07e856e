"""The scheduler: a leader-elected tick that turns definitions into runs.

Every ``tick_interval`` seconds, on one dedicated session connection:

1. ``jobs.try_lead()`` — a session advisory lock; only the leader goes on;
2. initialize the cursors of new recurring definitions (first occurrence >= now);
3. materialize recurring definitions due within the lookahead: compute the
   occurrences here (RRULE/cron in the definition's time zone, misfire policy)
   and hand them to ``jobs.materialize``, a compare-and-set on the cursor plus
   the inserts in one commit, so a second leader in the same instant adds nothing;
4. ``jobs.materialize_one_shots()``, then pending ``jobs.backfill()`` windows;
5. ``jobs.reap()``;
6. ``jobs.prune()`` now and then.

Each phase is its own transaction. A failing tick logs one line and the loop
sleeps and goes on; a lost connection means lost leadership, contested again
on the next tick.

Leadership takes one of two forms (``leadership``):

* ``lock``: the session advisory lock of step 1, for a direct (or session-pooled)
  connection; a crashed leader's lock goes with its session, so a follower takes
  over on its next tick;
* ``lease``: the lease ``pgtick:leader`` in ``jobs.leases``, taken with
  ``jobs.acquire_lease`` and renewed on every tick with ``jobs.renew_lease``; it
  needs no session, so it works through a transaction-mode pooler (PgBouncer),
  where a session lock would be handed to other clients. A crashed leader's lease
  expires after ``lease_ttl``, then a follower takes it. The leader's own writes
  are fenced by the lease: a tick stops between phases once the lease it renewed
  at the start may have expired (measured on this process's monotonic clock from
  before the renewal was sent), so a deposed leader does no more than finish the
  statement in flight, and that one is harmless: materialization is a
  compare-and-set, reaping and pruning are idempotent.
* ``auto`` (default): ``lease`` when the connection goes through a pooler
  (``pgtick.db.behind_pooler``), else ``lock``. Every replica of a deployment
  should reach PostgreSQL the same way, or be given the same mode: a lock leader
  and a lease leader do not see each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

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

log = logging.getLogger("pgtick.scheduler")


@dataclass
class TickReport:
    """What one tick did (the leader's tick; a follower's is empty)."""

    leading: bool = False
    initialized: int = 0
    runs_created: int = 0
    stale: int = 0
    one_shots: int = 0
    reaped: list[dict[str, Any]] = field(default_factory=list)
    pruned: int = 0
    schedule_errors: int = 0
    backfilled: int = 0


class Scheduler:
    """Leader election plus the materialize / reap / prune phases."""

    def __init__(
        self,
        dsn: str,
        *,
        owner: str,
        tick_interval: float = 1.0,
        lookahead: float | None = None,
        misfire_grace: float = 60.0,
        max_catch_up: int = 100,
        batch: int = 1000,
        prune_every: float = 3600.0,
        clock: Callable[[], datetime] | None = None,
        leadership: str = "auto",
        lease_ttl: float | None = None,
    ) -> None:
        if leadership not in ("auto", "lock", "lease"):
            raise ValueError(f"leadership must be auto, lock or lease, got {leadership!r}")
        self.dsn = dsn
        self.leadership = leadership
        self.mode = leadership if leadership != "auto" else "lock"  # settled when connected
        self.lease_ttl = timedelta(
            seconds=lease_ttl if lease_ttl is not None else max(5.0, 5 * tick_interval)
        )
        self._lease_until = float("-inf")  # monotonic instant the renewed lease may expire
        self.owner = owner
        self.tick_interval = tick_interval
        self.lookahead = timedelta(seconds=lookahead if lookahead is not None else 2 * tick_interval)
        self.misfire_grace = timedelta(seconds=misfire_grace)
        self.max_catch_up = max_catch_up
        self.batch = batch
        self.prune_every = prune_every
        self.clock = clock
        self.leading = False
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._last_prune = float("-inf")  # prune on the first tick as leader
        # Parsed schedules by (text, zone, anchor, DST policy): definitions sharing one share it.
        self._parsed: dict[tuple[str, str, datetime, str | None, str | None], Schedule] = {}

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
                    self._drop_connection()
                stop.wait(max(0.0, self.tick_interval - (time.monotonic() - started)))
        finally:
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

    def _drop_connection(self) -> None:
        if self.leading:
            log.warning("scheduler owner=%s lost leadership (connection gone)", self.owner)
        self.leading = False
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self.leading = False
            self._conn = connect_dicts(self.dsn, application_name=f"pgtick-leader {self.owner}")
            if self.leadership == "auto":
                mode = "lease" if behind_pooler(self._conn) else "lock"
                if mode != self.mode or self._pid is None:
                    log.info("scheduler owner=%s leads by %s", self.owner, mode)
                self.mode = mode
            if self.mode == "lock":
                # A leader frozen for long (SIGSTOP, swap) loses its session, hence the lock.
                # (Never through a pooler: a session setting would reach other clients.)
                idle = max(30, int(self.tick_interval * 10))
                sql.set_idle_session_timeout(self._conn, idle)
            self._pid = self._backend_pid(self._conn)
        return self._conn

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
            return report
        return self._lead(conn, report)

    def _tick_by_lease(self, conn: psycopg.Connection[Any], report: TickReport) -> TickReport:
        """Renew the leader lease (or take it when free or expired), then lead while it holds."""
        sent = time.monotonic()
        # Renew first even when not known to lead: after a reconnect the lease may still be ours.
        leading = sql.renew_lease(conn, sql.LEADER_LEASE, self.owner, self.lease_ttl)
        if self.leading and not leading:
            log.warning("scheduler owner=%s lost the leader lease (expired or taken)", self.owner)
        if not leading:
            sent = time.monotonic()
            leading = sql.acquire_lease(conn, sql.LEADER_LEASE, self.owner, self.lease_ttl)
        if leading:
            self._lease_until = sent + self.lease_ttl.total_seconds()
        if leading != self.leading:
            log.info("scheduler owner=%s %s (lease)", self.owner, "is leader" if leading else "follows")
        self.leading = report.leading = leading
        if not leading:
            return report
        return self._lead(conn, report)

    def _fenced(self) -> bool:
        """Lease mode: the lease renewed at the start of this tick may have expired by now."""
        if self.mode == "lease" and time.monotonic() >= self._lease_until:
            log.warning("scheduler owner=%s lease may have expired mid-tick: stopping the tick", self.owner)
            self.leading = False
            return True
        return False

    def _lead(self, conn: psycopg.Connection[Any], report: TickReport) -> TickReport:
        """The leader's phases; in lease mode each starts only while the lease holds."""
        if self._fenced():
            return report
        self.materialize_due(report)
        if self._fenced():
            return report
        report.reaped = sql.reap(conn)
        for r in report.reaped:
            log.warning("run=%s reaped reason=%s retry=%s", r["run_id"], r["reason"], r["retry_run_id"])
        if time.monotonic() - self._last_prune >= self.prune_every and not self._fenced():
            report.pruned = self.prune(conn)
            self._last_prune = time.monotonic()
        if report.runs_created or report.one_shots:
            log.debug("tick: %d runs materialized, %d one-shots", report.runs_created, report.one_shots)
        return report

    def materialize_due(self, report: TickReport | None = None) -> TickReport:
        """The materialization phases alone (cursors, recurring, one-shots).

        The tick calls this only while leading; tests and benchmarks call it
        directly, for instance from two processes at once, to show that the
        compare-and-set keeps every occurrence single without the leader lock.
        """
        report = report or TickReport()
        conn = self._connection()
        now = self._now(conn)
        self._init_cursors(conn, now, report)
        self._materialize_recurring(conn, now, report)
        report.one_shots = sql.materialize_one_shots(conn, self.lookahead, self.misfire_grace)
        report.backfilled = materialize_backfills(conn)
        return report

    def _now(self, conn: psycopg.Connection[Any]) -> datetime:
        if self.clock is not None:
            return self.clock()
        return sql.clock_timestamp(conn)

    def _schedule(
        self, conn: psycopg.Connection[Any], d: dict[str, Any], report: TickReport
    ) -> Schedule | None:
        try:
            parsed = self._parsed_schedule(d)
            if parsed is not None:
                return parsed
            parsed = definition_schedule(d)
        except (ScheduleError, ValueError, LookupError) as exc:
            report.schedule_errors += 1
            log.error("definition=%s schedule unusable: %s", d["name"], exc)
            sql.mark_schedule_error(conn, d["id"], d["revision"], str(exc))
            return None
        if len(self._parsed) >= 10000:
            self._parsed.clear()
        self._parsed[_schedule_key(d)] = parsed
        return parsed

    def _parsed_schedule(self, d: dict[str, Any]) -> Schedule | None:
        return self._parsed.get(_schedule_key(d))

    def _init_cursors(self, conn: psycopg.Connection[Any], now: datetime, report: TickReport) -> None:
        firsts: dict[int, datetime | None] = {}  # per shared schedule object: same now, same answer
        for _ in range(20):  # bounded: the next tick continues
            rows = sql.new_definitions(conn, self.batch)
            calls: list[tuple[Any, ...]] = []
            for d in rows:
                schedule = self._schedule(conn, d, report)
                if schedule is None:
                    continue
                if id(schedule) not in firsts:
                    firsts[id(schedule)] = first_cursor(schedule, now)
                calls.append((d["id"], None, [], firsts[id(schedule)], d["revision"]))
            if calls:
                self._materialize(conn, calls, report)
                report.initialized += len(calls)
            if len(rows) < self.batch:
                return

    def _materialize_recurring(
        self, conn: psycopg.Connection[Any], now: datetime, report: TickReport
    ) -> None:
        horizon = now + self.lookahead
        # shared schedule, same cursor: same plan
        plans: dict[tuple[int, datetime, str], tuple[Plan, CatchUp | None]] = {}
        catch_ups: dict[int, CatchUp] = {}  # by index in this batch's calls
        for _ in range(20):  # bounded: the next tick continues
            rows = sql.due_definitions(conn, horizon, self.batch)
            calls: list[tuple[Any, ...]] = []
            names: dict[int, str] = {}
            for d in rows:
                schedule = self._schedule(conn, d, report)
                if schedule is None:
                    continue
                names[d["id"]] = d["name"]
                memo = (id(schedule), d["next_run_at"], d["misfire_policy"])
                planned = plans.get(memo)
                if planned is None:
                    planned = plans[memo] = self._plan(schedule, d["next_run_at"], now, d["misfire_policy"])
                plan, catch_up = planned
                if catch_up is not None:
                    catch_ups[len(calls)] = catch_up
                calls.append((d["id"], d["next_run_at"], plan.run_times, plan.next_cursor, d["revision"]))
            if calls:
                for definition_id, sentence in self._materialize(conn, calls, report, catch_ups):
                    log.warning("definition=%s %s", names[definition_id], sentence)
                catch_ups.clear()
            if len(rows) < self.batch:
                return

    def _plan(
        self, schedule: Schedule, cursor: datetime, now: datetime, misfire_policy: str
    ) -> tuple[Plan, CatchUp | None]:
        """The plan for one cursor, with late occurrences settled honestly (see ``settle_late``)."""
        grace = misfire_grace_for(schedule, cursor, self.misfire_grace)
        plan = plan_materialization(
            schedule,
            cursor,
            now,
            misfire_policy=misfire_policy,
            lookahead=self.lookahead,
            misfire_grace=grace,
            max_runs=self.max_catch_up,
        )
        return settle_late(schedule, plan, cursor, now, misfire_policy)

    def _materialize(
        self,
        conn: psycopg.Connection[Any],
        calls: list[tuple[Any, ...]],
        report: TickReport,
        catch_ups: dict[int, CatchUp] | None = None,
    ) -> list[tuple[int, str]]:
        """Each call is its own transaction; pipelined so 10,000 cost few round trips.
        A catch-up is recorded in the same statement as its materialization (one commit,
        before workers hear of the new run); returns (definition id, sentence) for each
        catch-up recorded."""
        catch_ups = catch_ups or {}
        with conn.pipeline():
            cursors = []
            for index, call in enumerate(calls):
                c = catch_ups.get(index)
                if c is None:
                    cursors.append(conn.execute(sql.MATERIALIZE, call))
                else:
                    record = (
                        call[0],
                        c.misfire_policy,
                        c.first_late,
                        c.last_late,
                        c.occurrences,
                        c.runs,
                        call[3],
                    )
                    cursors.append(conn.execute(sql.MATERIALIZE_CATCH_UP, (*call, *record)))
        recorded = []
        for call, cur in zip(calls, cursors, strict=True):
            row = cur.fetchone()
            created = int(row["n"]) if row else 0
            report.runs_created += created
            if created == 0 and call[2]:
                report.stale += 1
            if row and row.get("recorded"):
                recorded.append((call[0], row["recorded"]))
        return recorded

    def prune(self, conn: psycopg.Connection[Any] | None = None, batch: int = 10000) -> int:
        conn = conn or self._connection()
        total = 0
        while True:
            n = sql.prune(conn, batch)
            total += n
            if n < batch:
                break
        if total:
            log.info("pruned %d finished runs", total)
        return total


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


def materialize_backfills(conn: psycopg.Connection[Any], *, limit: int = 100) -> int:
    """Insert the occurrences of pending jobs.backfill() windows; returns runs created.

    Each request is finished once (jobs.finish_backfill fences on its done_at), and an
    occurrence that already has its run is not inserted again.
    """
    created = 0
    for b in sql.pending_backfills(conn, limit):
        error: str | None = None
        times: list[datetime] = []
        try:
            schedule = definition_schedule(b)
            for occurrence in schedule.occurrences(b["window_from"], inclusive=True):
                assert occurrence.at is not None
                if occurrence.at > b["window_to"]:
                    break
                if len(times) >= 100_000:
                    error = "the window holds more than 100000 occurrences; backfill smaller windows"
                    times = []
                    break
                times.append(occurrence.at)
        except (ScheduleError, ValueError, LookupError) as exc:
            error = str(exc)
        n = sql.finish_backfill(conn, b["backfill_id"], times, error)
        created += n
        suffix = f" error={error}" if error else ""
        log.info("definition=%s backfill=%s runs=%d%s", b["name"], b["backfill_id"], n, suffix)
    return created


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
    schedule: Schedule, plan: Plan, cursor: datetime, now: datetime, misfire_policy: str
) -> tuple[Plan, CatchUp | None]:
    """After downtime (the plan found missed occurrences), count every late occurrence
    (cursor <= t <= now, up to where the plan stops) and keep the policy's promise for
    all of them: ``coalesce`` makes exactly one run, at the latest late occurrence (the
    plan alone coalesces those past the grace but still runs the recent ones one by
    one, which an overlap cap then records as skipped for a false reason); ``catch_up``
    runs each; ``skip`` runs only those still within the grace. Occurrences after now
    are planned as usual."""
    if not plan.missed:
        return plan, None
    end = now
    if plan.next_cursor is not None and plan.next_cursor <= now:
        end = plan.next_cursor - timedelta(microseconds=1)
    late = schedule.between(cursor, end, limit=10_000_000)
    if not late:
        return plan, None
    late_runs = [t for t in plan.run_times if t <= now]
    future = [t for t in plan.run_times if t > now]
    if misfire_policy == "coalesce":
        run_times = [late[-1], *future]
        runs = 1
    else:
        run_times = plan.run_times
        runs = len(late_runs)
    catch_up = CatchUp(misfire_policy, late[0], late[-1], len(late), runs)
    return Plan(run_times, plan.next_cursor, plan.missed), catch_up


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
