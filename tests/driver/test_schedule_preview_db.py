"""`pgtick preview --definition NAME` shows exactly what the scheduler materializes.

Through the database: definitions created (created_at) on a given day, whose phase
depends on the anchor; the scheduler materializes ten days of them with its own
clock, and the preview of each stored definition, run as the CLI, must list the same
start times.  Also: `pgtick define` and `app.schedule` store the DST policy, and
`pgtick backfill` inserts a past window once.
"""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from harness import Database, pgtick
from pgtick.app import App
from pgtick.definitions import sync_app
from pgtick.scheduler import Scheduler

CREATED = datetime(2026, 3, 3, 10, 17, tzinfo=UTC)  # a Tuesday, mid-morning
NOW = datetime(2026, 3, 25, 0, 0, 30, tzinfo=UTC)  # the scheduler's clock: Sofia's change is on the 29th
DAYS = 10

# (name, schedule, zone, extra jobs.define arguments): every phase here depends on the anchor.
DEFINITIONS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("every-other-day", "FREQ=DAILY;INTERVAL=2;BYHOUR=8", "Europe/Sofia", {}),
    ("weekly-no-byday", "FREQ=WEEKLY;BYHOUR=9", "America/New_York", {}),
    ("five-hourly", "FREQ=HOURLY;INTERVAL=5", "UTC", {}),
    ("five-hourly-sofia-jitter", "FREQ=HOURLY;INTERVAL=5", "Europe/Sofia", {"jitter": timedelta(minutes=7)}),
    ("three-weekly-gap", "FREQ=WEEKLY;INTERVAL=3;BYDAY=SU;BYHOUR=3;BYMINUTE=30", "Europe/Sofia", {}),
    ("hourly-repeat-second", "FREQ=HOURLY;INTERVAL=3", "Europe/Sofia", {"dst_repeat": "second"}),
]

_UTC_COLUMN = re.compile(r"\s(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def ok(*args: str) -> str:
    result: subprocess.CompletedProcess[str] = pgtick(*args)
    assert result.returncode == 0, f"pgtick {' '.join(args)} -> {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def preview_times(db: Database, name: str, count: int) -> tuple[list[datetime], str]:
    out = ok(
        "preview", "--definition", name, "--after", NOW.isoformat(), "--count", str(count), "--dsn", db.dsn
    )
    times = [datetime.fromisoformat(m.group(1).replace("Z", "+00:00")) for m in _UTC_COLUMN.finditer(out)]
    return times, out


def test_scheduler_materializes_what_preview_of_the_definition_shows(db: Database) -> None:
    with db.connect() as conn:
        for name, schedule, zone, extra in DEFINITIONS:
            args = "".join(f", {k} => %({k})s" for k in extra)
            conn.execute(
                f"SELECT jobs.define(%(name)s, 'k', %(schedule)s, %(zone)s{args})",
                {"name": name, "schedule": schedule, "zone": zone, **extra},
            )
        conn.execute("UPDATE jobs.definitions SET created_at = %s", (CREATED,))

    scheduler = Scheduler(db.dsn, owner="t", lookahead=DAYS * 86400, max_catch_up=1000, clock=lambda: NOW)
    try:
        scheduler.materialize_due()
    finally:
        scheduler.close()

    with db.connect() as conn:
        for name, schedule, _, _ in DEFINITIONS:
            materialized = [
                r[0]
                for r in conn.execute(
                    "SELECT r.scheduled_for FROM jobs.runs AS r JOIN jobs.definitions AS d"
                    " ON d.id = r.definition_id WHERE d.name = %s ORDER BY r.scheduled_for",
                    (name,),
                ).fetchall()
            ]
            assert materialized, f"definition={name}: nothing materialized"
            shown, out = preview_times(db, name, len(materialized))
            assert shown == materialized, (
                f"definition={name} {schedule}: preview\n{out}\nscheduler {materialized}"
            )
            assert "anchor: 2026-03-03T00:00:00" in out, out


def test_preview_of_the_anchor_dependent_rule_is_the_creation_days_phase(db: Database) -> None:
    """The phase of INTERVAL=2 comes from the creation day (Tue 3 March: Tue, Thu, ...),
    not from a fixed date."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('eod', 'k', 'FREQ=DAILY;INTERVAL=2;BYHOUR=8', 'Europe/Sofia')")
        conn.execute("UPDATE jobs.definitions SET created_at = %s", (CREATED,))
    shown, out = preview_times(db, "eod", 3)
    assert [t.strftime("%a %d") for t in shown] == ["Wed 25", "Fri 27", "Sun 29"], out


def test_define_cli_and_app_store_the_dst_policy_and_controls(db: Database) -> None:
    ok("define", "nightly", "etl", "--dsn", db.dsn, "--schedule", "30 2 * * *", "--tz", "America/New_York",
       "--dst-gap", "skip", "--dst-repeat", "both", "--jitter", "5m", "--pause-after-failures", "3",
       "--overlap", "buffer_one")  # fmt: skip
    app = App()
    app.schedule(
        "hourly", "etl", "0 * * * *", tz="Europe/Sofia", dst_repeat="first", jitter=timedelta(seconds=30)
    )
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        sync_app(app, conn)
        rows = conn.execute(
            "SELECT name, dst_gap, dst_repeat, dst_auto, jitter, pause_after_failures, overlap_policy"
            " FROM jobs.definition_health ORDER BY name"
        ).fetchall()
    assert rows == [
        ("hourly", "skip", "first", False, timedelta(seconds=30), None, "queue"),
        ("nightly", "skip", "both", False, timedelta(minutes=5), 3, "buffer_one"),
    ]
    out = ok("preview", "--definition", "hourly", "--after", "2026-10-24T23:30:00+00:00", "--count", "3",
             "--dsn", db.dsn)  # fmt: skip
    assert "dst: dst_gap=skip (auto) dst_repeat=first" in out
    assert "DST repeat: first of two" in out  # 03:00 EEST, then 03:00 EET is not run
    assert "jitter +" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dst-gap", "later"], "invalid choice: 'later'"),
        (["--definition", "nope"], "definition 'nope' does not exist"),
    ],
)
def test_preview_bad_input_is_one_line_and_exit_2(db: Database, args: list[str], message: str) -> None:
    base = [] if "--definition" in args else ["0 * * * *"]
    result = pgtick("preview", *base, *args, "--dsn", db.dsn)
    assert result.returncode == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_backfill_cli_inserts_a_past_window_once(db: Database) -> None:
    ok("define", "hourly", "etl", "--dsn", db.dsn, "--schedule", "0 * * * *")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    window = [
        "--from",
        (now - timedelta(hours=5, minutes=30)).isoformat(),
        "--to",
        (now - timedelta(hours=1)).isoformat(),
    ]
    assert "runs=5" in ok("backfill", "hourly", "--dsn", db.dsn, *window)
    assert "runs=0" in ok("backfill", "hourly", "--dsn", db.dsn, *window)
    result = pgtick(
        "backfill",
        "hourly",
        "--dsn",
        db.dsn,
        "--from",
        now.isoformat(),
        "--to",
        (now - timedelta(hours=1)).isoformat(),
    )
    assert result.returncode == 2 and "is after to" in result.stderr, result


def test_a_schedule_of_a_kind_the_app_does_not_register_is_warned_about(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Its runs would wait, QUEUED, for a worker whose app registers the kind: say so."""
    app = App("shop")

    @app.job("report")
    def report(ctx: Any) -> None:
        pass

    app.schedule("nightly-report", "report", "0 3 * * *")
    app.schedule("nightly-export", "export", "0 4 * * *")
    with db.connect() as conn, caplog.at_level("WARNING", logger="pgtick.definitions"):
        sync_app(app, conn)
    warned = [r.getMessage() for r in caplog.records if r.name == "pgtick.definitions"]
    assert len(warned) == 1 and "'nightly-export'" in warned[0] and "'export'" in warned[0], warned


def test_preview_of_a_definition_says_when_the_scheduler_will_not_run_what_it_lists(db: Database) -> None:
    """A paused definition's occurrences are listed, but the scheduler materializes none of
    them: the preview says so (with the reason of an automatic pause), and says when the
    schedule has ended rather than print an empty list."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("SELECT jobs.define('nightly', 'k', '0 3 * * *', 'Europe/Sofia')")
        conn.execute(
            "SELECT jobs.define('twice', 'k', %s)", ("DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY;COUNT=2",)
        )
    before = ok("preview", "--definition", "nightly", "--count", "2", "--dsn", db.dsn)
    assert "paused" not in before and len(_UTC_COLUMN.findall(before)) == 2, before
    ok("pause", "nightly", "--dsn", db.dsn)
    paused = ok("preview", "--definition", "nightly", "--count", "2", "--dsn", db.dsn)
    assert "paused: none of these runs until `pgtick resume nightly`" in paused, paused
    assert len(_UTC_COLUMN.findall(paused)) == 2, paused
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobs.definitions SET paused_reason = 'paused after 3 consecutive failures'"
            " WHERE name = 'nightly'"
        )
    reason = ok("preview", "--definition", "nightly", "--count", "2", "--dsn", db.dsn)
    assert "paused (paused after 3 consecutive failures): none of these runs" in reason, reason
    ended = ok("preview", "--definition", "twice", "--count", "2", "--dsn", db.dsn)
    assert "no further occurrences: the schedule has ended" in ended, ended
    text = ok("preview", "DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY;COUNT=2", "--count", "2")
    assert "no further occurrences: the schedule has ended" in text, text


def test_preview_of_a_paused_definition_counts_the_runs_queued_before_the_pause(db: Database) -> None:
    """A pause stops new occurrences, not the runs the scheduler had already materialized
    ahead: those still start (jobs.definition_health's next_start_at is the first of them), so
    the preview of a paused definition says how many and until when, rather than that none
    of the listed occurrences runs."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("SELECT jobs.define('often', 'k', '* * * * *', 'Europe/Sofia')")
    scheduler = Scheduler(db.dsn, owner="t", lookahead=600)
    try:
        scheduler.materialize_due()
        scheduler.materialize_due()
    finally:
        scheduler.close()
    ok("pause", "often", "--dsn", db.dsn)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), max(r.scheduled_for), min(h.next_start_at) FROM jobs.runs AS r"
            " JOIN jobs.definition_health AS h ON h.id = r.definition_id"
            " WHERE h.name = 'often' AND r.status = 'QUEUED'"
        ).fetchone()
    assert row is not None
    queued, last, next_start = row
    assert queued >= 5 and next_start is not None, (queued, next_start)
    paused = ok("preview", "--definition", "often", "--count", "3", "--dsn", db.dsn)
    local = last.astimezone(ZoneInfo("Europe/Sofia")).strftime("%Y-%m-%d %H:%M")
    assert f"paused: {queued} runs queued before the pause still start (the last at {local}" in paused, paused
    assert "none of these runs" not in paused, paused
