"""Bounds: every duration and number pgtick stores is range-checked where it is written.

A value out of bounds is refused with 22023 and a message naming the field and its range, by
every API function that writes it and by ``UPDATE jobs.config`` (the operator's way to change
settings); a direct write to any other table is refused by its CHECK constraint (23514, the
constraint named after the column). Nothing is half-applied. The bounds exist because a huge
heartbeat timeout made every jobs.reap() overflow (now() - interval), a huge timeout could not
be read by the driver (Python's timedelta ends at 999999999 days) so a claimed batch was lost,
and a deeply nested payload could not be decoded by the driver at all.

An upgrade clamps rows written before the bounds existed, so it never fails on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import (
    Conn,
    Server,
    add_definition,
    add_runs,
    claim,
    digest,
    expect_error,
    psql_file,
    rows,
    scalar,
    schema_before,
)
from pgtick import migrate

INVALID = "22023"
CHECK = "23514"
HUGE = "1000000 years"
DEEP = "repeat('[', 150) || repeat(']', 150)"  # JSON text nested 150 levels
DEEP_OBJECT = f"jsonb_build_object('a', ({DEEP})::jsonb)"

Case = tuple[str, str, tuple[str, ...]]


def refused(sql: str, *mentions: str) -> Case:
    """A write an API function refuses with 22023, its message naming the field, then its range."""
    return (sql, INVALID, mentions)


def checked(sql: str, *mentions: str) -> Case:
    """A direct write to a table its CHECK constraint refuses (23514, naming the constraint)."""
    return (sql, CHECK, mentions)


WRITERS: list[Case] = [
    # jobs.enqueue
    refused(f"SELECT jobs.enqueue('k', timeout => '{HUGE}')", "timeout", "366 days"),
    refused("SELECT jobs.enqueue('k', timeout => '500 milliseconds')", "timeout", "1 second"),
    refused("SELECT jobs.enqueue('k', timeout => '400 days')", "timeout", "366 days"),
    refused("SELECT jobs.enqueue('k', timeout => '13 months')", "timeout", "366 days"),
    refused(f"SELECT jobs.enqueue('k', heartbeat_timeout => '{HUGE}')", "heartbeat_timeout", "366 days"),
    refused(
        "SELECT jobs.enqueue('k', heartbeat_timeout => '10 ms')", "heartbeat_timeout", "100 milliseconds"
    ),
    refused(
        f"SELECT jobs.enqueue('k', unique_key => 'u', unique_for => '{HUGE}')", "unique_for", "100 years"
    ),
    refused(f"SELECT jobs.enqueue('k', {DEEP_OBJECT})", "payload", "100 levels"),
    # times a driver cannot hold in every zone (Python's datetime: years 1 to 9999)
    refused("SELECT jobs.enqueue('k', run_at => '9999-12-31 00:00+00')", "run_at", "9999-12-30"),
    refused("SELECT jobs.enqueue('k', run_at => '0001-01-01 00:00+00 BC')", "run_at", "0001-01-02"),
    # names: no control characters (they forge log lines and break the CLI's tables)
    refused("SELECT jobs.enqueue('a' || chr(10) || 'b')", "kind", "control characters"),
    refused("SELECT jobs.enqueue('k', queue => 'q' || chr(9))", "queue", "control characters"),
    # jobs.enqueue_many
    refused(f"SELECT jobs.enqueue_many('k', '[{{}}]', timeout => '{HUGE}')", "timeout", "366 days"),
    refused(
        f"SELECT jobs.enqueue_many('k', '[{{}}]', heartbeat_timeout => '{HUGE}')",
        "heartbeat_timeout",
        "366 days",
    ),
    refused(
        f"SELECT jobs.enqueue_many('k', jsonb_build_array('{{}}'::jsonb, {DEEP_OBJECT}))",
        "payloads[1]",
        "100 levels",
    ),
    refused(
        "SELECT jobs.enqueue_many('k', '[{}]', run_at => '294276-01-01 00:00+00')", "run_at", "9999-12-30"
    ),
    refused("SELECT jobs.enqueue_many(chr(27) || '[31m', '[{}]')", "kind", "control characters"),
    # jobs.define
    refused(f"SELECT jobs.define('d', 'k', '* * * * *', timeout => '{HUGE}')", "timeout", "366 days"),
    refused(
        f"SELECT jobs.define('d', 'k', '* * * * *', heartbeat_timeout => '{HUGE}')",
        "heartbeat_timeout",
        "366 days",
    ),
    refused(f"SELECT jobs.define('d', 'k', '* * * * *', payload => {DEEP_OBJECT})", "payload", "100 levels"),
    refused(
        "SELECT jobs.define('d', 'k', '* * * * *', max_concurrent_runs => 100001)",
        "max_concurrent_runs",
        "100000",
    ),
    refused("SELECT jobs.define('d', 'k', run_at => '0044-03-15 00:00+00 BC')", "run_at", "0001-01-02"),
    refused("SELECT jobs.define('n' || chr(13) || chr(10), 'k', '* * * * *')", "name", "control characters"),
    refused("SELECT jobs.define('d', 'k' || chr(7), '* * * * *')", "kind", "control characters"),
    # jobs.define_many: seconds or interval text
    refused(
        f"""SELECT jobs.define_many('[{{"name": "d", "kind": "k", "schedule": "* * * * *",
                                       "timeout": "{HUGE}"}}]')""",
        "timeout",
        "366 days",
    ),
    refused(
        """SELECT jobs.define_many('[{"name": "d", "kind": "k", "schedule": "* * * * *",
                                     "heartbeat_timeout": 1e12}]')""",
        "heartbeat_timeout",
        "366 days",
    ),
    refused(
        """SELECT jobs.define_many('[{"name": "d", "kind": "k", "schedule": "* * * * *",
                                     "timeout": 1e300}]')""",
        "timeout",
        "seconds",
        "366 days",
    ),
    refused(
        """SELECT jobs.define_many('[{"name": "d", "kind": "k", "schedule": "* * * * *",
                                     "timeout": 0.5}]')""",
        "timeout",
        "1 second",
    ),
    refused(
        f"""SELECT jobs.define_many(jsonb_build_array(jsonb_build_object(
                'name', 'd', 'kind', 'k', 'schedule', '* * * * *', 'payload', {DEEP_OBJECT})))""",
        "payload",
        "100 levels",
    ),
    refused(
        """SELECT jobs.define_many(jsonb_build_array(jsonb_build_object(
                'name', 'd', 'kind', 'k', 'schedule', '* * * * *',
                'payload', jsonb_build_object('x', repeat('a', 1100000)))))""",
        "payload",
        "max_payload_bytes",
    ),
    refused(
        """SELECT jobs.define_many('[{"name": "d", "kind": "k", "run_at": "10000-01-01T00:00:00Z"}]')""",
        "run_at",
        "9999-12-30",
    ),
    # jobs.run_now
    refused(f"SELECT jobs.run_now('defined', {DEEP_OBJECT})", "payload", "100 levels"),
    # jobs.backfill: a window the scheduler's driver could not compute in
    refused(
        "SELECT jobs.backfill('hourly', '4713-11-24 00:00+00 BC', '4713-11-25 00:00+00 BC')",
        "backfill from",
        "0001-01-02",
    ),
    # jobs.set_retry_policy
    refused(f"SELECT jobs.set_retry_policy('k', backoff_initial => '{HUGE}')", "backoff_initial", "366 days"),
    refused(f"SELECT jobs.set_retry_policy('k', backoff_max => '{HUGE}')", "backoff_max", "366 days"),
    refused("SELECT jobs.set_retry_policy('k', backoff_factor => 1e6)", "backoff_factor", "100"),
    refused("SELECT jobs.set_retry_policy('k', backoff_factor => 'NaN')", "backoff_factor", "100"),
    refused("SELECT jobs.set_retry_policy('k', jitter => 'Infinity')", "jitter", "between 0 and 1"),
    refused("SELECT jobs.set_retry_policy('k', max_attempts => 1001)", "max_attempts", "1000"),
    refused("SELECT jobs.set_retry_policy('k' || chr(127))", "kind", "control characters"),
    # jobs.set_limit, jobs.snooze, jobs.prune
    refused("SELECT jobs.set_limit('queue', 'q', max_running => 1000001)", "max_running", "1000000"),
    refused("SELECT jobs.set_limit('queue', 'q' || chr(10), max_running => 1)", "name", "control characters"),
    refused("SELECT jobs.pause_queue('q' || chr(10))", "name", "control characters"),
    refused(
        f"SELECT jobs.set_limit('queue', 'q', rate_limit => 1, rate_period => '{HUGE}')",
        "rate_period",
        "1 day",
    ),
    refused(
        "SELECT jobs.set_limit('queue', 'q', rate_limit => 1, rate_period => '100 microseconds')",
        "rate_period",
        "1 second",
    ),
    refused(
        "SELECT jobs.set_limit('queue', 'q', rate_limit => 1, rate_period => '999 milliseconds')",
        "rate_period",
        "1 second",
    ),
    refused(f"SELECT jobs.snooze(%(RUNNING)s, 'w1', '{HUGE}')", "delay", "365 days"),
    refused(f"SELECT jobs.prune('{HUGE}')", "older_than", "100 years"),
    # UPDATE jobs.config: the operator's writer, checked by its trigger
    refused(
        f"UPDATE jobs.config SET heartbeat_timeout = '{HUGE}'", "jobs.config.heartbeat_timeout", "366 days"
    ),
    refused(
        "UPDATE jobs.config SET heartbeat_timeout = '1 microsecond'",
        "jobs.config.heartbeat_timeout",
        "100 milliseconds",
    ),
    refused(f"UPDATE jobs.config SET orphan_timeout = '{HUGE}'", "jobs.config.orphan_timeout", "366 days"),
    refused(f"UPDATE jobs.config SET retention = '{HUGE}'", "jobs.config.retention", "100 years"),
    refused(f"UPDATE jobs.config SET backoff_initial = '{HUGE}'", "jobs.config.backoff_initial", "366 days"),
    refused(f"UPDATE jobs.config SET backoff_max = '{HUGE}'", "jobs.config.backoff_max", "366 days"),
    refused("UPDATE jobs.config SET max_attempts = 0", "jobs.config.max_attempts", "1000"),
    refused("UPDATE jobs.config SET max_payload_bytes = 1", "jobs.config.max_payload_bytes", "268435456"),
    refused(
        "UPDATE jobs.config SET heartbeat_timeout = NULL", "jobs.config.heartbeat_timeout must not be NULL"
    ),
    refused("UPDATE jobs.config SET max_attempts = NULL", "jobs.config.max_attempts must not be NULL"),
    refused(
        "UPDATE jobs.config SET require_claim_token = NULL", "jobs.config.require_claim_token must not be"
    ),
    # Without its one row, retries, reaping and the payload limit would find no setting
    refused("DELETE FROM jobs.config", "jobs.config", "cannot be emptied", "DELETE"),
    refused("TRUNCATE jobs.config", "jobs.config", "cannot be emptied", "TRUNCATE"),
    # The leader's materialization: each run time as a driver can hold it, whatever the cursors
    refused(
        "SELECT jobs.materialize((SELECT id FROM jobs.definitions WHERE name = 'hourly'), NULL,"
        " ARRAY['0100-01-01 00:00+00 BC'::timestamptz], NULL)",
        "run_times",
        "0001-01-02",
    ),
    refused(
        "SELECT jobs.materialize((SELECT id FROM jobs.definitions WHERE name = 'hourly'), NULL,"
        " ARRAY['294276-12-30 00:00+00'::timestamptz], '294276-12-31 00:00+00')",
        "new_next_run_at",
        "9999-12-30",
    ),
    refused(
        "SELECT jobs.materialize((SELECT id FROM jobs.definitions WHERE name = 'hourly'), NULL,"
        " ARRAY['infinity'::timestamptz], NULL)",
        "run_times",
    ),
    refused(
        "SELECT jobs.materialize((SELECT id FROM jobs.definitions WHERE name = 'hourly'), '2030-01-02',"
        " '{}', '2030-01-01')",
        "new_next_run_at",
        "must not be before expected_next_run_at",
    ),
    refused("SELECT jobs.jitter_offset(1, now(), '170000000 years')", "jitter", "1 day"),
    refused("SELECT jobs.jitter_offset(1, now(), '25 hours')", "jitter", "1 day"),
    # Nested 101 levels (the root object and 100 arrays): one more than a payload may
    refused(
        "SELECT jobs.enqueue('k', jsonb_build_object('a',"
        " (repeat('[', 100) || '1' || repeat(']', 100))::jsonb))",
        "payload",
        "100 levels",
    ),
    # Direct writes to the other tables: their CHECK constraints
    checked(f"UPDATE jobs.runs SET timeout = '{HUGE}'", "runs_timeout_check"),
    checked(f"UPDATE jobs.runs SET heartbeat_timeout = '{HUGE}'", "runs_heartbeat_timeout_check"),
    checked("UPDATE jobs.runs SET heartbeat_timeout = '1 ms'", "runs_heartbeat_timeout_check"),
    checked(f"UPDATE jobs.definitions SET timeout = '{HUGE}'", "definitions_timeout_check"),
    checked(
        f"UPDATE jobs.definitions SET heartbeat_timeout = '{HUGE}'", "definitions_heartbeat_timeout_check"
    ),
    checked(
        "UPDATE jobs.definitions SET max_concurrent_runs = 100001", "definitions_max_concurrent_runs_check"
    ),
    checked("UPDATE jobs.retry_policies SET backoff_factor = 'NaN'", "retry_policies_backoff_factor_check"),
    checked(
        f"UPDATE jobs.retry_policies SET backoff_initial = '{HUGE}'", "retry_policies_backoff_initial_check"
    ),
    checked(f"UPDATE jobs.retry_policies SET backoff_max = '{HUGE}'", "retry_policies_backoff_max_check"),
    checked(f"INSERT INTO jobs.runs (kind, timeout) VALUES ('k', '{HUGE}')", "runs_timeout_check"),
    # A run's own fields: their domains, under the names of the table constraints they replaced
    checked("UPDATE jobs.runs SET kind = ''", "jobs.run_kind", "runs_kind_check"),
    checked("INSERT INTO jobs.runs (kind) VALUES (repeat('k', 201))", "runs_kind_check"),
    checked("UPDATE jobs.runs SET payload = '[]'", "jobs.run_payload", "runs_payload_check"),
    checked("UPDATE jobs.runs SET attempt = 0", "runs_attempt_check"),
    checked("UPDATE jobs.runs SET max_attempts = 1001", "runs_max_attempts_check"),
    checked("UPDATE jobs.runs SET priority = -1001", "runs_priority_check"),
    checked("UPDATE jobs.runs SET origin = 'cron'", "runs_origin_check"),
    checked("UPDATE jobs.runs SET failure_reason = 'Oops'", "runs_failure_reason_check"),
    checked("UPDATE jobs.runs SET idempotency_key = ''", "runs_idempotency_key_check"),
    checked("UPDATE jobs.runs SET timeout = '500 milliseconds'", "runs_timeout_check"),
    checked("UPDATE jobs.runs SET queue = ''", "runs_queue_check"),
    checked("UPDATE jobs.runs SET concurrency_key = repeat('t', 201)", "runs_concurrency_key_check"),
    checked("UPDATE jobs.runs SET unique_key = ''", "runs_unique_key_check"),
    checked("INSERT INTO jobs.runs (kind, queue) VALUES ('k', '')", "runs_queue_check"),
    # Keys: not blank (only white space and control characters), as jobs._check_key says
    checked(
        "UPDATE jobs.runs SET idempotency_key = '   '",
        "jobs.run_idempotency_key",
        "runs_idempotency_key_not_blank",
    ),
    checked(
        "INSERT INTO jobs.runs (kind, idempotency_key) VALUES ('k', ' ' || chr(9) || chr(10))",
        "runs_idempotency_key_not_blank",
    ),
    checked(
        "UPDATE jobs.runs SET unique_key = U&'\\00A0\\3000'",
        "jobs.run_unique_key",
        "runs_unique_key_not_blank",
    ),
    checked("INSERT INTO jobs.runs (kind, unique_key) VALUES ('k', ' ')", "runs_unique_key_not_blank"),
    checked(
        "UPDATE jobs.runs SET concurrency_key = chr(10)",
        "jobs.run_concurrency_key",
        "runs_concurrency_key_not_blank",
    ),
    checked(
        "INSERT INTO jobs.runs (kind, concurrency_key) VALUES ('k', '  ')", "runs_concurrency_key_not_blank"
    ),
    checked("UPDATE jobs.definitions SET concurrency_key = ' '", "definitions_concurrency_key_not_blank"),
]


def _seed(conn: Conn) -> dict[str, Any]:
    """Definitions (one-shot, recurring), a retry policy and a RUNNING run for the writers to meet."""
    add_definition(conn, "defined")
    conn.execute("SELECT jobs.define('hourly', 'k', '0 * * * *')")
    conn.execute("SELECT jobs.set_retry_policy('k')")
    (running,) = add_runs(conn, 1)
    assert claim(conn, "w1") == [running]
    return {"RUNNING": running}


def _label(case: tuple[str, str, tuple[str, ...]]) -> str:
    return " ".join(case[0].split())[:80]


@pytest.mark.parametrize(("sql", "sqlstate", "mentions"), WRITERS, ids=[_label(c) for c in WRITERS])
def test_out_of_range_value_is_refused_by_name_and_range_and_changes_nothing(
    conn: Conn, sql: str, sqlstate: str, mentions: tuple[str, ...]
) -> None:
    ids = _seed(conn)
    before = digest(conn)
    expect_error(conn, sql % ids if "%(" in sql else sql, None, sqlstate, *mentions)
    assert digest(conn) == before, f"{sql}: changed the database"


def test_the_bounds_of_a_runs_own_fields_are_domains_not_table_constraints(conn: Conn) -> None:
    """Every UPDATE of jobs.runs (each claim, completion and heartbeat) reads and prepares all
    of the table's CHECK constraints again, whatever it changes; a domain is checked only where
    its column is written. So the table keeps only the rules that tie columns together."""
    single = conn.execute(
        "SELECT c.conname FROM pg_constraint AS c"
        " WHERE c.conrelid = 'jobs.runs'::regclass AND c.contype = 'c' AND cardinality(c.conkey) = 1"
        " ORDER BY 1"
    ).fetchall()
    assert single == [], f"single-column CHECK constraints on jobs.runs (make them domains): {single}"
    bounded = conn.execute(
        "SELECT a.attname, t.typname FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid"
        " WHERE a.attrelid = 'jobs.runs'::regclass AND t.typtype = 'd'"
        "   AND EXISTS (SELECT FROM pg_constraint AS c"
        "                WHERE c.contypid = t.oid AND c.conname = 'runs_' || a.attname || '_check')"
        " ORDER BY a.attnum"
    ).fetchall()
    assert len(bounded) == 14, f"columns of jobs.runs bounded by a domain of their own: {bounded}"


def test_the_final_statuses_are_the_ones_that_sort_after_running(conn: Conn) -> None:
    """runs_finished_have_time says "finished_at is set exactly when the status sorts after
    RUNNING" (short, so each UPDATE reads little back): a status added to jobs.run_status must
    keep that true, the final ones last."""
    after = conn.execute(
        "SELECT array_agg(s::text ORDER BY s) FROM unnest(enum_range(NULL::jobs.run_status)) AS s"
        " WHERE s > 'RUNNING'"
    ).fetchone()
    assert after == (["COMPLETED", "FAILED", "CANCELLED"],), f"statuses after RUNNING: {after}"
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_finished_have_time"):
        with conn.transaction():
            (run,) = add_runs(conn, 1)
            conn.execute("UPDATE jobs.runs SET finished_at = now() WHERE id = %s", (run,))


def test_config_check_constraints_hold_without_the_trigger(conn: Conn) -> None:
    """The trigger gives the readable 22023; the CHECK constraints hold even if it is disabled."""
    conn.execute("ALTER TABLE jobs.config DISABLE TRIGGER config_bounds")
    for column in ("heartbeat_timeout", "orphan_timeout", "retention", "backoff_initial", "backoff_max"):
        before = digest(conn)
        expect_error(
            conn, f"UPDATE jobs.config SET {column} = '{HUGE}'", None, CHECK, f"config_{column}_check"
        )
        assert digest(conn) == before


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT timeout FROM jobs.enqueue('k', timeout => '1 second')", "00:00:01"),
        ("SELECT timeout FROM jobs.enqueue('k', timeout => '366 days')", "366 days"),
        ("SELECT timeout FROM jobs.enqueue('k', timeout => '1 year')", "1 year"),
        ("SELECT heartbeat_timeout FROM jobs.enqueue('k', heartbeat_timeout => '100 ms')", "00:00:00.1"),
        ("SELECT backoff_initial FROM jobs.set_retry_policy('k', backoff_initial => '0')", "00:00:00"),
        ("SELECT (jobs.prune('0'))::text", "0"),
        (
            "SELECT payload->>'n' FROM jobs.enqueue('k', jsonb_build_object('n', 1, 'deep',"
            " (repeat('[', 98) || repeat(']', 98))::jsonb))",
            "1",
        ),
        (  # 100 levels: the root object and 99 arrays, the innermost holding a number
            "SELECT payload->>'n' FROM jobs.enqueue('k', jsonb_build_object('n', 1, 'deep',"
            " (repeat('[', 99) || '1' || repeat(']', 99))::jsonb))",
            "1",
        ),
        ("SELECT jobs.jitter_offset(1, now(), '1 day') < interval '1 day'", "true"),
    ],
)
def test_the_bounds_themselves_are_accepted(conn: Conn, sql: str, expected: str) -> None:
    assert str(scalar(conn, f"SELECT x::text FROM ({sql}) AS q (x)")) == expected


# -- upgrade ---------------------------------------------------------------------------------

# Rows a database could hold before the bounds existed, all accepted then.
ABSURD_ROWS = f"""
UPDATE jobs.config SET heartbeat_timeout = '{HUGE}', orphan_timeout = '1 microsecond',
       retention = '{HUGE}', backoff_initial = '{HUGE}', backoff_max = '{HUGE}';
INSERT INTO jobs.definitions (name, kind, run_at, enabled, timeout, heartbeat_timeout, max_concurrent_runs)
VALUES ('absurd', 'k', '2999-01-01', false, '{HUGE}', '1 microsecond', 2000000000);
INSERT INTO jobs.runs (kind, timeout, heartbeat_timeout) VALUES ('k', '{HUGE}', '{HUGE}');
INSERT INTO jobs.runs (kind, timeout) VALUES ('k', '1 microsecond');
INSERT INTO jobs.runs (kind) VALUES ('k');
INSERT INTO jobs.retry_policies (kind, backoff_initial, backoff_factor, backoff_max)
VALUES ('nan', '{HUGE}', 'NaN', '{HUGE}'), ('inf', '1 second', 'Infinity', '1 hour');
"""


def _schema_before_bounds(into: Path) -> Path:
    """sql/ and migrations/ as they were before migrations/0010_bounds.sql was added."""
    schema_before("0010_bounds.sql", into)
    (into / "migrations" / "0010_bounds.sql").unlink(missing_ok=True)
    install = into / "sql" / "install.sql"
    install.write_text(
        install.read_text().replace("\\set migration 0010_bounds \\ir ../migrations/apply.sql\n", "")
    )
    return install


def test_upgrade_clamps_rows_written_before_the_bounds_and_reap_then_works(
    pg: Server, tmp_path: Path
) -> None:
    """A database with absurd values from before the bounds upgrades without error: every
    value is clamped into its bounds (huge to the largest, tiny to the smallest, NaN factor to
    the default 2), and the reaper, which those values made fail, sweeps again."""
    database = pg.create_empty_database()
    try:
        installed = psql_file(database.dsn, _schema_before_bounds(tmp_path / "old"))
        assert installed.returncode == 0, installed.stderr
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            conn.execute(ABSURD_ROWS)
            migrate.apply(conn)
            config = conn.execute(
                "SELECT heartbeat_timeout::text, orphan_timeout::text, retention::text,"
                " backoff_initial::text, backoff_max::text FROM jobs.config"
            ).fetchone()
            definition = conn.execute(
                "SELECT timeout::text, heartbeat_timeout::text, max_concurrent_runs FROM jobs.definitions"
            ).fetchone()
            runs = conn.execute(
                "SELECT timeout::text, heartbeat_timeout::text FROM jobs.runs ORDER BY id"
            ).fetchall()
            policies = conn.execute(
                "SELECT kind, backoff_initial::text, backoff_factor, backoff_max::text"
                " FROM jobs.retry_policies ORDER BY kind"
            ).fetchall()
            # Runs claimed and gone silent are reaped (the huge heartbeat timeout was clamped).
            claimed = [r[0] for r in conn.execute("SELECT id FROM jobs.claim(10, 'w1', heartbeat => true)")]
            conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '400 days'")
            reaped = conn.execute("SELECT run_id, reason FROM jobs.reap() ORDER BY 1").fetchall()
    finally:
        pg.drop_database(database)

    assert config == ("366 days", "00:00:00.1", "100 years", "366 days", "366 days"), config
    assert definition == ("366 days", "00:00:00.1", 100000), definition
    assert runs == [("366 days", "366 days"), ("00:00:01", None), (None, None)], runs
    assert policies == [
        ("inf", "00:00:01", 100.0, "01:00:00"),
        ("nan", "366 days", 2.0, "366 days"),
    ], policies
    assert len(claimed) == 3 and sorted(r[0] for r in reaped) == sorted(claimed), (claimed, reaped)


# A plain value per argument type, and the extremes tried in each argument's place in turn.
PLAIN = {
    "text": "'x'",
    "integer": "1",
    "bigint": "1",
    "boolean": "false",
    "interval": "interval '1 second'",
    "timestamp with time zone": "now()",
    "jsonb": "'{}'::jsonb",
    "text[]": "'{x}'::text[]",
    "bigint[]": "'{1}'::bigint[]",
    "timestamp with time zone[]": "ARRAY[now()]",
}
EXTREMES = {
    "text": ["NULL", "''", "repeat('x', 100000)", "E'a\\x01b'"],
    "integer": ["NULL", "0", "-2147483648", "2147483647"],
    "bigint": ["NULL", "0", "-9223372036854775808", "9223372036854775807"],
    "boolean": ["NULL"],
    "interval": [
        "NULL",
        "interval '0'",
        "interval '-1 second'",
        "interval '178000000 years'",
        "interval '-178000000 years'",
    ],
    "timestamp with time zone": [
        "NULL",
        "'infinity'::timestamptz",
        "'-infinity'::timestamptz",
        "'4713-01-01 BC'::timestamptz",
        "'294276-12-31'::timestamptz",
    ],
    "jsonb": [
        "NULL",
        "'null'::jsonb",
        "'[]'::jsonb",
        "'1e308'::jsonb",
        "(repeat('[', 5000) || repeat(']', 5000))::jsonb",
    ],
    "text[]": [
        "NULL",
        "'{}'::text[]",
        "ARRAY[NULL]::text[]",
        "ARRAY[repeat('x', 100000)]",
        "array(SELECT 'k' || g FROM generate_series(1, 200000) AS g)",
    ],
    "bigint[]": [
        "NULL",
        "'{}'::bigint[]",
        "ARRAY[NULL]::bigint[]",
        "array(SELECT g FROM generate_series(1, 200000) AS g)",
    ],
}
# What a caller can act on: a bad argument, a NULL where none is allowed, nothing by that
# name, a duplicate, a state that does not allow it, not supported, not allowed.
CLEAR = {"22023", "22004", "P0002", "23505", "55000", "0A000", "42501"}


def test_every_public_function_answers_extreme_arguments_with_a_clear_error(conn: Conn) -> None:
    """Each public jobs.* function, called with each extreme value of its argument types in one
    argument's place (the others plain), either works or raises an error the caller can act on:
    never an overflow (22008, 22003), a negative LIMIT (2201W), a program limit or an internal
    error. Each call is rolled back."""
    functions = rows(
        conn,
        "SELECT p.oid::regprocedure::text AS signature, p.proname AS name,"
        "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) AS t) AS types"
        "  FROM pg_proc AS p"
        " WHERE p.pronamespace = 'jobs'::regnamespace AND p.proname !~ '^_' AND p.prokind = 'f'"
        "   AND p.prorettype <> 'trigger'::regtype AND p.proname <> 'resign'"
        " ORDER BY 1",
    )
    assert len(functions) > 50, f"the public API shrank? {len(functions)} functions"
    conn.execute("SET statement_timeout = '60s'")
    unclear: list[str] = []
    calls = 0
    for f in functions:
        plain = [PLAIN.get(t, "NULL") for t in f["types"]]
        for i, type_name in enumerate(f["types"]):
            for value in EXTREMES.get(type_name, []):
                args = [*plain[:i], value, *plain[i + 1 :]]
                calls += 1
                try:
                    with conn.transaction():
                        conn.execute(f"SELECT * FROM jobs.{f['name']}({', '.join(args)})").fetchall()
                        raise psycopg.Rollback()
                except psycopg.Error as exc:
                    if exc.sqlstate not in CLEAR:
                        first_line = str(exc).splitlines()[0][:200]
                        unclear.append(
                            f"{f['signature']} argument {i + 1} = {value[:50]}: {exc.sqlstate} {first_line}"
                        )
    assert calls > 500, f"only {calls} calls were tried"
    assert not unclear, f"{len(unclear)} of {calls} calls failed unclearly:\n" + "\n".join(unclear)
