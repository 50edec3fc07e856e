"""`pgtick run --processes 2`: two worker processes under one supervisor.

* kill -9 of the child running a job: the supervisor logs the exit code and starts a
  new child; the supervisor's scheduler reaps the dead child's run and its retry
  completes in a live child.
* SIGTERM to the supervisor: both children drain (their running jobs complete), every
  process exits, the supervisor with code 0.
* `--metrics-port P`: the children serve on P and P + 1, and the group's leader (the
  supervisor's scheduler) shows as pgtick_leader 1 on exactly one of them.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import urllib.request

from harness import (
    APPS,
    Conn,
    Database,
    Proc,
    Processes,
    pgtick,
    pid_of_owner,
    scalar,
    start_sleepy_run,
    wait_for,
    wait_retry_completed,
)


def _workers(proc: Proc, count: int) -> list[str]:
    """Wait until ``count`` workers have started under ``proc``; their ids."""

    def started() -> list[str] | None:
        ids = re.findall(r"worker=(\S+) started", proc.log())
        return ids if len(ids) >= count else None

    return wait_for(f"{count} workers to start", started, timeout=60)


def _job_pids(conn: Conn, count: int) -> set[int] | None:
    pids = {r[0] for r in conn.execute("SELECT pid FROM public.executions").fetchall()}
    return pids if len(pids) == count else None


def test_a_child_killed_mid_job_is_replaced_and_its_run_reaped_and_retried(
    procs: Processes, conn: Conn
) -> None:
    sup = procs.replica("work_app.py", "supervisor", "--processes", "2")
    workers = _workers(sup, 2)
    children = {pid_of_owner(w) for w in workers}
    run_id, victim = start_sleepy_run(conn, 60)
    assert victim in children and victim != sup.pid, f"run {run_id} in pid {victim}: {sup.tail()}"
    os.kill(victim, signal.SIGKILL)
    sup.wait_log(rf"worker process \d \(pid {victim}\) exited with code -9", timeout=60)
    replaced = _workers(sup, 3)
    retry = wait_retry_completed(conn, run_id, "id, worker")
    first = conn.execute(
        "SELECT status::text, failure_reason FROM jobs.runs WHERE id = %s", (run_id,)
    ).fetchone()
    alive = sup.popen.poll()
    log = sup.log()

    context = f"run {run_id}: {first}; retry {retry}; workers {replaced}\n{log}"
    assert first == ("FAILED", "HeartbeatLost"), context
    assert pid_of_owner(retry[1]) in {pid_of_owner(w) for w in replaced} - {victim}, context
    assert len({pid_of_owner(w) for w in replaced}) == 3, f"the dead child was not replaced: {context}"
    assert alive is None, f"the supervisor exited: {context}"


def test_sigterm_to_the_supervisor_drains_both_children(procs: Processes, conn: Conn) -> None:
    sup = procs.replica("work_app.py", "supervisor", "--processes", "2", "--concurrency", "1", grace="60s")
    workers = _workers(sup, 2)
    ids = [scalar(conn, """SELECT id FROM jobs.enqueue('sleepy', '{"seconds": 2}')""") for _ in range(2)]
    pids = wait_for("both runs to start in the two children", lambda: _job_pids(conn, 2), timeout=60)
    sup.send(signal.SIGTERM)
    code = sup.wait(90)
    runs = conn.execute("SELECT id, status::text FROM jobs.runs ORDER BY id").fetchall()
    log = sup.log()

    context = f"runs {runs}; workers {workers}; job pids {pids}\n{log}"
    assert code == 0, context
    assert pids == {pid_of_owner(w) for w in workers}, context
    assert runs == [(i, "COMPLETED") for i in ids], f"the children did not drain: {context}"
    assert len(re.findall(r"worker=\S+ stopped", log)) == 2, context


def test_processes_below_one_is_refused_with_exit_code_2(db: Database) -> None:
    done = pgtick("run", str(APPS / "work_app.py"), "--dsn", db.dsn, "--processes", "0")
    assert done.returncode == 2, done
    assert (
        done.stderr.strip()
        == "pgtick run: error: --processes: must be between 1 and 256 (got 0) (see pgtick run --help)"
    ), done.stderr


def _two_free_ports() -> int:
    """A port P such that P and P + 1 are both free now."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("0.0.0.0", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two consecutive free ports")


def _leader_gauge(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(r"^pgtick_leader (\S+)$", text, flags=re.MULTILINE)
    return float(found.group(1)) if found else None


def test_the_supervisors_leadership_shows_in_one_childs_leader_gauge(procs: Processes, conn: Conn) -> None:
    """The supervisor leads and serves no metrics: were pgtick_leader only each child's own
    leadership, max(pgtick_leader) over the group would be 0 while a leader ticks, and the
    runbook's "nobody leads" alert would fire for good."""
    port = _two_free_ports()
    sup = procs.replica("work_app.py", "supervisor", "--processes", "2", "--metrics-port", str(port))
    _workers(sup, 2)
    leader = wait_for(
        "the supervisor to lead", lambda: scalar(conn, "SELECT owner FROM jobs.leader"), timeout=60
    )
    assert pid_of_owner(leader) == sup.pid, f"{leader} leads, not the supervisor (pid {sup.pid})"

    def gauges() -> list[float | None] | None:
        seen = [_leader_gauge(port), _leader_gauge(port + 1)]
        return seen if None not in seen and 1.0 in seen else None

    try:
        seen = wait_for("a child to report the group's leader", gauges, timeout=30)
    except AssertionError:
        raise AssertionError(
            f"leader {leader}: pgtick_leader on {port}, {port + 1}:"
            f" {[_leader_gauge(port), _leader_gauge(port + 1)]}\n{sup.tail()}"
        ) from None
    assert sorted(g or 0.0 for g in seen) == [0.0, 1.0], f"pgtick_leader on {port}, {port + 1}: {seen}"
