"""A worker killed (kill -9) or cut off from the database in the middle of a job: the run
is reaped and retried elsewhere.

Invariants (DESIGN 1 and 4): the lost worker's run ends FAILED with reason
HeartbeatLost once its heartbeat is older than the run's heartbeat timeout; the
leader among the survivors reaps it and queues attempt 2 (retry_of), which
another worker runs to COMPLETED; nothing is executed twice at the same time.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from harness import (
    APPS,
    FAST,
    PGTICK,
    ROOT,
    SHORT_HEARTBEAT,
    Conn,
    Database,
    Processes,
    enqueue,
    pid_of_owner,
    refuse_login,
    scalar,
    start_sleepy_run,
    wait_finished,
    wait_for,
    wait_retry_completed,
    wait_started,
)
from pgtick.embedded import EmbeddedPostgres


def test_worker_killed_mid_job_is_reaped_and_retried_on_another_worker(procs: Processes, conn: Conn) -> None:
    replicas = [procs.replica("work_app.py", f"replica{i}") for i in range(2)]
    workers = {r.pid: r.worker_id for r in replicas}
    run_id, victim_pid = start_sleepy_run(conn, 30)
    wait_for(
        f"run {run_id} to heartbeat",
        lambda: scalar(conn, "SELECT heartbeat_at FROM jobs.runs WHERE id = %s", (run_id,)),
        timeout=60,
    )
    victim = procs.by_pid(victim_pid)
    survivor = next(r for r in replicas if r is not victim)
    assert victim is not None, f"run {run_id} executed by pid {victim_pid}, no replica: {workers}"

    victim.send(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    retry = wait_retry_completed(conn, run_id, "id, attempt, status::text, worker, origin")
    first = conn.execute(
        "SELECT status::text, failure_reason, worker, error, finished_at - heartbeat_at"
        " FROM jobs.runs WHERE id = %s",
        (run_id,),
    ).fetchone()
    executions = conn.execute(
        "SELECT run_id, attempt, pid, worker, exited IS NOT NULL, outcome FROM public.executions ORDER BY id"
    ).fetchall()
    survivor_log = survivor.log()
    logs = procs.tails()

    assert first is not None
    status, reason, worker, error, silent_for = first
    context = f"run {run_id}: {first}; retry {retry}; executions {executions}\n{logs}"
    assert (status, reason) == ("FAILED", "HeartbeatLost"), context
    assert worker == workers[victim.pid] and worker in error, context
    assert silent_for >= timedelta(seconds=SHORT_HEARTBEAT), f"reaped before its heartbeat timeout: {context}"
    retry_id, attempt, _, retry_worker, origin = retry
    assert (attempt, origin) == (2, "retry"), context
    assert pid_of_owner(retry_worker) == survivor.pid, f"retry not on the survivor {survivor.pid}: {context}"
    reaped = f"run={run_id} kind=sleepy worker={worker} reaped reason=HeartbeatLost retry={retry_id}"
    assert reaped in survivor_log, f"the survivor's leader did not reap run {run_id}: {context}"
    assert executions == [
        (run_id, 1, victim.pid, workers[victim.pid], False, None),
        (retry_id, 2, survivor.pid, workers[survivor.pid], True, "returned"),
    ], context


def test_a_worker_cut_off_from_the_database_passes_no_checkpoint_beside_its_retry(
    db: Database, procs: Processes, conn: Conn
) -> None:
    """The victim's login is refused and its sessions ended mid-job (a network partition: the
    process lives on, its heartbeats fail). Past the run's heartbeat timeout the survivor's
    leader reaps the run and runs its retry; the cut-off job must pass no checkpoint while the
    retry runs. Once the victim reaches the database again, its job learns it lost the run
    (Abandoned), nothing of it is reported, and the victim goes on working."""
    with db.worker_login("cutoff") as login:
        victim = procs.start(
            "victim", ["run", str(APPS / "work_app.py"), "--dsn", db.dsn_as(login), "--no-scheduler", *FAST]
        )
        victim_worker = victim.worker_id
        payload = '{"seconds": 120, "retry_seconds": 1}'
        short = f"make_interval(secs => {SHORT_HEARTBEAT})"
        run_id = enqueue(conn, "steps", payload, heartbeat_timeout=short)
        wait_started(conn, run_id)
        wait_for(
            f"run {run_id} to heartbeat",
            lambda: scalar(conn, "SELECT heartbeat_at > started_at FROM jobs.runs WHERE id = %s", (run_id,)),
            timeout=60,
        )
        refuse_login(conn, login)
        survivor = procs.replica("work_app.py", "survivor")
        retry_id, retry_started, retry_finished = wait_retry_completed(
            conn, run_id, "id, started_at, finished_at", timeout=90
        )
        conn.execute(SQL("ALTER ROLE {} CONNECTION LIMIT -1").format(Identifier(login)))
        exited: tuple[str, Any] = wait_for(
            f"the job of run {run_id} to stop",
            lambda: conn.execute(
                "SELECT outcome, exited FROM public.executions WHERE run_id = %s AND exited IS NOT NULL",
                (run_id,),
            ).fetchone(),
            timeout=90,
        )
        victim.wait_log(rf"run={run_id} kind=steps worker=\S+ abandoned")
        survivor.send(signal.SIGTERM)
        survivor.wait(30)
        quick = enqueue(conn, "quick")
        wait_finished(conn, quick)
        alive = victim.popen.poll() is None
        quick_worker = scalar(conn, "SELECT worker FROM jobs.runs WHERE id = %s", (quick,))
        first = conn.execute(
            "SELECT status::text, failure_reason, worker FROM jobs.runs WHERE id = %s", (run_id,)
        ).fetchone()
        lineage = conn.execute(
            "SELECT id, status::text FROM jobs.runs WHERE id = %s OR retry_of = %s ORDER BY id",
            (run_id, run_id),
        ).fetchall()
        late_steps = conn.execute(
            "SELECT count(*), max(at) FROM public.steps WHERE run_id = %s AND at >= %s",
            (run_id, retry_started),
        ).fetchone()
        context = (
            f"run {run_id}: {first}; retry {retry_id} ran {retry_started} .. {retry_finished};"
            f" lineage {lineage}; first attempt exited {exited}\n{procs.tails()}"
        )
    assert late_steps is not None
    count, last = late_steps
    assert count == 0, f"the cut-off job passed {count} checkpoints beside its retry (last {last}): {context}"
    assert exited[0] == "Abandoned", context
    assert first == ("FAILED", "HeartbeatLost", victim_worker), context
    assert lineage == [(run_id, "FAILED"), (retry_id, "COMPLETED")], context
    assert f"run={run_id} kind=steps worker={victim_worker} reaped reason=HeartbeatLost" in survivor.log(), (
        context
    )
    assert victim.log().count(f"run={run_id} waits at a checkpoint") == 1, context
    assert "Traceback" not in victim.log(), context
    assert alive, f"the victim exited after reaching the database again: {context}"
    assert quick_worker == victim_worker, f"run {quick} ran on {quick_worker}, not the victim: {context}"


def test_a_run_claimed_ahead_passes_no_checkpoint_past_its_server_timeout_when_cut_off(
    db: Database, procs: Processes, conn: Conn
) -> None:
    """The server counts a run's own timeout from its claim (started_at), and a run claimed
    ahead of a free slot begins later. Its worker cut off from the database, the survivor's
    leader fails the run as Timeout at started_at + timeout and runs its retry: the cut-off
    job must pass no checkpoint from then on, however long it waited for its slot (its
    heartbeat timeout, far longer, does not make it the worker's)."""
    with db.worker_login("ahead") as login:
        heartbeat = "make_interval(secs => 30)"
        ahead = enqueue(conn, "steps", '{"seconds": 3}', heartbeat_timeout=heartbeat)
        run_id = enqueue(
            conn,
            "steps",
            '{"seconds": 120, "retry_seconds": 1}',
            heartbeat_timeout=heartbeat,
            timeout="make_interval(secs => 8)",
        )
        args = ["--dsn", db.dsn_as(login), *FAST, "--no-scheduler", "--concurrency", "1", "--batch", "2"]
        victim = procs.start("victim", ["run", str(APPS / "work_app.py"), *args])
        victim.wait_log(r"worker=\S+ started")  # the app has made its tables
        wait_for(
            f"run {run_id} to pass a checkpoint after run {ahead}",
            lambda: scalar(conn, "SELECT EXISTS (SELECT FROM public.steps WHERE run_id = %s)", (run_id,)),
            timeout=60,
        )
        refuse_login(conn, login)
        survivor = procs.replica("work_app.py", "survivor")
        retry_id, retry_started = wait_retry_completed(conn, run_id, "id, started_at", timeout=90)
        exited = wait_for(
            f"the job of run {run_id} to stop",
            lambda: conn.execute(
                "SELECT outcome, exited FROM public.executions WHERE run_id = %s AND exited IS NOT NULL",
                (run_id,),
            ).fetchone(),
            timeout=90,
        )
        first = conn.execute(
            "SELECT status::text, failure_reason, started_at, finished_at FROM jobs.runs WHERE id = %s",
            (run_id,),
        ).fetchone()
        late = conn.execute(
            "SELECT count(*), max(at) FROM public.steps WHERE run_id = %s AND at >= %s",
            (run_id, retry_started),
        ).fetchone()
        context = (
            f"run {run_id}: {first}; retry {retry_id} started {retry_started}; first attempt"
            f" exited {exited}\n{procs.tails()}"
        )
        conn.execute(SQL("ALTER ROLE {} CONNECTION LIMIT -1").format(Identifier(login)))
        survivor.send(signal.SIGTERM)
        survivor.wait(30)
    assert first is not None and first[:2] == ("FAILED", "Timeout"), context
    assert late is not None
    count, last = late
    assert count == 0, f"the cut-off job passed {count} checkpoints beside its retry (last {last}): {context}"
    assert exited[0] == "JobTimeout", context


@pytest.fixture
def data_home() -> Iterator[Path]:
    """XDG_DATA_HOME for an embedded server, outside pytest's base directory (as root the
    server runs as its own user, which pytest's private directories would lock out)."""
    path = Path(tempfile.mkdtemp(prefix="pgtick-crash-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


EMBEDDED_APP = """
from pgtick.app import App

app = App("embedded")


@app.job("quick")
def quick(ctx):
    return None
"""


@pytest.mark.timeout(420)
def test_a_second_pgtick_run_on_the_embedded_server_leaves_it_running_for_the_first(
    tmp_path: Path, data_home: Path
) -> None:
    """Two `pgtick run` on the embedded PostgreSQL of one data directory (a scheduler beside
    a worker, or `pgtick web` beside `pgtick run`): stopping one must not stop the server
    under the other, which would be left without a database until restarted by hand. The
    last one out stops it."""
    app = tmp_path / "embedded_app.py"
    app.write_text(EMBEDDED_APP)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN", "PGTICK_HOME")}
    env.update(XDG_DATA_HOME=str(data_home), PGTICK_LOG="INFO", PYTHONUNBUFFERED="1")
    pidfile = data_home / "pgtick" / "pgdata" / "postmaster.pid"
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(label: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{label}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*PGTICK, "run", str(app), "--tick", "0.5s", "--poll", "0.2s", *extra],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append((proc, log))
        return proc, log

    def logged(proc: subprocess.Popen[bytes], log: Path, text: str) -> bool:
        assert proc.poll() is None, f"exited early:\n{log.read_text(errors='replace')[-3000:]}"
        return text in log.read_text(errors="replace")

    try:
        first, first_log = start("first")
        wait_for("the first to start its worker", lambda: logged(first, first_log, " started kinds="), 180)
        second, second_log = start("second", "--no-worker")
        wait_for("the second to attach", lambda: logged(second, second_log, "scheduler owner="), 120)
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, second_log.read_text(errors="replace")[-3000:]
        dsn = f"postgresql://postgres:@/postgres?host={data_home / 'pgtick' / 'pgdata'}"
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                run_id = scalar(conn, "SELECT id FROM jobs.enqueue('quick')")
                status = wait_finished(conn, run_id)
        except psycopg.OperationalError as exc:
            raise AssertionError(
                f"the embedded server stopped with the second pgtick run: {exc}\n"
                f"{first_log.read_text(errors='replace')[-3000:]}"
            ) from None
        assert status == "COMPLETED"
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0, first_log.read_text(errors="replace")[-3000:]
        wait_for("the last one out to stop the server", lambda: not pidfile.exists(), 60, interval=0.2)
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        if pidfile.exists():  # the test failed with the server up: stop it
            leftover = EmbeddedPostgres(pidfile.parent)
            leftover.start()
            leftover.stop()
