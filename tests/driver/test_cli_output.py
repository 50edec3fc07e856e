"""What the operator's terminal prints, on a fixed database state with a fixed clock.

Golden files (tests/driver/golden/) hold each command's default, --wide and --json
output; the default form fits 100 columns; every --json output is valid against its
documented schema (docs/schemas/). PGTICK_NOW fixes the clock the CLI displays with;
the few values the database computes from its own clock (ages, pids) are masked.
Regenerate the golden files after a deliberate change with PGTICK_GOLDEN_UPDATE=1
and read the diff.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest

from harness import ROOT, Database, in_pty, scalar, tty_env
from pgtick import cli

GOLDEN = Path(__file__).parent / "golden"
SCHEMAS = ROOT / "docs" / "schemas"
NOW = "2026-11-30T12:00:00Z"
# schema: jobs.version() names the newest migration and when it was applied.
VOLATILE = {"schema", "pid", "leading_for", "oldest_queued_age", "seen_age", "oldest_heartbeat_age"}

STATE = """
UPDATE jobs.definitions SET created_at = '2026-11-01 00:00Z', updated_at = '2026-11-01 00:00Z';
UPDATE jobs.definitions SET next_run_at = '2026-12-01 01:00Z' WHERE name = 'nightly-report';
UPDATE jobs.definitions SET next_run_at = '2026-11-30 12:00:10Z' WHERE name = 'every-10s';
UPDATE jobs.definitions SET next_run_at = '2026-11-30 12:15Z' WHERE name = 'sync-crm';
INSERT INTO jobs.runs (definition_id, kind, status, attempt, retry_of, origin, scheduled_for, created_at,
                       started_at, heartbeat_at, finished_at, worker, failure_reason, error, result)
SELECT d.id, d.kind, v.status::jobs.run_status, v.attempt, v.retry_of, v.origin, v.scheduled_for,
       v.scheduled_for, v.started_at, v.started_at, v.finished_at, v.worker, v.failure_reason, v.error,
       v.result::jsonb
  FROM (VALUES
    (1, 'nightly-report', 'COMPLETED', 1, NULL::bigint, 'schedule', '2026-11-26 01:00Z'::timestamptz,
     '2026-11-26 01:00:01Z'::timestamptz, '2026-11-26 01:00:43Z'::timestamptz, 'host-a-101-f00d',
     NULL, NULL, '{"rows": 1200}'),
    (2, 'nightly-report', 'COMPLETED', 1, NULL, 'schedule', '2026-11-27 01:00Z', '2026-11-27 01:00:01Z',
     '2026-11-27 01:00:39Z', 'host-a-101-f00d', NULL, NULL, '{"rows": 1180}'),
    (3, 'nightly-report', 'COMPLETED', 1, NULL, 'schedule', '2026-11-28 01:00Z', '2026-11-28 01:00:02Z',
     '2026-11-28 01:01:10Z', 'host-a-101-f00d', NULL, NULL, '{"rows": 1301}'),
    (4, 'nightly-report', 'FAILED', 1, NULL, 'schedule', '2026-11-29 01:00Z', '2026-11-29 01:00:01Z',
     '2026-11-29 01:00:04Z', 'host-a-101-f00d', 'Error',
     E'ConnectionError: report server down\n\nTraceback (most recent call last):\n'
     || E'  File "jobs.py", line 12, in report\n    fetch()\nConnectionError: report server down', NULL),
    (5, 'nightly-report', 'FAILED', 2, 4, 'retry', '2026-11-29 01:00:14Z', '2026-11-29 01:00:15Z',
     '2026-11-29 01:00:18Z', 'host-b-202-beef', 'Error', 'ConnectionError: report server down', NULL),
    (6, 'every-10s', 'COMPLETED', 1, NULL, 'schedule', '2026-11-30 11:59:20Z', '2026-11-30 11:59:20.1Z',
     '2026-11-30 11:59:20.3Z', 'host-a-101-f00d', NULL, NULL, NULL),
    (7, 'every-10s', 'COMPLETED', 1, NULL, 'schedule', '2026-11-30 11:59:30Z', '2026-11-30 11:59:30.1Z',
     '2026-11-30 11:59:41Z', 'host-a-101-f00d', NULL, NULL, NULL),
    (8, 'every-10s', 'CANCELLED', 1, NULL, 'schedule', '2026-11-30 11:59:40Z', NULL,
     '2026-11-30 11:59:40.1Z', NULL, 'Skipped',
     'skipped: definition at max_concurrent_runs (overlap_policy skip)', NULL),
    (9, 'every-10s', 'COMPLETED', 1, NULL, 'schedule', '2026-11-30 11:59:50Z', '2026-11-30 11:59:50.1Z',
     '2026-11-30 11:59:50.2Z', 'host-a-101-f00d', NULL, NULL, NULL),
    (10, 'every-10s', 'RUNNING', 1, NULL, 'schedule', '2026-11-30 12:00:00Z', '2026-11-30 12:00:00.2Z',
     NULL, 'host-a-101-f00d', NULL, NULL, NULL)
  ) AS v (n, name, status, attempt, retry_of, origin, scheduled_for, started_at, finished_at, worker,
          failure_reason, error, result)
  JOIN jobs.definitions AS d ON d.name = v.name
 ORDER BY v.n;
INSERT INTO jobs.runs (kind, payload, scheduled_for, created_at)
VALUES ('send-emial', '{"to": "ops@example.com"}', '2026-11-30 11:55Z', '2026-11-30 11:55Z');
INSERT INTO jobs.catch_ups (
    definition_id, caught_up_at, misfire_policy, resumed_from, first_late, last_late, occurrences, runs
)
SELECT id, '2026-11-30 11:57:30Z', 'coalesce', '2026-11-30 11:55:00Z', '2026-11-30 11:55:00Z',
       '2026-11-30 11:57:20Z', 15, 1
  FROM jobs.definitions WHERE name = 'every-10s';
INSERT INTO jobs.known_kinds (kind) VALUES ('report'), ('tick'), ('crm-sync');
INSERT INTO jobs.worker_registry (worker, host, pid, kinds, started_at, last_seen_at, stopped_at)
VALUES ('host-a-101-f00d', 'host-a', 101, '{report,tick}', '2026-11-30 08:00Z', '2026-11-30 11:59:58Z', NULL),
       ('host-b-202-beef', 'host-b', 202, '{report,tick,crm-sync}', '2026-11-29 00:00Z',
        '2026-11-30 10:00Z', '2026-11-30 10:00Z');
"""


@pytest.fixture
def fixed(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    """Four definitions with a history, a leader, two workers, a queued run of a kind no
    worker registered, a catch-up; the display clock at 2026-11-30 12:00 UTC."""
    monkeypatch.setenv("PGTICK_NOW", NOW)
    monkeypatch.delenv("NO_COLOR", raising=False)
    leader = psycopg.connect(db.dsn, autocommit=True)
    with db.connect() as conn:
        conn.execute(
            "SELECT jobs.define('nightly-report', 'report', schedule => 'FREQ=DAILY;BYHOUR=3;BYMINUTE=0',"
            " timezone => 'Europe/Sofia', payload => '{\"team\": \"sofia\"}')"
        )
        conn.execute(
            "SELECT jobs.define('every-10s', 'tick', schedule => 'FREQ=SECONDLY;INTERVAL=10',"
            " max_concurrent_runs => 1, overlap_policy => 'skip')"
        )
        conn.execute(
            "SELECT jobs.define('sync-crm', 'crm-sync', schedule => '*/15 * * * *',"
            " timezone => 'America/New_York', enabled => false)"
        )
        conn.execute(
            "SELECT jobs.define('launch', 'announce', run_at => '2026-12-24 16:00Z',"
            " timezone => 'Europe/Sofia')"
        )
        conn.execute(STATE)
        assert scalar(leader, "SELECT jobs.try_lead('host-a-101-f00d')") is True
        conn.execute("UPDATE jobs._leadership SET since = '2026-11-30 08:00:05Z'")
    try:
        yield db
    finally:
        leader.close()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, f"pgtick {' '.join(args)} exited {code}: {err}"
    assert err == "", f"pgtick {' '.join(args)} wrote to stderr: {err}"
    return out


def mask(value: Any) -> Any:
    """The values the database computes from its own clock, and pids, masked."""
    if isinstance(value, dict):
        masked = {k: "<volatile>" if k in VOLATILE and v is not None else mask(v) for k, v in value.items()}
        if masked.get("status") == "RUNNING" and "duration" in masked and masked["duration"] is not None:
            masked["duration"] = "<volatile>"
        return masked
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PGTICK_GOLDEN_UPDATE"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (
        f"{name} differs from its golden file:\n--- got ---\n{text}\n--- expected ---\n{expected}"
    )


def validate(schema: str, data: Any) -> None:
    document = json.loads((SCHEMAS / f"{schema}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    jsonschema.validate(data, document, cls=jsonschema.Draft202012Validator)


def text_of(out: str) -> str:
    out = re.sub(r"\(pid \d+\)", "(pid <pid>)", out)
    return re.sub(r"^schema  \d{4}_.*$", "schema  <version>", out, flags=re.M)


# (golden name, argv, schema of its --json form)
COMMANDS = [
    ("status", ["status"], "status"),
    ("runs", ["runs"], "runs"),
    ("runs-failed", ["runs", "--status", "FAILED"], "runs"),
    ("show", ["show", "5"], "show"),
    ("workers", ["workers", "--all"], "workers"),
    ("definitions", ["definitions"], "definitions"),
    ("definitions-paused", ["definitions", "--paused"], "definitions"),
]


@pytest.mark.parametrize(("name", "argv", "schema"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_default_wide_and_json_output_match_the_golden_files(
    fixed: Database, capsys: pytest.CaptureFixture[str], name: str, argv: list[str], schema: str
) -> None:
    dsn = ["--dsn", fixed.dsn]
    default = text_of(run_cli(capsys, *argv, *dsn))
    too_wide = [line for line in default.splitlines() if len(line) > 100]
    assert not too_wide, f"lines wider than 100 columns in `pgtick {' '.join(argv)}`: {too_wide}"
    assert "True" not in default and "False" not in default and "None" not in default, default
    assert "\033[" not in default, "no colour when stdout is not a terminal"
    check_golden(f"{name}.txt", default)

    data = json.loads(run_cli(capsys, *argv, "--json", *dsn))
    validate(schema, data)
    check_golden(f"{name}.json", json.dumps(mask(data), indent=2, ensure_ascii=False) + "\n")

    if name != "show":
        wide = text_of(run_cli(capsys, *argv, "--wide", *dsn))
        check_golden(f"{name}-wide.txt", wide)


@pytest.mark.parametrize("command", ["runs", "definitions", "workers"])
def test_lists_as_csv_have_a_header_and_one_line_per_row(
    fixed: Database, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    import csv
    import io

    argv = [command, "--all"] if command == "workers" else [command]
    out = run_cli(capsys, *argv, "--format", "csv", "--dsn", fixed.dsn)
    rows = list(csv.DictReader(io.StringIO(out)))
    as_json = json.loads(run_cli(capsys, *argv, "--json", "--dsn", fixed.dsn))
    assert len(rows) == len(as_json) > 0
    first = rows[0]
    assert first["id" if command != "workers" else "worker"] == str(
        as_json[0]["id" if command != "workers" else "worker"]
    )
    assert set(out.splitlines()[0].split(",")) == set(as_json[0]), "the same fields as --json"


def test_status_says_what_matters_in_words(fixed: Database, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(capsys, "status", "--dsn", fixed.dsn)
    assert "leading for 3h59m" in out
    report = next(line for line in out.splitlines() if line.startswith("nightly-report"))
    assert "Dec 01 03:00 EET" in report and "in 13h" in report and "2 failed" in report
    assert "✓✓✓✗✗" in report, "the last outcomes as a strip of marks, oldest first"
    ticks = next(line for line in out.splitlines() if line.startswith("every-10s"))
    assert "✓✓↷✓" in ticks
    assert "every-10s: caught up after 2m30s of downtime: 15 occurrences coalesced into 1" in out
    assert "kind send-emial: 1 queued, oldest due 5m ago: no worker ever registered it" in out


@pytest.mark.parametrize(("no_color", "letters"), [("1", True), ("", False)])
def test_no_color_means_letters_and_an_empty_one_is_as_if_unset(
    fixed: Database,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_color: str,
    letters: bool,
) -> None:
    monkeypatch.setenv("NO_COLOR", no_color)
    out = run_cli(capsys, "status", "--dsn", fixed.dsn)
    report = next(line for line in out.splitlines() if line.startswith("nightly-report"))
    assert ("CCCFF" in report, "✓" in report) == (letters, not letters), report


def test_show_has_the_attempt_chain_and_the_error_as_stored(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_cli(capsys, "show", "4", "--dsn", fixed.dsn)
    assert "Traceback (most recent call last):" in out and 'File "jobs.py", line 12' in out
    data = json.loads(run_cli(capsys, "show", "4", "--json", "--dsn", fixed.dsn))
    assert [(a["id"], a["attempt"], a["status"]) for a in data["attempts"]] == [
        (4, 1, "FAILED"),
        (5, 2, "FAILED"),
    ]
    assert data["error"].startswith("ConnectionError: report server down\n\nTraceback")


def undocumented(schema: dict[str, Any], data: Any, path: str = "") -> list[str]:
    """The fields of ``data`` that ``schema`` does not name, where it names fields: what a
    script reads that the docs never promised, even where the schema lets more fields by."""
    found: list[str] = []
    if isinstance(data, dict):
        branches = [schema, *schema.get("oneOf", []), *schema.get("anyOf", [])]
        named = [b["properties"] for b in branches if "properties" in b]
        if named:
            known = {k: v for props in named for k, v in props.items()}
            found += [f"{path}.{k}" for k in data if k not in known]
            for k, v in data.items():
                if k in known:
                    found += undocumented(known[k], v, f"{path}.{k}")
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            found += undocumented(schema["items"], item, f"{path}[{i}]")
    return found


@pytest.mark.parametrize(("name", "argv", "schema"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_field_of_the_json_is_named_in_its_schema(
    fixed: Database, capsys: pytest.CaptureFixture[str], name: str, argv: list[str], schema: str
) -> None:
    """`status --json` lists each queue of each kind: the schema names every field a row has
    (the queue, whether it is paused, its limits), not only those of a kind's totals."""
    data = json.loads(run_cli(capsys, *argv, "--json", "--dsn", fixed.dsn))
    document = json.loads((SCHEMAS / f"{schema}.json").read_text())
    assert undocumented(document, data) == [], f"fields docs/schemas/{schema}.json does not name"


def test_every_other_command_prints_json_valid_against_its_schema(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = ["--dsn", fixed.dsn]
    cases: list[tuple[str, list[str]]] = [
        ("define", ["define", "hourly", "report", "--schedule", "0 * * * *"]),
        ("enqueue", ["enqueue", "report", "--payload", '{"a": 1}']),
        ("enqueue", ["enqueue", "report", "--queue", "mail"]),  # a queue in use, paused below
        ("run-now", ["run-now", "hourly"]),
        ("cancel", ["cancel", "--definition", "hourly"]),
        ("cancel", ["cancel", "10"]),
        ("pause", ["pause", "hourly"]),
        ("pause", ["resume", "hourly"]),
        ("retry", ["retry", "5"]),
        ("prune", ["prune", "--dry-run", "--older-than", "1h"]),
        ("prune", ["prune", "--older-than", "30d"]),
        ("undefine", ["undefine", "sync-crm"]),
        ("migrate", ["migrate"]),
        ("dsn", ["dsn"]),
        ("pause-queue", ["pause-queue", "mail"]),
        ("pause-queue", ["resume-queue", "mail"]),
    ]
    for schema, argv in cases:
        data = json.loads(run_cli(capsys, *argv, "--json", *dsn))
        validate(schema, data)
    preview = json.loads(
        run_cli(capsys, "preview", "0 9 * * 1-5", "--tz", "Europe/Sofia", "--count", "3", "--json")
    )
    validate("preview", preview)
    stored = json.loads(run_cli(capsys, "preview", "--definition", "nightly-report", "--json", *dsn))
    validate("preview", stored)
    assert stored["definition"] == "nightly-report" and len(stored["runs"]) == 10
    backfill = ["backfill", "nightly-report", "--from", "2026-11-20T00:00Z", "--to", "2026-11-22T00:00Z"]
    validate("backfill", json.loads(run_cli(capsys, *backfill, "--json", *dsn)))


def test_define_from_file_prints_json_valid_against_the_schema_the_docs_name(
    fixed: Database, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`define --from-file` prints a summary, not one definition's row: docs/cli.md names the
    schema of that document, and it holds."""
    row = re.search(
        r"^\| `define --from-file` \| \[([\w-]+)\.json\]", (ROOT / "docs" / "cli.md").read_text(), re.M
    )
    assert row, "docs/cli.md names no --json schema for define --from-file"
    lines = tmp_path / "definitions.jsonl"
    lines.write_text(
        '{"name": "from-file-a", "kind": "report", "schedule": "0 * * * *"}\n'
        '{"name": "nightly-report", "kind": "report", "schedule": "0 4 * * *", "timezone": "Europe/Sofia"}\n'
    )
    data = json.loads(run_cli(capsys, "define", "--from-file", str(lines), "--json", "--dsn", fixed.dsn))
    validate(row.group(1), data)
    assert data == {"definitions": 2, "created": 1, "rescheduled": 1}, data


def test_preview_json_says_what_dst_did_and_which_policy_chose_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON carries what the text shows: the effective policy, each run's offset and DST
    mark, and the wall times a gap skipped."""

    def previewed(*argv: str) -> dict[str, Any]:
        data = json.loads(run_cli(capsys, "preview", *argv, "--tz", "America/New_York", "--json"))
        validate("preview", data)
        return dict(data)

    fall = previewed("30 1 * * *", "--after", "2026-10-31T12:00", "--count", "2", "--dst-repeat", "both")
    assert (fall["dst_gap"], fall["dst_repeat"]) == ("end", "both")
    assert [(r["utc"], r["offset"], r["dst"]) for r in fall["runs"]] == [
        ("2026-11-01T05:30:00Z", "-04:00", "doubled"),
        ("2026-11-01T06:30:00Z", "-05:00", "doubled"),
    ]
    spring = previewed("30 2 * * *", "--after", "2026-03-07T12:00", "--count", "1", "--dst-gap", "skip")
    assert spring["skipped"] == [{"local": "2026-03-08T02:30:00", "dst": "skipped"}]
    assert [(r["local"], r["dst"]) for r in spring["runs"]] == [("2026-03-09T02:30:00", None)]
    moved = previewed("30 2 * * *", "--after", "2026-03-07T12:00", "--count", "1")
    assert [(r["local"], r["dst"]) for r in moved["runs"]] == [("2026-03-08T03:00:00", "moved")]


def test_undefine_says_what_happens_to_the_runs(fixed: Database, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(capsys, "undefine", "every-10s", "--dsn", fixed.dsn)
    check_golden("undefine.txt", out)
    with fixed.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.definitions WHERE name = 'every-10s'") == 0
        assert scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = 10") == "RUNNING", "it finishes"


def test_prune_dry_run_counts_and_prune_deletes(fixed: Database, capsys: pytest.CaptureFixture[str]) -> None:
    dsn = ["--dsn", fixed.dsn]
    assert run_cli(capsys, "prune", "--dry-run", "--older-than", "1h", *dsn) == (
        "would delete 9 finished runs (dry run)\n"
    )
    assert run_cli(capsys, "prune", "--older-than", "1h", "--batch", "2", *dsn) == "deleted 9 finished runs\n"
    with fixed.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE finished_at IS NOT NULL") == 0


def test_enqueue_of_a_kind_no_worker_registered_warns_on_one_stderr_line(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["enqueue", "repotr", "--dsn", fixed.dsn]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("run=") and "kind=repotr status=QUEUED" in out
    assert err == (
        "pgtick enqueue: warning: no worker has ever registered kind 'repotr': the run waits until one does\n"
    )
    assert cli.main(["enqueue", "report", "--dsn", fixed.dsn]) == 0
    out, err = capsys.readouterr()
    assert err == "", "a registered kind: no warning"


def test_enqueue_of_a_key_enqueued_before_says_it_queued_nothing_new(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["enqueue", "report", "--key", "invoice-7", "--dsn", fixed.dsn]) == 0
    first, _ = capsys.readouterr()
    assert cli.main(["enqueue", "report", "--key", "invoice-7", "--dsn", fixed.dsn]) == 0
    again, _ = capsys.readouterr()
    run = first.split()[0]
    assert "enqueued before" not in first, first
    assert again.startswith(f"{run} ") and again.rstrip().endswith(
        "(the run of key 'invoice-7', enqueued before: nothing new queued)"
    ), again
    with fixed.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE idempotency_key = 'invoice-7'") == 1


LONG_NAMES = """
SELECT jobs.define('customer-invoice-reconciliation-eu-west-nightly', 'billing.reconcile_invoices_for_region',
                   schedule => 'FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9,13,17;BYMINUTE=0,30',
                   timezone => 'America/Argentina/Buenos_Aires', max_concurrent_runs => 1);
SELECT jobs.define('customer-invoice-reconciliation-eu-west-weekly',
                   'billing.reconcile_invoices_for_region_weekly', schedule => '0 6 * * 1',
                   timezone => 'America/Argentina/Buenos_Aires');
UPDATE jobs.definitions SET created_at = '2026-11-01 00:00Z', updated_at = '2026-11-01 00:00Z',
       next_run_at = '2026-11-30 12:30Z'
 WHERE name LIKE 'customer-invoice-%';
INSERT INTO jobs.runs (definition_id, kind, status, scheduled_for, created_at, started_at, heartbeat_at,
                       finished_at, worker, failure_reason, error)
SELECT id, kind, 'FAILED', '2026-11-30 11:30Z', '2026-11-30 11:30Z', '2026-11-30 11:30:01Z',
       '2026-11-30 11:30:01Z', '2026-11-30 11:31:07Z',
       'ip-10-20-130-44.eu-west-1.compute.internal-48211-a1b2c3d4', 'Error',
       'psycopg.errors.SerializationFailure: could not serialize access due to concurrent update'
  FROM jobs.definitions WHERE name = 'customer-invoice-reconciliation-eu-west-nightly';
INSERT INTO jobs.runs (definition_id, kind, scheduled_for, created_at)
SELECT id, kind, '2026-11-30 11:58Z', '2026-11-30 11:58Z'
  FROM jobs.definitions WHERE name = 'customer-invoice-reconciliation-eu-west-weekly';
INSERT INTO jobs.known_kinds (kind) VALUES ('billing.reconcile_invoices_for_region');
INSERT INTO jobs.worker_registry (worker, host, pid, kinds, started_at, last_seen_at, stopped_at)
VALUES ('ip-10-20-130-44.eu-west-1.compute.internal-48211-a1b2c3d4',
        'ip-10-20-130-44.eu-west-1.compute.internal', 48211,
        '{billing.reconcile_invoices_for_region,report}', '2026-11-30 06:00Z', '2026-11-30 11:59:59Z', NULL);
"""


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("status-long", ["status"]),
        ("runs-long", ["runs"]),
        ("definitions-long", ["definitions"]),
        ("workers-long", ["workers", "--all"]),
    ],
)
def test_long_names_fit_and_stay_apart(
    fixed: Database, capsys: pytest.CaptureFixture[str], name: str, argv: list[str]
) -> None:
    """Names, kinds, zones and workers of production length: each list still fits 100
    columns; a short name is never cut to make room for a long one's neighbours (the least
    important column gives way first), and two long names that share a prefix are cut in
    the middle, so they stay told apart."""
    with fixed.connect() as conn:
        conn.execute(LONG_NAMES)
    out = text_of(run_cli(capsys, *argv, "--dsn", fixed.dsn))
    too_wide = [line for line in out.splitlines() if len(line) > 100]
    assert not too_wide, f"lines wider than 100 columns in `pgtick {' '.join(argv)}`: {too_wide}"
    check_golden(f"{name}.txt", out)
    lines = out.splitlines()
    if name in ("status-long", "definitions-long"):
        for short in ("nightly-report", "sync-crm", "every-10s"):
            assert any(line.startswith(short + " ") for line in lines), f"{short} cut or missing:\n{out}"
    if name != "workers-long":
        column = 2 if name == "runs-long" else 0  # DEFINITION or NAME
        cells = [re.split(r"\s{2,}", line.strip())[column] for line in lines if "custome" in line]
        assert len(set(cells)) == len(cells) == 2, f"the two long names cut alike: {cells}\n{out}"


def test_backfill_says_how_many_occurrences_the_window_held(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary tells a window with no occurrence from one whose occurrences all had
    their run already: "runs=0" alone reads the same for both."""
    dsn = ["--dsn", fixed.dsn]
    backfill = ["backfill", "nightly-report"]
    out = run_cli(capsys, *backfill, "--from", "2026-11-25T00:00Z", "--to", "2026-11-28T00:00Z", *dsn)
    assert out.endswith(" runs=1 (of 3 occurrences, 2 already had a run)\n"), out
    out = run_cli(capsys, *backfill, "--from", "2026-11-25T00:00Z", "--to", "2026-11-28T00:00Z", *dsn)
    assert out.endswith(" runs=0 (of 3 occurrences, 3 already had a run)\n"), out
    quiet = ["--from", "2026-11-25T02:00Z", "--to", "2026-11-25T03:00Z"]
    out = run_cli(capsys, *backfill, *quiet, *dsn)
    assert out.endswith(" runs=0 (no occurrence of its schedule falls in the window)\n"), out
    data = json.loads(run_cli(capsys, *backfill, *quiet, "--json", *dsn))
    validate("backfill", data)
    assert (data["runs"], data["occurrences"]) == (0, 0), data


@pytest.mark.parametrize(
    ("name", "argv"),
    [("status", ["status"]), ("definitions", ["definitions"]), ("workers", ["workers", "--all"])],
)
def test_a_narrow_terminal_drops_columns_before_cutting_names(
    fixed: Database, name: str, argv: list[str]
) -> None:
    """Under a real pseudo-terminal 72 columns wide: every line fits, and once a column is
    dropped the others get their room back (a name is not left cut beside empty space)."""

    env = tty_env()
    env["COLUMNS"] = "72"
    code, out = in_pty([*argv, "--dsn", fixed.dsn], env)
    assert code == 0, out
    assert "\033[" in out, "colour on a terminal"
    text = text_of(re.sub(r"\033\[[0-9;?]*[a-zA-Z]", "", out).replace("\r\n", "\n"))
    too_wide = [line for line in text.splitlines() if len(line) > 72]
    assert not too_wide, f"lines wider than 72 columns in `pgtick {' '.join(argv)}`: {too_wide}"
    check_golden(f"{name}-72.txt", text)
    names = {"status": "nightly-report", "definitions": "nightly-report", "workers": "host-a-101-f00d"}
    assert any(line.startswith(names[name] + " ") for line in text.splitlines()), (
        f"{names[name]} cut:\n{text}"
    )


def _fitted(argv: list[str], fixed: Database, width: int) -> str:
    """`pgtick ARGV` in a real pseudo-terminal `width` columns wide: its text, once every line
    is checked to fit."""
    env = tty_env(NO_COLOR="1")
    env["COLUMNS"] = str(width)
    code, raw = in_pty([*argv, "--dsn", fixed.dsn], env)
    assert code == 0, raw
    text = text_of(raw.replace("\r\n", "\n"))
    too_wide = [line for line in text.splitlines() if columns(line) > width]
    assert not too_wide, f"lines wider than {width} columns in `pgtick {' '.join(argv)}`:\n{text}"
    return text


@pytest.mark.parametrize("width", [30, 24])
@pytest.mark.parametrize(
    "argv", [["runs"], ["status"], ["definitions"], ["workers", "--all"]], ids=lambda a: a[0]
)
def test_tables_fit_a_terminal_narrower_than_forty_columns(
    fixed: Database, argv: list[str], width: int
) -> None:
    """Under a real pseudo-terminal 30 or 24 columns wide every line fits, as the docs say
    (a table laid out for 40 columns wrapped each of its rows there), and each row still
    starts with what it is about."""
    text = _fitted(argv, fixed, width)
    first = {"runs": "11 ", "status": "every-10s", "definitions": "every-10s", "workers": "host-a-101-f00d"}
    assert any(line.startswith(first[argv[0]]) for line in text.splitlines()), text


@pytest.mark.parametrize("width", [80, 60, 100])
def test_names_sharing_a_prefix_and_a_suffix_are_cut_apart(fixed: Database, width: int) -> None:
    """Two names that differ only in their middle, too long for the column: cut in the
    middle alone both read ``custom…ounts``; each is cut so that where they differ shows,
    and every line still fits."""
    names = [f"customer-invoices-reconciliation-{region}-nightly-counts" for region in ("eu-west", "us-east")]
    with fixed.connect() as conn:
        for name in names:
            conn.execute("SELECT jobs.define(%s, 'report', schedule => '0 3 * * *')", (name,))
    env = tty_env(NO_COLOR="1")
    env["COLUMNS"] = str(width)
    code, raw = in_pty(["definitions", "--dsn", fixed.dsn], env)
    assert code == 0, raw
    text = text_of(raw.replace("\r\n", "\n"))
    too_wide = [line for line in text.splitlines() if columns(line) > width]
    assert not too_wide, f"lines wider than {width} columns:\n{text}"
    cells = [line.split("  ")[0] for line in text.splitlines() if line.startswith("cu")]
    assert len(cells) == 2 and cells[0] != cells[1], f"the two names look the same:\n{text}"
    assert "eu" in cells[0] and "us" in cells[1], text


@pytest.mark.parametrize(
    "names",
    [
        ["每日报表生成任务-亚太区域-销售-汇总", "每日报表生成任务-欧洲区域-销售-汇总"],
        ["a" * 30 + "X" + "b" * 30, "a" * 30 + "Y" + "b" * 30, "a" * 10 + "Z" + "a" * 19 + "X" + "b" * 30],
        ["x" * 20 + "1" + "y" * 5, "x" * 20 + "2" + "y" * 5, "short"],
    ],
    ids=["chinese", "three", "near-the-end"],
)
def test_a_table_cut_keeps_different_names_different_at_every_width(names: list[str]) -> None:
    from pgtick.terminal import Column, Style, Table

    for width in range(7, 40):
        table = Table([Column("NAME", lambda r: r["name"], shrink=True, min_width=1, middle=True)])
        table.rows = [{"name": name} for name in names]
        lines = table.render(Style(unicode=True, colour=False, width=width)).splitlines()[1:]
        cells = [line.rstrip() for line in lines]
        assert all(columns(line) <= width for line in lines), (width, lines)
        assert len(set(cells)) == len(names), f"at {width} columns: {cells}"


@pytest.mark.parametrize("width", [100, 72])
def test_undefine_with_many_running_runs_names_a_few_on_a_line_that_fits(fixed: Database, width: int) -> None:
    """Hundreds of runs still running: the line lists the first ids that fit and how many
    more there are, not every id on one unbounded line; --json keeps them all."""
    with fixed.connect() as conn:
        conn.execute(
            "INSERT INTO jobs.runs"
            " (definition_id, kind, status, scheduled_for, started_at, heartbeat_at, worker)"
            " SELECT id, kind, 'RUNNING', now(), now(), now(), 'host-a-101-f00d'"
            " FROM jobs.definitions, generate_series(1, 300) WHERE name = 'every-10s'"
        )
        running = [
            row[0] for row in conn.execute("SELECT id FROM jobs.runs WHERE status = 'RUNNING' ORDER BY id")
        ]
    env = tty_env(NO_COLOR="1")
    env["COLUMNS"] = str(width)
    code, raw = in_pty(["undefine", "every-10s", "--dsn", fixed.dsn], env)
    assert code == 0, raw
    lines = raw.replace("\r\n", "\n").splitlines()
    line = next(line for line in lines if "will finish" in line)
    assert columns(line) <= width, f"wider than {width} columns:\n{raw}"
    assert line.startswith(f"  301 running runs will finish: {running[0]}, "), line
    shown = re.findall(r"\d+", line.split(":", 1)[1].split("…")[0])
    assert f"and {len(running) - len(shown)} more" in line, line


def test_show_keeps_each_attempt_to_one_line_that_fits(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """An attempt's error as long as a real one: its line in the attempt chain is cut to
    100 columns (the error in full follows, as stored)."""
    long = "psycopg.errors.SerializationFailure: could not serialize access due to concurrent update " * 2
    with fixed.connect() as conn:
        conn.execute("UPDATE jobs.runs SET error = %s WHERE id IN (4, 5)", (long.strip(),))
    out = run_cli(capsys, "show", "5", "--dsn", fixed.dsn)
    lines = out.splitlines()
    chain = lines[lines.index("attempts") + 1 : lines.index("payload")]
    assert len(chain) == 2 and chain[1].endswith("<- this run"), chain
    too_wide = [line for line in chain if len(line) > 100]
    assert not too_wide, f"attempt lines wider than 100 columns: {too_wide}"
    assert long.strip() in out, "the error in full, as stored"


def test_show_fits_the_attempt_chain_to_a_narrow_terminal(fixed: Database) -> None:
    """At 40 columns every line of the attempt chain
    fits: an error with no room beside its status is cut on a line of its own, and an
    attempt cancelled with no failure reason shows its error alone (not ``None: …``)."""
    long = "psycopg.errors.SerializationFailure: could not serialize access due to concurrent update"
    with fixed.connect() as conn:
        conn.execute("UPDATE jobs.runs SET error = %s WHERE id IN (4, 5)", (long,))
        conn.execute(
            "INSERT INTO jobs.runs (definition_id, kind, status, attempt, retry_of, origin, scheduled_for,"
            " created_at, finished_at, error)"
            " SELECT definition_id, kind, 'CANCELLED', 3, id, 'retry', '2026-11-29 01:00:30Z',"
            " '2026-11-29 01:00:18Z', '2026-11-29 01:00:20Z', 'cancelled before it started'"
            " FROM jobs.runs WHERE id = 5"
        )
    for columns in (40, 100):
        env = tty_env()
        env["COLUMNS"] = str(columns)
        code, out = in_pty(["show", "5", "--dsn", fixed.dsn], env)
        assert code == 0, out
        lines = re.sub(r"\033\[[0-9;?]*[a-zA-Z]", "", out).replace("\r\n", "\n").splitlines()
        chain = lines[lines.index("attempts") + 1 : lines.index("payload")]
        too_wide = [line for line in chain if len(line) > columns]
        assert not too_wide, f"attempt lines wider than {columns} columns: {too_wide}\n{out}"
        assert not any("None" in line for line in chain), chain
        assert any("cancelled before it started" in line for line in chain), chain
        assert any("<-" in line for line in chain), f"this run is not marked: {chain}"
        assert any("Error: psycopg.errors" in line for line in chain), f"the errors were left out: {chain}"


def test_runs_of_a_definition_that_does_not_exist_warns_on_stderr(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt name still lists nothing (a filter; --json stays []), and says on stderr
    that no definition has that name, so a typo does not read as a definition that never ran."""
    assert cli.main(["runs", "--definition", "nightly-reprot", "--dsn", fixed.dsn]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("no runs\n", "pgtick runs: warning: no definition is named 'nightly-reprot'\n")
    assert run_cli(capsys, "runs", "--definition", "sync-crm", "--dsn", fixed.dsn) == "no runs\n"


#: Names a terminal shows wider or narrower than their length: Chinese (two columns a
#: character), emoji (two), an accent written as a combining mark (none), Arabic.
UNICODE_NAMES = """
SELECT jobs.define('每日报表生成任务-亚太区域-销售', '报表生成', schedule => '0 3 * * *',
                   timezone => 'Asia/Shanghai');
SELECT jobs.define('🚀-launch-🎉-party', 'émoji-kind-🎯', schedule => '*/5 * * * *');
SELECT jobs.define(E'cafe\\u0301-nightly-re\\u0301sume\\u0301', 'report', schedule => '0 4 * * *');
SELECT jobs.define('تقرير-يومي-للمبيعات', 'report', schedule => '0 5 * * *', timezone => 'Asia/Riyadh');
INSERT INTO jobs.runs (definition_id, kind, status, scheduled_for, started_at, finished_at,
                       failure_reason, error)
SELECT id, kind, 'FAILED', '2026-11-30 11:00Z', '2026-11-30 11:00Z', '2026-11-30 11:01Z', 'Error',
       '错误 数据库连接失败 请检查网络设置以及防火墙配置 然后再试一次 🔥🔥🔥'
  FROM jobs.definitions WHERE name NOT IN ('launch', 'sync-crm');
"""


def columns(text: str) -> int:
    """Columns ``text`` takes on a terminal (measured without the code under test)."""
    import unicodedata

    return sum(
        0
        if unicodedata.combining(c) or c in "\u200d\ufe0f"
        else 2
        if unicodedata.east_asian_width(c) in "WF"
        else 1
        for c in text
    )


@pytest.mark.parametrize(
    "argv", [["runs"], ["definitions"], ["status"]], ids=["runs", "definitions", "status"]
)
@pytest.mark.parametrize("width", [100, 60])
def test_wide_and_combining_characters_fit_and_line_up(
    fixed: Database, capsys: pytest.CaptureFixture[str], argv: list[str], width: int
) -> None:
    """Names and errors in Chinese, with emoji or with combining accents: a table is measured
    in terminal columns, not characters, so it still fits (into a pipe and under a real
    pseudo-terminal) and its columns line up; a name is not cut because of its accents."""
    with fixed.connect() as conn:
        conn.execute(UNICODE_NAMES)
    if width == 100:
        out = text_of(run_cli(capsys, *argv, "--dsn", fixed.dsn))
    else:
        env = tty_env(NO_COLOR="1")
        env["COLUMNS"] = str(width)
        code, raw = in_pty([*argv, "--dsn", fixed.dsn], env)
        assert code == 0, raw
        out = text_of(raw.replace("\r\n", "\n"))
    lines = out.splitlines()
    too_wide = [line for line in lines if columns(line) > width]
    assert not too_wide, f"lines wider than {width} columns in `pgtick {argv[0]}`:\n" + "\n".join(too_wide)
    header = next(line for line in lines if line.startswith(("ID ", "NAME ", "DEFINITION ")))
    table = lines[lines.index(header) + 1 :]
    rows = table[: table.index("")] if "" in table else table
    assert len(rows) >= 8, out
    if width == 100 and argv != ["runs"]:  # (runs cuts names to make room for the errors)
        assert any("café-nightly-résumé " in line.replace("e\u0301", "é") for line in rows), (
            f"a name with combining accents cut though it fits:\n{out}"
        )
    # The column after the name starts at the same screen column on every row as in the header.
    after = {"runs": "TRY", "definitions": "SCHEDULE", "status": "NEXT"}[argv[0]]
    if f" {after} " in header or header.endswith(f" {after}"):
        start = columns(header[: header.index(f" {after}") + 1])
        for row in rows:
            cell = row[len(row) - len(row.lstrip()) :]
            prefix = ""
            for ch in row:  # the row up to the screen column where the header's column starts
                if columns(prefix + ch) > start:
                    break
                prefix += ch
            assert columns(prefix) == start and prefix.endswith("  "), (
                f"{after} does not line up in:\n{header}\n{row}\n(all:\n{out})"
            )
            assert cell


def test_control_characters_in_an_error_reach_the_terminal_as_text(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job's error is whatever its code raised, often a tool's coloured output: `runs` and
    `show` print its escape sequences as ``^[`` (so they cannot recolour, clear or retitle
    the operator's terminal) and a tab as a space in a table; --json keeps it as stored."""
    error = (
        "CalledProcessError: \033[31mFAILED\033[0m test_x\tassert 1 == 2 \033[1m(see log)"
        "\033]0;owned\007\033[2J\x9b2K\x7f \u202edesrever"
    )
    with fixed.connect() as conn:
        conn.execute("UPDATE jobs.runs SET error = %s WHERE id = 5", (error,))
    for argv in (["runs", "--status", "FAILED", "--wide"], ["show", "5"]):
        out = run_cli(capsys, *argv, "--dsn", fixed.dsn)
        shown = [
            c for c in out if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c == "\u202e"
        ]
        assert not shown, f"control characters reached the terminal from `pgtick {argv[0]}`: {shown}\n{out}"
        assert "CalledProcessError: ^[[31mFAILED^[[0m test_x" in out, out
    runs = run_cli(capsys, "runs", "--status", "FAILED", "--wide", "--dsn", fixed.dsn)
    assert "\t" not in runs and "test_x assert" in runs, runs
    show = run_cli(capsys, "show", "5", "--dsn", fixed.dsn)
    assert "  CalledProcessError: ^[[31mFAILED^[[0m test_x\tassert 1 == 2 ^[[1m(see log)" in show, show
    assert "^[]0;owned^G^[[2J\\x9b2K^? \\u202edesrever" in show, show
    data = json.loads(run_cli(capsys, "show", "5", "--json", "--dsn", fixed.dsn))
    assert data["error"] == error


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/St_Johns"])
def test_show_json_gives_the_attempt_times_in_utc_whatever_the_session_zone(
    fixed: Database, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, zone: str
) -> None:
    """The attempt chain of `pgtick show --json` is built as JSON in SQL; its times are UTC
    with a Z like every other time in the output, not written in the session's TimeZone (a
    server's `timezone` setting, the role's, or PGTZ)."""
    monkeypatch.setenv("PGTZ", zone)
    data = json.loads(run_cli(capsys, "show", "5", "--json", "--dsn", fixed.dsn))
    validate("show", data)
    (first, this) = data["attempts"]
    assert (this["started_at"], this["finished_at"]) == (data["started_at"], data["finished_at"])
    assert (first["started_at"], first["finished_at"]) == ("2026-11-29T01:00:01Z", "2026-11-29T01:00:04Z")


def test_status_of_more_definitions_than_a_page_fits_the_width(
    fixed: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """More definitions than --limit shows: the line that says how many are left out (and
    how many are paused or failing) wraps within the width like the notes do."""
    with fixed.connect() as conn:
        conn.execute(
            "SELECT jobs.define('bulk-' || i, 'k', schedule => '0 3 * * *') FROM generate_series(1, 60) AS i"
        )
    out = run_cli(capsys, "status", "--limit", "5", "--dsn", fixed.dsn)
    too_wide = [line for line in out.splitlines() if len(line) > 100]
    assert not too_wide, f"lines wider than 100 columns:\n{too_wide}"
    assert "(5 of 64 definitions shown: --limit, --offset; 1 paused," in out, out


def test_status_notes_on_a_narrow_terminal_wrap_by_terminal_columns(db: Database) -> None:
    """On a terminal 40 columns wide, the lines of `pgtick status` that are not a table (the
    leader, the note on a kind no worker runs, here with a Chinese name) wrap within the
    width as the terminal counts it, instead of running past the edge."""
    with db.connect() as conn:
        conn.execute("SELECT jobs.enqueue('生成每日销售报表并发送邮件给管理团队')")
    env = tty_env(NO_COLOR="1")
    env["COLUMNS"] = "40"
    code, raw = in_pty(["status", "--dsn", db.dsn], env)
    assert code == 0, raw
    lines = raw.replace("\r\n", "\n").splitlines()
    too_wide = [line for line in lines if columns(line) > 40]
    assert not too_wide, "lines wider than 40 columns:\n" + "\n".join(too_wide)
    assert lines[0] == "leader  none: no scheduler is running,", lines
    assert any(line.startswith("kind 生成每日") for line in lines), lines


def test_workers_with_none_alive_points_at_the_lost_ones_too(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker killed with -9 is lost, not stopped: when no worker is alive, the line that
    says so points at --all for the lost ones as well, which are what an operator is after;
    --all on a database no worker ever reached says there are none, not that none is live."""
    assert cli.main(["workers", "--all", "--dsn", db.dsn]) == 0
    assert capsys.readouterr().out == "no workers\n"
    with db.connect() as conn:
        conn.execute("SELECT jobs.register_worker('killed-worker', ARRAY['report'])")
        conn.execute("UPDATE jobs.worker_registry SET last_seen_at = now() - interval '1 hour'")
        assert scalar(conn, "SELECT state FROM jobs.workers") == "lost"
    assert cli.main(["workers", "--dsn", db.dsn]) == 0
    out, _ = capsys.readouterr()
    assert out == "no live workers (pgtick workers --all shows stopped and lost ones)\n"
    assert cli.main(["workers", "--all", "--dsn", db.dsn]) == 0
    out, _ = capsys.readouterr()
    assert "killed-worker" in out and "lost" in out


def test_a_count_of_one_takes_the_singular() -> None:
    from pgtick.terminal import counted

    assert [counted(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert counted(1, "worker process", "worker processes") == "1 worker process"
    assert counted(3, "worker process", "worker processes") == "3 worker processes"


@pytest.mark.parametrize("width", [24, 80])
@pytest.mark.parametrize("argv", [["show", "5"], ["undefine", "every-10s"]], ids=lambda a: a[0])
def test_show_and_undefine_fit_a_narrow_terminal(fixed: Database, argv: list[str], width: int) -> None:
    """Under a real pseudo-terminal 24 or 80 columns wide every line of `pgtick show` and
    `pgtick undefine` fits, as the tables of the other commands do: a long field wraps
    under its label, a long value is cut, and what each line is about still leads it."""
    long = "psycopg.errors.SerializationFailure: could not serialize access due to concurrent update"
    with fixed.connect() as conn:
        conn.execute("UPDATE jobs.runs SET error = %s WHERE id IN (4, 5)", (long,))
    text = _fitted(argv, fixed, width)
    lines = text.splitlines()
    if argv[0] == "show":
        assert lines[0].startswith("run 5"), text
        assert any(line.startswith("attempts") for line in lines), text
        error = lines[lines.index("error") + 1 :]
        assert "".join(error).replace(" ", "") == long.replace(" ", ""), f"the error is not in full:\n{text}"
    else:
        assert lines[0].startswith("definition=every-10s"), text
        finish = next(n for n, line in enumerate(lines) if "running run will" in line)
        assert "10" in " ".join(lines[finish : finish + 3]), f"the running run is not named:\n{text}"
        assert "and 0 more" not in text, text


def test_show_and_undefine_piped_keep_long_values_whole(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped (to a file, grep, a script), `pgtick show` and `pgtick undefine` write each value
    as stored, however long, as they did before they fitted a terminal: a kind, a worker id or
    a definition name of 150 characters is not cut at 100 columns."""
    kind, worker, name = "k" * 150, "w" * 150, "d" * 150
    with db.connect() as conn:
        conn.execute("SELECT jobs.define(%s, %s, run_at => now() + interval '1 day')", (name, kind))
        run_id = scalar(
            conn,
            "INSERT INTO jobs.runs (kind, status, attempt, started_at, worker)"
            " VALUES (%s, 'RUNNING', 1, now(), %s) RETURNING id",
            (kind, worker),
        )
    assert cli.main(["show", str(run_id), "--dsn", db.dsn]) == 0
    shown, _ = capsys.readouterr()
    assert f"  kind        {kind}\n" in shown and f"  worker      {worker}\n" in shown, shown
    assert cli.main(["undefine", name, "--dsn", db.dsn]) == 0
    said, _ = capsys.readouterr()
    assert said.startswith(f"definition={name} deleted\n"), said


def test_a_paused_queue_says_so_in_status_however_its_name_is_cut(
    db: Database, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue table cuts a long queue name to fit 100 columns; what it cuts is the name,
    never the mark that the queue is paused (the one fact an operator looks for there)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    with db.connect() as conn:
        for queue in ("customer-notifications-eu", "customer-notifications-us"):
            conn.execute("SELECT jobs.enqueue('billing.reconcile_invoices', queue => %s)", (queue,))
        assert scalar(conn, "SELECT jobs.pause_queue('customer-notifications-eu')") is True
    out = run_cli(capsys, "status", "--dsn", db.dsn)
    table = out[out.index("KIND ") :].splitlines()
    assert all(len(line) <= 100 for line in table), table
    rows = [line for line in table[1:] if line.strip()]
    assert len(rows) == 2, table
    assert sorted("(paused)" in row for row in rows) == [False, True], table
    assert len({row.split("  ")[1] for row in rows}) == 2, f"the two queues look alike: {table}"


def test_a_kind_on_several_queues_keeps_its_queue_column_on_a_narrow_terminal(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a kind has runs on more than one queue, its rows differ only by their queue: a
    narrow terminal drops other columns first, so that no two rows look alike."""
    from pgtick.terminal import Style

    monkeypatch.setenv("PGTICK_NOW", NOW)
    with db.connect() as conn:
        for queue in ("default", "default", "mail", "bulk"):
            conn.execute("SELECT jobs.enqueue('report', queue => %s)", (queue,))
        conn.execute("SELECT jobs.enqueue('billing.reconcile_invoices_for_region')")
    with psycopg.connect(db.dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        snap = cli.status_snapshot(conn)
    out = cli.render_status(snap, Style(unicode=True, colour=False, width=60, terminal=True), False)
    table = out[out.index("KIND ") :].splitlines()
    assert all(len(line) <= 60 for line in table), table
    assert "QUEUE" in table[0].split(), table
    reports = [line for line in table[1:] if line.startswith("report ")]
    assert len(set(reports)) == 3, f"three queues of report, three different rows: {table}"


def test_a_coloured_last_column_ends_its_line_without_padding() -> None:
    """A table's lines end where their text does: a coloured cell in the last column is not
    padded inside its colour, where the line's trailing spaces could not be stripped."""
    from pgtick.terminal import Column, Style, Table

    table = Table(
        [
            Column("NAME", lambda r: r["name"]),
            Column("STREAK", lambda r: r["streak"], colour=lambda r: "red" if r["streak"] else None),
        ],
        [
            {"name": "a", "streak": "1 failed"},
            {"name": "b", "streak": "10 failed"},
            {"name": "c", "streak": ""},
        ],
    )
    out = table.render(Style(unicode=True, colour=True, width=100, terminal=True))
    plain = [re.sub(r"\033\[[0-9;]*m", "", line) for line in out.splitlines()]
    assert [line for line in plain if line != line.rstrip()] == [], out
    assert plain[1:] == ["a     1 failed", "b     10 failed", "c"], out


def test_a_cut_keeps_a_flag_whole() -> None:
    """A flag is two regional indicators a terminal draws as one two-column character; one
    alone is drawn as a box of its own (two columns, not the one it is counted as), so a cut
    takes both or neither, and the line keeps the width it was counted at."""
    from pgtick.terminal import clip, visible_len

    for width in range(2, 9):
        cut = clip("🇯🇵🇫🇷🇩🇪 flags", width)
        indicators = [ch for ch in cut if 0x1F1E6 <= ord(ch) <= 0x1F1FF]
        assert len(indicators) % 2 == 0, f"a flag cut in two at width {width}: {cut!r}"
        assert visible_len(cut) <= width, cut
