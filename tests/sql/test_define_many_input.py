"""What jobs.define_many reads from its JSON: a one-shot's run_at without a UTC offset is wall
time in the element's own timezone (UTC when it names none), as `pgtick define --run-at`,
the Python client and app.schedule read it: never in the calling session's TimeZone, which
differs between psql, a pooled connection and another language's driver."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from harness import Conn, digest, expect_error, scalar
from pgtick.client import read_time

#: Session zones far from Sofia and from each other: a time read in either would show.
SESSION_ZONES = ["America/Los_Angeles", "Pacific/Auckland"]
SOFIA = {"timezone": "Europe/Sofia"}
NEW_YORK = "America/New_York"


def utc(year: int, month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def _run_at(conn: Conn, element: dict[str, Any], session_zone: str) -> datetime:
    conn.execute("SELECT set_config('TimeZone', %s, false)", (session_zone,))
    conn.execute("SELECT jobs.define_many(%s)", (Jsonb([{"name": "once", "kind": "k", **element}]),))
    value = scalar(conn, "SELECT run_at FROM jobs.definitions WHERE name = 'once'")
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


@pytest.mark.parametrize("session_zone", SESSION_ZONES)
@pytest.mark.parametrize(
    ("element", "expected"),
    [
        # 18:00 EET
        ({"run_at": "2031-12-24T18:00:00", **SOFIA}, utc(2031, 12, 24, 16)),
        ({"run_at": "2031-12-24 18:00", **SOFIA}, utc(2031, 12, 24, 16)),
        ({"run_at": "2031-12-24", **SOFIA}, utc(2031, 12, 23, 22)),
        # no timezone: UTC, the element's zone when it names none
        ({"run_at": "2031-12-24T18:00:00"}, utc(2031, 12, 24, 18)),
        # an offset or Z: that instant, whatever the zones
        (
            {"run_at": "2031-12-24T18:00:00+05:00", **SOFIA},
            utc(2031, 12, 24, 13),
        ),
        ({"run_at": "2031-12-24T18:00:00Z", **SOFIA}, utc(2031, 12, 24, 18)),
        # the wall time the clocks skip: the offset before the gap (03:30 EET = 04:30 EEST);
        # the one they repeat: the first pass (03:30 EEST), as the driver reads them
        ({"run_at": "2031-03-30T03:30", **SOFIA}, utc(2031, 3, 30, 1, 30)),
        ({"run_at": "2031-10-26T03:30", **SOFIA}, utc(2031, 10, 26, 0, 30)),
        (
            {"run_at": "2031-11-02T01:30", "timezone": NEW_YORK},
            utc(2031, 11, 2, 5, 30),
        ),
    ],
    ids=["sofia-T", "sofia-space", "sofia-date", "utc-default", "offset", "z", "gap", "repeat", "repeat-ny"],
)
def test_a_run_at_without_offset_is_wall_time_in_the_elements_zone_whatever_the_session_zone(
    conn: Conn, element: dict[str, Any], expected: datetime, session_zone: str
) -> None:
    assert _run_at(conn, element, session_zone) == expected


def test_a_run_at_without_offset_is_read_as_the_driver_reads_it(conn: Conn) -> None:
    """Through psql and through `pgtick define --from-file` the same text is the same instant."""
    texts = ["2031-12-24T18:00:00", "2031-03-30T03:30", "2031-10-26T03:30", "2031-06-01T00:00"]
    for text in texts:
        for zone in ["Europe/Sofia", NEW_YORK, "Australia/Lord_Howe", "Asia/Kolkata"]:
            assert _run_at(conn, {"run_at": text, "timezone": zone}, "Pacific/Auckland") == read_time(
                text, zone
            ), (text, zone)


def test_a_run_at_without_offset_past_the_calendar_in_its_zone_is_refused_by_name(conn: Conn) -> None:
    """23:00 on 9999-12-31 in New York is in the year 10000 in UTC: refused, nothing applied."""
    before = digest(conn)
    expect_error(
        conn,
        "SELECT jobs.define_many(%s)",
        (
            Jsonb(
                [
                    {"name": "fine", "kind": "k", "run_at": "2031-01-01T00:00"},
                    {"name": "late", "kind": "k", "run_at": "9999-12-31T23:00", "timezone": NEW_YORK},
                ]
            ),
        ),
        "22023",
        "definitions[1] (late): run_at",
    )
    assert digest(conn) == before
