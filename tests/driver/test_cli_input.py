"""What a person types reaches the database as they meant it, or not at all.

Through the installed `pgtick` executable against real PostgreSQL: a time without a UTC
offset is wall time in the zone the command names (never the session's or the server's
TimeZone), across DST gaps and repeats; every number, duration, payload, name and date is
parsed once, range-checked, and a bad one is one readable line, exit 2, with the database
unchanged."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import make_conninfo

from harness import ROOT, Database, Server, digest, env_for, scalar
from pgtick import cli

PGTICK_EXE = str(Path(sys.executable).parent / "pgtick")  # the console script pip installed

#: Session zones far from Sofia and from each other: a time read in either would show.
SESSION_ZONES = ["America/Los_Angeles", "Pacific/Auckland"]


def exe(*args: str | bytes, pgtz: str | None = None) -> subprocess.CompletedProcess[str]:
    """The `pgtick` executable, to completion; PGTZ set as a user's shell might have it."""
    env = env_for(None)
    if pgtz is not None:
        env["PGTZ"] = pgtz
    return subprocess.run(
        [PGTICK_EXE, *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT, errors="replace"
    )


def ok(*args: str, pgtz: str | None = None) -> str:
    result = exe(*args, pgtz=pgtz)
    assert result.returncode == 0, f"pgtick {' '.join(args)}\nexit {result.returncode}\n{result.stderr}"
    return result.stdout


def materialize_one_shots(db: Database, session_zone: str) -> None:
    """What the leader does for one-shots, from a session in another zone."""
    with db.connect() as conn:
        conn.execute(f"SET TimeZone = '{session_zone}'")
        conn.execute("SELECT jobs.materialize_one_shots(interval '20 years', interval '1 minute')")


# -- a time without an offset -------------------------------------------------------------

SOFIA_EVE = datetime(2031, 12, 24, 16, 0, tzinfo=UTC)  # 18:00 EET


@pytest.mark.parametrize("pgtz", SESSION_ZONES)
def test_a_run_at_without_offset_is_read_in_tz_whatever_the_session_zone(
    db: Database, pgtz: str, tmp_path: Path
) -> None:
    dsn = ["--dsn", db.dsn]
    wall = "2031-12-24T18:00:00"
    ok("define", "launch", "announce", "--run-at", wall, "--tz", "Europe/Sofia", *dsn, pgtz=pgtz)
    ok("enqueue", "announce", "--run-at", wall, "--tz", "Europe/Sofia", *dsn, pgtz=pgtz)
    lines = tmp_path / "definitions.jsonl"
    line = {"name": "from-file", "kind": "announce", "run_at": wall, "timezone": "Europe/Sofia"}
    lines.write_text(json.dumps(line) + "\n")
    ok("define", "--from-file", str(lines), *dsn, pgtz=pgtz)
    materialize_one_shots(db, pgtz)
    with db.connect() as conn:
        conn.execute(f"SET TimeZone = '{pgtz}'")
        stored = dict(conn.execute("SELECT name, run_at FROM jobs.definitions").fetchall())
        runs = conn.execute("SELECT origin, scheduled_for FROM jobs.runs ORDER BY id").fetchall()
    expected = {"launch": SOFIA_EVE, "from-file": SOFIA_EVE}
    assert stored == expected, f"PGTZ={pgtz}: definitions' run_at {stored}, expected {SOFIA_EVE}"
    assert sorted(origin for origin, _ in runs) == ["manual", "schedule", "schedule"], runs
    wrong = [(origin, at) for origin, at in runs if at != SOFIA_EVE]
    assert not wrong, f"PGTZ={pgtz}: runs not at 18:00 in Sofia ({SOFIA_EVE}): {wrong}"


def test_preview_define_and_backfill_read_the_same_text_in_the_same_zone(db: Database) -> None:
    """The same wall time typed to preview --after, define --run-at and backfill --from/--to
    names the same instant: the zone given, or the definition's."""
    dsn = ["--dsn", db.dsn]
    ok("define", "daily", "report", "--schedule", "0 18 * * *", "--tz", "Europe/Sofia", *dsn)
    after = ["--after", "2031-12-24T17:59:00", "--count", "1", "--json"]

    def first_run(*what: str) -> str:
        return str(json.loads(ok("preview", *what, *after))["runs"][0]["utc"])

    previewed = first_run("0 18 * * *", "--tz", "Europe/Sofia")
    assert previewed == "2031-12-24T16:00:00Z"
    stored = first_run("--definition", "daily", *dsn)
    assert stored == previewed, "preview --definition reads --after in the definition's zone"
    out = json.loads(
        ok(
            "backfill",
            "daily",
            "--from",
            "2025-12-24T17:59:00",
            "--to",
            "2025-12-24T18:01:00",
            "--json",
            *dsn,
            pgtz="Pacific/Auckland",
        )
    )
    assert out["runs"] == 1, f"the window 17:59..18:01 Sofia holds exactly the 18:00 run: {out}"
    with db.connect() as conn:
        at = scalar(
            conn,
            "SELECT r.scheduled_for FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id",
        )
    assert at == datetime(2025, 12, 24, 16, 0, tzinfo=UTC), f"backfilled {at}, not 18:00 in Sofia"


@pytest.mark.parametrize(
    ("wall", "flags", "expected"),
    [
        # 2031-03-30 03:30 does not exist in Sofia (03:00 EET -> 04:00 EEST)
        ("2031-03-30T03:30:00", [], datetime(2031, 3, 30, 1, 30, tzinfo=UTC)),  # shift: EET offset
        ("2031-03-30T03:30:00", ["--dst-gap", "shift"], datetime(2031, 3, 30, 1, 30, tzinfo=UTC)),
        ("2031-03-30T03:30:00", ["--dst-gap", "end"], datetime(2031, 3, 30, 1, 0, tzinfo=UTC)),  # 04:00 EEST
        # 2031-10-26 03:30 happens twice in Sofia (04:00 EEST -> 03:00 EET)
        ("2031-10-26T03:30:00", [], datetime(2031, 10, 26, 0, 30, tzinfo=UTC)),  # first: EEST
        ("2031-10-26T03:30:00", ["--dst-repeat", "second"], datetime(2031, 10, 26, 1, 30, tzinfo=UTC)),
    ],
    ids=["gap-default", "gap-shift", "gap-end", "repeat-default", "repeat-second"],
)
def test_a_run_at_in_a_dst_gap_or_repeat_follows_the_schedule_policy(
    db: Database, wall: str, flags: list[str], expected: datetime
) -> None:
    ok(
        "define",
        "edge",
        "k",
        "--run-at",
        wall,
        "--tz",
        "Europe/Sofia",
        *flags,
        "--dsn",
        db.dsn,
        pgtz="America/Los_Angeles",
    )
    with db.connect() as conn:
        stored = scalar(conn, "SELECT run_at FROM jobs.definitions WHERE name = 'edge'")
    assert stored == expected, f"{wall} Europe/Sofia {flags}: stored {stored}, expected {expected}"


def test_a_run_at_that_names_no_single_instant_is_refused(db: Database) -> None:
    with db.connect() as conn:
        before = digest(conn)
    for wall, flags, needle in (
        ("2031-03-30T03:30:00", ["--dst-gap", "skip"], "does not exist in Europe/Sofia"),
        ("2031-10-26T03:30:00", ["--dst-repeat", "both"], "happens twice in Europe/Sofia"),
    ):
        result = exe("define", "edge", "k", "--run-at", wall, "--tz", "Europe/Sofia", *flags, "--dsn", db.dsn)
        assert_refused(result, needle)
    with db.connect() as conn:
        assert digest(conn) == before


@pytest.mark.parametrize(
    ("zone", "bound", "needle", "readings"),
    [
        # 2031-03-30 03:30 does not exist in Sofia (03:00 EET -> 04:00 EEST)
        (
            "Europe/Sofia",
            ["--from", "2031-03-30T03:30", "--to", "2031-03-31T00:00"],
            "--from: 2031-03-30T03:30:00 does not exist in Europe/Sofia",
            ["2031-03-30T03:30:00+03:00 (2031-03-30T00:30:00Z, 02:30 EET)",
             "2031-03-30T03:30:00+02:00 (2031-03-30T01:30:00Z, 04:30 EEST)"],
        ),
        # 2031-10-26 03:30 happens twice in Sofia (04:00 EEST -> 03:00 EET)
        (
            "Europe/Sofia",
            ["--from", "2031-10-25T00:00", "--to", "2031-10-26T03:30"],
            "--to: 2031-10-26T03:30:00 happens twice in Europe/Sofia",
            ["2031-10-26T03:30:00+03:00 (2031-10-26T00:30:00Z, 03:30 EEST)",
             "2031-10-26T03:30:00+02:00 (2031-10-26T01:30:00Z, 03:30 EET)"],
        ),
        # a date: midnight of 2025-09-07 does not exist in Santiago (00:00 -04 -> 01:00 -03);
        # one reading is on the day before, and says so
        (
            "America/Santiago",
            ["--from", "2025-09-07", "--to", "2025-09-10"],
            "--from: 2025-09-07T00:00:00 does not exist in America/Santiago",
            ["2025-09-07T00:00:00-03:00 (2025-09-07T03:00:00Z, 2025-09-06 23:00 -04)",
             "2025-09-07T00:00:00-04:00 (2025-09-07T04:00:00Z, 01:00 -03)"],
        ),
    ],
    ids=["gap", "repeat", "gap-at-midnight"],
)  # fmt: skip
def test_a_backfill_bound_the_zone_skips_or_repeats_is_refused_naming_both_instants(
    db: Database, zone: str, bound: list[str], needle: str, readings: list[str]
) -> None:
    """Which reading of an ambiguous bound is meant decides whether a whole hour of
    occurrences falls in the window: `pgtick backfill` asks for a UTC offset instead of
    picking one, and writes nothing."""
    dsn = ["--dsn", db.dsn]
    ok("define", "hourly", "k", "--schedule", "0 * * * *", "--tz", zone, *dsn)
    with db.connect() as conn:
        before = digest(conn)
    result = exe("backfill", "hourly", *bound, *dsn)
    assert_refused(result, needle)
    for reading in readings:
        assert reading in result.stderr, f"the error should name {reading}:\n{result.stderr}"
    with db.connect() as conn:
        assert digest(conn) == before, "a refused backfill changed the database"


def test_a_backfill_bound_with_an_offset_reads_either_instant_of_a_repeat(db: Database) -> None:
    """Each of the two readings of a repeated wall time, given with its offset, is taken as
    written: the hourly job's window from the first 03:30 holds one run more."""
    dsn = ["--dsn", db.dsn]
    for name in ("first", "second"):
        ok("define", name, "k", "--schedule", "0 * * * *", "--tz", "Europe/Sofia", *dsn)
    window = ["--to", "2025-10-26T05:00", "--json", *dsn]  # 03:30 happens twice in Sofia that day
    first = json.loads(ok("backfill", "first", "--from", "2025-10-26T03:30:00+03:00", *window))
    second = json.loads(ok("backfill", "second", "--from", "2025-10-26T03:30:00+02:00", *window))
    assert (first["runs"], second["runs"]) == (3, 2), (first, second)


# -- bad input: one line, exit 2, nothing changed --------------------------------------------

NESTED = "[" * 60_000 + "]" * 60_000  # within the 128 KiB a single argument may have
REFUSED: list[tuple[str, list[str | bytes], str]] = [
    ("huge-run-id-cancel", ["cancel", "99999999999999999999"], "run_id: must be between 1 and"),
    ("huge-run-id-retry", ["retry", "9223372036854775808"], "must be between 1 and 9223372036854775807"),
    ("huge-run-id-show", ["show", "99999999999999999999"], "must be between"),
    ("run-id-zero", ["cancel", "0"], "(got 0)"),
    ("run-id-not-a-number", ["cancel", "12abc"], "must be a whole number"),
    (
        "max-attempts-int4",
        ["define", "x", "k", "--schedule", "* * * * *", "--max-attempts", "2147483648"],
        "--max-attempts: must be between 1 and 1000 (got 2147483648)",
    ),
    ("cap-huge", ["define", "x", "k", "--schedule", "* * * * *", "--cap", "99999999999999999999"], "--cap:"),
    ("priority-int2", ["enqueue", "k", "--priority", "-32769"], "--priority: must be between -1000 and 1000"),
    ("priority-float", ["enqueue", "k", "--priority", "1e3"], "--priority: must be a whole number"),
    (
        "pause-after-huge",
        ["define", "x", "k", "--schedule", "* * * * *", "--pause-after-failures", "4294967296"],
        "--pause-after-failures:",
    ),
    ("status-limit-huge", ["status", "--limit", "99999999999999999999"], "--limit:"),
    ("status-offset-negative", ["status", "--offset", "-1"], "--offset:"),
    ("runs-limit-int4", ["runs", "--limit", "2147483648"], "--limit:"),
    ("definitions-limit-zero", ["definitions", "--limit", "0"], "--limit:"),
    ("preview-count-huge", ["preview", "0 9 * * *", "--count", "99999999999999999999"], "--count:"),
    ("prune-batch-huge", ["prune", "--batch", "99999999999999999999"], "--batch:"),
    ("claimers-zero", ["run", "examples/app.py", "--claimers", "0"], "--claimers: must be between 1 and 16"),
    ("claimers-too-many", ["run", "examples/app.py", "--claimers", "17"], "--claimers:"),
    (
        "timeout-years",
        ["define", "x", "k", "--schedule", "* * * * *", "--timeout", "10000000y"],
        "--timeout:",
    ),
    (
        "timeout-days-overflow",
        ["define", "x", "k", "--schedule", "* * * * *", "--timeout", "9" * 400 + "d"],
        "--timeout: must be at most",
    ),
    ("timeout-zero", ["define", "x", "k", "--schedule", "* * * * *", "--timeout", "0s"], "positive"),
    ("jitter-over-a-day", ["define", "x", "k", "--schedule", "0 0 1 1 *", "--jitter", "2d"], "--jitter:"),
    ("prune-older-than-huge", ["prune", "--older-than", "99999999999d"], "--older-than:"),
    ("lock-ttl-huge", ["lock", "x", "--ttl", "100000000d", "--", "true"], "--ttl:"),
    # A lease shorter than a round trip is lost before the command runs: it was started, then
    # stopped, blamed on the database.
    (
        "lock-ttl-sub-second",
        ["lock", "x", "--ttl", "1ms", "--", "true"],
        "--ttl: must be at least 1s (got '1ms')",
    ),
    ("status-watch-1ms", ["status", "--watch", "1ms"], "--watch: must be at least 100ms (got '1ms')"),
    (
        "tick-over-a-day",
        ["run", "examples/app.py", "--no-worker", "--tick", "30d"],
        "--tick: must be at most",
    ),
    (
        "lease-ttl-within-a-tick",
        ["run", "examples/app.py", "--no-worker", "--tick", "10s", "--lease-ttl", "10s"],
        "--lease-ttl must be longer than --tick",
    ),
    ("payload-invalid", ["enqueue", "k", "--payload", "{'a': 1}"], "not valid JSON"),
    ("payload-not-object", ["enqueue", "k", "--payload", '"text"'], "JSON object"),
    ("payload-nan", ["enqueue", "k", "--payload", '{"a": NaN}'], "NaN is not a JSON number"),
    (
        "payload-infinity",
        ["define", "x", "k", "--schedule", "* * * * *", "--payload", '{"a": -Infinity}'],
        "-Infinity",
    ),
    ("payload-nul", ["enqueue", "k", "--payload", '{"a": "x\\u0000y"}'], "NUL"),
    ("payload-nested", ["enqueue", "k", "--payload", NESTED], "nested too deeply"),
    ("payload-huge-integer", ["enqueue", "k", "--payload", '{"a": ' + "9" * 5000 + "}"], "payload"),
    ("name-control", ["define", "bad\x01name", "k", "--schedule", "* * * * *"], "control characters"),
    ("kind-control", ["enqueue", "k\x7f"], "control characters"),
    ("name-newline", ["run-now", "a\nb"], "control characters"),
    ("kind-empty", ["enqueue", ""], "must not be empty"),
    ("name-blank", ["pause", "   "], "must not be empty"),
    ("schedule-newline", ["define", "x", "k", "--schedule", "* * * * *\n"], "--schedule: must not contain"),
    ("rrule-tab", ["preview", "DTSTART:20260101T000000\tRRULE:FREQ=DAILY"], "must not contain control"),
    ("schedule-too-long", ["preview", "* " * 2001], "must be at most 4000 characters"),
    ("queue-empty", ["enqueue", "k", "--queue", ""], "--queue: must not be empty"),
    ("key-too-long", ["enqueue", "k", "--key", "x" * 201], "--key: must be at most 200"),
    ("tz-empty", ["define", "x", "k", "--schedule", "* * * * *", "--tz", ""], "--tz:"),
    ("tz-unknown", ["enqueue", "k", "--run-at", "2031-01-01T00:00", "--tz", "Mars/Olympus"], "Mars/Olympus"),
    ("argv-not-utf8", ["enqueue", b"k\xff"], "not valid UTF-8"),
    ("dsn-not-a-connection-string", ["status", "--dsn", "foo"], "--dsn: not a connection string"),
    ("dsn-empty", ["status", "--dsn", ""], "--dsn: must not be empty"),
    ("run-at-year-0", ["enqueue", "k", "--run-at", "0000-01-01T00:00:00Z"], "out of range"),
    ("run-at-year-99999", ["define", "x", "k", "--run-at", "99999-01-01T00:00:00"], "--run-at:"),
    ("run-at-past-9999-in-utc", ["enqueue", "k", "--run-at", "9999-12-31T23:00:00-05:00"], "out of range"),
    (
        "run-at-before-year-1-in-utc",
        ["enqueue", "k", "--run-at", "0001-01-01T00:30:00", "--tz", "Asia/Tokyo"],
        "out of range",
    ),
    ("after-year-0", ["preview", "0 9 * * *", "--after", "0000-12-31"], "--after:"),
    (
        "schedule-with-a-huge-unknown-part",
        ["define", "x", "k", "--schedule", "FREQ=DAILY;" + "Z" * 3000 + "=1"],
        "(3002 characters)",
    ),
    (
        "payload-with-an-integer-python-cannot-read",
        ["enqueue", "k", "--payload", '{"a": ' + "9" * 5000 + "}"],
        "has 5000 digits, more than a worker in Python reads (4300)",
    ),
    (
        "timeout-under-a-second",
        ["define", "dd", "k", "--schedule", "@daily", "--timeout", "0.0004s"],
        "--timeout: must be at least 1s",
    ),
    (
        "duration-in-other-digits",
        ["define", "dd", "k", "--schedule", "@daily", "--timeout", "\u0661\u0660m"],
        "--timeout",
    ),
    ("integer-in-other-digits", ["enqueue", "k", "--priority", "\u0663"], "--priority"),
    ("integer-with-an-underscore", ["enqueue", "k", "--priority", "1_0"], "--priority"),
    ("web-empty", ["run", "examples/app.py", "--web", ""], "--web"),
    ("run-at-month-13", ["enqueue", "k", "--run-at", "2026-13-01"], "--run-at: the month must be 1 to 12"),
    (
        "run-at-february-30",
        ["enqueue", "k", "--run-at", "2026-02-30T00:00"],
        "--run-at: no such day in that month",
    ),
    (
        "run-at-hour-24",
        ["enqueue", "k", "--run-at", "2026-01-01T24:00"],
        "--run-at: the hour must be 0 to 23",
    ),
    (
        "after-second-60",
        ["preview", "@daily", "--after", "2026-01-01T00:00:60Z"],
        "--after: the second must be 0",
    ),
    (
        "run-at-offset-of-a-day",
        ["enqueue", "k", "--run-at", "2026-01-01T00:00+25:00"],
        "--run-at: the UTC offset must be under 24 hours",
    ),
    ("migrate-sql-as-json", ["migrate", "--sql", "--json"], "give one of --sql or --json"),
    (
        "define-interval-past-the-calendar",
        ["define", "y", "k", "--schedule", "FREQ=DAILY;INTERVAL=99999999999999999999", "--jitter", "5m"],
        "INTERVAL must be at most 365,000",
    ),
    (
        "after-year-1-local-before-it",
        ["preview", "FREQ=DAILY", "--after", "0001-01-01T00:00:00Z", "--tz", "America/New_York"],
        "outside the years 1 to 9999",
    ),
    (
        "after-year-9999-local-past-it",
        ["preview", "FREQ=DAILY", "--after", "9999-12-31T20:00:00Z", "--tz", "Pacific/Kiritimati"],
        "outside the years 1 to 9999",
    ),
    (
        "anchor-year-1-local-before-it",
        ["preview", "FREQ=DAILY", "--anchor", "0001-01-01T00:00:00Z", "--tz", "America/New_York"],
        "outside the years 1 to 9999",
    ),
    ("backfill-from-year-0", ["backfill", "x", "--from", "0000-01-01", "--to", "2031-01-01"], "--from:"),
    (
        "backfill-from-in-a-dst-gap",
        ["backfill", "x", "--from", "2031-03-30T03:30", "--to", "2031-04-01"],
        "--from: 2031-03-30T03:30:00 does not exist in Europe/Sofia",
    ),
    (
        "backfill-to-in-a-dst-repeat",
        ["backfill", "x", "--from", "2031-10-25", "--to", "2031-10-26T03:30"],
        "--to: 2031-10-26T03:30:00 happens twice in Europe/Sofia",
    ),
]


def assert_refused(result: subprocess.CompletedProcess[str], needle: str) -> None:
    shown = f"exit {result.returncode}\nstdout: {result.stdout[:300]!r}\nstderr: {result.stderr[:600]!r}"
    assert result.returncode == 2, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    assert len(result.stderr.splitlines()) == 1, f"expected exactly one line on stderr:\n{shown}"
    assert result.stderr.startswith("pgtick"), shown
    assert needle in result.stderr, f"the error should say {needle!r}:\n{shown}"
    assert len(result.stderr) <= 500, f"an error line of {len(result.stderr)} characters:\n{shown}"
    assert result.stdout == "", shown


@pytest.mark.parametrize(
    ("created_at", "zone"),
    [("0001-01-01 00:00+00", "America/New_York"), ("9999-12-31 20:00+00", "Pacific/Kiritimati")],
)
def test_preview_of_a_definition_created_at_the_ends_of_the_calendar_is_one_line(
    db: Database, created_at: str, zone: str
) -> None:
    """A creation time whose local day falls outside the years 1 to 9999 (the scheduler
    records it as the definition's schedule error) is one line from preview, exit 2."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('edge', 'k', schedule => 'FREQ=DAILY', timezone => %s)", (zone,))
        conn.execute("UPDATE jobs.definitions SET created_at = %s WHERE name = 'edge'", (created_at,))
    result = exe("preview", "--definition", "edge", "--dsn", db.dsn)
    assert_refused(result, "outside the years 1 to 9999")


@pytest.fixture(scope="module")
def seeded(pg: Server) -> Iterator[Database]:
    """A database with a definition, runs of each state and a retry policy: none of the
    refused commands may change any of it."""
    with pg.database() as database, database.connect() as conn:
        conn.execute("SELECT jobs.define('x', 'k', schedule => '0 9 * * *', timezone => 'Europe/Sofia')")
        conn.execute("SELECT jobs.enqueue('k', '{\"n\": 1}')")
        conn.execute("SELECT jobs.enqueue('k', '{\"n\": 2}', run_at => now() + interval '1 day')")
        yield database


@pytest.mark.parametrize(("argv", "needle"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    seeded: Database, argv: list[str | bytes], needle: str
) -> None:
    with seeded.connect() as conn:
        before = digest(conn)
    result = exe(*argv, "--dsn", seeded.dsn) if "--" not in argv else exe(*_dsn_before_dashes(argv, seeded))
    assert_refused(result, needle)
    with seeded.connect() as conn:
        assert digest(conn) == before, f"pgtick {argv!r} was refused but changed the database"


def _dsn_before_dashes(argv: list[str | bytes], db: Database) -> list[str | bytes]:
    split = argv.index("--")
    return [*argv[:split], "--dsn", db.dsn, *argv[split:]]


# -- arbitrary text to every numeric, duration and time option -----------------------------

OPTIONS: list[tuple[list[str], bool]] = [  # (argv before the value, needs the database)
    (["preview", "0 9 * * *", "--count"], False),
    (["preview", "0 9 * * *", "--tz", "Europe/Sofia", "--after"], False),
    (["preview", "0 9 * * *", "--tz", "Europe/Sofia", "--anchor"], False),
    (["preview", "0 9 * * *", "--tz"], False),
    (["status", "--limit"], True),
    (["status", "--offset"], True),
    (["status", "--recent"], True),
    (["runs", "--limit"], True),
    (["cancel"], True),
    (["show"], True),
    (["prune", "--dry-run", "--older-than"], True),
    (["prune", "--dry-run", "--batch"], True),
    (["enqueue", "k", "--tz", "Europe/Sofia", "--run-at"], True),
    (["enqueue", "k", "--priority"], True),
    (["define", "x", "k", "--schedule", "0 9 * * *", "--timeout"], True),
    (["define", "x", "k", "--schedule", "0 9 * * *", "--max-attempts"], True),
    (["define", "x", "k", "--schedule", "0 0 1 1 *", "--jitter"], True),
    (["define", "x", "k", "--tz", "Europe/Sofia", "--run-at"], True),
    (["run-now"], True),  # names: any text is a name that exists, one that does not, or refused
    (["enqueue", "k", "--queue"], True),
    (["enqueue", "k", "--payload"], True),
    (["definitions", "--name"], True),
]

VALUES = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"\A[+-]?[0-9]{1,40}(\.[0-9]{1,5})?(ms|s|m|h|d|y)?\Z"),
    st.from_regex(
        r"\A[0-9]{1,6}-[0-9]{1,2}-[0-9]{1,2}(T[0-9]{1,2}:[0-9]{2}(:[0-9]{2})?)?(Z|[+-][0-9]{2}:[0-9]{2})?\Z"
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(OPTIONS), value=VALUES)
def test_any_text_to_a_typed_option_is_accepted_or_refused_cleanly(
    seeded: Database, capsys: pytest.CaptureFixture[str], option: tuple[list[str], bool], value: str
) -> None:
    """In-process for speed: the same parser and commands as the executable."""
    head, needs_db = option
    argv = [*head, value, "--json"] + (["--dsn", seeded.dsn] if needs_db else [])
    if head[0] == "prune":
        argv.remove("--json")
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code if isinstance(exc.code, int) else 2
    _, err = capsys.readouterr()
    assert code in (0, 2), f"pgtick {argv!r}: exit {code}\n{err}"
    assert "Traceback" not in err, err
    if code == 2:
        assert len(err.splitlines()) == 1, f"pgtick {argv!r}: not one line:\n{err}"


def test_every_numeric_option_has_a_range() -> None:
    """No option of the CLI is a bare int: each goes through the typed, range-checked parser."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [
        f"{name} {action.dest}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.type in (int, float)
    ]
    assert not bare, f"options parsed as a bare int or float, without a range: {bare}"


def test_every_numeric_option_says_its_range_in_its_help() -> None:
    """A value out of range says "see pgtick CMD --help": the help says what the range is."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    unsaid = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.type is None:
                continue
            try:
                action.type("9" * 25)  # past every range: the refusal names the range
            except argparse.ArgumentTypeError as exc:
                found = re.search(r"between (-?\d+) and (\d+)", str(exc))
            else:
                continue
            if found is None:  # not a whole-number option
                continue
            low, high = found.groups()
            said = f"{low}..{high}" if int(high) < 2**63 - 1 else f"{low} or more"
            if said not in (action.help or ""):
                unsaid.append(f"pgtick {name} {action.option_strings[0]}: {action.help!r} lacks {said!r}")
    assert not unsaid, "\n".join(unsaid)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "defs.jsonl:1: is nested too deeply"),
        ('{"name": "n", "kind": "k", "schedule": "* * * * *", "payload": {"a": NaN}}', "NaN is not a JSON"),
        ('{"name": "n\\u0000", "kind": "k", "schedule": "* * * * *"}', "defs.jsonl:1: must not contain NUL"),
    ],
    ids=["nested", "nan", "nul"],
)
def test_a_definitions_file_with_json_jsonb_refuses_is_one_line(
    seeded: Database, tmp_path: Path, content: str, needle: str
) -> None:
    path = tmp_path / "defs.jsonl"
    path.write_text(content + "\n")
    with seeded.connect() as conn:
        before = digest(conn)
    assert_refused(exe("define", "--from-file", str(path), "--dsn", seeded.dsn), needle)
    with seeded.connect() as conn:
        assert digest(conn) == before


@pytest.mark.parametrize(
    ("suffix", "body"),
    [
        (".jsonl", '{"name": "x", "kind": "k", "schedule": "*/5 * * * *", "jitter": "10 minutes"}'),
        (".jsonl", '{"name": "x", "kind": "k", "schedule": "*/5 * * * *", "jitter": "00:10:00"}'),
        (".jsonl", '{"name": "x", "kind": "k", "schedule": "*/5 * * * *", "jitter": "600"}'),
        (".csv", "name,kind,schedule,jitter\nx,k,*/5 * * * *,10 minutes"),
    ],
    ids=["words", "clock", "seconds-text", "csv"],
)
def test_a_jitter_written_as_interval_text_in_a_definitions_file_is_held_to_the_spacing_of_runs(
    seeded: Database, tmp_path: Path, suffix: str, body: str
) -> None:
    """A definitions file may write jitter as interval text, as jobs.define_many takes it: it is
    checked against the schedule's spacing as a jitter in seconds is (and --jitter 10m)."""
    path = tmp_path / f"defs{suffix}"
    path.write_text(body + "\n")
    with seeded.connect() as conn:
        before = digest(conn)
    assert_refused(
        exe("define", "--from-file", str(path), "--dsn", seeded.dsn),
        "definition=x jitter 0:10:00 is longer than the 0:05:00 between runs",
    )
    with seeded.connect() as conn:
        assert digest(conn) == before


def test_a_jitter_in_a_definitions_file_that_is_no_interval_is_refused_by_the_sql_api(
    seeded: Database, tmp_path: Path
) -> None:
    path = tmp_path / "defs.jsonl"
    path.write_text('{"name": "x", "kind": "k", "schedule": "*/5 * * * *", "jitter": "soon"}\n')
    assert_refused(
        exe("define", "--from-file", str(path), "--dsn", seeded.dsn),
        "definitions[0] (x): jitter must be a number of seconds or an interval",
    )


@pytest.mark.parametrize("target", [":app", ".app", "", "a..b:app", "my-app"])
def test_an_app_that_is_no_module_name_is_one_line_saying_what_app_takes(
    seeded: Database, target: str
) -> None:
    """A mistyped APP is the user's mistake, not an error that the app raised while imported."""
    module = target.partition(":")[0]
    assert_refused(
        exe("run", target, "--dsn", seeded.dsn),
        f"pgtick run: error: {module!r} is not a module name: give module[:attr] or path/to/file.py[:attr]",
    )


@pytest.mark.parametrize("level", ["serializable", "repeatable read"])
def test_a_database_whose_default_isolation_is_not_read_committed_takes_the_commands(
    db: Database, level: str
) -> None:
    """A database (or role, or DSN) set to default_transaction_isolation serializable is the
    application's choice; pgtick's own connections still run its calls, which need READ
    COMMITTED, as pgtick run's claims do."""
    dsn = make_conninfo(db.dsn, options="-c default_transaction_isolation=" + level.replace(" ", "\\ "))
    ok("enqueue", "k", "--key", "order-42", "--dsn", dsn)
    ok("enqueue", "k", "--key", "order-42", "--dsn", dsn)
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE idempotency_key = 'order-42'") == 1


def test_a_definitions_file_that_is_not_utf8_is_one_line(seeded: Database, tmp_path: Path) -> None:
    path = tmp_path / "defs.jsonl"
    path.write_bytes(b'\xff\xfe{"name": "n"}\n')
    assert_refused(exe("define", "--from-file", str(path), "--dsn", seeded.dsn), "is not UTF-8 text")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_definitions_file_with_a_byte_order_mark_is_read(db: Database, tmp_path: Path, suffix: str) -> None:
    """As a spreadsheet saves it: UTF-8 with a byte order mark before the first field name."""
    path = tmp_path / f"defs{suffix}"
    body = (
        "name,kind,schedule\nbom-def,k,* * * * *\n"
        if suffix == ".csv"
        else '{"name": "bom-def", "kind": "k", "schedule": "* * * * *"}\n'
    )
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    result = exe("define", "--from-file", str(path), "--dsn", db.dsn)
    assert result.returncode == 0, result
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM jobs.definitions WHERE name = 'bom-def'").fetchone() == (1,)


def test_a_bad_pgtick_now_is_one_line(seeded: Database) -> None:
    env = {**env_for(None), "PGTICK_NOW": "garbage"}
    result = subprocess.run(
        [PGTICK_EXE, "status", "--dsn", seeded.dsn], capture_output=True, text=True, env=env
    )
    assert_refused(result, "PGTICK_NOW must be an ISO 8601 time")


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("PGTICK_LOG", "basic_format", "PGTICK_LOG=BASIC_FORMAT is not a level"),
        ("PGTICK_LOG", "loud", "PGTICK_LOG=LOUD is not a level"),
        ("PGTICK_LOG_FORMAT", "xml", "PGTICK_LOG_FORMAT=xml is not a log format"),
    ],
)
def test_a_log_setting_that_is_no_setting_is_one_warning_and_the_command_runs(
    seeded: Database, variable: str, value: str, said: str
) -> None:
    """A name of the logging module that is no level (BASIC_FORMAT is its format string) ended
    every command in a traceback; an unknown one was ignored without a word."""
    env = {**env_for(None), variable: value}
    result = subprocess.run(
        [PGTICK_EXE, "runs", "--dsn", seeded.dsn], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr


def test_a_log_format_is_read_whatever_its_case_as_the_log_level_is(seeded: Database) -> None:
    """PGTICK_LOG=info is INFO; PGTICK_LOG_FORMAT=JSON is json, not a warning that it is no
    format and lines for humans."""
    env = {**env_for(None), "PGTICK_LOG_FORMAT": "JSON", "PGTICK_LOG": "loud"}
    result = subprocess.run(
        [PGTICK_EXE, "runs", "--dsn", seeded.dsn], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = json.loads(lines[0])
    assert "PGTICK_LOG=LOUD is not a level" in line["message"], line


def test_a_database_without_the_schema_says_to_migrate(pg: Server) -> None:
    empty = pg.create_empty_database()
    try:
        for argv in (["status"], ["runs"], ["enqueue", "k"], ["show", "1"]):
            result = exe(*argv, "--dsn", empty.dsn)
            shown = f"{argv}: exit {result.returncode} {result.stderr!r}"
            assert result.returncode == 1 and "Traceback" not in result.stderr, shown
            assert len(result.stderr.splitlines()) == 1 and "run pgtick migrate" in result.stderr, shown
    finally:
        pg.drop_database(empty)


@pytest.mark.parametrize("variable", ["DATABASE_URL", "PGTICK_DSN"])
@pytest.mark.parametrize("argv", [["status"], ["runs", "--json"], ["run", "examples/app.py"]])
def test_a_bad_dsn_in_the_environment_is_a_usage_error_naming_the_variable(
    variable: str, argv: list[str]
) -> None:
    """A connection string with a typo in $DATABASE_URL is the same mistake as in --dsn:
    exit 2 and one line that says where the bad text came from."""
    env = {**env_for(None), variable: "postgresql://[::1"}
    result = subprocess.run(
        [PGTICK_EXE, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert_refused(result, f"${variable}: not a connection string or URL")
    # Blank, as --dsn ' ' is refused: libpq would take it for every default (the local socket).
    blank = subprocess.run(
        [PGTICK_EXE, *argv],
        capture_output=True,
        text=True,
        env={**env, variable: " \t"},
        cwd=ROOT,
        timeout=60,
    )
    assert_refused(blank, f"${variable}: must not be blank")


@pytest.mark.parametrize("variable", ["DATABASE_URL", "PGTICK_DSN"])
@pytest.mark.parametrize("argv", [["status"], ["define", "x", "k", "--schedule", "@daily"]])
def test_a_dsn_in_the_environment_that_is_not_utf8_is_a_usage_error_naming_the_variable(
    variable: str, argv: list[str]
) -> None:
    """Bytes that are not UTF-8 in $DATABASE_URL are refused as they are in --dsn: exit 2 and
    one line naming the variable, its password masked."""
    env: dict[str, str | bytes] = {**env_for(None), variable: b"postgresql://app:s3cr3t@127.0.0.1:1/x\xff"}
    result = subprocess.run(
        [PGTICK_EXE, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, errors="replace"
    )
    assert_refused(result, f"${variable}: not valid UTF-8: 'postgresql://app:***@127.0.0.1:1/x\ufffd'")
    assert "s3cr3t" not in result.stderr, result.stderr


def test_a_utf8_dsn_in_the_environment_of_an_ascii_locale_is_read_as_utf8(seeded: Database) -> None:
    """Under LC_ALL=C without UTF-8 mode Python keeps the bytes of "é" in $DATABASE_URL
    undecoded; they are UTF-8, so the variable is read as the text it is, as an argument is."""
    env = {**env_for(None), "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    for name in ("PYTHONIOENCODING", "LANG", "LC_CTYPE", "PGTICK_LOG"):
        env.pop(name, None)
    env["DATABASE_URL"] = make_conninfo(seeded.dsn, application_name="café")
    shown = subprocess.run(
        [PGTICK_EXE, "dsn", "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "application_name=café" in json.loads(shown.stdout)["dsn"], shown.stdout
    used = subprocess.run(
        [PGTICK_EXE, "runs", "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert (used.returncode, used.stderr) == (0, ""), used.stderr


@pytest.mark.parametrize("where", ["--dsn", "DATABASE_URL"])
def test_a_url_that_cannot_be_read_is_quoted_without_its_password(where: str) -> None:
    """libpq quotes a URL it cannot parse in its message; the error line masks the password
    (it goes to a terminal and to CI logs)."""
    url = "postgresql://app:s3cr3t-Pa55@[::1/app"
    env = env_for(None)
    argv = ["status"]
    if where == "--dsn":
        argv += ["--dsn", url]
    else:
        env["DATABASE_URL"] = url
    result = subprocess.run(
        [PGTICK_EXE, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert_refused(result, "not a connection string or URL")
    assert "s3cr" not in result.stderr and "Pa55" not in result.stderr, result.stderr
    assert '"postgresql://app:***@[::1/app"' in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("dsn", "kept"),
    [
        ("postgresql://admin:Sup3r%Secret@db.example.com/app", "invalid percent-encoded token"),
        ("host=db.example.com password=Sup3r Secret", 'missing "=" after'),
    ],
    ids=["percent-in-a-url-password", "space-in-a-keyword-password"],
)
@pytest.mark.parametrize("where", ["--dsn", "DATABASE_URL"])
def test_a_password_libpq_cannot_read_is_not_quoted_in_the_error(where: str, dsn: str, kept: str) -> None:
    """libpq quotes the token it stumbled on, which can be a piece of the password (a '%' in a
    URL's, a space in a keyword string's): the error line says what is wrong without it."""
    env = env_for(None)
    argv = ["status"]
    if where == "--dsn":
        argv += ["--dsn", dsn]
    else:
        env["DATABASE_URL"] = dsn
    result = subprocess.run(
        [PGTICK_EXE, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert_refused(result, "not a connection string or URL")
    assert kept in result.stderr, result.stderr
    assert "Secret" not in result.stderr and "Sup3r" not in result.stderr, result.stderr


def test_an_unknown_option_in_a_connection_string_is_named() -> None:
    """An option's name is no secret, and it is what the reader must fix: it stays quoted."""
    result = subprocess.run(
        [PGTICK_EXE, "status", "--dsn", "host=db.example.com hots=1"],
        capture_output=True,
        text=True,
        env=env_for(None),
        cwd=ROOT,
        timeout=60,
    )
    assert_refused(result, 'invalid connection option "hots"')


@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"], ids=["closed", "full"])
def test_a_standard_error_that_cannot_be_written_neither_stops_nor_fails_a_change(
    pg: Server, stderr: str
) -> None:
    """An enqueue of a kind no worker registered warns on standard error after its commit.
    Closed (2>&-) or full (/dev/full), the warning is dropped: the run is queued once, the
    result is printed and the exit code is 0, so nobody runs it again for a second run."""
    with pg.database() as database:
        result = subprocess.run(
            ["/bin/sh", "-c", f'exec "$0" "$@" {stderr}', PGTICK_EXE, "enqueue", "unregistered", "--json"],
            stdout=subprocess.PIPE,
            text=True,
            env={**env_for(None), "DATABASE_URL": database.dsn},
            cwd=ROOT,
            timeout=60,
        )
        assert result.returncode == 0, result
        shown = json.loads(result.stdout)
        with database.connect() as conn:
            queued = conn.execute("SELECT id FROM jobs.runs WHERE kind = 'unregistered'").fetchall()
        assert [row[0] for row in queued] == [shown["id"]], (queued, shown)


def test_years_before_1000_print_with_four_digits(pg: Server) -> None:
    """The C library writes the year 1 as "1": every time printed, in a run's details, a
    listing and a preview (its UTC column is ISO 8601), keeps four digits."""
    with pg.database() as database:
        env = {**env_for(None), "DATABASE_URL": database.dsn, "COLUMNS": "200"}

        def out(*argv: str) -> str:
            result = subprocess.run(
                [PGTICK_EXE, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
            )
            assert result.returncode == 0, result.stderr
            return result.stdout

        run = json.loads(out("enqueue", "ancient", "--run-at", "0001-01-02T00:00Z", "--json"))
        assert "0001-01-02 00:00:00 UTC" in out("show", str(run["id"])), out("show", str(run["id"]))
        assert "0001-01-02 00:00" in out("runs", "--kind", "ancient")
        shown = out("preview", "FREQ=DAILY", "--tz", "Etc/GMT+12", "--after", "0001-01-01", "--count", "1")
        assert "0001-01-02 00:00 Tue" in shown and "0001-01-02T12:00:00Z" in shown, shown
        assert not re.search(r"(?<![\d-])1-01-02", shown), shown
