"""Leases (jobs.acquire_lease, jobs.renew_lease): how long a lease lasts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from harness import Conn, scalar, spring_forward_zone


@pytest.mark.parametrize("call", ["acquire", "renew"])
def test_a_lease_of_a_day_lasts_24_hours_whatever_the_sessions_time_zone(conn: Conn, call: str) -> None:
    """A lease taken or renewed for a day from a session set to a zone that springs forward
    within the day expires 24 hours later, as from a session in UTC, not 23 (a calendar day
    in that zone): another holder cannot take it an hour early."""
    zone = spring_forward_zone(conn, ahead=True)
    if call == "renew":
        assert scalar(conn, "SELECT jobs.acquire_lease('nightly', 'a', '1 minute')") is True
    with conn.transaction():
        conn.execute(f"SET LOCAL TIME ZONE '{zone}'")
        taken = scalar(conn, f"SELECT jobs.{call}_lease('nightly', 'a', '1 day')")
        lasts = scalar(conn, "SELECT expires_at - clock_timestamp() FROM jobs.leases WHERE name = 'nightly'")
    assert taken is True
    assert timedelta(hours=23, minutes=59) < lasts <= timedelta(hours=24), f"zone {zone}: lasts {lasts}"
