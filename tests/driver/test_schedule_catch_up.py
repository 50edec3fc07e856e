"""A catch-up walked in parts (a budget per tick) ends exactly as one unbounded walk:
the same runs, the same record of the late occurrences, the same cursor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest

from pgtick.schedule import Plan, parse_schedule, plan_materialization
from pgtick.scheduler import CatchUp, Progress, misfire_grace_for, settle_late

NOW = datetime(2026, 3, 29, 12, 0, 30, tzinfo=UTC)  # the day Europe/Sofia springs forward


def walk(
    schedule_text: str, zone: str, cursor: datetime, policy: str, budget: int | None
) -> tuple[list[datetime], CatchUp | None, datetime | None, int]:
    """Plan from `cursor` until the walk reaches the present, `budget` missed occurrences
    at a time, the way the scheduler's ticks do; returns runs, record, cursor, parts."""
    schedule = parse_schedule(schedule_text, zone, anchor=datetime(2026, 1, 1, tzinfo=UTC))
    grace = misfire_grace_for(schedule, cursor, timedelta(seconds=60))
    definition = {"name": "walked", "revision": 1, "misfire_policy": policy, "next_run_at": cursor}
    runs: list[datetime] = []
    before: Progress | None = None
    for parts in range(1, 100_000):
        plan = plan_materialization(
            schedule,
            cursor,
            NOW,
            misfire_policy=policy,
            lookahead=timedelta(seconds=2),
            misfire_grace=grace,
            max_runs=10**9,  # the cap of catch_up runs per tick is bounded elsewhere
            budget=budget,
        )
        if plan.partial:
            runs += plan.run_times
            before = Progress.after(before, definition, plan, NOW, grace)
            assert before.continues(definition | {"next_run_at": plan.next_cursor})
            assert plan.next_cursor is not None and plan.next_cursor > cursor, plan
            cursor = definition["next_run_at"] = plan.next_cursor
            continue
        settled, record = settle_late(plan, NOW, policy, before)
        assert isinstance(settled, Plan)
        return runs + settled.run_times, record, settled.next_cursor, parts
    raise AssertionError("the walk never reached the present")


@pytest.mark.parametrize("policy", ["coalesce", "catch_up", "skip"])
@pytest.mark.parametrize(
    ("schedule_text", "zone", "down"),
    [
        ("FREQ=SECONDLY;INTERVAL=7", "UTC", timedelta(hours=2)),
        ("*/5 * * * *", "Europe/Sofia", timedelta(days=3)),
        ("FREQ=MINUTELY;INTERVAL=3;BYSECOND=0,20", "Europe/Sofia", timedelta(days=1)),
        ("DTSTART:20260328T000000Z\nRRULE:FREQ=SECONDLY;COUNT=200000", "UTC", timedelta(hours=1)),
    ],
)
def test_a_catch_up_in_parts_ends_as_one_walk(
    schedule_text: str, zone: str, down: timedelta, policy: str
) -> None:
    start = parse_schedule(schedule_text, zone, anchor=datetime(2026, 1, 1, tzinfo=UTC)).next_after(
        NOW - down, inclusive=True
    )
    assert start is not None
    whole = walk(schedule_text, zone, start, policy, None)
    for budget in (1, 97, 1000):
        runs, record, cursor, parts = walk(schedule_text, zone, start, policy, budget)
        assert parts > 1 or budget == 1000, f"budget {budget} did not split the walk"
        assert (runs, record, cursor) == whole[:3], (budget, runs[:5], record, cursor, whole[1], whole[2])


@pytest.mark.parametrize(
    "text",
    [
        "FREQ=SECONDLY;INTERVAL=7;COUNT=5000",
        "FREQ=HOURLY;INTERVAL=5;BYMINUTE=10,40;COUNT=2000",
        "FREQ=DAILY;BYHOUR=8,20;COUNT=900",
        "FREQ=WEEKLY;INTERVAL=3;BYDAY=SU;COUNT=60;WKST=SU",
        "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;COUNT=100",
        "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;COUNT=5",
    ],
)
@pytest.mark.parametrize("zone", ["UTC", "Europe/Sofia", "America/New_York"])
def test_a_count_rule_restarted_near_the_instant_runs_as_walked_from_its_start(text: str, zone: str) -> None:
    """A COUNT rule restarts near the asked instant with the occurrences before it counted
    (and remembered): the same runs as walking it from DTSTART, at any instant, asked in any
    order, and the remembered counts only ever save work."""
    schedule = parse_schedule(text, zone, anchor=datetime(2026, 1, 1, tzinfo=UTC))
    whole = list(schedule._run_instants(None, inclusive=True, rebase=False))
    span = whole[-1] - whole[0] + timedelta(days=2)
    instants = [whole[0] - timedelta(days=1) + span * k / 37 for k in (5, 1, 30, 12, 36, 12, 0, 21)]
    for instant in instants:
        expected = [t for t in whole if t >= instant][:10]
        got = list(islice(schedule._run_instants(instant, inclusive=True), 10))
        assert got == expected, (instant, got[:3], expected[:3])
