"""jobs.new_definitions / jobs.due_definitions (the scheduler's rule for which definitions need
work) and jobs.run_list (what `pgtick runs` lists)."""

from __future__ import annotations

from sql_support import Conn, expect_error, scalar

from harness import Database


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
    ]


def test_a_negative_row_limit_is_refused(conn: Conn) -> None:
    expect_error(conn, "SELECT * FROM jobs.due_definitions(now(), -1)", None, "2201W")
    expect_error(conn, "SELECT * FROM jobs.new_definitions(-1)", None, "2201W")


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
