"""Operator functions: jobs.cancel_queued, jobs.retry, jobs.prune, jobs.pause / jobs.resume,
and pruning by the leader's tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from harness import Conn, Database, claim, expect_error, one, rows, scalar

# -- jobs.cancel_queued --------------------------------------------------------------------


# -- jobs.retry ----------------------------------------------------------------------------


# -- jobs.prune ----------------------------------------------------------------------------


# -- jobs.pause / jobs.resume --------------------------------------------------------------


def test_pause_stops_materialization_and_resume_restarts_after_now(conn: Conn) -> None:
    def_id = int(scalar(conn, "SELECT id FROM jobs.define('hourly', 'k', schedule => 'FREQ=HOURLY')"))
    cursor = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    assert scalar(conn, "SELECT jobs.materialize(%s, NULL, '{}', %s)", (def_id, cursor)) == 0
    first = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
        (def_id, cursor, cursor, cursor + timedelta(hours=1)),
    )
    assert first == 1
    cursor += timedelta(hours=1)
    queued = scalar(conn, "SELECT id FROM jobs.runs WHERE definition_id = %s", (def_id,))

    paused = one(conn, "SELECT * FROM jobs.pause('hourly')")
    assert paused["enabled"] is False and paused["next_run_at"] == cursor
    assert scalar(conn, "SELECT paused FROM jobs.definition_health WHERE id = %s", (def_id,)) is True
    missed = scalar(
        conn,
        "SELECT jobs.materialize(%s, %s, ARRAY[%s]::timestamptz[], %s)",
        (def_id, cursor, cursor, cursor + timedelta(hours=1)),
    )
    assert missed == 0, "a paused definition materializes nothing"
    assert claim(conn, "w") == [queued], "runs queued before the pause still run"
    assert one(conn, "SELECT * FROM jobs.pause('hourly')")["enabled"] is False, "pausing twice is fine"

    revision = scalar(conn, "SELECT revision FROM jobs.definitions WHERE id = %s", (def_id,))
    resumed = one(conn, "SELECT * FROM jobs.resume('hourly')")
    assert resumed["enabled"] is True
    assert resumed["next_run_at"] is None, "the paused window is not caught up: the cursor restarts"
    assert resumed["revision"] == revision + 1, "a stale leader's compare-and-set now fails"
    again = one(conn, "SELECT * FROM jobs.resume('hourly')")
    assert (again["revision"], again["next_run_at"]) == (revision + 1, None), "resuming twice is a no-op"


def test_resume_keeps_a_one_shots_time(conn: Conn) -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    conn.execute("SELECT jobs.define('later', 'k', run_at => %s)", (at,))
    conn.execute("SELECT jobs.pause('later')")
    assert one(conn, "SELECT * FROM jobs.resume('later')")["next_run_at"] == at


def test_pause_and_resume_unknown_definition(conn: Conn) -> None:
    expect_error(conn, "SELECT jobs.pause('ghost')", None, "P0002", "ghost")
    expect_error(conn, "SELECT jobs.resume('ghost')", None, "P0002", "ghost")
    assert rows(conn, "SELECT * FROM jobs.definitions") == []


# jobs.new_definitions / jobs.due_definitions: the scheduler's rule for which definitions need work;
# jobs.run_list: what `pgtick runs` lists.


def _define(conn: Conn, name: str, schedule: str | None = "*/5 * * * *", **columns: object) -> int:
    cols = {"name": name, "kind": "k", "schedule": schedule, "timezone": "UTC", **columns}
    names = ", ".join(cols)
    marks = ", ".join(["%s"] * len(cols))
    return int(
        scalar(
            conn, f"INSERT INTO jobs.definitions ({names}) VALUES ({marks}) RETURNING id", list(cols.values())
        )
    )


def _names(conn: Conn, sql: str, params: tuple[object, ...]) -> list[str]:
    return [r[1] for r in conn.execute(sql, params).fetchall()]


def test_new_definitions_are_live_recurring_ones_without_a_cursor(conn: Conn) -> None:
    a = _define(conn, "a")
    _define(conn, "b")
    _define(conn, "paused", enabled=False)
    _define(conn, "broken", schedule_error="bad")
    _define(conn, "started", next_run_at="2030-01-01 00:00+00")
    _define(conn, "once", schedule=None, run_at="2030-01-01 00:00+00")
    assert _names(conn, "SELECT * FROM jobs.new_definitions(10)", ()) == ["a", "b"]
    assert _names(conn, "SELECT * FROM jobs.new_definitions(1)", ()) == ["a"]
    conn.execute("UPDATE jobs.definitions SET finished_at = now() WHERE id = %s", (a,))
    assert _names(conn, "SELECT * FROM jobs.new_definitions(10)", ()) == ["b"]


def test_due_definitions_are_those_within_the_horizon_earliest_first(conn: Conn) -> None:
    _define(conn, "late", next_run_at="2030-01-01 00:10+00")
    _define(conn, "early", next_run_at="2030-01-01 00:01+00")
    _define(conn, "beyond", next_run_at="2030-01-01 01:00+00")
    _define(conn, "unset")
    _define(conn, "paused", enabled=False, next_run_at="2030-01-01 00:00+00")
    _define(conn, "broken", schedule_error="bad", next_run_at="2030-01-01 00:00+00")
    horizon = "2030-01-01 00:10+00"
    assert _names(conn, "SELECT * FROM jobs.due_definitions(%s, 10)", (horizon,)) == ["early", "late"]
    assert _names(conn, "SELECT * FROM jobs.due_definitions(%s, 1)", (horizon,)) == ["early"]
    columns = [c.name for c in conn.execute("SELECT * FROM jobs.due_definitions(now(), 1)").description or []]
    assert columns == [
        "id",
        "name",
        "schedule",
        "timezone",
        "revision",
        "created_at",
        "next_run_at",
        "misfire_policy",
        "dst_gap",
        "dst_repeat",
        "cursor_from",
    ]


def test_a_negative_row_limit_is_refused_by_name(conn: Conn) -> None:
    expect_error(conn, "SELECT * FROM jobs.due_definitions(now(), -1)", None, "22023", "max_rows")
    expect_error(conn, "SELECT * FROM jobs.new_definitions(-1)", None, "22023", "max_rows")


def test_only_operators_may_ask_what_is_due(db: Database) -> None:
    for role, allowed in (("pgtick_t_worker", False), ("pgtick_t_operator", True)):
        with db.connect(user=role) as conn:
            for sql in (
                "SELECT count(*) FROM jobs.new_definitions(1)",
                "SELECT count(*) FROM jobs.due_definitions(now(), 1)",
            ):
                if allowed:
                    assert scalar(conn, sql) == 0
                else:
                    expect_error(conn, sql, None, "42501")


def test_run_list_names_the_definition_and_readers_may_select_it(db: Database, conn: Conn) -> None:
    d = _define(conn, "nightly")
    scheduled = scalar(
        conn,
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for) VALUES (%s, 'k', 'manual', now())"
        " RETURNING id",
        (d,),
    )
    adhoc = scalar(
        conn,
        "INSERT INTO jobs.runs (kind, origin, scheduled_for, error)"
        " VALUES ('k', 'manual', now(), repeat('x', 100)) RETURNING id",
    )
    with db.connect(user="pgtick_t_reader") as reader:
        rows = reader.execute(
            "SELECT id, definition, status, error FROM jobs.run_list ORDER BY id"
        ).fetchall()
    assert rows == [(scheduled, "nightly", "QUEUED", None), (adhoc, None, "QUEUED", "x" * 60)]


def test_zones_that_share_their_name_with_an_abbreviation_of_the_same_offset_are_taken(conn: Conn) -> None:
    """UTC, GMT, EST, MST and HST read the same as a zone and as an abbreviation (a fixed
    offset either way), so a definition may name them; the session's zone is left as it was."""
    before = scalar(conn, "SELECT current_setting('TimeZone')")
    for zone in ("UTC", "GMT", "EST", "MST", "HST", "Europe/Paris"):
        conn.execute("SELECT jobs.define(%s, 'k', '0 9 * * *', timezone => %s)", (f"d-{zone}", zone))
    assert scalar(conn, "SELECT current_setting('TimeZone')") == before


def test_the_one_shot_phase_reads_only_one_shots_however_many_schedules_are_behind(conn: Conn) -> None:
    """After downtime every recurring schedule's cursor has passed. The leader's one-shot phase
    still reads only the one-shot definitions, not each of those schedules at every tick."""
    conn.execute(
        "INSERT INTO jobs.definitions (name, kind, schedule, next_run_at)"
        " SELECT 'every-minute-' || i, 'k', '* * * * *', now() - interval '1 hour'"
        " FROM generate_series(1, 5000) AS i"
    )
    conn.execute("SELECT jobs.define('once', 'k', run_at => now() - interval '1 second')")
    conn.execute("ANALYZE jobs.definitions")

    def tuples_read() -> int:
        conn.execute("SELECT pg_stat_force_next_flush()")  # flushed when the session goes idle
        return int(
            scalar(
                conn,
                "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
                " FROM pg_stat_user_tables WHERE relid = 'jobs.definitions'::regclass",
            )
        )

    before = tuples_read()
    assert scalar(conn, "SELECT jobs.materialize_one_shots()") == 1
    read = tuples_read() - before
    assert 0 < read < 100, f"the one-shot phase read {read} definitions"
