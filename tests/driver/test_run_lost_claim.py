"""A claim that committed but whose answer never reached its worker (the connection broke
after the commit: a network cut, a server restart, a proxy timeout).

The runs it took are RUNNING for the worker, which does not know them. The worker hands
them back on its next connection (``jobs.hand_back_unheld``): same attempt, same
``scheduled_for``, at once; they then run exactly once, long before the reaper could fail
them as HeartbeatLost, and no attempt is spent on them (with ``max_attempts = 1`` a lost
claim would otherwise end them FAILED without ever running).

A completion or a failure whose answer is lost the same way is sent again, and the worker
reports the run COMPLETED or FAILED, not fenced.
"""

from __future__ import annotations

import pytest

from fixtures.processes import LossyProxy
from harness import APPS, FAST, Conn, Processes, enqueue, executions, wait_for


def test_runs_of_a_claim_whose_answer_was_lost_run_once_with_no_attempt_spent(
    procs: Processes, conn: Conn, lossy_proxy: LossyProxy
) -> None:
    # Queued before the worker starts: its first claim takes them all, and its answer is lost.
    ids = [
        enqueue(conn, "quick", max_attempts="1", heartbeat_timeout="interval '120 seconds'") for _ in range(5)
    ]
    before = conn.execute("SELECT id, attempt, scheduled_for, priority FROM jobs.runs ORDER BY id").fetchall()
    replica = procs.start(
        "replica", ["run", str(APPS / "work_app.py"), "--dsn", lossy_proxy.dsn, *FAST, "--grace", "5s"]
    )
    lost = lossy_proxy.lost()
    assert lost.startswith("lost jobs.claim answer:"), f"{lost!r}\n{replica.tail()}"

    def all_completed() -> bool:
        done = conn.execute(
            "SELECT count(*) FROM jobs.runs WHERE id = ANY (%s) AND status = 'COMPLETED'", (ids,)
        ).fetchone()
        return done == (len(ids),)

    # Long before the runs' heartbeat timeout (120 s): not the reaper's doing.
    try:
        wait_for("the runs of the lost claim to complete", all_completed, 60)
    except AssertionError as exc:
        state = conn.execute(
            "SELECT id, status::text, attempt, worker, failure_reason FROM jobs.runs ORDER BY id"
        ).fetchall()
        raise AssertionError(f"{exc}\nruns: {state}\n{replica.tail()}") from None
    replica.wait_log(r"handed back runs=\S+: claimed by a claim whose answer was lost")

    runs = conn.execute(
        "SELECT id, attempt, scheduled_for, priority, status::text, failure_reason, retry_of"
        " FROM jobs.runs ORDER BY id"
    ).fetchall()
    context = f"runs {runs}\n{replica.tail()}"
    # No attempt spent, no retry row, nothing failed; each run kept its place in the queue.
    assert [r[:4] for r in runs] == [tuple(b) for b in before], context
    assert [r[4:] for r in runs] == [("COMPLETED", None, None)] * len(ids), context
    # Each run's job code ran exactly once.
    ran = executions(conn, "run_id, attempt, outcome")
    assert sorted(ran) == [(run_id, 1, "returned") for run_id in ids], f"executions {ran}\n{context}"


@pytest.mark.parametrize("lossy_proxy", [3], indirect=True)
def test_with_claims_in_flight_on_several_connections_a_lost_claim_runs_every_run_once(
    procs: Processes, conn: Conn, lossy_proxy: LossyProxy
) -> None:
    """Extra claimers keep claims in flight on their own connections while claims come back
    full; the fourth claim that takes runs loses its answer. What the worker hands back is
    only what no claim of its own returned: every run runs exactly once, attempt 1."""
    payloads = "(SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, 200))"
    ids = [
        int(r[0])
        for r in conn.execute(
            f"SELECT id FROM jobs.enqueue_many('quick', {payloads},"
            " max_attempts => 1, heartbeat_timeout => interval '120 seconds')"
        ).fetchall()
    ]
    args = ["--concurrency", "10", "--batch", "5", "--claimers", "4", "--grace", "5s"]
    replica = procs.start(
        "replica", ["run", str(APPS / "work_app.py"), "--dsn", lossy_proxy.dsn, *FAST, *args]
    )
    lost = lossy_proxy.lost()
    assert lost.startswith("lost jobs.claim answer:"), f"{lost!r}\n{replica.tail()}"

    def all_completed() -> bool:
        return conn.execute("SELECT count(*) FROM jobs.runs WHERE status = 'COMPLETED'").fetchone() == (
            len(ids),
        )

    try:
        wait_for("every run to complete", all_completed, 90)
    except AssertionError as exc:
        state = conn.execute("SELECT status::text, count(*) FROM jobs.runs GROUP BY 1").fetchall()
        raise AssertionError(f"{exc}\nruns: {state}\n{replica.tail()}") from None
    replica.wait_log(r"handed back runs=\S+: claimed by a claim whose answer was lost")
    runs = conn.execute("SELECT count(*), max(attempt), count(retry_of) FROM jobs.runs").fetchone()
    assert runs == (len(ids), 1, 0), f"runs {runs}\n{replica.tail()}"
    ran = executions(conn, "run_id, attempt")
    twice = sorted({r for r in ran if ran.count(r) > 1})
    assert not twice and sorted(ran) == [(run_id, 1) for run_id in ids], f"executed twice: {twice}"


@pytest.mark.parametrize("lossy_proxy", [(0, "jobs.complete_many")], indirect=True)
def test_a_completion_whose_answer_was_lost_is_reported_completed_not_fenced(
    procs: Processes, conn: Conn, lossy_proxy: LossyProxy
) -> None:
    """The completion commits and its answer is lost; the worker sends it again on its next
    connection. The run was completed by this worker: the outcome is COMPLETED, once, not a
    fenced report (which says the run was reaped or taken by another worker)."""
    run_id = enqueue(conn, "quick")
    replica = procs.start("replica", ["run", str(APPS / "work_app.py"), "--dsn", lossy_proxy.dsn, *FAST])
    lost = lossy_proxy.lost()
    assert lost.startswith("lost jobs.complete_many answer:"), f"{lost!r}\n{replica.tail()}"
    line = replica.wait_log(rf"run={run_id} kind=quick \S+ status=(\S+)")
    assert line.group(1) == "COMPLETED", replica.tail()
    assert conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,)).fetchone() == (
        "COMPLETED",
    )


@pytest.mark.parametrize("lossy_proxy", [(0, "jobs.fail")], indirect=True)
def test_a_failure_whose_answer_was_lost_is_reported_failed_not_fenced(
    procs: Processes, conn: Conn, lossy_proxy: LossyProxy
) -> None:
    """The same for a failure: sent again, it is reported FAILED once, with no second
    failure recorded and no retry beyond the policy's."""
    run_id = enqueue(conn, "exits", '{"code": 3}', max_attempts="1")
    replica = procs.start("replica", ["run", str(APPS / "work_app.py"), "--dsn", lossy_proxy.dsn, *FAST])
    lost = lossy_proxy.lost()
    assert lost.startswith("lost jobs.fail answer:"), f"{lost!r}\n{replica.tail()}"
    line = replica.wait_log(rf"run={run_id} kind=exits \S+ status=(\S+)")
    assert line.group(1) == "FAILED", replica.tail()
    runs = conn.execute("SELECT id, status::text, failure_reason FROM jobs.runs").fetchall()
    assert runs == [(run_id, "FAILED", "Error")], runs
