"""Optional Prometheus endpoint for ``pgtick run --metrics-port N``.

Counters and the start lateness histogram (``started_at - scheduled_for``,
per kind; per definition id too with ``per_definition``) come from this
process's worker; queue depth, oldest queued age, skipped and lost runs of the
last hour (jobs.queue_stats), scheduled occurrences due but not started
(jobs.schedule_backlog, an alert source), definitions whose runs cannot be
inserted (jobs.definition_summary), consecutive skips (jobs.definition_health, and
of the leases of ``pgtick lock``, jobs.leases) and the leader flag (jobs.leader) are
read from the database at scrape time, one query each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pgtick import calls
from pgtick.db import connect
from pgtick.errors import PgtickError
from pgtick.execution import one_line

log = logging.getLogger("pgtick.metrics")


class WorkerMetrics:
    """The worker's events as Prometheus series (a pgtick.worker listener)."""

    # Start lateness buckets, seconds: from a millisecond to a minute.
    LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60)

    def __init__(self, registry: CollectorRegistry, *, per_definition: bool = False) -> None:
        self.lateness = Histogram(
            "pgtick_start_lateness_seconds",
            "Start lateness of claimed runs (started_at - scheduled_for)",
            ["kind"],
            buckets=self.LATENESS_BUCKETS,
            registry=registry,
        )
        self.definition_lateness = (
            Histogram(
                "pgtick_definition_start_lateness_seconds",
                "Start lateness of claimed runs per definition id (started_at - scheduled_for)",
                ["definition_id"],
                buckets=self.LATENESS_BUCKETS,
                registry=registry,
            )
            if per_definition
            else None
        )
        self.started = Counter("pgtick_runs_started", "Runs claimed and started", ["kind"], registry=registry)
        self.finished = Counter(
            "pgtick_runs_finished", "Runs finished by this worker", ["kind", "outcome"], registry=registry
        )
        self.claim_seconds = Histogram(
            "pgtick_claim_seconds", "Latency of one jobs.claim call", registry=registry
        )
        self.heartbeat_failures = Counter(
            "pgtick_heartbeat_failures", "Heartbeat calls that failed", registry=registry
        )

    def on_claim(self, kinds: list[str], seconds: float) -> None:
        self.claim_seconds.observe(seconds)
        for kind in kinds:
            self.started.labels(kind).inc()

    def on_started(self, kind: str, definition_id: int | None, lateness: float) -> None:
        self.lateness.labels(kind).observe(max(0.0, lateness))
        if self.definition_lateness is not None and definition_id is not None:
            self.definition_lateness.labels(str(definition_id)).observe(max(0.0, lateness))

    def on_outcome(self, kind: str, outcome: str) -> None:
        self.finished.labels(kind, outcome).inc()

    def on_heartbeat_failure(self) -> None:
        self.heartbeat_failures.inc()


#: The gauges ``DatabaseCollector`` reads at scrape time: key, name, help text, labels.
DATABASE_GAUGES: tuple[tuple[str, str, str, list[str]], ...] = (
    ("depth", "pgtick_queue_depth", "Due QUEUED runs", ["kind"]),
    ("running", "pgtick_running", "RUNNING runs", ["kind"]),
    ("oldest", "pgtick_oldest_queued_seconds", "Age of the oldest due QUEUED run", ["kind"]),
    (
        "skipped",
        "pgtick_runs_skipped_last_hour",
        "Occurrences recorded as Skipped (overlap_policy skip) in the last hour",
        ["kind"],
    ),
    (
        "lost",
        "pgtick_runs_lost_last_hour",
        "Runs reaped as HeartbeatLost or Orphaned in the last hour",
        ["kind"],
    ),
    ("skips", "pgtick_consecutive_skips", "Occurrences skipped in a row", ["definition"]),
    (
        "lease_skips",
        "pgtick_lease_consecutive_skips",
        "Acquire attempts of a pgtick lock lease refused in a row",
        ["lease"],
    ),
    (
        "due",
        "pgtick_occurrences_due_not_started",
        "Schedule occurrences whose time has come that are still QUEUED",
        ["kind"],
    ),
    (
        "due_age",
        "pgtick_oldest_due_occurrence_seconds",
        "How late the oldest due but not started schedule occurrence is",
        ["kind"],
    ),
    (
        "failing",
        "pgtick_definitions_materialize_failing",
        "Definitions whose runs the database refused at the last attempt (backing off)",
        [],
    ),
    ("leader", "pgtick_leader", "1 if this process leads the scheduler", []),
)


class DatabaseCollector(Collector):
    """Queue depth, oldest queued age, skipped and lost runs, skips and the leader flag,
    read at scrape time.

    One scrape at a time reads the database, on a connection of its own: a scrape that finds
    another reading waits for it up to ``wait`` seconds, then is served without these gauges.
    So scrapes of a database that does not answer (a lock held by a migration, a stalled
    server) hold one connection per process, however often they come, not one each until
    max_connections locks the workers out."""

    def __init__(self, dsn: str, owner: str | None, *, wait: float = 5.0) -> None:
        self.dsn = dsn
        self.owner = owner
        self.wait = wait
        self._reading = threading.Lock()
        self._said: str | None = None  # the warning of the last failed read, said once

    def _warn(self, text: str | None) -> None:
        """Say why the gauges are left out once, not at every scrape of the same trouble (the
        repeats go to DEBUG); a read that succeeds again says so."""
        if text is None:
            if self._said is not None:
                log.info("metrics: the database gauges are back")
            self._said = None
        elif text != self._said:
            self._said = text
            log.warning("%s", text)
        else:
            log.debug("%s", text)

    def collect(self) -> Iterator[Any]:
        if not self._reading.acquire(timeout=self.wait):
            log.warning("metrics: the database did not answer the previous scrape yet: its gauges left out")
            return
        try:
            yield from self._read()
        finally:
            self._reading.release()

    def _read(self) -> Iterator[Any]:
        gauge = {
            key: GaugeMetricFamily(name, documentation, labels=labels)
            for key, name, documentation, labels in DATABASE_GAUGES
        }
        try:
            with connect(self.dsn, application_name="pgtick-metrics") as conn:
                for kind, queued, run, age, skipped_1h, lost_1h in calls.queue_metrics(conn):
                    gauge["depth"].add_metric([kind], queued)
                    gauge["running"].add_metric([kind], run)
                    gauge["oldest"].add_metric([kind], float(age or 0))
                    gauge["skipped"].add_metric([kind], skipped_1h)
                    gauge["lost"].add_metric([kind], lost_1h)
                for name, count in calls.definition_skips(conn):
                    gauge["skips"].add_metric([name], count)
                for name, count in calls.lease_skips(conn):
                    gauge["lease_skips"].add_metric([name], count)
                for kind, count, age in calls.schedule_backlog(conn):
                    gauge["due"].add_metric([kind], count)
                    gauge["due_age"].add_metric([kind], float(age or 0))
                gauge["failing"].add_metric([], calls.materialize_failing(conn))
                gauge["leader"].add_metric([], 1.0 if calls.leads(conn, self.owner or "") else 0.0)
        except psycopg.errors.InsufficientPrivilege as exc:
            # A login that may not read the views (a worker-only login): the database is up,
            # and no retry helps; say what does.
            self._warn(
                f"metrics: {exc.diag.message_primary or one_line(exc)}: the database gauges are"
                " left out (the login needs jobs_reader: GRANT jobs_reader TO it)"
            )
            return
        except Exception as exc:
            self._warn(f"metrics: database unavailable: {one_line(exc)}")
            return
        self._warn(None)
        yield from gauge.values()


def serve_metrics(
    port: int, dsn: str, owner: str | None, *, per_definition: bool = False, bind: str = "0.0.0.0"
) -> tuple[WorkerMetrics, Any]:
    """Start the HTTP endpoint on ``bind`` (every interface by default: the series name kinds,
    queues, definitions and leases to whoever reaches the port); returns the worker listener
    and the server."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, per_definition=per_definition)
    registry.register(DatabaseCollector(dsn, owner))
    try:
        server, thread = start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:  # the port is taken, the address not this machine's, or not ours
        where = f"metrics port {port}" if bind == "0.0.0.0" else f"--metrics-bind {bind} port {port}"
        raise PgtickError(f"{where}: cannot listen: {exc.strerror or exc}") from None
    log.info("metrics on http://%s/metrics", _host_port(bind, port))
    return metrics, (server, thread)


def _host_port(bind: str, port: int) -> str:
    return f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"
