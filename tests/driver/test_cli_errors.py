"""The CLI on bad input: the right exit code (2 usage or bad input, 1 runtime failure) and
exactly one readable line on stderr, never a traceback; `--help` everywhere has an example;
`pgtick preview` shows local wall time across a DST change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from procs import ROOT, pgtick

from harness import Database, Server

NOWHERE = "postgresql://nobody@127.0.0.1:1/x"  # nothing listens on port 1
EXAMPLE = str(ROOT / "examples" / "app.py")  # imports without a database

# (id, argv with {dsn} for the test database, expected exit code, text the error line must hold)
BAD_INPUT = [
    ("unknown-command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ("unknown-option", ["status", "--colour", "--dsn", "{dsn}"], 2, "unrecognized arguments: --colour"),
    ("unreachable-db", ["status", "--dsn", NOWHERE], 1, "cannot connect to PostgreSQL"),
    ("unreachable-db-migrate", ["migrate", "--dsn", NOWHERE], 1, "cannot connect to PostgreSQL"),
    ("unreachable-db-run", ["run", EXAMPLE, "--dsn", NOWHERE], 1, "cannot connect to PostgreSQL"),
    ("bad-cron", ["define", "x", "k", "--schedule", "61 * * * *", "--dsn", "{dsn}"], 2, "minute"),
    ("bad-rrule", ["define", "x", "k", "--schedule", "FREQ=FORTNIGHTLY", "--dsn", "{dsn}"], 2, "FREQ"),
    (
        "unknown-zone",
        ["define", "x", "k", "--schedule", "0 9 * * *", "--tz", "Mars/Olympus", "--dsn", "{dsn}"],
        2,
        "Mars/Olympus",
    ),
    (
        "unknown-zone-one-shot",  # no schedule to parse in Python: the SQL check answers (22023)
        ["define", "x", "k", "--run-at", "2030-01-01T00:00:00Z", "--tz", "Mars/Olympus", "--dsn", "{dsn}"],
        2,
        "Mars/Olympus",
    ),
    ("bad-run-at", ["define", "x", "k", "--run-at", "next tuesday", "--dsn", "{dsn}"], 2, "ISO 8601"),
    ("no-schedule", ["define", "x", "k", "--dsn", "{dsn}"], 2, "--schedule"),
    ("unknown-definition", ["run-now", "nope", "--dsn", "{dsn}"], 2, "nope"),
    ("unknown-definition-pause", ["pause", "nope", "--dsn", "{dsn}"], 2, "nope"),
    ("unknown-run-cancel", ["cancel", "424242", "--dsn", "{dsn}"], 2, "424242"),
    ("unknown-run-retry", ["retry", "424242", "--dsn", "{dsn}"], 2, "424242"),
    ("cancel-nothing", ["cancel", "--dsn", "{dsn}"], 2, "RUN_ID"),
    ("bad-payload-json", ["enqueue", "k", "--payload", "{oops", "--dsn", "{dsn}"], 2, "not valid JSON"),
    ("payload-not-object", ["enqueue", "k", "--payload", "[1, 2]", "--dsn", "{dsn}"], 2, "JSON object"),
    ("bad-duration", ["lock", "x", "--ttl", "soon", "--dsn", "{dsn}", "--", "true"], 2, "not a duration"),
    ("lock-no-command", ["lock", "x", "--ttl", "5s", "--dsn", "{dsn}"], 2, "command"),
    (
        "lock-missing-program",
        ["lock", "x", "--ttl", "5s", "--dsn", "{dsn}", "--", "/nonexistent/cmd"],
        127,
        "",
    ),
    ("preview-garbage", ["preview", "garbage"], 2, "cron"),
    ("preview-bad-rrule", ["preview", "FREQ=DAILY;BYHOUR=25"], 2, "BYHOUR"),
    ("preview-unknown-zone", ["preview", "0 9 * * *", "--tz", "Nowhere/Land"], 2, "Nowhere/Land"),
    ("preview-bad-after", ["preview", "0 9 * * *", "--after", "yesterday"], 2, "ISO 8601"),
    ("preview-bad-count", ["preview", "0 9 * * *", "--count", "0"], 2, "--count"),
    ("run-missing-app", ["run", "tests/driver/apps/missing.py", "--dsn", "{dsn}"], 2, "not found"),
    ("run-not-an-app", ["run", f"{EXAMPLE}:nothing", "--dsn", "{dsn}"], 2, "no pgtick.App named 'nothing'"),
]


@pytest.fixture(scope="module")
def shared_db(pg: Server) -> Iterator[Database]:
    """One database for every bad-input case: none of them may change it."""
    database = pg.create_database()
    try:
        yield database
    finally:
        pg.drop_database(database)


@pytest.mark.parametrize(
    ("argv", "code", "needle"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_exits_with_one_line_and_no_traceback(
    shared_db: Database, argv: list[str], code: int, needle: str
) -> None:
    result = pgtick(*[a.replace("{dsn}", shared_db.dsn) for a in argv])
    shown = (
        f"pgtick {' '.join(argv)}\nexit {result.returncode}\n"
        f"stdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    )
    assert result.returncode == code, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    assert len(result.stderr.splitlines()) == 1, f"expected exactly one line on stderr:\n{shown}"
    assert result.stderr.startswith("pgtick"), shown
    assert needle in result.stderr, f"the error should mention {needle!r}:\n{shown}"
    assert result.stdout == "", shown


COMMANDS = [
    "run",
    "migrate",
    "define",
    "enqueue",
    "run-now",
    "cancel",
    "pause",
    "resume",
    "retry",
    "status",
    "runs",
    "preview",
    "lock",
    "dsn",
    "web",
]


def test_every_command_is_listed_here() -> None:
    from pgtick.cli import EXAMPLES

    assert set(EXAMPLES) == set(COMMANDS)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_has_an_example(command: str | None) -> None:
    result = pgtick(*([command] if command else []), "--help")
    assert result.returncode == 0, result
    assert "example" in result.stdout, result.stdout
    assert result.stderr == "", result.stderr


def test_preview_keeps_local_time_across_the_dst_change() -> None:
    result = pgtick(
        "preview",
        "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0",
        "--tz",
        "Europe/Sofia",
        "--after",
        "2026-03-26",
        "--count",
        "6",
    )
    assert result.returncode == 0, result
    runs = [line.split() for line in result.stdout.splitlines()[1:]]
    # 2026-03-29 (a Sunday) 03:00 EET -> 04:00 EEST: 09:00 local is 07:00Z before, 06:00Z after.
    assert [(r[0], r[1], r[-1]) for r in runs] == [
        ("2026-03-26", "09:00", "2026-03-26T07:00:00Z"),
        ("2026-03-27", "09:00", "2026-03-27T07:00:00Z"),
        ("2026-03-30", "09:00", "2026-03-30T06:00:00Z"),
        ("2026-03-31", "09:00", "2026-03-31T06:00:00Z"),
        ("2026-04-01", "09:00", "2026-04-01T06:00:00Z"),
        ("2026-04-02", "09:00", "2026-04-02T06:00:00Z"),
    ], result.stdout
    assert result.stderr == "", result.stderr
