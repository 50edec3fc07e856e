"""The Prometheus endpoint of `pgtick run --metrics-port`: a real process runs real jobs, the
test scrapes /metrics and checks the series and their values."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import APPS, PGTICK, ROOT, Conn, Database, enqueue, free_port, scalar, stop_process, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"series {key} appears twice (Prometheus keeps one at random)"
            samples[key] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_endpoint_reports_runs_queue_and_leader(db: Database, conn: Conn, tmp_path: Path) -> None:
    for _ in range(3):
        enqueue(conn, "ops-ok")
    enqueue(conn, "ops-fail")
    # Nobody in this process runs "ops-nobody": its runs stay queued, two minutes old, one of
    # them in another queue (the gauges are by kind: one series, the sum).
    enqueue(conn, "ops-nobody", run_at="now() - interval '2 minutes'")
    enqueue(conn, "ops-nobody", run_at="now() - interval '2 minutes'", queue="'other'")

    port = free_port()
    log = tmp_path / "pgtick-run.log"
    args = [
        *PGTICK,
        *("run", str(APPS / "metrics_app.py"), "--dsn", db.dsn, "--metrics-port", str(port)),
        *("--tick", "0.2s", "--poll", "0.2s", "--heartbeat", "0.3s", "--grace", "5s"),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=ROOT, env=env, start_new_session=True
        )

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:]

    try:

        def settled() -> bool:
            assert proc.poll() is None, f"pgtick run exited {proc.returncode}:\n{tail()}"
            return bool(
                scalar(
                    conn,
                    "SELECT count(*) FILTER (WHERE status = 'COMPLETED') = 3"
                    " AND count(*) FILTER (WHERE status = 'FAILED') = 1"
                    " FROM jobs.runs WHERE kind IN ('ops-ok', 'ops-fail')",
                )
            )

        wait_for("the four runs to finish", settled, timeout=60)

        def scraped_as_leader() -> Samples | None:
            assert proc.poll() is None, f"pgtick run exited {proc.returncode}:\n{tail()}"
            try:
                samples = scrape(port)
            except OSError:
                return None
            return samples if value(samples, "pgtick_leader") == 1 else None

        scraped = wait_for("a scrape that shows this process leading", scraped_as_leader, timeout=60)
        assert scraped is not None
        samples = scraped

        started = {k: value(samples, "pgtick_runs_started_total", kind=k) for k in ("ops-ok", "ops-fail")}
        assert started == {"ops-ok": 3, "ops-fail": 1}, samples
        assert value(samples, "pgtick_runs_finished_total", kind="ops-ok", outcome="complete") == 3
        assert value(samples, "pgtick_runs_finished_total", kind="ops-fail", outcome="fail") == 1
        assert value(samples, "pgtick_runs_started_total", kind="ops-nobody") is None, "never claimed"

        assert value(samples, "pgtick_queue_depth", kind="ops-nobody") == 2
        oldest = value(samples, "pgtick_oldest_queued_seconds", kind="ops-nobody")
        assert oldest is not None and 120 <= oldest < 600
        assert value(samples, "pgtick_running", kind="ops-nobody") == 0
        assert value(samples, "pgtick_runs_lost_last_hour", kind="ops-fail") == 0
        assert value(samples, "pgtick_runs_skipped_last_hour", kind="ops-ok") == 0

        claims = value(samples, "pgtick_claim_seconds_count")
        assert claims is not None and claims >= 1
        assert value(samples, "pgtick_heartbeat_failures_total") == 0
        assert (
            scalar(conn, "SELECT count(*) FROM jobs.runs WHERE kind = 'ops-nobody' AND status = 'QUEUED'")
            == 2
        )

        # A clean stop: SIGTERM drains (nothing in flight) and exits 0, resigning the lead.
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == 0, tail()
        assert scalar(conn, "SELECT count(*) FROM jobs.leader") == 0
    finally:
        _kill_group(proc)


def _start(db: Database, port: int, log: Path) -> subprocess.Popen[Any]:
    """`pgtick run` of the metrics app with the endpoint on ``port``, its stderr in ``log``."""
    args = [
        *PGTICK,
        *("run", str(APPS / "metrics_app.py"), "--dsn", db.dsn, "--metrics-port", str(port)),
        *("--tick", "0.2s", "--poll", "0.2s", "--heartbeat", "0.3s", "--grace", "5s"),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env["PGTICK_LOG"] = "INFO"
    with log.open("wb") as stderr:
        return subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=ROOT, env=env, start_new_session=True
        )


def test_a_run_its_worker_fails_past_its_timeout_counts_as_failed(
    db: Database, conn: Conn, tmp_path: Path
) -> None:
    """A job that blocks past its kind's timeout with no checkpoint is failed as Timeout by its
    worker: pgtick_runs_finished_total counts it once, as `fail` (when the worker fails it,
    not when the job returns, which may be never), and the log says FAILED, not that the run
    was lost to the reaper or another worker."""
    hung = enqueue(conn, "ops-hang", '{"seconds": 4}')
    never = enqueue(conn, "ops-hang", '{"seconds": 3600}')
    port = free_port()
    log = tmp_path / "pgtick-run.log"
    proc = _start(db, port, log)
    try:

        def failed_and_counted() -> Samples | None:
            assert proc.poll() is None, f"pgtick run exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            if (
                scalar(
                    conn,
                    "SELECT count(*) FROM jobs.runs WHERE kind = 'ops-hang' AND failure_reason = 'Timeout'",
                )
                < 2
            ):
                return None
            try:
                samples = scrape(port)
            except OSError:
                return None
            return (
                samples
                if value(samples, "pgtick_runs_finished_total", kind="ops-hang", outcome="fail")
                else None
            )

        samples = wait_for("both runs failed as Timeout and counted", failed_and_counted, timeout=60)
        assert value(samples, "pgtick_runs_finished_total", kind="ops-hang", outcome="fail") == 2, samples

        def returned() -> bool:
            return f"run={hung} " in log.read_text() and "result not reported" in log.read_text()

        wait_for("the job that returns late to return", returned, timeout=30)
        samples = scrape(port)
        assert value(samples, "pgtick_runs_finished_total", kind="ops-hang", outcome="fail") == 2, samples
        assert value(samples, "pgtick_runs_finished_total", kind="ops-hang", outcome="abandon") is None, (
            samples
        )
        text = log.read_text()
        for run in (hung, never):
            assert f"run={run} kind=ops-hang definition=- status=FAILED" in text, text
        assert "no longer ours" not in text, text
    finally:
        _kill_group(proc)


def test_scrapes_of_a_stalled_database_hold_one_connection(db: Database, conn: Conn) -> None:
    """While the database does not answer (here: jobs.runs locked by a migration), scrapes that
    keep coming (a short scrape interval, two Prometheus servers) do not each open a connection
    that waits on the lock: they would pile up to max_connections and lock the workers out. One
    scrape reads the database; the others return within the collector's wait, without the
    database's gauges, and the process's own series are still served."""
    import threading

    from prometheus_client import CollectorRegistry, generate_latest

    from pgtick.metrics import DatabaseCollector, WorkerMetrics

    registry = CollectorRegistry()
    WorkerMetrics(registry)
    collector = DatabaseCollector(db.dsn, "nobody", wait=0.5)
    registry.register(collector)
    scraped: list[str] = []

    def scrape_once() -> None:
        scraped.append(generate_latest(registry).decode())

    def reading() -> int:
        return int(
            scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtick-metrics'")
        )

    threads = [threading.Thread(target=scrape_once, daemon=True) for _ in range(8)]
    with db.connect(autocommit=False) as locker:
        locker.execute("LOCK TABLE jobs.runs IN ACCESS EXCLUSIVE MODE")
        for t in threads:
            t.start()
        wait_for("all but one scrape to return while the database is stalled", lambda: len(scraped) >= 7, 60)
        assert reading() == 1, "each stalled scrape holds a connection of its own"
        assert all("pgtick_claim_seconds_count" in text for text in scraped), scraped[0]
        assert not any("pgtick_queue_depth" in text for text in scraped[:7]), scraped[0]
        locker.rollback()
    for t in threads:
        t.join(60)
    assert len(scraped) == 8
    assert "pgtick_leader 0.0" in scraped[-1], scraped[-1]
    wait_for("the metrics connection to be closed", lambda: reading() == 0, 30)


def test_lease_skips_are_served_and_a_standby_scheduler_raises_no_skip_alert(
    db: Database, conn: Conn
) -> None:
    """docs/operations.md's consecutive-skips alert covers `pgtick lock` wrappers that keep
    finding their lease held, in SQL and in Prometheus. The scheduler's own lease (lease mode,
    behind PgBouncer) is not such a wrapper: a standby counts a refused acquire every tick, and
    neither the series nor the runbook's query may page for a healthy standby."""
    import re

    from prometheus_client import CollectorRegistry, generate_latest

    from pgtick.metrics import DatabaseCollector

    conn.execute("SELECT jobs.acquire_lease('pgtick:leader', 'replica-a', '1 minute')")
    conn.execute("SELECT jobs.acquire_lease('nightly-backup', 'host-1', '1 hour')")
    for _ in range(4):
        conn.execute("SELECT jobs.acquire_lease('pgtick:leader', 'replica-b', '1 minute')")
        conn.execute("SELECT jobs.acquire_lease('nightly-backup', 'host-2', '1 hour')")
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(db.dsn, "replica-a"))
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert value(samples, "pgtick_lease_consecutive_skips", lease="nightly-backup") == 4, samples
    assert value(samples, "pgtick_lease_consecutive_skips", lease="pgtick:leader") is None, samples

    runbook = (ROOT / "docs" / "operations.md").read_text()
    section = runbook[runbook.index("**Consecutive skips**") :]
    assert "pgtick_lease_consecutive_skips >= 3" in section.split("```")[0], section[:600]
    query = section.split("```sql")[1].split("```")[0]
    rows = conn.execute(query).fetchall()
    assert [tuple(r)[:2] for r in rows] == [("lease", "nightly-backup")], rows
    assert not re.search(r"pgtick:leader", str(rows))


def test_connections_cut_under_a_worker_log_one_line_each_and_counters_keep_counting(
    db: Database, conn: Conn, tmp_path: Path
) -> None:
    """The server ends every connection of a running `pgtick run` (a failover, an operator's
    pg_terminate_backend): each warning the process logs about it is one line that starts with
    its time and level (libpq's two-line 'server closed the connection unexpectedly' would
    otherwise leave a line a log shipper takes for an event of its own), and the counters of
    the metrics endpoint go on from where they were."""
    import functools
    import re

    port = free_port()
    log = tmp_path / "pgtick-run.log"
    proc = _start(db, port, log)
    try:
        for _ in range(3):
            enqueue(conn, "ops-ok")

        def counted(n: int) -> Samples | None:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                samples = scrape(port)
            except OSError:
                return None
            done = value(samples, "pgtick_runs_finished_total", kind="ops-ok", outcome="complete")
            return samples if done == n else None

        wait_for("three runs counted", lambda: counted(3), timeout=60)
        for cut in range(3):

            def cut_all() -> bool:
                return bool(
                    scalar(
                        conn,
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND application_name LIKE 'pgtick-%%'"
                        " AND application_name <> 'pgtick-metrics'",
                    )
                )

            wait_for("the process's connections (back after the last cut)", cut_all, timeout=60)
            enqueue(conn, "ops-ok")
            wait_for(f"run {4 + cut} counted after the cut", functools.partial(counted, 4 + cut), timeout=90)
        text = log.read_text()
        assert "WARNING" in text, text
        stamped = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+ ")
        loose = [line for line in text.splitlines() if not stamped.match(line)]
        assert not loose, f"lines that are no event of their own: {loose}\n{text}"
    finally:
        _kill_group(proc)


def test_the_no_leader_alert_fires_when_no_process_reports_a_leader_flag(tmp_path: Path) -> None:
    """pgtick_leader is read from the database at scrape time: while the database cannot be
    reached a scrape has no such series, and when every pgtick process is down there is none
    to scrape. Nobody leads then either, so the runbook's Prometheus rule for "Nobody leads"
    must fire on the series' absence, not only on max(pgtick_leader) == 0 (an empty result)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pgtick.metrics import DatabaseCollector, WorkerMetrics

    registry = CollectorRegistry()
    WorkerMetrics(registry)
    unreachable = f"postgresql://nobody@127.0.0.1:{free_port()}/none?connect_timeout=5"
    registry.register(DatabaseCollector(unreachable, "nobody"))
    text = generate_latest(registry).decode()
    assert "pgtick_claim_seconds_count" in text and "pgtick_leader" not in text, text

    runbook = (ROOT / "docs" / "operations.md").read_text()
    section = runbook[runbook.index("**Nobody leads**") :].split("```")[0]
    assert "max(pgtick_leader) == 0" in section and "absent(pgtick_leader)" in section, section


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    stop_process(proc)


def test_lateness_histogram_due_occurrences_and_failing_definitions(db: Database, conn: Conn) -> None:
    """Start lateness is a histogram per kind (and per definition id when asked); occurrences
    due but not started and definitions whose runs were refused are gauges read at scrape."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pgtick.metrics import DatabaseCollector, WorkerMetrics

    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, per_definition=True)
    registry.register(DatabaseCollector(db.dsn, "nobody"))
    for late in (0.004, 0.004, 3.0):
        metrics.on_started("tick", 7, late)
    definition = scalar(conn, "SELECT id FROM jobs.define('minutely', 'tick', schedule => '* * * * *')")
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for)"
        " VALUES (%s, 'tick', 'schedule', now() - interval '90 seconds')",
        (definition,),
    )
    conn.execute("UPDATE jobs.definitions SET materialize_error = 'refused (SQLSTATE P0001)'")
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert value(samples, "pgtick_start_lateness_seconds_count", kind="tick") == 3
    assert value(samples, "pgtick_start_lateness_seconds_bucket", kind="tick", le="0.005") == 2
    assert value(samples, "pgtick_definition_start_lateness_seconds_count", definition_id="7") == 3
    assert value(samples, "pgtick_occurrences_due_not_started", kind="tick") == 1
    oldest = value(samples, "pgtick_oldest_due_occurrence_seconds", kind="tick")
    assert oldest is not None and 90 <= oldest < 600
    assert value(samples, "pgtick_definitions_materialize_failing") == 1


def test_a_metrics_port_in_use_is_one_line_and_exit_1(db: Database) -> None:
    """Another process holds the port: `pgtick run` says so in one line and exits 1."""
    import socket

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
        result = subprocess.run(
            [*PGTICK, "run", str(APPS / "metrics_app.py"), "--dsn", db.dsn, "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )
    shown = f"exit {result.returncode}\nstderr: {result.stderr[-2000:]}"
    assert result.returncode == 1, shown
    assert "Traceback" not in result.stderr, shown
    assert result.stderr.splitlines() == [
        f"pgtick run: error: metrics port {port}: cannot listen: Address already in use"
    ], shown


def test_metrics_bind_keeps_the_endpoint_to_the_address_given(db: Database) -> None:
    """The series name kinds, queues, definitions and leases to whoever reaches the port:
    ``--metrics-bind 127.0.0.1`` listens on the loopback alone, not on every interface, and
    an address that is not this machine's is one readable line, exit 1."""
    from pgtick.metrics import serve_metrics

    _, (server, _thread) = serve_metrics(0, db.dsn, None, bind="127.0.0.1")
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1", f"listening on {host}, not the loopback alone"
        assert value(scrape(port), "pgtick_heartbeat_failures_total") == 0.0
    finally:
        server.shutdown()
        server.server_close()

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    result = subprocess.run(
        [
            *PGTICK,
            *("run", str(APPS / "metrics_app.py"), "--dsn", db.dsn),
            *("--metrics-port", "0", "--metrics-bind", "192.0.2.1"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    shown = f"exit {result.returncode}\nstderr: {result.stderr[-2000:]}"
    assert result.returncode == 1, shown
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "pgtick run: error: --metrics-bind 192.0.2.1 port 0: cannot listen: "
    ), shown


def test_a_login_that_may_not_read_the_views_is_told_once_what_it_lacks(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """`--metrics-port` with a worker-only login: the database is up, but the login may not read
    the views the gauges come from. The warning says so and what to grant, not that the
    database is unavailable, and once, not at every scrape; the counters are still served."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pgtick.metrics import DatabaseCollector, WorkerMetrics

    with db.worker_login("metrics") as login:
        registry = CollectorRegistry()
        WorkerMetrics(registry)
        registry.register(DatabaseCollector(db.dsn_as(login), login))
        with caplog.at_level(logging.DEBUG, logger="pgtick.metrics"):
            texts = [generate_latest(registry).decode() for _ in range(3)]
    for text in texts:
        assert "pgtick_claim_seconds_count" in text and "pgtick_queue_depth" not in text, text
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "permission denied" in warnings[0] and "GRANT jobs_reader" in warnings[0], warnings
    assert "unavailable" not in warnings[0], warnings
