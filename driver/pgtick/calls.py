"""Every SQL statement the driver sends, by name.

One answer to "what does the driver send?": each call is a name, its SQL text
and a thin typed function. The rules live in SQL (``sql/*.sql``, documented in
DESIGN.md); these calls only name the function or view and pass arguments.
Hot-path calls that travel in a pipeline expose their SQL text as constants.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from pgtick import json_numbers

Conn = psycopg.Connection[Any]

# --- migrations (migrate.py) -------------------------------------------------

MIGRATION_LEDGER_EXISTS = "SELECT to_regclass('jobs.schema_migrations') IS NOT NULL"
APPLIED_MIGRATIONS = "SELECT version FROM jobs.schema_migrations"
RECORD_MIGRATION = "INSERT INTO jobs.schema_migrations (version, name) VALUES (%s, %s)"
ADVISORY_LOCK = "SELECT pg_advisory_lock(%s)"
ADVISORY_UNLOCK = "SELECT pg_advisory_unlock(%s)"
ADVISORY_XACT_LOCK = "SELECT pg_advisory_xact_lock(%s)"


def migration_ledger_exists(conn: Conn) -> bool:
    row = conn.execute(MIGRATION_LEDGER_EXISTS).fetchone()
    return bool(row and row[0])


def applied_migrations(conn: Conn) -> set[str]:
    return {str(row[0]) for row in conn.execute(APPLIED_MIGRATIONS)}


def record_migration(conn: Conn, version: str, name: str) -> None:
    conn.execute(RECORD_MIGRATION, (version, name))


def advisory_lock(conn: Conn, key: int) -> None:
    conn.execute(ADVISORY_LOCK, (key,))


def advisory_unlock(conn: Conn, key: int) -> None:
    conn.execute(ADVISORY_UNLOCK, (key,))


def advisory_xact_lock(conn: Conn, key: int) -> None:
    conn.execute(ADVISORY_XACT_LOCK, (key,))


#: The session of this database, other than this one, whose open transaction is the oldest of
#: those holding a lock on something in the jobs schema (a table, a view, an index) for longer
#: than the given seconds: the likeliest to hold up a migration that waits for one. Its
#: application name, its state, how long its transaction has been open and the start of its
#: statement (which another role's session shows only to a member of pg_read_all_stats).
OLDEST_JOBS_LOCK_HOLDER = """
SELECT a.pid, a.application_name, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8,
       left(regexp_replace(a.query, '\\s+', ' ', 'g'), 120)
  FROM pg_catalog.pg_stat_activity AS a
 WHERE a.datname = current_database() AND a.pid <> pg_catalog.pg_backend_pid()
   AND a.xact_start < clock_timestamp() - make_interval(secs => %s)
   AND EXISTS (SELECT FROM pg_catalog.pg_locks AS l
                 JOIN pg_catalog.pg_class AS c ON c.oid = l.relation
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                WHERE l.pid = a.pid AND l.granted AND n.nspname = 'jobs')
 ORDER BY a.xact_start
 LIMIT 1
"""


def oldest_jobs_lock_holder(conn: Conn, older_than: float) -> Any:
    """``(pid, application_name, state, transaction seconds, query)`` or None."""
    return conn.execute(OLDEST_JOBS_LOCK_HOLDER, (older_than,)).fetchone()


CONFIG_EXISTS = "SELECT to_regclass('jobs.config') IS NOT NULL"
#: The shortest heartbeat timeout of a run that is running or may start: the server's, or a
#: shorter one of a queued or running run's own.
SHORTEST_HEARTBEAT_TIMEOUT = """
SELECT extract(epoch FROM least(
           (SELECT heartbeat_timeout FROM jobs.config),
           (SELECT min(heartbeat_timeout) FROM jobs.runs WHERE status IN ('QUEUED', 'RUNNING'))))::float8
"""


def shortest_heartbeat_timeout(conn: Conn) -> float | None:
    """SHORTEST_HEARTBEAT_TIMEOUT in seconds; None before the schema is installed."""
    if not _first(conn.execute(CONFIG_EXISTS).fetchone()):
        return None
    row = conn.execute(SHORTEST_HEARTBEAT_TIMEOUT).fetchone()
    return None if row is None or _first(row) is None else float(_first(row))


def can_operate(conn: Conn) -> bool:
    """Whether this login has jobs_operator's rights (sync the app, schedule), not only a worker's
    (true where the role does not exist yet: the schema is not installed, which is said next)."""
    row = conn.execute(
        "SELECT CASE WHEN to_regrole('jobs_operator') IS NULL THEN true"
        " ELSE pg_has_role('jobs_operator', 'USAGE') END"
    ).fetchone()
    return bool(row and _first(row))


def schema_installed(conn: Conn) -> bool:
    row = conn.execute("SELECT to_regclass('jobs.runs') IS NOT NULL").fetchone()
    return bool(row and row[0])


# The migrations recorded, when this login may read the ledger (readers and operators may;
# a worker-only login may not, and is answered None).
READABLE_MIGRATIONS = (
    "SELECT coalesce(has_table_privilege(to_regclass('jobs.schema_migrations'), 'SELECT'), false)"
)


def readable_migrations(conn: Conn) -> set[str] | None:
    """The versions in ``jobs.schema_migrations``; None when this login may not read it."""
    row = conn.execute(READABLE_MIGRATIONS).fetchone()
    if not (row and row[0]):
        return None
    return applied_migrations(conn)


#: The functions a worker calls, with the argument types of this driver's calls: what a
#: worker-only login, which may not read the migration ledger, checks for at start.
WORKER_FUNCTIONS = (
    "jobs.claim(integer, text, text[], boolean, text[], text)",
    "jobs.heartbeat(bigint[], text, text)",
    "jobs.hand_back_unheld(bigint[], text, text)",
    "jobs.complete(bigint, text, jsonb, text)",
    "jobs.complete_many(bigint[], text, text)",
    "jobs.fail(bigint, text, text[], text, text, text)",
    "jobs.acknowledge_cancel(bigint, text, text, text)",
    "jobs.next_due(text[], text[])",
    "jobs.snooze(bigint, text, interval, text)",
    "jobs.unclaim(bigint[], text, text)",
    "jobs.register_worker(text, text[], text, integer, text[])",
    "jobs.worker_seen(text)",
    "jobs.worker_stopped(text)",
)
MISSING_FUNCTIONS = (
    "SELECT s FROM unnest(%s::text[]) WITH ORDINALITY AS f(s, n) WHERE to_regprocedure(s) IS NULL ORDER BY n"
)


def missing_functions(conn: Conn, signatures: tuple[str, ...] = WORKER_FUNCTIONS) -> list[str]:
    """Which of ``signatures`` (``jobs.name(type, ...)``) the database does not have."""
    return [str(row[0]) for row in conn.execute(MISSING_FUNCTIONS, (list(signatures),))]


# --- worker (worker.py, heartbeat) ------------------------------------------

# heartbeat => true: the claim itself stamps heartbeat_at, so no extra heartbeat round
# trip is needed right after it, and a crash just after claiming is reaped by timeout.
# queues => NULL claims from every queue. claim_token: the worker's secret (one per worker
# process, never logged); the database keeps its hash on the runs, and every later call on
# them (heartbeat, complete, complete_many, fail, acknowledge_cancel, unclaim) must present it.
CLAIM = "SELECT * FROM jobs.claim(%s, %s, %s, true, %s, claim_token => %s)"
# When the next QUEUED run this worker could claim (its kinds and queues) becomes due, and the
# server clock: an idle worker sleeps until then.
NEXT_DUE = "SELECT next_at, db_now FROM jobs.next_due(%s, %s)"
COMPLETE_MANY = "SELECT run_id FROM jobs.complete_many(%s, %s, claim_token => %s)"
COMPLETE = "SELECT jobs.complete(%s, %s, %s, claim_token => %s) AS ok"
ACKNOWLEDGE_CANCEL = "SELECT jobs.acknowledge_cancel(%s, %s, %s, claim_token => %s) AS ok"
FAIL = "SELECT (f).id, (f).status::text AS status FROM jobs.fail(%s, %s, %s, %s, %s, claim_token => %s) AS f"
HEARTBEAT = "SELECT run_id, cancel_requested FROM jobs.heartbeat(%s, %s, claim_token => %s)"
DEFAULT_HEARTBEAT_TIMEOUT = "SELECT heartbeat_timeout FROM jobs.config"
LISTEN = "LISTEN jobs"


def default_heartbeat_timeout(conn: Conn) -> timedelta | None:
    row = conn.execute(DEFAULT_HEARTBEAT_TIMEOUT).fetchone()
    return None if row is None else _first(row)


def listen(conn: Conn) -> None:
    conn.execute(LISTEN)


def complete(conn: Conn, run_id: int, worker_id: str, result: Jsonb, claim_token: str | None = None) -> bool:
    row = conn.execute(COMPLETE, (run_id, worker_id, result, claim_token)).fetchone()
    return bool(row and _first(row))


SNOOZE = "SELECT jobs.snooze(%s, %s, %s, %s)"
HAND_BACK_UNHELD = (
    "SELECT run_id, status::text AS status FROM jobs.hand_back_unheld(%s, %s, claim_token => %s)"
)


def hand_back_unheld(
    conn: Conn, held: list[int], worker_id: str, claim_token: str | None = None
) -> dict[int, str]:
    """Give back the runs RUNNING for this worker (and claim token) that it does not hold
    (``held``), claimed by a claim whose answer was lost: QUEUED unchanged, or CANCELLED when
    their cancellation was requested. Their ids and new statuses."""
    rows = conn.execute(HAND_BACK_UNHELD, (held, worker_id, claim_token)).fetchall()
    return {int(_first(row)): str(row["status"] if isinstance(row, dict) else row[1]) for row in rows}


def snooze(conn: Conn, run_id: int, worker_id: str, delay: timedelta, claim_token: str | None = None) -> bool:
    """RUNNING -> QUEUED at now() + delay, same attempt; False when fenced or asked to cancel."""
    row = conn.execute(SNOOZE, (run_id, worker_id, delay, claim_token)).fetchone()
    return bool(row and _first(row))


UNCLAIM = "SELECT run_id FROM jobs.unclaim(%s, %s, claim_token => %s)"


def unclaim(conn: Conn, run_ids: list[int], worker_id: str, claim_token: str | None = None) -> list[int]:
    """RUNNING -> QUEUED as claimed (same attempt and scheduled_for) for runs whose job never
    began; the ids given back (not those fenced or asked to cancel)."""
    return [int(_first(row)) for row in conn.execute(UNCLAIM, (run_ids, worker_id, claim_token)).fetchall()]


def acknowledge_cancel(
    conn: Conn, run_id: int, worker_id: str, message: str | None, claim_token: str | None = None
) -> bool:
    row = conn.execute(ACKNOWLEDGE_CANCEL, (run_id, worker_id, message, claim_token)).fetchone()
    return bool(row and _first(row))


def fail(
    conn: Conn,
    run_id: int,
    worker_id: str,
    classes: list[str] | None,
    message: str,
    reason: str,
    claim_token: str | None = None,
) -> tuple[int, str] | None:
    """jobs.fail; (retry or failed run id, its status), or None when fenced."""
    row = conn.execute(FAIL, (run_id, worker_id, classes, message, reason, claim_token)).fetchone()
    if row is None:
        return None
    run, status = (row[0], row[1]) if isinstance(row, tuple) else (row["id"], row["status"])
    return None if run is None else (int(run), str(status))


def _first(row: Any) -> Any:
    return row[0] if isinstance(row, tuple) else next(iter(row.values()))


# --- scheduler (scheduler.py) -----------------------------------------------

NEW_DEFINITIONS = "SELECT * FROM jobs.new_definitions(%s)"
DUE_DEFINITIONS = "SELECT * FROM jobs.due_definitions(%s, %s)"
MATERIALIZE = "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s, %s) AS n"
MATERIALIZE_MANY = (
    "SELECT definition_id, created, error FROM jobs.materialize_many("
    "%s::bigint[], %s::timestamptz[], %s::timestamptz[], %s::integer[], %s::bigint[], %s::timestamptz[])"
)

# After downtime: materialize many definitions and record each one's catch-up
# (jobs.record_catch_up, which also supersedes older never-started runs) in one statement,
# so one commit. A definition the database refuses is isolated by jobs.materialize_many
# (its error row), and its catch-up is not recorded.
MATERIALIZE_CATCH_UPS = """
    WITH m AS MATERIALIZED (
        SELECT * FROM jobs.materialize_many(%s::bigint[], %s::timestamptz[], %s::timestamptz[],
                                            %s::integer[], %s::bigint[], %s::timestamptz[])
    )
    SELECT m.definition_id, m.created, m.error,
           CASE WHEN m.error IS NULL
                THEN jobs.record_catch_up(c.id, c.policy, c.first_late, c.last_late, c.occurrences,
                                          c.runs, c.next_run_at)
           END AS recorded
      FROM m
      JOIN unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::timestamptz[], %s::integer[],
                  %s::integer[], %s::timestamptz[])
           AS c (id, policy, first_late, last_late, occurrences, runs, next_run_at) ON c.id = m.definition_id
"""


def materialize_catch_ups(
    conn: Conn,
    materialize: tuple[list[Any], ...],
    records: list[tuple[int, str, datetime, datetime, int, int]],
) -> list[Any]:
    """jobs.materialize_many (the arguments of ``materialize_many``, in order) plus
    jobs.record_catch_up for each definition advanced (definition, policy, first and last late
    occurrence, occurrences, runs; at the cursor materialize_many moved it to): one row per
    definition advanced or refused, with the catch-up's sentence (``recorded``) or NULL."""
    columns = [list(c) for c in zip(*records, strict=True)] if records else [[] for _ in range(6)]
    return conn.execute(MATERIALIZE_CATCH_UPS, (*materialize, *columns, materialize[2])).fetchall()


def try_lead(conn: Conn, owner: str) -> bool:
    row = conn.execute("SELECT jobs.try_lead(%s) AS leading", (owner,)).fetchone()
    return bool(row and _first(row))


def resign(conn: Conn) -> None:
    conn.execute("SELECT jobs.resign()")


def set_idle_session_timeout(conn: Conn, seconds: int) -> None:
    conn.execute(f"SET idle_session_timeout = '{int(seconds)}s'")


def ping(conn: Conn) -> None:
    """A statement that does nothing: the session is not idle."""
    conn.execute("SELECT 1")


def idle_session_timeout(conn: Conn) -> float:
    """The session's idle_session_timeout in seconds (0: none)."""
    row = conn.execute(
        "SELECT setting::bigint / 1000.0 AS s FROM pg_catalog.pg_settings WHERE name = 'idle_session_timeout'"
    ).fetchone()
    return float(_first(row)) if row else 0.0


def backend_pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    return int(_first(row)) if row else 0


def server_local_times(conn: Conn, zone: str, instants: list[datetime]) -> list[datetime]:
    """Each instant's wall time in `zone` as the server's time zone database reads it."""
    rows = conn.execute(
        "SELECT u.t AT TIME ZONE %s AS local FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS u (t, n)"
        " ORDER BY u.n",
        (zone, instants),
    ).fetchall()
    return [_first(row) for row in rows]


def clock_timestamp(conn: Conn) -> datetime:
    row = conn.execute("SELECT clock_timestamp() AS now").fetchone()
    assert row is not None
    value: datetime = _first(row)
    return value


def reap(conn: Conn) -> list[Any]:
    """jobs.reap, each run with its kind and the worker it was taken from (for the log line)."""
    rows = conn.execute("SELECT * FROM jobs.reap()").fetchall()
    if not rows:
        return rows
    ids = [r["run_id"] for r in rows]
    held = {r["id"]: r for r in conn.execute(REAPED_FROM, (ids,)).fetchall()}
    for r in rows:
        row = held.get(r["run_id"])
        r["kind"] = row["kind"] if row is not None else None
        r["worker"] = row["worker"] if row is not None else None
    return rows


REAPED_FROM = "SELECT id, kind, worker FROM jobs.runs WHERE id = ANY(%s)"


def new_definitions(conn: Conn, max_rows: int) -> list[Any]:
    return conn.execute(NEW_DEFINITIONS, (max_rows,)).fetchall()


def due_definitions(conn: Conn, horizon: datetime, max_rows: int) -> list[Any]:
    return conn.execute(DUE_DEFINITIONS, (horizon, max_rows)).fetchall()


def materialize_many(
    conn: Conn,
    definition_ids: list[int],
    expected: list[datetime | None],
    new_next: list[datetime | None],
    revisions: list[int | None],
    run_definition_ids: list[int],
    run_times: list[datetime],
) -> list[Any]:
    """jobs.materialize_many: one row per definition advanced (created) or refused (error)."""
    return conn.execute(
        MATERIALIZE_MANY, (definition_ids, expected, new_next, revisions, run_definition_ids, run_times)
    ).fetchall()


def materialize_one_shots(conn: Conn, lookahead: timedelta, misfire_grace: timedelta) -> int:
    row = conn.execute(
        "SELECT jobs.materialize_one_shots(%s, %s) AS n", (lookahead, misfire_grace)
    ).fetchone()
    return int(_first(row)) if row else 0


def mark_schedule_error(conn: Conn, definition_id: int, revision: int, error: str) -> None:
    conn.execute("SELECT jobs.mark_schedule_error(%s, %s, %s)", (definition_id, revision, error))


def prune(conn: Conn, batch: int) -> int:
    row = conn.execute("SELECT jobs.prune(NULL, %s) AS n", (batch,)).fetchone()
    return int(_first(row)) if row else 0


def archive(conn: Conn, batch: int) -> int:
    row = conn.execute("SELECT jobs.archive(%s) AS n", (batch,)).fetchone()
    return int(_first(row)) if row else 0


# --- definitions and app sync (definitions.py) ------------------------------


def set_retry_policy(
    conn: Conn,
    kind: str,
    retry_on: list[str] | None,
    never_retry: list[str] | None,
    max_attempts: int | None,
    backoff_initial: float | None,
    backoff_factor: float | None,
    backoff_max: float | None,
    jitter: float | None,
) -> None:
    conn.execute(
        "SELECT jobs.set_retry_policy(%s, %s, %s, %s, make_interval(secs => %s), %s, "
        "make_interval(secs => %s), %s)",
        (kind, retry_on, never_retry, max_attempts, backoff_initial, backoff_factor, backoff_max, jitter),
    )


def define(conn: Conn, name: str, kind: str, given: dict[str, Any]) -> Any:
    """jobs.define with named arguments, only those given (the rest keep their SQL defaults)."""
    args = [sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in given]
    query = sql.SQL("SELECT * FROM jobs.define(%(name)s, %(kind)s{})").format(
        sql.SQL("").join(sql.SQL(", ") + a for a in args)
    )
    return conn.execute(query, {"name": name, "kind": kind, **given}).fetchone()


DEFINE_MANY_FIELDS = frozenset(
    {
        "name",
        "kind",
        "schedule",
        "timezone",
        "run_at",
        "payload",
        "enabled",
        "max_concurrent_runs",
        "priority",
        "max_attempts",
        "misfire_policy",
        "overlap_policy",
        "timeout",
        "heartbeat_timeout",
        "dst_gap",
        "dst_repeat",
        "jitter",
        "pause_after_failures",
        "queue",
        "concurrency_key",
    }
)


def define_many(conn: Conn, definitions: list[dict[str, Any]]) -> list[Any]:
    """jobs.define_many: one row per definition (id, name, created, rescheduled); a Decimal in
    a payload is written with every digit."""
    return conn.execute("SELECT * FROM jobs.define_many(%s)", (json_numbers.jsonb(definitions),)).fetchall()


def interval(conn: Conn, text: str) -> timedelta | None:
    """Interval text as PostgreSQL reads it (as jobs.define_many reads an interval written as
    text); raises psycopg.DataError when it is none."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("SELECT %s::text::interval", (text,)).fetchone()
    return row[0] if row is not None and isinstance(row[0], timedelta) else None


# --- operator commands (cli.py) ---------------------------------------------


def enqueue(
    conn: Conn,
    kind: str,
    payload: Jsonb,
    run_at: datetime | None,
    priority: int | None,
    key: str | None,
    *,
    queue: str = "default",
    concurrency_key: str | None = None,
) -> Any:
    return conn.execute(
        "SELECT * FROM jobs.enqueue(%s, %s, coalesce(%s, now()), %s, %s, queue => %s, concurrency_key => %s)",
        (kind, payload, run_at, priority, key, queue, concurrency_key),
    ).fetchone()


def pause_queue(conn: Conn, name: str) -> bool:
    return bool(_first(conn.execute("SELECT jobs.pause_queue(%s)", (name,)).fetchone()))


def resume_queue(conn: Conn, name: str) -> bool:
    return bool(_first(conn.execute("SELECT jobs.resume_queue(%s)", (name,)).fetchone()))


def scope_worker(conn: Conn, role: str, kinds: list[str] | None, queues: list[str] | None) -> Any:
    return conn.execute(
        "SELECT role::text AS role, kinds, queues FROM jobs.scope_worker(%s, %s, %s)", (role, kinds, queues)
    ).fetchone()


def unscope_worker(conn: Conn, role: str) -> bool:
    return bool(_first(conn.execute("SELECT jobs.unscope_worker(%s)", (role,)).fetchone()))


def run_now(conn: Conn, name: str) -> Any:
    return conn.execute("SELECT * FROM jobs.run_now(%s)", (name,)).fetchone()


def cancel_queued(conn: Conn, definition: str) -> int:
    row = conn.execute("SELECT jobs.cancel_queued(%s)", (definition,)).fetchone()
    return int(_first(row)) if row else 0


def cancel(conn: Conn, run_id: int) -> str:
    row = conn.execute("SELECT jobs.cancel(%s)::text", (run_id,)).fetchone()
    return str(_first(row)) if row else "?"


def run_state(conn: Conn, run_id: int) -> tuple[str, bool] | None:
    """A run's status and whether its cancel was requested (jobs.get_run: live or moved);
    None when there is no such run."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("SELECT status::text, cancel_requested FROM jobs.get_run(%s)", (run_id,)).fetchone()
    return None if row is None else (str(row[0]), bool(row[1]))


def pause(conn: Conn, name: str) -> bool:
    """jobs.pause; whether it changed anything (False: the definition was paused already)."""
    return _set_enabled(conn, name, "SELECT jobs.pause(%s)", enabled=False)


def resume(conn: Conn, name: str) -> bool:
    """jobs.resume; whether it changed anything (False: the definition was not paused)."""
    return _set_enabled(conn, name, "SELECT jobs.resume(%s)", enabled=True)


def _set_enabled(conn: Conn, name: str, call: LiteralString, *, enabled: bool) -> bool:
    """``call`` (jobs.pause or jobs.resume of definition ``name``, which raises for an unknown
    name) in one transaction with a read of the state it finds: whether it was not
    ``enabled`` already."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        before = cur.execute("SELECT enabled FROM jobs.definitions WHERE name = %s", (name,)).fetchone()
        cur.execute(call, (name,))
    return before is not None and bool(before[0]) != enabled


def retry(conn: Conn, run_id: int) -> Any:
    return conn.execute("SELECT * FROM jobs.retry(%s)", (run_id,)).fetchone()


def leader(conn: Conn) -> list[Any]:
    return conn.execute("SELECT pid, owner, since FROM jobs.leader").fetchall()


def definition_summary(conn: Conn) -> Any:
    return conn.execute("SELECT * FROM jobs.definition_summary").fetchone()


def queue_stats(conn: Conn) -> list[Any]:
    return conn.execute("SELECT * FROM jobs.queue_stats ORDER BY kind").fetchall()


def run_list(
    conn: Conn, status: str | None, kind: str | None, definition: str | None, limit: int
) -> list[Any]:
    return conn.execute(
        """
        SELECT * FROM jobs.run_list
         WHERE (%(status)s::text IS NULL OR status = %(status)s::jobs.run_status::text)
           AND (%(kind)s::text IS NULL OR kind = %(kind)s)
           AND (%(definition)s::text IS NULL OR definition = %(definition)s)
         ORDER BY id DESC LIMIT %(limit)s
        """,
        {"status": status, "kind": kind, "definition": definition, "limit": limit},
    ).fetchall()


# --- leases (lock.py) -------------------------------------------------------

ACQUIRE_LEASE = "SELECT jobs.acquire_lease(%s, %s, %s)"
RENEW_LEASE = "SELECT jobs.renew_lease(%s, %s, %s)"
RELEASE_LEASE = "SELECT jobs.release_lease(%s, %s)"


def acquire_lease(conn: Conn, name: str, owner: str, ttl: timedelta) -> bool:
    row = conn.execute(ACQUIRE_LEASE, (name, owner, ttl)).fetchone()
    return bool(row and _first(row))


def renew_lease(conn: Conn, name: str, owner: str, ttl: timedelta) -> bool:
    row = conn.execute(RENEW_LEASE, (name, owner, ttl)).fetchone()
    return bool(row and _first(row))


def release_lease(conn: Conn, name: str, owner: str) -> bool:
    row = conn.execute(RELEASE_LEASE, (name, owner)).fetchone()
    return bool(row and _first(row))


def lease_holder(conn: Conn, name: str) -> Any:
    return conn.execute(
        "SELECT owner, expires_at, consecutive_skips FROM jobs.leases WHERE name = %s", (name,)
    ).fetchone()


# --- metrics (metrics.py) ---------------------------------------------------


def queue_metrics(conn: Conn) -> list[Any]:
    """One row per kind (jobs.queue_stats has one per kind and queue: the gauges are by kind,
    and a kind in several queues would give each series several samples)."""
    return conn.execute(
        "SELECT kind, sum(queued), sum(running), extract(epoch FROM max(oldest_queued_age)),"
        " sum(skipped_1h), sum(lost_1h) FROM jobs.queue_stats GROUP BY kind"
    ).fetchall()


def definition_skips(conn: Conn) -> list[Any]:
    # Only definitions that can skip (overlap_policy skip): a scrape stays cheap with many definitions.
    return conn.execute(
        "SELECT name, consecutive_skips FROM jobs.definition_health"
        " WHERE id IN (SELECT id FROM jobs.definitions WHERE overlap_policy <> 'queue')"
    ).fetchall()


def lease_skips(conn: Conn) -> list[Any]:
    # The leases of `pgtick lock` wrappers; not the scheduler's own, whose standbys (lease
    # mode) count a refused acquire every tick.
    return conn.execute(
        "SELECT name, consecutive_skips FROM jobs.leases WHERE name <> %s", (LEADER_LEASE,)
    ).fetchall()


def schedule_backlog(conn: Conn) -> list[Any]:
    return conn.execute(
        "SELECT kind, due_not_started, extract(epoch FROM oldest_due_age) FROM jobs.schedule_backlog"
    ).fetchall()


def materialize_failing(conn: Conn) -> int:
    row = conn.execute("SELECT materialize_errors FROM jobs.definition_summary").fetchone()
    return int(_first(row)) if row else 0


def leads(conn: Conn, owner: str) -> bool:
    row = conn.execute("SELECT count(*) FROM jobs.leader WHERE owner = %s", (owner,)).fetchone()
    return bool(row and _first(row))


# --- schema version (migrate.py, pgtick status) ---------------------------------

PACKAGE_VERSION_COLUMN_EXISTS = (
    "SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = 'jobs.schema_migrations'::regclass"
    " AND attname = 'package_version' AND NOT attisdropped)"
)
RECORD_PACKAGE_VERSION = "UPDATE jobs.schema_migrations SET package_version = %s WHERE version = ANY(%s)"
SCHEMA_VERSION = "SELECT schema_version, migration, package_version, applied_at FROM jobs.version()"


def record_package_version(conn: Conn, package_version: str, versions: list[str]) -> None:
    """Note which pgtick release applied ``versions`` (schemas that record it)."""
    row = conn.execute(PACKAGE_VERSION_COLUMN_EXISTS).fetchone()
    if row and row[0]:
        conn.execute(RECORD_PACKAGE_VERSION, (package_version, versions))


def schema_version(conn: Conn) -> dict[str, Any] | None:
    """jobs.version(): the latest applied migration and the package that applied it."""
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute("SELECT to_regprocedure('jobs.version()') IS NOT NULL AS found").fetchone()
        if not (found and found["found"]):
            return None
        return cur.execute(SCHEMA_VERSION).fetchone()


# --- poolers (db.py) and lease leadership (scheduler.py) -------------------------

SERVER_PORT = "SELECT current_setting('port')::integer AS port"

#: Every jobs.* call that reads what others commit needs READ COMMITTED (jobs.claim, an
#: idempotent enqueue...): a session of the driver's own reads so whatever
#: default_transaction_isolation the database, role or DSN set for the application.
READ_COMMITTED_SESSION = (
    "SELECT set_config('default_transaction_isolation', 'read committed', false)"
    " WHERE current_setting('default_transaction_isolation') <> 'read committed'"
)

#: The lease a scheduler leads by when its connection goes through a pooler.
LEADER_LEASE = "pgtick:leader"


def server_port(conn: Conn) -> int | None:
    """The port PostgreSQL listens on (not necessarily the one this client reached)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(SERVER_PORT).fetchone()
    return int(row["port"]) if row else None


def lease_leader(conn: Conn) -> list[dict[str, Any]]:
    """The scheduler leading by lease, if any (pid is NULL: a lease has no session)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT NULL::integer AS pid, owner, acquired_at AS since FROM jobs.leases"
            " WHERE name = %s AND owner IS NOT NULL AND expires_at > clock_timestamp()",
            (LEADER_LEASE,),
        ).fetchall()


# --- backfill (scheduler.py: jobs.backfill requests the leader fills in) -----

PENDING_BACKFILLS = """
SELECT b.id AS backfill_id, b.window_from, b.window_to, d.id, d.name, d.schedule, d.timezone,
       d.created_at, d.dst_gap, d.dst_repeat
  FROM jobs.backfills AS b JOIN jobs.definitions AS d ON d.id = b.definition_id
 WHERE b.done_at IS NULL
 ORDER BY b.id
 LIMIT %s
"""
FINISH_BACKFILL = "SELECT jobs.finish_backfill(%s, %s::timestamptz[], %s) AS n"


def pending_backfills(conn: Conn, limit: int) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(PENDING_BACKFILLS, (limit,)).fetchall())


def finish_backfill(conn: Conn, backfill_id: int, times: list[datetime] | None, error: str | None) -> int:
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(FINISH_BACKFILL, (backfill_id, times, error)).fetchone()
    return int(row[0]) if row else 0


# --- the operator's console (cli.py; sql/console.sql) -------------------------

REGISTER_WORKER = "SELECT jobs.register_worker(%s, %s, %s, %s, %s)"
WORKER_SEEN = "SELECT jobs.worker_seen(%s)"
WORKER_STOPPED = "SELECT jobs.worker_stopped(%s)"


def register_worker(
    conn: Conn, worker_id: str, kinds: list[str], host: str, pid: int, queues: list[str] | None = None
) -> None:
    conn.execute(REGISTER_WORKER, (worker_id, kinds, host, pid, queues))


#: The server's heartbeat timeout in seconds, as a number: an interval too large for Python's
#: timedelta (a mistaken value) still reads, and only ever makes the cadence the configured one.
HEARTBEAT_TIMEOUT_SECONDS = "SELECT extract(epoch FROM heartbeat_timeout)::float8 FROM jobs.config"


def heartbeat_timeout_seconds(conn: Conn) -> float | None:
    row = conn.execute(HEARTBEAT_TIMEOUT_SECONDS).fetchone()
    return None if row is None or _first(row) is None else float(_first(row))


def worker_seen(conn: Conn, worker_id: str) -> None:
    conn.execute(WORKER_SEEN, (worker_id,))


def local_lock_timeout(conn: Conn, seconds: float) -> None:
    """Bound the lock waits of the rest of this transaction (``SET LOCAL lock_timeout``)."""
    conn.execute(LOCAL_LOCK_TIMEOUT, (f"{max(1, round(seconds * 1000))}ms",))


LOCAL_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"


def worker_stopped(conn: Conn, worker_id: str) -> None:
    conn.execute(WORKER_STOPPED, (worker_id,))


def leaders(conn: Conn) -> list[Any]:
    """Every scheduler that leads now, the longest-leading first: more than one when a replica
    leads by the lock and another by the lease (they do not see each other)."""
    return conn.execute(
        "SELECT owner, pid, since, leading_for FROM jobs.leader ORDER BY since, pid"
    ).fetchall()


def status_definitions(conn: Conn, limit: int = 50, offset: int = 0) -> list[Any]:
    """One page of jobs.definition_health by name (each row reads that definition's runs)."""
    return conn.execute(
        "SELECT name, kind, schedule, timezone, paused, finished, next_run_at, running, queued,"
        " max_concurrent_runs, last_status, last_success_at, last_failure_at, consecutive_failures,"
        " consecutive_skips, recent_outcomes, schedule_error, last_catch_up, last_catch_up_at,"
        " materialize_error, lateness_p50, lateness_p99, next_start_at, last_finished_at"
        " FROM jobs.definition_health ORDER BY name LIMIT %s OFFSET %s",
        (limit, offset),
    ).fetchall()


def kinds_without_worker(conn: Conn) -> list[Any]:
    return conn.execute("SELECT * FROM jobs.kinds_without_worker ORDER BY kind").fetchall()


def workers(conn: Conn, include_gone: bool) -> list[Any]:
    return conn.execute(
        "SELECT * FROM jobs.workers WHERE %s OR state = 'alive' ORDER BY state, started_at DESC, worker",
        (include_gone,),
    ).fetchall()


def definition_list(
    conn: Conn, kind: str | None, name_like: str | None, state: str | None, limit: int
) -> list[Any]:
    return conn.execute(
        """
        SELECT * FROM jobs.definition_list
         WHERE (%(kind)s::text IS NULL OR kind = %(kind)s)
           AND (%(name)s::text IS NULL OR name LIKE %(name)s)
           AND (%(state)s::text IS NULL
                OR (%(state)s = 'paused' AND paused)
                OR (%(state)s = 'finished' AND finished)
                OR (%(state)s = 'active' AND NOT paused AND NOT finished))
         ORDER BY name LIMIT %(limit)s
        """,
        {"kind": kind, "name": name_like, "state": state, "limit": limit},
    ).fetchall()


def run_detail(conn: Conn, run_id: int) -> Any:
    return conn.execute("SELECT * FROM jobs.run_detail(%s)", (run_id,)).fetchone()


def undefine_detail(conn: Conn, name: str) -> Any:
    return conn.execute("SELECT * FROM jobs.undefine_detail(%s)", (name,)).fetchone()


def prune_count(conn: Conn, older_than: timedelta | None) -> int:
    row = conn.execute("SELECT jobs.prune_count(%s) AS n", (older_than,)).fetchone()
    return int(_first(row)) if row else 0


def prune_batch(conn: Conn, older_than: timedelta | None, batch: int) -> int:
    row = conn.execute("SELECT jobs.prune(%s, %s) AS n", (older_than, batch)).fetchone()
    return int(_first(row)) if row else 0


def definition_facts(conn: Conn, ids: list[int]) -> dict[int, tuple[str, bool]]:
    """Each definition's name and whether it caps its concurrent runs (max_concurrent_runs)."""
    rows = conn.execute(
        "SELECT id, name, max_concurrent_runs IS NOT NULL AS capped FROM jobs.definitions WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    facts = {}
    for r in rows:
        name, capped = (r["name"], r["capped"]) if isinstance(r, dict) else (r[1], r[2])
        facts[int(_first(r))] = (str(name), bool(capped))
    return facts


def limits(conn: Conn) -> dict[tuple[str, str], bool]:
    """The (scope, name) of every limit, and whether a claim takes its dispatch lock
    exclusively (jobs.tight_limits: below 500 running or 500 starts per period)."""
    rows = conn.execute(
        "SELECT l.scope, l.name, t.name IS NOT NULL AS tight FROM jobs.limits AS l"
        " LEFT JOIN jobs.tight_limits AS t ON t.scope = l.scope AND t.name = l.name"
    ).fetchall()
    return {
        (str(r["scope"]), str(r["name"])) if isinstance(r, dict) else (str(r[0]), str(r[1])): bool(
            r["tight"] if isinstance(r, dict) else r[2]
        )
        for r in rows
    }


# --- backfill and preview of a stored definition (cli.py) --------------------


def backfill(conn: Conn, name: str, window_from: datetime, window_to: datetime) -> Any:
    """jobs.backfill: record a past window to materialize; returns the request row."""
    row = conn.execute("SELECT * FROM jobs.backfill(%s, %s, %s)", (name, window_from, window_to)).fetchone()
    assert row is not None
    return row


def backfill_request(conn: Conn, backfill_id: int) -> Any:
    return conn.execute("SELECT * FROM jobs.backfills WHERE id = %s", (backfill_id,)).fetchone()


def definition(conn: Conn, name: str) -> Any:
    return conn.execute("SELECT * FROM jobs.definitions WHERE name = %s", (name,)).fetchone()


def queued_occurrences(conn: Conn, definition_id: int) -> tuple[int, datetime | None]:
    """How many of a definition's scheduled runs are QUEUED (materialized, not started) and
    the latest start among them."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            "SELECT count(*), max(scheduled_for) FROM jobs.runs"
            " WHERE definition_id = %s AND status = 'QUEUED' AND origin = 'schedule'",
            (definition_id,),
        ).fetchone()
    return (int(row[0]), row[1]) if row is not None else (0, None)


def jitter_offsets(
    conn: Conn, definition_id: int, jitter: timedelta | None, times: list[datetime]
) -> list[Any]:
    """jobs.jitter_offset for each occurrence time, in order (what the scheduler adds)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            "SELECT jobs.jitter_offset(%s, t.at, %s) FROM unnest(%s::timestamptz[]) WITH ORDINALITY"
            " AS t (at, n) ORDER BY t.n",
            (definition_id, jitter, times),
        ).fetchall()
    return [r[0] for r in rows]
