"""Any language is a worker: the whole protocol driven through the psql binary alone.

No Python driver code and no psycopg here: every step is a separate psql
process, exactly what a shell script worker would run.
"""

from __future__ import annotations

from harness import Database


def test_psql_worker_enqueue_claim_heartbeat_complete(db: Database) -> None:
    run_id = db.psql("SELECT id FROM jobs.enqueue('shell', '{\"file\": \"a.csv\"}')")
    assert run_id.isdigit(), run_id
    claimed = db.psql("SELECT id, kind, payload->>'file' FROM jobs.claim(1, 'sh-1')")
    assert claimed == f"{run_id}|shell|a.csv"
    beat = db.psql(f"SELECT run_id, cancel_requested FROM jobs.heartbeat('{{{run_id}}}', 'sh-1')")
    assert beat == f"{run_id}|f"
    assert db.psql(f"SELECT jobs.complete({run_id}, 'sh-1', '{{\"rows\": 3}}')") == "t"
    status = db.psql(f"SELECT status, worker, result->>'rows' FROM jobs.runs WHERE id = {run_id}")
    assert status == "COMPLETED|sh-1|3"
    # Sent again (its answer lost): acknowledged, and nothing changes; another worker is fenced.
    assert db.psql(f"SELECT jobs.complete({run_id}, 'sh-1', '{{\"rows\": 4}}')") == "t"
    assert db.psql(f"SELECT jobs.complete({run_id}, 'sh-2')") == "f", "another worker is fenced"
    assert db.psql(f"SELECT status, worker, result->>'rows' FROM jobs.runs WHERE id = {run_id}") == status


def test_psql_worker_enqueue_claim_fail(db: Database) -> None:
    db.psql("SELECT 1 FROM jobs.set_retry_policy('shell', max_attempts => 2)")
    run_id = db.psql("SELECT id FROM jobs.enqueue('shell')")
    assert db.psql("SELECT id FROM jobs.claim(1, 'sh-1')") == run_id
    retry = db.psql(
        f"SELECT status, attempt, retry_of FROM jobs.fail({run_id}, 'sh-1', "
        "ARRAY['CalledProcessError', 'Exception'], 'exit status 2')"
    )
    assert retry == f"QUEUED|2|{run_id}"
    failed = db.psql(f"SELECT status, failure_reason, error FROM jobs.runs WHERE id = {run_id}")
    assert failed == "FAILED|Error|exit status 2"


def test_psql_sees_clear_errors_and_nothing_changes(db: Database) -> None:
    before = db.psql("SELECT count(*), count(*) FILTER (WHERE status = 'QUEUED') FROM jobs.runs")
    out = db.psql("SELECT jobs.claim(0)", check=False)
    assert "ERROR" in out and "batch_size must be between 1 and 1000, got 0" in out, out
    out = db.psql("SELECT jobs.enqueue('k', '[1, 2]')", check=False)
    assert "payload must be a JSON object, got array" in out, out
    assert db.psql("SELECT count(*), count(*) FILTER (WHERE status = 'QUEUED') FROM jobs.runs") == (before)
