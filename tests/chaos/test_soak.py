"""Chaos soak: three `pgtick run` processes, ~50 definitions and a stream of
ad-hoc runs, while faults are injected at random — kill -9 of workers,
SIGSTOP/SIGCONT of the leader (with its session terminated: two leaders at
once), restarts of PostgreSQL itself, and dropped connections — and, alongside
them, bad values and changes: poison outcomes (results and errors the database
refuses), hung jobs (no checkpoint, a short timeout), absurd configuration
values, and schedule changes (equivalent texts, genuinely new schedules,
jitters changed with and without them, one-shots moved back and forth). Then a
full accounting from the database proves the invariants of DESIGN.md; scheduled
runs are accounted by the occurrence each records, whatever its jittered start.

CI runs a short soak (PGTICK_SOAK_SECONDS, default 40); a long one is
`PGTICK_SOAK_SECONDS=1800 pytest -m chaos -s`. PGTICK_SOAK_REPORT=path writes
the figures as JSON (docs/reliability.md quotes them).
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import APPS
from pgtick import migrate
from pgtick.db import connect_dicts
from pgtick.embedded import EmbeddedPostgres
from pgtick.errors import PgtickError
from pgtick.schedule.occurrences import parse_schedule
from pgtick.schedule.plan import anchor_for, first_cursor


def _soak_app_poison() -> list[str]:
    """The poison variants the soak app knows (its module loaded from its file)."""
    spec = importlib.util.spec_from_file_location("chaos_soak_app", APPS / "soak_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(module.POISON)


POISON = _soak_app_poison()

SOAK_SECONDS = float(os.environ.get("PGTICK_SOAK_SECONDS", "40"))
#: The families of bad values and changes injected besides the process and database
#: faults (all by default; name fewer to see one family's effect alone).
FAMILIES = set(os.environ.get("PGTICK_SOAK_FAMILIES", "poison,hung,absurd,schedules,history").split(","))
TICK = 0.3
HEARTBEAT_TIMEOUT = 2.0
HUNG_TIMEOUT = 2.0  # seconds; the hung kind blocks for soak_app.HANG_SECONDS
SETTLE_RUNS = 72  # the work every replica is offered at the end (1 s each)
SETTLE_DEADLINE = 120.0  # seconds to work the backlog off once the faults stop
SETTLE_MOST = 900.0  # and at most this long while runs go on finishing
HUGE = "100000000 years"  # a valid PostgreSQL interval, beyond Python's timedelta and any timestamp
INFINITE = float("inf")

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SOAK_SECONDS + 600)]


def _try(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
    """Run one statement on a fresh connection; None if the database is unavailable."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []
    except psycopg.Error:
        return None


def _pid_of(worker_id: str) -> int:
    # worker and leader ids are host-PID-random (pgtick.identity.new_worker_id)
    return int(worker_id.rsplit("-", 2)[1])


def _tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


class Fleet:
    """The three `pgtick run` replicas, restartable. Knows which replicas the soak
    disturbed (kill -9, SIGSTOP) and which ended by themselves."""

    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn = dsn
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_of: dict[int, Path] = {}
        self.started = 0
        self.killed: set[int] = set()
        self.exited: list[dict[str, Any]] = []  # replicas that ended without being told to
        self.failed_starts: list[dict[str, Any]] = []  # could not start (database down meanwhile)

    def spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        path = self.logs / f"replica-{self.started}.log"
        log = open(path, "wb")
        env = dict(os.environ, CHAOS_DSN=self.dsn, PGTICK_LOG="INFO")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgtick.cli",
                "run",
                str(APPS / "soak_app.py"),
                "--dsn",
                self.dsn,
                "--tick",
                f"{TICK}s",
                "--poll",
                "0.5s",
                "--heartbeat",
                "0.3s",
                "--grace",
                "2s",
                "--concurrency",
                "6",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.procs.append(proc)
        self.log_of[proc.pid] = path
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.killed.add(proc.pid)
        proc.kill()
        proc.wait()

    def keep(self, replicas: int = 3) -> None:
        """Note replicas that ended by themselves, and bring the fleet back to size."""
        for p in self.procs:
            if p.returncode is None and p.poll() is not None and p.pid not in self.killed:
                self.killed.add(p.pid)  # noted once
                log = self.log_of[p.pid].read_text(errors="replace")
                ended = {"pid": p.pid, "exit_code": p.returncode, "log_tail": _tail(self.log_of[p.pid])}
                if p.returncode != 0 and " started kinds=" not in log:
                    self.failed_starts.append(ended)  # said so and exited non-zero: a supervisor retries
                else:
                    self.exited.append(ended)
        while len(self.alive()) < replicas:
            self.spawn()

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def by_pid(self, pid: int) -> subprocess.Popen[bytes] | None:
        return next((p for p in self.alive() if p.pid == pid), None)

    def stop(self) -> None:
        for p in self.alive():
            self.killed.add(p.pid)
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _leader_pid(dsn: str) -> int | None:
    rows = _try(dsn, "SELECT owner, pid FROM jobs.leader")
    if not rows or rows[0][0] is None:
        return None
    return _pid_of(str(rows[0][0]))


class Ledger:
    """Every run the soak enqueues, by idempotency key: the id it got back, or None when
    the call failed (then the key tells whether it was committed after all)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.lock = threading.Lock()
        self.entries: list[tuple[str, str, int | None]] = []  # (kind, key, run id)
        self.seq = itertools.count()

    def enqueue(self, kind: str, payload: dict[str, Any] | None = None, **options: Any) -> int | None:
        key = f"soak-{next(self.seq)}"
        names = "".join(f", {name} => %s" for name in options)
        rows = _try(
            self.dsn,
            f"SELECT (jobs.enqueue(%s, %s, idempotency_key => %s{names})).id",
            (kind, json.dumps(payload or {}), key, *options.values()),
        )
        run_id = int(rows[0][0]) if rows else None
        with self.lock:
            self.entries.append((kind, key, run_id))
        return run_id


# -- schedules and their equivalent texts ----------------------------------------------

RRULE_FORMS = (
    "FREQ=SECONDLY;INTERVAL={p}",
    "INTERVAL={p};FREQ=SECONDLY",
    "FREQ=SECONDLY;WKST=MO;INTERVAL={p}",
    "freq=secondly;interval={p}",
    "RRULE:FREQ=SECONDLY;INTERVAL={p}",
    " FREQ=SECONDLY ; INTERVAL={p} ",
)
CRON_MINUTELY = ("* * * * *", "*/1 * * * *", "0-59 * * * *", "* */1 * * *", "* * * * 0-6")
#: The jitters a jittered definition moves between (None: none), all under a second.
JITTERS = (None, timedelta(milliseconds=250), timedelta(milliseconds=500), timedelta(milliseconds=900))


def _texts(period: int) -> list[str]:
    """Texts that all mean 'every `period` seconds from local midnight'."""
    if period == 60:
        return list(CRON_MINUTELY)
    texts = [form.format(p=period) for form in RRULE_FORMS]
    return [*texts, "FREQ=SECONDLY"] if period == 1 else texts


def _check_equivalent(zone: str, created_at: datetime) -> None:
    """The soak's premise: each family of texts gives the same instants (if not, a
    'cosmetic' change would be a real one and its accounting wrong)."""
    anchor = anchor_for(created_at, zone)
    for period in (1, 2, 3, 4, 5, 60):
        seen = set()
        for text in _texts(period):
            schedule = parse_schedule(text, zone, anchor=anchor)
            start = first_cursor(schedule, created_at)
            assert start is not None, text
            it = schedule.occurrences(start, inclusive=True)
            seen.add(tuple(o.at for o in itertools.islice(it, 5)))
        assert len(seen) == 1, f"not equivalent in {zone}: {_texts(period)} -> {seen}"


@dataclass
class Definition:
    """A recurring definition and the schedules it had: (defined at, period, text)."""

    id: int
    name: str
    zone: str
    anchor: datetime
    options: dict[str, Any]
    history: list[tuple[datetime, int, str]]
    cap: Any = None
    uncertain: bool = False  # a re-define whose outcome could not be read back
    # For each change, keyed by its updated_at (its transaction's start): the database clock
    # when it was read back committed, an upper bound on its commit.
    committed_by: dict[datetime, datetime] = field(default_factory=dict)

    @property
    def period(self) -> int:
        return self.history[-1][1]


@dataclass
class OneShot:
    """A one-shot definition moved between two times: (defined at, run_at) per define."""

    name: str
    times: tuple[datetime, datetime]
    history: list[tuple[datetime, datetime]] = field(default_factory=list)
    uncertain: bool = False


def _define(dsn: str, name: str, kind: str, zone: str, schedule: str | None, **options: Any) -> bool:
    names = "".join(f", {k} => %s" for k in options)
    rows = _try(
        dsn,
        f"SELECT id FROM jobs.define(name => %s, kind => %s, schedule => %s, timezone => %s{names})",
        (name, kind, schedule, zone, *options.values()),
    )
    return rows is not None


def _read_back(dsn: str, name: str) -> tuple[str | None, datetime | None, datetime, datetime] | None:
    """The definition as stored (schedule, run_at, updated_at) and the database clock when it
    was read, by which its last change had committed; waiting out an outage."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = _try(
            dsn,
            "SELECT schedule, run_at, updated_at, clock_timestamp() FROM jobs.definitions WHERE name = %s",
            (name,),
        )
        if rows:
            return rows[0][0], rows[0][1], rows[0][2], rows[0][3]
        time.sleep(0.5)
    return None


def _setup(dsn: str) -> list[Definition]:
    """Schema, the executions table, short timeouts and ~50 definitions."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.apply(conn)
        conn.execute(
            """
            CREATE SCHEMA chaos;
            CREATE TABLE chaos.executions (
                run_id bigint, definition_id bigint, kind text, attempt int, pid int,
                entered timestamptz NOT NULL DEFAULT clock_timestamp(), exited timestamptz);
            CREATE TABLE chaos.cap_violations (
                seen_at timestamptz DEFAULT clock_timestamp(), definition_id bigint,
                running bigint, cap int);
            """
        )
        conn.execute(
            "UPDATE jobs.config SET heartbeat_timeout = %s, orphan_timeout = '6 seconds'",
            (f"{HEARTBEAT_TIMEOUT} seconds",),
        )
        specs: list[tuple[str, str, int, str, dict[str, Any]]] = []
        for i in range(50):
            kind = rng.choice(["quick", "quick", "flaky", "long"])
            interval = rng.randint(1, 5)
            cap = rng.choice([1, 2, 3, None])
            overlap = "skip" if (cap and rng.random() < 0.3) else "queue"
            zone = rng.choice(["UTC", "Europe/Sofia", "America/New_York", "Australia/Lord_Howe"])
            options: dict[str, Any] = {"max_concurrent_runs": cap, "overlap_policy": overlap}
            if rng.random() < 0.4:  # delayed runs: below the spacing of every period used here
                options["jitter"] = rng.choice(JITTERS[1:])
            specs.append((f"chaos-{i}", kind, interval, zone, options))
        # Minutely cron (equivalent texts swap during the soak), and a capped definition
        # whose every run hangs past its timeout: only the server's timeout frees the cap.
        specs.append(("chaos-cron-0", "quick", 60, "UTC", {}))
        specs.append(("chaos-cron-1", "quick", 60, "Asia/Kolkata", {}))
        hung = {"max_concurrent_runs": 1, "max_attempts": 1, "timeout": timedelta(seconds=HUNG_TIMEOUT)}
        if "hung" in FAMILIES:
            specs.append(("chaos-hung", "hung", 20, "UTC", hung))
        definitions = []
        for name, kind, period, zone, options in specs:
            text = _texts(period)[0]
            names = "".join(f", {k} => %s" for k in options)
            row = conn.execute(
                f"SELECT id, updated_at, created_at FROM jobs.define(%s, %s, %s, %s{names})",
                (name, kind, text, zone, *options.values()),
            ).fetchone()
            assert row is not None
            definitions.append(
                Definition(
                    id=int(row[0]),
                    name=name,
                    zone=zone,
                    anchor=anchor_for(row[2], zone),
                    options={"kind": kind, **options},
                    history=[(row[1], period, text)],
                    cap=options.get("max_concurrent_runs"),
                )
            )
            _check_equivalent(zone, row[2])
    return definitions


# -- absurd values: each written inside a transaction that is rolled back ----------------

#: (what, statements): the write under test; when accepted, the soak goes on to claim,
#: heartbeat, fail, reap and prune in the same transaction, as a worker and the leader would.
ABSURD: list[tuple[str, list[tuple[str, tuple[Any, ...]]]]] = [
    ("control: nothing absurd", [("SELECT 1", ())]),
]
ABSURD += [
    (f"config.{column} = {value}", [(f"UPDATE jobs.config SET {column} = %s", (value,))])
    for column, value in [
        ("heartbeat_timeout", HUGE),
        ("heartbeat_timeout", "-1 second"),
        ("orphan_timeout", HUGE),
        ("orphan_timeout", "0"),
        ("retention", HUGE),
        ("backoff_initial", HUGE),
        ("backoff_max", HUGE),
        ("max_attempts", "2147483647"),
        ("max_attempts", "-1"),
        ("max_payload_bytes", "-1"),
    ]
]
ABSURD += [
    (
        f"enqueue {option} => {value}",
        [(f"SELECT (jobs.enqueue('soak-probe', '{{}}', {option} => %s::{cast})).id", (value,))],
    )
    for option, value, cast in [
        ("timeout", HUGE, "interval"),
        ("timeout", "3000000 years", "interval"),
        ("timeout", "-1 second", "interval"),
        ("heartbeat_timeout", HUGE, "interval"),
        ("heartbeat_timeout", "3000000 years", "interval"),
        ("max_attempts", "-1", "integer"),
        ("max_attempts", "2147483647", "integer"),
        ("priority", "2147483647", "integer"),
        ("run_at", "infinity", "timestamptz"),
        ("run_at", "294276-12-31 00:00:00+00", "timestamptz"),
    ]
]
ABSURD += [
    (
        "enqueue payload nested 5,000 deep",
        [("SELECT (jobs.enqueue('soak-probe', %s::jsonb)).id", ('{"a":' * 5000 + "1" + "}" * 5000,))],
    ),
]
ABSURD += [
    (
        f"define {option} => {value}",
        [
            (
                f"SELECT (jobs.define('soak-probe-def', 'soak-probe', 'FREQ=SECONDLY',"
                f" {option} => %s::{cast})).id",
                (value,),
            ),
            ("SELECT (jobs.run_now('soak-probe-def')).id", ()),
        ],
    )
    for option, value, cast in [
        ("timeout", HUGE, "interval"),
        ("heartbeat_timeout", HUGE, "interval"),
        ("jitter", HUGE, "interval"),
        ("max_attempts", "0", "integer"),
        ("max_concurrent_runs", "2147483647", "integer"),
        ("pause_after_failures", "-1", "integer"),
    ]
]
#: Schedules the database may accept as text: then the leader has to cope, live.
ABSURD_SCHEDULES = [
    "FREQ=SECONDLY;INTERVAL=0",
    "FREQ=SECONDLY;INTERVAL=-1",
    "FREQ=SECONDLY;INTERVAL=2147483648",
    "FREQ=SECONDLY;INTERVAL=99999999999999999999",
    "FREQ=YEARLY;INTERVAL=100000",
    "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
    "FREQ=SECONDLY;UNTIL=99991231T235959Z",
    "FREQ=SECONDLY;COUNT=2147483647",
    "*/0 * * * *",
    "0 0 30 2 *",
    "99 99 99 99 99",
]
#: SQLSTATEs that say 'not a database error but the connection': the probe is inconclusive.
_INCONCLUSIVE = {
    "08000",
    "08003",
    "08006",
    "57P01",
    "57P02",
    "57P03",
    "57014",
    "42883",
    "25P02",
    "40001",
    "40P01",
    "55P03",
}


#: What a worker and the leader do with a run, each step read with the driver's loaders.
_PROBE_STAGES = [
    (
        "claim",
        "SELECT * FROM jobs.claim(batch_size => 10, worker => %(worker)s, kinds => ARRAY['soak-probe'],"
        " heartbeat => false)",
    ),
    ("heartbeat", "SELECT * FROM jobs.heartbeat(%(first)s::bigint[], %(worker)s)"),
    ("next_due", "SELECT * FROM jobs.next_due(ARRAY['soak-probe'])"),
    ("reap", "SELECT * FROM jobs.reap()"),
    ("prune", "SELECT jobs.prune(NULL, 100)"),
    (
        "fail",
        "SELECT (f).id, (f).status::text FROM jobs.fail(run_id => %(last)s, worker => %(worker)s,"
        " error_classes => ARRAY['ProbeError'], message => 'probe') AS f",
    ),
]


def _first_line(exc: BaseException) -> str:
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}{f' {sqlstate}' if sqlstate else ''}: {str(exc).splitlines()[0][:200]}"


def _probe_absurd(dsn: str, writes: list[tuple[str, tuple[Any, ...]]]) -> tuple[str, Any]:
    """('refused', sqlstate) | ('accepted', None) | ('breaks', [(stage, error)]) | ('inconclusive', error)."""
    worker = f"soak-probe-{socket.gethostname()}-0-{random.randrange(10**6)}"
    try:
        conn = connect_dicts(dsn, application_name="soak-probe")  # the driver's own type loaders
    except (psycopg.Error, PgtickError) as exc:  # the database is down (restart_pg)
        return "inconclusive", str(exc)
    breaks: list[tuple[str, str]] = []
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL statement_timeout = '20s'")
            try:
                with conn.transaction():
                    for sql, params in writes:
                        conn.execute(sql, params)
            except psycopg.Error as exc:
                if exc.sqlstate is None or exc.sqlstate in _INCONCLUSIVE or conn.broken:
                    return "inconclusive", repr(exc)
                return "refused", exc.sqlstate
            # Three more runs: one heartbeated, one never (orphan sweep), one failed last.
            conn.execute("SELECT count(jobs.enqueue('soak-probe')) FROM generate_series(1, 3)")
            args: dict[str, Any] = {"worker": worker, "first": [], "last": None}
            for stage, sql in _PROBE_STAGES:
                if stage == "fail" and args["last"] is None:
                    continue
                try:
                    with conn.transaction():
                        cur = conn.execute(sql, args)
                        try:
                            cur.fetchall()
                        except Exception as exc:  # the server did it; the driver cannot read it
                            if isinstance(exc, psycopg.Error) and exc.sqlstate is not None:
                                raise
                            breaks.append((stage, _first_line(exc)))
                except psycopg.Error as exc:
                    if exc.sqlstate in _INCONCLUSIVE or conn.broken:
                        return "inconclusive", repr(exc)
                    breaks.append((stage, _first_line(exc)))
                if stage == "claim":  # the ids, whether or not the driver could read the rows
                    ids = conn.execute(
                        "SELECT array_agg(id ORDER BY id) AS ids FROM jobs.runs"
                        " WHERE worker = %s AND status = 'RUNNING'",
                        (worker,),
                    ).fetchone()
                    held = (ids or {}).get("ids") or []
                    args.update(first=held[:1], last=held[-1] if held else None)
    except psycopg.Error as exc:
        return "inconclusive", repr(exc)
    finally:
        conn.close()
    return ("breaks", breaks) if breaks else ("accepted", None)


def test_chaos_soak(tmp_path: Path) -> None:
    server = EmbeddedPostgres(ephemeral=True, fast=True)
    dsn = server.start()
    faults: collections.Counter[str] = collections.Counter()
    families: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    fleet = Fleet(dsn, tmp_path)
    ledger = Ledger(dsn)
    stopped_pids: set[int] = set()
    one_shots: list[OneShot] = []
    absurd: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    absurd_breaks: list[tuple[str, Any]] = []
    absurd_schedules: dict[str, str] = {}
    absurd_defined_at: dict[str, datetime] = {}
    enqueued = 0
    probe_samples = 0
    try:
        definitions = _setup(dsn)
        for _ in range(3):
            fleet.spawn()

        def enqueue_stream() -> None:
            nonlocal enqueued
            rng = random.Random()
            first = True  # one poison outcome and one hung job at once, the rest at random
            while not stop.wait(0.05):
                if ledger.enqueue("adhoc") is not None:
                    enqueued += 1
                if "poison" in FAMILIES and (first or rng.random() < 0.05):  # ~1 a second
                    variant = rng.choice(POISON)
                    if ledger.enqueue("poison", {"variant": variant}) is not None:
                        families[f"poison:{variant}"] += 1
                if "hung" in FAMILIES and (first or rng.random() < 0.004):  # ~1 in 12 s
                    if ledger.enqueue("hung", timeout=timedelta(seconds=HUNG_TIMEOUT)) is not None:
                        families["hung"] += 1
                first = False

        def cap_probe() -> None:
            nonlocal probe_samples
            while not stop.wait(0.05):
                rows = _try(
                    dsn,
                    "INSERT INTO chaos.cap_violations (definition_id, running, cap)"
                    " SELECT r.definition_id, count(*), d.max_concurrent_runs"
                    "   FROM jobs.runs r JOIN jobs.definitions d ON d.id = r.definition_id"
                    "  WHERE r.status = 'RUNNING' GROUP BY 1, 3"
                    " HAVING count(*) > d.max_concurrent_runs RETURNING definition_id",
                )
                if rows is not None:
                    probe_samples += 1

        def inject() -> None:
            rng = random.Random()
            while not stop.wait(rng.uniform(1.0, 3.0)):
                fleet.keep()
                fault = rng.choice(["kill9", "kill9", "sigstop_leader", "restart_pg", "drop_conns"])
                if fault == "kill9":
                    victims = fleet.alive()
                    if victims:
                        fleet.kill(rng.choice(victims))
                        fleet.spawn()
                elif fault == "sigstop_leader":
                    pid = _leader_pid(dsn)
                    proc = fleet.by_pid(pid) if pid else None
                    if proc is None:
                        continue
                    stopped_pids.add(proc.pid)
                    proc.send_signal(signal.SIGSTOP)
                    time.sleep(rng.uniform(2 * TICK, 3.0))
                    if rng.random() < 0.6:  # its session dies: another replica leads meanwhile
                        _try(
                            dsn,
                            "SELECT pg_terminate_backend(l.pid) FROM jobs.leader l",
                        )
                        faults["leader_session_killed"] += 1
                        time.sleep(3 * TICK)
                    proc.send_signal(signal.SIGCONT)
                elif fault == "restart_pg":
                    server.restart()
                elif fault == "drop_conns":
                    _try(
                        dsn,
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name LIKE 'pgtick%%' AND random() < 0.3",
                    )
                faults[fault] += 1

        mutable = [d for d in definitions if d.name in {f"chaos-{i}" for i in range(0, 50, 6)}]
        mutable += [d for d in definitions if d.name.startswith("chaos-cron-")]

        def redefine(d: Definition, text: str) -> None:
            _define(dsn, d.name, zone=d.zone, schedule=text, **d.options)
            stored = _read_back(dsn, d.name)
            if stored is None or stored[0] is None:
                d.uncertain = True
                return
            stored_text, _, updated_at, read_at = stored
            if updated_at != d.history[-1][0]:
                period = next((p for p in (1, 2, 3, 4, 5, 60) if stored_text in _texts(p)), None)
                if period is None or stored_text is None:
                    d.uncertain = True
                    return
                d.history.append((updated_at, period, stored_text))
                d.committed_by[updated_at] = read_at

        def move(shot: OneShot, run_at: datetime) -> None:
            _define(dsn, shot.name, "quick", "UTC", None, run_at=run_at)
            stored = _read_back(dsn, shot.name)
            if stored is None:
                shot.uncertain = True
                return
            _, stored_run_at, updated_at, _ = stored
            if stored_run_at is None:
                shot.uncertain = True
            elif not shot.history or updated_at != shot.history[-1][0]:
                shot.history.append((updated_at, stored_run_at))

        def change_schedules() -> None:
            rng = random.Random()
            # The first three changes are a jitter moved, a schedule text changed to an equivalent
            # one and a one-shot defined, each family the soak must show, however few changes a
            # slow machine leaves time for; the rest are drawn.
            firsts = iter(["cosmetic", "equivalent", "one_shot"])
            while not stop.wait(rng.uniform(1.0, 3.0)):
                opening = next(firsts, None)
                if opening is None:
                    action = rng.choices(["cosmetic", "changed", "one_shot"], weights=[4, 2, 4])[0]
                else:  # (an equivalent text is a cosmetic change that keeps the jitter)
                    action = "cosmetic" if opening == "equivalent" else opening
                if action == "one_shot":
                    now = datetime.now(UTC)
                    soon = now + timedelta(seconds=0.8)  # also after the leader materialized it
                    movable = [s for s in one_shots if not s.uncertain and min(s.times) > soon]
                    if opening or not movable or (len(movable) < 3 and rng.random() < 0.3):
                        first = now + timedelta(seconds=rng.uniform(4, 10))
                        shot = OneShot(
                            f"chaos-once-{len(one_shots)}",
                            (first, first + timedelta(seconds=rng.uniform(1, 3))),
                        )
                        one_shots.append(shot)
                        move(shot, shot.times[0])
                        families["one_shot_defined"] += 1
                    else:
                        shot = rng.choice(movable)
                        current = shot.history[-1][1] if shot.history else shot.times[0]
                        move(shot, shot.times[1] if current == shot.times[0] else shot.times[0])
                        families["one_shot_moved"] += 1
                    continue
                # The first change of the soak moves a jitter, so a short soak has one too.
                jittered = [m for m in mutable if "jitter" in m.options and not m.uncertain]
                first_jitter = bool(jittered) and not any(k.startswith("jitter_changed") for k in families)
                d = (
                    rng.choice(jittered)
                    if first_jitter
                    else rng.choice([m for m in mutable if not m.uncertain] or mutable)
                )
                if "jitter" in d.options and opening != "equivalent" and (first_jitter or rng.random() < 0.5):
                    # A new delay for each later occurrence, alone or with the schedule's change.
                    d.options["jitter"] = rng.choice([j for j in JITTERS if j != d.options["jitter"]])
                    if rng.random() < 0.5:
                        redefine(d, d.history[-1][2])
                        families["jitter_changed_alone"] += 1
                        continue
                    families["jitter_changed_with_schedule"] += 1
                if action == "changed" and d.period != 60:
                    period = rng.choice([p for p in (1, 2, 3, 4, 5) if p != d.period])
                    redefine(d, rng.choice(_texts(period)))
                    families["schedule_changed"] += 1
                else:
                    text = d.history[-1][2]
                    redefine(d, rng.choice([t for t in _texts(d.period) if t != text]))
                    families["schedule_equivalent_text"] += 1

        def absurd_values() -> None:
            rng = random.Random()
            schedules = iter(ABSURD_SCHEDULES)
            while not stop.wait(rng.uniform(0.5, 2.0)):
                if rng.random() < 0.15:
                    text = next(schedules, None)
                    if text is not None:
                        name = f"chaos-absurd-{len(absurd_schedules)}"
                        ok = _define(dsn, name, "quick", "UTC", text)
                        absurd_schedules[name] = text if ok else f"{text} (call failed)"
                        absurd_defined_at[name] = _db_now(dsn)
                        families["absurd_schedule"] += 1
                        continue
                what, writes = rng.choice(ABSURD)
                outcome, detail = _probe_absurd(dsn, writes)
                absurd[what][outcome if outcome != "refused" else f"refused {detail}"] += 1
                families["absurd_value"] += 1
                if outcome == "breaks":
                    absurd_breaks.append((what, detail))

        def move_history() -> None:
            """Finished ad-hoc runs are aged past archive_after and moved to history while
            everything else goes on: idempotent enqueues of the same keys, retries of their
            chains, faults. The accounting reads jobs.runs_all."""
            rng = random.Random()
            while not stop.wait(rng.uniform(0.5, 1.5)):
                _try(
                    dsn,
                    "UPDATE jobs.runs SET finished_at = finished_at - interval '2 days'"
                    " WHERE kind = 'adhoc' AND finished_at BETWEEN now() - interval '1 hour'"
                    " AND now() - interval '1 second'",
                )
                moved = _try(dsn, "SELECT jobs.archive(100)")
                if moved and moved[0][0]:
                    families["history_moved"] += int(moved[0][0])

        harness_errors: list[str] = []

        def guarded(loop: Callable[[], None]) -> Callable[[], None]:
            """The loop again after an error of the soak's own (reported, not a violation)."""

            def run() -> None:
                while not stop.is_set():
                    try:
                        return loop()
                    except Exception:
                        harness_errors.append(traceback.format_exc(limit=4))
                        stop.wait(1.0)

            return run

        threads = [
            threading.Thread(target=guarded(f), daemon=True)
            for f in (enqueue_stream, cap_probe, inject, change_schedules, absurd_values, move_history)
            if (f is not change_schedules or "schedules" in FAMILIES)
            and (f is not absurd_values or "absurd" in FAMILIES)
            and (f is not move_history or "history" in FAMILIES)
        ]
        for t in threads:
            t.start()
        time.sleep(SOAK_SECONDS)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        settle = _settle(dsn, fleet, ledger)
        fleet.stop()
        # Whatever the stopped replicas still held is the reaper's to hand on.
        for _ in range(20):
            time.sleep(HEARTBEAT_TIMEOUT / 2)
            _try(dsn, "SELECT jobs.reap()")
            left = _try(dsn, "SELECT count(*) FROM jobs.runs WHERE status = 'RUNNING'")
            if left is not None and left[0][0] == 0:
                break

        report = _account(dsn, server, definitions)
        violations = report["violations"]
        violations.update(settle.pop("violations"))
        _account_new_families(dsn, report, ledger, one_shots, definitions, settle["settle_started"])
        if absurd_breaks:
            violations["absurd_value_breaks_a_loop"] = dict(reversed(absurd_breaks))  # one per value
        outcomes = _absurd_schedule_outcomes(dsn, absurd_schedules)
        unsettled = [
            text
            for name, text in absurd_schedules.items()
            if outcomes[text] == "not looked at"
            and absurd_defined_at[name] < settle["settle_started"] - timedelta(seconds=20)
        ]
        if unsettled:  # the leader never got to it: with the tick errors it met meanwhile
            violations["absurd_schedule_never_settled_by_the_leader"] = {
                "schedules": unsettled,
                "tick_errors": _tick_errors(tmp_path),
            }
        if fleet.exited:
            violations["replica_exited_by_itself"] = fleet.exited[:10]
        report.update(
            seconds=SOAK_SECONDS,
            faults=dict(faults),
            fault_families=dict(families),
            absurd_values={k: dict(v) for k, v in sorted(absurd.items())},
            absurd_schedules=outcomes,
            settle=settle,
            replicas_started=fleet.started,
            replicas_that_could_not_start=fleet.failed_starts[:5],
            harness_errors=harness_errors[:5],
            adhoc_enqueued=enqueued,
            cap_probe_samples=probe_samples,
        )
        print("\nchaos soak:", json.dumps(report, indent=1, default=str))
        if os.environ.get("PGTICK_SOAK_REPORT"):
            Path(os.environ["PGTICK_SOAK_REPORT"]).write_text(json.dumps(report, indent=1, default=str))
        assert sum(faults.values()) >= max(3, SOAK_SECONDS / 6), f"too few faults injected: {faults}"
        expected = {
            "hung": ["hung"],
            "absurd": ["absurd_value"],
            "poison": ["poison:"],
            "history": ["history_moved"],
        }
        expected["schedules"] = ["schedule_equivalent_text", "one_shot_defined", "jitter_changed"]
        for family in sorted(FAMILIES & set(expected)):
            for counter in expected[family]:
                assert any(k.startswith(counter) for k in families), f"{counter} never injected: {families}"
        assert report["runs_completed"] > 100, report
        assert violations == {}, json.dumps(violations, indent=1, default=str)
    finally:
        stop.set()
        fleet.stop()
        server.stop()


def _db_now(dsn: str) -> datetime:
    while True:
        rows = _try(dsn, "SELECT clock_timestamp()")
        if rows:
            return rows[0][0]  # type: ignore[no-any-return]
        time.sleep(0.5)


def _wait(dsn: str, sql: str, deadline: float) -> bool:
    """Until the query answers true, or the deadline (monotonic) passes."""
    while time.monotonic() < deadline:
        rows = _try(dsn, sql)
        if rows and rows[0][0]:
            return True
        time.sleep(0.5)
    return False


_DRAINED = (
    "SELECT NOT EXISTS (SELECT FROM jobs.runs"
    "                    WHERE status IN ('QUEUED', 'RUNNING') AND scheduled_for <= now())"
    " AND NOT EXISTS (SELECT FROM jobs.definitions WHERE schedule IS NULL AND enabled"
    "                  AND finished_at IS NULL AND run_at <= now())"
)
_FINISHED = "SELECT count(*) FROM jobs.runs_all WHERE finished_at IS NOT NULL"


def _wait_drained(dsn: str) -> bool:
    """Until the due work is done: SETTLE_DEADLINE seconds, and longer while runs go on
    finishing (a backlog that a busy machine left large drains slowly, but drains), up to
    SETTLE_MOST. False when no run finished for SETTLE_DEADLINE seconds and work is left."""
    start = time.monotonic()
    last_progress, finished = start, -1
    while time.monotonic() < min(last_progress + SETTLE_DEADLINE, start + SETTLE_MOST):
        if _wait(dsn, _DRAINED, time.monotonic() + 5):
            return True
        rows = _try(dsn, _FINISHED)
        if rows and int(rows[0][0]) > finished:
            finished, last_progress = int(rows[0][0]), time.monotonic()
    return False


def _settle(dsn: str, fleet: Fleet, ledger: Ledger) -> dict[str, Any]:
    """No more faults: a full fleet works the backlog off; then every replica is offered
    poison outcomes and hung jobs once more and, after them, plain work that each must
    take a share of (a replica that no longer claims is wedged)."""
    violations: dict[str, Any] = {}
    fleet.keep()
    _try(dsn, "UPDATE jobs.definitions SET enabled = false WHERE schedule IS NOT NULL")
    started = _db_now(dsn)
    pids = {p.pid for p in fleet.alive()}
    registered = _wait(
        dsn,
        f"SELECT count(DISTINCT pid) = {len(pids)} FROM jobs.worker_registry"
        f" WHERE stopped_at IS NULL AND pid IN ({','.join(map(str, pids))})",
        time.monotonic() + 60,
    )
    if not registered:  # never registered, or its worker said it stopped while the process lives on
        rows = _try(dsn, "SELECT pid FROM jobs.worker_registry WHERE stopped_at IS NULL") or []
        live = {r[0] for r in rows}
        violations["replica_without_a_live_worker"] = {p: _tail(fleet.log_of[p]) for p in pids - live}
    drained = _wait_drained(dsn)
    for variant in POISON if "poison" in FAMILIES else []:
        ledger.enqueue("poison", {"variant": variant}, priority=100)
    for _ in range(2 if "hung" in FAMILIES else 0):
        ledger.enqueue("hung", timeout=timedelta(seconds=HUNG_TIMEOUT), priority=100)
    _wait(
        dsn,
        "SELECT NOT EXISTS (SELECT FROM jobs.runs WHERE kind IN ('poison', 'hung')"
        " AND status IN ('QUEUED', 'RUNNING') AND scheduled_for <= now())",
        time.monotonic() + 30,
    )
    offered = _db_now(dsn)
    for _ in range(SETTLE_RUNS):
        ledger.enqueue("settle", priority=100)
    drained = _wait_drained(dsn) and drained
    stuck = _try(
        dsn,
        "SELECT id, kind, payload->>'variant', worker, started_at, heartbeat_at, timeout FROM jobs.runs"
        " WHERE status = 'RUNNING' ORDER BY id",
    )
    if not drained and stuck:
        violations["stuck_running_at_settle"] = stuck[:20]
    claims = dict(
        _try(
            dsn,
            "SELECT r.pid, count(u.id) FROM jobs.worker_registry r"
            " LEFT JOIN jobs.runs u ON u.worker = r.worker AND u.started_at >= %s"
            " WHERE r.pid = ANY(%s) GROUP BY 1",
            (offered, sorted(pids)),
        )
        or []
    )
    wedged = {
        pid: {"claimed_since_offer": claims.get(pid, 0), "log_tail": _tail(fleet.log_of[pid])}
        for pid in pids
        if fleet.by_pid(pid) is not None and not claims.get(pid)
    }
    if wedged:
        violations["replica_wedged"] = wedged
    return {
        "violations": violations,
        "settle_started": started,
        "drained": drained,
        "claims_per_replica_after_offer": claims,
    }


def _superseded(status: str, reason: str | None) -> bool:
    """A scheduled run cancelled because its definition changed (not an overlap skip)."""
    return status == "CANCELLED" and reason != "Skipped"


def _on(d: Definition, t: datetime, period: int) -> bool:
    return (t - d.anchor).total_seconds() % period == 0


def _occurrences(conn: psycopg.Connection[Any], definitions: list[Definition]) -> dict[str, Any]:
    """Every occurrence of each definition's schedules exactly once, none dropped by a change."""
    violations: dict[str, list[Any]] = collections.defaultdict(list)
    restarted: collections.Counter[str] = collections.Counter()
    kept_while_changing = taken_over = 0
    for d in definitions:
        if d.uncertain:
            continue
        rows = conn.execute(
            "SELECT coalesce(occurrence_at, scheduled_for), status::text, failure_reason, created_at,"
            " finished_at, started_at FROM jobs.runs_all"
            " WHERE definition_id = %s AND origin = 'schedule' ORDER BY 1",
            (d.id,),
        ).fetchall()
        live = {r[0]: r for r in rows if not _superseded(r[1], r[2])}
        coalesced = {
            (r[0], r[1])
            for r in conn.execute(
                "SELECT resumed_from, last_late FROM jobs.catch_ups WHERE definition_id = %s", (d.id,)
            )
        }
        changes = [h[0] for h in d.history]
        # A run the old and the new schedule share is never cancelled by the change.
        for t, _, _, _, finished_at, _ in (r for r in rows if _superseded(r[1], r[2])):
            j = max((i for i, at in enumerate(changes) if at <= finished_at), default=0)
            if j > 0 and _on(d, t, d.history[j][1]) and t not in live:
                before = d.history[j - 1][2]
                violations["shared_occurrence_dropped"].append(
                    (d.name, t, f"cancelled at {finished_at} by {before!r} -> {d.history[j][2]!r}")
                )
        for k, (since, period, text) in enumerate(d.history):
            until = changes[k + 1] if k + 1 < len(changes) else None
            times = [t for t in live if (k == 0 or t > since) and (until is None or t <= until)]
            # After a change the leader restarts the cursor at its own now: instants already
            # past by the time it materialized the new schedule are not owed.
            restart = min((live[t][3] for t in times if live[t][3] > since), default=None) if k else None
            if k and restart is None:
                continue  # nothing materialized from the new cursor: only kept runs, checked above
            for t in times:
                if _on(d, t, period):
                    continue
                # A run of the replaced schedule that a worker claimed before the change
                # committed is not the change's to cancel: the change only began at ``since``.
                committed_by = d.committed_by.get(since, since)
                if any(
                    r[0] == t and r[3] < since and r[5] is not None and r[5] <= committed_by for r in rows
                ):
                    kept_while_changing += 1
                    continue
                # Nor is a run of the next schedule materialized after the next change began:
                # a change takes over from the old cursor when the scheduler was behind it
                # (jobs._takeover), so its first runs may fall before the change itself.
                if k + 1 < len(d.history):
                    next_since, next_period, _ = d.history[k + 1]
                    if _on(d, t, next_period) and any(r[0] == t and r[3] >= next_since for r in rows):
                        taken_over += 1
                        continue
                violations["occurrence_of_replaced_schedule_kept"].append(
                    (d.name, t, text, [(r[1], r[3], r[5]) for r in rows if r[0] == t], since, committed_by)
                )
            grid = [t for t in times if _on(d, t, period)]
            for a, b in itertools.pairwise(grid):
                if (b - a).total_seconds() == period or (a + timedelta(seconds=period), b) in coalesced:
                    continue
                missing = [
                    a + timedelta(seconds=s) for s in range(period, int((b - a).total_seconds()), period)
                ]
                owed = [m for m in missing if restart is None or m >= restart]
                restarted["cosmetic" if k and d.history[k - 1][1] == period else "changed"] += len(
                    missing
                ) - len(owed)
                if owed:
                    violations["occurrence_gaps"].append((d.name, a, b, text))
    return {
        "violations": {k: v[:20] for k, v in violations.items()},
        "skipped_by_restart": dict(restarted),
        "claimed_while_changing": kept_while_changing,
        "taken_over_before_the_change": taken_over,
    }


def _account(dsn: str, server: EmbeddedPostgres, definitions: list[Definition]) -> dict[str, Any]:
    violations: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:

        def q(sql: str) -> list[tuple[Any, ...]]:
            return conn.execute(sql).fetchall()

        def flag(violation: str, sql: str) -> None:
            """Record the first 20 counter-examples ``sql`` finds as ``violation``, if any."""
            found = q(sql)
            if found:
                violations[violation] = found[:20]

        # 1. Every occurrence materialized once, and none lost between first and last:
        # a gap is allowed only where a recorded catch-up coalesced the occurrences a
        # stalled or stopped scheduler found late (misfire_policy coalesce, the default),
        # or right after a schedule change, before the leader restarted the cursor.
        flag(
            "occurrence_materialized_twice",
            "SELECT definition_id, coalesce(occurrence_at, scheduled_for), count(*) FROM jobs.runs_all"
            " WHERE origin = 'schedule' GROUP BY 1, 2 HAVING count(*) > 1",
        )
        occurrences = _occurrences(conn, definitions)
        violations.update(occurrences["violations"])
        # 2. No run executed twice (each run id is entered by one execution only).
        flag(
            "run_executed_twice",
            "SELECT run_id, array_agg(pid) FROM chaos.executions GROUP BY 1 HAVING count(*) > 1",
        )
        # 3. Caps never exceeded (probe samples during the soak).
        flag("cap_exceeded", "SELECT definition_id, running, cap, seen_at FROM chaos.cap_violations LIMIT 20")
        # 4. Nothing lost: every run terminal with a reason, or still queued for later.
        flag(
            "still_running_after_settle",
            "SELECT id, status::text, worker FROM jobs.runs_all WHERE status = 'RUNNING'",
        )
        flag(
            "failed_without_reason",
            "SELECT id FROM jobs.runs_all WHERE status = 'FAILED' AND failure_reason IS NULL",
        )
        flag(
            "finished_execution_not_recorded",
            "SELECT e.run_id, r.status::text FROM chaos.executions e JOIN jobs.runs_all r ON r.id = e.run_id"
            " WHERE e.exited IS NOT NULL AND r.status IN ('QUEUED', 'RUNNING')",
        )
        flag(
            "completed_without_execution",
            "SELECT r.id, r.kind FROM jobs.runs_all r WHERE r.status = 'COMPLETED' AND NOT EXISTS"
            " (SELECT FROM chaos.executions e WHERE e.run_id = r.id AND e.exited IS NOT NULL)",
        )
        due_left = q(
            "SELECT count(*) FROM jobs.runs_all"
            " WHERE status = 'QUEUED' AND scheduled_for <= now() - interval '5 s'"
        )[0][0]
        if due_left:
            violations["due_runs_never_claimed"] = due_left
        flag(
            "run_both_live_and_in_history",
            "SELECT id FROM jobs.runs INTERSECT SELECT id FROM jobs.run_history",
        )
        # 5. Retries linked: each attempt n+1 points at a FAILED attempt n of the same kind.
        flag(
            "broken_retry_links",
            "SELECT r.id, r.attempt, p.id, p.attempt, p.status::text FROM jobs.runs_all r"
            " LEFT JOIN jobs.runs_all p ON p.id = r.retry_of"
            " WHERE r.attempt > 1 AND (p.id IS NULL OR p.attempt <> r.attempt - 1"
            "       OR p.status <> 'FAILED' OR p.kind <> r.kind)",
        )
        stats = dict(q("SELECT status::text, count(*) FROM jobs.runs_all GROUP BY 1"))
        reasons = dict(
            q(
                "SELECT failure_reason, count(*) FROM jobs.runs_all"
                " WHERE failure_reason IS NOT NULL GROUP BY 1"
            )
        )
        retries = q("SELECT count(*) FROM jobs.runs_all WHERE attempt > 1")[0][0]
        executions = q("SELECT count(*) FROM chaos.executions")[0][0]
    # 6. No deadlocks or lock timeouts in the server log.
    log_lines = (server.data_dir / "log").read_text(errors="replace").splitlines()
    bad_lines = [
        "\n".join(log_lines[i : i + 6])  # the error with its DETAIL and STATEMENT lines
        for i, line in enumerate(log_lines)
        if "deadlock detected" in line or "lock timeout" in line or "canceling statement due to lock" in line
    ]
    if bad_lines:
        violations["server_log"] = bad_lines[:20]
    return {
        "violations": violations,
        "runs_by_status": stats,
        "failure_reasons": reasons,
        "runs_completed": stats.get("COMPLETED", 0),
        "retries": retries,
        "executions": executions,
        "instants_skipped_by_cursor_restart": occurrences["skipped_by_restart"],
        "replaced_runs_claimed_while_changing": occurrences["claimed_while_changing"],
        "new_schedule_runs_taken_over_before_the_change": occurrences["taken_over_before_the_change"],
    }


def _retry_owed(
    run: dict[str, Any], policy: tuple[list[str] | None, list[str], int | None], default: int
) -> bool:
    """Whether the kind's policy gives this FAILED run another attempt (jobs._retry_allowed):
    decided only where the failure's classes are known (reaped runs: just the reason)."""
    allow, deny, attempts = policy
    if run["attempt"] >= (run["max_attempts"] or attempts or default):
        return False
    reason = run["failure_reason"]
    if reason in ("HeartbeatLost", "Orphaned"):
        return reason not in deny
    if reason in ("Error", "Timeout") and not deny:
        return allow is None or reason in allow
    return False


def _account_new_families(
    dsn: str,
    report: dict[str, Any],
    ledger: Ledger,
    one_shots: list[OneShot],
    definitions: list[Definition],
    settle_started: datetime,
) -> None:
    """Exact accounting of what the soak enqueued, of poison, hung and retried runs, of
    moved one-shots, and that the scheduler kept materializing."""
    violations: dict[str, Any] = collections.defaultdict(list)
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        runs = {
            r["id"]: r
            for r in conn.execute(
                "SELECT id, kind, status::text AS status, failure_reason, error, attempt, max_attempts,"
                " retry_of, payload->>'variant' AS variant, result, started_at, finished_at,"
                " scheduled_for, origin, definition_id, idempotency_key,"
                " extract(epoch FROM timeout) AS timeout FROM jobs.runs_all"
            )
        }
        policies = {
            p["kind"]: (p["allow"], p["deny"], p["max_attempts"])
            for p in conn.execute("SELECT kind, allow, deny, max_attempts FROM jobs.retry_policies")
        }
        default_attempts = conn.execute("SELECT max_attempts FROM jobs.config").fetchone()["max_attempts"]  # type: ignore[index]
        one_shot_ids = {
            r["name"]: r["id"]
            for r in conn.execute("SELECT name, id FROM jobs.definitions WHERE name LIKE 'chaos-once-%'")
        }
    successor = {r["retry_of"]: i for i, r in runs.items() if r["retry_of"] is not None}
    scheduled: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in runs.values():
        if r["origin"] == "schedule":
            scheduled[r["definition_id"]].append(r)
    by_key = {(r["kind"], r["idempotency_key"]): i for i, r in runs.items() if r["idempotency_key"]}

    # Every enqueued run is found, and its chain of attempts ends in one final state.
    finals: collections.Counter[str] = collections.Counter()
    for kind, key, run_id in ledger.entries:
        found = by_key.get((kind, key))
        if run_id is not None and found != run_id:
            violations["enqueued_run_lost"].append((kind, key, run_id, found))
        if found is None:
            finals["call failed, not committed"] += 1
            continue
        chain = [found]
        while chain[-1] in successor:
            chain.append(successor[chain[-1]])
        if any(runs[i]["status"] != "FAILED" for i in chain[:-1]):
            violations["attempt_chain_broken"].append([(i, runs[i]["status"]) for i in chain])
        finals[f"{kind} {runs[chain[-1]]['status']}"] += 1
    # A failure the policy retries has its retry: none lost between reap or fail and the insert.
    for i, r in runs.items():
        if r["status"] == "FAILED" and i not in successor:
            if _retry_owed(r, policies.get(r["kind"], (None, [], None)), default_attempts):
                violations["retry_missing"].append((i, r["kind"], r["attempt"], r["failure_reason"]))
    # Poison outcomes end FAILED with a readable message (an unserialisable object may be
    # stored as its repr, as the driver documents); never RUNNING.
    poison: collections.Counter[str] = collections.Counter()
    for i, r in runs.items():
        if r["kind"] != "poison":
            continue
        poison[f"{r['variant']} {r['status']} {r['failure_reason'] or ''}".strip()] += 1
        if r["status"] == "FAILED" and not (r["error"] or "").strip():
            violations["poison_failure_unreadable"].append((i, r["variant"], r["failure_reason"], r["error"]))
        elif r["status"] == "COMPLETED" and r["variant"] != "unserialisable_result":
            violations["poison_outcome_stored_as_success"].append((i, r["variant"], r["result"]))
        elif r["status"] in ("QUEUED", "RUNNING") and r["scheduled_for"] < settle_started:
            violations["poison_run_not_finished"].append((i, r["variant"], r["status"]))
    # Hung runs are ended by the server's timeout (or by the reaper, their worker gone):
    # one that completed ran past its timeout unfenced.
    hung: collections.Counter[str] = collections.Counter()
    overrun = 0.0
    for i, r in runs.items():
        if r["kind"] != "hung":
            continue
        hung[f"{r['status']} {r['failure_reason'] or ''}".strip()] += 1
        if r["status"] == "COMPLETED":
            took = (r["finished_at"] - r["started_at"]).total_seconds()
            violations["hung_run_completed_past_timeout"].append((i, r["timeout"], f"ran {took:.1f}s"))
        elif r["failure_reason"] == "Timeout" and r["started_at"] and r["timeout"]:
            late = (r["finished_at"] - r["started_at"]).total_seconds() - float(r["timeout"])
            overrun = max(overrun, late)
    # A one-shot runs once at its final time, even after being moved away and back, and
    # never at a time it had been moved away from before that time came.
    moved: collections.Counter[str] = collections.Counter()
    for shot in one_shots:
        if shot.uncertain or not shot.history or shot.name not in one_shot_ids:
            continue
        final = shot.history[-1][1]
        mine = scheduled.get(one_shot_ids[shot.name], [])
        live = [r for r in mine if not _superseded(r["status"], r["failure_reason"])]
        at_final = [r for r in live if r["scheduled_for"] == final]
        moved[f"moved {len(shot.history) - 1}x"] += 1
        if final <= settle_started and len(at_final) != 1:
            violations["one_shot_missing_at_its_time"].append(
                (shot.name, final, [(r["id"], r["scheduled_for"], r["status"]) for r in mine], shot.history)
            )
        for r in live:
            t = r["scheduled_for"]
            in_force = [h for h in shot.history if h[0] < t]
            if (
                t != final
                and in_force
                and in_force[-1][1] != t
                and in_force[-1][0] + timedelta(seconds=1) < t
            ):
                violations["one_shot_ran_at_a_time_moved_away"].append((shot.name, r["id"], t, shot.history))
    # The leader kept materializing every definition until the faults stopped.
    for d in definitions:
        last = max((r["scheduled_for"] for r in scheduled.get(d.id, [])), default=None)
        owed_since = settle_started - timedelta(seconds=d.period + 20)  # an instant was due by then
        if not d.uncertain and (last or d.history[0][0]) < owed_since:
            violations["materialization_stalled"].append((d.name, last, settle_started))
    report["violations"].update({k: v[:20] for k, v in violations.items()})
    report.update(
        enqueued_by_final_state=dict(finals),
        poison_outcomes=dict(poison),
        hung_outcomes=dict(hung),
        hung_timeout_overrun_max_s=round(overrun, 2),
        one_shots=dict(moved),
    )


def _tick_errors(logs: Path) -> list[str]:
    """The distinct reasons scheduler ticks failed, other than a lost connection."""
    seen: collections.Counter[str] = collections.Counter()
    for path in sorted(logs.glob("replica-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            _, found, reason = line.partition("scheduler tick failed (will retry): ")
            if found and not any(w in reason for w in ("Shutdown", "terminat", "connect", "closed")):
                seen[reason[:200]] += 1
    return [f"{n}x {reason}" for reason, n in seen.most_common(5)]


def _absurd_schedule_outcomes(dsn: str, defined: dict[str, str]) -> dict[str, str]:
    """What became of each absurd schedule: refused, or what the leader made of it."""
    rows = _try(
        dsn,
        "SELECT name, CASE WHEN schedule_error IS NOT NULL THEN 'schedule_error: ' || schedule_error"
        " WHEN finished_at IS NOT NULL THEN 'finished' WHEN next_run_at IS NOT NULL THEN 'scheduled'"
        " ELSE 'not looked at' END FROM jobs.definitions WHERE name LIKE 'chaos-absurd-%%'",
    )
    state = dict(rows or [])
    return {text or name: state.get(name, "refused") for name, text in defined.items()}
