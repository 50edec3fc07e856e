"""Every ```sql snippet of docs/operations.md runs without error, through psql, with the
runbook's variables set, against a database holding runs in every state.

Each snippet gets its own clone of one seeded database, so a snippet that changes things
(cancel, retry, prune, pause) cannot break the next one, and the order in the document is
free. A leader session holds the leader lock while the snippet runs.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ROOT, Conn, Database, Server, claim, enqueue, finish_old, psql_binary, scalar

RUNBOOK = ROOT / "docs" / "operations.md"
SNIPPETS = re.findall(r"^```sql\n(.*?)^```", RUNBOOK.read_text(), flags=re.DOTALL | re.MULTILINE)
WORKER = "web-7-31337-a1b2c3"
NAME = "nightly-report"


def seed(conn: Conn) -> int:
    """Definitions and runs in every state; returns the id of a FAILED run (the :run_id)."""
    conn.execute("UPDATE jobs.config SET max_attempts = 1")
    conn.execute("SELECT jobs.set_retry_policy('report', allow => '{Timeout}', max_attempts => 3)")
    conn.execute(
        "SELECT jobs.define('nightly-report', 'report', schedule => 'FREQ=DAILY;BYHOUR=2',"
        " timezone => 'Europe/Sofia', max_concurrent_runs => 1)"
    )
    conn.execute(
        "SELECT jobs.define('every-minute', 'tick', schedule => '* * * * *', max_concurrent_runs => 1,"
        " overlap_policy => 'skip')"
    )
    # An RRULE that never occurs: SQL takes it, the scheduler records a schedule error.
    conn.execute("SELECT jobs.define('broken', 'tick', schedule => 'FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30')")
    conn.execute("SELECT jobs.define('launch', 'announce', run_at => now() - interval '1 hour')")
    conn.execute("SELECT jobs.materialize_one_shots()")
    conn.execute(
        "UPDATE jobs.definitions SET next_run_at = now() - interval '10 minutes'"
        " WHERE name IN ('nightly-report', 'every-minute')"
    )
    conn.execute(
        "SELECT jobs.mark_schedule_error(id, revision, 'BYHOUR must be 0..23') FROM jobs.definitions"
        " WHERE name = 'broken'"
    )

    # nightly-report: a failure (the :run_id), then one running and one waiting behind the cap.
    failed = int(scalar(conn, "SELECT id FROM jobs.run_now('nightly-report')"))
    assert claim(conn, WORKER, kinds=["report"]) == [failed]
    conn.execute("SELECT jobs.fail(%s, %s, '{ConnectionError}', 'report server down')", (failed, WORKER))
    running = int(scalar(conn, "SELECT id FROM jobs.run_now('nightly-report')"))
    assert claim(conn, WORKER, kinds=["report"]) == [running]
    conn.execute("SELECT jobs.heartbeat(ARRAY[%s]::bigint[], %s)", (running, WORKER))
    conn.execute("SELECT jobs.run_now('nightly-report')")

    # every-minute: one running, the next occurrences skipped at its cap.
    for _ in range(3):
        conn.execute("SELECT jobs.run_now('every-minute')")
    conn.execute("UPDATE jobs.runs SET origin = 'schedule' WHERE kind = 'tick'")
    assert len(claim(conn, "other-worker", batch=3, kinds=["tick"])) == 1
    assert claim(conn, "other-worker", batch=3, kinds=["tick"]) == [], "at its cap: skipped"
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE failure_reason = 'Skipped'") == 2

    # Ad-hoc work: queued for ten minutes, scheduled for later, a silent run, a cancelled one.
    for _ in range(3):
        enqueue(conn, "send-email", run_at="now() - interval '10 minutes'")
    enqueue(conn, "send-email", run_at="now() + interval '1 hour'")
    enqueue(conn, "nobody-runs-this", run_at="now() - interval '30 minutes'")
    silent = enqueue(conn, "send-email", run_at="now() - interval '20 minutes'")
    stale = enqueue(conn, "send-email", run_at="now() - interval '20 minutes'")
    got = claim(conn, WORKER, batch=2, kinds=["send-email"])
    assert sorted(got) == sorted([silent, stale]), got
    conn.execute(
        "UPDATE jobs.runs SET started_at = now() - interval '10 minutes',"
        " heartbeat_at = CASE WHEN id = %s THEN now() - interval '50 seconds' END WHERE id IN (%s, %s)",
        (stale, silent, stale),
    )
    conn.execute("SELECT jobs.cancel(%s)", (stale,))
    conn.execute("SELECT jobs.cancel(%s)", (enqueue(conn, "send-email"),))

    # History: old and recent outcomes, a run the reaper took, a lease that keeps skipping.
    finish_old(conn, 50, age="20 days", kind="send-email")
    finish_old(conn, 10, age="2 hours", kind="send-email")
    finish_old(conn, 5, age="10 minutes", kind="send-email", status="FAILED")
    conn.execute(
        "UPDATE jobs.runs SET failure_reason = 'HeartbeatLost' WHERE id IN"
        " (SELECT id FROM jobs.runs WHERE status = 'FAILED' AND kind = 'send-email' ORDER BY id LIMIT 2)"
    )
    conn.execute("SELECT jobs.acquire_lease('nightly-backup', 'host-a', '1 hour')")
    for _ in range(3):
        conn.execute("SELECT jobs.acquire_lease('nightly-backup', 'host-b', '1 hour')")
    # The worker logins the scope snippet names. Roles belong to the server: test sessions
    # sharing one may create them at the same moment, and they stay for the next session.
    for role in ("mail_worker", "report_worker"):
        conn.execute(
            f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation"
            " THEN NULL; END $$"
        )
    conn.execute("ANALYZE jobs.runs")
    return failed


@pytest.fixture(scope="module")
def seeded(pg: Server) -> Iterator[tuple[Server, Database, int]]:
    template = pg.create_database()
    try:
        with template.connect() as conn:
            run_id = seed(conn)
        yield pg, template, run_id
    finally:
        pg.drop_database(template)


def test_the_runbook_has_its_snippets() -> None:
    assert len(SNIPPETS) >= 30, f"found only {len(SNIPPETS)} sql blocks in {RUNBOOK}"
    text = "\n".join(SNIPPETS)
    for call in (
        "jobs.running",
        "jobs.queue_stats",
        "jobs.definition_health",
        "jobs.leader",
        "jobs.pause(",
        "jobs.resume(",
        "jobs.cancel(",
        "jobs.cancel_queued(",
        "jobs.retry(",
        "jobs.prune(",
        "jobs.reap_worker(",
        "reloptions",
        "pg_stat_user_tables",
        "consecutive_skips",
        "oldest_queued_age",
        "HeartbeatLost",
        "jobs.scope_worker(",
        "jobs.worker_scope_list",
    ):
        assert call in text, f"the runbook has no snippet using {call}"


def _label(i: int, snippet: str) -> str:
    """'07-jobs.pause' : the snippet's number and the first jobs./pg_ object it names."""
    found = re.search(r"\b(jobs\.\w+|pg_\w+)", snippet)
    return f"{i:02d}-{found.group(1) if found else 'sql'}"


def _run_snippet(db: Database, snippet: str, run_id: int, tmp_path: Path, *options: str) -> str:
    """Run a snippet through psql as the runbook says (its variables set); returns stdout."""
    script = tmp_path / "snippet.sql"
    script.write_text(snippet)
    proc = subprocess.run(
        [
            psql_binary(),
            *("-X", "-v", "ON_ERROR_STOP=1", "-d", db.dsn, *options),
            *("-v", f"run_id={run_id}", "-v", f"name={NAME}", "-v", f"worker={WORKER}"),
            *("-f", str(script)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, (
        f"runbook snippet failed (exit {proc.returncode}):\n{snippet}\n--- stderr:\n{proc.stderr}"
    )
    return proc.stdout


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[_label(i, s) for i, s in enumerate(SNIPPETS)])
def test_runbook_snippet_runs(seeded: tuple[Server, Database, int], snippet: str, tmp_path: Path) -> None:
    pg, template, run_id = seeded
    db = pg.create_database(template=template.name)
    try:
        with db.connect() as leader:
            assert scalar(leader, "SELECT jobs.try_lead('runbook-leader')") is True
            _run_snippet(db, snippet, run_id, tmp_path)
    finally:
        pg.drop_database(db)


def _snippet_with(text: str) -> str:
    found = [s for s in SNIPPETS if text in s]
    assert len(found) == 1, f"{len(found)} snippets of the runbook hold {text!r}"
    return str(found[0])


@pytest.mark.parametrize(
    "marker",
    [
        "WITH RECURSIVE back",  # one run and the chain of its attempts
        "left(r.error, 80)",  # the latest failures
        "(jobs.retry(r.id)).id",  # retry every failure of a definition from the last day
    ],
)
def test_runbook_snippets_about_a_past_run_find_it_after_it_moved_to_history(
    seeded: tuple[Server, Database, int], marker: str, tmp_path: Path
) -> None:
    """With archive_after at its shortest (an hour), the failed :run_id of three hours ago is
    in jobs.run_history: a snippet that lists it, follows its chain or retries it must still
    see it."""
    pg, template, run_id = seeded
    db = pg.create_database(template=template.name)
    try:
        with db.connect() as conn:
            conn.execute("UPDATE jobs.config SET archive_after = '1 hour'")
            conn.execute(
                "UPDATE jobs.runs SET finished_at = now() - interval '3 hours' WHERE id = %s", (run_id,)
            )
            assert scalar(conn, "SELECT jobs.archive()") > 0
            assert scalar(conn, "SELECT count(*) FROM jobs.run_history WHERE id = %s", (run_id,)) == 1
        out = _run_snippet(db, _snippet_with(marker), run_id, tmp_path, "-A", "-t")
        first_columns = [line.split("|")[0] for line in out.splitlines()]
        assert str(run_id) in first_columns, f"run {run_id} (moved to history) is not in the answer:\n{out}"
    finally:
        pg.drop_database(db)


def test_runbook_hands_on_the_runs_of_a_dead_worker_that_claimed_with_a_token(
    seeded: tuple[Server, Database, int], tmp_path: Path
) -> None:
    """A worker that claimed with a claim token (every Python worker, every worker that follows
    docs/other-languages.md) dies: the runbook's snippet for a machine that died for good must
    fail each of its runs, fence it and queue the retries, without the token the operator lacks."""
    pg, template, _ = seeded
    db = pg.create_database(template=template.name)
    token = "d" * 32
    try:
        with db.connect() as conn:
            conn.execute("SELECT jobs.set_retry_policy('resize', max_attempts => 2)")
            runs = [enqueue(conn, "resize") for _ in range(2)]
            got = conn.execute(
                "SELECT id FROM jobs.claim(2, 'dead-1', ARRAY['resize'], claim_token => %s)", (token,)
            ).fetchall()
            assert sorted(r[0] for r in got) == sorted(runs), got
        script = tmp_path / "snippet.sql"
        script.write_text(_snippet_with("jobs.reap_worker("))
        proc = subprocess.run(
            [
                psql_binary(),
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                db.dsn,
                "-A",
                "-t",
                "-v",
                "worker=dead-1",
                "-f",
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        with db.connect() as conn:
            for run in runs:
                row = conn.execute(
                    "SELECT status::text, failure_reason,"
                    " (SELECT n.status::text FROM jobs.runs AS n WHERE n.retry_of = r.id)"
                    " FROM jobs.runs AS r WHERE r.id = %s",
                    (run,),
                ).fetchone()
                assert row == ("FAILED", "HeartbeatLost", "QUEUED"), (
                    f"run {run} of the dead worker after the runbook's snippet: {row}\n{proc.stdout}"
                )
                assert (
                    scalar(conn, "SELECT jobs.complete(%s, 'dead-1', claim_token => %s)", (run, token))
                    is False
                ), f"run {run}: the dead worker, back, could still complete it"
    finally:
        pg.drop_database(db)
