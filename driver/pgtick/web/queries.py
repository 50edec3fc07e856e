"""Every statement the dashboard sends, by name: the dashboard's own read model.

The driver's statements live in ``pgtick.calls``; the dashboard reads what its pages
show with its own queries (cost shaped for a page load) and acts through the jobs.*
functions, and this module is the one place both are written. Page reads run inside a
READ ONLY transaction as jobs_reader, actions in a transaction as jobs_operator (see
``db.py``, which opens them with `begin_reading` / `begin_acting`). Parts that depend on
schema the database may not have (queues, limits, dependencies) each live in one
function that asks ``Features`` first and returns None when the schema lacks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from pgtick import json_numbers

Conn = psycopg.AsyncConnection[dict[str, Any]]
Row = dict[str, Any]

STATUSES = ("QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED")
PAGE_SIZE = 50
#: Bulk actions act on at most this many runs per click.
BULK_LIMIT = 10_000


@dataclass(frozen=True)
class Features:
    """Which optional schema parts this database has (read once at start)."""

    relations: frozenset[str]
    columns: frozenset[str]  # "table.column"

    def has(self, name: str) -> bool:
        return name in self.relations or name in self.columns


#: The login and whether it may take the reader and operator roles, read in every page's and
#: action's transaction (before its role is set): a grant or revoke takes effect at the next
#: request, not at the dashboard's restart.
_ACCESS = (
    "current_user AS login,"
    " pg_catalog.pg_has_role('jobs_reader', 'MEMBER') AS reader,"
    " pg_catalog.pg_has_role('jobs_operator', 'MEMBER') AS operator"
)


async def begin_reading(conn: Conn, *, timeout: float) -> Row:
    """Settings of a page's transaction: read only, the dashboard's limit (seconds) on each
    statement, times in UTC, the reader role if the login may take it. Returns the login's
    access (``_ACCESS``)."""
    await conn.execute("SET TRANSACTION READ ONLY")
    access = await _transaction_settings(conn, timeout)
    if access["reader"]:
        await conn.execute("SET LOCAL ROLE jobs_reader")
    return access


async def begin_acting(conn: Conn, *, timeout: float) -> Row:
    """Settings of an action's transaction: the dashboard's limit (seconds) on each
    statement, times in UTC, the operator role if the login may take it (the caller refuses
    the action otherwise). Returns the login's access (``_ACCESS``)."""
    access = await _transaction_settings(conn, timeout)
    if access["operator"]:
        await conn.execute("SET LOCAL ROLE jobs_operator")
    return access


async def _transaction_settings(conn: Conn, timeout: float) -> Row:
    """``SET LOCAL statement_timeout`` to `timeout` seconds (in whole milliseconds, from 1 to
    the setting's maximum), ``TimeZone`` to UTC: the pages show times in UTC, and what the
    server computes per minute or per day (the charts' buckets) follows the session's zone,
    which the database or the login may set to another; and ``jit`` off: the statements run
    in milliseconds, but the estimates of some (every definition with its streaks, over a
    large history) pass ``jit_above_cost``, and compiling them took longer than running them
    (over half a second of each /definitions page). Returns the login's access, in the same
    round trip."""
    milliseconds = min(2**31 - 1, max(1, round(timeout * 1000)))
    cur = await conn.execute(
        "SELECT pg_catalog.set_config('statement_timeout', %s, true),"
        " pg_catalog.set_config('TimeZone', 'UTC', true),"
        " pg_catalog.set_config('jit', 'off', true), " + _ACCESS,
        (str(milliseconds),),
    )
    row = await cur.fetchone()
    assert row is not None
    return row


async def features(conn: Conn) -> Features:
    rows = await (
        await conn.execute(
            """
            SELECT c.relname, a.attname
              FROM pg_catalog.pg_class AS c
              JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'jobs'
              LEFT JOIN pg_catalog.pg_attribute AS a
                ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             WHERE c.relkind IN ('r', 'v', 'p')
            """
        )
    ).fetchall()
    return Features(
        frozenset(r["relname"] for r in rows),
        frozenset(f"{r['relname']}.{r['attname']}" for r in rows if r["attname"]),
    )


# -- overview ---------------------------------------------------------------------------


async def kind_stats(conn: Conn) -> list[Row]:
    """Per kind: due and future QUEUED, RUNNING, last hour's outcomes, oldest due age.

    jobs.queue_stats summed over each kind's queues: the counts are the view's, so the
    overview and ``pgtick status`` agree.
    """
    cur = await conn.execute(
        """
        SELECT s.kind,
               sum(s.queued) AS queued,
               sum(s.scheduled) AS scheduled,
               sum(s.running) AS running,
               sum(s.completed_1h) AS completed_1h,
               sum(s.failed_1h) AS failed_1h,
               sum(s.cancelled_1h) AS cancelled_1h,
               max(s.oldest_queued_age) AS oldest_queued_age,
               sum(s.skipped_1h) AS skipped_1h,
               sum(s.lost_1h) AS lost_1h
          FROM jobs.queue_stats AS s
         GROUP BY s.kind
         ORDER BY s.kind
        """
    )
    return await cur.fetchall()


async def queues(conn: Conn, feats: Features) -> list[Row] | None:
    """The queues with their paused state (jobs.queues), when the schema has them."""
    if not feats.has("queues"):
        return None
    cur = await conn.execute("SELECT * FROM jobs.queues ORDER BY 1")
    return await cur.fetchall()


async def limits(conn: Conn, feats: Features) -> list[Row] | None:
    """Queue and kind limits (jobs.limits), when the schema has them."""
    if not feats.has("limits"):
        return None
    cur = await conn.execute("SELECT * FROM jobs.limits ORDER BY 1, 2")
    return await cur.fetchall()


async def leader(conn: Conn) -> Row | None:
    cur = await conn.execute("SELECT owner, since, leading_for, application_name, pid FROM jobs.leader")
    return await cur.fetchone()


async def last_hour(conn: Conn) -> tuple[datetime, list[Row]]:
    """Per minute of the last hour: completions, failures, and start lateness (p50, max).

    Finished runs come from the finished_at index; lateness is measured on the runs that
    started in the window (those finished since, and those still RUNNING).
    """
    cur = await conn.execute(
        """
        WITH bounds AS (
            SELECT date_trunc('minute', now()) - interval '59 minutes' AS start
        ),
        done AS (
            SELECT floor(extract(epoch FROM r.finished_at - b.start) / 60)::integer AS minute,
                   r.status
              FROM jobs.runs AS r CROSS JOIN bounds AS b
             WHERE r.finished_at >= b.start
        ),
        started AS (
            SELECT r.started_at, r.scheduled_for
              FROM jobs.runs AS r CROSS JOIN bounds AS b
             WHERE r.finished_at >= b.start AND r.started_at >= b.start
            UNION ALL
            SELECT r.started_at, r.scheduled_for
              FROM jobs.runs AS r CROSS JOIN bounds AS b
             WHERE r.status = 'RUNNING' AND r.started_at >= b.start
        ),
        late AS (
            SELECT floor(extract(epoch FROM s.started_at - b.start) / 60)::integer AS minute,
                   greatest(extract(epoch FROM s.started_at - s.scheduled_for), 0) AS seconds
              FROM started AS s CROSS JOIN bounds AS b
        ),
        done_by_minute AS (
            SELECT d.minute,
                   count(*) FILTER (WHERE d.status = 'COMPLETED') AS completed,
                   count(*) FILTER (WHERE d.status = 'FAILED') AS failed
              FROM done AS d GROUP BY d.minute
        ),
        late_by_minute AS (
            SELECT l.minute,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY l.seconds) AS late_p50,
                   max(l.seconds) AS late_max
              FROM late AS l GROUP BY l.minute
        )
        SELECT m.minute, coalesce(d.completed, 0) AS completed, coalesce(d.failed, 0) AS failed,
               l.late_p50, l.late_max, b.start
          FROM generate_series(0, 59) AS m (minute)
          CROSS JOIN bounds AS b
          LEFT JOIN done_by_minute AS d ON d.minute = m.minute
          LEFT JOIN late_by_minute AS l ON l.minute = m.minute
         ORDER BY m.minute
        """
    )
    rows = await cur.fetchall()
    return rows[0]["start"], rows


# -- definitions ------------------------------------------------------------------------


async def definitions(conn: Conn, feats: Features) -> list[Row]:
    """Every definition with what jobs.definition_health shows, computed so that the cost
    follows the number of definitions and the live set, not the history: live counts from
    the QUEUED and RUNNING partial indexes, failures from the FAILED-by-definition index.
    Also the next start as ``pgtick definitions`` and ``pgtick status`` show it
    (jobs.definition_list.next_start_at: the first QUEUED run not waiting on dependencies,
    however it was queued, else the cursor while the definition is enabled), and the DST
    policy: stored (None is auto, what the schedule is parsed with) and effective (dst_gap,
    dst_repeat: the columns of jobs.definition_health, auto resolved by jobs._dst_auto as
    the view does).
    The last outcome and the failure streak reach into history as the view's do: history is
    read only for a definition with no such run since jobs.config.archive_after."""
    history = feats.has("runs_all")
    next_start = feats.has("definition_list.next_start_at")
    query = sql.SQL(
        """
        WITH live AS (
            SELECT r.definition_id, 0 AS running, count(*) AS queued
              FROM jobs.runs AS r WHERE r.status = 'QUEUED' AND r.definition_id IS NOT NULL
             GROUP BY r.definition_id
            UNION ALL
            SELECT r.definition_id, count(*), 0
              FROM jobs.runs AS r WHERE r.status = 'RUNNING' AND r.definition_id IS NOT NULL
             GROUP BY r.definition_id
        ),
        live_by_definition AS (
            SELECT l.definition_id, sum(l.running) AS running, sum(l.queued) AS queued
              FROM live AS l GROUP BY l.definition_id
        )
        SELECT d.id, d.name, d.kind, d.schedule, d.timezone, NOT d.enabled AS paused,
               d.next_run_at, d.next_run_at AT TIME ZONE d.timezone AS next_run_local,
               d.max_concurrent_runs, coalesce(l.running, 0) AS running,
               coalesce(l.queued, 0) AS queued, {next_start} AS next_start_at,
               last.status AS last_status, last.finished_at AS last_finished_at,
               (SELECT count(*) FROM {runs} AS f
                 WHERE f.definition_id = d.id AND f.status = 'FAILED'
                   AND f.id > coalesce(ok.id, 0)
                   AND last.status IS DISTINCT FROM 'COMPLETED') AS consecutive_failures,
               -- (the bound as a row comparison, which only the (definition_id, id) index
               -- answers: as s.id > ..., the plan could walk the primary key over every run)
               (SELECT count(*) FROM jobs.runs AS s
                 WHERE s.definition_id = d.id AND s.failure_reason = 'Skipped'
                   AND (s.definition_id, s.id) > (d.id, coalesce(started.id, 0))) AS consecutive_skips,
               d.finished_at IS NOT NULL AS finished, d.schedule_error,
               d.misfire_policy, d.overlap_policy, d.priority, d.created_at, d.run_at,
               d.dst_gap AS stored_dst_gap, d.dst_repeat AS stored_dst_repeat,
               coalesce(d.dst_gap, (jobs._dst_auto(d.schedule))[1]) AS dst_gap,
               coalesce(d.dst_repeat, (jobs._dst_auto(d.schedule))[2]) AS dst_repeat
          FROM jobs.definitions AS d
          LEFT JOIN live_by_definition AS l ON l.definition_id = d.id
          {next_start_join}
          LEFT JOIN LATERAL (
              SELECT coalesce(
                  (SELECT max(r.id) FROM jobs.runs AS r
                    WHERE r.definition_id = d.id AND r.finished_at IS NOT NULL),
                  {last_moved}) AS id
          ) AS last_id ON TRUE
          LEFT JOIN LATERAL (
              SELECT a.status, a.finished_at FROM {runs} AS a WHERE a.id = last_id.id
          ) AS last ON TRUE
          LEFT JOIN LATERAL (
              SELECT coalesce(
                  (SELECT max(r.id) FROM jobs.runs AS r
                    WHERE r.definition_id = d.id AND r.status = 'COMPLETED'),
                  {ok_moved}) AS id
          ) AS ok ON TRUE
          LEFT JOIN LATERAL (
              SELECT r.id FROM jobs.runs AS r
               WHERE r.definition_id = d.id AND r.started_at IS NOT NULL
               ORDER BY r.id DESC LIMIT 1
          ) AS started ON TRUE
         ORDER BY d.name
        """
    ).format(
        runs=every_run(feats),
        # (A schema older than next_start_at: the cursor alone, while the definition is enabled.)
        next_start=sql.SQL("n.next_start_at" if next_start else "CASE WHEN d.enabled THEN d.next_run_at END"),
        next_start_join=sql.SQL("LEFT JOIN jobs.definition_list AS n ON n.id = d.id" if next_start else ""),
        last_moved=sql.SQL(
            "(SELECT max(h.id) FROM jobs.run_history AS h WHERE h.definition_id = d.id)"
            if history
            else "NULL"
        ),
        ok_moved=sql.SQL(
            "(SELECT max(h.id) FROM jobs.run_history AS h"
            " WHERE h.definition_id = d.id AND h.status = 'COMPLETED')"
            if history
            else "NULL"
        ),
    )
    cur = await conn.execute(query)
    return await cur.fetchall()


async def definition(conn: Conn, name: str) -> Row | None:
    """A definition's health and settings, its payload's numbers with every digit."""
    cur = conn.cursor()
    json_numbers.read_exactly(cur)
    await cur.execute(
        """
        SELECT h.*, d.misfire_policy, d.priority, d.created_at, d.run_at,
               d.payload, d.max_attempts, d.timeout, d.heartbeat_timeout, d.updated_at, d.revision,
               d.dst_gap AS stored_dst_gap, d.dst_repeat AS stored_dst_repeat
          FROM jobs.definition_health AS h
          JOIN jobs.definitions AS d ON d.id = h.id
         WHERE h.name = %s
        """,
        (name,),
    )
    return await cur.fetchone()


async def jitter_offsets(
    conn: Conn, definition_id: int, jitter: timedelta | None, times: list[datetime]
) -> list[timedelta]:
    """jobs.jitter_offset of each occurrence time, in order: how much later its run starts."""
    cur = await conn.execute(
        "SELECT jobs.jitter_offset(%s, t.at, %s) AS delay FROM unnest(%s::timestamptz[])"
        " WITH ORDINALITY AS t (at, n) ORDER BY t.n",
        (definition_id, jitter, times),
    )
    return [row["delay"] for row in await cur.fetchall()]


# -- runs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFilter:
    status: str | None = None
    kind: str | None = None
    queue: str | None = None
    definition: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def params(self) -> dict[str, str]:
        """The filter as query parameters (for links and the bulk forms)."""
        out: dict[str, str] = {}
        for key in ("status", "kind", "queue", "definition"):
            value = getattr(self, key)
            if value:
                out[key] = value
        for key in ("since", "until"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value.isoformat()
        return out


def _where(f: RunFilter, feats: Features, *, status: str | None) -> tuple[sql.Composable, list[Any]]:
    clauses: list[sql.Composable] = []
    args: list[Any] = []
    if status:
        # A literal, not a parameter: the partial indexes of the FAILED runs are chosen only
        # where the plan knows the status, and a prepared statement's generic plan does not.
        assert status in STATUSES, status
        clauses.append(sql.SQL("r.status = {}::jobs.run_status").format(sql.Literal(status)))
    if f.kind:
        clauses.append(sql.SQL("r.kind = %s"))
        args.append(f.kind)
    if f.definition:
        clauses.append(
            sql.SQL("r.definition_id = (SELECT d.id FROM jobs.definitions AS d WHERE d.name = %s)")
        )
        args.append(f.definition)
    if f.queue:
        clause, qargs = _queue_clause(f.queue, feats)
        clauses.append(clause)
        args.extend(qargs)
    if f.since is not None:
        clauses.append(sql.SQL("r.scheduled_for >= %s"))
        args.append(f.since)
    if f.until is not None:
        clauses.append(sql.SQL("r.scheduled_for < %s"))
        args.append(f.until)
    if not clauses:
        return sql.SQL("TRUE"), args
    return sql.SQL(" AND ").join(clauses), args


def _queue_clause(queue: str, feats: Features) -> tuple[sql.Composable, list[Any]]:
    """Runs of one queue. Without a queue column every run is in the 'default' queue."""
    if feats.has("runs.queue"):
        return sql.SQL("r.queue = %s"), [queue]
    return (sql.SQL("TRUE") if queue == "default" else sql.SQL("FALSE")), []


async def runs(conn: Conn, feats: Features, f: RunFilter, before: int | None) -> list[Row]:
    """One page of runs matching the filter, newest first (keyset on id).

    Whether each was retried is a probe of the retry_of indexes per run shown (a LATERAL
    with LIMIT, which the planner cannot turn into a hash of every retried run: as an
    EXISTS in the select list, planned before the LIMIT, it read every run per page)."""
    where, args = _where(f, feats, status=f.status)
    if before is not None:
        where = sql.SQL("{} AND r.id < %s").format(where)
        args.append(before)
    query = sql.SQL(
        """
        SELECT r.id, r.kind, r.status, r.attempt, r.retry_of, r.origin, r.definition_id,
               d.name AS definition, r.scheduled_for, r.started_at, r.finished_at,
               r.failure_reason, left(r.error, 300) AS error, r.worker, r.cancel_requested,
               n.id IS NOT NULL AS retried
          FROM {runs} AS r
          LEFT JOIN jobs.definitions AS d ON d.id = r.definition_id
          LEFT JOIN LATERAL (SELECT a.id FROM {runs} AS a WHERE a.retry_of = r.id LIMIT 1) AS n ON TRUE
         WHERE {where}
         ORDER BY r.id DESC
         LIMIT %s
        """
    ).format(where=where, runs=every_run(feats))
    cur = await conn.execute(query, [*args, PAGE_SIZE + 1])
    return await cur.fetchall()


async def failed_count(conn: Conn, feats: Features, f: RunFilter, *, unretried: bool) -> int:
    """How many FAILED runs match the filter (counted up to BULK_LIMIT)."""
    where, args = _failed_where(f, feats, unretried)
    query = sql.SQL("SELECT count(*) AS n FROM (SELECT FROM {} AS r WHERE {} LIMIT %s) AS m").format(
        every_run(feats), where
    )
    row = await (await conn.execute(query, [*args, BULK_LIMIT])).fetchone()
    return int(row["n"]) if row else 0


async def failed_ids(
    conn: Conn, feats: Features, f: RunFilter, *, unretried: bool, upto: int = 2**63 - 1
) -> list[int]:
    """Ids up to ``upto`` of the FAILED runs matching the filter (at most BULK_LIMIT), for
    bulk actions."""
    where, args = _failed_where(f, feats, unretried)
    query = sql.SQL("SELECT r.id FROM {} AS r WHERE {} AND r.id <= %s ORDER BY r.id LIMIT %s").format(
        every_run(feats), where
    )
    cur = await conn.execute(query, [*args, upto, BULK_LIMIT])
    return [row["id"] for row in await cur.fetchall()]


async def failed_top(conn: Conn, feats: Features, f: RunFilter) -> int:
    """The highest id of a FAILED run matching the filter (0: none): a bulk action confirmed on
    the page acts on no run that failed after it was shown."""
    where, args = _failed_where(f, feats, False)
    query = sql.SQL("SELECT coalesce(max(r.id), 0) AS top FROM {} AS r WHERE {}").format(
        every_run(feats), where
    )
    row = await (await conn.execute(query, args)).fetchone()
    return int(row["top"]) if row else 0


def _failed_where(f: RunFilter, feats: Features, unretried: bool) -> tuple[sql.Composable, list[Any]]:
    """The FAILED runs matching the filter, live or moved to history (with ``unretried``,
    those with no next attempt yet)."""
    where, args = _where(f, feats, status="FAILED")
    if unretried:
        where = sql.SQL("{} AND NOT EXISTS (SELECT FROM {} AS n WHERE n.retry_of = r.id)").format(
            where, every_run(feats)
        )
    return where, args


def every_run(feats: Features) -> sql.Composable:
    """The relation holding every run: live and history (jobs.runs_all), or jobs.runs alone on
    a schema that keeps no separate history."""
    return sql.SQL("jobs.runs_all" if feats.has("runs_all") else "jobs.runs")


async def run(conn: Conn, feats: Features, run_id: int) -> Row | None:
    """A run with its definition and timings, its payload's and result's numbers with every digit."""
    query = sql.SQL(
        """
        SELECT r.*, d.name AS definition, d.max_concurrent_runs,
               r.started_at - r.scheduled_for AS start_delay,
               coalesce(r.finished_at, now()) - r.started_at AS runtime,
               CASE WHEN r.status = 'RUNNING' THEN now() - r.heartbeat_at END AS heartbeat_age,
               EXISTS (SELECT FROM {runs} AS n WHERE n.retry_of = r.id) AS retried
          FROM {runs} AS r
          LEFT JOIN jobs.definitions AS d ON d.id = r.definition_id
         WHERE r.id = %s
        """
    ).format(runs=every_run(feats))
    cur = conn.cursor()
    json_numbers.read_exactly(cur)
    await cur.execute(query, (run_id,))
    return await cur.fetchone()


async def attempt_chain(conn: Conn, feats: Features, run_id: int) -> list[Row]:
    """Every attempt of the run's occurrence, first to last, following retry_of both ways. The
    attempts are read by an array of ids: the planner cannot tell how few rows a recursive
    query gives, and joined with it, it read every run."""
    query = sql.SQL(
        """
        WITH RECURSIVE earlier AS (
            SELECT r.id, r.retry_of, 0 AS depth FROM {runs} AS r WHERE r.id = %(id)s
            UNION ALL
            SELECT p.id, p.retry_of, e.depth + 1
              FROM {runs} AS p JOIN earlier AS e ON p.id = e.retry_of
             WHERE e.depth < 1000
        ),
        later AS (
            SELECT r.id, 0 AS depth FROM {runs} AS r WHERE r.id = %(id)s
            UNION ALL
            SELECT n.id, l.depth + 1
              FROM {runs} AS n JOIN later AS l ON n.retry_of = l.id
             WHERE l.depth < 1000
        )
        SELECT r.id, r.attempt, r.status, r.origin, r.scheduled_for, r.started_at, r.finished_at,
               r.failure_reason, left(r.error, 300) AS error, r.worker
          FROM {runs} AS r
         WHERE r.id = ANY (ARRAY(SELECT id FROM earlier UNION SELECT id FROM later))
         ORDER BY r.attempt, r.id
        """
    ).format(runs=every_run(feats))
    cur = await conn.execute(query, {"id": run_id})
    return await cur.fetchall()


async def dependencies(conn: Conn, feats: Features, run_id: int) -> tuple[list[Row], list[Row]] | None:
    """(runs this one waits for, runs waiting for this one), when runs have depends_on."""
    if not feats.has("runs.depends_on"):
        return None
    query = sql.SQL(
        """
        SELECT u.id, u.kind, u.status FROM {runs} AS u
         WHERE u.id = ANY((SELECT r.depends_on FROM {runs} AS r WHERE r.id = %s)::bigint[])
         ORDER BY u.id
        """
    ).format(runs=every_run(feats))
    upstream = await (await conn.execute(query, (run_id,))).fetchall()
    downstream = await (
        await conn.execute(
            sql.SQL(
                "SELECT w.id, w.kind, w.status FROM {runs} AS w"
                " WHERE w.depends_on @> ARRAY[%s]::bigint[] ORDER BY w.id LIMIT 100"
            ).format(runs=every_run(feats)),
            (run_id,),
        )
    ).fetchall()
    return upstream, downstream


# -- running and audit --------------------------------------------------------------------


async def running(conn: Conn) -> list[Row]:
    cur = await conn.execute("SELECT * FROM jobs.running ORDER BY started_at, id LIMIT 1000")
    return await cur.fetchall()


async def audit(conn: Conn, before: int | None) -> list[Row]:
    cur = await conn.execute(
        """
        SELECT a.id, a.at, a.actor, a.action, a.target, a.detail, a.db_user
          FROM jobs.audit_log AS a
         WHERE %(before)s::bigint IS NULL OR a.id < %(before)s::bigint
         ORDER BY a.id DESC
         LIMIT %(limit)s
        """,
        {"before": before, "limit": PAGE_SIZE + 1},
    )
    return await cur.fetchall()


# -- actions (as jobs_operator; each commits with its audit entry) ----------------------


async def record_audit(conn: Conn, actor: str, action: str, target: str | None, detail: str) -> None:
    """jobs.audit: who did what to what; `detail` is a JSON object as text."""
    await conn.execute("SELECT jobs.audit(%s, %s, %s, %s::jsonb)", (actor, action, target, detail))


async def cancel(conn: Conn, run_id: int) -> tuple[str, bool]:
    """jobs.cancel; the run's status after it, and whether this transaction cancelled it. A
    run another transaction cancelled first (a second operator, a double click: this one waited
    for that one's lock on the run) reads CANCELLED too, with the other's finished_at; one this
    transaction cancelled has finished_at = now(), its start."""
    row = await (await conn.execute("SELECT jobs.cancel(%s) AS status", (run_id,))).fetchone()
    assert row is not None
    status = str(row["status"])
    if status != "CANCELLED":
        return status, False
    mine = await (
        await conn.execute(
            "SELECT r.finished_at = now() AS mine FROM jobs.runs AS r WHERE r.id = %s", (run_id,)
        )
    ).fetchone()
    return status, bool(mine and mine["mine"])


async def retry(conn: Conn, run_id: int) -> int:
    """jobs.retry; the id of the new attempt."""
    row = await (await conn.execute("SELECT id FROM jobs.retry(%s)", (run_id,))).fetchone()
    assert row is not None
    return int(row["id"])


async def next_attempt(conn: Conn, feats: Features, run_id: int) -> int | None:
    """The id of the run's next attempt (the run whose retry_of it is), None when it has none."""
    query = sql.SQL("SELECT n.id FROM {runs} AS n WHERE n.retry_of = %s LIMIT 1").format(
        runs=every_run(feats)
    )
    row = await (await conn.execute(query, (run_id,))).fetchone()
    return None if row is None else int(row["id"])


async def run_now(conn: Conn, name: str) -> int:
    """jobs.run_now; the id of the queued run."""
    row = await (await conn.execute("SELECT id FROM jobs.run_now(%s)", (name,))).fetchone()
    assert row is not None
    return int(row["id"])


async def pause_definition(conn: Conn, name: str) -> bool:
    """jobs.pause: whether the definition was running (False: it was paused already)."""
    return await _set_enabled(conn, name, "pause")


async def resume_definition(conn: Conn, name: str) -> bool:
    """jobs.resume: whether the definition was paused (False: it was not)."""
    return await _set_enabled(conn, name, "resume")


async def _set_enabled(conn: Conn, name: str, call: str) -> bool:
    before = await (
        await conn.execute("SELECT d.enabled FROM jobs.definitions AS d WHERE d.name = %s", (name,))
    ).fetchone()
    await conn.execute(sql.SQL("SELECT 1 FROM jobs.{}(%s)").format(sql.Identifier(call)), (name,))
    return before is not None and bool(before["enabled"]) == (call == "pause")


async def pause_queue(conn: Conn, name: str | None) -> bool:
    """jobs.pause_queue: whether the queue was running (False: it was paused already)."""
    row = await (await conn.execute("SELECT jobs.pause_queue(%s) AS changed", (name,))).fetchone()
    return bool(row and row["changed"])


async def resume_queue(conn: Conn, name: str | None) -> bool:
    """jobs.resume_queue: whether the queue was paused (False: it was not)."""
    row = await (await conn.execute("SELECT jobs.resume_queue(%s) AS changed", (name,))).fetchone()
    return bool(row and row["changed"])


async def retry_many(conn: Conn, run_ids: list[int]) -> list[int]:
    """jobs.retry_many; the ids of the runs it retried (not of their new attempts)."""
    cur = await conn.execute("SELECT retry_of FROM jobs.retry_many(%s)", (run_ids,))
    return [int(row["retry_of"]) for row in await cur.fetchall()]


async def discard(conn: Conn, run_ids: list[int]) -> int:
    """jobs.discard; how many runs it deleted."""
    row = await (await conn.execute("SELECT jobs.discard(%s) AS n", (run_ids,))).fetchone()
    assert row is not None
    return int(row["n"])


async def passed_over(conn: Conn, feats: Features, run_ids: list[int], *, unretried: bool) -> list[int]:
    """The runs among `run_ids` a bulk action left as they were, FAILED (with ``unretried``,
    still without a next attempt): those jobs.retry_many or jobs.discard passed
    over by their own rules. A run among them that is gone, or was retried, was taken by
    another action meanwhile."""
    query = sql.SQL(
        "SELECT r.id FROM {runs} AS r WHERE r.id = ANY(%s) AND r.status = 'FAILED'{unretried} ORDER BY r.id"
    ).format(
        runs=every_run(feats),
        unretried=sql.SQL(
            " AND NOT EXISTS (SELECT FROM {} AS n WHERE n.retry_of = r.id)" if unretried else ""
        ).format(every_run(feats)),
    )
    cur = await conn.execute(query, (run_ids,))
    return [int(row["id"]) for row in await cur.fetchall()]
