"""`pgtick status` (tables and --json) and `pgtick runs --json` against a test database."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from ops_support import PGTICK, ROOT, Conn, claim, enqueue, scalar

from harness import Database
from pgtick import cli


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
    db: Database, busy: dict[str, Any], machine_in_new_york: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _pgtick(capsys, "status", "--dsn", db.dsn)
    lines = out.splitlines()
    assert lines[0].startswith("leader: cli-leader (pid ")
    assert "definitions:" in lines and "queues:" in lines
    defs = out[out.index("definitions:") : out.index("queues:")]
    row = next(line for line in defs.splitlines() if line.startswith("sofia-report"))
    # Local wall-clock time in the definition's zone, not shifted by this machine's zone.
    assert "2031-07-01 08:00:00" in row and "Europe/Sofia" in row and "FAILED" in row
    assert "08:00:00Z" not in row
    queues = out[out.index("queues:") :].splitlines()
    header = queues[1].split()
    mail = dict(zip(header, next(q for q in queues if q.startswith("mail")).split(), strict=False))
    assert (mail["queued"], mail["running"]) == ("2", "1")
    report = dict(zip(header, next(q for q in queues if q.startswith("report")).split(), strict=False))
    assert report["failed_1h"] == "1"


def test_status_json(db: Database, busy: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
    assert [leader["owner"] for leader in snap["leader"]] == ["cli-leader"]
    assert datetime.fromisoformat(snap["leader"][0]["since"]).tzinfo is not None
    (definition,) = snap["definitions"]
    assert definition["name"] == "sofia-report"
    assert definition["next_run_local"] == "2031-07-01T08:00:00"
    assert (definition["last_status"], definition["fails"], definition["paused"]) == ("FAILED", 1, False)
    queues = {q["kind"]: q for q in snap["queues"]}
    assert (queues["mail"]["queued"], queues["mail"]["running"]) == (2, 1)
    assert 300 <= queues["mail"]["oldest_queued_age"] < 400, "an interval becomes seconds"
    assert queues["report"]["failed_1h"] == 1


def test_status_of_an_empty_installation(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    out = _pgtick(capsys, "status", "--dsn", db.dsn)
    assert "leader: none" in out and "(none)" in out and "(empty)" in out
    snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn))
    assert snap == {"leader": [], "definitions": [], "queues": []}


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
    assert json.loads(proc.stdout)["leader"][0]["owner"] == "cli-leader"


def test_status_works_for_the_read_only_role(
    db: Database, busy: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The console role jobs_reader can run `pgtick status` (the leader view used to refuse it)."""
    snap = json.loads(_pgtick(capsys, "status", "--json", "--dsn", db.dsn_as("pgtick_t_reader")))
    assert [leader["owner"] for leader in snap["leader"]] == ["cli-leader"]
    assert [d["name"] for d in snap["definitions"]] == ["sofia-report"]
