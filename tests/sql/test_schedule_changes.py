"""Changing a schedule never loses, nor doubles, an occurrence the old and the new schedule
share: jobs.define and jobs.define_many (a cosmetic change, a rolling deploy re-declaring, a
one-shot moved and moved back), with the scheduler's tick after the change."""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from harness import Clock, Conn, Database, materialize_occurrences, repeat_for, rows, run_in_processes, scalar
from pgtick.scheduler import Scheduler


def _redefine(conn: Conn, how: str, name: str, schedule: str) -> None:
    if how == "define":
        conn.execute("SELECT jobs.define(%s, 'k', schedule => %s)", (name, schedule))
    else:
        conn.execute(
            "SELECT * FROM jobs.define_many(%s::jsonb)",
            (json.dumps([{"name": name, "kind": "k", "schedule": schedule}]),),
        )


def _materialize(db: Database, at: datetime | None, lookahead: float) -> None:
    """The scheduler's materialization phases, twice (new cursors, then their runs), at `at`
    (None: the database's clock)."""
    scheduler = Scheduler(db.dsn, owner="t", clock=None if at is None else Clock(at), lookahead=lookahead)
    try:
        scheduler.materialize_due()
        scheduler.materialize_due()
    finally:
        scheduler.close()


def _runs(conn: Conn, definition_id: int) -> list[dict[str, Any]]:
    return rows(
        conn,
        "SELECT id, scheduled_for, status::text AS status FROM jobs.runs WHERE definition_id = %s"
        " ORDER BY scheduled_for, id",
        (definition_id,),
    )


@pytest.mark.parametrize("how", ["define", "define_many"])
@pytest.mark.parametrize("new_schedule", ["*/1 * * * *", "*/2 * * * *"])
def test_a_shared_occurrence_just_after_a_change_runs_once_when_the_tick_comes_late(
    db: Database, conn: Conn, how: str, new_schedule: str
) -> None:
    """Every minute, materialized ahead; the schedule text changes shortly before the next
    minute T (which the new schedule also has), and the scheduler's next tick only comes after
    T. T must have exactly one live run: not cancelled as superseded and lost, not twice."""
    _redefine(conn, how, "d", "* * * * *")
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'd'"))
    now = scalar(conn, "SELECT now()")
    # The next even minute at least 30 s ahead: shared by both new schedules.
    shared = (now + timedelta(seconds=30)).replace(second=0, microsecond=0) + timedelta(minutes=1)
    if shared.minute % 2:
        shared += timedelta(minutes=1)
    _materialize(db, now, 300)
    assert shared in [r["scheduled_for"] for r in _runs(conn, definition_id)], "materialized ahead"
    _redefine(conn, how, "d", new_schedule)
    _materialize(db, shared + timedelta(seconds=5), 300)  # the first tick after the change is late
    at_shared = [r for r in _runs(conn, definition_id) if r["scheduled_for"] == shared]
    assert [r["status"] for r in at_shared] == ["QUEUED"], (
        f"{how} {new_schedule!r}: the shared occurrence {shared} must have one live run, got {at_shared}"
    )


FLIPS = ("FREQ=SECONDLY", "FREQ=SECONDLY;INTERVAL=1")  # the same instants, written two ways


def _every_second(conn: Conn, schedule: str) -> None:
    conn.execute("SELECT jobs.define('s', 'k', schedule => %s, misfire_policy => 'catch_up')", (schedule,))


def _seconds_without_one_run(conn: Conn, start: datetime, end: datetime) -> dict[datetime, list[str]]:
    """Every whole second in [start, end) whose runs are not exactly one QUEUED run."""
    got: dict[datetime, list[str]] = {}
    for r in rows(conn, "SELECT scheduled_for AS t, status::text AS status FROM jobs.runs"):
        got.setdefault(r["t"], []).append(r["status"])
    seconds = [start + timedelta(seconds=i) for i in range(int((end - start).total_seconds()))]
    return {t: got.get(t, []) for t in seconds if got.get(t) != ["QUEUED"]}


def test_two_changes_before_the_next_tick_leave_no_occurrence_between_them(db: Database, conn: Conn) -> None:
    """The schedule changes, an occurrence passes, and it changes again before the scheduler's
    next tick (a rolling deploy flipping between two spellings). The first change dropped the
    occurrence's run; the second schedule starts where the first one would have, so the
    occurrence is re-created once, not lost between the two."""
    _every_second(conn, FLIPS[0])
    now = scalar(conn, "SELECT now()")
    _materialize(db, now, 30.0)
    first = scalar(conn, "SELECT min(scheduled_for) FROM jobs.runs")
    _every_second(conn, FLIPS[1])
    changed = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE name = 's'")
    between = changed.replace(microsecond=0) + timedelta(seconds=1)
    deadline = time.monotonic() + 60
    while scalar(conn, "SELECT clock_timestamp()") <= between:  # the occurrence passes
        assert time.monotonic() < deadline, f"the database clock did not pass {between}"
        time.sleep(0.05)
    _every_second(conn, FLIPS[0])
    late = scalar(conn, "SELECT now()") + timedelta(seconds=5)
    _materialize(db, late, 30.0)
    wrong = _seconds_without_one_run(conn, first, late)
    assert not wrong, f"changed at {changed}, again after {between}: seconds without exactly one run: {wrong}"


def test_a_change_while_the_scheduler_is_behind_leaves_no_occurrence_unplanned(
    db: Database, conn: Conn
) -> None:
    """The scheduler has materialized up to 20 s ago (it was slow or down) when the schedule
    changes: the occurrences since then were never planned by the old schedule, so the new one
    plans them (as its misfire policy says; catch_up here), instead of starting at the change."""
    _every_second(conn, FLIPS[0])
    now = scalar(conn, "SELECT now()")
    behind = now - timedelta(seconds=30)
    _materialize(db, behind, 10.0)  # runs and cursor up to 20 s ago
    first = scalar(conn, "SELECT min(scheduled_for) FROM jobs.runs")
    _every_second(conn, FLIPS[1])
    late = scalar(conn, "SELECT now()") + timedelta(seconds=2)
    _materialize(db, late, 2.0)
    wrong = _seconds_without_one_run(conn, first, late)
    assert not wrong, f"materialized up to {behind + timedelta(seconds=10)}, changed at {now}: {wrong}"


def test_redeclaring_the_same_definition_changes_nothing(db: Database, conn: Conn) -> None:
    conn.execute("SELECT jobs.define('same', 'k', schedule => '* * * * *', priority => 3)")
    _materialize(db, None, 300)
    columns = "revision, next_run_at, updated_at, finished_at, enabled"
    before = rows(conn, f"SELECT {columns} FROM jobs.definitions WHERE name = 'same'")
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'same'"))
    runs = _runs(conn, definition_id)
    assert runs, "materialized ahead"
    for _ in range(2):
        conn.execute("SELECT jobs.define('same', 'k', schedule => '* * * * *', priority => 3)")
        conn.execute(
            "SELECT * FROM jobs.define_many(%s::jsonb)",
            (json.dumps([{"name": "same", "kind": "k", "schedule": "* * * * *", "priority": 3}]),),
        )
    after = rows(conn, f"SELECT {columns} FROM jobs.definitions WHERE name = 'same'")
    assert after == before, f"an identical re-declare changed the definition: {before} -> {after}"
    assert _runs(conn, definition_id) == runs, "an identical re-declare touched the runs"


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_a_one_shot_moved_and_moved_back_runs_once_at_its_time(conn: Conn, how: str) -> None:
    a = scalar(conn, "SELECT date_trunc('second', now()) + interval '1 hour'")
    b = a + timedelta(minutes=30)

    def move(at: datetime) -> None:
        if how == "define":
            conn.execute("SELECT jobs.define('once', 'k', run_at => %s)", (at,))
        else:
            conn.execute(
                "SELECT * FROM jobs.define_many(%s::jsonb)",
                (json.dumps([{"name": "once", "kind": "k", "run_at": at.isoformat()}]),),
            )
        conn.execute("SELECT jobs.materialize_one_shots(interval '2 hours')")

    move(a)
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'once'"))
    move(b)
    move(a)
    runs = [(r["scheduled_for"], r["status"]) for r in _runs(conn, definition_id)]
    assert runs == [(a, "QUEUED")], f"{how}: run_at {a} -> {b} -> {a} must leave one run at {a}, got {runs}"


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_a_one_shot_moved_after_its_time_passed_runs_at_its_new_time_only(conn: Conn, how: str) -> None:
    """Its run for the old time is due and not started (no worker yet, or held by its cap):
    moved, to a later time or made a schedule, the definition runs at its new time, not also
    at the old one."""
    past = scalar(conn, "SELECT date_trunc('second', now()) - interval '10 seconds'")
    later = past + timedelta(hours=1)

    def declare(**fields: Any) -> None:
        if how == "define":
            names = ", ".join(f"{k} => %s" for k in fields)
            conn.execute(f"SELECT jobs.define('once', 'k', {names})", tuple(fields.values()))
        else:
            element = {"name": "once", "kind": "k"}
            element.update({k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()})
            conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([element]),))
        conn.execute("SELECT jobs.materialize_one_shots(interval '2 hours')")

    declare(run_at=past)
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'once'"))
    assert [(r["scheduled_for"], r["status"]) for r in _runs(conn, definition_id)] == [(past, "QUEUED")]
    declare(run_at=later)
    runs = [(r["scheduled_for"], r["status"]) for r in _runs(conn, definition_id)]
    assert runs == [(later, "QUEUED")], f"{how}: moved from {past} to {later}, got {runs}"
    declare(schedule="0 3 * * *")
    assert [r for r in _runs(conn, definition_id) if r["scheduled_for"] == later] == [], (
        "the old one-shot stays"
    )


def test_a_jittered_run_of_an_occurrence_before_the_change_is_kept_and_not_doubled(
    db: Database, conn: Conn
) -> None:
    """With a jitter, a run may start after the change for an occurrence before it: that run
    belongs to the old schedule's past and stays. The occurrences after the change that the
    schedules share are re-created once; none has two runs."""
    definition_id = int(
        scalar(conn, "SELECT id FROM jobs.define('j', 'k', schedule => '* * * * *', jitter => '1 day')")
    )
    # An occurrence at or before the change whose run starts well after it (jittered).
    start = scalar(
        conn,
        "SELECT t FROM generate_series(date_trunc('minute', now()), now() - interval '1 day',"
        "                              '-1 minute') AS t"
        " WHERE t + jobs.jitter_offset(%s, t, '1 day') > now() + interval '10 minutes'"
        " LIMIT 1",
        (definition_id,),
    )
    times = [start + timedelta(minutes=i) for i in range(5)]
    materialize_occurrences(conn, definition_id, times, start + timedelta(minutes=5))
    first = scalar(conn, "SELECT %s + jobs.jitter_offset(%s, %s, '1 day')", (start, definition_id, start))
    before = _runs(conn, definition_id)
    assert len(before) == 5

    conn.execute("SELECT jobs.define('j', 'k', schedule => '*/1 * * * *', jitter => '1 day')")
    changed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    assert first > changed_at, "the first occurrence's run starts after the change (jittered)"
    _materialize(db, changed_at + timedelta(seconds=5), 300)
    after = _runs(conn, definition_id)
    live = [r["scheduled_for"] for r in after if r["status"] == "QUEUED"]
    assert first in live, f"jittered run {first} of occurrence {start} (before the change) is lost: {after}"
    offsets = rows(
        conn,
        "SELECT t, t + jobs.jitter_offset(%s, t, '1 day') AS s FROM unnest(%s::timestamptz[]) AS t",
        (definition_id, times),
    )
    for o in offsets:
        count = sum(1 for r in after if r["scheduled_for"] == o["s"])
        assert count == 1, f"occurrence {o['t']} (starting {o['s']}) has {count} runs: {after}"
    assert len(live) == len(set(live)), f"an occurrence runs twice: {after}"


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_runs_materialized_before_runs_recorded_their_occurrence_are_judged_by_their_start(
    db: Database, conn: Conn, how: str
) -> None:
    """Runs materialized by an older version have no occurrence_at. A change still drops those
    that start after it (unjittered, their start is their occurrence), so the old schedule's
    runs of occurrences the new schedule lacks do not survive an upgrade."""
    _redefine(conn, how, "old", "* * * * *")
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'old'"))
    start = scalar(conn, "SELECT date_trunc('minute', now()) + interval '2 minutes'")
    minutes = [start + timedelta(minutes=i) for i in range(3)]
    materialize_occurrences(conn, definition_id, minutes, start + timedelta(minutes=3))
    conn.execute("UPDATE jobs.runs SET occurrence_at = NULL WHERE definition_id = %s", (definition_id,))
    _redefine(conn, how, "old", "0 0 1 1 *")
    kept = [r for r in _runs(conn, definition_id) if r["scheduled_for"] in minutes]
    assert not kept, f"{how}: runs of the replaced schedule survived the change: {kept}"


def test_resuming_just_before_an_occurrence_materializes_it_when_the_tick_comes_late(
    db: Database, conn: Conn
) -> None:
    """jobs.resume restarts from the first occurrence at or after the resume, even when the
    scheduler's first tick after it comes only after that occurrence."""
    definition_id = int(scalar(conn, "SELECT id FROM jobs.define('r', 'k', schedule => '* * * * *')"))
    conn.execute("SELECT jobs.pause('r')")
    conn.execute("SELECT jobs.resume('r')")
    resumed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    occurrence = resumed_at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    _materialize(db, occurrence + timedelta(seconds=5), 60)
    got = [(r["scheduled_for"], r["status"]) for r in _runs(conn, definition_id)]
    assert (occurrence, "QUEUED") in got, f"resumed at {resumed_at}: occurrence {occurrence} is lost: {got}"


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_a_changed_schedule_enabled_later_starts_when_it_is_enabled(
    db: Database, conn: Conn, how: str
) -> None:
    """A schedule changed while disabled and enabled an hour later by a re-declare: its cursor
    starts at the enabling, so the disabled hour is not caught up (catch_up policy)."""
    sql = "SELECT jobs.define('off', 'k', schedule => %s, misfire_policy => 'catch_up', enabled => %s)"
    conn.execute(sql, ("* * * * *", None))
    conn.execute(sql, ("*/1 * * * *", False))
    conn.execute(
        "UPDATE jobs.definitions SET cursor_from = cursor_from - interval '1 hour'"
    )  # changed long ago
    element = {
        "name": "off",
        "kind": "k",
        "schedule": "*/1 * * * *",
        "misfire_policy": "catch_up",
        "enabled": True,
    }
    if how == "define":
        conn.execute(sql, ("*/1 * * * *", True))
    else:
        conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([element]),))
    enabled_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE name = 'off'")
    _materialize(db, enabled_at, 60)
    early = [
        r["scheduled_for"]
        for r in rows(conn, "SELECT scheduled_for FROM jobs.runs")
        if r["scheduled_for"] < enabled_at
    ]
    assert early == [], f"{how}: enabled at {enabled_at}, the disabled time was caught up: {early}"


def _flip_loop(dsn: str, seconds: float) -> int:
    """Re-declare the every-second definition again and again, alternating how it is written."""
    flips = itertools.count()

    def flip(conn: Conn) -> int:
        conn.execute(
            "SELECT jobs.define('flip', 'k', schedule => %s, misfire_policy => 'catch_up')",
            (FLIPS[next(flips) % 2],),
        )
        time.sleep(random.uniform(0, 0.3))
        return 1

    return repeat_for(dsn, seconds, flip)


def _materialize_loop(dsn: str, seconds: float) -> int:
    """A would-be leader materializing in a loop (without the lock, as a second leader would)."""
    scheduler = Scheduler(dsn, owner=f"m-{os.getpid()}", lookahead=2.0)
    created = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            created += scheduler.materialize_due().runs_created
            time.sleep(0.05)
    finally:
        scheduler.close()
    return created


def _payload_loop(dsn: str, seconds: float) -> int:
    """Re-declare the every-second definition again and again with another payload and priority."""
    flips = itertools.count(1)

    def flip(conn: Conn) -> int:
        n = next(flips)
        conn.execute(
            "SELECT jobs.define('flip', 'k', schedule => %s, misfire_policy => 'catch_up',"
            " payload => %s::jsonb, priority => %s)",
            (FLIPS[0], json.dumps({"n": n}), n % 7),
        )
        time.sleep(random.uniform(0, 0.2))
        return 1

    return repeat_for(dsn, seconds, flip)


def _claim_loop(dsn: str, seconds: float) -> int:
    """A worker claiming the due runs and completing them at once."""

    def work(conn: Conn) -> int:
        got = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')").fetchall()]
        for run_id in got:
            conn.execute("SELECT jobs.complete(%s, 'w')", (run_id,))
        time.sleep(0.02)
        return len(got)

    return repeat_for(dsn, seconds, work)


def _race_member(dsn: str, seconds: float, role: str) -> int:
    loops = {"flip": _flip_loop, "payload": _payload_loop, "claim": _claim_loop}
    return loops.get(role, _materialize_loop)(dsn, seconds)


@pytest.mark.parametrize("materializers", [1, 2])
def test_re_declaring_during_materialization_keeps_every_occurrence_exactly_once(
    db: Database, conn: Conn, materializers: int
) -> None:
    """A rolling deploy: one process re-declares an every-second schedule over and over (two
    spellings of the same instants) while the leader (and, in the second case, a would-be second
    leader without the lock) materializes it. Every second of the race has exactly one run: none
    cancelled and lost, none twice."""
    conn.execute("SELECT jobs.define('flip', 'k', schedule => %s, misfire_policy => 'catch_up')", (FLIPS[0],))
    _materialize(db, None, 2.0)  # its cursor starts at once
    first = scalar(conn, "SELECT min(scheduled_for) FROM jobs.runs")
    flips, *created = run_in_processes(
        _race_member, [(db.dsn, 6.0, role) for role in ("flip", *["m"] * materializers)]
    )
    _materialize(db, None, 2.0)  # the last re-declare's occurrences up to now
    ended = scalar(conn, "SELECT now()")
    assert flips > 5, f"the race ran too little: {flips} re-declares"
    got = rows(
        conn,
        "SELECT scheduled_for AS t, count(*) FILTER (WHERE status = 'QUEUED') AS live, count(*) AS runs"
        " FROM jobs.runs GROUP BY 1 ORDER BY 1",
    )
    counts = {r["t"]: (r["live"], r["runs"]) for r in got}
    seconds = [first + timedelta(seconds=i) for i in range(int((ended - first).total_seconds()))]
    wrong = {t: counts.get(t, (0, 0)) for t in seconds if counts.get(t) != (1, 1)}
    assert not wrong, (
        f"{flips} re-declares, {created} runs created: seconds without exactly one live run"
        f" (live, all runs): {sorted(wrong.items())[:10]}"
    )


def _jittered_minutes_ahead(conn: Conn, jitter: str, count: int) -> tuple[int, list[datetime]]:
    """A definition 'j' every minute with this jitter, whose runs for `count` minutes from the
    one after next (each delayed by its jitter) are materialized: (its id, those minutes). The
    first is at least a minute away, so a minute that turns while the test runs cannot put it
    before the change the test makes."""
    definition_id = int(
        scalar(conn, "SELECT id FROM jobs.define('j', 'k', schedule => '* * * * *', jitter => %s)", (jitter,))
    )
    start = scalar(conn, "SELECT date_trunc('minute', now()) + interval '2 minutes'")
    minutes = [start + timedelta(minutes=i) for i in range(count)]
    materialize_occurrences(conn, definition_id, minutes, start + timedelta(minutes=count))
    return definition_id, minutes


def _each_runs_once_at(conn: Conn, definition_id: int, minutes: list[datetime], old: str, new: str) -> None:
    """Each of these occurrences has exactly one QUEUED run, delayed by the new jitter."""
    for minute in minutes:
        live = _live_runs_of(conn, definition_id, minute, [old, new])
        at = scalar(conn, "SELECT %s + jobs.jitter_offset(%s, %s, %s)", (minute, definition_id, minute, new))
        assert live == [at], f"occurrence {minute}: one run at {at} (jitter {new}) expected, got {live}"


def _live_runs_of(conn: Conn, definition_id: int, minute: datetime, jitters: list[str]) -> list[datetime]:
    """The start times of the definition's QUEUED runs of this occurrence: those that recorded
    it, and any that recorded none but start at it delayed by one of the jitters. (By start time
    alone a run of the next minute can be taken for this one: the offsets are hashes.)"""
    return [
        r["scheduled_for"]
        for r in rows(
            conn,
            "SELECT r.scheduled_for FROM jobs.runs AS r"
            " WHERE r.definition_id = %(d)s AND r.status = 'QUEUED'"
            "   AND (r.occurrence_at = %(m)s"
            "        OR (r.occurrence_at IS NULL AND r.scheduled_for IN ("
            "            SELECT %(m)s + jobs.jitter_offset(%(d)s, %(m)s, j)"
            "              FROM unnest(%(j)s::interval[]) AS j)))"
            " ORDER BY r.scheduled_for",
            {"d": definition_id, "m": minute, "j": jitters},
        )
    ]


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_a_jitter_changed_alone_moves_the_runs_materialized_ahead(db: Database, conn: Conn, how: str) -> None:
    """Only the jitter changes: the runs of the next minutes, materialized ahead with the old
    jitter, start as the new one delays them, once each, as preview and the leaders compute."""
    definition_id, minutes = _jittered_minutes_ahead(conn, "1 hour", 5)
    if how == "define":
        conn.execute("SELECT jobs.define('j', 'k', schedule => '* * * * *', jitter => '30 minutes')")
    else:
        new = {"name": "j", "kind": "k", "schedule": "* * * * *", "jitter": "30 minutes"}
        conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([new]),))
    changed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    _materialize(db, changed_at + timedelta(seconds=5), 600)
    _each_runs_once_at(conn, definition_id, minutes, "1 hour", "30 minutes")


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_a_schedule_and_jitter_change_runs_each_later_occurrence_once(
    db: Database, conn: Conn, how: str
) -> None:
    """The schedule and the jitter change together. The old schedule's runs of the next minutes
    were materialized ahead, delayed by the old jitter (some start before the change plus that
    jitter). The new schedule has the same minutes: each must end with exactly one run, the
    new one, not the old jittered run and a new one beside it."""
    definition_id, minutes = _jittered_minutes_ahead(conn, "1 hour", 5)
    if how == "define":
        conn.execute("SELECT jobs.define('j', 'k', schedule => '*/1 * * * *', jitter => '30 minutes')")
    else:
        new = {"name": "j", "kind": "k", "schedule": "*/1 * * * *", "jitter": "30 minutes"}
        conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([new]),))
    changed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    _materialize(db, changed_at + timedelta(seconds=5), 600)
    _each_runs_once_at(conn, definition_id, minutes, "1 hour", "30 minutes")


@pytest.mark.parametrize("how", ["define", "define_many"])
def test_a_jittered_run_of_an_occurrence_the_new_schedule_lacks_is_dropped(
    db: Database, conn: Conn, how: str
) -> None:
    """A run of an occurrence after the change, materialized ahead and delayed by the jitter to
    start before the change plus the jitter, belongs to the old schedule only: when the new
    schedule does not have that occurrence, the run is dropped, whatever its delay."""
    definition_id, minutes = _jittered_minutes_ahead(conn, "1 hour", 5)
    _redefine(conn, how, "j", "0 0 1 1 *")
    changed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    _materialize(db, changed_at + timedelta(seconds=5), 600)
    kept = {m: _live_runs_of(conn, definition_id, m, ["1 hour"]) for m in minutes}
    assert not any(kept.values()), f"{how}: runs of occurrences the new schedule lacks survived: {kept}"


def test_a_jitter_changed_while_paused_runs_each_occurrence_once_after_the_resume(
    db: Database, conn: Conn
) -> None:
    """Runs materialized ahead, then a pause, a new jitter, and a resume: the resume restarts the
    cursor at that instant, and each later occurrence must have one run, delayed by the new
    jitter, not the old jittered run beside a new one."""
    definition_id, minutes = _jittered_minutes_ahead(conn, "1 hour", 5)
    conn.execute("SELECT jobs.pause('j')")
    conn.execute("SELECT jobs.define('j', 'k', schedule => '* * * * *', jitter => '30 minutes')")
    conn.execute("SELECT jobs.resume('j')")
    resumed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    _materialize(db, resumed_at + timedelta(seconds=5), 600)
    _each_runs_once_at(conn, definition_id, minutes, "1 hour", "30 minutes")


@pytest.mark.parametrize("how", ["resume", "define", "define_many"])
def test_a_definition_enabled_again_does_not_catch_up_its_paused_time(
    db: Database, conn: Conn, how: str
) -> None:
    """Paused for an hour (its cursor an hour behind), then enabled again by jobs.resume or by
    a re-declare with enabled true: it starts at the enabling, whatever its misfire policy;
    the paused hour is not caught up."""
    sql = "SELECT jobs.define('e', 'k', schedule => '* * * * *', misfire_policy => 'catch_up', enabled => %s)"
    conn.execute(sql, (None,))
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'e'"))
    conn.execute("SELECT jobs.pause('e')")
    conn.execute(
        "UPDATE jobs.definitions SET next_run_at = date_trunc('minute', now()) - interval '1 hour'"
        " WHERE id = %s",
        (definition_id,),
    )
    if how == "resume":
        conn.execute("SELECT jobs.resume('e')")
    elif how == "define":
        conn.execute(sql, (True,))
    else:
        element = {
            "name": "e",
            "kind": "k",
            "schedule": "* * * * *",
            "misfire_policy": "catch_up",
            "enabled": True,
        }
        conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([element]),))
    enabled_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    _materialize(db, enabled_at + timedelta(seconds=5), 60)
    paused = [r for r in _runs(conn, definition_id) if r["scheduled_for"] < enabled_at - timedelta(minutes=1)]
    assert not paused, f"{how}: enabled at {enabled_at}, the paused hour was caught up: {paused}"


def test_a_pause_and_resume_keeps_the_runs_materialized_ahead_and_what_waits_on_them(
    db: Database, conn: Conn
) -> None:
    """The jitter unchanged, a resume's cursor would make the same runs again: the runs
    materialized before the pause stay (their ids too), so a run that waits on one of them
    still waits instead of being cancelled as if its dependency had gone."""
    definition_id, minutes = _jittered_minutes_ahead(conn, "1 hour", 3)
    ahead = scalar(conn, "SELECT max(id) FROM jobs.runs WHERE definition_id = %s", (definition_id,))
    waiting = scalar(
        conn, "SELECT id FROM jobs.enqueue('after', depends_on => ARRAY[%s]::bigint[])", (ahead,)
    )
    conn.execute("SELECT jobs.pause('j')")
    conn.execute("SELECT jobs.resume('j')")
    resumed_at = scalar(conn, "SELECT updated_at FROM jobs.definitions WHERE id = %s", (definition_id,))
    _materialize(db, resumed_at + timedelta(seconds=5), 600)
    _each_runs_once_at(conn, definition_id, minutes, "1 hour", "1 hour")
    state = rows(
        conn,
        "SELECT id, status::text AS status, blocked FROM jobs.runs WHERE id IN (%s, %s)",
        (ahead, waiting),
    )
    assert {r["id"]: (r["status"], r["blocked"]) for r in state} == {
        ahead: ("QUEUED", False),
        waiting: ("QUEUED", True),
    }, f"after a pause and a resume: {state}"


def _occurrences_jittered_together(conn: Conn, definition_id: int, jitter: str) -> tuple[datetime, datetime]:
    """Two minutes of the coming day (from the one after next) that the definition's jitter
    delays to the same start: with a jitter of many minutes, a day holds dozens of such pairs."""
    pair = conn.execute(
        """
        SELECT min(m), max(m) FROM (
            SELECT m, m + jobs.jitter_offset(%(d)s, m, %(j)s::interval) AS starts
              FROM generate_series(date_trunc('minute', now()) + interval '2 minutes',
                                   date_trunc('minute', now()) + interval '1 day', interval '1 minute') AS m
        ) AS s
         GROUP BY starts HAVING count(*) > 1
         ORDER BY min(m) LIMIT 1
        """,
        {"d": definition_id, "j": jitter},
    ).fetchone()
    assert pair is not None and pair[0] is not None, "no two minutes of the day share a jittered start"
    return pair[0], pair[1]


@pytest.mark.parametrize("path", ["materialize", "scheduler"])
def test_two_occurrences_jittered_to_the_same_start_each_get_their_run(
    db: Database, conn: Conn, path: str
) -> None:
    """A jitter longer than the schedule's step can delay two occurrences to the same second
    (12:39 by 19:36 and 12:40 by 18:36). Each is an occurrence of its own: both get their run,
    through jobs.materialize (any language) and through the scheduler (jobs.materialize_many)."""
    definition_id = int(
        scalar(conn, "SELECT id FROM jobs.define('j', 'k', schedule => '* * * * *', jitter => '30 minutes')")
    )
    first, second = _occurrences_jittered_together(conn, definition_id, "30 minutes")
    if path == "materialize":
        materialize_occurrences(conn, definition_id, [first, second], second + timedelta(minutes=1))
    else:
        # The scheduler's clock a minute before the pair, which can be most of a day away: a
        # call plans at most max_catch_up runs per definition, so from the real clock the
        # horizon would end before the pair whenever it lies more than 100 minutes ahead.
        at = first - timedelta(minutes=1)
        _materialize(db, at, (second - at).total_seconds() + 60)
    got = rows(
        conn,
        "SELECT occurrence_at, scheduled_for, status::text AS status FROM jobs.runs"
        " WHERE definition_id = %s AND occurrence_at IN (%s, %s) ORDER BY occurrence_at",
        (definition_id, first, second),
    )
    assert [(r["occurrence_at"], r["status"]) for r in got] == [(first, "QUEUED"), (second, "QUEUED")], (
        f"{path}: occurrences {first} and {second}, both due at {got[0]['scheduled_for'] if got else '?'},"
        f" have these runs: {got}"
    )
    assert got[0]["scheduled_for"] == got[1]["scheduled_for"]


_SETTINGS = (
    "SELECT kind, payload, priority, max_attempts, timeout, heartbeat_timeout, queue, concurrency_key"
    " FROM jobs.runs WHERE definition_id = %s AND status = 'QUEUED' ORDER BY id"
)


@pytest.mark.parametrize("how", ["define", "define_many"])
@pytest.mark.parametrize("shape", ["recurring", "one-shot"])
def test_runs_materialized_ahead_take_the_settings_of_a_re_declaration(
    db: Database, conn: Conn, how: str, shape: str
) -> None:
    """A re-declaration that keeps the occurrences but changes what a run does (kind, payload,
    priority, attempts, timeouts, queue, concurrency key) applies to the runs materialized
    ahead that have not started: a renamed kind would otherwise leave them waiting for a
    worker of the old kind forever, and a corrected payload would not reach the next runs (a
    one-shot's only run)."""
    at = scalar(conn, "SELECT date_trunc('minute', now()) + interval '3 minutes'")
    timing: dict[str, Any] = {"schedule": "* * * * *"} if shape == "recurring" else {"run_at": at.isoformat()}
    old = {"name": "d", "kind": "old", "payload": {"v": 1}, **timing}
    new = {
        **old,
        "kind": "new",
        "payload": {"v": 2},
        "priority": 5,
        "max_attempts": 7,
        "timeout": 60,
        "heartbeat_timeout": 30,
        "queue": "other",
        "concurrency_key": "ck",
    }
    conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([old]),))
    definition_id = int(scalar(conn, "SELECT id FROM jobs.definitions WHERE name = 'd'"))
    _materialize(db, None, 600)
    before = rows(conn, _SETTINGS, (definition_id,))
    assert before, "materialized ahead"
    if how == "define":
        conn.execute(
            "SELECT jobs.define('d', 'new', schedule => %(schedule)s, run_at => %(run_at)s,"
            " payload => '{\"v\": 2}', priority => 5, max_attempts => 7, timeout => '60 seconds',"
            " heartbeat_timeout => '30 seconds', queue => 'other', concurrency_key => 'ck')",
            {"schedule": timing.get("schedule"), "run_at": at if shape == "one-shot" else None},
        )
    else:
        conn.execute("SELECT * FROM jobs.define_many(%s::jsonb)", (json.dumps([new]),))
    after = rows(conn, _SETTINGS, (definition_id,))
    expected = {
        "kind": "new",
        "payload": {"v": 2},
        "priority": 5,
        "max_attempts": 7,
        "timeout": timedelta(seconds=60),
        "heartbeat_timeout": timedelta(seconds=30),
        "queue": "other",
        "concurrency_key": "ck",
    }
    assert len(after) == len(before), f"{how} {shape}: the runs ahead stay: {before} -> {after}"
    assert all(r == expected for r in after), f"{how} {shape}: runs ahead after the change: {after}"


def test_re_declaring_run_settings_while_runs_are_claimed_keeps_every_occurrence_once(
    db: Database, conn: Conn
) -> None:
    """Processes: one re-declares an every-second schedule's payload and priority over and over
    (each change restates the runs materialized ahead), one materializes, one claims and
    completes. No call fails (no deadlock between the restate and claims), every second has
    exactly one run, and the runs still waiting carry the last declaration's payload."""
    conn.execute("SELECT jobs.define('flip', 'k', schedule => %s, misfire_policy => 'catch_up')", (FLIPS[0],))
    _materialize(db, None, 2.0)
    first = scalar(conn, "SELECT min(scheduled_for) FROM jobs.runs")
    flips, _created, claimed = run_in_processes(
        _race_member, [(db.dsn, 6.0, role) for role in ("payload", "m", "claim")]
    )
    _materialize(db, None, 2.0)
    ended = scalar(conn, "SELECT now()")
    assert flips > 5 and claimed > 0, f"the race ran too little: {flips} re-declares, {claimed} claimed"
    counts = {
        r["t"]: r["runs"]
        for r in rows(conn, "SELECT scheduled_for AS t, count(*) AS runs FROM jobs.runs GROUP BY 1")
    }
    seconds = [first + timedelta(seconds=i) for i in range(int((ended - first).total_seconds()))]
    wrong = {t: counts.get(t, 0) for t in seconds if counts.get(t) != 1}
    assert not wrong, f"{flips} re-declares: seconds without exactly one run: {sorted(wrong.items())[:10]}"
    stale = rows(
        conn,
        "SELECT r.id, r.payload FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id"
        " WHERE r.status = 'QUEUED' AND (r.payload, r.priority) IS DISTINCT FROM (d.payload, d.priority)",
    )
    assert stale == [], f"runs waiting with an earlier declaration's settings: {stale}"
