"""docs/other-languages.md behind a transaction-mode pooler: a worker written from the page
alone, its calls sent through a real PgBouncer (tests/harness.py: PgBouncer) with bound
parameters and its driver's automatic prepared statements off, as the page says."""

from __future__ import annotations

import re
import secrets

import psycopg

from harness import ROOT, Conn, Database, PgBouncer, enqueue, rows, scalar

PAGE = ROOT / "docs" / "other-languages.md"


def pooler_advice() -> str:
    """The page's Practicalities bullet about transaction-mode poolers."""
    page = PAGE.read_text()
    bullets = re.findall(r"^- (.*?)(?=^- |^## |\Z)", page, flags=re.DOTALL | re.MULTILINE)
    found = [b for b in bullets if "transaction-mode pooler" in b]
    assert len(found) == 1, "docs/other-languages.md has one bullet about transaction-mode poolers"
    return " ".join(found[0].split())


def test_the_pooler_advice_says_how_each_client_turns_prepared_statements_off() -> None:
    """Drivers prepare statements on their own (pgx always, JDBC after 5 runs, psycopg after
    5): through PgBouncer before 1.21 those calls then fail. The page says so and names each
    client's switch, one that still binds the claim token as a parameter."""
    advice = pooler_advice()
    for needed in (
        "prepared statement",
        "26000",
        "42P05",
        "max_prepared_statements",
        "default_query_exec_mode=exec",
        "prepareThreshold=0",
        "prepare_threshold=None",
        "node-postgres",
    ):
        assert needed in advice, f"the pooler advice does not mention {needed!r}:\n{advice}"


def test_a_worker_behind_the_pooler_claims_beats_and_reports_every_run_once(
    db: Database, conn: Conn, pgbouncer: PgBouncer
) -> None:
    """Two workers, each on its own pooled connection with prepared statements off, run more
    calls than a driver needs to start preparing: every call answers, and each run ends once,
    completed or failed, by the worker that claimed it."""
    runs = [enqueue(conn, "pooled", f'{{"i": {i}}}') for i in range(24)]
    workers = {f"pooled-{n}": secrets.token_hex(16) for n in range(2)}
    pooled = {w: psycopg.connect(pgbouncer.dsn(db), autocommit=True, prepare_threshold=None) for w in workers}
    try:
        ended: dict[int, str] = {}
        for _ in range(len(runs)):
            for worker, token in workers.items():
                c = pooled[worker]
                claimed = c.execute(
                    "SELECT id, payload FROM jobs.claim(1, %s, ARRAY['pooled'], claim_token => %s)",
                    (worker, token),
                ).fetchall()
                for run_id, payload in claimed:
                    beat = c.execute(
                        "SELECT run_id, cancel_requested FROM jobs.heartbeat(%s, %s, claim_token => %s)",
                        ([run_id], worker, token),
                    ).fetchall()
                    assert beat == [(run_id, False)], f"run {run_id} not held by {worker}: {beat}"
                    if payload["i"] % 3 == 0:
                        failed = c.execute(
                            "SELECT (f).id, (f).status::text FROM jobs.fail(%s, %s, ARRAY['Boom'], 'boom',"
                            " claim_token => %s) AS f",
                            (run_id, worker, token),
                        ).fetchone()
                        assert failed == (run_id, "FAILED"), f"fail of run {run_id}: {failed}"
                    else:
                        done = c.execute(
                            "SELECT jobs.complete(%s, %s, '{}', claim_token => %s)", (run_id, worker, token)
                        ).fetchone()
                        assert done == (True,), f"complete of run {run_id}: {done}"
                    assert run_id not in ended, f"run {run_id} claimed twice"
                    ended[run_id] = worker
        assert sorted(ended) == runs, f"runs never claimed: {sorted(set(runs) - set(ended))}"
        assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE status NOT IN ('COMPLETED', 'FAILED')") == 0
        by_worker = rows(conn, "SELECT worker, count(*) AS n FROM jobs.runs GROUP BY worker ORDER BY worker")
        assert {r["worker"] for r in by_worker} == set(workers), by_worker
    finally:
        for c in pooled.values():
            c.close()
