"""jobs.define_many: many definitions in one call, upserted by name, validated like jobs.define,
never half-applied."""

from __future__ import annotations

import json
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from harness import Conn, expect_error, one, rows, scalar


def _define_many(conn: Conn, defs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows(conn, "SELECT * FROM jobs.define_many(%s) ORDER BY name", (Jsonb(defs),))


def test_creates_then_updates_idempotently(conn: Conn) -> None:
    defs = [{"name": f"d{i:03}", "kind": "k", "schedule": "* * * * *"} for i in range(100)]
    first = _define_many(conn, defs)
    assert len(first) == 100 and all(r["created"] and not r["rescheduled"] for r in first)
    again = _define_many(conn, defs)
    assert [r["id"] for r in again] == [r["id"] for r in first]
    assert not any(r["created"] or r["rescheduled"] for r in again)
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 100
    assert scalar(conn, "SELECT count(DISTINCT revision) FROM jobs.definitions") == 1


def test_matches_what_define_stores(conn: Conn) -> None:
    params = {
        "kind": "report",
        "schedule": "FREQ=DAILY;BYHOUR=8",
        "timezone": "Europe/Sofia",
        "payload": {"to": "ops"},
        "max_concurrent_runs": 2,
        "priority": 5,
        "max_attempts": 3,
        "misfire_policy": "catch_up",
        "overlap_policy": "skip",
        "timeout": 90,
        "heartbeat_timeout": "2 minutes",
    }
    _define_many(conn, [{"name": "bulk", **params}])
    conn.execute(
        "SELECT jobs.define('single', 'report', schedule => 'FREQ=DAILY;BYHOUR=8',"
        " timezone => 'Europe/Sofia',"
        ' payload => \'{"to": "ops"}\', max_concurrent_runs => 2, priority => 5, max_attempts => 3,'
        " misfire_policy => 'catch_up', overlap_policy => 'skip', timeout => '90 s',"
        " heartbeat_timeout => '2 minutes')"
    )
    columns = (
        "kind, schedule, timezone, payload, enabled, max_concurrent_runs, priority, max_attempts,"
        " misfire_policy, overlap_policy, timeout, heartbeat_timeout, revision, next_run_at"
    )
    bulk = one(conn, f"SELECT {columns} FROM jobs.definitions WHERE name = 'bulk'")
    single = one(conn, f"SELECT {columns} FROM jobs.definitions WHERE name = 'single'")
    assert bulk == single


def test_a_changed_schedule_resets_the_cursor_and_drops_future_runs(conn: Conn) -> None:
    _define_many(
        conn,
        [
            {"name": "a", "kind": "k", "schedule": "* * * * *"},
            {"name": "b", "kind": "k", "schedule": "* * * * *"},
        ],
    )
    conn.execute("UPDATE jobs.definitions SET next_run_at = now() + interval '1 hour'")
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for)"
        " SELECT id, 'k', 'schedule', now() + interval '30 minutes' FROM jobs.definitions"
    )
    out = _define_many(
        conn,
        [
            {"name": "a", "kind": "k", "schedule": "*/5 * * * *"},
            {"name": "b", "kind": "k", "schedule": "* * * * *"},
        ],
    )
    assert [(r["name"], r["rescheduled"]) for r in out] == [("a", True), ("b", False)]
    state = rows(
        conn,
        "SELECT d.name, d.next_run_at IS NULL AS reset, r.status::text AS status FROM jobs.definitions AS d"
        " LEFT JOIN jobs.runs AS r ON r.definition_id = d.id ORDER BY d.name",
    )
    # a's never-started run is gone: its cursor restarts now and re-creates what the schedules share.
    assert state == [
        {"name": "a", "reset": True, "status": None},
        {"name": "b", "reset": False, "status": "QUEUED"},
    ]


def test_enabled_not_given_keeps_a_pause(conn: Conn) -> None:
    _define_many(conn, [{"name": "p", "kind": "k", "schedule": "* * * * *"}])
    conn.execute("SELECT jobs.pause('p')")
    _define_many(conn, [{"name": "p", "kind": "k2", "schedule": "* * * * *"}])
    assert one(conn, "SELECT kind, enabled FROM jobs.definitions") == {"kind": "k2", "enabled": False}
    _define_many(conn, [{"name": "p", "kind": "k2", "schedule": "* * * * *", "enabled": True}])
    assert scalar(conn, "SELECT enabled FROM jobs.definitions") is True


@pytest.mark.parametrize(
    ("bad", "mentions"),
    [
        ({"kind": "k", "schedule": "* * * * *"}, ["definitions[1]", "name"]),
        ({"name": "x", "schedule": "* * * * *"}, ["definitions[1]", "kind"]),
        ({"name": "x", "kind": "k"}, ["definitions[1]", "exactly one of schedule"]),
        ({"name": "x", "kind": "k", "schedule": "every day"}, ["definitions[1]", "schedule"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "timezone": "Mars/Base"}, ["timezone"]),
        ({"name": "x", "kind": "k", "run_at": "not a time"}, ["run_at"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "payload": [1]}, ["payload"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "priority": 5000}, ["priority"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "priority": 1.5}, ["priority"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "max_attempts": 0}, ["max_attempts"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "misfire_policy": "later"}, ["misfire_policy"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "overlap_policy": "x"}, ["overlap_policy"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "timeout": -1}, ["timeout"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "timeout": "soon"}, ["timeout"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "enabled": "yes"}, ["enabled"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "colour": "red"}, ["unknown field colour"]),
        ("x", ["definitions[1]", "object"]),
    ],
)
def test_bad_input_names_the_element_and_field_and_applies_nothing(
    conn: Conn, bad: Any, mentions: list[str]
) -> None:
    good = {"name": "fine", "kind": "k", "schedule": "* * * * *"}
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb([good, bad]),), "22023", *mentions)
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


def test_duplicate_names_and_non_arrays_are_refused(conn: Conn) -> None:
    d = {"name": "x", "kind": "k", "schedule": "* * * * *"}
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb([d, d]),), "22023", "more than once")
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb(d),), "22023", "array")
    expect_error(conn, "SELECT * FROM jobs.define_many(NULL)", None, "22023", "array")
    assert json.loads(json.dumps(rows(conn, "SELECT * FROM jobs.define_many('[]')"))) == []
