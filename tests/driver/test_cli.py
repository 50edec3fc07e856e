"""The CLI on bad input: the right exit code (2 usage or bad input, 1 runtime failure) and
exactly one readable line on stderr, never a traceback; `--help` everywhere has an example;
`pgtick preview` shows local wall time across a DST change."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import (
    PGTICK,
    ROOT,
    Clock,
    Conn,
    Database,
    Server,
    claim,
    digest,
    enqueue,
    env_for,
    pgtick,
    scalar,
)
from pgtick import cli, migrate
from pgtick.scheduler import Scheduler

NOWHERE = "postgresql://nobody@127.0.0.1:1/x"  # nothing listens on port 1
EXAMPLE = str(ROOT / "examples" / "app.py")  # imports without a database

INJECTION = "x'); DROP TABLE jobs.runs; --"

# (id, argv with {dsn} for the test database, expected exit code, text the error line must hold)
BAD_INPUT = [
    ("unknown-command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ("unknown-option", ["status", "--colour", "--dsn", "{dsn}"], 2, "unrecognized arguments: --colour"),
    ("mistyped-command", ["stat"], 2, "pgtick: error: COMMAND: invalid choice: 'stat'; did you mean status?"),
    ("unknown-option-named-by-its-command", ["show", "1", "--bogus"], 2, "pgtick show: error: unrecognized"),
    (
        "lock-without-dashes",
        ["lock", "l", "--ttl", "5m", "echo", "hi", "--dsn", "{dsn}"],
        2,
        "pgtick lock: error: give the command after --: pgtick lock l --ttl ... -- echo hi",
    ),
    (
        "lock-with-the-command-before-its-options",
        ["lock", "l", "echo", "hi", "--ttl", "5m", "--dsn", "{dsn}"],
        2,
        "pgtick lock: error: give the command after --",
    ),
    # The command was given: only the name is missing, and the line says that alone.
    (
        "lock-without-a-name",
        ["lock", "--ttl", "10", "--", "true"],
        2,
        "required: name (see pgtick lock --help)",
    ),
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
    (  # not a character: PostgreSQL's jsonb refuses the escape
        "payload-lone-surrogate",
        ["enqueue", "k", "--payload", '{"a": "\\ud800"}', "--dsn", "{dsn}"],
        2,
        "payload must not contain a lone surrogate",
    ),
    (  # Python reads it as infinity, which JSON cannot write
        "payload-number-past-a-double",
        ["enqueue", "k", "--payload", '{"a": -1e999}', "--dsn", "{dsn}"],
        2,
        "payload is not usable JSON: the number -1e999 is out of range",
    ),
    ("bad-duration", ["lock", "x", "--ttl", "soon", "--dsn", "{dsn}", "--", "true"], 2, "not a duration"),
    ("lock-no-command", ["lock", "x", "--ttl", "5s", "--dsn", "{dsn}"], 2, "command"),
    (
        "lock-missing-program",
        ["lock", "x", "--ttl", "5s", "--dsn", "{dsn}", "--", "/nonexistent/cmd"],
        127,
        "",
    ),
    (  # found but not executable (a directory): 126, as a shell says it
        "lock-program-not-executable",
        ["lock", "x", "--ttl", "5s", "--dsn", "{dsn}", "--", "/"],
        126,
        "Permission denied",
    ),
    ("preview-garbage", ["preview", "garbage"], 2, "cron"),
    ("preview-bad-rrule", ["preview", "FREQ=DAILY;BYHOUR=25"], 2, "BYHOUR"),
    ("preview-unknown-zone", ["preview", "0 9 * * *", "--tz", "Nowhere/Land"], 2, "Nowhere/Land"),
    ("runs-json-and-format", ["runs", "--json", "--format", "csv"], 2, "not allowed with argument --json"),
    (
        "define-timeout-past-366-days",
        ["define", "x", "k", "--schedule", "* * * * *", "--timeout", "400d"],
        2,
        "366d",
    ),
    ("preview-host-zone", ["preview", "0 9 * * *", "--tz", "localtime"], 2, "'localtime' is not a place's"),
    (
        "define-posix-copy-of-a-zone",
        ["define", "x", "k", "--schedule", "0 9 * * *", "--tz", "posix/Europe/Sofia", "--dsn", "{dsn}"],
        2,
        "give one such as Europe/Sofia",
    ),
    ("preview-bad-after", ["preview", "0 9 * * *", "--after", "yesterday"], 2, "ISO 8601"),
    ("preview-bad-count", ["preview", "0 9 * * *", "--count", "0"], 2, "--count"),
    ("define-bad-dst-gap", ["define", "x", "k", "--schedule", "0 * * * *", "--dst-gap", "later"], 2, "later"),
    (
        "define-negative-jitter",
        ["define", "x", "k", "--schedule", "0 * * * *", "--jitter", "-5m"],
        2,
        "--jitter",
    ),
    (
        "define-jitter-over-spacing",
        ["define", "x", "k", "--schedule", "*/5 * * * *", "--jitter", "10m"],
        2,
        "longer than the 0:05:00 between runs",
    ),
    ("preview-text-and-definition", ["preview", "0 * * * *", "--definition", "x"], 2, "not both"),
    ("preview-bad-dst-repeat", ["preview", "0 * * * *", "--dst-repeat", "twice"], 2, "twice"),
    ("preview-big-step", ["preview", "*/90 * * * *"], 2, "FREQ=MINUTELY;INTERVAL=90"),
    (
        "backfill-backwards",
        ["backfill", "x", "--from", "2026-01-02T00:00Z", "--to", "2026-01-01T00:00Z", "--dsn", "{dsn}"],
        2,
        "is after to",
    ),
    (
        "backfill-unknown",
        ["backfill", "nope", "--from", "2026-01-01T00:00Z", "--to", "2026-01-02T00:00Z", "--dsn", "{dsn}"],
        2,
        "nope",
    ),
    ("run-missing-app", ["run", "tests/apps/missing.py", "--dsn", "{dsn}"], 2, "not found"),
    (
        "run-nothing",
        ["run", EXAMPLE, "--no-scheduler", "--no-worker", "--dsn", "{dsn}"],
        2,
        "leave nothing to run",
    ),
    ("run-not-an-app", ["run", f"{EXAMPLE}:nothing", "--dsn", "{dsn}"], 2, "no pgtick.App named 'nothing'"),
    ("six-field-cron", ["define", "--dsn", "{dsn}", "x", "k", "--schedule", "* * * * * *"], 2, "error"),
    (
        "rrule-hour-99",
        ["define", "--dsn", "{dsn}", "x", "k", "--schedule", "FREQ=DAILY;BYHOUR=99"],
        2,
        "error",
    ),
    (
        "unknown-zone-cron",
        ["define", "--dsn", "{dsn}", "x", "k", "--schedule", "* * * * *", "--tz", "Nowhere/Land"],
        2,
        "error",
    ),
    ("run-at-tomorrow", ["define", "--dsn", "{dsn}", "x", "k", "--run-at", "tomorrow"], 2, "error"),
    ("cap-zero", ["define", "--dsn", "{dsn}", "x", "k", "--schedule", "* * * * *", "--cap", "0"], 2, "error"),
    (
        "negative-timeout",
        ["define", "--dsn", "{dsn}", "x", "k", "--schedule", "* * * * *", "--timeout", "-5s"],
        2,
        "error",
    ),
    ("payload-list", ["enqueue", "--dsn", "{dsn}", "k", "--payload", "[1]"], 2, "error"),
    ("payload-broken-json", ["enqueue", "--dsn", "{dsn}", "k", "--payload", "{not json"], 2, "error"),
    ("run-at-infinity", ["enqueue", "--dsn", "{dsn}", "k", "--run-at", "infinity"], 2, "error"),
    ("empty-kind", ["enqueue", "--dsn", "{dsn}", "", "--payload", "{}"], 2, "error"),
    ("injection-as-name", ["run-now", "--dsn", "{dsn}", INJECTION], 2, "error"),
    ("negative-run-id", ["cancel", "--dsn", "{dsn}", "-5"], 2, "error"),
    ("unknown-run-retry-large", ["retry", "--dsn", "{dsn}", "123456789"], 2, "error"),
    ("runs-limit-zero", ["runs", "--dsn", "{dsn}", "--limit", "0"], 2, "error"),
    ("version-and-more", ["--version", "extra"], 2, "invalid choice: 'extra'"),
    ("version-and-a-command", ["--version", "status", "--dsn", "{dsn}"], 2, "--version takes no command"),
    # A command's option typed before the command: where it goes, never its value (a password).
    (
        "dsn-before-the-command",
        ["--dsn", "postgresql://u:s3cr3t@127.0.0.1:1/x", "status"],
        2,
        "pgtick status: error: --dsn goes after the command: pgtick status --dsn ...",
    ),
    (
        "dsn-with-equals-before-the-command",
        ["--dsn=postgresql://u:s3cr3t@127.0.0.1:1/x", "runs"],
        2,
        "pgtick runs: error: --dsn goes after the command",
    ),
    ("json-before-the-command", ["--json", "status", "--dsn", "{dsn}"], 2, "--json goes after the command"),
    (
        "a-url-as-the-command",
        ["postgresql://u:s3cr3t@127.0.0.1:1/x"],
        2,
        "'postgresql://u:***@127.0.0.1:1/x'",
    ),
]


@pytest.fixture(scope="module")
def shared_db(pg: Server) -> Iterator[Database]:
    """One database for every bad-input case: none of them may change it."""
    with pg.database() as database:
        yield database


@pytest.mark.parametrize(
    ("argv", "code", "needle"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_exits_with_one_line_and_no_traceback(
    shared_db: Database, argv: list[str], code: int, needle: str
) -> None:
    with shared_db.connect() as conn:
        before = digest(conn)
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
    assert "s3cr3t" not in result.stderr, f"a password reached standard error:\n{shown}"
    assert result.stdout == "", shown
    if code == 2:  # bad input changes nothing (a runtime failure, like a missing program, may)
        with shared_db.connect() as conn:
            assert digest(conn) == before, f"bad input changed the database:\n{shown}"


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("from pgtick import App\napp = App('x')\ndef f(:\n", "app.py:3: syntax error in the app"),
        ("from os import nonexistent_name\n", "app.py:1: the app raised ImportError: cannot import name"),
        ("from pgtick import App\napp = App('x')\nraise RuntimeError('no config')\n",
         "app.py:3: the app raised RuntimeError: no config while it was imported"),
    ],
    ids=["syntax-error", "import-error", "raises"],
)  # fmt: skip
def test_an_app_that_fails_to_import_is_one_line_naming_where(
    shared_db: Database, tmp_path: Path, source: str, needle: str
) -> None:
    app = tmp_path / "app.py"
    app.write_text(source)
    result = pgtick("run", str(app), "--dsn", shared_db.dsn)
    shown = f"exit {result.returncode}\nstderr: {result.stderr!r}"
    assert result.returncode == 2 and "Traceback" not in result.stderr, shown
    assert len(result.stderr.splitlines()) == 1 and needle in result.stderr, shown


def test_an_app_whose_job_caps_its_retry_delay_below_the_first_is_one_line_and_writes_nothing(
    shared_db: Database, tmp_path: Path
) -> None:
    """``backoff=7200`` with the default ``backoff_max`` (3600) would make every retry delay
    3600 s: `pgtick run` says so in one line, exit 2, before it writes any policy."""
    app = tmp_path / "app.py"
    app.write_text(
        "from pgtick import App\napp = App('x')\n"
        "@app.job('slow-retry', retry_on=[ConnectionError], backoff=7200)\ndef f(ctx): pass\n"
    )
    with shared_db.connect() as conn:
        before = digest(conn)
    result = pgtick("run", str(app), "--dsn", shared_db.dsn)
    shown = f"exit {result.returncode}\nstderr: {result.stderr!r}"
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, shown
    said = "job slow-retry: backoff_max must be at least backoff, got backoff_max 3600 s and backoff 7200 s"
    assert said in result.stderr, shown
    with shared_db.connect() as conn:
        assert digest(conn) == before


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("examples/no-such-app.py", "pgtick run: error: app file not found: examples/no-such-app.py\n"),
        ("examples/app.py:nope",
         "pgtick run: error: examples/app.py:nope: no pgtick.App named 'nope' in examples/app.py\n"),
        ("no_such_module:app",
         "pgtick run: error: cannot import app module 'no_such_module': No module named 'no_such_module'\n"),
    ],
    ids=["no-file", "no-attr", "no-module"],
)  # fmt: skip
def test_an_app_that_is_not_there_is_one_line_saying_so(shared_db: Database, target: str, said: str) -> None:
    """A mistyped app is the user's mistake, not an error the app raised while it was imported."""
    result = pgtick("run", target, "--dsn", shared_db.dsn)
    assert (result.returncode, result.stderr) == (2, said), f"exit {result.returncode}: {result.stderr!r}"


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
    "show",
    "undefine",
    "workers",
    "prune",
    "definitions",
    "pause-queue",
    "resume-queue",
    "scope-worker",
    "unscope-worker",
    "backfill",
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


@pytest.mark.parametrize("argv", [[], ["-v"]], ids=["bare", "verbose"])
def test_no_command_is_a_usage_error_with_the_help_on_stderr(argv: list[str]) -> None:
    """`pgtick` alone is a usage mistake: exit 2, the help (which lists the commands) on
    stderr, nothing on stdout, as argparse reports one. `--version` alone is not."""
    result = pgtick(*argv)
    shown = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr[:300]!r}"
    assert result.returncode == 2 and result.stdout == "", shown
    assert result.stderr.startswith("usage: pgtick") and "backfill" in result.stderr, shown
    version = pgtick(*argv, "--version")
    assert (version.returncode, version.stderr) == (0, ""), version
    assert re.fullmatch(r"pgtick \S+\n", version.stdout), version.stdout


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [(["status"], False), (["-v", "status"], True), (["status", "-v"], True), (["runs", "--verbose"], True)],
)
def test_verbose_is_taken_before_or_after_the_command(argv: list[str], verbose: bool) -> None:
    assert cli.build_parser().parse_args(argv).verbose is verbose


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
    lines = result.stdout.splitlines()
    assert lines[1:3] == [
        "  anchor: 2026-03-26T00:00:00+02:00 (as if defined at --after: local midnight that day)",
        "  dst: dst_gap=shift (auto) dst_repeat=first (auto)",
    ], result.stdout
    runs = [line.split() for line in lines[3:]]
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


def test_preview_takes_rrule_text_of_several_lines_and_a_utc_dtstart_is_that_instant() -> None:
    """DTSTART, RDATE and EXDATE are lines of their own beside the RRULE line; a UTC DTSTART in
    the repeated hour of the fall-back day is the reading it names (the second here), not the
    one dst_repeat picks for a local time."""
    text = "DTSTART:20271107T063000Z\nRRULE:FREQ=DAILY;COUNT=2"
    result = pgtick("preview", text, *("--tz", "America/New_York", "--after", "2027-11-01"))
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert lines[1] == "  anchor: none (the rule's DTSTART starts it)", result.stdout
    runs = [line.split() for line in lines[3:]]
    assert [(r[0], r[1], r[3], r[5]) for r in runs] == [
        ("2027-11-07", "01:30", "EST", "2027-11-07T06:30:00Z"),
        ("2027-11-08", "01:30", "EST", "2027-11-08T06:30:00Z"),
    ], result.stdout
    assert "second of two" in lines[3], result.stdout


def test_preview_of_a_rule_that_ends_says_how_many_runs_are_left() -> None:
    """A COUNT rule with fewer runs left than --count asks for: the title counts the runs shown
    and says the schedule has no more, rather than "next 10 runs" over two or none."""
    text = "DTSTART:20270301T090000\nRRULE:FREQ=DAILY;COUNT=2"
    result = pgtick("preview", text, "--tz", "Europe/Sofia", "--after", "2027-01-01")
    assert result.returncode == 0, result
    title, *_, last = result.stdout.splitlines()
    assert title.startswith("next 2 runs of "), result.stdout
    assert title.endswith("(local, then UTC; the schedule has no more):"), result.stdout
    assert last.startswith("  2027-03-02 09:00"), result.stdout
    result = pgtick("preview", text, "--tz", "Europe/Sofia", "--after", "2027-06-01")
    assert result.returncode == 0, result
    assert result.stdout.splitlines()[0].startswith("no more runs of "), result.stdout
    result = pgtick("preview", text, "--tz", "Europe/Sofia", "--after", "2027-01-01", "--count", "2")
    assert result.stdout.splitlines()[0].endswith("(local, then UTC):"), result.stdout


def _pgtick(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, f"pgtick {' '.join(args)} exited {code}: {err}"
    return out


@pytest.fixture
def machine_in_new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run as if this machine's local time zone were America/New_York (not the data's zone)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def busy(db: Database, conn: Conn) -> Iterator[dict[str, Any]]:
    """A leader, a definition due at 08:00 Sofia time, queued/running/failed runs."""
    leader = db.connect()
    assert scalar(leader, "SELECT jobs.try_lead('cli-leader')") is True
    def_id = scalar(
        conn,
        "SELECT id FROM jobs.define('sofia-report', 'report', schedule => 'FREQ=DAILY;BYHOUR=8',"
        " timezone => 'Europe/Sofia')",
    )
    conn.execute(
        "UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s",
        (datetime(2031, 7, 1, 5, 0, tzinfo=UTC), def_id),
    )
    failed = int(scalar(conn, "SELECT id FROM jobs.run_now('sofia-report')"))
    assert claim(conn, "w") == [failed]
    conn.execute("SELECT jobs.fail(%s, 'w', '{Boom}', 'report server down')", (failed,))
    running = enqueue(conn, "mail", run_at="now() - interval '1 minute'")
    assert claim(conn, "w", kinds=["mail"]) == [running]
    queued = [enqueue(conn, "mail", run_at="now() - interval '5 minutes'") for _ in range(2)]
    try:
        yield {"failed": failed, "running": running, "queued": queued, "def_id": def_id}
    finally:
        leader.close()


def test_status_tables(
    db: Database,
    busy: dict[str, Any],
    machine_in_new_york: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGTICK_NOW", "2031-07-01T04:56:00Z")
    out = _pgtick(capsys, "status", "--dsn", db.dsn)
    lines = out.splitlines()
    assert lines[0].startswith("leader  cli-leader (pid ")
    row = next(line for line in lines if line.startswith("sofia-report"))
    # Local wall-clock time in the definition's zone with its abbreviation, not shifted by
    # this machine's zone, and how long until then.
    assert "08:00:00 EEST" in row and "in 4m" in row and "FAILED" in row, row
    assert "1 failed" in row, row
    header = next(line for line in lines if line.startswith("KIND"))

    def cell(kind: str, column: str) -> str:
        """The right-aligned cell under `column` in the row of `kind` ("" when blank)."""
        row = next(q for q in lines if q.startswith(kind + " "))
        end = header.index(column) + len(column)
        return row[:end].split()[-1] if row[end - 1] != " " else ""

    assert (cell("mail", "QUEUED"), cell("mail", "RUNNING")) == ("2", "1")
    assert cell("report", "FAILED/1H") == "1"
    assert all(len(line) <= 100 for line in lines), out


def test_status_json(db: Database, busy: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
    assert snap["leader"]["owner"] == "cli-leader"
    assert datetime.fromisoformat(snap["leader"]["since"]).tzinfo is not None
    (definition,) = snap["definitions"]
    assert definition["name"] == "sofia-report"
    assert definition["next_run_local"] == "2031-07-01T08:00:00"
    assert (definition["last_status"], definition["consecutive_failures"], definition["paused"]) == (
        "FAILED",
        1,
        False,
    )
    queues = {q["kind"]: q for q in snap["queues"]}
    assert (queues["mail"]["queued"], queues["mail"]["running"]) == (2, 1)
    assert 300 <= queues["mail"]["oldest_queued_age"] < 400, "an interval becomes seconds"
    assert queues["report"]["failed_1h"] == 1


def test_status_of_an_empty_installation(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    out = _pgtick(capsys, "status", "--dsn", db.dsn)
    assert "leader  none" in out and "no definitions" in out and "no runs in the last hour" in out
    snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
    summary = snap.pop("summary")
    assert summary["definitions"] == 0 and summary["materialize_errors"] == 0, summary
    schema = snap.pop("schema")
    assert schema["schema_version"] == max(m.version for m in migrate.migrations())
    assert {k: v for k, v in snap.items() if k != "now"} == {
        "leader": None,
        "other_leaders": [],
        "definitions": [],
        "queues": [],
        "kinds_without_worker": [],
    }


def test_status_names_a_leader_that_took_the_lead_from_psql_without_an_owner(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """A leader in another language calls jobs.try_lead() as the contract lists it, with no
    owner: status names it (by its application_name) instead of failing with a traceback."""
    with psycopg.connect(db.dsn, autocommit=True, application_name="cron-in-go") as leader:
        assert leader.execute("SELECT jobs.try_lead()").fetchone() == (True,)
        pid = leader.info.backend_pid
        out = _pgtick(capsys, "status", "--dsn", db.dsn)
        assert f"leader  cron-in-go (pid {pid}), leading for" in out, out
        snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
        assert (snap["leader"]["owner"], snap["leader"]["pid"]) == ("cron-in-go", pid), snap["leader"]


def test_status_names_both_leaders_when_one_leads_by_the_lock_and_another_by_the_lease(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replica that leads by the lock and one that leads by the lease (behind a pooler) do not
    see each other: both lead. Status names the first as the leader and the second on a line of
    its own that says so (--json: other_leaders)."""
    with psycopg.connect(db.dsn, autocommit=True) as by_lock:
        assert by_lock.execute("SELECT jobs.try_lead('replica-a')").fetchone() == (True,)
        by_lock.execute("SELECT jobs.acquire_lease('pgtick:leader', 'replica-b', '1 minute')")
        out = _pgtick(capsys, "status", "--dsn", db.dsn)
        lines = out.splitlines()
        assert lines[0].startswith(f"leader  replica-a (pid {by_lock.info.backend_pid}), leading for"), out
        assert lines[1].startswith("leader  also replica-b (by lease), leading for"), out
        assert "give every replica the same --leadership" in out, out
        snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
        assert snap["leader"]["owner"] == "replica-a", snap
        assert [(o["owner"], o["pid"]) for o in snap["other_leaders"]] == [("replica-b", None)], snap
        by_lock.execute("SELECT jobs.release_lease('pgtick:leader', 'replica-b')")
        snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
        assert (snap["leader"]["owner"], snap["other_leaders"]) == ("replica-a", []), snap


def test_status_and_definitions_show_the_next_start_not_the_cursor(
    db: Database, conn: Conn, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler materializes occurrences ahead (lookahead): at 03:57:30 the runs of 03:58,
    04:00 and 04:02 wait and the cursor is at 04:04. NEXT and LEFT name the run that starts
    next, in the table, --json and --format csv; next_run_at stays the cursor."""
    at = datetime(2026, 6, 1, 3, 57, 30, tzinfo=UTC)  # before the definition was made
    conn.execute("SELECT jobs.define('every-2m', 'k', schedule => '*/2 * * * *')")
    scheduler = Scheduler(db.dsn, owner="t", clock=Clock(at), lookahead=300)
    try:
        scheduler.materialize_due()  # sets the new definition's cursor
        scheduler.materialize_due()  # materializes up to 5 minutes ahead
    finally:
        scheduler.close()
    queued = [r[0] for r in conn.execute("SELECT scheduled_for FROM jobs.runs ORDER BY scheduled_for")]
    first = datetime(2026, 6, 1, 3, 58, tzinfo=UTC)
    cursor = datetime(2026, 6, 1, 4, 4, tzinfo=UTC)
    assert queued == [first + timedelta(minutes=m) for m in (0, 2, 4)]
    assert scalar(conn, "SELECT next_run_at FROM jobs.definitions") == cursor
    monkeypatch.setenv("PGTICK_NOW", at.isoformat())

    for command in ("status", "definitions"):
        out = _pgtick(capsys, command, "--dsn", db.dsn)
        row = next(line for line in out.splitlines() if line.startswith("every-2m"))
        assert "03:58:00 UTC" in row and "in 30s" in row, f"{command}: {row}"
        assert "04:04" not in row, f"{command} shows the cursor: {row}"
    wide = _pgtick(capsys, "status", "--wide", "--dsn", db.dsn)
    assert "2026-06-01T03:58:00" in wide and "04:04" not in wide, wide

    (health,) = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))["definitions"]
    assert datetime.fromisoformat(health["next_start_at"]) == first
    assert health["next_start_local"] == "2026-06-01T03:58:00"
    assert datetime.fromisoformat(health["next_run_at"]) == cursor, "next_run_at is the cursor"
    (listed,) = json.loads(_pgtick(capsys, "definitions", "--json", "--dsn", db.dsn))
    assert datetime.fromisoformat(listed["next_start_at"]) == first
    assert datetime.fromisoformat(listed["next_run_at"]) == cursor
    csv = _pgtick(capsys, "definitions", "--format", "csv", "--dsn", db.dsn).splitlines()
    assert "next_start_at" in csv[0].split(",") and "2026-06-01T03:58:00" in csv[1], csv


def test_passed_is_when_the_last_outcome_finished(
    db: Database, conn: Conn, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A success a day ago, then an overlap skip a minute ago: LAST says SKIPPED and PASSED
    says when that skip was, not when the older success was."""
    monkeypatch.setenv("PGTICK_NOW", "2031-07-01T12:00:00Z")
    conn.execute(
        "SELECT jobs.define('ticks', 'k', schedule => '* * * * *', max_concurrent_runs => 1,"
        " overlap_policy => 'skip')"
    )
    conn.execute(
        """
        INSERT INTO jobs.runs (definition_id, kind, status, origin, scheduled_for, started_at, finished_at,
                               failure_reason, error)
        SELECT d.id, 'k', v.status::jobs.run_status, 'schedule', v.at, v.started_at, v.finished_at,
               v.reason, v.error
          FROM jobs.definitions AS d, (VALUES
            ('COMPLETED', '2031-06-30 12:00Z'::timestamptz, '2031-06-30 12:00:01Z'::timestamptz,
             '2031-06-30 12:00:05Z'::timestamptz, NULL, NULL),
            ('CANCELLED', '2031-07-01 11:59Z', NULL, '2031-07-01 11:59:00Z', 'Skipped',
             'skipped: definition at max_concurrent_runs (overlap_policy skip)')
          ) AS v (status, at, started_at, finished_at, reason, error)
         ORDER BY v.at
        """
    )
    out = _pgtick(capsys, "status", "--dsn", db.dsn)
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("DEFINITION"))
    row = next(line for line in lines if line.startswith("ticks"))
    assert "SKIPPED" in row, row
    passed = row[header.index("PASSED") :].split("  ")[0].strip()
    assert passed == "1m ago", f"PASSED beside a skip a minute ago: {passed!r} in {row!r}"
    (health,) = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))["definitions"]
    assert datetime.fromisoformat(health["last_finished_at"]) == datetime(2031, 7, 1, 11, 59, tzinfo=UTC)


def test_runs_json_with_filters(
    db: Database, busy: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    every = json.loads(_pgtick(capsys, "runs", "--json", "--dsn", db.dsn))
    ids = [r["id"] for r in every]
    assert ids == sorted(ids, reverse=True), "newest first"
    assert set(ids) == {busy["failed"], busy["running"], *busy["queued"]}

    (failed,) = json.loads(_pgtick(capsys, "runs", "--json", "--status", "FAILED", "--dsn", db.dsn))
    assert failed["id"] == busy["failed"]
    assert (failed["definition"], failed["kind"], failed["failure_reason"]) == (
        "sofia-report",
        "report",
        "Error",
    )
    assert failed["error"] == "report server down" and failed["worker"] == "w"
    assert datetime.fromisoformat(failed["finished_at"]).tzinfo is not None

    mail = json.loads(_pgtick(capsys, "runs", "--json", "--kind", "mail", "--limit", "2", "--dsn", db.dsn))
    assert [r["id"] for r in mail] == sorted(busy["queued"], reverse=True)
    assert {r["status"] for r in mail} == {"QUEUED"}
    by_def = json.loads(_pgtick(capsys, "runs", "--json", "--definition", "sofia-report", "--dsn", db.dsn))
    assert [r["id"] for r in by_def] == [busy["failed"]]
    assert json.loads(_pgtick(capsys, "runs", "--json", "--definition", "nope", "--dsn", db.dsn)) == []

    table = _pgtick(capsys, "runs", "--status", "RUNNING", "--dsn", db.dsn)
    assert str(busy["running"]) in table and "RUNNING" in table


def test_status_json_through_the_installed_entry_point(db: Database, busy: dict[str, Any]) -> None:
    proc = subprocess.run(
        [*PGTICK, "status", "--json", "--dsn", db.dsn],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["leader"]["owner"] == "cli-leader"


def test_status_works_for_the_read_only_role(
    db: Database, busy: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The console role jobs_reader can run `pgtick status` (the leader view used to refuse it)."""
    snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn_as("pgtick_t_reader")))
    assert snap["leader"]["owner"] == "cli-leader"
    assert [d["name"] for d in snap["definitions"]] == ["sofia-report"]


@pytest.mark.parametrize(
    ("login", "args", "role"),
    [
        ("pgtick_t_reader", ["pause", "sofia-report"], "jobs_operator"),
        ("pgtick_t_reader", ["cancel", "1"], "jobs_operator"),
        ("pgtick_t_reader", ["enqueue", "k"], "jobs_operator"),
        ("pgtick_t_reader", ["prune"], "jobs_operator"),
        ("pgtick_t_reader", ["lock", "nightly", "--ttl", "1m", "--", "true"], "jobs_operator"),
        ("worker", ["status"], "jobs_reader"),
        ("worker", ["show", "1"], "jobs_reader"),
        ("worker", ["prune", "--dry-run"], "jobs_reader"),
        ("worker", ["backfill", "sofia-report", "--from", "2026-01-01T00:00Z", "--to", "2026-01-02T00:00Z"],
         "jobs_operator"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(value[:2]),
)  # fmt: skip
def test_a_login_refused_a_privilege_is_told_which_role_the_command_needs(
    db: Database, busy: dict[str, Any], login: str, args: list[str], role: str
) -> None:
    """A login without the privilege a command needs: one line, exit 1, saying which of the
    documented roles (docs/cli.md) to grant, and nothing changed."""
    with db.worker_login("refused") as worker:
        dsn = db.dsn_as(worker if login == "worker" else login)
        with db.connect() as conn:
            before = digest(conn)
        result = pgtick(args[0], "--dsn", dsn, *args[1:])  # before a `--` that lock takes
        with db.connect() as conn:
            assert digest(conn) == before, "a refused command changed something"
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "permission denied" in lines[0], result.stderr
    assert lines[0].endswith(f"(pgtick {args[0]} needs a login granted {role}: GRANT {role} TO <login>)"), (
        lines[0]
    )


def ok(*args: str) -> str:
    result: subprocess.CompletedProcess[str] = pgtick(*args)
    assert result.returncode == 0, f"pgtick {' '.join(args)} -> {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> tuple[Any, ...]:
    row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return tuple(row)


def number(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return int(match.group(1))


def test_cli_round_trip(db: Database) -> None:
    dsn = ["--dsn", db.dsn]
    with db.connect() as conn:
        # define: RRULE in a zone, cron with a cap and overlap policy, a one-shot
        out = ok("define", "weekday-report", "report", *dsn, "--schedule",
                 "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0", "--tz", "Europe/Sofia",
                 "--payload", '{"team": "sofia"}')  # fmt: skip
        assert re.fullmatch(r"definition=weekday-report id=\d+ revision=1 saved\n", out), out
        ok(
            "define",
            "cleanup",
            "vacuum",
            *dsn,
            "--schedule",
            "*/15 * * * *",
            "--cap",
            "1",
            "--overlap",
            "skip",
        )
        ok("define", "launch", "announce", *dsn, "--run-at", "2030-12-24T18:00:00+02:00")
        rows = conn.execute(
            "SELECT name, kind, schedule, timezone, run_at::text, payload, max_concurrent_runs,"
            " overlap_policy, enabled FROM jobs.definitions ORDER BY name"
        ).fetchall()
        assert rows == [
            ("cleanup", "vacuum", "*/15 * * * *", "UTC", None, {}, 1, "skip", True),
            ("launch", "announce", None, "UTC", "2030-12-24 16:00:00+00", {}, None, "queue", True),
            ("weekday-report", "report", "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0",
             "Europe/Sofia", None, {"team": "sofia"}, None, "queue", True),
        ], rows  # fmt: skip

        # enqueue with an idempotency key twice: one run
        first = ok("enqueue", "send-email", *dsn, "--payload", '{"to": "a@example.com"}', "--key", "order-42")
        again = ok("enqueue", "send-email", *dsn, "--payload", '{"to": "a@example.com"}', "--key", "order-42")
        run_id = number(r"run=(\d+) kind=send-email status=QUEUED", first)
        assert number(r"run=(\d+)", again) == run_id, (first, again)
        assert one(conn, "SELECT count(*) FROM jobs.runs WHERE idempotency_key = 'order-42'") == (1,)

        # run-now: a manual run of the definition
        manual = number(r"run=(\d+) definition=weekday-report queued", ok("run-now", "weekday-report", *dsn))
        assert one(
            conn,
            "SELECT d.name, r.origin, r.status::text, r.payload FROM jobs.runs r"
            " JOIN jobs.definitions d ON d.id = r.definition_id WHERE r.id = %s",
            (manual,),
        ) == ("weekday-report", "manual", "QUEUED", {"team": "sofia"})

        # pause / resume
        assert ok("pause", "cleanup", *dsn) == "definition=cleanup paused\n"
        assert one(conn, "SELECT enabled FROM jobs.definitions WHERE name = 'cleanup'") == (False,)
        assert ok("resume", "cleanup", *dsn) == "definition=cleanup resumed\n"
        assert one(conn, "SELECT enabled FROM jobs.definitions WHERE name = 'cleanup'") == (True,)

        # cancel a queued run, then retry it as attempt 2
        assert ok("cancel", str(run_id), *dsn) == f"run={run_id} status=CANCELLED\n"
        retried = ok("retry", str(run_id), *dsn)
        retry_id = number(rf"run={run_id} retried as run=(\d+) attempt=2", retried)
        assert one(
            conn, "SELECT retry_of, attempt, status::text, origin FROM jobs.runs WHERE id = %s", (retry_id,)
        ) == (run_id, 2, "QUEUED", "retry")

        # cancel every queued run of a definition
        out = ok("cancel", "--definition", "weekday-report", *dsn)
        assert out == "definition=weekday-report cancelled 1 queued run\n", out
        assert one(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (manual,)) == ("CANCELLED",)

        # status --json and runs --json parse and show what we did
        status = json.loads(ok("status", "--json", *dsn))
        assert set(status) >= {"definitions", "queues", "leader"}, status
        assert status["leader"] is None, status["leader"]  # no scheduler runs in this test
        assert sorted(d["name"] for d in status["definitions"]) == ["cleanup", "launch", "weekday-report"]
        assert {q["kind"] for q in status["queues"]} >= {"send-email"}, status["queues"]
        assert "leader  none" in ok("status", *dsn)

        runs = json.loads(ok("runs", "--json", *dsn))
        assert [(r["id"], r["status"]) for r in runs] == [
            (retry_id, "QUEUED"),
            (manual, "CANCELLED"),
            (run_id, "CANCELLED"),
        ], runs
        queued_only = json.loads(ok("runs", "--json", "--status", "QUEUED", "--kind", "send-email", *dsn))
        assert [r["id"] for r in queued_only] == [retry_id], queued_only
        assert str(retry_id) in ok("runs", *dsn)  # the table form


def test_a_pause_resume_or_cancel_that_changes_nothing_says_so(db: Database) -> None:
    """Pausing a paused definition, resuming one that runs, cancelling a run that was cancelled
    or finished: exit 0 (each is idempotent) with a line that says nothing changed, and
    ``changed`` false in --json, where the first, changing, call says what it did."""
    dsn = ["--dsn", db.dsn]
    with db.connect() as conn:
        conn.execute("SELECT jobs.define('nightly', 'k', schedule => '0 3 * * *')")
        queued = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
        done = scalar(conn, "SELECT id FROM jobs.enqueue('k')")
        conn.execute(
            "UPDATE jobs.runs SET status = 'COMPLETED', started_at = now(), finished_at = now()"
            " WHERE id = %s",
            (done,),
        )
    assert ok("pause", "nightly", *dsn) == "definition=nightly paused\n"
    assert ok("pause", "nightly", *dsn) == "definition=nightly already paused: nothing changed\n"
    assert json.loads(ok("pause", "nightly", "--json", *dsn)) == {
        "definition": "nightly",
        "paused": True,
        "changed": False,
    }
    assert ok("resume", "nightly", *dsn) == "definition=nightly resumed\n"
    assert ok("resume", "nightly", *dsn) == "definition=nightly not paused: nothing changed\n"
    assert json.loads(ok("resume", "nightly", "--json", *dsn))["changed"] is False
    assert ok("cancel", str(queued), *dsn) == f"run={queued} status=CANCELLED\n"
    again = ok("cancel", str(queued), *dsn)
    assert again == f"run={queued} status=CANCELLED (cancelled already: nothing changed)\n", again
    assert json.loads(ok("cancel", str(queued), "--json", *dsn))["changed"] is False
    finished = ok("cancel", str(done), *dsn)
    assert finished == f"run={done} status=COMPLETED (finished already: nothing to cancel)\n", finished
    assert json.loads(ok("cancel", str(done), "--json", *dsn)) == {
        "run_id": done,
        "status": "COMPLETED",
        "cancel_requested": False,
        "changed": False,
    }


def test_define_from_file_jsonl_and_csv_in_one_statement_each(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "defs.jsonl"
    lines.write_text(
        "\n".join(json.dumps({"name": f"j{i}", "kind": "k", "schedule": "* * * * *"}) for i in range(300))
        + "\n# a comment\n"
        + '{"name": "once", "kind": "k", "run_at": "2031-01-01T00:00:00Z", "payload": {"a": 1}}\n'
    )
    out = _pgtick(capsys, "define", "--from-file", str(lines), "--dsn", db.dsn)
    assert out.strip() == "definitions=301 created=301 rescheduled=0 saved"
    table = tmp_path / "defs.csv"
    table.write_text(
        "name,kind,schedule,timezone,priority,payload,timeout,jitter,dst_gap,pause_after_failures,queue\n"
        'c1,k,30 2 * * 1-5,Europe/Sofia,5,"{""x"": 2}",90,5 minutes,skip,3,reports\n'
        "j0,k,*/5 * * * *,,,,,,,,\n"
    )
    out = _pgtick(capsys, "define", "--from-file", str(table), "--dsn", db.dsn)
    assert out.strip() == "definitions=2 created=1 rescheduled=1 saved"
    with db.connect() as conn:
        row = conn.execute(
            "SELECT timezone, priority, payload, jitter, dst_gap, pause_after_failures, queue, timeout"
            " FROM jobs.definitions WHERE name = 'c1'"
        ).fetchone()
        assert row is not None and row[:7] == (
            "Europe/Sofia",
            5,
            {"x": 2},
            timedelta(minutes=5),
            "skip",
            3,
            "reports",
        ), row
        assert row[7].total_seconds() == 90, row
        assert conn.execute("SELECT count(*) FROM jobs.definitions").fetchone() == (302,)
        summary = json.loads(_pgtick(capsys, "status", "--json", "--limit", "10", "--dsn", db.dsn))
    assert summary["summary"]["definitions"] == 302 and len(summary["definitions"]) == 10


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"name": "x", "kind": "k", "schedule": "61 * * * *"}\n', ["x"]),
        ('{"name": "x", "kind": "k", "schedule": "* * * * *", "colour": 1}\n', ["colour"]),
        (
            '{"name": "x", "kind": "k", "schedule": "* * * * *", "jitter": 120}\n',
            ["x", "jitter", "longer than"],
        ),
        ("not json\n", ["defs.jsonl:1"]),
        (
            '{"name": "x", "kind": "k", "schedule": "* * * * *"}\n'
            '{"name": "y", "kind": "k", "schedule": "* * * * *", "payload": {"n": 1e999}}\n',
            ["defs.jsonl:2", "the number 1e999 is out of range"],
        ),
        (
            '{"name": "x", "kind": "k", "schedule": "* * * * *", "payload": {"\\udc80": 1}}\n',
            ["defs.jsonl:1", "lone surrogate (\\udc80)"],
        ),
    ],
)
def test_define_from_file_refuses_bad_lines_in_one_readable_line(
    db: Database, tmp_path: Path, content: str, words: list[str]
) -> None:
    path = tmp_path / "defs.jsonl"
    path.write_text(content)
    result = pgtick("define", "--from-file", str(path), "--dsn", db.dsn)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM jobs.definitions").fetchone() == (0,)


def _without_stream(fd: int) -> Callable[[], None]:
    """A ``preexec_fn`` that closes ``fd`` in the child, as ``<&-`` or ``>&-`` does."""
    return lambda: os.close(fd)


def test_an_output_or_input_that_cannot_be_used_is_one_line(db: Database) -> None:
    """A full disk under standard output, a closed standard output or input: one error line,
    never a traceback; with no output to show it on, a command does nothing."""
    dsn = ["--dsn", db.dsn]

    def into_a_full_disk(*args: str) -> subprocess.CompletedProcess[str]:
        with open("/dev/full", "w") as full:
            return subprocess.run(
                [*PGTICK, *args, *dsn],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                env=env_for(None),
                timeout=60,
            )

    # The version and the help too: argparse alone would drop the help and exit 0.
    for shown_before_connecting in (["--version"], ["define", "--help"]):
        with open("/dev/full", "w") as full:
            told = subprocess.run(
                [*PGTICK, *shown_before_connecting],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                env=env_for(None),
                timeout=60,
            )
        assert (told.returncode, told.stderr) == (
            1,
            "pgtick: error: cannot write the output: No space left on device\n",
        ), (shown_before_connecting, told)
    result = into_a_full_disk("runs")
    assert result.returncode == 1, result.stderr
    assert result.stderr == "pgtick runs: error: cannot write the output: No space left on device\n", (
        result.stderr
    )
    # A command that changed something says so: run again, it would enqueue a second run.
    enqueued = into_a_full_disk("enqueue", "shown-nowhere")
    assert enqueued.returncode == 1, enqueued.stderr
    assert enqueued.stderr.splitlines()[-1] == (
        "pgtick enqueue: error: cannot write the output (the change itself was made): No space left on device"
    ), enqueued.stderr
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'shown-nowhere'") == 1
    closed_out = subprocess.run(
        [*PGTICK, "enqueue", "never-shown", "--json", *dsn],
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(None),
        timeout=60,
        preexec_fn=_without_stream(1),
    )
    assert closed_out.returncode == 1, closed_out.stderr
    assert closed_out.stderr.count("\n") == 1 and "standard output is closed" in closed_out.stderr, (
        closed_out.stderr
    )
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'never-shown'") == 0, (
            "a run was enqueued and never shown"
        )
    closed_in = subprocess.run(
        [*PGTICK, "define", "--from-file", "-", *dsn],
        capture_output=True,
        text=True,
        env=env_for(None),
        timeout=60,
        preexec_fn=_without_stream(0),
    )
    assert closed_in.returncode == 2, closed_in.stderr
    assert closed_in.stderr == "pgtick define: error: cannot read -: standard input is closed\n", (
        closed_in.stderr
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b"name,kind,schedule\na\x00b,k,@daily\n",
            "defs.csv:2: name must not contain NUL characters (\\u0000)",
        ),
        (
            b"name,kind,schedule,name\na,k,@daily,b\n",
            "defs.csv: column 'name' is in the header more than once",
        ),
        (
            b"name,kind,schedule\nff1,k," + b"x" * 200_000 + b"\n",
            "defs.csv:2: not readable as CSV: field larger than field limit (131072)",
        ),
        (  # not read as a schedule holding the line break and what follows
            b'name,kind,schedule\na,k,@daily\nb,k,"* * * * *\n',
            "defs.csv:3: not readable as CSV: a quoted cell is not closed before the end of the file",
        ),
        (  # not read as "@dailyx"
            b'name,kind,schedule\na,k,"@daily"x\n',
            "defs.csv:2: not readable as CSV: ',' expected after '\"'",
        ),
        (
            b"name,kind,schedule\na,k,@daily,extra\n",
            "defs.csv:2: 4 cells, but the header names 3 columns",
        ),
        (  # a quoted cell of two lines: the next record starts on line 4
            b'name,kind,schedule,priority\na,k,"DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY",1\n'
            b"b,k,@daily,high\n",
            "defs.csv:4: bad priority 'high'",
        ),
        (b"name,kind,schedule,priority\na,k,@daily,1_0\n", "defs.csv:2: bad priority '1_0'"),
        ("name,kind,schedule,priority\na,k,@daily,\u0663\n".encode(), "defs.csv:2: bad priority '\u0663'"),
        (
            b"name,kind,schedule,priority\na,k,@daily," + b"9" * 5000 + b"\n",
            "defs.csv:2: bad priority '" + "9" * 40 + "...'",
        ),
    ],
    ids=[
        "nul-in-a-cell",
        "a-column-twice",
        "a-cell-past-the-field-limit",
        "a-quote-left-open",
        "text-after-a-closing-quote",
        "a-cell-past-the-header",
        "a-record-after-a-cell-of-two-lines",
        "an-integer-with-an-underscore",
        "an-integer-in-another-script",
        "an-integer-of-thousands-of-digits",
    ],
)
def test_a_definitions_csv_the_database_cannot_take_is_one_line_before_any_change(
    db: Database, tmp_path: Path, content: bytes, said: str
) -> None:
    path = tmp_path / "defs.csv"
    path.write_bytes(content)
    result = pgtick("define", "--from-file", str(path), "--dsn", db.dsn)
    assert result.returncode == 2, result
    assert result.stderr == f"pgtick define: error: {path.parent}/{said}\n", result.stderr
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


@pytest.mark.parametrize(
    "option",
    [
        ["--paused"],
        ["--cap", "7"],
        ["--priority", "0"],  # the default value, given: still refused
        ["--tz", "Europe/Sofia"],
        ["--misfire", "skip"],
        ["--payload", "{}"],
        ["--schedule", "@daily"],
        ["--pause-after-failures", "3"],
    ],
    ids=lambda option: option[0],
)
def test_define_from_file_refuses_the_options_of_one_definition(
    db: Database, tmp_path: Path, option: list[str]
) -> None:
    """With --from-file every field comes from the file: an option that sets one too would be
    ignored for some definitions or all of them, so it is refused, named, before any change."""
    path = tmp_path / "defs.jsonl"
    path.write_text('{"name": "x", "kind": "k", "schedule": "@daily"}\n')
    result = pgtick("define", "--from-file", str(path), *option, "--dsn", db.dsn)
    assert result.returncode == 2, result
    assert result.stderr == (
        "pgtick define: error: with --from-file the file gives every field of each definition:"
        f" {option[0]} cannot be given here (set it in the file)\n"
    ), result.stderr
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0


def test_a_json_line_holding_unicode_line_separators_is_one_line(db: Database, tmp_path: Path) -> None:
    """JSON lines end at \\n (or \\r\\n): U+2028, U+2029 and U+0085 are valid inside a JSON
    string and stay there."""
    note = "a\u2028b\u2029c\x85d"
    path = tmp_path / "defs.jsonl"
    path.write_bytes(
        (
            json.dumps(
                {"name": "sep", "kind": "k", "schedule": "@daily", "payload": {"note": note}},
                ensure_ascii=False,
            )
            + "\r\n"
        ).encode()
    )
    result = pgtick("define", "--from-file", str(path), "--dsn", db.dsn)
    assert result.returncode == 0, result.stderr
    with db.connect() as conn:
        assert scalar(conn, "SELECT payload->>'note' FROM jobs.definitions WHERE name = 'sep'") == note
