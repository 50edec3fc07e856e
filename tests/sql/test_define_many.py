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


DEFINED_BOTH_WAYS = [
    pytest.param(
        {
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
        },
        " timezone => 'Europe/Sofia', payload => '{\"to\": \"ops\"}', max_concurrent_runs => 2,"
        " priority => 5, max_attempts => 3, misfire_policy => 'catch_up', overlap_policy => 'skip',"
        " timeout => '90 s', heartbeat_timeout => '2 minutes'",
        id="run-options",
    ),
    pytest.param(
        {
            "kind": "report",
            "schedule": "FREQ=DAILY;BYHOUR=2;BYMINUTE=30",
            "timezone": "Europe/Sofia",
            "dst_gap": "end",
            "dst_repeat": "second",
            "jitter": 30,
            "pause_after_failures": 4,
            "queue": "reports",
            "concurrency_key": "tenant-1",
        },
        " timezone => 'Europe/Sofia', dst_gap => 'end', dst_repeat => 'second', jitter => '30 s',"
        " pause_after_failures => 4, queue => 'reports', concurrency_key => 'tenant-1'",
        id="schedule-controls-and-flow",
    ),
    pytest.param(
        {
            "kind": "report",
            "schedule": "*/5 * * * *",
            "overlap_policy": "cancel_other",
            "jitter": "2 minutes",
        },
        " overlap_policy => 'cancel_other', jitter => '2 minutes'",
        id="overlap-one-at-a-time",
    ),
]
COLUMNS = (
    "kind, schedule, timezone, payload, enabled, max_concurrent_runs, priority, max_attempts,"
    " misfire_policy, overlap_policy, timeout, heartbeat_timeout, revision, next_run_at, dst_gap,"
    " dst_repeat, jitter, pause_after_failures, queue, concurrency_key"
)


@pytest.mark.parametrize(("fields", "arguments"), DEFINED_BOTH_WAYS)
def test_matches_what_define_stores(conn: Conn, fields: dict[str, Any], arguments: str) -> None:
    """Every field jobs.define takes, given to jobs.define_many, is stored as jobs.define stores
    it; declaring the same again changes nothing."""
    _define_many(conn, [{"name": "bulk", **fields}])
    conn.execute(
        f"SELECT jobs.define('single', %s, schedule => %s, {arguments.lstrip(' ,')})",
        (fields["kind"], fields["schedule"]),
    )
    bulk = one(conn, f"SELECT {COLUMNS} FROM jobs.definitions WHERE name = 'bulk'")
    single = one(conn, f"SELECT {COLUMNS} FROM jobs.definitions WHERE name = 'single'")
    assert bulk == single
    again = _define_many(conn, [{"name": "bulk", **fields}])
    assert not again[0]["rescheduled"], f"an identical re-declare rescheduled: {again}"
    assert one(conn, f"SELECT {COLUMNS} FROM jobs.definitions WHERE name = 'bulk'") == bulk


def test_a_json_null_field_means_not_given(conn: Conn) -> None:
    """null is the field's default, as a missing field is: priority 0, misfire coalesce, UTC."""
    nulls = {"priority": None, "misfire_policy": None, "timezone": None, "max_attempts": None}
    _define_many(conn, [{"name": "nulls", "kind": "k", "schedule": "* * * * *", **nulls}])
    _define_many(conn, [{"name": "absent", "kind": "k", "schedule": "* * * * *"}])
    columns = "priority, misfire_policy, timezone, max_attempts"
    assert one(conn, f"SELECT {columns} FROM jobs.definitions WHERE name = 'nulls'") == one(
        conn, f"SELECT {columns} FROM jobs.definitions WHERE name = 'absent'"
    )


def test_whole_numbers_written_as_decimals_are_taken_as_integers(conn: Conn) -> None:
    """JSON writes a number as it likes: 2.0, 10.00 and 1e1 are whole numbers, stored as
    integers, whatever serialized them (a YAML 2.0, a float in another language)."""
    numbers = json.loads(
        '{"max_concurrent_runs": 2.0, "priority": -0.0, "max_attempts": 1e1, "pause_after_failures": 3.000}'
    )
    _define_many(conn, [{"name": "decimals", "kind": "k", "schedule": "* * * * *", **numbers}])
    assert one(
        conn,
        "SELECT max_concurrent_runs, priority, max_attempts, pause_after_failures"
        " FROM jobs.definitions WHERE name = 'decimals'",
    ) == {"max_concurrent_runs": 2, "priority": 0, "max_attempts": 10, "pause_after_failures": 3}


def test_a_changed_dst_policy_reschedules(conn: Conn) -> None:
    """As jobs.define: a new DST policy means new occurrences, so the cursor restarts."""
    d = {"name": "n", "kind": "k", "schedule": "30 2 * * *", "timezone": "Europe/Sofia"}
    _define_many(conn, [d])
    out = _define_many(conn, [{**d, "dst_gap": "skip"}])
    assert out[0]["rescheduled"], f"a new dst_gap must reschedule: {out}"


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
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "dst_gap": "later"},
            ["dst_gap must be shift, end or skip"],
        ),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "dst_repeat": 2},
            ["dst_repeat must be a string"],
        ),
        (
            {"name": "x", "kind": "k", "run_at": "2030-01-01T00:00:00Z", "dst_repeat": "both"},
            ["dst_gap and dst_repeat"],
        ),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "jitter": "2 days"},
            ["jitter must be between 0 and 1 day"],
        ),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "jitter": -1},
            ["jitter must be between 0 and 1 day"],
        ),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "jitter": "soon"},
            ["jitter must be a number of seconds or an interval"],
        ),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "jitter": True},
            ["jitter must be a number of seconds"],
        ),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "pause_after_failures": 0},
            ["pause_after_failures must be an integer from 1 to 1000"],
        ),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "queue": ""}, ["queue must be"]),
        ({"name": "x", "kind": "k", "schedule": "* * * * *", "queue": ["a"]}, ["queue must be a string"]),
        (
            {"name": "x", "kind": "k", "schedule": "* * * * *", "concurrency_key": "k" * 201},
            ["concurrency_key is 201 characters"],
        ),
        ("x", ["definitions[1]", "object"]),
    ],
)
def test_bad_input_names_the_element_and_field_and_applies_nothing(
    conn: Conn, bad: Any, mentions: list[str]
) -> None:
    good = {"name": "fine", "kind": "k", "schedule": "* * * * *"}
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb([good, bad]),), "22023", *mentions)
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


@pytest.mark.parametrize(
    ("zone", "mentions"),
    [
        ("CET", ["definitions[3]", "'CET' is also the abbreviation"]),
        ("Mars/Base", ["definitions[3]", "'Mars/Base' is not a known"]),
        (5, ["definitions[3]", "timezone must be a string"]),
    ],
)
def test_a_bad_zone_is_named_in_a_batch_of_many_sharing_good_ones(
    conn: Conn, zone: Any, mentions: list[str]
) -> None:
    """Zones are checked once per batch, not once per element: an element with a bad zone
    among many with good ones (and one without, which is UTC) is still the one named."""
    defs = [
        {"name": f"d{i}", "kind": "k", "schedule": "* * * * *", "timezone": "Europe/Sofia"} for i in range(3)
    ]
    defs += [{"name": "bad", "kind": "k", "schedule": "* * * * *", "timezone": zone}]
    defs += [{"name": "utc", "kind": "k", "schedule": "* * * * *"}, {**defs[0], "name": "d9"}]
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb(defs),), "22023", *mentions)
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0
    del defs[3]
    assert len(_define_many(conn, defs)) == 5


def test_duplicate_names_and_non_arrays_are_refused(conn: Conn) -> None:
    d = {"name": "x", "kind": "k", "schedule": "* * * * *"}
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb([d, d]),), "22023", "more than once")
    expect_error(conn, "SELECT * FROM jobs.define_many(%s)", (Jsonb(d),), "22023", "array")
    expect_error(conn, "SELECT * FROM jobs.define_many(NULL)", None, "22023", "array")
    assert json.loads(json.dumps(rows(conn, "SELECT * FROM jobs.define_many('[]')"))) == []
