"""The schedule benchmark: how late do scheduled occurrences start, and are any missed or
run twice, with N schedules every minute (and 100 every second)? pgtick beside pg_cron,
procrastinate and DBOS, in one run, on one server.

    .venv/bin/python bench/schedule.py [--sizes 100,1000,10000,100000] [--every-second 100]
                                       [--boundaries 3] [--workers 1] [--concurrency 100]
                                       [--claimers 1]
                                       [--systems pgtick,pg_cron,procrastinate,dbos]
                                       [--dsn DSN | --embedded] [--out results.json]

stdout: one JSON line per system per scenario, then a table. Progress goes to stderr.

The server: without ``--dsn``, a throwaway PostgreSQL 15 cluster (Debian's binaries, run
as the ``postgres`` OS user on a temporary directory, its own port, durable: fsync and
synchronous_commit on) with pg_cron loaded through ``shared_preload_libraries``
(``cron.use_background_workers = on``, ``max_worker_processes = 20`` as pg_cron's README
shows for that mode, ``cron.max_running_jobs = 32``, its default). Every system runs on it,
one after the other, each in its own database. Without the PostgreSQL 15 binaries (or with
``--embedded``) the embedded server is used and pg_cron is reported as ``not run: <reason>``.

Per scenario and system: N schedules of a no-op, ``* * * * *`` in UTC, are created (timed:
setup seconds), the system's processes start, and after one warm-up minute boundary (at
least 30 s after the start) ``--boundaries`` boundaries are observed. For every occurrence
of them, lateness is the start instant minus the scheduled instant, both as the database
recorded them:

- pgtick: ``jobs.define_many`` creates the definitions; a leader (``pgtick run
  --no-worker``) and ``--workers`` workers (``pgtick run --no-scheduler``, ``--concurrency``,
  ``--claimers``, each claim for ``concurrency / claimers`` runs) run; lateness is
  ``started_at - scheduled_for`` of ``jobs.runs``.
- pg_cron, procrastinate, DBOS: see ``bench/schedule_peers.py`` (where each start instant
  comes from; procrastinate runs one worker at ``--concurrency``, DBOS at its defaults).

Missed = occurrences not started within 60 s of their time (counting those never
materialized); duplicated = more than one run for one schedule and occurrence;
inserted_after_their_time counts occurrences materialized after their instant (where the
system records it). After the last observed boundary the benchmark waits until every
occurrence has started or 60 s have passed, whichever is first, then stops the system's
processes (also on Ctrl-C or an error). CPU is user+system time of the system's own
processes from half a step before the first observed instant until the last observed
occurrence started (or the 60 s ran out), as a percentage of one core: pgtick's leader and
worker processes; the pg_cron launcher (a server process; its jobs' background workers are
not counted); procrastinate's and DBOS's one process each (scheduler and worker together).
Each peer's row carries ``p99 / pgtick p99`` for the same scenario. The every-second
scenario (100 ``FREQ=SECONDLY`` definitions, 60 seconds observed) runs pgtick only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from bench.harness import Server, db_now  # noqa: E402
from bench.schedule_peers import (  # noqa: E402
    PEERS,
    PG_CRON_SO,
    Driver,
    Pg15Cluster,
    cpu_seconds,
    log,
    peer_unavailable,
    server_preloads_pg_cron,
    spawn,
    stop_all,
)
from bench.summary import Summary, combine  # noqa: E402
from pgtick import migrate  # noqa: E402

# The pgtick CLI of this checkout (its driver/ first on the path), not whichever pgtick the
# environment installed: the processes the benchmark starts run the code it reports.
PGTICK = [sys.executable, "-m", "pgtick"]
PGTICK_PATH = os.pathsep.join(
    [str(ROOT / "driver"), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
)
APP = str(ROOT / "bench" / "schedule_app.py")
SYSTEMS = ("pgtick", *PEERS)
GRACE = timedelta(seconds=60)
# pgtick's lateness p99 targets per scenario, in ms (every-minute-100000 runs 2 workers).
P99_TARGET_MS = {
    "every-minute-100": 20,
    "every-second-100": 50,
    "every-minute-1000": 250,
    "every-minute-10000": 2_000,
    "every-minute-100000": 20_000,
}
SETUP_TARGET_S = {"every-minute-100000": 30}  # creating the definitions
PEER_RATIO_TARGET = 10  # each peer's p99 / pgtick's p99, in the same run


def sleep_until(conn: psycopg.Connection[Any], at: datetime) -> None:
    while True:
        left = (at - db_now(conn)).total_seconds()
        if left <= 0:
            return
        time.sleep(min(left, 5.0))


class PgtickDriver(Driver):
    """pgtick: ``jobs.define_many``, one leader and ``workers`` worker processes."""

    workers: int = 1
    claimers: int = 1  # claims in flight per worker process, each for concurrency / claimers runs

    def setup(self) -> None:
        self.dbname = f"sched_pgtick_{self.count}"
        self.server.fresh_database(self.dbname)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            migrate.apply(conn)
            defs = [
                {"name": f"s{i:06}", "kind": "noop", "schedule": self.schedule} for i in range(self.count)
            ]
            began = time.monotonic()
            conn.execute("SELECT count(*) FROM jobs.define_many(%s)", (Jsonb(defs),))
            self.setup_seconds = time.monotonic() - began
        self.starts_sql = """
            SELECT definition_id::text AS key, scheduled_for, started_at, created_at
              FROM jobs.runs
             WHERE origin = 'schedule' AND scheduled_for BETWEEN %(from)s AND %(to)s
        """

    def start(self) -> None:
        batch = str(max(1, min(self.concurrency // self.claimers, 1000)))
        flags = ["--concurrency", str(self.concurrency), "--batch", batch, "--claimers", str(self.claimers)]
        run = [*PGTICK, "run", APP, "--dsn", self.dsn]
        env = {"DATABASE_URL": self.dsn, "PYTHONPATH": PGTICK_PATH}
        log_of = self.workdir / f"pgtick-{self.count}"
        self.procs = [spawn([*run, "--no-worker"], env, Path(f"{log_of}-leader.log"))]
        self.procs += [
            spawn([*run, "--no-scheduler", *flags], env, Path(f"{log_of}-worker{i}.log"))
            for i in range(self.workers)
        ]
        self.leader_pids = [self.procs[0].pid]
        self.worker_pids = [p.pid for p in self.procs[1:]]


STATS_SQL = """
WITH r AS ({starts}), s AS (SELECT *, started_at - scheduled_for AS late FROM r)
SELECT count(DISTINCT (key, scheduled_for)) FILTER (WHERE late <= interval '60 s'),
       count(*) - count(DISTINCT (key, scheduled_for)),
       1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY late)),
       1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY late)),
       1000 * extract(epoch FROM max(late)),
       1000 * extract(epoch FROM min(late)),
       count(*) FILTER (WHERE started_at < scheduled_for),
       count(*) FILTER (WHERE created_at > scheduled_for),
       count(created_at),
       count(*)
  FROM s
"""

STARTED_SQL = """
SELECT count(DISTINCT (key, scheduled_for)) FILTER (WHERE started_at IS NOT NULL) FROM ({starts}) AS r
"""


def scenario(driver: Driver, name: str, step: timedelta, observe: int) -> dict[str, Any]:
    """Set the driver's schedules up, run it, observe ``observe`` occurrence instants."""
    try:
        driver.setup()
        driver.start()
        log(f"{name} {driver.system}: {driver.count} schedules created in {driver.setup_seconds:.2f}s")
        with psycopg.connect(driver.dsn, autocommit=True) as conn:
            now = db_now(conn)
            # Warm-up: one occurrence instant (a minute boundary at least 30 s away, or 10 s
            # of every-second occurrences) is handled before the observed ones.
            unit = step.total_seconds()
            lead = timedelta(seconds=min(30.0, unit / 2))
            first = datetime.fromtimestamp((now.timestamp() // unit + 1) * unit, tz=now.tzinfo)
            warm = first if unit >= 60 else first + timedelta(seconds=10)
            while warm - now < lead:
                warm += step
            observed_from = warm + step
            observed_to = observed_from + step * (observe - 1)
            # CPU: from half a step before the first observed instant until the last start.
            sleep_until(conn, observed_from - lead)
            pids = [*driver.leader_pids, *driver.worker_pids]
            cpu0 = {pid: cpu_seconds(pid) for pid in pids}
            t0 = time.monotonic()
            log(f"{name} {driver.system}: observing {observe} instants from {observed_from:%H:%M:%S}")
            sleep_until(conn, observed_to + timedelta(seconds=1))
            # Let late starts happen (they count as late, not missed, within 60 s).
            expected = driver.count * observe
            waiting = STARTED_SQL.format(starts=driver.starts_sql)
            bounds = {"from": observed_from, "to": observed_to}
            while db_now(conn) < observed_to + GRACE:
                row = conn.execute(waiting, bounds).fetchone()
                if row is not None and int(row[0]) >= expected:
                    break
                time.sleep(1.0)
            window = time.monotonic() - t0
            cpu = {pid: cpu_seconds(pid) - c for pid, c in cpu0.items()}
            # A pgtick process that exited (a refused schema, a crash) measured nothing: an
            # error, not a scenario of missed occurrences.
            gone = [f"pid {p.pid} exited with {p.returncode}" for p in driver.procs if p.poll() is not None]
            if gone and isinstance(driver, PgtickDriver):
                raise RuntimeError(f"{', '.join(gone)} during the window (logs in {driver.workdir})")
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            driver.stop()
            driver.cleanup()
        raise
    driver.stop()
    with psycopg.connect(driver.dsn, autocommit=True) as conn:
        stats = conn.execute(STATS_SQL.format(starts=driver.starts_sql), bounds).fetchone()
    driver.cleanup()
    assert stats is not None
    started, duplicated, p50, p99, worst, best, early, inserted_late, known_created, inserted = stats

    def pct(pids: list[int]) -> float | None:
        return round(100 * sum(cpu[p] for p in pids) / window, 1) if pids and window else None

    return {
        "system": driver.system,
        "scenario": name,
        "schedules": driver.count,
        "schedule": driver.schedule,
        "occurrences": expected,
        "started": int(started),
        "missed": expected - int(started),
        "duplicated": int(duplicated),
        "started_early": int(early),
        "inserted": int(inserted),
        "inserted_after_their_time": int(inserted_late) if known_created else None,
        "lateness_ms": {
            "p50": _round(p50),
            "p99": _round(p99),
            "max": _round(worst),
            "min": _round(best),
        },
        "setup_seconds": round(driver.setup_seconds, 2),
        "leader_cpu_pct": pct(driver.leader_pids),
        "worker_cpu_pct": pct(driver.worker_pids),
        "cpu_note": driver.cpu_note or None,
        "worker_processes": len(driver.worker_pids),
        "concurrency": driver.concurrency,
        "claimers": getattr(driver, "claimers", None),
        "observed_seconds": round(window, 1),
    }


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def parse_systems(text: str) -> list[str]:
    """``--systems``: a comma-separated subset of SYSTEMS (case-insensitive), in SYSTEMS order."""
    asked = {t.strip().lower() for t in text.split(",") if t.strip()}
    unknown = sorted(asked - set(SYSTEMS))
    if unknown or not asked:
        names = ", ".join(unknown) or "(none given)"
        raise ValueError(f"--systems: unknown {names}; choose from {','.join(SYSTEMS)}")
    return [name for name in SYSTEMS if name in asked]


def ratio(peer_p99: float | None, pgtick_p99: float | None) -> float | None:
    """Peer p99 / pgtick p99 (the target: at least 10), or None when either is unknown."""
    if peer_p99 is None or not pgtick_p99:
        return None
    return round(peer_p99 / pgtick_p99, 1)


def open_server(args: argparse.Namespace, systems: list[str]) -> tuple[Server, Pg15Cluster | None]:
    """The one server every system runs on (see the module docstring)."""
    if args.dsn:
        return Server(args.dsn), None
    why = Pg15Cluster.unavailable()
    if args.embedded or why:
        log(f"embedded server ({'--embedded' if args.embedded else why})")
        return Server(), None
    cluster = Pg15Cluster(with_pg_cron="pg_cron" in systems and PG_CRON_SO.exists())
    try:
        return Server(cluster.start()), cluster
    except BaseException:
        cluster.stop()
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="every-minute schedule counts")
    parser.add_argument("--every-second", type=int, default=100, help="every-second schedules (0: skip)")
    parser.add_argument("--boundaries", type=int, default=3, help="minute boundaries observed per size")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (2 at 100,000 always)")
    parser.add_argument("--concurrency", type=int, default=100, help="worker concurrency (no-op jobs)")
    parser.add_argument(
        "--claimers",
        type=int,
        default=1,
        help="pgtick: claims in flight per worker, each of concurrency/claimers",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of: %(default)s")
    parser.add_argument("--dsn", help="use this server (a superuser DSN) instead of a throwaway one")
    parser.add_argument("--embedded", action="store_true", help="use the embedded server, not PostgreSQL 15")
    parser.add_argument("--out", help="also write all records to this JSON file")
    parser.add_argument(
        "--report",
        nargs="+",
        metavar="RUN",
        help="measure nothing: print the targets over runs written by --out, one RUN each"
        " (a run's files joined by commas)",
    )
    args = parser.parse_args(argv)
    if args.report:
        return report(args.report)
    try:
        systems = parse_systems(args.systems)
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError as exc:
        parser.error(str(exc))

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)  # stop the children and the cluster on the way out
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    records: list[dict[str, Any]] = []
    server: Server | None = None
    cluster: Pg15Cluster | None = None
    workdir = Path(tempfile.mkdtemp(prefix="pgtick-sched-logs-"))
    try:
        server, cluster = open_server(args, systems)
        settings = server.settings()
        log(
            f"server {settings['server_version']}, synchronous_commit={settings['synchronous_commit']},"
            f" shared_preload_libraries={settings['shared_preload_libraries'] or '(none)'}; logs in {workdir}"
        )
        has_pg_cron = server_preloads_pg_cron(server)
        skip = {name: peer_unavailable(name, has_pg_cron) for name in systems if name != "pgtick"}
        for name, why in skip.items():
            if why:
                log(f"{name}: not run: {why}")
        scenarios: list[tuple[str, int, str, timedelta, int, list[str]]] = [
            (f"every-minute-{n}", n, "* * * * *", timedelta(minutes=1), args.boundaries, systems)
            for n in sizes
        ]
        if args.every_second and "pgtick" in systems:
            scenarios.append(
                (
                    f"every-second-{args.every_second}",
                    args.every_second,
                    "FREQ=SECONDLY",
                    timedelta(seconds=1),
                    60,
                    ["pgtick"],
                )
            )
        for name, count, schedule, step, observe, which in scenarios:
            for system in which:
                record = run_one(server, system, name, count, schedule, step, observe, args, skip, workdir)
                records.append(record)
                print(json.dumps(record), flush=True)
    finally:
        stop_all()
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.stop()
    add_ratios(records)
    print_table(records)
    print("\n" + target_table(targets(records)))
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": settings, "records": records}, indent=2))
    return 0


def run_one(
    server: Server,
    system: str,
    name: str,
    count: int,
    schedule: str,
    step: timedelta,
    observe: int,
    args: argparse.Namespace,
    skip: dict[str, str | None],
    workdir: Path,
) -> dict[str, Any]:
    """One system in one scenario: its record, or why it did not run or failed."""
    if skip.get(system):
        return {"system": system, "scenario": name, "status": "not run", "why": skip[system]}
    driver_class = PgtickDriver if system == "pgtick" else PEERS[system]
    driver = driver_class(system, server, count, schedule, args.concurrency, workdir)
    if isinstance(driver, PgtickDriver):
        driver.workers = max(args.workers, 2) if count >= 100_000 else args.workers
        driver.claimers = args.claimers
    load_before = loadavg()
    try:
        record = scenario(driver, name, step, observe)
    except Exception as exc:  # a peer that breaks must not stop the others
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        log(f"{name} {system}: error: {why}")
        stop_all()
        return {"system": system, "scenario": name, "status": "error", "why": why}
    record["load_before"] = load_before
    record["load_after"] = loadavg()
    return record


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Each peer's record gets ``p99_vs_pgtick``: its p99 / pgtick's p99 in the same scenario."""
    pgtick = {r["scenario"]: r for r in records if r["system"] == "pgtick" and "lateness_ms" in r}
    for r in records:
        base = pgtick.get(r["scenario"])
        if r["system"] != "pgtick" and "lateness_ms" in r and base is not None:
            r["p99_vs_pgtick"] = ratio(r["lateness_ms"]["p99"], base["lateness_ms"]["p99"])


def print_table(records: list[dict[str, Any]]) -> None:
    print(
        "\n| scenario | system | p50 ms | p99 ms | max ms | missed | duplicated | setup s"
        " | leader CPU % | worker CPU % | p99 / pgtick p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        if "lateness_ms" not in r:
            print(f"| {r['scenario']} | {r['system']} | {r['status']}: {r['why']} | | | | | | | | |")
            continue
        lat = r["lateness_ms"]
        system = r["system"]
        if system == "pgtick":
            system += f" ({r['worker_processes']} worker proc.)"
        cells = [
            r["scenario"],
            system,
            lat["p50"],
            lat["p99"],
            lat["max"],
            f"{r['missed']} of {r['occurrences']}",
            r["duplicated"],
            r["setup_seconds"],
            r["leader_cpu_pct"],
            r["worker_cpu_pct"],
            r.get("p99_vs_pgtick"),
        ]
        print("| " + " | ".join("—" if c is None else str(c) for c in cells) + " |")


def targets(records: list[dict[str, Any]]) -> Summary:
    """This run's targets: pgtick's p99 per scenario, nothing missed or run twice, the time
    to create 100,000 definitions, and each peer's p99 at least 10x pgtick's."""
    loads = [{"loadavg": r["load_after"].split()[0]} for r in records if r.get("load_after")]
    s = Summary(loads)
    pgtick = {r["scenario"]: r for r in records if r["system"] == "pgtick"}
    for name, r in pgtick.items():
        if "lateness_ms" not in r:
            s.add(f"{name}: pgtick ran", None, "ran", False, f"{r['status']}: {r['why']}")
            continue
        p99 = r["lateness_ms"]["p99"]
        goal = P99_TARGET_MS.get(name)
        if goal is not None:
            procs = r["worker_processes"]
            s.add(
                f"{name}: pgtick p99 ms ({procs} worker proc.)",
                p99,
                f"<= {goal}",
                p99 is not None and p99 <= goal,
            )
        wrong = r["missed"] + r["duplicated"]
        s.add(
            f"{name}: pgtick missed + run twice",
            wrong,
            "0",
            wrong == 0,
            f"{r['missed']} missed, {r['duplicated']} twice of {r['occurrences']}",
        )
        if (limit := SETUP_TARGET_S.get(name)) is not None:
            s.add(
                f"{name}: creating the definitions, s",
                r["setup_seconds"],
                f"<= {limit}",
                r["setup_seconds"] <= limit,
            )
    for r in records:
        base = pgtick.get(r["scenario"])
        if r["system"] == "pgtick" or base is None or "lateness_ms" not in base:
            continue
        label = f"{r['scenario']}: {r['system']} p99 / pgtick p99"
        if "lateness_ms" not in r:
            s.add(label, None, f">= {PEER_RATIO_TARGET}", None, f"{r['status']}: {r['why']}")
        elif r["started"] == 0:  # nothing of its own to compare: pgtick started them all
            s.add(
                label,
                None,
                f">= {PEER_RATIO_TARGET}",
                base["missed"] == 0,
                f"{r['system']} started none of {r['occurrences']}",
            )
        else:
            # A peer that never started more than 1 % of its occurrences has one of those as
            # its p99 occurrence, later than any start: the ratio over the runs it did start
            # understates it, and pgtick is ahead by any factor if it missed none.
            value = r.get("p99_vs_pgtick")
            unbounded = r["missed"] * 100 > r["occurrences"]
            note = f"{r['system']} missed {r['missed']} of {r['occurrences']}" if r["missed"] else ""
            if unbounded and (value is None or value < PEER_RATIO_TARGET):
                note += " (its p99 occurrence never started)"
            s.add(
                label,
                value,
                f">= {PEER_RATIO_TARGET}",
                value is not None and (value >= PEER_RATIO_TARGET or (unbounded and base["missed"] == 0)),
                note,
            )
    return s


def target_table(s: Summary) -> str:
    """The targets of one run, a line each."""
    lines = ["| target | measured | goal | status | note |", "|---|---|---|---|---|"]
    for r in s.rows:
        measured = "—" if r["measured"] is None else f"{r['measured']:g}"
        lines.append(f"| {r['target']} | {measured} | {r['goal']} | {r['status']} | {r['note']} |")
    return "\n".join(lines)


def report(runs: list[str]) -> int:
    """The targets over several runs (each the --out files of one run, comma-joined)."""
    summaries = []
    for run in runs:
        records: list[dict[str, Any]] = []
        for path in run.split(","):
            try:
                records += json.loads(Path(path).read_text())["records"]
            except (OSError, ValueError, KeyError) as exc:
                print(f"schedule.py: --report: cannot read {path}: {exc}", file=sys.stderr)
                return 2
        add_ratios(records)
        summaries.append(targets(records))
    print(combine(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
