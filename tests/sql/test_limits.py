"""Limits per queue and kind (jobs.set_limit): max_running and rate limits, per
concurrency key with per_key, on ad-hoc runs as on scheduled ones, combined with a
definition's max_concurrent_runs. Single-session behaviour here, and changes of a limit
while a claim or a give-back is in progress in a second session; the invariants under many
concurrent claimers are in test_concurrency_limits.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from harness import (
    BlockedCall,
    Conn,
    Database,
    add_definition,
    add_runs,
    claim_after_a_wait,
    expect_error,
    scalar,
    spring_forward_zone,
    wait_for,
    waits_on_lock,
)


def _claim(conn: Conn, n: int = 10, worker: str = "w") -> list[int]:
    return [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(%s, %s)", (n, worker))]


def _runs(
    conn: Conn, n: int, *, kind: str = "k", queue: str = "default", key: str | None = None, priority: int = 0
) -> list[int]:
    rows = conn.execute(
        """
        INSERT INTO jobs.runs (kind, queue, concurrency_key, priority, scheduled_for)
        SELECT %s, %s, %s, %s, now() - interval '1 hour' + g * interval '1 ms'
          FROM generate_series(1, %s) AS g ORDER BY g RETURNING id
        """,
        (kind, queue, key, priority, n),
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


def test_queue_limit_caps_ad_hoc_runs(conn: Conn) -> None:
    """max_running 2 on a queue: claim(10) starts 2; each completion frees one slot."""
    ids = _runs(conn, 5, queue="q")
    conn.execute("SELECT jobs.set_limit('queue', 'q', max_running => 2)")
    first = _claim(conn)
    assert first == ids[:2], first
    assert _claim(conn) == []
    conn.execute("SELECT jobs.complete(%s, 'w')", (first[0],))
    assert _claim(conn) == ids[2:3]


def test_kind_limit_spans_queues(conn: Conn) -> None:
    _runs(conn, 3, kind="pdf", queue="a")
    _runs(conn, 3, kind="pdf", queue="b")
    other = _runs(conn, 2, kind="other", queue="a")
    conn.execute("SELECT jobs.set_limit('kind', 'pdf', max_running => 2)")
    got = _claim(conn)
    kinds = dict(
        conn.execute("SELECT kind, count(*) FROM jobs.runs WHERE status = 'RUNNING' GROUP BY 1").fetchall()
    )
    assert kinds == {"pdf": 2, "other": 2}, (got, kinds)
    assert set(other) <= set(got)


def test_per_key_limit_holds_for_each_key(conn: Conn) -> None:
    """per_key: one tenant with a long backlog ahead of everyone takes only its own slots;
    the oversample reaches the other tenants in the same claim."""
    _runs(conn, 30, queue="t", key="big", priority=10)
    for key in ("a", "b", "c"):
        _runs(conn, 3, queue="t", key=key)
    _runs(conn, 3, queue="t", key=None)
    conn.execute("SELECT jobs.set_limit('queue', 't', max_running => 1, per_key => true)")
    _claim(conn, 10)
    per_key = dict(
        conn.execute(
            "SELECT coalesce(concurrency_key, '<none>'), count(*)"
            " FROM jobs.runs WHERE status = 'RUNNING' GROUP BY 1"
        ).fetchall()
    )
    assert per_key == {"big": 1, "a": 1, "b": 1, "c": 1, "<none>": 1}, per_key


def _start_one_run_per_key(conn: Conn, kind: str) -> None:
    """Mark the first QUEUED run of each of the kind's concurrency keys RUNNING: every key at a
    max_running 1 limit, whatever the claim would have done to get there."""
    conn.execute(
        """
        UPDATE jobs.runs SET status = 'RUNNING', started_at = now(), worker = 'busy'
         WHERE id IN (SELECT min(id) FROM jobs.runs WHERE kind = %s AND status = 'QUEUED'
                       GROUP BY concurrency_key)
        """,
        (kind,),
    )


def _interleaved(conn: Conn, kind: str, keys: list[str], per_key: int) -> None:
    """``per_key`` runs of each key, the keys taking turns in claim order (due times rising)."""
    conn.execute(
        """
        INSERT INTO jobs.runs (kind, concurrency_key, scheduled_for)
        SELECT %s, (%s::text[])[1 + (g - 1) %% %s], now() - interval '1 hour' + g * interval '1 ms'
          FROM generate_series(1, %s) AS g ORDER BY g
        """,
        (kind, keys, len(keys), len(keys) * per_key),
    )


@pytest.mark.parametrize("batch", [1, 5])
def test_runs_with_room_start_behind_a_full_queue_and_a_full_definition(conn: Conn, batch: int) -> None:
    """A run starts once every group it belongs to has room, however many full groups sit
    ahead of it: a queue at max_running 1 with 200 runs waiting and a definition at
    max_concurrent_runs 1 with 60 waiting, both ahead in claim order, must not keep 5 runs
    of an unlimited queue behind them from starting. Claims of ``batch`` start one run of the
    queue, one of the definition and then every unlimited run, none coming back empty while
    one of those is QUEUED."""
    crowded = _runs(conn, 200, queue="qa", priority=3)
    conn.execute("SELECT jobs.set_limit('queue', 'qa', max_running => 1)")
    def_id = add_definition(conn, "capped", cap=1)
    capped = add_runs(conn, 60, kind="capped", definition_id=def_id, priority=2)
    free = _runs(conn, 5, queue="free", priority=1)
    started: list[int] = []
    claims: list[list[int]] = []
    while not set(free) <= set(started) and len(claims) < 10:
        got = _claim(conn, batch)
        claims.append(got)
        started.extend(got)
        if not got:
            break
    assert set(free) <= set(started), (
        f"claims of {batch} ({claims}) left unlimited runs {sorted(set(free) - set(started))}"
        " QUEUED behind the full queue and definition"
    )
    assert sorted(started) == sorted([crowded[0], capped[0], *free]), claims
    assert _claim(conn, batch) == [], "the queue and the definition are still at their limits"


@pytest.mark.parametrize("batch", [1, 10])
def test_a_tenant_with_room_starts_behind_tenants_taking_turns_at_their_limit(conn: Conn, batch: int) -> None:
    """per_key max_running 1: tenants A and B take turns in a backlog of 100 runs, each with a
    run RUNNING already; tenant C's 5 runs wait behind them. A claim of ``batch`` must start
    one of C's runs (C has room), and then nothing more."""
    _interleaved(conn, "il", ["A", "B"], 50)
    _start_one_run_per_key(conn, "il")
    c_runs = _runs(conn, 5, kind="il", key="C")
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = ANY (%s)", (c_runs,))
    conn.execute("SELECT jobs.set_limit('kind', 'il', max_running => 1, per_key => true)")
    got = _claim(conn, batch)
    assert got == c_runs[:1], f"claim({batch}) started {got}; tenant C's first run is {c_runs[0]}"
    assert _claim(conn, batch) == []


def test_a_tenant_with_room_starts_behind_many_tenants_at_their_limit(conn: Conn) -> None:
    """per_key max_running 1, 40 tenants taking turns in a backlog of 800 runs, each tenant
    with a run RUNNING: claim(1) must reach the 41st tenant's run behind them all."""
    tenants = [f"t{i:02}" for i in range(40)]
    _interleaved(conn, "many", tenants, 20)
    _start_one_run_per_key(conn, "many")
    last = _runs(conn, 2, kind="many", key="last")
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() WHERE id = ANY (%s)", (last,))
    conn.execute("SELECT jobs.set_limit('kind', 'many', max_running => 1, per_key => true)")
    assert _claim(conn, 1) == last[:1]
    assert _claim(conn, 1) == []


@pytest.mark.parametrize("batch", [1, 3])
def test_a_tenant_with_room_starts_behind_two_tenants_backlogs(conn: Conn, batch: int) -> None:
    """per_key max_running 2: tenant A's 500 runs, then B's 100, then C's 10, in claim order.
    Claims of ``batch`` start two runs of each tenant, C's included, and then nothing."""
    for key, n in (("A", 500), ("B", 100), ("C", 10)):
        conn.execute(
            """
            INSERT INTO jobs.runs (kind, concurrency_key, scheduled_for)
            SELECT 'pk', %s, clock_timestamp() - interval '1 hour' FROM generate_series(1, %s)
            """,
            (key, n),
        )
    conn.execute("SELECT jobs.set_limit('kind', 'pk', max_running => 2, per_key => true)")
    claims = [_claim(conn, batch) for _ in range(6)]
    assert _running_per_key(conn) == {"A": 2, "B": 2, "C": 2}, claims
    assert _claim(conn, batch) == []


def test_definition_cap_combines_with_queue_limit(conn: Conn) -> None:
    """A run starts only when every group it belongs to has room: definition cap 3 and
    queue limit 2 give 2; lifting the queue limit gives the third."""
    def_id = add_definition(conn, "capped", cap=3)
    add_runs(conn, 6, kind="capped", definition_id=def_id)
    conn.execute("UPDATE jobs.runs SET queue = 'dq' WHERE definition_id = %s", (def_id,))
    conn.execute("SELECT jobs.set_limit('queue', 'dq', max_running => 2)")
    assert len(_claim(conn)) == 2
    conn.execute("SELECT jobs.remove_limit('queue', 'dq')")
    assert len(_claim(conn)) == 1
    assert _claim(conn) == []


def test_limits_of_queue_and_kind_both_apply(conn: Conn) -> None:
    _runs(conn, 5, kind="k1", queue="q1")
    conn.execute("SELECT jobs.set_limit('queue', 'q1', max_running => 4)")
    conn.execute("SELECT jobs.set_limit('kind', 'k1', max_running => 1)")
    assert len(_claim(conn)) == 1


def test_rate_limit_counts_starts_in_the_trailing_window(conn: Conn) -> None:
    """rate_limit 3 per hour: 3 start, then nothing even after they complete (the starts are
    still in the window); starts older than the window no longer count."""
    ids = _runs(conn, 6, queue="r")
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 3, rate_period => '1 hour')")
    first = _claim(conn)
    assert first == ids[:3]
    conn.execute("SELECT jobs.complete_many(%s, 'w')", (first,))
    assert _claim(conn) == []
    # Age the recorded starts past the window (as if two hours had gone by).
    conn.execute("UPDATE jobs._rate_starts SET started_at = started_at - interval '2 hours'")
    assert _claim(conn) == ids[3:6]
    assert scalar(conn, "SELECT sum(starts) FROM jobs._rate_starts") == 3, "expired starts are dropped"


def test_a_day_long_rate_window_is_24_hours_whatever_the_claimers_time_zone(conn: Conn) -> None:
    """2 a day: two start, and 23 hours 30 minutes later the window still holds them for
    every claimer. In a session whose zone sprang forward during that day, now() - interval
    '1 day' is only 23 hours back: read that way, the claim found the window empty (and
    dropped the two starts from it) and started two more within 24 hours."""
    ids = _runs(conn, 4, queue="r")
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 2, rate_period => '1 day')")
    assert _claim(conn) == ids[:2]
    conn.execute("UPDATE jobs._rate_starts SET started_at = started_at - interval '23 hours 30 minutes'")
    conn.execute(
        "UPDATE jobs.runs SET started_at = started_at - interval '23 hours 30 minutes'"
        " WHERE started_at IS NOT NULL"
    )
    zone = spring_forward_zone(conn)
    conn.execute(f"SET TIME ZONE '{zone}'")
    started = _claim(conn)
    conn.execute("SET TIME ZONE 'UTC'")
    assert started == [], f"zone {zone}: started {started}, the day's 2 starts were already taken"
    assert scalar(conn, "SELECT sum(starts) FROM jobs._rate_starts") == 2, "the day's starts are kept"


def test_rate_limit_per_key(conn: Conn) -> None:
    _runs(conn, 4, kind="api", key="acme")
    _runs(conn, 4, kind="api", key="globex")
    conn.execute(
        "SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '1 hour', per_key => true)"
    )
    _claim(conn)
    per_key = dict(
        conn.execute("SELECT concurrency_key, count(*) FROM jobs.runs WHERE status = 'RUNNING' GROUP BY 1")
    )
    assert per_key == {"acme": 2, "globex": 2}, per_key


def _running_per_key(conn: Conn) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT coalesce(concurrency_key, '<none>'), count(*) FROM jobs.runs"
            " WHERE started_at IS NOT NULL GROUP BY 1"
        ).fetchall()
    )


def test_rate_limit_turned_per_key_counts_each_keys_past_starts(conn: Conn) -> None:
    """2 an hour for the kind, then per key: the key that took the kind's two starts has no
    room left in its own window, and the other key gets its own two."""
    _runs(conn, 4, kind="api", key="acme")
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '1 hour')")
    assert len(_claim(conn)) == 2
    _runs(conn, 4, kind="api", key="globex")
    conn.execute(
        "SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '1 hour', per_key => true)"
    )
    _claim(conn)
    _claim(conn)
    assert _running_per_key(conn) == {"acme": 2, "globex": 2}


def test_rate_limit_turned_global_counts_every_keys_past_starts(conn: Conn) -> None:
    """2 an hour per key, four started over two keys, then 3 an hour for the whole kind: the
    kind's window already holds four starts, so nothing more starts."""
    _runs(conn, 4, kind="api", key="acme")
    _runs(conn, 4, kind="api", key="globex")
    conn.execute(
        "SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '1 hour', per_key => true)"
    )
    assert len(_claim(conn)) == 4
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 3, rate_period => '1 hour')")
    assert _claim(conn) == []
    assert _running_per_key(conn) == {"acme": 2, "globex": 2}
    assert scalar(conn, 'SELECT sum(starts) FROM jobs._rate_starts WHERE label = \'["kind", "api"]\'') == 4


def test_rate_limit_with_a_longer_period_counts_the_older_starts(conn: Conn) -> None:
    """2 a minute: two start, then (their starts aged five minutes) two more. Widened to 2 an
    hour, the window holds all four, including the two whose rows the minute had dropped."""
    ids = _runs(conn, 6, queue="r")
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 2, rate_period => '1 minute')")
    assert _claim(conn) == ids[:2]
    conn.execute(
        "UPDATE jobs.runs SET started_at = started_at - interval '5 minutes' WHERE started_at IS NOT NULL"
    )
    conn.execute("UPDATE jobs._rate_starts SET started_at = started_at - interval '5 minutes'")
    assert _claim(conn) == ids[2:4]
    assert scalar(conn, "SELECT sum(starts) FROM jobs._rate_starts") == 2, "the minute dropped the older rows"
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 2, rate_period => '1 hour')")
    assert _claim(conn) == []
    # A new rate within the same period keeps the recorded starts.
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 5, rate_period => '1 hour')")
    assert _claim(conn) == ids[4:5]


def test_new_rate_limit_counts_the_starts_before_it(conn: Conn) -> None:
    """Three runs started three hours ago with no limit, completed and archived to history: a
    rate limit of 3 a day set afterwards has no room, and one of 4 a day has room for one."""
    ids = _runs(conn, 5, queue="r")
    started = _claim(conn, 3)
    conn.execute("SELECT jobs.complete_many(%s, 'w')", (started,))
    conn.execute(
        "UPDATE jobs.runs SET started_at = now() - interval '3 hours',"
        " finished_at = now() - interval '2 hours' WHERE id = ANY (%s)",
        (started,),
    )
    conn.execute("UPDATE jobs.config SET archive_after = interval '1 hour'")
    conn.execute("SELECT jobs.archive()")
    assert scalar(conn, "SELECT count(*) FROM jobs.run_history") == 3
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 3, rate_period => '1 day')")
    assert _claim(conn) == []
    conn.execute("SELECT jobs.set_limit('queue', 'r', rate_limit => 4, rate_period => '1 day')")
    assert _claim(conn) == ids[3:4]
    # An hour's window does not reach them.
    conn.execute(
        "SELECT jobs.set_limit('queue', 'r', rate_limit => 1, rate_period => '1 hour', per_key => true)"
    )
    assert scalar(conn, "SELECT sum(starts) FROM jobs._rate_starts") == 1


def test_no_limits_means_no_cap(conn: Conn) -> None:
    _runs(conn, 12, queue="free")
    assert len(_claim(conn, 12)) == 12


def test_set_limit_replaces_and_remove_limit_removes(conn: Conn) -> None:
    row = conn.execute(
        "SELECT scope, name, max_running, per_key FROM jobs.set_limit('kind', 'x', max_running => 1)"
    ).fetchone()
    assert row == ("kind", "x", 1, False)
    row = conn.execute(
        "SELECT max_running, rate_limit, rate_period::text"
        " FROM jobs.set_limit('kind', 'x', rate_limit => 5, rate_period => '1 minute')"
    ).fetchone()
    assert row == (None, 5, "00:01:00")
    assert scalar(conn, "SELECT count(*) FROM jobs.limits") == 1
    assert scalar(conn, "SELECT jobs.remove_limit('kind', 'x')") is True
    assert scalar(conn, "SELECT jobs.remove_limit('kind', 'x')") is False


def test_set_limit_refuses_a_rate_period_under_one_second_and_keeps_the_limit(conn: Conn) -> None:
    """A rate window shorter than a claim's own transaction counts almost none of its starts:
    100 per 100 microseconds would be no limit at all. Periods from 1 second to 1 day pass;
    a refused change leaves the limit as it was."""
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 5, rate_period => '1 minute')")
    for period in ("100 microseconds", "1 millisecond", "0.5 seconds", "999999 microseconds"):
        expect_error(
            conn,
            "SELECT jobs.set_limit('kind', 'api', rate_limit => 100, rate_period => %s)",
            (period,),
            "22023",
            "rate_period",
            "1 second",
        )
    row = conn.execute("SELECT rate_limit, rate_period::text FROM jobs.limits WHERE name = 'api'").fetchone()
    assert row == (5, "00:01:00"), row
    # Kept as elapsed time: a day is 24 hours for every claimer, whatever its TimeZone.
    for period, shown in (("1 second", "00:00:01"), ("1.5 seconds", "00:00:01.5"), ("1 day", "24:00:00")):
        row = conn.execute(
            "SELECT rate_period::text FROM jobs.set_limit('kind', 'api', rate_limit => 1, rate_period => %s)",
            (period,),
        ).fetchone()
        assert row == (shown,), (period, row)


def test_a_rate_period_with_a_day_field_is_refused_by_the_table(conn: Conn) -> None:
    """A row written into jobs.limits directly keeps the period as elapsed time too: a day field
    (which now() - rate_period would step back in the claiming session's TimeZone, 23 or 25
    hours across a DST change) is refused with 23514 naming the rule, and nothing is stored;
    the same length in hours is taken."""
    for period in ("1 day", "1 month -29 days", "2 days -30 hours"):
        with pytest.raises(psycopg.errors.CheckViolation, match="limits_rate_period_elapsed"):
            conn.execute(
                "INSERT INTO jobs.limits (scope, name, rate_limit, rate_period)"
                " VALUES ('kind', 'api', 2, %s)",
                (period,),
            )
    assert scalar(conn, "SELECT count(*) FROM jobs.limits") == 0
    conn.execute(
        "INSERT INTO jobs.limits (scope, name, rate_limit, rate_period) VALUES ('kind', 'api', 2, '24:00:00')"
    )
    assert scalar(conn, "SELECT rate_period::text FROM jobs.limits") == "24:00:00"


def test_a_rate_period_under_one_second_is_refused_by_the_table_too(conn: Conn) -> None:
    """A row written into jobs.limits directly meets the same bound as jobs.set_limit: 23514
    naming the constraint, nothing stored."""
    with pytest.raises(psycopg.errors.CheckViolation, match="limits_rate_period_check"):
        conn.execute(
            "INSERT INTO jobs.limits (scope, name, rate_limit, rate_period)"
            " VALUES ('kind', 'api', 2, '1 millisecond')"
        )
    assert conn.execute("SELECT count(*) FROM jobs.limits").fetchone() == (0,)


def test_queue_stats_shows_limits_pause_blocked_and_rate_limited(conn: Conn) -> None:
    """New columns come after the old ones, so a reader of the old columns is unaffected."""
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute"
            " WHERE attrelid = 'jobs.queue_stats'::regclass AND attnum > 0 ORDER BY attnum"
        )
    ]
    old = [
        "kind",
        "queued",
        "scheduled",
        "running",
        "completed_1h",
        "failed_1h",
        "cancelled_1h",
        "oldest_queued_age",
        "skipped_1h",
        "lost_1h",
    ]
    assert cols[: len(old)] == old, cols
    _runs(conn, 4, kind="api", queue="ext")
    conn.execute("SELECT jobs.set_limit('queue', 'ext', rate_limit => 1, rate_period => '1 hour')")
    conn.execute("SELECT jobs.set_limit('kind', 'api', max_running => 5)")
    _claim(conn)
    dep = int(scalar(conn, "SELECT id FROM jobs.runs WHERE status = 'RUNNING'"))
    conn.execute("SELECT jobs.enqueue('api', queue => 'ext', depends_on => ARRAY[%s]::bigint[])", (dep,))
    conn.execute("SELECT jobs.pause_queue('ext')")
    row = conn.execute(
        "SELECT queue, paused, queued, running, blocked, rate_limited, kind_max_running, queue_rate"
        " FROM jobs.queue_stats WHERE kind = 'api'"
    ).fetchone()
    assert row == ("ext", True, 3, 1, 1, 3, 5, "1 per 01:00:00"), row


def test_roomy_limit_with_every_stripe_held_starts_none_of_its_runs(db: Database, conn: Conn) -> None:
    """A roomy limit (shared dispatch lock) is started from by at most 16 claimers at once:
    each holds one of the group's 16 stripe locks. With all 16 held elsewhere, a claim starts
    nothing of that group, at once (stripes are never waited for), and still starts other
    runs; once they are released it starts the group's runs again."""
    big = _runs(conn, 5, queue="big")
    other = _runs(conn, 2, queue="other")
    conn.execute("SELECT jobs.set_limit('queue', 'big', max_running => 500)")
    label = '["queue", "big"]'
    with db.connect(autocommit=False) as holder:
        holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('dispatch:' || %s || '#' || s, 0))"
            "  FROM generate_series(0, 15) AS s",
            (label,),
        )
        got = _claim(conn)
        assert got == other, f"claimed {got} with every stripe of the 'big' group held; expected only {other}"
        holder.rollback()
    got = _claim(conn)
    assert got == big, f"claimed {got} after the stripes were released; expected {big}"


def test_a_claim_near_a_roomy_limit_starts_only_up_to_it(conn: Conn) -> None:
    """A roomy limit (500 RUNNING) lets a claim start its whole pool while the group has room
    for it with 16 claimers at once; nearer the limit the claim counts exactly and stops at
    the limit, then starts again as runs finish."""
    ids = _runs(conn, 520, queue="big")
    conn.execute("SELECT jobs.set_limit('queue', 'big', max_running => 500)")
    started: list[int] = []
    for _ in range(33):
        started += _claim(conn, 15, "a")
    assert started == ids[:495], f"started {len(started)} runs, expected the first 495"
    assert _claim(conn, 10, "b") == ids[495:500]
    assert _claim(conn, 10, "b") == []
    conn.execute("SELECT jobs.complete_many(%s, 'a')", (ids[:3],))
    assert _claim(conn, 10, "b") == ids[500:503]


def test_a_roomy_limit_keeps_the_claims_filters_and_pauses(conn: Conn) -> None:
    """With only roomy limits defined, a claim still takes only the queues and kinds asked
    for, and nothing from a paused queue."""
    big = _runs(conn, 3, queue="big", kind="x")
    other = _runs(conn, 3, queue="other", kind="y")
    conn.execute("SELECT jobs.set_limit('queue', 'big', max_running => 1000)")
    conn.execute("SELECT jobs.set_limit('kind', 'y', max_running => 1000, per_key => true)")
    conn.execute("SELECT jobs.pause_queue('big')")
    assert _claim(conn) == other
    conn.execute("SELECT jobs.resume_queue('big')")
    more = _runs(conn, 2, queue="other", kind="y")
    got = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w', kinds => ARRAY['x'])")]
    assert got == big
    got = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w', queues => ARRAY['other'])")]
    assert got == more


def test_tight_limits_are_the_limits_the_claim_locks_exclusively(db: Database) -> None:
    """jobs.tight_limits lists a limit exactly when jobs.claim, starting a run under it, takes
    its dispatch lock exclusively (pg_locks shows no shared advisory lock then); a roomy limit
    (500 or more running, and a rate of 500 or more if any) it locks shared."""
    shapes = {
        "running-499": (499, None),
        "running-500": (500, None),
        "rate-499": (None, 499),
        "rate-500": (None, 500),
        "running-1000-rate-499": (1000, 499),
        "running-1000-rate-600": (1000, 600),
        "running-499-rate-600": (499, 600),
    }
    locked_shared = {}
    for name, (running, rate) in shapes.items():
        with db.connect() as conn:
            conn.execute("DELETE FROM jobs.limits")
            conn.execute(
                "SELECT jobs.set_limit('queue', %s, max_running => %s, rate_limit => %s,"
                " rate_period => CASE WHEN %s::int IS NOT NULL THEN interval '1 hour' END)",
                (name, running, rate, rate),
            )
            run = _runs(conn, 1, queue=name)
            tight = [tuple(r) for r in conn.execute("SELECT scope, name FROM jobs.tight_limits")]
            with conn.transaction():
                assert _claim(conn, 1) == run, f"{name}: the claim did not start its run"
                locked_shared[name] = scalar(
                    conn,
                    "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid()"
                    " AND locktype = 'advisory' AND mode = 'ShareLock' AND granted"
                    # not the worker's own claim lock nor the claiming lock: every claim holds those shared
                    " AND ((classid::bigint << 32) | objid::bigint)"
                    " NOT IN (jobs._claim_key('w'), jobs._claiming_key()))",
                )
        assert tight == ([] if locked_shared[name] else [("queue", name)]), (
            f"{name}: the claim locked the limit {'shared' if locked_shared[name] else 'exclusively'},"
            f" jobs.tight_limits lists {tight}"
        )
    assert locked_shared == {
        "running-499": False,
        "running-500": True,
        "rate-499": False,
        "rate-500": True,
        "running-1000-rate-499": False,
        "running-1000-rate-600": True,
        "running-499-rate-600": False,
    }, locked_shared


# ---------------------------------------------------------------------------
# Changing a rate limit's window: the starts it counts
# ---------------------------------------------------------------------------


def _snooze_running(conn: Conn, worker: str = "w") -> None:
    conn.execute(
        "SELECT jobs.snooze(id, %s, interval '0 seconds')"
        "  FROM jobs.runs WHERE status = 'RUNNING' ORDER BY id",
        (worker,),
    )


def test_a_longer_period_still_counts_the_starts_of_runs_snoozed_since(conn: Conn) -> None:
    """2 starts per 10 minutes: two runs start, then snooze (which clears their started_at).
    The window is full, and stays full when the period grows to 20 minutes: the recount keeps
    the starts recorded, whatever happened to the runs since."""
    _runs(conn, 4, kind="api")
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '10 minutes')")
    assert len(_claim(conn)) == 2
    _snooze_running(conn)
    assert _claim(conn) == [], "the window holds two starts"
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '20 minutes')")
    got = _claim(conn)
    assert got == [], f"claimed {got}: the longer window forgot the starts of the runs snoozed since"


def test_a_rate_limit_turned_per_key_counts_snoozed_starts_for_their_key_only(conn: Conn) -> None:
    """2 starts per 10 minutes for the kind; both go to key a, and both runs snooze. Turned per
    key, key a's window holds its two starts (no run's started_at says so any more) and key b,
    whose runs never started, still gets its two."""
    a = _runs(conn, 2, kind="api", key="a")
    b = _runs(conn, 2, kind="api", key="b")
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '10 minutes')")
    assert _claim(conn) == a
    _snooze_running(conn)
    conn.execute(
        "SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '10 minutes', per_key => true)"
    )
    got = _claim(conn)
    assert got == b, f"claimed {got}; expected only key b's runs {b} (key a's window is full)"


def test_a_rate_limit_turned_global_counts_the_snoozed_starts_of_every_key(conn: Conn) -> None:
    """2 starts per 10 minutes per key; key a starts two, which snooze. Turned into 3 per 10
    minutes for the whole kind, the window holds those two: one more run starts."""
    _runs(conn, 2, kind="api", key="a")
    _runs(conn, 2, kind="api", key="b")
    conn.execute(
        "SELECT jobs.set_limit('kind', 'api', rate_limit => 2, rate_period => '10 minutes', per_key => true)"
    )
    assert len(_claim(conn, 2)) == 2
    _snooze_running(conn)
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 3, rate_period => '10 minutes')")
    got = _claim(conn)
    assert len(got) == 1, f"claimed {got}: the kind's window holds 2 starts of 3"


# ---------------------------------------------------------------------------
# Changing a limit while claims are in progress (two sessions)
# ---------------------------------------------------------------------------


def _change_during_claim(
    db: Database, conn: Conn, before: str, after: str, *, batch: int, key: str | None = "t1"
) -> tuple[list[int], list[int]]:
    """Limit ``before`` on kind 'api' (10 runs of ``key``); a claim of ``batch`` in another
    session, not committed yet; then set_limit(``after``), which must wait for that claim to
    commit; then a claim after the change. Returns (runs of the first claim, of the second)."""
    conn.execute(f"SELECT jobs.set_limit('kind', 'api', {before})")
    _runs(conn, 10, kind="api", key=key)
    with db.connect(autocommit=False) as first, db.connect() as changer:
        held = _claim(first, batch, "wa")
        change = BlockedCall(
            conn,
            changer,
            lambda: changer.execute(f"SELECT jobs.set_limit('kind', 'api', {after})").fetchall(),
            "set_limit to wait for the claim in progress",
        )
        first.commit()
        outcome = change.join(30)
        assert outcome and not isinstance(outcome[0], psycopg.Error), f"set_limit: {outcome}"
    return held, _claim(conn, 10, "wb")


def test_turning_a_running_limit_per_key_waits_for_the_claim_in_progress(db: Database, conn: Conn) -> None:
    """2 RUNNING for the kind; a claim in progress starts 2 runs of key t1; the limit turns per
    key (2 per key). The change waits for that claim, so the next claim sees key t1 full."""
    held, after = _change_during_claim(
        db, conn, "max_running => 2", "max_running => 2, per_key => true", batch=5
    )
    assert len(held) == 2
    running = scalar(
        conn, "SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING' AND concurrency_key = 't1'"
    )
    assert after == [] and running == 2, f"claimed {after} after the change: t1 has {running} RUNNING (of 2)"


def _starts_within(conn: Conn, period: str) -> int:
    return int(
        scalar(conn, "SELECT count(*) FROM jobs.runs WHERE started_at > now() - %s::interval", (period,))
    )


def test_a_rate_limit_change_waits_for_the_claim_in_progress(db: Database, conn: Conn) -> None:
    """3 starts per 10 minutes; a claim in progress starts 3; meanwhile per_key flips (either
    way) or a rate is added to a running limit, tight or roomy. Each change waits for that claim
    and counts its starts: the next claim starts nothing."""
    rate = "rate_limit => 3, rate_period => '10 minutes'"
    changes = {
        "per_key turned on": (rate, f"{rate}, per_key => true"),
        "per_key turned off": (f"{rate}, per_key => true", rate),
        "a rate added to a running limit": ("max_running => 100", f"max_running => 100, {rate}"),
        "a rate added to a roomy running limit": ("max_running => 500", f"max_running => 500, {rate}"),
    }
    for what, (before, after) in changes.items():
        conn.execute("DELETE FROM jobs.runs")
        conn.execute("DELETE FROM jobs._rate_starts")
        conn.execute("DELETE FROM jobs.limits")
        held, later = _change_during_claim(db, conn, before, after, batch=3)
        assert len(held) == 3, f"{what}: the first claim started {held}"
        starts = _starts_within(conn, "10 minutes")
        assert later == [], f"{what}: claimed {later} after it; {starts} starts in 10 minutes (limit 3)"


TOKEN = "giver-0123456789abcdef-secret"

#: Two ways a worker gives back runs it claimed, each lowering its claim's row of the rate
#: window.
GIVE_BACKS = ("unclaim", "hand_back_unheld")


def _give_back(way: str, runs: list[int], held: list[int]) -> tuple[str, tuple[list[int], str]]:
    """The call that gives back ``runs`` of worker wd: by name, or as every run but ``held``."""
    if way == "unclaim":
        return "SELECT run_id FROM jobs.unclaim(%s, 'wd', %s)", (runs, TOKEN)
    return "SELECT run_id FROM jobs.hand_back_unheld(%s, 'wd', claim_token => %s)", (held, TOKEN)


@pytest.mark.parametrize("give_back", GIVE_BACKS)
def test_a_change_of_a_rate_window_waits_for_a_give_back_of_its_starts(
    db: Database, conn: Conn, give_back: str
) -> None:
    """A worker gives back two runs from two claims in one transaction, one call each, while
    set_limit rewrites that rate window: the change waits for the give-back to commit, and
    neither fails."""
    claim = "SELECT id FROM jobs.claim(1, 'wd', claim_token => %s)"
    conn.execute("SELECT jobs.set_limit('kind', 'api', rate_limit => 100, rate_period => '1 minute')")
    runs = _runs(conn, 4, kind="api")
    first = [r[0] for r in conn.execute(claim, (TOKEN,))]
    second = [r[0] for r in conn.execute(claim, (TOKEN,))]
    assert first + second == runs[:2]
    with db.connect(autocommit=False) as giver, db.connect() as changer:
        assert [r[0] for r in giver.execute(*_give_back(give_back, second, first))] == second
        change = BlockedCall(
            conn,
            changer,
            lambda: changer.execute(
                "SELECT jobs.set_limit('kind', 'api', rate_limit => 100, rate_period => '1 minute',"
                " per_key => true)"
            ).fetchall(),
            "set_limit to wait for the give-back in progress",
        )
        try:
            assert [r[0] for r in giver.execute(*_give_back(give_back, first, []))] == first
            giver.commit()
        except psycopg.Error as exc:
            raise AssertionError(f"the give-back failed: {exc.sqlstate} {exc}") from exc
        outcome = change.join(30)
        assert outcome and not isinstance(outcome[0], psycopg.Error), f"set_limit: {outcome}"
    assert scalar(conn, "SELECT coalesce(sum(starts), 0) FROM jobs._rate_starts") == 0
    assert _claim(conn) == runs, "the runs given back start again"


def test_a_claim_that_read_a_limit_before_it_turned_per_key_starts_nothing_by_it(
    db: Database, conn: Conn
) -> None:
    """Invariant: a key never has more RUNNING than its limit, whatever the order of a change
    and the claims. Queue fq at max_running 1, three runs of key a. set_limit(per_key => true)
    is in progress, holding the queue's group; a claim reads the limit as it was (per_key off),
    polls for that group and gets it once the change commits; a second claim reads per_key on
    and takes key a's group, which the first does not hold. Where the first counted by the
    grouping it read, both would start a run of key a."""
    _runs(conn, 3, queue="fq", key="a")

    def setup() -> None:
        conn.execute("UPDATE jobs.runs SET status = 'QUEUED', started_at = NULL, worker = NULL")
        conn.execute("SELECT jobs.set_limit('queue', 'fq', max_running => 1)")

    waited = claim_after_a_wait(
        db,
        conn,
        setup=setup,
        hold=lambda changer: changer.execute(
            "SELECT jobs.set_limit('queue', 'fq', max_running => 1, per_key => true)"
        ),
        claim=lambda claimer: _claim(claimer, 1, "wa"),
        later=lambda other: _claim(other, 1, "wb"),
    )
    running = conn.execute(
        "SELECT array_agg(id ORDER BY id), array_agg(worker ORDER BY id) FROM jobs.runs"
        " WHERE status = 'RUNNING' AND concurrency_key = 'a'"
    ).fetchone()
    assert running is not None and len(running[0] or []) <= 1, (
        f"key a has RUNNING {running} (limit 1 before and after the change): {waited}"
    )
    assert waited.later != [], "the claim after the change starts a run of key a"


def test_a_claim_that_read_no_limit_for_a_queue_starts_none_of_its_runs_once_one_exists(
    db: Database, conn: Conn
) -> None:
    """Invariant: a queue never has more RUNNING than its limit, also a limit made while a
    claim is in progress. Kind k1 at max_running 5, its group held by another transaction; a
    claim reads the limits (queue q has none), takes run r1 (kind k1, queue q) and polls for
    k1's group. Meanwhile set_limit gives queue q max_running 1, and the holder commits: the
    claim gets k1's group and starts r1 by the limits it read. set_limit waited for that claim,
    so the limit counts r1, and a claim after it starts none of q's other run r2.

    The same where the limit is written into jobs.limits by hand, which waits for nothing: the
    claim reads the limits again under its locks and starts nothing of q, and with the claim
    after it one run of q is RUNNING in all."""
    conn.execute("SELECT jobs.set_limit('kind', 'k1', max_running => 5)")
    r1 = _runs(conn, 1, kind="k1", queue="q", priority=1)
    r2 = _runs(conn, 1, kind="k2", queue="q")
    running_sql = "SELECT array_agg(id ORDER BY id) FROM jobs.runs WHERE status = 'RUNNING' AND queue = 'q'"
    hold_k1 = 'SELECT pg_advisory_xact_lock(jobs._limit_key(\'["kind", "k1"]\'))'
    with db.connect() as changer:
        changes: list[tuple[threading.Thread, list[Any]]] = []

        def setup() -> None:
            for thread, _ in changes:
                thread.join(60)
            conn.execute("UPDATE jobs.runs SET status = 'QUEUED', started_at = NULL, worker = NULL")
            conn.execute("SELECT jobs.remove_limit('queue', 'q')")

        def set_limit() -> None:
            call = lambda: changer.execute("SELECT jobs.set_limit('queue', 'q', max_running => 1)").fetchall()  # noqa: E731
            changes.append(_call_meanwhile(conn, changer, call))

        waited = claim_after_a_wait(
            db,
            conn,
            setup=setup,
            hold=lambda holder: holder.execute(hold_k1),
            claim=lambda claimer: _claim(claimer, 1, "wa"),
            meanwhile=set_limit,
        )
        thread, outcome = changes[-1]
        thread.join(60)
    assert outcome and not isinstance(outcome[0], psycopg.Error), f"set_limit: {outcome}"
    assert waited.runs == r1, f"the claim in progress started {waited} (r1 {r1})"
    later = _claim(conn, 1, "wb")
    running = scalar(conn, running_sql)
    assert later == [] and running == r1, f"queue q has RUNNING {running} (limit 1): later {later} (r2 {r2})"

    conn.execute("UPDATE jobs.runs SET status = 'QUEUED', started_at = NULL, worker = NULL")
    conn.execute("SELECT jobs.remove_limit('queue', 'q')")
    by_hand = claim_after_a_wait(
        db,
        conn,
        hold=lambda holder: holder.execute(hold_k1),
        claim=lambda claimer: _claim(claimer, 1, "wa"),
        meanwhile=lambda: conn.execute(
            "INSERT INTO jobs.limits (scope, name, max_running) VALUES ('queue', 'q', 1)"
        ),
        later=lambda other: _claim(other, 1, "wb"),
    )
    running = scalar(conn, running_sql)
    assert len(running or []) == 1, f"queue q has RUNNING {running} (limit 1): {by_hand} (r1 {r1}, r2 {r2})"
    assert _claim(conn) == [], "queue q is at its limit"


# a new limit: each key's lock (while few), the group's, the window's, and the claiming lock
@pytest.mark.parametrize(("keys", "locks"), [(3, 3 + 1 + 1 + 1), (5000, 1 + 1 + 1)])
def test_a_per_key_change_locks_each_key_only_while_keys_are_few(conn: Conn, keys: int, locks: int) -> None:
    """set_limit waits for the claims of every key of a per-key limit by taking each key's
    lock; those locks live in the server's shared lock table until commit, so with thousands
    of tenants it takes only the group's (and the window's) rather than fill that table and
    make every other session's locks fail."""
    conn.execute(
        "INSERT INTO jobs.runs (kind, queue, concurrency_key) SELECT 'k', 't', 'tenant-' || g"
        " FROM generate_series(1, %s) AS g",
        (keys,),
    )
    with conn.transaction():
        conn.execute("SELECT jobs.set_limit('queue', 't', max_running => 1, per_key => true)")
        held = scalar(
            conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
    assert held == locks, held
    assert _claim(conn, 20) != [], "the runs start under the new limit"


@pytest.mark.parametrize("keys", [3, 1500])
def test_turning_a_per_key_limit_off_waits_for_the_claim_in_progress_however_many_keys(
    db: Database, conn: Conn, keys: int
) -> None:
    """Invariant: a kind limit of 1 per key turned into 1 for the whole kind never has 2
    RUNNING, however many keys its runs have. A claim in progress (not committed) started a
    run of one key by the old settings; the change waits for it, so the claim after the change
    counts that run and starts none. Past 1,000 keys the change does not lock each key (the
    locks would crowd the server's lock table) but waits for every claim in progress, as a new
    limit does; where it waited for neither, the claim after it counted nothing (the run was
    not committed) and started a second run under the limit of 1."""
    conn.execute("SELECT jobs.set_limit('kind', 'api', max_running => 1, per_key => true)")
    conn.execute(
        "INSERT INTO jobs.runs (kind, concurrency_key, scheduled_for)"
        " SELECT 'api', 'tenant-' || g, now() - interval '1 hour' + g * interval '1 ms'"
        " FROM generate_series(1, %s) AS g, generate_series(1, 2) AS n",
        (keys,),
    )
    with (
        db.connect(autocommit=False) as first,
        db.connect() as changer,
        db.connect() as second,
    ):
        held = _claim(first, 1, "wa")
        assert len(held) == 1, held
        changing, changed = _call_meanwhile(
            conn,
            changer,
            lambda: changer.execute("SELECT jobs.set_limit('kind', 'api', max_running => 1)").fetchall(),
        )
        claiming, claimed = _call_meanwhile(conn, second, lambda: _claim(second, 5, "wb"))
        first.commit()
        changing.join(60)
        claiming.join(60)
    assert changed and not isinstance(changed[0], psycopg.Error), f"the change: {changed}"
    running = scalar(conn, "SELECT array_agg(id ORDER BY id) FROM jobs.runs WHERE status = 'RUNNING'")
    assert claimed == [[]], (
        f"{keys} keys: the claim after the change started {claimed}; RUNNING {running} (limit 1 for the"
        f" kind; the claim in progress held {held})"
    )


# ---------------------------------------------------------------------------
# Capping runs that claims in progress read as uncapped
# ---------------------------------------------------------------------------


def _call_meanwhile(
    observer: Conn, session: Conn, call: Callable[[], Any]
) -> tuple[threading.Thread, list[Any]]:
    """``call()`` on a thread using ``session``; returns once it has ended or waits for a lock."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except psycopg.Error as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    pid = session.info.backend_pid
    wait_for(
        "the call to end or wait for a lock",
        lambda: not thread.is_alive() or waits_on_lock(observer, pid),
        60,
    )
    return thread, outcome


CAPPING_CHANGES = {
    "a new queue limit": "SELECT jobs.set_limit('queue', 'q', max_running => 1)",
    "a new rate limit": "SELECT jobs.set_limit('queue', 'q', rate_limit => 1, rate_period => '1 hour')",
    "a definition's first cap": (
        "SELECT jobs.define('later-capped', 'later-capped', run_at => (SELECT d.run_at FROM jobs.definitions"
        " AS d WHERE d.name = 'later-capped'), enabled => false, max_concurrent_runs => 1)"
    ),
}


@pytest.mark.parametrize("change", CAPPING_CHANGES)
def test_capping_runs_waits_for_the_claims_that_read_them_uncapped(
    db: Database, conn: Conn, change: str
) -> None:
    """Invariant: a group never has more RUNNING (or starts in its window) than its bound, also
    one capped while a claim is in progress. Nothing is capped; a claim in progress (not
    committed) takes the uncapped path and starts 3 runs of queue q and definition
    later-capped. Then the change caps them at 1, and another claim asks for more. The change
    waits for the claim in progress; the claim after it counts that claim's 3 runs and starts
    none. Where the change did not wait, the second claim would count none of them (they were
    not committed) and start one: 4 where the bound is 1."""
    def_id = add_definition(conn, "later-capped")
    conn.execute("UPDATE jobs.definitions SET max_concurrent_runs = NULL WHERE id = %s", (def_id,))
    runs = add_runs(conn, 5, kind="later-capped", definition_id=def_id)
    conn.execute("UPDATE jobs.runs SET queue = 'q' WHERE id = ANY(%s)", (runs,))
    with (
        db.connect(autocommit=False) as first,
        db.connect() as changer,
        db.connect() as second,
    ):
        held = _claim(first, 3, "wa")
        assert held == runs[:3]
        changing, changed = _call_meanwhile(
            conn, changer, lambda: changer.execute(CAPPING_CHANGES[change]).fetchall()
        )
        claiming, claimed = _call_meanwhile(conn, second, lambda: _claim(second, 5, "wb"))
        first.commit()
        changing.join(60)
        claiming.join(60)
    assert changed and not isinstance(changed[0], psycopg.Error), f"the change: {changed}"
    running = scalar(conn, "SELECT array_agg(id ORDER BY id) FROM jobs.runs WHERE status = 'RUNNING'")
    assert claimed == [[]], (
        f"{change}: the claim after it started {claimed}; RUNNING {running} (bound 1; the first held {held})"
    )


def test_lowering_a_definitions_cap_waits_for_the_claims_that_started_runs_by_the_old_one(
    db: Database, conn: Conn
) -> None:
    """A claim in progress (not committed) started 3 runs of a definition capped at 5; then its
    cap is lowered to 1. The change waits for that claim to commit, so the 3 runs started
    before the change and every claim after it counts them. Where the change did not wait, it
    committed first and the claim after it: an observer saw 0 RUNNING under the cap of 1, then
    3."""
    def_id = add_definition(conn, "lowered", cap=5)
    runs = add_runs(conn, 5, kind="lowered", definition_id=def_id)
    lower = (
        "SELECT jobs.define('lowered', 'lowered', run_at => (SELECT d.run_at FROM jobs.definitions AS d"
        " WHERE d.name = 'lowered'), enabled => false, max_concurrent_runs => 1)"
    )
    with db.connect(autocommit=False) as first, db.connect() as changer:
        assert _claim(first, 3, "wa") == runs[:3]
        changing, changed = _call_meanwhile(conn, changer, lambda: changer.execute(lower).fetchall())
        waited = changing.is_alive()
        first.commit()
        changing.join(60)
    assert changed and not isinstance(changed[0], psycopg.Error), f"the change: {changed}"
    assert waited, (
        "the cap was lowered from 5 to 1 while a claim that started 3 runs by the old cap was in progress,"
        " without waiting for it: once it committed, 3 RUNNING under the cap of 1"
    )
    assert _claim(conn, 5, "wb") == [], "a claim after the change starts a run past the cap of 1"


def test_a_new_limit_waits_for_an_open_claim_at_most_its_time_and_changes_nothing(
    db: Database, conn: Conn
) -> None:
    """A claim whose transaction stays open holds a new limit back: set_limit gives up after
    the session's lock_timeout (5 s at most) with 55P03 naming what waited, and no limit is
    made. A change of an existing limit does not wait for claims of other groups."""
    conn.execute("SELECT jobs.set_limit('queue', 'other', max_running => 5)")
    _runs(conn, 2)
    with db.connect(autocommit=False) as first, db.connect() as changer:
        assert len(_claim(first, 1, "wa")) == 1
        changer.execute("SET lock_timeout = '300ms'")
        expect_error(
            changer,
            "SELECT jobs.set_limit('queue', 'q', max_running => 1)",
            None,
            "55P03",
            "jobs.set_limit of a new limit waits for the claims in progress",
            "within 300ms",
        )
        assert scalar(conn, "SELECT count(*) FROM jobs.limits WHERE name = 'q'") == 0
        changer.execute("SELECT jobs.set_limit('queue', 'other', max_running => 6)")
        first.commit()
    assert scalar(conn, "SELECT max_running FROM jobs.limits WHERE name = 'other'") == 6
