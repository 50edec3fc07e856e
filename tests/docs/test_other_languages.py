"""examples/worker.sh, the bash + psql worker of docs/other-languages.md, against real runs:
results, retries by policy, cancellation through the heartbeat answer, draining on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fixtures.processes import LossyProxy
from harness import ROOT, Conn, Database, enqueue, one, psql_binary, rows, run_row, scalar, wait_for

WORKER_SH = ROOT / "examples" / "worker.sh"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass
class ShellWorker:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        assert self.alive(), f"worker.sh exited {self.proc.returncode}:\n{self.log()[-3000:]}"

    def wait_until(self, what: str, fn: Callable[[], object], timeout: float = 10) -> None:
        """Poll ``fn`` until truthy; fail at once, with the log, if the worker exits meanwhile."""

        def probe() -> bool:
            self.check_alive()
            return bool(fn())

        wait_for(what, probe, timeout)

    def wait_log(self, text: str, timeout: float = 10) -> None:
        self.wait_until(f"worker.sh to log {text!r}", lambda: text in self.log(), timeout)

    def terminate_and_wait(self, timeout: float = 15) -> int:
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker.sh still running {timeout}s after SIGTERM:\n{self.log()}") from None

    def group_is_gone(self) -> bool:
        """True when no process of the worker's process group is left (heartbeat loop, job, sleep)."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        return False


@pytest.fixture
def start_worker(db: Database, tmp_path: Path) -> Iterator[Any]:
    started: list[ShellWorker] = []

    def start(
        grace: float = 10,
        label: str = "worker",
        dsn: str | None = None,
        script: Path = WORKER_SH,
        queue: str = "",
        report_tries: int = 60,
    ) -> ShellWorker:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
        env.update(
            PGTICK_DSN=dsn or db.dsn,
            PGTICK_POLL="0.1",
            PGTICK_HEARTBEAT="0.2",
            PGTICK_GRACE=str(grace),
            PGTICK_QUEUE=queue,
            PGTICK_REPORT_TRIES=str(report_tries),
            PSQL=psql_binary(),
        )
        log = tmp_path / f"{label}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                ["bash", str(script)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                cwd=ROOT,
                start_new_session=True,  # its own process group: the test can see leftovers
            )
        worker = ShellWorker(proc, log)
        started.append(worker)
        worker.wait_log("started kinds=" if script != WORKER_SH else "started kinds=greet nap shaky")
        return worker

    try:
        yield start
    finally:
        for worker in started:
            try:
                os.killpg(worker.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            worker.proc.wait(10)


def wait_terminal(conn: Conn, worker: ShellWorker, kinds: list[str], timeout: float = 30) -> None:
    def settled() -> bool:
        worker.check_alive()
        return bool(
            scalar(
                conn,
                "SELECT count(*) = 0 FROM jobs.runs"
                " WHERE kind = ANY (%s) AND status IN ('QUEUED', 'RUNNING')",
                (kinds,),
            )
        )

    wait_for(f"every {kinds} run to finish", settled, timeout)


def attempts(conn: Conn, first: int) -> list[dict[str, Any]]:
    """The chain of attempts that starts at run ``first``."""
    return rows(
        conn,
        """
        WITH RECURSIVE chain AS (
            SELECT * FROM jobs.runs WHERE id = %s
            UNION ALL
            SELECT r.* FROM jobs.runs AS r JOIN chain AS c ON r.retry_of = c.id
        )
        SELECT id, attempt, retry_of, status::text AS status, failure_reason, error, result, worker
          FROM chain ORDER BY attempt
        """,
        (first,),
    )


def test_worker_sh_processes_runs_with_results_and_retries(conn: Conn, start_worker: Any) -> None:
    # Retry policies live in the database, per kind; the worker only names the error class.
    conn.execute(
        "SELECT jobs.set_retry_policy('shaky', allow => '{Unavailable}', max_attempts => 3,"
        " backoff_initial => '0.1 seconds', jitter => 0)"
    )
    conn.execute(
        "SELECT jobs.set_retry_policy('greet', deny => '{BadInput}', max_attempts => 3,"
        " backoff_initial => '0.1 seconds', jitter => 0)"
    )
    name = 'Ada "Countess"\tof Lovelace \\ o/'
    greet = enqueue(conn, "greet", payload=json.dumps({"name": name}))
    recovers = enqueue(conn, "shaky", payload='{"fail_times": 1}')
    gives_up = enqueue(conn, "shaky", payload='{"fail_times": 5}')
    bad_input = enqueue(conn, "greet", payload="{}")
    foreign = enqueue(conn, "python-only")

    worker = start_worker()
    wait_terminal(conn, worker, ["greet", "shaky"])

    done = run_row(conn, greet)
    assert (done["status"], done["result"]) == ("COMPLETED", {"greeting": f"hello {name}"})
    assert done["worker"].startswith("bash-") and done["attempt"] == 1

    chain = attempts(conn, recovers)
    assert [(a["attempt"], a["status"]) for a in chain] == [(1, "FAILED"), (2, "COMPLETED")]
    assert (chain[0]["failure_reason"], chain[0]["error"]) == ("Error", "upstream unavailable on attempt 1")
    assert chain[1]["retry_of"] == recovers and chain[1]["result"] == {"attempt": 2}

    chain = attempts(conn, gives_up)
    assert [(a["attempt"], a["status"]) for a in chain] == [(1, "FAILED"), (2, "FAILED"), (3, "FAILED")], (
        "max_attempts 3: no fourth attempt"
    )

    chain = attempts(conn, bad_input)
    assert [(a["attempt"], a["status"]) for a in chain] == [(1, "FAILED")], "deny wins: no retry"
    assert chain[0]["error"] == 'the payload needs a "name"'

    assert run_row(conn, foreign)["status"] == "QUEUED", "a kind the worker lacks is never claimed"

    # Idle, a SIGTERM stops it at once, cleanly, with nothing left behind.
    assert worker.terminate_and_wait() == 0, worker.log()
    wait_for("the worker's process group to be gone", worker.group_is_gone, timeout=60)
    assert "stopped" in worker.log()


def _long_run_heartbeating(conn: Conn, worker: Any, timeout: float) -> int:
    """A run of ten minutes' naps, once the worker has it RUNNING and heartbeating."""
    long_run = enqueue(conn, "nap", payload='{"steps": 600}')
    worker.wait_until(
        "the long run to be RUNNING with a heartbeat",
        lambda: scalar(conn, "SELECT heartbeat_at IS NOT NULL FROM jobs.runs WHERE id = %s", (long_run,)),
        timeout=timeout,
    )
    return long_run


def _job_under_way(conn: Conn, worker: Any, run_id: int) -> None:
    """Wait until the run's job is under way: beaten twice. worker.sh sends the first beat as it
    starts the job and ignores SIGTERM while it forks it (so that the job inherits the ignore);
    a beat later its main loop waits on the job and a signal reaches it. A signal sent as soon
    as the run is RUNNING can fall in that fork and be lost."""
    worker.wait_until(
        "the run's first heartbeat",
        lambda: scalar(conn, "SELECT heartbeat_at IS NOT NULL FROM jobs.runs WHERE id = %s", (run_id,)),
        timeout=60,
    )
    first = scalar(conn, "SELECT heartbeat_at FROM jobs.runs WHERE id = %s", (run_id,))
    worker.wait_until(
        "the run's next heartbeat",
        lambda: scalar(conn, "SELECT heartbeat_at > %s FROM jobs.runs WHERE id = %s", (first, run_id)),
        timeout=60,
    )


def _cancel_at_a_checkpoint(conn: Conn, worker: Any, run_id: int, timeout: float) -> None:
    """jobs.cancel the RUNNING run; the worker hears it in a heartbeat answer and stops the job."""
    assert scalar(conn, "SELECT jobs.cancel(%s)::text", (run_id,)) == "RUNNING"
    worker.wait_until(
        "the run to be cancelled at a checkpoint",
        lambda: run_row(conn, run_id)["status"] == "CANCELLED",
        timeout=timeout,
    )


def test_worker_sh_heartbeats_and_is_cancelled_through_the_heartbeat_answer(
    conn: Conn, start_worker: Any
) -> None:
    worker = start_worker()
    long_run = _long_run_heartbeating(conn, worker, timeout=60)
    running = one(conn, "SELECT * FROM jobs.running WHERE id = %s", (long_run,))
    assert running["heartbeat_age"] is not None and running["worker"].startswith("bash-")

    _cancel_at_a_checkpoint(conn, worker, long_run, timeout=60)
    assert run_row(conn, long_run)["error"] == "cancelled at a checkpoint"

    # The worker goes on working after a cancellation.
    after = enqueue(conn, "greet", payload='{"name": "again"}')
    worker.wait_until("the next run", lambda: run_row(conn, after)["status"] == "COMPLETED", timeout=60)
    assert worker.terminate_and_wait() == 0


def test_worker_sh_heartbeats_its_run_while_the_worker_registry_is_locked(
    conn: Conn, db: Database, start_worker: Any
) -> None:
    """A lock on jobs.worker_registry (a migration) does not hold up the heartbeats of the run:
    jobs.worker_seen waits for it at most a second, and the next beat comes on time."""
    worker = start_worker()
    long_run = _long_run_heartbeating(conn, worker, timeout=60)
    with db.connect(autocommit=False) as locker:
        locker.execute("LOCK TABLE jobs.worker_registry IN ACCESS EXCLUSIVE MODE")
        locked = scalar(locker, "SELECT clock_timestamp()")
        worker.wait_until(
            "a heartbeat of the run well after the registry was locked",
            lambda: scalar(
                conn,
                "SELECT heartbeat_at > %s + interval '3 seconds' FROM jobs.runs WHERE id = %s",
                (locked, long_run),
            ),
            timeout=60,
        )
        locker.commit()
    _cancel_at_a_checkpoint(conn, worker, long_run, timeout=60)
    assert worker.terminate_and_wait() == 0


def test_worker_sh_as_a_worker_login_holds_runs_that_its_worker_id_alone_cannot_touch(
    db: Database, conn: Conn, start_worker: Any
) -> None:
    """Logged in with jobs_worker only, the bash worker claims with its claim token: a caller
    that presents its worker id (shown in jobs.running) without the token completes nothing,
    while the worker's own heartbeats, cancellation and completion go through."""
    with db.worker_login("bash") as login:
        worker = start_worker(dsn=db.dsn_as(login))
        long_run = _long_run_heartbeating(conn, worker, timeout=15)
        shown = scalar(conn, "SELECT worker FROM jobs.running WHERE id = %s", (long_run,))
        forged = scalar(conn, """SELECT jobs.complete(%s, %s, '{"forged": true}')""", (long_run, shown))
        row = run_row(conn, long_run)
        assert forged is False and row["status"] == "RUNNING", f"completed with the worker id alone: {row}"
        assert row["claim_token_hash"] is not None, "worker.sh claimed without a token"

        _cancel_at_a_checkpoint(conn, worker, long_run, timeout=10)
        after = enqueue(conn, "greet", payload='{"name": "Ada"}')
        worker.wait_until("the next run", lambda: run_row(conn, after)["status"] == "COMPLETED", timeout=10)
        assert run_row(conn, after)["result"] == {"greeting": "hello Ada"}
        assert worker.terminate_and_wait() == 0, worker.log()
    assert "permission denied" not in worker.log(), worker.log()


def test_worker_sh_registers_itself_and_its_kinds_and_stops_as_stopped(
    db: Database, conn: Conn, start_worker: Any
) -> None:
    """Logged in with jobs_worker only, the bash worker is in jobs.workers (`pgtick workers`),
    alive, with its kinds, which join jobs.known_kinds (so `pgtick status` does not report them
    as kinds no worker ever registered); it stays alive by its beats, and a clean stop shows
    as stopped, not lost."""
    with db.worker_login("bash") as login:
        worker = start_worker(dsn=db.dsn_as(login))
        row = one(conn, "SELECT worker, state, kinds, pid, last_seen_at, queues FROM jobs.workers")
        assert (row["state"], row["kinds"], row["pid"], row["queues"]) == (
            "alive",
            ["greet", "nap", "shaky"],
            worker.proc.pid,
            None,  # every queue
        ), row
        assert row["worker"].startswith("bash-"), row
        known = {r["kind"] for r in rows(conn, "SELECT kind FROM jobs.known_kinds")}
        assert {"greet", "nap", "shaky"} <= known, known
        worker.wait_until(
            "the worker to be seen again on its heartbeat cadence",
            lambda: scalar(conn, "SELECT last_seen_at FROM jobs.workers") > row["last_seen_at"],
        )
        assert worker.terminate_and_wait() == 0, worker.log()
    assert scalar(conn, "SELECT state FROM jobs.workers") == "stopped", worker.log()
    assert "cannot register" not in worker.log(), worker.log()


def test_worker_sh_of_one_queue_registers_it_and_leaves_the_others_to_show_unserved(
    conn: Conn, start_worker: Any
) -> None:
    """PGTICK_QUEUE: the bash worker claims from that queue only and registers it, so a run of
    its kind in another queue shows in jobs.kinds_without_worker while the one in its queue
    completes."""
    inside = enqueue(conn, "greet", payload='{"name": "in"}', queue="'images'")
    outside = enqueue(conn, "greet", payload='{"name": "out"}', queue="'mail'")
    worker = start_worker(queue="images")
    worker.wait_until(
        "the run of its queue to complete", lambda: run_row(conn, inside)["status"] == "COMPLETED", 60
    )
    assert one(conn, "SELECT queues FROM jobs.workers") == {"queues": ["images"]}
    unserved = rows(conn, "SELECT kind, queued, queues FROM jobs.kinds_without_worker")
    assert unserved == [{"kind": "greet", "queued": 1, "queues": ["mail"]}], unserved
    assert run_row(conn, outside)["status"] == "QUEUED"
    assert worker.terminate_and_wait() == 0, worker.log()


def test_worker_sh_drains_the_running_job_on_sigterm(conn: Conn, start_worker: Any) -> None:
    worker = start_worker(grace=20)
    draining = enqueue(conn, "nap", payload='{"steps": 30}')  # 3 s of work
    _job_under_way(conn, worker, draining)
    began = time.monotonic()
    # As systemd stops a service: SIGTERM to every process of the group, the job's included.
    os.killpg(worker.proc.pid, signal.SIGTERM)
    worker.wait_log("stopping: run=")
    late = enqueue(conn, "greet", payload='{"name": "too late"}')
    assert worker.proc.wait(15) == 0, worker.log()
    assert time.monotonic() - began < 10
    row = run_row(conn, draining)
    assert (row["status"], row["result"]) == ("COMPLETED", {"steps": 30}), "finished within the grace"
    assert run_row(conn, late)["status"] == "QUEUED", "nothing is claimed after SIGTERM"
    wait_for("the worker's process group to be gone", worker.group_is_gone, timeout=60)


def test_worker_sh_leaves_a_job_past_its_grace_to_the_reaper(conn: Conn, start_worker: Any) -> None:
    worker = start_worker(grace=1)
    stuck = enqueue(conn, "nap", payload='{"steps": 600}')
    _job_under_way(conn, worker, stuck)
    assert worker.terminate_and_wait(timeout=10) == 0, worker.log()
    assert "grace over; leaving run=" in worker.log()
    wait_for("the worker's process group to be gone", worker.group_is_gone, timeout=60)
    assert run_row(conn, stuck)["status"] == "RUNNING", "not reported: the reaper hands it on"

    # Its last heartbeat ages past the heartbeat timeout (a minute).
    conn.execute("UPDATE jobs.runs SET heartbeat_at = now() - interval '2 minutes' WHERE id = %s", (stuck,))
    reaped = rows(conn, "SELECT * FROM jobs.reap()")
    assert [(r["run_id"], r["reason"]) for r in reaped] == [(stuck, "HeartbeatLost")]


def test_other_languages_sql_snippets_run(db: Database, conn: Conn, tmp_path: Path) -> None:
    """The ```sql blocks of docs/other-languages.md run, in order, with the bash worker's
    variables and claim token set (a RUNNING run for the fail call)."""
    doc = (ROOT / "docs" / "other-languages.md").read_text()
    snippets = re.findall(r"^```sql\n(.*?)^```", doc, flags=re.DOTALL | re.MULTILINE)
    assert len(snippets) >= 2
    run_id = enqueue(conn, "resize")
    token = "doc-snippet-claim-token"
    claimed = scalar(conn, "SELECT id FROM jobs.claim(1, 'w', '{resize}', claim_token => %s)", (token,))
    assert claimed == run_id
    for i, snippet in enumerate(snippets):
        script = tmp_path / f"snippet{i}.sql"
        script.write_text(snippet.rstrip().rstrip(";") + ";\n")
        variables = {"run_id": run_id, "worker": "w", "class": "IOException", "message": "boom"}
        args = [psql_binary(), "-X", "-v", "ON_ERROR_STOP=1", "-d", db.dsn, "-f", str(script)]
        for name, value in variables.items():
            args += ["-v", f"{name}={value}"]
        env = dict(os.environ, PGOPTIONS=f"-c pgtick.claim_token={token}")
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0 and "ERROR" not in proc.stderr, f"{snippet}\n{proc.stderr}"
    policy = one(conn, "SELECT allow, deny, max_attempts FROM jobs.retry_policies WHERE kind = 'resize'")
    assert policy == {
        "allow": ["IOException", "Unavailable"],
        "deny": ["IllegalArgumentException"],
        "max_attempts": 5,
    }
    retry = one(conn, "SELECT attempt, status::text AS status FROM jobs.runs WHERE retry_of = %s", (run_id,))
    assert retry == {"attempt": 2, "status": "QUEUED"}, "IOException is allowed: a retry was queued"


def test_the_walkthrough_kinds_are_not_the_example_apps() -> None:
    """The walkthrough runs worker.sh on the database `pgtick dsn` names, where the quickstart's
    example app may be running: a kind both serve would go to either worker, and the
    walkthrough's retry policy for it would replace the app's."""
    from pgtick.runner import load_app

    shell_kinds = set(re.findall(r"^job_([\w-]+)\(\)", WORKER_SH.read_text(), flags=re.MULTILINE))
    app_kinds = set(load_app(str(ROOT / "examples" / "app.py")).jobs)
    assert shell_kinds and app_kinds
    assert not shell_kinds & app_kinds, f"kinds served by both examples: {sorted(shell_kinds & app_kinds)}"
    walkthrough = (ROOT / "docs" / "other-languages.md").read_text()
    for kind in re.findall(r"jobs\.(?:enqueue|set_retry_policy)\('([\w-]+)'", walkthrough):
        assert kind not in app_kinds, f"docs/other-languages.md uses the example app's kind {kind!r}"
    assert f"started kinds={' '.join(sorted(shell_kinds))}" in walkthrough


def test_worker_sh_hands_back_the_run_of_a_claim_whose_answer_was_lost(
    conn: Conn, start_worker: Any, lossy_proxy: LossyProxy
) -> None:
    """The claim commits and its answer never reaches psql (the proxy cuts the connection
    after the commit): the worker hands the run back before it claims again, and then runs
    it once, no attempt spent, long before the reaper could take it (its heartbeat timeout
    is two minutes)."""
    run_id = enqueue(
        conn,
        "greet",
        payload='{"name": "lost"}',
        max_attempts="1",
        heartbeat_timeout="interval '120 seconds'",
    )
    worker = start_worker(dsn=lossy_proxy.dsn)
    assert lossy_proxy.lost().startswith("lost jobs.claim answer:"), worker.log()
    worker.wait_until("the run to complete", lambda: run_row(conn, run_id)["status"] == "COMPLETED", 60)
    assert f"handed back runs of the failed claim: {run_id}=QUEUED" in worker.log(), worker.log()
    chain = attempts(conn, run_id)
    assert [(r["id"], r["attempt"], r["status"]) for r in chain] == [(run_id, 1, "COMPLETED")], chain
    assert chain[0]["result"] == {"greeting": "hello lost"}
    assert worker.terminate_and_wait() == 0, worker.log()


def test_worker_sh_records_a_failure_whose_error_text_is_not_utf8(
    conn: Conn, start_worker: Any, tmp_path: Path
) -> None:
    """A job of one's own whose last line on stderr is not UTF-8 (a tool printing bytes of
    another encoding): the database refuses that text, and the failure is recorded all the
    same, saying why, once, by policy; not left RUNNING for the reaper to call it lost."""
    script = tmp_path / "worker.sh"
    kind = "job_garbled() { printf 'output in Latin-1: caf\\xe9\\n' >&2; exit 1; }\n"
    text = WORKER_SH.read_text()
    mark = "# greet {"
    script.write_text(text.replace(mark, kind + mark, 1))
    conn.execute("SELECT jobs.set_retry_policy('garbled', max_attempts => 1)")
    run_id = enqueue(conn, "garbled", max_attempts="1")
    worker = start_worker(script=script)
    worker.wait_until("the run to fail", lambda: run_row(conn, run_id)["status"] == "FAILED", 120)
    row = run_row(conn, run_id)
    assert row["failure_reason"] == "Error", row
    assert "could not be stored" in row["error"], row
    assert [(r["id"], r["status"]) for r in attempts(conn, run_id)] == [(run_id, "FAILED")]
    # The worker logs the failure once jobs.fail has answered, after its commit made it visible.
    worker.wait_log(f"run={run_id} failed class=ShellError", 60)
    assert worker.terminate_and_wait() == 0, worker.log()


def _script_with_job(tmp_path: Path, job: str) -> Path:
    """worker.sh with one more job function, defined before its own kinds."""
    script = tmp_path / "worker.sh"
    text = WORKER_SH.read_text()
    mark = "# greet {"
    script.write_text(text.replace(mark, job + mark, 1))
    return script


def test_worker_sh_fails_a_run_whose_result_is_not_json_as_invalid_result(
    conn: Conn, start_worker: Any, tmp_path: Path
) -> None:
    """Jobs that succeed but print something other than JSON (prose, or JSON whose text is not
    UTF-8, which psql cannot even quote): jobs.complete refuses the result, and the run is
    failed as InvalidResult, once, by policy."""
    jobs = "job_prose() { printf 'all done\\n'; }\njob_latin() { printf '{\"word\": \"caf\\xe9\"}\\n'; }\n"
    script = _script_with_job(tmp_path, jobs)
    runs = [enqueue(conn, kind, max_attempts="1") for kind in ("prose", "latin")]
    worker = start_worker(script=script)
    for run_id in runs:

        def failed(run_id: int = run_id) -> bool:
            return bool(run_row(conn, run_id)["status"] == "FAILED")

        worker.wait_until(f"run {run_id} to fail", failed, 120)
        row = run_row(conn, run_id)
        assert row["failure_reason"] == "Error", row
        assert row["error"] == "the job printed a result that is not a JSON document", row
        worker.wait_log(f"run={run_id} failed class=InvalidResult", 60)
    assert worker.terminate_and_wait() == 0, worker.log()


def _report_under_a_row_lock(
    db: Database, conn: Conn, start_worker: Any, tmp_path: Path, outcome: str
) -> tuple[int, str]:
    """Run a job that ends with ``outcome`` (bash) while an operator's transaction holds its
    run's row and the worker's sessions have a lock timeout: its report errs with 55P03.
    Returns the run id and the worker's log once it gave up reporting."""
    gate = tmp_path / "open"
    job = f"job_gated() {{ while [[ ! -e {gate} ]]; do sleep 0.05; done; {outcome}; }}\n"
    script = _script_with_job(tmp_path, job)
    # The worker's sessions from now on (each of its calls is a psql of its own).
    conn.execute(sql.SQL("ALTER DATABASE {} SET lock_timeout = '200ms'").format(sql.Identifier(db.name)))
    run_id = enqueue(conn, "gated")
    worker = start_worker(script=script)
    worker.wait_until("the run to be RUNNING", lambda: run_row(conn, run_id)["status"] == "RUNNING", 60)
    with db.connect(autocommit=False) as operator:
        operator.execute("SELECT FROM jobs.runs WHERE id = %s FOR UPDATE", (run_id,))
        gate.touch()
        worker.wait_log(f"run={run_id} outcome not reported", 60)
        log = worker.log()
        operator.rollback()
    assert "55P03" in log, "the lock timeout is in the log, for whoever looks into it"
    row = run_row(conn, run_id)
    assert (row["status"], row["failure_reason"]) == ("RUNNING", None), row
    assert worker.terminate_and_wait() == 0, worker.log()
    return run_id, log


def test_worker_sh_does_not_fail_a_succeeded_job_whose_completion_errs_for_another_reason(
    db: Database, conn: Conn, start_worker: Any, tmp_path: Path
) -> None:
    """A job that succeeded with a valid result, whose jobs.complete errs for a reason that is
    not the result (a lock timeout: an operator's transaction holds the run's row): the worker
    must not record the success as a failure (InvalidResult), which its policy could retry
    and run the job again. It leaves the run unreported, as for a database it cannot reach,
    and the reaper hands it on."""
    _, log = _report_under_a_row_lock(db, conn, start_worker, tmp_path, "printf '{\"ok\": true}\\n'")
    assert "InvalidResult" not in log and "could not be stored" not in log, log


def test_worker_sh_does_not_change_the_class_of_a_failure_whose_report_errs_for_another_reason(
    db: Database, conn: Conn, start_worker: Any, tmp_path: Path
) -> None:
    """A job that failed with a class its policy denies (BadInput), whose jobs.fail errs for a
    reason that is not its class or message (a lock timeout): the worker must not report it
    again as ShellError, a class the policy may retry. It leaves the run unreported."""
    conn.execute("SELECT jobs.set_retry_policy('gated', deny => '{BadInput}', max_attempts => 3)")
    outcome = "raise BadInput 'the payload is wrong'"
    _, log = _report_under_a_row_lock(db, conn, start_worker, tmp_path, outcome)
    assert "could not be stored" not in log, log


class _Cable:
    """A TCP forwarder to the test's database that can be unplugged: then every connection
    through it is cut and new ones are refused, as in a network outage."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self.host = str(params.get("host") or "localhost")
        self.port = int(params.get("port") or 5432)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.dsn = make_conninfo(
            dsn, host="127.0.0.1", port=str(self.listener.getsockname()[1]), sslmode="disable",
            gssencmode="disable",
        )  # fmt: skip
        self.plugged = True
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _upstream(self) -> socket.socket:
        if self.host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(os.path.join(self.host, f".s.PGSQL.{self.port}"))
            return sock
        return socket.create_connection((self.host, self.port))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.plugged:
                client.close()
                continue
            server = self._upstream()
            self.socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for sock in (a, b):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def unplug(self) -> None:
        self.plugged = False
        for sock in self.socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.socks = []

    def close(self) -> None:
        self.unplug()
        self.listener.close()


def test_worker_sh_does_not_hand_back_a_run_whose_outcome_it_could_not_report(
    db: Database, conn: Conn, start_worker: Any
) -> None:
    """The database is out of reach from the moment a job ends until after the worker has
    given up reporting it (five tries a second apart) and a claim has failed. When it is back, the
    worker hands back what that claim may have taken, but not the run it could not report:
    its job ran, so queued again it would run twice; it is left to the reaper."""
    cable = _Cable(db.dsn)
    try:
        run_id = enqueue(conn, "nap", payload='{"steps": 10}', heartbeat_timeout="interval '10 minutes'")
        worker = start_worker(dsn=cable.dsn, report_tries=5)
        worker.wait_log(f"run={run_id} kind=nap attempt=1 started")
        cable.unplug()
        worker.wait_log(f"run={run_id} outcome not reported", timeout=150)
        assert worker.log().count("database unavailable while reporting") == 4, worker.log()
        worker.wait_log("claim failed", timeout=30)
        cable.plugged = True
        # The worker settles the failed claim before it claims again: a run queued now is run
        # after that, and after a run handed back (which was queued earlier).
        later = enqueue(conn, "greet", payload='{"name": "later"}')
        done = lambda: run_row(conn, later)["status"] == "COMPLETED"  # noqa: E731
        worker.wait_until("the later run to complete", done, 60)
        assert worker.log().count(f"run={run_id} kind=nap attempt=1 started") == 1, worker.log()
        row = run_row(conn, run_id)
        assert (row["status"], row["attempt"]) == ("RUNNING", 1), row
        assert worker.terminate_and_wait() == 0, worker.log()
    finally:
        cable.close()
