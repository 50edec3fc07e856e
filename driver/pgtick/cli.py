"""The ``pgtick`` command line. Exit codes: 0 ok, 1 runtime failure, 2 usage error.

Every error is one readable line on stderr, never a traceback for a user mistake.
Without --dsn or $DATABASE_URL every command uses the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import psycopg

from pgtick import __version__, calls, migrate
from pgtick.db import connect, connect_dicts, resolve_dsn
from pgtick.errors import PgtickError, UsageError, translate_errors

log = logging.getLogger("pgtick.cli")

EXAMPLES = {
    "run": "pgtick run examples/app.py            # embedded PostgreSQL\n"
    "  pgtick run myproj.jobs:app --dsn postgresql://... --concurrency 20\n"
    "  pgtick run myproj.jobs:app --queues mail,reports   # claim only from these queues",
    "migrate": "pgtick migrate --dsn postgresql://localhost/app\n"
    "  pgtick migrate --sql | psql -v ON_ERROR_STOP=1 -d app",
    "define": "pgtick define weekday-report send-report "
    "--schedule 'FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0' --tz Europe/Sofia\n"
    "  pgtick define cleanup vacuum --schedule '*/15 * * * *' --cap 1 --overlap skip\n"
    "  pgtick define nightly etl --schedule '30 2 * * *' --tz America/New_York --dst-gap skip "
    "--jitter 5m --pause-after-failures 3\n"
    "  pgtick define launch announce --run-at 2026-12-24T18:00:00+02:00\n"
    "  pgtick define --from-file definitions.jsonl   # or .csv; one statement",
    "enqueue": 'pgtick enqueue send-email --payload \'{"to": "a@example.com"}\' --key order-42\n'
    "  pgtick enqueue sync-account --queue tenants --concurrency-key acme",
    "run-now": "pgtick run-now weekday-report",
    "cancel": "pgtick cancel 1234\n  pgtick cancel --definition weekday-report   # every queued run",
    "pause": "pgtick pause weekday-report",
    "resume": "pgtick resume weekday-report",
    "pause-queue": "pgtick pause-queue mail     # claims stop now; running jobs finish",
    "resume-queue": "pgtick resume-queue mail",
    "retry": "pgtick retry 1234",
    "status": "pgtick status\n  pgtick status --json\n  pgtick status --watch 2\n"
    "  pgtick status --limit 100 --offset 100",
    "runs": "pgtick runs --status FAILED --limit 20\n  pgtick runs --definition weekday-report",
    "preview": "pgtick preview 'FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0' "
    "--tz Europe/Sofia --count 10\n  pgtick preview '30 2 * * *' --tz America/New_York "
    "--after 2026-03-07\n  pgtick preview --definition weekday-report --count 5\n"
    "  pgtick preview '0 * * * *' --tz America/New_York --dst-repeat first",
    "backfill": "pgtick backfill weekday-report --from 2026-03-01T00:00Z --to 2026-03-08T00:00Z",
    "lock": "pgtick lock nightly-backup --ttl 10m -- /usr/local/bin/backup.sh --full",
    "dsn": 'psql "$(pgtick dsn)" -c "TABLE jobs.definition_health"',
}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_queue_list(text: str) -> list[str]:
    """'mail,reports' -> ['mail', 'reports'] (non-empty names of up to 200 characters)."""
    names = [name.strip() for name in text.split(",")]
    if not names or any(not name or len(name) > 200 for name in names):
        raise argparse.ArgumentTypeError(
            f"queues must be a comma-separated list of queue names, got {text!r}"
        )
    return names


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1.5h', '2d' -> seconds (positive)."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return seconds


def parse_instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2026-12-24T18:00:00+02:00)"
        ) from None
    return value


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"payload is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("payload must be a JSON object, e.g. '{\"a\": 1}'")
    return value


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _command(
    sub: Any, name: str, help_text: str, fn: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=f"example:\n  {EXAMPLES[name]}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(fn=fn)
    p.add_argument("--dsn", help="PostgreSQL URL (default: $DATABASE_URL, else embedded)")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="pgtick",
        description="pgtick: a job scheduler that lives inside PostgreSQL.",
        epilog="example:\n  pgtick run examples/app.py\n  pgtick status",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pgtick {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = _command(sub, "run", "run the scheduler and a worker for an app", cmd_run)
    p.add_argument("app", help="module:attr or path/to/app.py (attr defaults to app)")
    p.add_argument("--concurrency", type=int, default=10, help="jobs at once (default 10)")
    p.add_argument("--batch", type=int, default=None, help="claim batch size (default: concurrency)")
    p.add_argument("--tick", type=parse_duration, default=1.0, help="scheduler tick (default 1s)")
    p.add_argument("--poll", type=parse_duration, default=1.0, help="poll fallback (default 1s)")
    p.add_argument("--heartbeat", type=parse_duration, default=5.0, help="heartbeat cadence (5s)")
    p.add_argument("--grace", type=parse_duration, default=30.0, help="shutdown grace (30s)")
    p.add_argument("--no-scheduler", action="store_true", help="only work, never lead")
    p.add_argument("--no-worker", action="store_true", help="only schedule")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics")
    p.add_argument(
        "--metrics-per-definition",
        action="store_true",
        help="also label start lateness by definition id (one series per definition)",
    )
    p.add_argument("--migrate", action="store_true", help="migrate first (always when embedded)")
    p.add_argument(
        "--queues",
        type=parse_queue_list,
        default=None,
        help="claim only from these queues (a,b; default all)",
    )
    p.add_argument("--processes", type=int, default=1, help="worker processes under one supervisor (1)")

    p = _command(sub, "migrate", "install or upgrade the jobs schema", cmd_migrate)
    p.add_argument("--sql", action="store_true", help="print the install script for psql instead")

    p = _command(sub, "define", "create or replace a definition (or many, --from-file)", cmd_define)
    p.add_argument("name", nargs="?")
    p.add_argument("kind", nargs="?")
    p.add_argument(
        "--from-file",
        metavar="FILE",
        help="create or replace every definition in FILE in one statement: JSON lines "
        "(one object per line with the fields of jobs.define_many) or .csv with a header row",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument("--schedule", help="RRULE (FREQ=...) or 5-field cron")
    when.add_argument("--run-at", type=parse_instant, help="one-shot time, ISO 8601")
    p.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    p.add_argument("--payload", type=parse_json_object, default=None)
    p.add_argument("--cap", type=int, default=None, help="max concurrent runs")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--max-attempts", type=int, default=None)
    p.add_argument("--misfire", choices=["coalesce", "catch_up", "skip"], default="coalesce")
    p.add_argument("--overlap", choices=["queue", "skip", "buffer_one", "cancel_other"], default="queue")
    p.add_argument("--timeout", type=parse_duration, default=None)
    p.add_argument("--paused", action="store_true", help="define it paused")
    p.add_argument("--dst-gap", choices=["shift", "end", "skip"], default=None, help="default: auto")
    p.add_argument("--dst-repeat", choices=["first", "second", "both"], default=None, help="default: auto")
    p.add_argument("--jitter", type=parse_duration, default=None, help="delay each run by up to this")
    p.add_argument("--pause-after-failures", type=int, default=None, metavar="N")

    p = _command(sub, "backfill", "materialize a past window's occurrences once", cmd_backfill)
    p.add_argument("name")
    p.add_argument("--from", dest="window_from", type=parse_instant, required=True, help="ISO time")
    p.add_argument("--to", dest="window_to", type=parse_instant, required=True, help="ISO time")

    p = _command(sub, "enqueue", "queue an ad-hoc run", cmd_enqueue)
    p.add_argument("kind")
    p.add_argument("--payload", type=parse_json_object, default=None)
    p.add_argument("--run-at", type=parse_instant, default=None)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--key", default=None, help="idempotency key")
    p.add_argument("--queue", default="default", help="queue (default 'default')")
    p.add_argument("--concurrency-key", default=None, help="tenant/customer key for per-key limits")

    p = _command(sub, "run-now", "queue a run of a definition now", cmd_run_now)
    p.add_argument("name")

    p = _command(sub, "cancel", "cancel a run (or every queued run of a definition)", cmd_cancel)
    p.add_argument("run_id", nargs="?", type=int)
    p.add_argument("--definition", default=None)

    for name, verb in (("pause", "pause"), ("resume", "resume")):
        p = _command(sub, name, f"{verb} a definition", cmd_pause_resume)
        p.add_argument("name")

    p = _command(sub, "pause-queue", "stop claiming from a queue now (running jobs finish)", cmd_queue_pause)
    p.add_argument("name")
    p = _command(sub, "resume-queue", "resume claiming from a paused queue", cmd_queue_pause)
    p.add_argument("name")

    p = _command(sub, "retry", "retry a FAILED or CANCELLED run now", cmd_retry)
    p.add_argument("run_id", type=int)

    p = _command(sub, "status", "definitions, queues and the leader", cmd_status)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--watch", type=parse_duration, default=None, help="refresh every N seconds")
    p.add_argument("--limit", type=int, default=50, help="definitions shown (a page by name, default 50)")
    p.add_argument("--offset", type=int, default=0, help="definitions skipped before the page")

    p = _command(sub, "runs", "list recent runs", cmd_runs)
    p.add_argument("--status", choices=["QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"])
    p.add_argument("--kind")
    p.add_argument("--definition")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")

    p = _command(sub, "preview", "show the next occurrences of a schedule", cmd_preview)
    p.add_argument("schedule", nargs="?", help="RRULE or cron text (or give --definition)")
    p.add_argument("--definition", default=None, help="preview a stored definition as the scheduler will")
    p.add_argument("--tz", default=None, help="IANA time zone (default UTC)")
    p.add_argument("--after", type=parse_instant, default=None, help="ISO time (default now)")
    p.add_argument("--count", type=int, default=10)
    p.add_argument(
        "--anchor",
        type=parse_instant,
        default=None,
        help="start of a rule without DTSTART (default: local midnight of the --after day)",
    )
    p.add_argument("--dst-gap", choices=["shift", "end", "skip"], default=None, help="default: auto")
    p.add_argument("--dst-repeat", choices=["first", "second", "both"], default=None, help="default: auto")

    p = _command(sub, "lock", "run a command under a lease; skip if it is held", cmd_lock)
    p.add_argument("name")
    p.add_argument("--ttl", type=parse_duration, required=True, help="lease time to live")
    p.add_argument("--owner", default=None, help="owner id (default host-pid-random)")
    p.add_argument("--skipped-exit", type=int, default=75, help="exit code when held (75)")
    # Filled from whatever follows the first `--` (see main): a REMAINDER positional
    # after NAME would swallow the options that follow it (`NAME --ttl 5m -- cmd`).
    p.add_argument("cmd", nargs="*", metavar="-- COMMAND", help="the command and its arguments")

    _command(sub, "dsn", "print the DSN in use (starts the embedded server if needed)", cmd_dsn)
    return parser


# -- helpers ------------------------------------------------------------------------

_embedded: Any = None


def _start_embedded() -> str:
    global _embedded
    from pgtick.embedded import EmbeddedPostgres

    _embedded = EmbeddedPostgres()
    dsn: str = _embedded.start()
    print(f"pgtick: embedded PostgreSQL, data in {_embedded.data_dir}", file=sys.stderr)
    with connect(dsn) as conn:
        # Always through the migration lock: checking versions first would race a
        # concurrent migrator between its migration commit and its function commit.
        migrate.apply(conn)
    return dsn


def _dsn(args: argparse.Namespace) -> str:
    return resolve_dsn(getattr(args, "dsn", None), _start_embedded)


def _print_table(rows: Sequence[dict[str, Any]], empty: str) -> None:
    from tabulate import tabulate

    if not rows:
        print(empty)
        return
    print(tabulate([{k: _cell(v) for k, v in r.items()} for r in rows], headers="keys"))


def _cell(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            # Already a wall-clock time in a named zone (next_run_local): astimezone() would
            # read it as this machine's local time and shift it.
            return value.strftime("%Y-%m-%d %H:%M:%S")
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, timedelta):
        return f"{value.total_seconds():.1f}s"
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value)[:60]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


# -- commands -------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from pgtick import supervisor
    from pgtick.runner import RunOptions, load_app, run_app

    if args.processes < 1:
        raise UsageError(f"--processes must be at least 1, got {args.processes}")
    app = load_app(args.app)
    dsn = _dsn(args)
    if args.migrate and supervisor.child_index() is None:
        with connect(dsn) as conn:
            migrate.apply(conn)
    options = RunOptions(
        concurrency=args.concurrency,
        batch_size=args.batch,
        tick_interval=args.tick,
        poll_interval=args.poll,
        heartbeat_interval=args.heartbeat,
        shutdown_grace=args.grace,
        scheduler=not args.no_scheduler,
        worker=not args.no_worker,
        metrics_port=args.metrics_port,
        metrics_per_definition=args.metrics_per_definition,
        queues=args.queues,
    )
    if _embedded is not None:
        print(f'pgtick: watch it with: psql "{_embedded.dsn}"', file=sys.stderr)
    try:
        if args.processes > 1:
            return supervisor.run_supervised(app, dsn, options, args.processes)
        stop = supervisor.stop_when_supervisor_says() if supervisor.child_index() is not None else None
        return run_app(app, dsn, options, stop)
    finally:
        if _embedded is not None:
            _embedded.stop()


def cmd_migrate(args: argparse.Namespace) -> int:
    if args.sql:
        sys.stdout.write(migrate.install_script())
        return 0
    with connect(_dsn(args)) as conn:
        done = migrate.apply(conn)
    print(f"applied migrations: {', '.join(done)}" if done else "schema up to date")
    return 0


def cmd_define(args: argparse.Namespace) -> int:
    from pgtick.definitions import define, define_many, read_definitions, validate_schedule

    if args.from_file is not None:
        if args.name or args.kind or args.schedule or args.run_at:
            raise UsageError("--from-file takes its definitions from the file: give no NAME, KIND or times")
        definitions = read_definitions(args.from_file)
        with connect_dicts(_dsn(args)) as conn, conn.transaction():
            rows = define_many(conn, definitions)
        created = sum(1 for r in rows if r["created"])
        rescheduled = sum(1 for r in rows if r["rescheduled"])
        print(f"definitions={len(rows)} created={created} rescheduled={rescheduled} saved")
        return 0
    if not args.name or not args.kind or (args.schedule is None) == (args.run_at is None):
        raise UsageError("give NAME KIND and one of --schedule or --run-at (or --from-file FILE)")

    if args.schedule is not None:  # before any connection: a typo fails fast
        validate_schedule(
            args.schedule,
            args.tz,
            args.name,
            dst_gap=args.dst_gap,
            dst_repeat=args.dst_repeat,
            jitter=timedelta(seconds=args.jitter) if args.jitter else None,
        )

    with connect_dicts(_dsn(args)) as conn:
        row = define(
            conn,
            args.name,
            args.kind,
            schedule=args.schedule,
            timezone=args.tz,
            run_at=args.run_at,
            payload=args.payload,
            max_concurrent_runs=args.cap,
            priority=args.priority,
            max_attempts=args.max_attempts,
            misfire_policy=args.misfire,
            overlap_policy=args.overlap,
            timeout=timedelta(seconds=args.timeout) if args.timeout else None,
            enabled=False if args.paused else None,
            dst_gap=args.dst_gap,
            dst_repeat=args.dst_repeat,
            jitter=timedelta(seconds=args.jitter) if args.jitter else None,
            pause_after_failures=args.pause_after_failures,
        )
    print(f"definition={row['name']} id={row['id']} revision={row['revision']} saved")
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from pgtick.scheduler import materialize_backfills

    for value in (args.window_from, args.window_to):
        if value.tzinfo is None:
            raise UsageError("--from and --to need a UTC offset (e.g. 2026-03-01T00:00Z)")
    with connect_dicts(_dsn(args)) as conn:
        row = conn.execute(
            "SELECT * FROM jobs.backfill(%s, %s, %s)", (args.name, args.window_from, args.window_to)
        ).fetchone()
        assert row is not None
        materialize_backfills(conn)
        done = conn.execute("SELECT * FROM jobs.backfills WHERE id = %s", (row["id"],)).fetchone()
    assert done is not None
    if done["error"]:
        raise UsageError(f"definition={args.name} backfill {row['id']}: {done['error']}")
    print(
        f"definition={args.name} backfill={row['id']} runs={done['runs_created'] or 0} "
        "(occurrences that already had a run were left alone)"
    )
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    from psycopg.types.json import Jsonb

    with connect_dicts(_dsn(args)) as conn:
        row = calls.enqueue(
            conn,
            args.kind,
            Jsonb(args.payload or {}),
            args.run_at,
            args.priority,
            args.key,
            queue=args.queue,
            concurrency_key=args.concurrency_key,
        )
    assert row is not None
    print(
        f"run={row['id']} kind={row['kind']} status={row['status']}"
        f" scheduled_for={_cell(row['scheduled_for'])}"
    )
    return 0


def cmd_run_now(args: argparse.Namespace) -> int:
    with connect_dicts(_dsn(args)) as conn:
        row = calls.run_now(conn, args.name)
    assert row is not None
    print(f"run={row['id']} definition={args.name} queued")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    if (args.run_id is None) == (args.definition is None):
        raise UsageError("give a RUN_ID or --definition NAME")
    with connect(_dsn(args)) as conn:
        if args.definition is not None:
            n = calls.cancel_queued(conn, args.definition)
            print(f"definition={args.definition} cancelled {n} queued runs")
        else:
            status = calls.cancel(conn, args.run_id)
            note = " (cancel requested; stops at its next checkpoint)" if status == "RUNNING" else ""
            print(f"run={args.run_id} status={status}{note}")
    return 0


def cmd_pause_resume(args: argparse.Namespace) -> int:
    call = calls.pause if args.command == "pause" else calls.resume
    with connect(_dsn(args)) as conn:
        call(conn, args.name)
    print(f"definition={args.name} {'paused' if args.command == 'pause' else 'resumed'}")
    return 0


def cmd_queue_pause(args: argparse.Namespace) -> int:
    pause = args.command == "pause-queue"
    with connect(_dsn(args)) as conn:
        changed = calls.pause_queue(conn, args.name) if pause else calls.resume_queue(conn, args.name)
    state = "paused" if pause else "resumed"
    print(
        f"queue={args.name} {state}"
        if changed
        else f"queue={args.name} already {state if pause else 'running'}"
    )
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    with connect_dicts(_dsn(args)) as conn:
        row = calls.retry(conn, args.run_id)
    assert row is not None
    print(f"run={args.run_id} retried as run={row['id']} attempt={row['attempt']}")
    return 0


def status_snapshot(conn: psycopg.Connection[Any], limit: int = 50, offset: int = 0) -> dict[str, Any]:
    """The leader, a summary of all definitions, one page of them by name, and the queues."""
    return {
        "leader": calls.leader(conn),
        "summary": calls.definition_summary(conn),
        "definitions": calls.definition_health(conn, limit, offset),
        "queues": calls.queue_stats(conn),
    }


#: The jobs.queue_stats columns `pgtick status` shows as a table (--json has them all).
QUEUE_COLUMNS = (
    "kind",
    "queue",
    "paused",
    "queued",
    "scheduled",
    "running",
    "blocked",
    "rate_limited",
    "completed_1h",
    "failed_1h",
    "oldest_queued_age",
)


def cmd_status(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 10000 or args.offset < 0:
        raise UsageError("--limit must be 1..10000 and --offset at least 0")
    with connect_dicts(_dsn(args)) as conn:
        while True:
            snap = status_snapshot(conn, args.limit, args.offset)
            if args.json:
                print(json.dumps(snap, default=_json_default))
            else:
                if args.watch:
                    print("\033[2J\033[H", end="")
                leader = snap["leader"]
                print(
                    f"leader: {leader[0]['owner']} (pid {leader[0]['pid']}) since {_cell(leader[0]['since'])}"
                    if leader
                    else "leader: none (no scheduler running)"
                )
                print("\ndefinitions:")
                _print_table(snap["definitions"], "  (none)")
                summary = snap["summary"]
                print(
                    f"  ({summary['definitions']} in all, {summary['paused']} paused,"
                    f" {summary['schedule_errors']} with schedule errors,"
                    f" {summary['materialize_errors']} failing to materialize;"
                    f" this page: {len(snap['definitions'])} from #{args.offset + 1} by name)"
                )
                print("\nqueues:")
                _print_table(
                    [{k: q[k] for k in QUEUE_COLUMNS if k in q} for q in snap["queues"]], "  (empty)"
                )
            if not args.watch:
                return 0
            sys.stdout.flush()
            time.sleep(args.watch)


def cmd_runs(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 10000:
        raise UsageError("--limit must be 1..10000")
    with connect_dicts(_dsn(args)) as conn:
        rows = calls.run_list(conn, args.status, args.kind, args.definition, args.limit)
    if args.json:
        print(json.dumps(rows, default=_json_default))
    else:
        _print_table(rows, "(no runs)")
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    from zoneinfo import ZoneInfo

    from pgtick.schedule import ScheduleError, anchor_for, format_preview, header, parse_schedule

    if not 1 <= args.count <= 1000:
        raise UsageError("--count must be 1..1000")
    if (args.schedule is None) == (args.definition is None):
        raise UsageError("give a schedule or --definition NAME (not both)")
    if args.definition is not None:
        if args.anchor is not None or args.tz is not None:
            raise UsageError("--anchor and --tz come from the definition; leave them out with --definition")
        return _preview_definition(args)
    tz = args.tz or "UTC"
    after = args.after or datetime.now(UTC)
    try:
        if after.tzinfo is None:
            after = after.replace(tzinfo=ZoneInfo(tz))
        if args.anchor is None:  # as if the definition were created at the start of the preview
            anchor = anchor_for(after, tz)
            note = (
                "as if defined now: local midnight today"
                if args.after is None
                else "as if defined at --after: local midnight that day"
            )
        else:
            anchor = args.anchor if args.anchor.tzinfo else args.anchor.replace(tzinfo=ZoneInfo(tz))
            note = "--anchor"
        schedule = parse_schedule(
            args.schedule, tz, anchor=anchor, dst_gap=args.dst_gap, dst_repeat=args.dst_repeat
        )
        lines = format_preview(schedule, after, args.count)
    except (ScheduleError, LookupError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"next {args.count} runs of {args.schedule!r} in {tz} (local, then UTC):")
    for line in header(schedule, anchor_note=note):
        print(f"  {line}")
    for line in lines:
        print(f"  {line}")
    return 0


def _preview_definition(args: argparse.Namespace) -> int:
    """A stored definition's next runs exactly as the scheduler will materialize them."""
    from pgtick.schedule import ScheduleError, format_preview, header
    from pgtick.scheduler import definition_schedule

    with connect_dicts(_dsn(args)) as conn:
        d = conn.execute("SELECT * FROM jobs.definitions WHERE name = %s", (args.definition,)).fetchone()
        if d is None:
            raise UsageError(f"definition {args.definition!r} does not exist")
        if d["schedule"] is None:
            raise UsageError(f"definition {args.definition!r} is a one-shot at {d['run_at'].isoformat()}")
        if args.dst_gap is not None or args.dst_repeat is not None:
            d = {**d, "dst_gap": args.dst_gap or d["dst_gap"]}
            d["dst_repeat"] = args.dst_repeat or d["dst_repeat"]
        after = args.after or datetime.now(UTC)
        if after.tzinfo is None:
            raise UsageError("--after needs a UTC offset with --definition")

        def jitter(runs: Sequence[datetime]) -> list[timedelta]:
            rows = conn.execute(
                "SELECT jobs.jitter_offset(%s, t, %s) AS j FROM unnest(%s::timestamptz[]) AS t",
                (d["id"], d["jitter"], list(runs)),
            ).fetchall()
            return [row["j"] for row in rows]

        try:
            schedule = definition_schedule(d)
            lines = format_preview(schedule, after, args.count, delay=jitter)
        except ScheduleError as exc:
            raise UsageError(str(exc)) from exc
    print(f"next {args.count} runs of definition {d['name']!r} ({d['schedule']!r} in {d['timezone']}):")
    for line in header(schedule, anchor_note="local midnight of the day it was created"):
        print(f"  {line}")
    for line in lines:
        print(f"  {line}")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from pgtick.lock import run_locked

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("give the command to run after --, e.g. pgtick lock NAME --ttl 5m -- cmd")
    return run_locked(_dsn(args), args.name, args.ttl, cmd, owner=args.owner, skipped_exit=args.skipped_exit)


def cmd_dsn(args: argparse.Namespace) -> int:
    print(_dsn(args))
    return 0


# -- entry point ----------------------------------------------------------------------


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse argv; for ``pgtick lock ... -- CMD ARGS`` everything after the first ``--``
    is the command, verbatim (its own options included)."""
    if "--" in argv:
        split = argv.index("--")
        head, command = argv[:split], argv[split + 1 :]
        subcommand = next((a for a in head if not a.startswith("-")), None)
        if subcommand == "lock":
            args = parser.parse_args(head)
            args.cmd = command
            return args
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else getattr(logging, os.environ.get("PGTICK_LOG", "INFO")),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with translate_errors():  # the SQL API's bad input -> InvalidArgument / NotFound (exit 2)
            return int(args.fn(args))
    except UsageError as exc:
        print(f"pgtick {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except PgtickError as exc:
        print(f"pgtick {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"pgtick {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
