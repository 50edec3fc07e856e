"""``isolation="process"`` under `pgtick run`: the job runs in a child process.

* A job stuck in ``time.sleep(3600)`` (no checkpoint) is killed at its timeout: the run
  fails with reason 'Timeout' and the job's process is gone.
* A cancel from psql kills the job's process; the kind's compensation runs in the
  worker process, and commits before the run is stamped CANCELLED.
* An exception's class chain reaches the retry policy, its traceback the run's error.
* Results come back; consecutive jobs reuse the pool's child process. A result that
  cannot be pickled (or unpickled) is stored if it is JSON, and otherwise fails the run as
  a thread job's result that is not JSON does.
* A job past its kind's ``memory_limit`` fails (``MemoryLimitExceeded``, retried by its
  policy) saying the limit, and its job process runs the next job.
* A worker cut off from the database kills a job process once no heartbeat has confirmed
  the run within its heartbeat timeout, and reports nothing: the job does not run on
  beside the retry another worker starts after reaping the run.
* Several workers in one Python process each own their job processes: stopping one leaves
  the jobs of the others running in their children.
* The kill at a timeout or cancel reaches the processes the job started too (a
  ``subprocess`` it waits for, one in a session of its own, a double-forked daemon): they do
  not run on, orphaned, past the stop; nor past the death of the worker process, nor past
  a job process that exits before reporting. A daemon a completed job left behind is reaped
  when it ends, not left a zombie of the reused job process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from harness import (
    APPS,
    FAST,
    PGTICK,
    ROOT,
    Conn,
    Database,
    Proc,
    Processes,
    cancel_a_running_job,
    cut_off_mid_job,
    env_for,
    executions,
    scalar,
    wait_finished,
    wait_for,
    wait_started,
    worker_thread,
)
from pgtick.app import App, Context
from pgtick.worker import Worker

#: A stopped job ends long before this; a job left to its time.sleep(3600) would not.
SLACK = timedelta(seconds=15)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def held_until_released(ctx: Context) -> dict[str, int]:
    """Writes its process id to the payload's ``started`` file (whole: a reader that sees the
    file sees the id), then waits (no checkpoint) for the payload's ``release`` file to exist,
    five minutes at most."""
    started = Path(ctx.payload["started"])
    started.with_name(started.name + ".new").write_text(str(os.getpid()))
    os.replace(started.with_name(started.name + ".new"), started)
    release = Path(ctx.payload["release"])
    give_up = time.monotonic() + 300
    while not release.exists() and time.monotonic() < give_up:
        time.sleep(0.02)
    return {"pid": os.getpid()}


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: neither gone nor a zombie (an orphan the container's init may
    never reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _stopped_growing(path: Path, timeout: float, still: float = 0.5) -> bool:
    """Whether ``path``'s size stays the same for ``still`` seconds (ten of its 50 ms beats)
    within ``timeout`` seconds."""
    give_up = time.monotonic() + timeout
    size, since = -1, time.monotonic()
    while time.monotonic() < give_up:
        now, grown = time.monotonic(), path.stat().st_size
        if grown != size:
            size, since = grown, now
        elif now - since >= still:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("how", "stop"),
    [
        *(
            (how, stop)
            for how in ("subprocess", "new-session", "daemon", "hopping")
            for stop in ("timeout", "cancel", "exit", "worker-killed")
        ),
    ],
)
def test_the_kill_of_a_process_job_stops_the_processes_its_job_started(
    procs: Processes, conn: Conn, tmp_path: Path, how: str, stop: str
) -> None:
    """A job starts a process that appends to a file every 50 ms: a subprocess it waits for, one
    in a session of its own (``start_new_session=True``), a daemon (double fork, ``setsid``), or
    one that forks and exits after every beat. The job is killed at its timeout, or on cancel,
    or its process exits before reporting, or its worker process is killed (SIGKILL): the
    process it started is stopped with it and its file stops growing, rather than run on
    (orphaned) for its ten minutes beside the run's retry."""
    replica = procs.replica("isolated_app.py", "replica")
    kind = "starts-sleeper-timeout" if stop == "timeout" else "starts-sleeper"
    sleeper_file, beats = tmp_path / "sleeper", tmp_path / "beats"
    payload = json.dumps(
        {"sleeper": str(sleeper_file), "beats": str(beats), "how": how, "exit": stop == "exit"}
    )
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue(%s, %s)", (kind, payload))
    try:
        wait_for("the job to start its process", lambda: sleeper_file.exists() or None, 60)
    except AssertionError as exc:
        status = scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,))
        raise AssertionError(f"{exc}; run {run_id}: {status}\n{replica.log()}") from None
    sleeper = int(sleeper_file.read_text())
    wait_for(f"process {sleeper} to beat", lambda: (beats.exists() and beats.stat().st_size > 0) or None, 60)
    status = None
    try:
        if stop == "worker-killed":
            replica.send(signal.SIGKILL)
            replica.wait(30)
        else:
            if stop == "cancel":
                conn.execute("SELECT jobs.cancel(%s)", (run_id,))
            status = wait_finished(conn, run_id)
        stopped = _stopped_growing(beats, 30)  # a killed process is gone in milliseconds
        last = int(beats.read_text().split()[-1])  # the process that beat last
        give_up = time.monotonic() + 30
        while _running(last) and time.monotonic() < give_up:
            time.sleep(0.1)
        running = _running(last)
    finally:
        # Whatever the outcome, not left behind by the test: a hopping one by its group.
        kill = os.killpg if how == "hopping" else os.kill
        for pid in {sleeper, int(beats.read_text().split()[-1])}:
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    context = f"run {run_id}: {status}; first process {sleeper}, last {last}\n{replica.log()}"
    if stop != "worker-killed":
        assert status == ("CANCELLED" if stop == "cancel" else "FAILED"), context
    assert stopped, f"the job's {how} process beat on past the kill of its job ({stop}): {context}"
    assert not running, f"the job's {how} process {last} outlived the kill of its job ({stop}): {context}"


def test_a_daemon_a_process_job_left_behind_is_reaped_when_it_ends(
    procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """A job that completes leaves a daemon that ends half a second later: its job process,
    kept for the next job, is not left holding the daemon's exit (a zombie) for its lifetime."""
    replica = procs.replica("isolated_app.py", "replica")
    sleeper_file, beats = tmp_path / "sleeper", tmp_path / "beats"
    payload = json.dumps({"sleeper": str(sleeper_file), "beats": str(beats)})
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('leaves-a-daemon', %s)", (payload,))
    status = wait_finished(conn, run_id)
    daemon = int(sleeper_file.read_text())
    give_up = time.monotonic() + 30  # it beats for half a second
    while Path(f"/proc/{daemon}").exists() and time.monotonic() < give_up:
        time.sleep(0.1)
    try:
        stat = Path(f"/proc/{daemon}/stat").read_text()
    except FileNotFoundError:
        stat = None
    context = f"run {run_id}: {status}; daemon {daemon}: {stat}\n{replica.log()}"
    assert status == "COMPLETED", context
    assert stat is None, f"the daemon's exit was never reaped: {context}"


def test_stopping_one_worker_leaves_another_workers_process_jobs_running(
    db: Database, tmp_path: Path
) -> None:
    """Two workers in one Python process, one per queue, both with a job process: stopping A
    stops A's child only. B's job, mid-run in its child when A stops, runs on and completes."""
    app = App("two-workers")
    app.job("held", isolation="process")(held_until_released)

    def held(conn: Conn, queue: str, name: str) -> tuple[int, Path, Path]:
        started, release = tmp_path / f"{name}.started", tmp_path / f"{name}.release"
        payload = json.dumps({"started": str(started), "release": str(release)})
        run_id = scalar(conn, "SELECT id FROM jobs.enqueue('held', %s, queue => %s)", (payload, queue))
        return run_id, started, release

    def status(conn: Conn, run_id: int) -> str:
        return str(scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,)))

    a = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, queues=["a"])
    b = Worker(app, db.dsn, concurrency=1, poll_interval=0.1, queues=["b"])
    with db.connect() as conn, worker_thread(b):
        with worker_thread(a):
            a_run, a_started, a_release = held(conn, "a", "a")
            a_release.touch()  # A's job returns at once: its child stays, idle, for A's next job
            wait_for(f"A's run {a_run} to complete", lambda: status(conn, a_run) == "COMPLETED" or None, 60)
            a_child = int(a_started.read_text())
            b_run, b_started, b_release = held(conn, "b", "b")
            wait_for(f"B's run {b_run} to start in its child", lambda: b_started.exists() or None, timeout=60)
            b_child = int(b_started.read_text())
        # A has stopped (worker_thread joined it).
        a_gone = wait_for(f"A's child {a_child} to be gone", lambda: not _alive(a_child) or None, timeout=60)
        b_alive, b_status = _alive(b_child), status(conn, b_run)
        b_release.touch()
        wait_for(f"B's run {b_run} to end", lambda: status(conn, b_run) != "RUNNING" or None, timeout=60)
        end = "SELECT status::text, error, result FROM jobs.runs WHERE id = %s"
        b_end = conn.execute(end, (b_run,)).fetchone()

    context = f"A's child {a_child}, B's child {b_child}; B's run {b_run} ended {b_end}"
    assert a_gone, context
    assert b_alive and b_status == "RUNNING", f"stopping A stopped B's job ({b_status}): {context}"
    assert b_end == ("COMPLETED", None, {"pid": b_child}), context


def test_a_process_job_stuck_in_sleep_is_killed_at_its_timeout(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("isolated_app.py", "replica")
    worker = replica.worker_id
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('stuck')")
    child = wait_started(conn, run_id)
    status = wait_finished(conn, run_id)
    run = conn.execute(
        "SELECT failure_reason, error, finished_at - started_at, worker FROM jobs.runs WHERE id = %s",
        (run_id,),
    ).fetchone()
    gone = wait_for(f"job process {child} to be gone", lambda: not _alive(child) or None, timeout=60)
    log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; job pid {child}, worker pid {replica.pid}\n{log}"
    assert child != replica.pid, f"the job ran in the worker process: {context}"
    assert status == "FAILED" and run[0] == "Timeout" and run[3] == worker, context
    assert "killed" in run[1], context
    assert timedelta(seconds=2) <= run[2] < timedelta(seconds=2) + SLACK, context
    assert gone


def test_cancel_from_psql_kills_a_process_job_and_compensation_runs_in_the_worker(
    db: Database, procs: Processes, conn: Conn
) -> None:
    replica, cancelled = cancel_a_running_job(procs, db, conn, "isolated_app.py", "stuck-mutating")
    child = cancelled.pid
    executed = executions(conn, "run_id, pid, exited")
    gone = wait_for(f"job process {child} to be gone", lambda: not _alive(child) or None, timeout=60)
    context = f"{cancelled}; executions {executed}\n{replica.log()}"
    cancelled.check_compensated_first(replica, context)
    assert executed == [(cancelled.run_id, child, None)], f"the job was not killed mid-sleep: {context}"
    assert gone


def test_a_process_job_error_keeps_its_class_chain_for_retries_and_its_traceback(
    procs: Processes, conn: Conn
) -> None:
    replica = procs.replica("isolated_app.py", "replica")
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('isolated-fails')")
    wait_for(
        f"run {run_id} and its retry to fail",
        lambda: scalar(conn, "SELECT count(*) = 2 FROM jobs.runs WHERE status = 'FAILED'") or None,
        timeout=60,
    )
    runs = conn.execute(
        "SELECT id, retry_of, attempt, failure_reason, error FROM jobs.runs ORDER BY id"
    ).fetchall()
    log = replica.log()

    context = f"runs {runs}\n{log}"
    assert [r[2] for r in runs] == [1, 2] and runs[1][1] == run_id, f"RuntimeError not retried: {context}"
    for r in runs:
        assert r[3] == "Error", context
        assert r[4].startswith(f"LedgerLocked: ledger locked for run {r[0]}"), context
        assert "Traceback (most recent call last)" in r[4] and "isolated_fails" in r[4], context


def test_process_jobs_return_results_and_reuse_their_child_process(procs: Processes, conn: Conn) -> None:
    replica = procs.replica("isolated_app.py", "replica", "--concurrency", "1")
    ids = [
        scalar(conn, "SELECT id FROM jobs.enqueue('isolated-returns', %s)", (f'{{"echo": {i}}}',))
        for i in range(3)
    ]
    wait_for(
        "the runs to complete",
        lambda: scalar(conn, "SELECT count(*) = 3 FROM jobs.runs WHERE status = 'COMPLETED'") or None,
        timeout=60,
    )
    results = [scalar(conn, "SELECT result FROM jobs.runs WHERE id = %s", (i,)) for i in ids]
    log = replica.log()

    context = f"results {results}\n{log}"
    assert [r["echo"] for r in results] == [0, 1, 2], context
    pids = {r["pid"] for r in results}
    assert replica.pid not in pids, f"a job ran in the worker process: {context}"
    assert len(pids) == 1, f"each job started a process of its own: {context}"


@pytest.mark.parametrize(
    ("what", "args", "type_name"),
    [
        # A result pickle refuses: a function (not JSON either); a dict of a local class is JSON.
        pytest.param("function", (), "function", id="pickle-refuses"),
        # One that pickles but cannot be unpickled, and then the same child runs the next job.
        pytest.param("unloadable", ("--concurrency", "1"), "TwoPartError", id="cannot-be-unpickled"),
    ],
)
def test_a_result_that_does_not_come_back_from_the_job_process_is_stored_when_json_and_else_fails_the_run(
    procs: Processes, conn: Conn, what: str, args: tuple[str, ...], type_name: str
) -> None:
    """A result the job's process cannot send back (pickle refuses it, or the worker cannot
    unpickle it) is stored when it is JSON; otherwise the run fails as a thread job's result
    that is not JSON does, with no worker traceback, and the next job runs."""
    replica = procs.replica("isolated_app.py", "replica", *args)
    kind = "isolated-returns-unpicklable"
    refused = scalar(conn, "SELECT id FROM jobs.enqueue(%s, %s)", (kind, json.dumps({"what": what})))
    json_result = scalar(conn, "SELECT id FROM jobs.enqueue(%s)", (kind,))
    statuses = [wait_finished(conn, refused), wait_finished(conn, json_result)]
    runs = conn.execute(
        "SELECT id, status, failure_reason, error, result FROM jobs.runs ORDER BY id"
    ).fetchall()
    log = replica.log()

    context = f"runs {runs}\n{log}"
    assert statuses == ["FAILED", "COMPLETED"], context
    expected = (
        f"the result could not be stored: TypeError: Object of type {type_name} is not JSON serializable"
    )
    assert runs[0][2:4] == ("Error", expected), context
    assert "Traceback" not in log, f"a job's result is not a worker error: {context}"
    assert runs[1][4] is not None and set(runs[1][4]) == {"pid"} and runs[1][4]["pid"] != replica.pid, context


def test_a_process_job_past_its_memory_limit_fails_by_its_policy_and_its_process_runs_the_next_job(
    procs: Processes, conn: Conn
) -> None:
    """A job of a kind declared with ``memory_limit=200 MiB`` that allocates 1 GiB at once
    fails (MemoryLimitExceeded, a MemoryError: retried by its policy) saying the limit; the
    job process stays up and, the limit lifted, runs the next job, within the limit, to
    completion, as does the worker."""
    replica = procs.replica("isolated_app.py", "replica", "--concurrency", "1")
    hog = scalar(conn, "SELECT id FROM jobs.enqueue('memory-capped', %s)", (json.dumps({"allocate": 2**30}),))
    wait_for(
        f"run {hog} and its retry to fail",
        lambda: scalar(conn, "SELECT count(*) = 2 FROM jobs.runs WHERE status = 'FAILED'") or None,
        timeout=60,
    )
    within = scalar(
        conn, "SELECT id FROM jobs.enqueue('memory-capped', %s)", (json.dumps({"allocate": 2**24}),)
    )
    status = wait_finished(conn, within)
    runs = conn.execute(
        "SELECT id, retry_of, attempt, status, failure_reason, error, result FROM jobs.runs ORDER BY id"
    ).fetchall()
    alive = replica.popen.poll()
    log = replica.log()

    context = f"runs {runs}\n{log}"
    failed, retry, completed = runs
    assert (retry[1], retry[2]) == (hog, 2), f"MemoryError not retried: {context}"
    limit = "209715200 bytes (200 MiB)"
    for r in (failed, retry):
        assert r[3:5] == ("FAILED", "Error"), context
        said = f"MemoryLimitExceeded: run {r[0]} exceeded its memory limit of {limit}: an allocation in its"
        assert r[5].startswith(said), context
        assert "Traceback (most recent call last)" in r[5] and "memory_capped" in r[5], context
    assert status == "COMPLETED" and completed[6]["allocated"] == 2**24, context
    job_pid = completed[6]["pid"]
    assert f"job process pid {job_pid}:" in failed[5], f"the job process did not outlive its error: {context}"
    assert alive is None, f"the worker died: {context}"


@pytest.mark.parametrize(
    ("kind", "note"),
    [
        ("stuck-mutating", ""),
        # Killed under a memory limit (as code that aborts when an allocation fails ends): the
        # error says the limit, which the run may have exceeded; never a clean completion.
        (
            "stuck-memory-capped",
            "; it ran under its kind's memory limit of 209715200 bytes (200 MiB), which an allocation"
            " that ended it may have exceeded",
        ),
    ],
)
def test_a_job_process_killed_from_outside_fails_the_run_with_its_exit_code(
    procs: Processes, conn: Conn, kind: str, note: str
) -> None:
    replica = procs.replica("isolated_app.py", "replica")
    assert replica.worker_id  # started: its tables exist
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue(%s)", (kind,))
    child = wait_started(conn, run_id)
    os.kill(child, signal.SIGKILL)
    status = wait_finished(conn, run_id)
    run = conn.execute("SELECT failure_reason, error FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
    compensations = scalar(conn, "SELECT count(*) FROM public.compensations")
    alive = replica.popen.poll()
    log = replica.log()

    assert run is not None
    context = f"run {run_id}: {status} {run}; compensations {compensations}\n{log}"
    assert status == "FAILED" and run[0] == "Error", context
    expected = f"JobProcessExited: job process pid {child} exited with code -9 before reporting{note}"
    assert run[1] == expected, context
    assert compensations == 0, f"a failure is not a cancel: {context}"
    assert alive is None, f"the worker died with its job process: {context}"


def test_a_process_job_of_a_worker_cut_off_from_the_database_is_killed_before_its_retry_completes(
    db: Database, procs: Processes, conn: Conn, tmp_path: Path
) -> None:
    """The victim's login is refused and its sessions ended while its job process appends to a
    file every 50 ms without a checkpoint. Once no heartbeat has confirmed the run within its
    heartbeat timeout, the victim kills the child and reports nothing; the survivor's leader
    reaps the run (HeartbeatLost) and runs its retry. The first attempt's lines end before the
    retry completes; the victim lives on and runs the next job once it reaches the database."""
    cut = cut_off_mid_job(
        db, procs, conn, tmp_path / "appended", "isolated_app.py", "appends", "isolated-returns",
        stopped=lambda run_id, pid: not _alive(pid),
    )  # fmt: skip
    context, log = cut.context, cut.victim.log()
    firsts = [t for a, t in cut.appended if a == 1]
    assert cut.pid != cut.victim.pid, f"the job ran in the worker process: {context}"
    assert firsts, f"the first attempt appended nothing: {context}"
    assert max(firsts) < cut.retry_finished, f"the cut-off job ran on past its retry: {context}"
    assert cut.first == ("FAILED", "HeartbeatLost", cut.victim_worker), f"not left to the reaper: {context}"
    killed = f"run={cut.run_id} kind=appends worker={cut.victim_worker} job process pid {cut.pid} killed"
    assert log.count(killed) == 1, context
    assert "Traceback" not in log, context
    assert cut.alive, f"the victim exited: {context}"
    assert cut.after_worker == cut.victim_worker, f"the next run ran on {cut.after_worker}: {context}"


def test_a_process_job_error_whose_message_cannot_be_read_fails_by_its_class_and_policy(
    procs: Processes, conn: Conn
) -> None:
    """Its ``__str__`` raises in the job process: the run still fails with its class, and the
    policy that says never to retry that class holds."""
    replica = procs.replica("isolated_app.py", "replica")
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('isolated-unprintable')")
    wait_for(
        f"run {run_id} to fail",
        lambda: (
            scalar(conn, "SELECT status::text = 'FAILED' FROM jobs.runs WHERE id = %s", (run_id,)) or None
        ),
        timeout=60,
    )
    runs = conn.execute("SELECT id, attempt, error FROM jobs.runs ORDER BY id").fetchall()
    context = f"runs {runs}\n{replica.log()}"
    assert len(runs) == 1, f"retried though never_retry names its class: {context}"
    assert runs[0][2].startswith("Unprintable: (the error message could not be read: ValueError"), context


def test_what_a_process_job_logs_through_its_logger_shows_as_a_thread_jobs_does(
    procs: Processes, conn: Conn
) -> None:
    """`pgtick run` without -v or PGTICK_LOG shows what job code logs through ``ctx.logger`` at
    INFO (``pgtick.job``): so does a job in a process of its own."""
    label = "default-log-level"
    log = procs.directory / f"{label}.log"
    env = {k: v for k, v in env_for(procs.dsn).items() if k != "PGTICK_LOG"}
    args = ["run", str(APPS / "isolated_app.py"), "--dsn", procs.dsn, *FAST, "--grace", "5s"]
    with log.open("wb") as stderr:
        popen = subprocess.Popen(
            [*PGTICK, *args],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    replica = Proc(label, popen, log)
    procs.started.append(replica)
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('isolated-returns', '{\"echo\": 7}')")
    wait_finished(conn, run_id, timeout=60)
    replica.wait_log(rf"INFO pgtick.outcome run={run_id} kind=isolated-returns ", timeout=15)
    assert "INFO pgtick.job echo 7 from the job process" in replica.log(), replica.log()
