"""A happy-path round trip through the CLI against a real database: every operator
command once, each checked against the rows it should have written."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import psycopg
from procs import pgtick

from harness import Database


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
        assert out == "definition=weekday-report cancelled 1 queued runs\n", out
        assert one(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (manual,)) == ("CANCELLED",)

        # status --json and runs --json parse and show what we did
        status = json.loads(ok("status", "--json", *dsn))
        assert set(status) >= {"definitions", "queues", "leader"}, status
        assert status["leader"] == [], status["leader"]  # no scheduler runs in this test
        assert sorted(d["name"] for d in status["definitions"]) == ["cleanup", "launch", "weekday-report"]
        assert {q["kind"] for q in status["queues"]} >= {"send-email"}, status["queues"]
        assert "leader: none" in ok("status", *dsn)

        runs = json.loads(ok("runs", "--json", *dsn))
        assert [(r["id"], r["status"]) for r in runs] == [
            (retry_id, "QUEUED"),
            (manual, "CANCELLED"),
            (run_id, "CANCELLED"),
        ], runs
        queued_only = json.loads(ok("runs", "--json", "--status", "QUEUED", "--kind", "send-email", *dsn))
        assert [r["id"] for r in queued_only] == [retry_id], queued_only
        assert str(retry_id) in ok("runs", *dsn)  # the table form
