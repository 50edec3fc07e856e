"""TTL leases (sql/leases.sql): a lease lasts its ttl as elapsed time, whoever takes it."""

from __future__ import annotations

import calendar
from datetime import timedelta

from harness import Conn, add_runs, scalar


def springs_forward_within_a_day(conn: Conn) -> None:
    """Set the session's TimeZone to a zone (a POSIX rule) that springs forward an hour at the
    next midnight UTC, so that now() + interval '1 day' is 23 hours away."""
    tomorrow = scalar(conn, "SELECT (now() AT TIME ZONE 'UTC')::date + 1")
    day = tomorrow.timetuple().tm_yday - (1 if calendar.isleap(tomorrow.year) and tomorrow.month > 2 else 0)
    conn.execute(f"SET TimeZone = 'XST0XDT,J{day}/0,J{day % 365 + 1}/0'")
    gap = scalar(conn, "SELECT (now() + interval '1 day') - now()")
    assert gap == timedelta(hours=23), f"a day ahead is {gap}, not 23 hours"


def test_a_lease_lasts_its_ttl_in_elapsed_time_whatever_the_sessions_time_zone(conn: Conn) -> None:
    """A lease of '1 day' taken, or renewed, from a session whose TimeZone springs forward
    within the day expires 24 hours later, not 23: another owner cannot take it an hour early."""
    springs_forward_within_a_day(conn)
    assert scalar(conn, "SELECT jobs.acquire_lease('nightly', 'a', '1 day')")
    left = scalar(conn, "SELECT expires_at - clock_timestamp() FROM jobs.leases")
    assert timedelta(hours=23, minutes=59) < left <= timedelta(hours=24), f"acquired for {left}"
    assert scalar(conn, "SELECT jobs.renew_lease('nightly', 'a', '1 day')")
    left = scalar(conn, "SELECT expires_at - clock_timestamp() FROM jobs.leases")
    assert timedelta(hours=23, minutes=59) < left <= timedelta(hours=24), f"renewed for {left}"


def test_a_snoozed_run_waits_its_delay_in_elapsed_time_whatever_the_sessions_time_zone(conn: Conn) -> None:
    """jobs.snooze (sql/flow.sql) of '1 day' from such a session requeues the run 24 hours on."""
    (running,) = add_runs(conn, 1)
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(running,)]
    springs_forward_within_a_day(conn)
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w1', '1 day')", (running,))
    wait = scalar(conn, "SELECT scheduled_for - clock_timestamp() FROM jobs.runs WHERE id = %s", (running,))
    assert timedelta(hours=23, minutes=59) < wait <= timedelta(hours=24), f"snoozed for {wait}"
