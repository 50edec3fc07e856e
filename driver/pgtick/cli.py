"""The ``pgtick`` command line. Exit codes: 0 ok, 1 runtime failure, 2 usage error.

Results go to stdout, diagnostics to stderr (WARNING and up unless -v). Every
error is one readable line on stderr, never a traceback for a user mistake.
Without --dsn or $DATABASE_URL every command uses the embedded PostgreSQL.

A command is registered in ``build_parser`` with ``_command`` (name, help,
function, what output options it takes) and an example in ``EXAMPLES``; it
returns a ``Result``: the data (what ``--json`` prints, documented in
docs/cli.md) and how to show it to a person. Tables and marks live in
``pgtick.terminal``; the facts come from SQL (``sql/console.sql``).
"""

from __future__ import annotations

import argparse
import difflib
import io
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg

from pgtick import __version__, calls, db, json_numbers, migrate
from pgtick.client import BIGINT_MAX, MAX_DURATION, RANGES, parse_time, read_time
from pgtick.db import resolve_dsn, without_password
from pgtick.errors import InvalidArgument, PgtickError, Session, UsageError, translate_errors
from pgtick.schedule.zones import strftime
from pgtick.terminal import (
    Column,
    Style,
    Table,
    clip,
    compact_duration,
    counted,
    display_now,
    fit_screen,
    full_time,
    iso,
    local_time,
    mark,
    outcome_of,
    paint,
    printable,
    printable_line,
    redraws,
    relative,
    seconds,
    status_word,
    to_csv,
    to_json,
    utf8,
    visible_len,
    wrap,
)

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from pgtick.schedule import Occurrence, Schedule

log = logging.getLogger("pgtick.cli")

EXAMPLES = {
    "run": "pgtick run examples/app.py            # embedded PostgreSQL\n"
    "  pgtick run myproj.jobs:app --dsn postgresql://... --concurrency 20\n"
    "  pgtick run myproj.jobs:app --log-format json   # one JSON object per line\n"
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
    "scope-worker": "pgtick scope-worker mail_worker --kinds send-email,send-sms --queues mail",
    "unscope-worker": "pgtick unscope-worker mail_worker",
    "retry": "pgtick retry 1234",
    "status": "pgtick status\n  pgtick status --wide --recent 20\n  pgtick status --json\n"
    "  pgtick status --watch 2\n  pgtick status --limit 100 --offset 100",
    "runs": "pgtick runs --status FAILED --limit 20\n  pgtick runs --definition weekday-report\n"
    "  pgtick runs --format csv > runs.csv",
    "show": "pgtick show 1234\n  pgtick show 1234 --json | jq .attempts",
    "undefine": "pgtick undefine weekday-report",
    "workers": "pgtick workers\n  pgtick workers --all     # stopped and lost ones too",
    "prune": "pgtick prune --dry-run\n  pgtick prune --older-than 7d",
    "definitions": "pgtick definitions\n  pgtick definitions --kind send-report --paused\n"
    "  pgtick definitions --name 'nightly-%' --format csv",
    "preview": "pgtick preview 'FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0' "
    "--tz Europe/Sofia --count 10\n  pgtick preview '30 2 * * *' --tz America/New_York "
    "--after 2026-03-07\n  pgtick preview --definition weekday-report --count 5\n"
    "  pgtick preview '0 * * * *' --tz America/New_York --dst-repeat first",
    "backfill": "pgtick backfill weekday-report --from 2026-03-01T00:00Z --to 2026-03-08T00:00Z",
    "lock": "pgtick lock nightly-backup --ttl 10m -- /usr/local/bin/backup.sh --full",
    "dsn": 'psql "$(pgtick dsn)" -c "TABLE jobs.definition_health"',
    "web": "PGTICK_WEB_PASSWORD='long secret' pgtick web --bind 127.0.0.1:8080",
}

PRIORITY_HELP = "higher is claimed first (-1000..1000, default 0)"

STATUSES = ["QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"]

# -- typed arguments -------------------------------------------------------------------
# Every value typed on the command line is parsed here, once, into what the SQL API takes
# and within the range it documents; a bad one is one line naming the option, exit 2,
# before any connection.

# ASCII digits only: Python's \d and int() also take the digits of other scripts.
_INTEGER = re.compile(r"^\s*([+-]?)([0-9]+)\s*$")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        match = _INTEGER.match(text)
        if not match:
            raise argparse.ArgumentTypeError(
                f"must be a whole number between {low} and {high} (got {_shown(text)})"
            )
        digits = match.group(2).lstrip("0") or "0"
        if len(digits) > 19:  # past bigint, and too long to be worth converting
            raise argparse.ArgumentTypeError(f"must be between {low} and {high} (got {_shown(text)})")
        value = int(match.group(1) + digits)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high} (got {value})")
        return value

    return parse


def sql_integer(field: str) -> Callable[[str], int]:
    """An argparse type for the SQL API's integer ``field``, in its documented range."""
    return integer(*RANGES[field])


RUN_ID = sql_integer("run_id")


def duration(maximum: timedelta = MAX_DURATION, minimum: timedelta | None = None) -> Callable[[str], float]:
    """An argparse type: '90', '90s', '5m', '1.5h', '2d' -> seconds, positive, at most
    ``maximum`` and, given, at least ``minimum``."""
    longest = maximum.total_seconds()
    shortest = minimum.total_seconds() if minimum is not None else 0.0

    def parse(text: str) -> float:
        match = _DURATION.match(text)
        if not match:
            raise argparse.ArgumentTypeError(f"not a duration: {_shown(text)} (use e.g. 30s, 5m, 1h, 2d)")
        value = float(match.group(1)) * _UNITS[match.group(2)]
        if not value > 0:
            raise argparse.ArgumentTypeError(f"duration must be positive (got {_shown(text)})")
        if minimum is not None and value < shortest:
            raise argparse.ArgumentTypeError(
                f"must be at least {compact_duration(minimum)} (got {_shown(text)})"
            )
        if not value <= longest:  # also an overflow to infinity
            raise argparse.ArgumentTypeError(
                f"must be at most {compact_duration(maximum)} (got {_shown(text)})"
            )
        return value

    return parse


parse_duration = duration()


def one_line_text(longest: int, *, line_breaks: bool = False) -> Callable[[str], str]:
    """An argparse type: 1 to ``longest`` characters, none of them a control character (but
    line breaks, with ``line_breaks``)."""
    allowed = "\n\r" if line_breaks else ""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("must not be empty")
        if len(text) > longest:
            raise argparse.ArgumentTypeError(f"must be at most {longest} characters (got {len(text)})")
        if any(unicodedata.category(c) in ("Cc", "Cs") and c not in allowed for c in text):
            raise argparse.ArgumentTypeError(f"must not contain control characters (got {_shown(text)})")
        return text

    return parse


#: Names, kinds, queues and keys, as the SQL API stores a name.
name_text = one_line_text(200)
_rrule_lines = one_line_text(4000, line_breaks=True)
_cron_line = one_line_text(4000)


def schedule_text(text: str) -> str:
    """An argparse type: schedule text (RRULE or cron), as jobs.define takes it. RRULE text may
    hold DTSTART, RDATE and EXDATE lines beside its RRULE line; cron is one line."""
    from pgtick.schedule.occurrences import looks_like_cron

    return _cron_line(text) if looks_like_cron(text) else _rrule_lines(text)


def name_list(what: str) -> Callable[[str], list[str]]:
    """An argparse type: 'mail,reports' -> ['mail', 'reports'] (names as ``name_text`` takes
    them, at most 1000, as the SQL API's name arrays hold)."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",")]
        if len(names) > 1000:
            raise argparse.ArgumentTypeError(f"must list at most 1000 {what} names (got {len(names)})")
        try:
            return [name_text(name) for name in names]
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of {what} names: {exc} in {_shown(text)}"
            ) from None

    return parse


parse_queue_list = name_list("queue")


def parse_role(text: str) -> str:
    """An argparse type: a PostgreSQL role name as typed (at most 63 bytes, which PostgreSQL
    would otherwise cut silently)."""
    name_text(text)
    if len(text.encode()) > 63:
        raise argparse.ArgumentTypeError(
            f"must be at most 63 bytes, as PostgreSQL role names are (got {len(text.encode())})"
        )
    return text


def parse_zone(text: str) -> str:
    """An argparse type: an IANA time zone name the driver and the database both know."""
    from pgtick.schedule.zones import ScheduleError, load_zone, not_a_place

    name_text(text)
    why = not_a_place(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    try:
        load_zone(text)
    except ScheduleError:
        raise argparse.ArgumentTypeError(
            f"not a known IANA time zone name: {_shown(text)} (e.g. Europe/Sofia, UTC)"
        ) from None
    return text


def parse_dsn(text: str) -> str:
    """An argparse type: a libpq connection string or URL that libpq can parse."""
    from psycopg.conninfo import conninfo_to_dict

    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave it out for $DATABASE_URL or embedded)")
    try:
        conninfo_to_dict(text)
    except psycopg.ProgrammingError as exc:
        raise argparse.ArgumentTypeError(
            f"not a connection string or URL: {without_password(str(exc))}"
        ) from None
    return text


def parse_instant(text: str) -> datetime:
    """An argparse type: ISO 8601, with or without a UTC offset. Without one, the command
    reads it with ``read_time`` in its zone (--tz, or the definition's)."""
    try:
        return parse_time(text, "time")
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("time: ")) from None


def parse_json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object as PostgreSQL's jsonb takes it."""
    from pgtick.definitions import read_json

    try:
        value = read_json(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"payload {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("payload must be a JSON object, e.g. '{\"a\": 1}'")
    return value


def _shown(text: str) -> str:
    """A typed value quoted for an error line, cut short and with control characters escaped."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _as_utf8(text: str) -> tuple[str, str | None]:
    """An argument or environment variable as UTF-8 text, and None; or, when its bytes are not
    UTF-8 (the shell passed bytes), as given, and those bytes shown with replacement characters.
    In a locale whose encoding is not UTF-8 (``LC_ALL=C``) Python keeps the bytes it could not
    decode as surrogates: text whose bytes are UTF-8 is read as UTF-8, the encoding of
    everything pgtick stores."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = text.encode(sys.getfilesystemencoding(), "surrogateescape")
        except UnicodeError:  # not bytes of the command line (a lone surrogate given to main)
            raw = text.encode("utf-8", "replace")
        try:
            return raw.decode("utf-8"), None
        except UnicodeDecodeError:
            return text, raw.decode("utf-8", "replace")
    return text, None


def _argv_as_text(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """The arguments as text (``_as_utf8``), and the first one that is not valid UTF-8, if any."""
    text: list[str] = []
    for arg in argv:
        arg, undecodable = _as_utf8(arg)
        if undecodable is not None:
            return text, undecodable
        text.append(arg)
    return text, None


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exits 2, and lets a failure to write
    its help or usage reach the caller (argparse drops it and exits 0 as if it had been shown)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if not message:
            return
        if file is None or file is sys.stderr:  # a usage error still exits 2 (as _say)
            with suppress(OSError, ValueError, AttributeError):
                sys.stderr.write(message)
                sys.stderr.flush()
            return
        file.write(message)
        flush = getattr(file, "flush", None)
        if flush is not None:
            flush()

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # one line, whatever argparse built
        unknown = re.fullmatch(r"argument COMMAND: invalid choice: '(.*)' \(choose from (.*)\)", message)
        if unknown:  # a mistyped command: the closest one, not the list of all 25
            close = difflib.get_close_matches(unknown[1], re.findall(r"'([^']*)'", unknown[2]), n=1)
            guess = f"; did you mean {close[0]}?" if close else ""
            message = f"COMMAND: invalid choice: {_shown(db.without_password(unknown[1]))}{guess}"
        self.exit(2, f"{self.prog}: error: {message.removeprefix('argument ')} (see {self.prog} --help)\n")


# -- results ------------------------------------------------------------------------


@dataclass
class Result:
    """What a command found or did: ``data`` for --json (and csv), ``text`` for a person."""

    data: Any
    text: Callable[[Style, bool], str] | None = None
    csv_fields: Sequence[str] | None = None  # a list: --format csv writes these columns
    code: int = 0


def _emit(args: argparse.Namespace, result: Result) -> int:
    fmt = getattr(args, "format", None) or ("json" if getattr(args, "json", False) else "table")
    if fmt == "json":
        _write_out(to_json(result.data, ascii_only=not utf8(sys.stdout)) + "\n")
    elif fmt == "csv":
        assert result.csv_fields is not None
        _write_out(to_csv(result.data, result.csv_fields) + "\n")
    elif result.text is not None:
        text = result.text(Style.detect(sys.stdout), bool(getattr(args, "wide", False)))
        if text:
            _write_out(text + "\n")
    return result.code


def _write_out(text: str) -> None:
    """Write ``text`` to standard output in pieces that fit its buffer. One larger write goes
    to the pipe at once, and when the reader leaves in the middle of it (``| head``) the
    kernel takes part of it and Python drops the rest without an error; a piece through the
    buffer raises BrokenPipeError instead, which ``main`` turns into exit 1."""
    piece = io.DEFAULT_BUFFER_SIZE // 4  # characters: at most 4 bytes each in UTF-8
    for start in range(0, len(text), piece):
        sys.stdout.write(text[start : start + piece])


# -- parser ---------------------------------------------------------------------------


def _command(
    sub: Any,
    name: str,
    help_text: str,
    fn: Callable[[argparse.Namespace], Result | int],
    *,
    output: str | None = "json",
) -> argparse.ArgumentParser:
    """Register a command. ``output``: "json" (--json), "table" (--json, --wide),
    "list" (--json, --wide, --format table|csv|json) or None (no machine output)."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=f"example:\n  {EXAMPLES[name]}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(fn=fn)
    p.add_argument("--dsn", type=parse_dsn, help="PostgreSQL URL (default: $DATABASE_URL, else embedded)")
    # Also after the command (pgtick status -v); unset here unless given, so that a -v given
    # before the command is not overwritten by this one's default.
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="as pgtick -v")
    if output is not None:
        formats = p.add_mutually_exclusive_group()  # --json is --format json: one of them
        formats.add_argument("--json", action="store_true", help="print JSON (schema: docs/cli.md)")
    if output in ("table", "list"):
        p.add_argument("--wide", action="store_true", help="every column, nothing cut")
    if output == "list":
        formats.add_argument(
            "--format", choices=["table", "csv", "json"], default=None, help="output format (table)"
        )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="pgtick",
        description="pgtick: a job scheduler that lives inside PostgreSQL.",
        epilog="example:\n  pgtick run examples/app.py\n  pgtick status",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="show the version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="diagnostics down to DEBUG")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = _command(sub, "run", "run the scheduler and a worker for an app", cmd_run, output=None)
    p.add_argument("app", help="module:attr or path/to/app.py (attr defaults to app)")
    p.add_argument(
        "--concurrency", type=integer(1, 1000), default=10, help="jobs at once (1..1000, default 10)"
    )
    p.add_argument(
        "--batch",
        type=integer(1, 1000),
        default=None,
        help="claim batch size (1..1000, default: concurrency); larger claims runs ahead of free slots",
    )
    p.add_argument(
        "--claimers",
        type=integer(1, 16),
        default=1,
        help="claims in flight while runs are waiting, each for --batch free slots (1..16, default 1)",
    )
    p.add_argument(
        "--tick",
        type=duration(timedelta(days=1)),
        default=1.0,
        help="scheduler tick (default 1s, at most 1d)",
    )
    p.add_argument("--poll", type=parse_duration, default=1.0, help="poll fallback (default 1s)")
    p.add_argument("--heartbeat", type=parse_duration, default=5.0, help="heartbeat cadence (5s)")
    p.add_argument("--grace", type=parse_duration, default=30.0, help="shutdown grace (30s)")
    p.add_argument("--no-scheduler", action="store_true", help="only work, never lead")
    p.add_argument("--no-worker", action="store_true", help="only schedule")
    p.add_argument(
        "--metrics-port",
        type=integer(0, 65535),
        default=None,
        help="serve Prometheus metrics on this port (0..65535)",
    )
    p.add_argument(
        "--metrics-bind",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="the address the metrics endpoint listens on (default 0.0.0.0: every interface;"
        " 127.0.0.1 keeps it to this machine)",
    )
    p.add_argument(
        "--metrics-per-definition",
        action="store_true",
        help="also serve start lateness per definition id"
        " (pgtick_definition_start_lateness_seconds, one series per definition)",
    )
    p.add_argument("--migrate", action="store_true", help="migrate first (always when embedded)")
    p.add_argument("--no-listen", action="store_true", help="poll only (automatic behind a pooler)")
    p.add_argument(
        "--leadership",
        choices=["auto", "lock", "lease"],
        default="auto",
        help="lead by session lock or by lease (auto: lease behind a pooler)",
    )
    p.add_argument(
        "--lease-ttl",
        type=duration(timedelta(days=1)),
        default=None,
        help="leader lease TTL (default 5s or five ticks, the longer; at most 1d)",
    )
    p.add_argument(
        "--log-format",
        choices=["human", "json"],
        default=os.environ.get("PGTICK_LOG_FORMAT") or None,
        help="log lines as text or JSON objects (default: $PGTICK_LOG_FORMAT, else human)",
    )
    p.add_argument(
        "--queues",
        type=parse_queue_list,
        default=None,
        help="claim only from these queues (a,b; default all)",
    )
    p.add_argument(
        "--processes",
        type=integer(1, 256),
        default=1,
        help="worker processes under one supervisor (1..256, default 1)",
    )
    p.add_argument("--web", metavar="ADDR", default=None, help="also serve the dashboard on HOST:PORT")

    p = _command(sub, "migrate", "install or upgrade the jobs schema", cmd_migrate)
    p.add_argument("--sql", action="store_true", help="print the install script for psql instead")

    p = _command(sub, "define", "create or replace a definition (or many, --from-file)", cmd_define)
    p.add_argument("name", nargs="?", type=name_text)
    p.add_argument("kind", nargs="?", type=name_text)
    p.add_argument(
        "--from-file",
        metavar="FILE",
        help="create or replace every definition in FILE in one statement: JSON lines "
        "(one object per line with the fields of jobs.define_many) or .csv with a header row",
    )
    # The fields of one definition: --from-file takes every field from its file and refuses
    # these, so each defaults to None (False) here and to DEFINE_DEFAULTS in cmd_define.
    group = p.add_argument_group("definition fields", "(with --from-file, the file gives every field)")
    when = group.add_mutually_exclusive_group()
    fields = [
        when.add_argument("--schedule", type=schedule_text, help="RRULE (FREQ=...) or 5-field cron"),
        when.add_argument(
            "--run-at", type=parse_instant, help="one-shot time, ISO 8601 (without an offset: in --tz)"
        ),
        group.add_argument("--tz", type=parse_zone, help="IANA time zone (default UTC)"),
        group.add_argument("--payload", type=parse_json_object),
        group.add_argument(
            "--cap", type=sql_integer("max_concurrent_runs"), help="max concurrent runs (1..100000)"
        ),
        group.add_argument("--priority", type=sql_integer("priority"), help=PRIORITY_HELP),
        group.add_argument(
            "--max-attempts",
            type=sql_integer("max_attempts"),
            help="attempts, the first included (1..1000; default: the retry policy)",
        ),
        group.add_argument("--misfire", choices=["coalesce", "catch_up", "skip"], help="default coalesce"),
        group.add_argument(
            "--overlap", choices=["queue", "skip", "buffer_one", "cancel_other"], help="default queue"
        ),
        group.add_argument(
            "--timeout",
            type=duration(timedelta(days=366), minimum=timedelta(seconds=1)),
            help="a run's time limit (1s to 366d)",
        ),
        group.add_argument(
            "--heartbeat-timeout",
            type=duration(timedelta(days=366), minimum=timedelta(seconds=1)),
            help="a run is reaped when its worker sends no heartbeat for this long"
            " (default: the config's; 1s to 366d)",
        ),
        group.add_argument("--queue", type=name_text, help="queue its runs go to (default 'default')"),
        group.add_argument(
            "--concurrency-key", type=name_text, help="tenant/customer key its runs carry for per-key limits"
        ),
        group.add_argument("--paused", action="store_true", help="define it paused"),
        group.add_argument("--dst-gap", choices=["shift", "end", "skip"], help="default: auto"),
        group.add_argument("--dst-repeat", choices=["first", "second", "both"], help="default: auto"),
        group.add_argument(
            "--jitter", type=duration(timedelta(days=1)), help="delay each run by up to this (at most 1d)"
        ),
        group.add_argument(
            "--pause-after-failures",
            type=sql_integer("pause_after_failures"),
            metavar="N",
            help="pause the definition after N final failures in a row (1..1000)",
        ),
    ]
    p.set_defaults(field_options=fields)

    p = _command(sub, "backfill", "materialize a past window's occurrences once", cmd_backfill)
    p.add_argument("name", type=name_text)
    p.add_argument("--from", dest="window_from", type=parse_instant, required=True,
                   help="ISO time (without an offset: in the definition's zone, where it must"
                   " name one instant, not one a DST change skips or repeats)")  # fmt: skip
    p.add_argument("--to", dest="window_to", type=parse_instant, required=True,
                   help="ISO time (as --from)")  # fmt: skip

    p = _command(sub, "enqueue", "queue an ad-hoc run", cmd_enqueue)
    p.add_argument("kind", type=name_text)
    p.add_argument("--payload", type=parse_json_object, default=None)
    p.add_argument("--run-at", type=parse_instant, default=None, help="ISO time (without an offset: in --tz)")
    p.add_argument("--tz", type=parse_zone, default="UTC", help="zone of a --run-at without offset (UTC)")
    p.add_argument("--priority", type=sql_integer("priority"), default=0, help=PRIORITY_HELP)
    p.add_argument(
        "--key",
        type=name_text,
        default=None,
        help="idempotency key: enqueued again, the kind and key print the run they made and queue nothing",
    )
    p.add_argument("--queue", type=name_text, default="default", help="queue (default 'default')")
    p.add_argument("--concurrency-key", type=name_text, default=None,
                   help="tenant/customer key for per-key limits")  # fmt: skip

    p = _command(sub, "run-now", "queue a run of a definition now", cmd_run_now)
    p.add_argument("name", type=name_text)

    p = _command(sub, "cancel", "cancel a run (or every queued run of a definition)", cmd_cancel)
    p.add_argument("run_id", nargs="?", type=RUN_ID)
    p.add_argument("--definition", type=name_text, default=None)

    for name, verb in (("pause", "pause"), ("resume", "resume")):
        p = _command(sub, name, f"{verb} a definition", cmd_pause_resume)
        p.add_argument("name", type=name_text)

    p = _command(sub, "pause-queue", "stop claiming from a queue now (running jobs finish)", cmd_queue_pause)
    p.add_argument("name", type=name_text)
    p = _command(sub, "resume-queue", "resume claiming from a paused queue", cmd_queue_pause)
    p.add_argument("name", type=name_text)

    scope = "let a worker login claim only these kinds and queues"
    p = _command(sub, "scope-worker", scope, cmd_scope_worker)
    p.add_argument("role", type=parse_role, help="the LOGIN role the worker connects as")
    p.add_argument("--kinds", type=name_list("kind"), help="only these kinds (a,b; default any)")
    p.add_argument("--queues", type=name_list("queue"), help="only these queues (a,b; default any)")
    p = _command(sub, "unscope-worker", "let a worker login claim any run again", cmd_scope_worker)
    p.add_argument("role", type=parse_role, help="the LOGIN role the worker connects as")

    p = _command(sub, "retry", "retry a FAILED or CANCELLED run now", cmd_retry)
    p.add_argument("run_id", type=RUN_ID)

    p = _command(
        sub, "status", "what is due, what failed, the leader, kinds nobody runs", cmd_status, output="table"
    )
    p.add_argument(
        "--watch",
        type=duration(minimum=timedelta(milliseconds=100)),
        default=None,
        help="refresh every N seconds (at least 100ms)",
    )
    p.add_argument("--limit", type=integer(1, 10000), default=50,
                   help="definitions shown, a page by name (1..10000, default 50)")  # fmt: skip
    p.add_argument("--offset", type=integer(0, BIGINT_MAX), default=0,
                   help="definitions skipped before the page (0 or more, default 0)")  # fmt: skip
    p.add_argument(
        "--recent", type=integer(1, 20), default=10, help="outcomes in the strip (1..20, default 10)"
    )

    p = _command(sub, "runs", "list recent runs, newest first", cmd_runs, output="list")
    p.add_argument("--status", choices=STATUSES)
    p.add_argument("--kind", type=name_text)
    p.add_argument("--definition", type=name_text)
    p.add_argument("--limit", type=integer(1, 10000), default=20, help="runs shown (1..10000, default 20)")

    p = _command(sub, "show", "one run in full: timings, attempts, payload, result, error", cmd_show)
    p.add_argument("run_id", type=RUN_ID, metavar="RUN")

    p = _command(
        sub,
        "undefine",
        "delete a definition: its queued runs are cancelled, running ones finish, history stays",
        cmd_undefine,
    )
    p.add_argument("name", type=name_text)

    p = _command(sub, "workers", "workers: alive or not, what each runs, when last seen", cmd_workers,
                 output="list")  # fmt: skip
    p.add_argument("--all", action="store_true", help="also stopped and lost workers")

    p = _command(sub, "prune", "delete finished runs older than the retention", cmd_prune)
    p.add_argument("--older-than", type=parse_duration, default=None,
                   help="age of finished runs to delete (default: jobs.config.retention)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    p.add_argument(
        "--batch",
        type=integer(1, 1000000),
        default=10000,
        help="rows per transaction (1..1000000, default 10000)",
    )

    p = _command(sub, "definitions", "list definitions, filterable", cmd_definitions, output="list")
    p.add_argument("--kind", type=name_text)
    p.add_argument("--name", type=name_text, help="SQL LIKE pattern, e.g. 'nightly-%%'")
    state = p.add_mutually_exclusive_group()
    for flag in ("active", "paused", "finished"):
        state.add_argument(f"--{flag}", dest="state", action="store_const", const=flag,
                           help=f"only {flag} definitions")  # fmt: skip
    p.add_argument(
        "--limit", type=integer(1, 100000), default=1000, help="definitions shown (1..100000, default 1000)"
    )

    p = _command(sub, "preview", "show the next occurrences of a schedule", cmd_preview)
    p.add_argument("schedule", nargs="?", type=schedule_text,
                   help="RRULE or cron text (or give --definition)")  # fmt: skip
    p.add_argument("--definition", type=name_text, default=None,
                   help="preview a stored definition as the scheduler will")  # fmt: skip
    p.add_argument("--tz", type=parse_zone, default=None, help="IANA time zone (default UTC)")
    p.add_argument("--after", type=parse_instant, default=None,
                   help="ISO time (default now; without an offset: in the schedule's zone)")  # fmt: skip
    p.add_argument(
        "--count", type=integer(1, 1000), default=10, help="occurrences shown (1..1000, default 10)"
    )
    p.add_argument(
        "--anchor",
        type=parse_instant,
        default=None,
        help="start of a rule without DTSTART (default: local midnight of the --after day)",
    )
    p.add_argument("--dst-gap", choices=["shift", "end", "skip"], default=None, help="default: auto")
    p.add_argument("--dst-repeat", choices=["first", "second", "both"], default=None, help="default: auto")

    p = _command(sub, "lock", "run a command under a lease; skip if it is held", cmd_lock, output=None)
    p.add_argument("name", type=name_text)
    # At least a second: a lease shorter than a round trip to the database is lost before the
    # command gets going (started, then stopped as if the database did not answer).
    p.add_argument(
        "--ttl",
        type=duration(timedelta(days=365), minimum=timedelta(seconds=1)),
        required=True,
        help="lease time to live (1s to 365d)",
    )
    p.add_argument("--owner", type=name_text, default=None, help="owner id (default host-pid-random)")
    p.add_argument(
        "--skipped-exit", type=integer(0, 255), default=75, help="exit code when held (0..255, default 75)"
    )
    # Filled from whatever follows the first `--` (see main): a REMAINDER positional
    # after NAME would swallow the options that follow it (`NAME --ttl 5m -- cmd`).
    p.add_argument("cmd", nargs="*", default=[], metavar="-- COMMAND", help="the command and its arguments")

    p = _command(sub, "web", "serve the web dashboard", cmd_web, output=None)
    p.add_argument("--bind", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080)")
    p.add_argument("--password-file", default=None, help="operator password (else $PGTICK_WEB_PASSWORD)")
    p.add_argument(
        "--db-timeout",
        metavar="DURATION",
        type=duration(timedelta(hours=1)),
        default=10.0,
        help="longest a request waits for the database before it answers 504 (default 10s, at most 1h)",
    )
    p.add_argument(
        "--cookie-secure",
        action="store_true",
        help="mark the session cookie Secure: browsers reach the dashboard over HTTPS only",
    )
    p.add_argument(
        "--trust-proxy",
        action="store_true",
        help="a proxy in front terminates TLS and sets X-Forwarded-Proto: mark the session"
        " cookie Secure on requests it says came over https (ignored without this)",
    )
    _command(sub, "dsn", "print the DSN in use (starts the embedded server if needed)", cmd_dsn)
    return parser


# -- helpers ------------------------------------------------------------------------

_embedded: Any = None


def _start_embedded() -> str:
    global _embedded
    from pgtick.embedded import EmbeddedPostgres

    _embedded = EmbeddedPostgres()
    dsn: str = _embedded.start()  # logs where its data lives (pgtick.embedded, INFO)
    with connect(dsn) as conn:
        # Always through the migration lock: checking versions first would race a
        # concurrent migrator between its migration commit and its function commit.
        migrate.apply(conn)
    return dsn


def _dsn(args: argparse.Namespace) -> str:
    """--dsn, else $DATABASE_URL (or $PGTICK_DSN), else the embedded PostgreSQL. The variable
    is read as UTF-8 as an argument is; bytes that are not UTF-8 are a usage error naming it."""
    explicit = getattr(args, "dsn", None)
    variable = next((v for v in ("DATABASE_URL", "PGTICK_DSN") if os.environ.get(v)), None)
    if not explicit and variable is not None:
        value = os.environ[variable]
        text, undecodable = _as_utf8(value)
        if undecodable is not None:
            raise UsageError(f"${variable}: not valid UTF-8: {without_password(repr(undecodable))}")
        if text != value:  # UTF-8 bytes in a locale whose encoding is not UTF-8
            try:
                explicit = parse_dsn(text)
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"${variable}: {exc}") from None
    return resolve_dsn(explicit, _start_embedded)


def _warn(command: str, message: str) -> None:
    _say(f"pgtick {command}: warning: {_readable(message)}")


def _error(command: str, message: str) -> None:
    """The one line a failed command writes: the message may quote stored or given text (a
    name, a payload), so its control characters are shown, not sent to the terminal."""
    _say(f"pgtick {command}: error: {_readable(message)}")


#: A word of an error line longer than this is a value quoted whole (a schedule, a name, a
#: number of thousands of characters): it is cut, so the line stays one that can be read.
_LONGEST_WORD = 200


def _readable(message: str) -> str:
    """An error or warning line: control characters shown (``printable_line``) and every word
    longer than ``_LONGEST_WORD`` characters cut to its start and its length."""
    return re.sub(
        rf"\S{{{_LONGEST_WORD + 1},}}",
        lambda word: f"{word.group()[:80]}... ({len(word.group())} characters)",
        printable_line(message),
    )


def _say(line: str) -> None:
    """A line on standard error. When it cannot be written (a full disk, a closed descriptor)
    the line is dropped and so is the rest of standard error: a warning after a commit must not
    turn the change into a failure, and the exit code still says how the command ended."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _discard_stderr()


def _discard_stderr() -> None:
    """Standard error to /dev/null from here on (the logging handler writes to it too)."""
    sys.stderr = open(os.devnull, "w")  # lives as long as the process
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
    except OSError:
        pass
    finally:
        os.close(devnull)


def connect(dsn: str) -> psycopg.Connection[Any]:
    """A command's connection (``db.connect``), reading the numbers of json and jsonb with
    every digit (``json_numbers``): a payload or result prints as it is stored."""
    conn = db.connect(dsn)
    json_numbers.read_exactly(conn)
    return conn


def connect_dicts(dsn: str, *, application_name: str = "pgtick") -> psycopg.Connection[dict[str, Any]]:
    """``connect`` with rows as dicts."""
    conn = db.connect_dicts(dsn, application_name=application_name)
    json_numbers.read_exactly(conn)
    return conn


def _jsonable(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A row for --json: times as UTC ISO 8601 strings, intervals as seconds."""
    if row is None:
        return None
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, datetime):
            out[k] = iso(v)
        elif isinstance(v, timedelta):
            out[k] = seconds(v)
        else:
            out[k] = v
    return out


@contextmanager
def _interrupt_between() -> Iterator[Callable[[], bool]]:
    """Within: a first Ctrl-C (SIGINT) is only noted, for the caller to stop between two
    steps (``asked()`` says whether it came); a second one interrupts at once."""
    noted: list[bool] = []

    def on_interrupt(signum: int, frame: Any) -> None:
        if noted:
            raise KeyboardInterrupt
        noted.append(True)

    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: bool(noted)
    finally:
        signal.signal(signal.SIGINT, previous)


def _progress_enabled() -> bool:
    return redraws(sys.stderr)


# -- commands -------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from pgtick import supervisor
    from pgtick.runner import RunOptions, check_login, check_schema, load_app, run_app
    from pgtick.worker import claimable_kinds

    if args.processes < 1:
        raise UsageError(f"--processes must be at least 1, got {args.processes}")
    if args.no_scheduler and args.no_worker:
        raise UsageError("--no-scheduler and --no-worker together leave nothing to run")
    if args.lease_ttl is not None and args.lease_ttl <= args.tick:
        ttl, tick = (compact_duration(timedelta(seconds=s)) for s in (args.lease_ttl, args.tick))
        raise UsageError(
            f"--lease-ttl must be longer than --tick (got {ttl} and {tick}):"
            " renewed once a tick, the leader lease would lapse between ticks"
        )
    app = load_app(args.app)
    if not args.no_worker:
        claimable_kinds(app)  # an app its workers cannot claim for: said once, before anything starts
    dsn = _dsn(args)
    if args.migrate and supervisor.child_index() is None:
        with connect(dsn) as conn:
            migrate.apply(conn)
    options = RunOptions(
        concurrency=args.concurrency,
        batch_size=args.batch,
        claimers=args.claimers,
        tick_interval=args.tick,
        poll_interval=args.poll,
        heartbeat_interval=args.heartbeat,
        shutdown_grace=args.grace,
        scheduler=not args.no_scheduler,
        worker=not args.no_worker,
        metrics_port=args.metrics_port,
        metrics_bind=args.metrics_bind,
        metrics_per_definition=args.metrics_per_definition,
        listen=not args.no_listen,
        leadership=args.leadership,
        lease_ttl=args.lease_ttl,
        queues=args.queues,
    )
    try:
        if args.web is not None and supervisor.child_index() is None:  # (--web "" is refused there)
            # One dashboard per `pgtick run`: the supervisor serves it, its worker children do not.
            with connect(dsn) as conn:  # a schema it cannot serve: one line, before it starts
                migrate.check_schema(conn)
            try:
                from pgtick.web.serve import operator_secret, serve_in_thread
            except ImportError as exc:
                raise UsageError(f"--web needs the web extra: pip install 'pgtick[web]' ({exc})") from None
            serve_in_thread(dsn, args.web, operator_secret(None))
        if args.processes > 1:
            # A schema or login that cannot run as asked: say so once, start nothing.
            with connect(dsn) as conn:
                check_schema(conn)
                check_login(conn, options)
            return supervisor.run_supervised(app, dsn, options, args.processes)
        stop = supervisor.stop_when_supervisor_says() if supervisor.child_index() is not None else None
        return run_app(app, dsn, options, stop)
    finally:
        if _embedded is not None:
            _embedded.stop()


def cmd_migrate(args: argparse.Namespace) -> Result | int:
    if args.sql:
        if args.json:
            raise UsageError(
                "--sql prints the install script for psql, not JSON: give one of --sql or --json"
            )
        _write_out(migrate.install_script())
        return 0
    from pgtick.progress import Steps

    steps: Steps
    dsn = _dsn(args)
    committed: list[str] = []  # the versions this run has applied so far

    def progress(step: str, done: int, total: int) -> None:
        version = step.partition("_")[0]
        committed.append(version if version.isdigit() else "functions")
        steps.step(step, done, total)

    with connect(dsn) as conn, Steps("migrate", enabled=_progress_enabled()) as steps:
        try:
            done = migrate.apply(conn, progress=progress)
        except KeyboardInterrupt:
            conn.close()  # as for a backfill: its statement may still be ending
            _say_where_migrate_stopped(dsn, committed)
            raise
        except psycopg.Error as exc:
            if exc.sqlstate is None:  # the connection: said as any command says it
                raise
            # What the database holds stopped a migration (its message says what, its hint what
            # to do): a failure (exit 1), not a usage error, and never "run pgtick migrate".
            diag = exc.diag
            message = diag.message_primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            hint = f" ({diag.message_hint})" if diag.message_hint else ""
            where = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
            raise PgtickError(f"migrating stopped: {message}{hint}{where}") from exc
    return Result(
        {"applied": done},
        lambda style, wide: f"applied migrations: {', '.join(done)}" if done else "schema up to date",
    )


def _say_where_migrate_stopped(dsn: str, committed: list[str]) -> None:
    """Ctrl-C stopped ``pgtick migrate``: the steps ``committed`` stay (each migration is its
    own transaction; the last commits with the functions, reported as "functions"), the one
    in flight was rolled back. One line says what this run applied and what is still
    missing, read on a connection of its own (the interrupted one may still be ending its
    statement); none when nothing is left to do."""
    try:
        with connect(dsn) as reader:
            stored = migrate.applied_versions(reader)
    except (psycopg.Error, PgtickError):
        return  # the line would be a guess: `pgtick migrate` again says where it stands
    missing = [m.version for m in migrate.migrations() if m.version not in stored]
    versions = [v for v in committed if v != "functions"]
    what = f" after applying {_span(versions)}" if versions else ""
    if not missing:
        if "functions" not in committed:  # the functions and views may be the ones from before
            _warn(
                "migrate",
                f"interrupted{what}: the schema has every migration;"
                " run pgtick migrate again to re-apply the functions and views",
            )
        return
    what = what or " before applying a migration"
    _warn(
        "migrate",
        f"interrupted{what}: {_span(missing)} still to apply; run pgtick migrate again"
        " (pgtick run refuses to start until then)",
    )


def _span(versions: list[str]) -> str:
    """Migration versions in order, written short: ``0003``, ``0003 to 0009``."""
    return versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"


#: What ``pgtick define NAME KIND`` sends for a field not given.
DEFINE_DEFAULTS = {"tz": "UTC", "priority": 0, "misfire": "coalesce", "overlap": "queue", "queue": "default"}


def cmd_define(args: argparse.Namespace) -> Result:
    from pgtick.definitions import define, define_many, read_definitions, validate_schedule

    if args.from_file is not None:
        if args.name or args.kind:
            raise UsageError("--from-file takes its definitions from the file: give no NAME or KIND")
        given = [a.option_strings[0] for a in args.field_options if getattr(args, a.dest) != a.default]
        if given:
            them = "it" if len(given) == 1 else "them"
            raise UsageError(
                f"with --from-file the file gives every field of each definition: {', '.join(given)}"
                f" cannot be given here (set {them} in the file)"
            )
        definitions = read_definitions(args.from_file)
        with connect_dicts(_dsn(args)) as conn, conn.transaction():
            rows = define_many(conn, definitions)
        created = sum(1 for r in rows if r["created"])
        rescheduled = sum(1 for r in rows if r["rescheduled"])
        summary = {"definitions": len(rows), "created": created, "rescheduled": rescheduled}
        return Result(
            summary,
            lambda s, w: f"definitions={len(rows)} created={created} rescheduled={rescheduled} saved",
        )
    if not args.name or not args.kind or (args.schedule is None) == (args.run_at is None):
        raise UsageError("give NAME KIND and one of --schedule or --run-at (or --from-file FILE)")
    for dest, value in DEFINE_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)

    if args.schedule is not None:  # before any connection: a typo fails fast
        validate_schedule(
            args.schedule,
            args.tz,
            args.name,
            dst_gap=args.dst_gap,
            dst_repeat=args.dst_repeat,
            jitter=timedelta(seconds=args.jitter) if args.jitter else None,
        )

    # For a one-shot, --dst-gap/--dst-repeat say how to read a wall time the zone skips or
    # repeats; the definition stores the instant (the SQL API takes them for schedules only).
    run_at = read_time(
        args.run_at,
        args.tz,
        field_name="--run-at",
        zone_name="--tz",
        dst_gap=args.dst_gap,
        dst_repeat=args.dst_repeat,
    )
    recurring = args.schedule is not None
    with connect_dicts(_dsn(args)) as conn:
        row = define(
            conn,
            args.name,
            args.kind,
            schedule=args.schedule,
            timezone=args.tz,
            run_at=run_at,
            payload=args.payload,
            max_concurrent_runs=args.cap,
            priority=args.priority,
            max_attempts=args.max_attempts,
            misfire_policy=args.misfire,
            overlap_policy=args.overlap,
            timeout=timedelta(seconds=args.timeout) if args.timeout else None,
            heartbeat_timeout=(timedelta(seconds=args.heartbeat_timeout) if args.heartbeat_timeout else None),
            queue=args.queue,
            concurrency_key=args.concurrency_key,
            enabled=False if args.paused else None,
            dst_gap=args.dst_gap if recurring else None,
            dst_repeat=args.dst_repeat if recurring else None,
            jitter=timedelta(seconds=args.jitter) if args.jitter else None,
            pause_after_failures=args.pause_after_failures,
        )
    data = _jsonable(dict(row))
    return Result(
        data, lambda s, w: f"definition={row['name']} id={row['id']} revision={row['revision']} saved"
    )


def cmd_backfill(args: argparse.Namespace) -> Result:
    from pgtick.scheduler import materialize_backfills

    dsn = _dsn(args)
    with connect_dicts(dsn) as conn:
        found = calls.definition(conn, args.name)
        zone = found["timezone"] if found is not None else "UTC"  # unknown: jobs.backfill says so
        window = [
            _window_bound(value, zone, option)
            for value, option in ((args.window_from, "--from"), (args.window_to, "--to"))
        ]
        row = calls.backfill(conn, args.name, *window)
        from pgtick.progress import Bar

        held: dict[int, int] = {}
        try:
            with Bar("backfill", 1.0, enabled=_progress_enabled(), percent=True) as bar:
                materialize_backfills(conn, progress=bar.reached, occurrences=held)
        except KeyboardInterrupt:
            # The interrupted statement may still be ending on this connection: closed, not
            # rolled back (a rollback then fails, and psycopg logs that on standard error).
            conn.close()
            _withdraw_backfill(dsn, row["id"])
            raise
        done = calls.backfill_request(conn, row["id"])
    assert done is not None
    if done["error"]:
        raise UsageError(f"definition={args.name} backfill {row['id']}: {done['error']}")
    runs = done["runs_created"] or 0
    occurrences = held.get(row["id"])  # None: another leader finished it first
    note = _backfill_note(runs, occurrences)
    return Result(
        {"definition": args.name, "backfill_id": row["id"], "runs": runs, "occurrences": occurrences},
        lambda st, w: f"definition={args.name} backfill={row['id']} runs={runs} ({note})",
    )


#: Why a backfill request was withdrawn (jobs.backfills.error).
BACKFILL_INTERRUPTED = "interrupted by the operator (Ctrl-C) before its runs were inserted"


def _withdraw_backfill(dsn: str, backfill_id: int) -> None:
    """Ctrl-C stopped ``pgtick backfill`` before its runs were inserted (an interrupted insert
    is rolled back): the request it recorded is withdrawn, so that no scheduler inserts them
    later behind the operator's back. One line says what became of it; on a connection of
    its own, since the interrupted one may still be ending its statement."""
    try:
        with connect_dicts(dsn) as conn:
            calls.finish_backfill(conn, backfill_id, None, BACKFILL_INTERRUPTED)  # fenced: once
            request = calls.backfill_request(conn, backfill_id)
    except (psycopg.Error, PgtickError) as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _warn(
            "backfill",
            f"interrupted: backfill {backfill_id} could not be withdrawn ({why}):"
            " a running scheduler may still insert its runs",
        )
        return
    if request is None:  # its definition was deleted meanwhile, and the request with it
        _warn("backfill", f"interrupted: backfill {backfill_id} is gone with its definition")
    elif request["error"] == BACKFILL_INTERRUPTED:
        _warn("backfill", f"interrupted: backfill {backfill_id} withdrawn, no run inserted")
    elif request["error"]:
        _warn("backfill", f"interrupted: backfill {backfill_id} was refused: {request['error']}")
    else:  # the insert had committed, or a scheduler had done it
        inserted = counted(request["runs_created"] or 0, "run")
        _warn("backfill", f"interrupted after backfill {backfill_id} was done: {inserted} inserted")


def _window_bound(value: datetime, zone: str, option: str) -> datetime:
    """A bound of a backfill's window: a time with a UTC offset as given, a wall time in the
    definition's zone. A wall time the zone skips (spring forward) or shows twice (fall back)
    is refused, naming both instants it could mean: which one it is decides whether the
    occurrences of a whole hour fall in the window, so it is the operator's to say (with an
    offset), not a default's."""
    if value.tzinfo is None:
        readings = _dst_readings(value, zone)
        if readings is not None:
            earlier, later, skipped = readings
            wall = value.isoformat()
            why = "does not exist in {} (skipped" if skipped else "happens twice in {} (repeated"
            raise UsageError(
                f"{option}: {wall} {why.format(zone)} at a DST change): give a UTC offset, "
                f"{_reading(value, earlier, zone)} or {_reading(value, later, zone)}"
            )
    return read_time(value, zone, field_name=option, zone_name="the definition's timezone")


def _dst_readings(wall: datetime, zone: str) -> tuple[datetime, datetime, bool] | None:
    """The two instants a wall time of ``zone`` can mean when a DST change makes it ambiguous
    (earlier first), and whether the change skipped it; None when it names one instant."""
    from zoneinfo import ZoneInfo

    from pgtick.schedule.zones import fold_offsets

    before, after = fold_offsets(wall, ZoneInfo(zone))
    if before == after:
        return None
    try:
        instants = sorted([(wall - before).replace(tzinfo=UTC), (wall - after).replace(tzinfo=UTC)])
    except OverflowError:  # at the ends of the calendar: read_time says it is out of range
        return None
    return instants[0], instants[1], before < after


def _reading(wall: datetime, instant: datetime, zone: str) -> str:
    """``wall`` written with the UTC offset that makes it ``instant``, and what that is in UTC
    and on the zone's clock: ``2026-03-08T02:30:00-05:00 (07:30:00Z, 03:30 EDT)``."""
    from datetime import timezone
    from zoneinfo import ZoneInfo

    offset = wall.replace(tzinfo=UTC) - instant
    local = instant.astimezone(ZoneInfo(zone))
    clock = strftime(local, "%H:%M" if local.date() == wall.date() else "%Y-%m-%d %H:%M")
    return f"{wall.replace(tzinfo=timezone(offset)).isoformat()} ({iso(instant)}, {clock} {local.tzname()})"


def _backfill_note(runs: int, held: int | None) -> str:
    """What a backfill's run count means: the window's occurrences, and those left alone."""
    if held is None:
        return "occurrences that already had a run were left alone"
    if held == 0:
        return "no occurrence of its schedule falls in the window"
    kept = held - runs
    return f"of {counted(held, 'occurrence')}" + (f", {kept} already had a run" if kept else "")


def cmd_enqueue(args: argparse.Namespace) -> Result:
    run_at = read_time(args.run_at, args.tz, field_name="--run-at", zone_name="--tz")
    notices: list[str] = []
    with connect_dicts(_dsn(args)) as conn, conn.transaction():
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        row = calls.enqueue(
            conn,
            args.kind,
            json_numbers.jsonb(args.payload or {}),
            run_at,
            args.priority,
            args.key,
            queue=args.queue,
            concurrency_key=args.concurrency_key,
        )
        assert row is not None
        # A run this transaction made was created at its start; one of --key made before, not.
        began = conn.execute("SELECT now() AS began").fetchone()
        existing = began is not None and row["created_at"] != began["began"]
    for notice in notices:
        _warn("enqueue", notice)
    now = display_now()
    return Result(
        _jsonable(dict(row)),
        lambda s, w: (
            f"run={row['id']} kind={row['kind']} status={row['status']}"
            f" scheduled_for={iso(row['scheduled_for'])} ({relative(row['scheduled_for'], now)})"
            + (f" (the run of key {args.key!r}, enqueued before: nothing new queued)" if existing else "")
        ),
    )


def cmd_run_now(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        row = calls.run_now(conn, args.name)
    assert row is not None
    return Result(
        {"run_id": row["id"], "definition": args.name, "status": str(row["status"])},
        lambda s, w: f"run={row['id']} definition={args.name} queued",
    )


def cmd_cancel(args: argparse.Namespace) -> Result:
    if (args.run_id is None) == (args.definition is None):
        raise UsageError("give a RUN_ID or --definition NAME")
    with connect(_dsn(args)) as conn:
        if args.definition is not None:
            n = calls.cancel_queued(conn, args.definition)
            return Result(
                {"definition": args.definition, "cancelled": n},
                lambda s, w: f"definition={args.definition} cancelled {counted(n, 'queued run')}",
            )
        with conn.transaction():  # what it found, and what it made of it
            before = calls.run_state(conn, args.run_id)  # None: jobs.cancel says it does not exist
            status = calls.cancel(conn, args.run_id)
    was, requested = before if before is not None else (status, False)
    changed = was == "QUEUED" or (was == "RUNNING" and not requested)
    if status == "RUNNING":
        note = " (cancel requested; stops at its next checkpoint)"
    elif changed:
        note = ""
    elif status == "CANCELLED":
        note = " (cancelled already: nothing changed)"
    else:
        note = " (finished already: nothing to cancel)"
    data = {"run_id": args.run_id, "status": status, "cancel_requested": status == "RUNNING"}
    return Result({**data, "changed": changed}, lambda s, w: f"run={args.run_id} status={status}{note}")


def cmd_pause_resume(args: argparse.Namespace) -> Result:
    paused = args.command == "pause"
    with connect(_dsn(args)) as conn:
        changed = calls.pause(conn, args.name) if paused else calls.resume(conn, args.name)
    if changed:
        text = f"definition={args.name} {'paused' if paused else 'resumed'}"
    else:
        text = f"definition={args.name} {'already paused' if paused else 'not paused'}: nothing changed"
    return Result({"definition": args.name, "paused": paused, "changed": changed}, lambda s, w: text)


def cmd_queue_pause(args: argparse.Namespace) -> Result:
    pause = args.command == "pause-queue"
    notices: list[str] = []
    with connect(_dsn(args)) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        changed = calls.pause_queue(conn, args.name) if pause else calls.resume_queue(conn, args.name)
    for notice in notices:  # a queue nothing uses: a typo?
        _warn(args.command, notice)
    state = "paused" if pause else "resumed"
    text = (
        f"queue={args.name} {state}"
        if changed
        else f"queue={args.name} already {state if pause else 'running'}"
    )
    return Result({"queue": args.name, "paused": pause, "changed": bool(changed)}, lambda st, w: text)


def cmd_scope_worker(args: argparse.Namespace) -> Result:
    """scope-worker / unscope-worker (jobs.scope_worker, jobs.unscope_worker)."""
    if args.command == "unscope-worker":
        with connect(_dsn(args)) as conn:
            changed = calls.unscope_worker(conn, args.role)
            if (
                not changed
                and conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (args.role,)).fetchone() is None
            ):
                raise UsageError(f"role {args.role!r} does not exist")  # a typo, as scope-worker says
        text = f"role={args.role} unscoped" if changed else f"role={args.role} had no scope"
        data = {"role": args.role, "kinds": None, "queues": None, "scoped": False, "changed": changed}
        return Result(data, lambda st, w: text)
    if args.kinds is None and args.queues is None:
        raise UsageError("give --kinds, --queues or both (pgtick unscope-worker lifts a scope)")
    with connect_dicts(_dsn(args)) as conn, conn.transaction():
        before = conn.execute(
            "SELECT kinds, queues FROM jobs.worker_scopes WHERE role = %s", (args.role,)
        ).fetchone()
        row = calls.scope_worker(conn, args.role, args.kinds, args.queues)

    def shown(names: list[str] | None) -> str:
        return "any" if names is None else ",".join(names)

    # The scope is replaced whole: a list not given is "any". Widening one the login had
    # (--queues alone, after --kinds) is what was asked, but worth a line.
    for part, option in (("kinds", "--kinds"), ("queues", "--queues")):
        if before is not None and before[part] is not None and row[part] is None:
            widened = f"{part} widened from {shown(before[part])} to any"
            _warn(args.command, f"{widened} ({option} not given; a scope is set whole)")
    text = f"role={row['role']} kinds={shown(row['kinds'])} queues={shown(row['queues'])}"
    return Result({**row, "scoped": True, "changed": True}, lambda st, w: text)


def cmd_retry(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        row = calls.retry(conn, args.run_id)
    assert row is not None
    return Result(
        {"run_id": args.run_id, "retry_run_id": row["id"], "attempt": row["attempt"]},
        lambda s, w: f"run={args.run_id} retried as run={row['id']} attempt={row['attempt']}",
    )


# -- status -----------------------------------------------------------------------------


def status_snapshot(
    conn: psycopg.Connection[Any], recent: int = 10, limit: int = 50, offset: int = 0
) -> dict[str, Any]:
    """What `pgtick status --json` prints (schema: docs/schemas/status.json)."""
    leaders = [_jsonable(dict(row)) for row in calls.leaders(conn)]
    definitions = []
    for d in calls.status_definitions(conn, limit, offset):
        row = _jsonable(dict(d))
        assert row is not None
        row["recent_outcomes"] = list(d["recent_outcomes"] or [])[-recent:]
        row["next_run_local"] = _local(d["next_run_at"], d["timezone"])
        row["next_start_local"] = _local(d["next_start_at"], d["timezone"])
        definitions.append(row)
    return {
        "now": iso(display_now()),
        "leader": leaders[0] if leaders else _lease_leader(conn),
        "other_leaders": leaders[1:],
        "schema": _jsonable(calls.schema_version(conn)),
        "summary": _jsonable(dict(calls.definition_summary(conn))),
        "definitions": definitions,
        "queues": [_jsonable(dict(q)) for q in calls.queue_stats(conn)],
        "kinds_without_worker": [_jsonable(dict(k)) for k in calls.kinds_without_worker(conn)],
    }


def _zone(name: str) -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def _local(at: datetime | None, zone: str) -> str | None:
    """``at`` as a wall time in ``zone``, without an offset (as the views' *_local columns)."""
    return at.astimezone(_zone(zone)).replace(tzinfo=None).isoformat() if at else None


def _when(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


def _age(value: str | datetime | None, now: datetime) -> str:
    """How long ago ``value`` was, measured from the display clock."""
    when = _when(value) if isinstance(value, str) else value
    return "" if when is None else compact_duration(now - when)


def _streak(d: dict[str, Any]) -> str:
    if d["consecutive_failures"]:
        return f"{d['consecutive_failures']} failed"
    if d["consecutive_skips"]:
        return f"{d['consecutive_skips']} skipped"
    return ""


def _last_outcome(d: dict[str, Any]) -> str | None:
    """A definition's last outcome as its strip of marks shows it: SKIPPED for a run the
    overlap policy skipped (``last_status`` is the run's status, CANCELLED). The strip's last
    mark is that same run: both are its newest finished run in jobs.runs."""
    recent = d["recent_outcomes"]
    if d["last_status"] == "CANCELLED" and recent and recent[-1] == "SKIPPED":
        return "SKIPPED"
    last: str | None = d["last_status"]
    return last


def render_status(snap: dict[str, Any], style: Style, wide: bool) -> str:
    now = datetime.fromisoformat(snap["now"])
    out: list[str] = []
    leader = snap["leader"]
    if leader:
        by = f"pid {leader['pid']}" if leader.get("pid") is not None else "by lease"
        owner = printable_line(leader["owner"] or "(no owner)")  # one from before owners were required
        line = f"leader  {owner} ({by}), leading for {_age(leader['since'], now)}"
        out.extend(wrap(line, style.width, indent="    "))
    else:
        line = "leader  none: no scheduler is running, nothing new is materialized"
        out.extend(paint(part, "red", style) for part in wrap(line, style.width, indent="    "))
    for other in snap.get("other_leaders") or []:
        by = f"pid {other['pid']}" if other.get("pid") is not None else "by lease"
        owner = printable_line(other["owner"] or "(no owner)")
        line = (
            f"leader  also {owner} ({by}), leading for {_age(other['since'], now)}: a lock leader and"
            " a lease leader do not see each other; give every replica the same --leadership"
        )
        out.extend(paint(part, "red", style) for part in wrap(line, style.width, indent="    "))
    if wide or snap.get("schema") is None:  # the schema version: on --wide, or when unknown
        out.append(_schema_line(snap.get("schema")))

    def strip(d: dict[str, Any]) -> str:
        return "".join(mark(o, style) for o in d["recent_outcomes"])

    def next_cell(d: dict[str, Any]) -> str:
        # The next start (a run already queued, else the cursor); a paused definition says so,
        # and LEFT still counts down to a run it queued before the pause.
        if d["paused"]:
            return "paused"
        if d["finished"] and not d["next_start_at"]:
            return "finished"
        return local_time(_when(d["next_start_at"]), d["timezone"], now)

    table = Table(
        [
            Column("DEFINITION", lambda d: d["name"], priority=0, shrink=True, min_width=16, middle=True),
            Column("NEXT", next_cell, priority=1),
            Column("LEFT", lambda d: relative(_when(d["next_start_at"]), now), priority=1),
            Column(
                "LAST", lambda d: status_word(_last_outcome(d), style) if d["last_status"] else "", priority=2
            ),
            # When the outcome LAST names finished (a skip or a cancel too).
            Column("PASSED", lambda d: relative(_when(d["last_finished_at"]), now), priority=3),
            Column("RECENT", strip, priority=2),
            Column(
                "STREAK", _streak, priority=2, colour=lambda d: "red" if d["consecutive_failures"] else None
            ),
            Column("RUN/Q", lambda d: f"{d['running']}/{d['queued']}", priority=4, right=True),
            Column("KIND", lambda d: d["kind"], priority=6, shrink=True, middle=True),
            Column("SCHEDULE", lambda d: d["schedule"] or "one-shot", wide_only=True),
            Column("ZONE", lambda d: d["timezone"], wide_only=True),
            Column("NEXT (UTC)", lambda d: d["next_start_at"] or "", wide_only=True),
            Column("CAP", lambda d: str(d["max_concurrent_runs"] or ""), wide_only=True),
            Column("CATCH-UP", lambda d: d["last_catch_up"] or "", wide_only=True),
        ],
        snap["definitions"],
    )
    out.append("")
    out.append(table.render(style, wide=wide) if snap["definitions"] else "no definitions")
    summary = snap.get("summary")
    if summary and summary["definitions"] > len(snap["definitions"]):
        shown = (
            f"({len(snap['definitions'])} of {counted(summary['definitions'], 'definition')} shown:"
            " --limit, --offset;"
            f" {summary['paused']} paused, {summary['schedule_errors']} with schedule errors,"
            f" {summary['materialize_errors']} failing to materialize)"
        )
        out.extend(wrap(shown, style.width, indent=" "))
    notes: list[tuple[str, str | None]] = []  # (text, colour)
    for d in snap["definitions"]:
        if d["schedule_error"]:
            notes.append((f"{d['name']}: schedule unusable: {d['schedule_error']}", "red"))
        if d["last_catch_up"] and not wide:
            caught = _when(d["last_catch_up_at"])
            if caught and now - caught < timedelta(hours=24):
                notes.append((f"{d['name']}: {d['last_catch_up']} ({relative(caught, now)})", None))
    for k in snap["kinds_without_worker"]:
        why = "no worker ever registered it" if not k["ever_registered"] else "no live worker runs it"
        queues = k.get("queues") or []
        if queues and queues != ["default"]:  # where the runs wait, unless only the default queue
            why += f" in queue{'s' if len(queues) > 1 else ''} {', '.join(queues)}"
        oldest = relative(_when(k["oldest_queued_at"]), now)
        notes.append((f"kind {k['kind']}: {k['queued']} queued, oldest due {oldest}: {why}", "yellow"))
    if notes:
        out.append("")
        for text, colour in notes:  # long notes wrap with an indent, not mid-word at the edge
            wrapped = wrap(printable_line(text), style.width, indent="    ")  # names and errors as stored
            out.extend(paint(line, colour, style) for line in wrapped)
    kinds = [q["kind"] for q in snap["queues"]]
    # A kind on several queues has rows that only the queue tells apart: then it stays longer.
    queue_priority = 1 if len(set(kinds)) < len(kinds) else 2
    queues = Table(
        [
            Column("KIND", lambda q: q["kind"], priority=0, shrink=True, min_width=12, middle=True),
            Column(
                "QUEUE",
                lambda q: q.get("queue") or "",
                priority=queue_priority,
                shrink=True,
                middle=True,  # queues that share a prefix stay apart
                min_width=12,  # room for a name beside " (paused)"
                suffix=lambda q: " (paused)" if q.get("paused") else "",
            ),
            Column("QUEUED", lambda q: str(q["queued"]), right=True, priority=0),
            Column("OLDEST", lambda q: _age(q["oldest_queued_at"], now), right=True, priority=1),
            Column("RUNNING", lambda q: str(q["running"]), right=True, priority=0),
            Column("LATER", lambda q: str(q["scheduled"]), right=True, priority=2),
            Column("DONE/1H", lambda q: str(q["completed_1h"]), right=True, priority=1),
            Column(
                "FAILED/1H",
                lambda q: str(q["failed_1h"]),
                right=True,
                priority=1,
                colour=lambda q: "red" if q["failed_1h"] else None,
            ),
            Column("SKIPPED/1H", lambda q: str(q["skipped_1h"]), right=True, priority=3),
            Column("LOST/1H", lambda q: str(q["lost_1h"]), right=True, priority=3),
            Column("CANCELLED/1H", lambda q: str(q["cancelled_1h"]), right=True, wide_only=True),
            Column("BLOCKED", lambda q: str(q.get("blocked", 0)), right=True, wide_only=True),
            Column("RATE-LIMITED", lambda q: str(q.get("rate_limited", 0)), right=True, wide_only=True),
        ],
        snap["queues"],
    )
    out.append("")
    out.append(queues.render(style, wide=wide) if snap["queues"] else "no runs in the last hour")
    return "\n".join(out)


def cmd_status(args: argparse.Namespace) -> Result | int:
    if args.watch:
        return _watch_status(args, _dsn(args))
    with connect_dicts(_dsn(args)) as conn:
        snap = status_snapshot(conn, args.recent, args.limit, args.offset)
    return Result(snap, lambda style, wide: render_status(snap, style, wide))


#: How long `status --watch` waits before its first try to reach a lost server, and at most
#: between two tries (s): the pause doubles from the first to the most.
WATCH_RETRY_FIRST = 0.5
WATCH_RETRY_MAX = 5.0


def _watch_connect(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    # (with TCP keepalives, as every connection: a cut network ends a query in seconds)
    return connect_dicts(dsn, application_name="pgtick status --watch")


def _watch_status(args: argparse.Namespace, dsn: str) -> int:
    """`pgtick status --watch N`: a snapshot every N seconds until Ctrl-C. The first connection
    must succeed (a wrong DSN is an error); after that, a lost connection (a restart, a
    failover, a cut network) does not end the watch: the last screen stays, headed by a line
    that says since when the connection is lost, while it retries with a growing pause
    (WATCH_RETRY_FIRST to WATCH_RETRY_MAX s); it redraws as soon as the server answers."""
    conn: psycopg.Connection[dict[str, Any]] | None = _watch_connect(dsn)
    draws = redraws(sys.stdout) and not args.json  # JSON lines never clear a screen
    screen_drawn = False
    frame: str | None = None  # the last status drawn on the screen
    lost: tuple[datetime, float, str] | None = None  # since (UTC), since (monotonic), why
    pause = args.watch

    def draw(text: str) -> None:
        nonlocal screen_drawn
        screen = shutil.get_terminal_size()
        more = "a taller terminal, or fewer definitions with --limit"
        print("\033[2J\033[H" + fit_screen(text, screen.lines, screen.columns, more), end="", flush=True)
        screen_drawn = True

    try:
        while True:
            try:
                if conn is None:
                    conn = _watch_connect(dsn)
                snap = status_snapshot(conn, args.recent, args.limit, args.offset)
            except (psycopg.Error, PgtickError) as exc:
                if not _connection_lost(exc, conn):
                    raise
                if conn is not None:
                    conn.close()
                    conn = None
                why = _why_lost(exc)
                if lost is None:  # retry soon, then less often: not on the watch's own cadence
                    lost = (datetime.now(UTC).replace(microsecond=0), time.monotonic(), why)
                    pause = min(args.watch, WATCH_RETRY_FIRST)
                    if not draws:  # a pipe, a file: one line on stderr, the snapshots go on after
                        _warn("status", f"connection lost at {iso(lost[0])}: {why}; retrying")
                else:
                    lost, pause = (lost[0], lost[1], why), min(pause * 2, WATCH_RETRY_MAX)
                retry_at = time.monotonic() + pause
                while True:  # on a terminal: the last screen under the lost line, redrawn each second
                    left = retry_at - time.monotonic()
                    if draws:
                        line = _lost_line(lost, left, Style.detect(sys.stdout))
                        draw(line if frame is None else line + "\n" + frame)
                    if left <= 0:
                        break
                    time.sleep(min(left, 1.0))
                continue
            if lost is not None and not draws:
                _warn("status", f"connection back after {compact_duration(time.monotonic() - lost[1])}")
            lost = None
            if args.json:
                print(json_numbers.dumps(snap))
            elif draws:  # clear the screen, then draw what fits on it
                frame = render_status(snap, Style.detect(sys.stdout), args.wide)
                draw(frame)
            else:  # a pipe, a file or a dumb terminal: one snapshot after another
                print(render_status(snap, Style.detect(sys.stdout), args.wide) + "\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    finally:
        if conn is not None:
            conn.close()
        if screen_drawn:  # the screen's last line has no line break: the prompt or an error starts below
            print(flush=True)


def _connection_lost(exc: BaseException, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether ``exc`` says the server is out of reach (not that a query is wrong): a failed
    connection attempt (``conn`` None), or an operational error or a broken connection."""
    if conn is None:
        return not isinstance(exc, UsageError)
    return isinstance(exc, psycopg.OperationalError) or conn.closed or conn.broken


def _why_lost(exc: BaseException) -> str:
    """What went wrong, short enough for one line: libpq's reason for a failed connection
    attempt (``Connection refused``) without the socket or host it names first."""
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, PgtickError) and "failed: " in why:
        return "cannot connect: " + why.rsplit("failed: ", 1)[1]
    return why


def _lost_line(lost: tuple[datetime, float, str], next_try: float, style: Style) -> str:
    """``connection lost at 14:05:09 UTC, 1m20s ago: <why>; next try in 4s``."""
    since, started, why = lost
    line = (
        f"connection lost at {local_time(since, 'UTC', datetime.now(UTC))},"
        f" {compact_duration(max(1, round(time.monotonic() - started)))} ago: {printable(why)};"
        f" next try in {compact_duration(max(0, round(next_try)))}"
    )
    return paint(clip(line, shutil.get_terminal_size().columns), "red", style)


def _lease_leader(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The scheduler that leads by lease (behind a pooler: no session, so no pid)."""
    found = calls.lease_leader(conn)
    return _jsonable({**found[0], "leading_for": None}) if found else None


def _schema_line(schema: dict[str, Any] | None) -> str:
    if schema is None:
        return "schema  unknown (jobs.version() missing: run `pgtick migrate`)"
    by = f"pgtick {schema['package_version']}" if schema["package_version"] else "psql"
    version = f"{schema['schema_version']}_{schema['migration']}"
    return f"schema  {version} (applied by {by}; this is pgtick {__version__})"


# -- runs and show ---------------------------------------------------------------------

RUN_FIELDS = [
    "id", "definition", "kind", "status", "attempt", "scheduled_for", "started_at", "finished_at",
    "duration", "worker", "failure_reason", "error", "origin", "timezone", "definition_id",
]  # fmt: skip


def cmd_runs(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        rows = calls.run_list(conn, args.status, args.kind, args.definition, args.limit)
        if not rows and args.definition is not None and calls.definition(conn, args.definition) is None:
            _warn("runs", f"no definition is named {args.definition!r}")  # a typo is not "no runs"
    data = [_jsonable(dict(r)) for r in rows]
    now = display_now()

    def text(style: Style, wide: bool) -> str:
        if not rows:
            return "no runs"

        def what(r: dict[str, Any]) -> str:
            return _definition_of(r) or f"({r['kind']})"

        table = Table(
            [
                Column("ID", lambda r: str(r["id"]), priority=0, right=True),
                Column(
                    "STATUS",
                    lambda r: status_word(outcome_of(r["status"], r["failure_reason"]), style),
                    priority=0,
                ),
                Column("DEFINITION", what, priority=1, shrink=True, min_width=10, middle=True),
                Column("KIND", lambda r: r["kind"], priority=6, shrink=True, middle=True),
                Column("TRY", lambda r: str(r["attempt"]), priority=3, right=True),
                Column("SCHEDULED", lambda r: local_time(r["scheduled_for"], r["timezone"], now), priority=2),
                Column(
                    "WHEN",
                    lambda r: relative(r["finished_at"] or r["started_at"] or r["scheduled_for"], now),
                    priority=1,
                ),
                Column("TOOK", lambda r: _took(r, now), priority=2, right=True),
                Column("ERROR", _first_line, priority=4, shrink=True, min_width=24),
                Column("WORKER", lambda r: r["worker"] or "", wide_only=True),
                Column("ORIGIN", lambda r: r["origin"], wide_only=True),
            ],
            [dict(r) for r in rows],
        )
        return table.render(style, wide=wide)

    return Result(data, text, RUN_FIELDS)


def _definition_of(r: dict[str, Any]) -> str | None:
    """The definition a run came from: its name, ``#7 (deleted)`` once it was deleted (the
    run keeps its id), None for an ad-hoc run."""
    if r["definition"] is None and r["definition_id"] is not None:
        return f"#{r['definition_id']} (deleted)"
    name: str | None = r["definition"]
    return name


def _first_line(r: dict[str, Any]) -> str:
    lines = printable(r["error"] or "").splitlines()
    return lines[0] if lines else ""


def _took(r: dict[str, Any], now: datetime) -> str:
    """A run's duration; while RUNNING, so far (from the display clock)."""
    if r["started_at"] is None:
        return ""
    return compact_duration((r["finished_at"] or now) - r["started_at"])


def cmd_show(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        row = calls.run_detail(conn, args.run_id)
    assert row is not None
    data = _jsonable(dict(row))
    assert data is not None
    # The chain comes as JSON built in SQL, its times written in the session's TimeZone.
    data["attempts"] = [
        {**a, **{k: iso(_when(a.get(k))) for k in ("started_at", "finished_at")}} for a in row["attempts"]
    ]
    data["duration"] = (
        seconds(row["finished_at"] - row["started_at"]) if row["finished_at"] and row["started_at"] else None
    )
    now = display_now()
    zone = row["timezone"]

    def text(style: Style, wide: bool) -> str:
        r = row
        head = (
            f"run {r['id']}  {status_word(outcome_of(r['status'], r['failure_reason']), style)}"
            + (f"  ({r['failure_reason']})" if r["failure_reason"] else "")
            + ("  cancel requested" if r["cancel_requested"] and r["status"] == "RUNNING" else "")
        )
        lines = [head] if wide or not style.terminal else wrap(head, style.width, indent="  ")

        def field(label: str, value: str, *, name: bool = False) -> None:  # stored text, written out
            lines.extend(_field_lines(label, printable(value), style, wide, name=name))

        field("definition", _definition_of(r) or "(ad-hoc)", name=True)
        field("kind", r["kind"], name=True)
        field(
            "attempt",
            f"{r['attempt']}"
            + (f" of {r['max_attempts']}" if r["max_attempts"] else "")
            + f"  (origin {r['origin']})",
        )
        if r["worker"]:
            field("worker", r["worker"], name=True)
        for label, key in (
            ("scheduled", "scheduled_for"),
            ("started", "started_at"),
            ("heartbeat", "heartbeat_at"),
            ("finished", "finished_at"),
        ):
            if r[key] is not None:
                field(label, f"{full_time(r[key], zone)}  ({relative(r[key], now)})")
        if r["started_at"] is not None:
            took = (r["finished_at"] or now) - r["started_at"]
            field("took", compact_duration(took) + ("" if r["finished_at"] else " so far"))
        if len(r["attempts"]) > 1:
            lines.append("attempts")
            for a in r["attempts"]:
                lines += _attempt_lines(a, a["id"] == r["id"], style, wide)
        lines.append("payload")
        lines.extend(_block_lines(to_json(r["payload"]), style, wide))
        if r["result"] is not None:
            lines.append("result")
            lines.extend(_block_lines(to_json(r["result"]), style, wide))
        if r["error"]:
            lines.append("error")
            lines.extend(_block_lines(printable(r["error"]), style, wide))
        return "\n".join(lines)

    return Result(data, text)


#: Columns an attempt's error needs beside its status to say something; with less room it
#: goes on a line of its own.
_ATTEMPT_ERROR_ROOM = 16
#: Where an attempt's error starts when it has a line of its own: under ``run``.
_ATTEMPT_ERROR_INDENT = " " * 7


def _attempt_lines(attempt: dict[str, Any], this: bool, style: Style, wide: bool) -> list[str]:
    """An attempt of the chain in ``pgtick show``: its status and reason on one line cut to
    the width (the error in full follows for the run shown), or, where that leaves the
    error too little room, the error cut on the next line."""
    outcome = outcome_of(attempt["status"], attempt["failure_reason"])
    head = f"  {attempt['attempt']:>3}  run {attempt['id']:<8} {status_word(outcome, style)}"
    error = style.shown(printable(attempt["error"])) if attempt["error"] else ""
    reason = f"{attempt['failure_reason']}: {error}" if error and attempt["failure_reason"] else error
    here = "  <- this run" if this else ""
    if wide:
        return [head + (f"  {reason}" if reason else "") + here]
    if here and visible_len(head + here) > style.width:
        here = "  <-"
    room = style.width - visible_len(head) - visible_len(here) - 2
    if reason and room >= _ATTEMPT_ERROR_ROOM:
        return [f"{head}  {clip(reason, room, style.ellipsis)}{here}"]
    lines = [clip(head + here, style.width, style.ellipsis)]
    if reason:
        room = style.width - len(_ATTEMPT_ERROR_INDENT)
        lines.append(_ATTEMPT_ERROR_INDENT + clip(reason, room, style.ellipsis))
    return lines


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


#: Where a field's value starts in ``pgtick show``: after ``  definition  ``.
_FIELD_INDENT = " " * 14
#: Columns a field's value needs beside its label; with less room it goes under the label.
_FIELD_ROOM = 12


def _field_lines(label: str, value: str, style: Style, wide: bool, *, name: bool = False) -> list[str]:
    """``  label       value`` in ``pgtick show``, fitted to a terminal's width: the value wrapped
    under itself, or under the label where the terminal leaves it too little room beside it
    (a word too long for a line is cut, as a table cuts a cell: a ``name``, a definition's,
    a kind or a worker id, in the middle, so that two sharing a prefix stay apart)."""
    line = f"  {label:<11} {value}"
    if wide or not style.terminal or visible_len(line) <= style.width:
        return [line]  # piped: as stored, however long (to copy or grep)
    if style.width - len(_FIELD_INDENT) >= _FIELD_ROOM:
        return wrap(line, style.width, indent=_FIELD_INDENT, middle=name)
    return [f"  {label}", *wrap(f"    {value}", style.width, indent="    ", middle=name)]


def _block_lines(text: str, style: Style, wide: bool) -> list[str]:
    """A payload, result or error under its heading, indented: as stored when piped (to
    copy or grep), wrapped to the terminal's width on one, without losing a character."""
    lines = ["  " + line for line in text.splitlines()]
    if wide or not style.terminal:
        return lines
    out: list[str] = []
    for line in lines:
        lead = len(line) - len(line.lstrip(" "))
        out.extend(wrap(line, style.width, indent=" " * min(lead + 2, style.width // 2), whole=True))
    return out


# -- definitions, undefine, workers, prune ----------------------------------------------

DEFINITION_FIELDS = [
    "id", "name", "kind", "schedule", "timezone", "run_at", "paused", "finished", "next_run_at",
    "misfire_policy", "overlap_policy", "max_concurrent_runs", "priority", "max_attempts", "timeout",
    "payload", "schedule_error", "created_at", "updated_at", "next_start_at",
]  # fmt: skip


def cmd_definitions(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        rows = calls.definition_list(conn, args.kind, args.name, args.state, args.limit)
    data = [_jsonable(dict(r)) for r in rows]
    now = display_now()

    def state(d: dict[str, Any]) -> str:
        return (
            "error"
            if d["schedule_error"]
            else "paused"
            if d["paused"]
            else "finished"
            if d["finished"]
            else "active"
        )

    def text(style: Style, wide: bool) -> str:
        if not rows:
            return "no definitions"
        table = Table(
            [
                Column("NAME", lambda d: d["name"], priority=0, shrink=True, min_width=12, middle=True),
                Column("KIND", lambda d: d["kind"], priority=3, shrink=True, min_width=12, middle=True),
                Column(
                    "SCHEDULE", lambda d: d["schedule"] or "one-shot", priority=1, shrink=True, min_width=20
                ),
                Column("ZONE", lambda d: d["timezone"], priority=5),  # NEXT shows its abbreviation
                Column(
                    "STATE",
                    state,
                    priority=0,
                    colour=lambda d: "red" if d["schedule_error"] else "yellow" if d["paused"] else None,
                ),
                # The next start: a run already queued (a paused definition's too), else the cursor.
                Column("NEXT", lambda d: local_time(d["next_start_at"], d["timezone"], now), priority=2),
                Column("LEFT", lambda d: relative(d["next_start_at"], now), priority=3),
                Column("POLICIES", lambda d: f"{d['misfire_policy']}/{d['overlap_policy']}", priority=5),
                Column("CAP", lambda d: str(d["max_concurrent_runs"] or ""), priority=6, right=True),
                Column("PRIORITY", lambda d: str(d["priority"]), wide_only=True, right=True),
                Column("ATTEMPTS", lambda d: str(d["max_attempts"] or ""), wide_only=True, right=True),
                Column("TIMEOUT", lambda d: compact_duration(d["timeout"]), wide_only=True),
                Column("CREATED", lambda d: iso(d["created_at"]) or "", wide_only=True),
            ],
            [dict(r) for r in rows],
        )
        return table.render(style, wide=wide)

    return Result(data, text, DEFINITION_FIELDS)


def cmd_undefine(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        row = calls.undefine_detail(conn, args.name)
    assert row is not None
    data = {
        "definition": row["definition"],
        "cancelled": row["cancelled"],
        "still_running": list(row["still_running"]),
        "history": row["history"],
    }

    def text(style: Style, wide: bool) -> str:
        running = data["still_running"]

        def fit(line: str, indent: str) -> list[str]:
            # Piped: each line as it is, the name whole (to copy or grep).
            return wrap(line, style.width, indent=indent) if style.terminal else [line]

        lines = [
            *fit(f"definition={args.name} deleted", "  "),
            *fit(f"  {counted(data['cancelled'], 'queued run')} cancelled", "    "),
            *_first_ids(f"  {counted(len(running), 'running run')} will finish", running, style),
            *fit(
                f"  {counted(data['history'], 'finished run')} kept as history"
                " (pgtick prune removes them with age)",
                "    ",
            ),
        ]
        return "\n".join(lines)

    return Result(data, text)


def _first_ids(line: str, ids: Sequence[int], style: Style) -> list[str]:
    """``line: 1, 2, 3`` with as many of ``ids`` as fit the width, and how many more there
    are (``--json`` lists every one): ``line: 1, 2 … and 298 more``. Where ``line`` leaves
    no room for the first id, it is wrapped and the ids follow on a line of their own."""
    if not ids:
        return wrap(line, style.width, indent="    ")
    one = _ids_that_fit(f"{line}: ", ids, style)
    if visible_len(one) <= style.width:
        return [one]
    return [*wrap(f"{line}:", style.width, indent="    "), _ids_that_fit("    ", ids, style)]


def _ids_that_fit(prefix: str, ids: Sequence[int], style: Style) -> str:
    """``prefix`` then the first of ``ids`` that fit the width (one at least), and how many more."""
    shown, count = f"{prefix}{ids[0]}", 1
    for run_id in ids[1:]:
        longer = f"{shown}, {run_id}"
        rest = len(ids) - count - 1
        if visible_len(longer + (f" {style.ellipsis} and {rest} more" if rest else "")) > style.width:
            break
        shown, count = longer, count + 1
    return shown if count == len(ids) else f"{shown} {style.ellipsis} and {len(ids) - count} more"


WORKER_FIELDS = [
    "worker", "state", "host", "pid", "kinds", "started_at", "last_seen_at", "seen_age", "running",
    "run_ids", "oldest_heartbeat_age", "oldest_heartbeat_at", "login", "queues",
]  # fmt: skip


def cmd_workers(args: argparse.Namespace) -> Result:
    with connect_dicts(_dsn(args)) as conn:
        rows = calls.workers(conn, args.all)
    data = [_jsonable(dict(r)) for r in rows]
    now = display_now()

    def text(style: Style, wide: bool) -> str:
        if not rows:
            if args.all:
                return "no workers"
            return "no live workers (pgtick workers --all shows stopped and lost ones)"
        state_colour = {"alive": "green", "lost": "red", "stopped": "dim"}
        table = Table(
            [
                Column("WORKER", lambda w: w["worker"], priority=0, shrink=True, min_width=14, middle=True),
                Column("STATE", lambda w: w["state"], priority=0, colour=lambda w: state_colour[w["state"]]),
                Column("SEEN", lambda w: relative(w["last_seen_at"], now), priority=1),
                Column("UP", lambda w: compact_duration(now - w["started_at"]), priority=3, right=True),
                Column("RUNNING", lambda w: str(w["running"]), priority=0, right=True),
                Column("RUNS", lambda w: ",".join(map(str, w["run_ids"])), priority=2, shrink=True),
                Column("HEARTBEAT", lambda w: _age(w["oldest_heartbeat_at"], now), priority=2, right=True),
                Column("KINDS", lambda w: ",".join(w["kinds"]), priority=4, shrink=True, min_width=16),
                Column("QUEUES", lambda w: ",".join(w["queues"]) if w["queues"] else "all", wide_only=True),
                Column("HOST", lambda w: f"{w['host']}:{w['pid']}", wide_only=True),
                Column("LOGIN", lambda w: w["login"] or "", wide_only=True),
            ],
            [dict(r) for r in rows],
        )
        return table.render(style, wide=wide)

    return Result(data, text, WORKER_FIELDS)


def cmd_prune(args: argparse.Namespace) -> Result:
    older = timedelta(seconds=args.older_than) if args.older_than else None
    with connect(_dsn(args)) as conn:
        total = calls.prune_count(conn, older)
        if args.dry_run:
            return Result(
                {"dry_run": True, "rows": total, "deleted": 0},
                lambda s, w: f"would delete {counted(total, 'finished run')} (dry run)",
            )
        from pgtick.progress import Bar

        deleted = 0
        try:
            # Each batch commits: Ctrl-C stops after the batch in flight (a second one at
            # once), so the count said below is what was deleted.
            with Bar("prune", total, enabled=_progress_enabled()) as bar, _interrupt_between() as asked:
                while True:
                    n = calls.prune_batch(conn, older, args.batch)
                    deleted += n
                    bar.advance(n)
                    if n < args.batch:
                        break
                    if asked():
                        raise KeyboardInterrupt
        except (KeyboardInterrupt, psycopg.Error, PgtickError) as exc:
            if isinstance(exc, KeyboardInterrupt):
                _warn("prune", f"interrupted after deleting {deleted} of {counted(total, 'finished run')}")
            elif deleted:  # else the error line alone says it all: nothing was deleted
                _warn(
                    "prune",
                    f"stopped by the error below after deleting {deleted}"
                    f" of {counted(total, 'finished run')}",
                )
            raise
    return Result(
        {"dry_run": False, "rows": total, "deleted": deleted},
        lambda s, w: f"deleted {counted(deleted, 'finished run')}",
    )


# -- preview, backfill, lock, dsn ----------------------------------------------------------


def _preview_data(
    schedule: Schedule,
    occurrences: Sequence[Occurrence],
    runs: Sequence[datetime],
    definition: str | None = None,
) -> dict[str, Any]:
    """What `pgtick preview --json` prints (schema: docs/schemas/preview.json): the effective
    DST policy, each run (`runs`: the occurrences' instants, jittered for a definition) with
    its offset and what DST did to it, and the wall times a gap skipped."""
    from pgtick.schedule.preview import format_offset

    tz = _zone(schedule.timezone)
    instants = iter(runs)
    shown: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for occurrence in occurrences:
        if occurrence.at is None:
            skipped.append({"local": occurrence.wall.replace(tzinfo=None).isoformat(), "dst": occurrence.dst})
            continue
        local = next(instants).astimezone(tz)
        shown.append(
            {
                "local": local.replace(tzinfo=None).isoformat(),
                "abbreviation": local.tzname(),
                "offset": format_offset(local.utcoffset()),
                "utc": iso(local),
                "dst": occurrence.dst,
            }
        )
    return {
        "schedule": schedule.text,
        "timezone": schedule.timezone,
        "definition": definition,
        "dst_gap": schedule.policy.gap,
        "dst_repeat": schedule.policy.repeat,
        "runs": shown,
        "skipped": skipped,
    }


def cmd_preview(args: argparse.Namespace) -> Result:
    from pgtick.schedule import ScheduleError, anchor_for, format_preview, header, parse_schedule, preview

    if (args.schedule is None) == (args.definition is None):
        raise UsageError("give a schedule or --definition NAME (not both)")
    if args.definition is not None:
        if args.anchor is not None or args.tz is not None:
            raise UsageError("--anchor and --tz come from the definition; leave them out with --definition")
        return _preview_definition(args)
    tz = args.tz or "UTC"
    after = read_time(args.after, tz, field_name="--after", zone_name="--tz") or datetime.now(UTC)
    try:
        if args.anchor is None:  # as if the definition were created at the start of the preview
            anchor = anchor_for(after, tz)
            note = (
                "as if defined now: local midnight today"
                if args.after is None
                else "as if defined at --after: local midnight that day"
            )
        else:
            anchor = read_time(args.anchor, tz, field_name="--anchor", zone_name="--tz")
            assert anchor is not None
            note = "--anchor"
        schedule = parse_schedule(
            args.schedule, tz, anchor=anchor, dst_gap=args.dst_gap, dst_repeat=args.dst_repeat
        )
        lines = format_preview(schedule, after, args.count)
        occurrences = preview(schedule, after, args.count)
        runs = [o.at for o in occurrences if o.at is not None]
    except (ScheduleError, LookupError) as exc:
        raise UsageError(str(exc)) from exc
    except OverflowError as exc:  # a local time before the year 1 or after 9999
        raise UsageError(f"the schedule's times in {tz} fall outside the years 1 to 9999 ({exc})") from exc
    out = [_preview_title(args.count, len(runs), f"{args.schedule!r} in {tz}", "(local, then UTC)")]
    out += [f"  {line}" for line in header(schedule, anchor_note=note)]
    if not runs and args.count:
        out.append("  no further occurrences: the schedule has ended")
    out += [f"  {line}" for line in lines]
    return Result(_preview_data(schedule, occurrences, runs), lambda st, w: "\n".join(out))


def _preview_title(asked: int, found: int, what: str, shown: str = "") -> str:
    """``next N runs of WHAT SHOWN:``, saying so when the schedule ends before N."""
    if found >= asked:
        return f"next {counted(asked, 'run')} of {what}" + (f" {shown}" if shown else "") + ":"
    ends = "the schedule has no more"
    if found == 0:
        return f"no more runs of {what}: {ends}"
    notes = f"{shown[1:-1]}; {ends}" if shown else ends
    return f"next {counted(found, 'run')} of {what} ({notes}):"


def _preview_definition(args: argparse.Namespace) -> Result:
    """A stored definition's next runs exactly as the scheduler will materialize them."""
    from pgtick.schedule import ScheduleError, format_preview, header, preview
    from pgtick.scheduler import definition_schedule

    with connect_dicts(_dsn(args)) as conn:
        d = calls.definition(conn, args.definition)
        if d is None:
            raise UsageError(f"definition {args.definition!r} does not exist")
        if d["schedule"] is None:
            raise UsageError(f"definition {args.definition!r} is a one-shot at {d['run_at'].isoformat()}")
        if args.dst_gap is not None or args.dst_repeat is not None:
            d = {**d, "dst_gap": args.dst_gap or d["dst_gap"]}
            d["dst_repeat"] = args.dst_repeat or d["dst_repeat"]
        zone_name = "the definition's timezone"
        after = read_time(args.after, d["timezone"], field_name="--after", zone_name=zone_name)
        after = after or datetime.now(UTC)

        queued = calls.queued_occurrences(conn, d["id"]) if not d["enabled"] else (0, None)

        def jitter(runs: Sequence[datetime]) -> list[timedelta]:
            return calls.jitter_offsets(conn, d["id"], d["jitter"], list(runs))

        try:
            schedule = definition_schedule(d)
            lines = format_preview(schedule, after, args.count, delay=jitter)
            occurrences = preview(schedule, after, args.count)
            plain = [o.at for o in occurrences if o.at is not None]
            runs = [t + j for t, j in zip(plain, jitter(plain), strict=True)] if plain else []
        except ScheduleError as exc:
            raise UsageError(str(exc)) from exc
        except OverflowError as exc:  # created_at or --after near the ends of the calendar
            raise UsageError(
                f"definition {d['name']!r}: its times in {d['timezone']} fall outside"
                f" the years 1 to 9999 ({exc})"
            ) from exc
    what = f"definition {d['name']!r} ({d['schedule']!r} in {d['timezone']})"
    out = [_preview_title(args.count, len(runs), what)]
    out += [f"  {line}" for line in header(schedule, anchor_note="local midnight of the day it was created")]
    out += [f"  {line}" for line in _not_run_notes(d, bool(plain) or args.count == 0, queued)]
    out += [f"  {line}" for line in lines]
    data = _preview_data(schedule, occurrences, runs, definition=d["name"])
    return Result(data, lambda st, w: "\n".join(out))


def _not_run_notes(
    d: dict[str, Any], has_runs: bool, queued: tuple[int, datetime | None] = (0, None)
) -> list[str]:
    """Why the scheduler will not run the occurrences a definition's preview lists: it is
    paused (but the runs it materialized before the pause, `queued`, still start), its
    schedule is in error, or the schedule has ended."""
    notes = []
    if not d["enabled"]:
        reason = f" ({d['paused_reason']})" if d.get("paused_reason") else ""
        count, last = queued
        if count and last is not None:
            local = strftime(last.astimezone(_zone(d["timezone"])), "%Y-%m-%d %H:%M %Z")
            notes.append(
                f"paused{reason}: {counted(count, 'run')} queued before the pause still start"
                f" (the last at {local}); none of the later ones until `pgtick resume {d['name']}`"
            )
        else:
            notes.append(f"paused{reason}: none of these runs until `pgtick resume {d['name']}`")
    if d.get("schedule_error"):
        notes.append(f"not scheduled until defined again: {printable_line(d['schedule_error'])}")
    if not has_runs:
        notes.append("no further occurrences: the schedule has ended")
    return notes


def cmd_lock(args: argparse.Namespace) -> int:
    from pgtick.lock import run_locked

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("give the command to run after --, e.g. pgtick lock NAME --ttl 5m -- cmd")
    return run_locked(_dsn(args), args.name, args.ttl, cmd, owner=args.owner, skipped_exit=args.skipped_exit)


def cmd_web(args: argparse.Namespace) -> int:
    try:
        from pgtick.web.serve import operator_secret, parse_bind, serve
    except ImportError as exc:
        raise UsageError(f"the dashboard needs the web extra: pip install 'pgtick[web]' ({exc})") from None
    parse_bind(args.bind)
    secret = operator_secret(args.password_file)
    try:
        dsn = _dsn(args)
        with connect(dsn) as conn:  # a server it cannot reach, no schema or an older one: say so now
            migrate.check_schema(conn)  # (a newer one is the dashboard's warning as it starts)
        return serve(
            dsn,
            args.bind,
            secret,
            args.db_timeout,
            cookie_secure=args.cookie_secure,
            trust_proxy=args.trust_proxy,
        )
    finally:
        if _embedded is not None:
            _embedded.stop()


def cmd_dsn(args: argparse.Namespace) -> Result:
    dsn = _dsn(args)
    return Result({"dsn": dsn}, lambda s, w: dsn)


# -- entry point ----------------------------------------------------------------------


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse argv; for ``pgtick lock ... -- CMD ARGS`` everything after the first ``--``
    is the command, verbatim (its own options included). Words no option takes are reported
    by the command they were given to (``pgtick show: error: ...``)."""
    if "--" in argv:
        split = argv.index("--")
        head, command = argv[:split], argv[split + 1 :]
        subcommand = next((a for a in head if not a.startswith("-")), None)
        if subcommand == "lock":
            args = _parse_known(parser, head)
            if args.cmd:
                _subparser(parser, "lock").error(
                    f"unrecognized arguments: {' '.join(args.cmd)} (the command goes after --)"
                )
            args.cmd = command
            return args
    _refuse_options_before_the_command(parser, argv)
    args, extras = parser.parse_known_args(argv)
    if getattr(args, "command", None) == "lock" and (args.cmd or extras):  # no -- before the command
        given = " ".join([*args.cmd, *extras])
        _subparser(parser, "lock").error(
            f"give the command after --: pgtick lock {args.name} --ttl ... -- {given}"
        )
    _refuse_extras(parser, args, extras)
    return args


def _refuse_options_before_the_command(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """``pgtick --dsn URL status``: an option of the command typed before it. argparse would
    read its value as the command (and quote it, password and all) or report the option as one
    the command does not take; say where it goes instead, without its value."""
    commands = _commands(parser)
    words = argv[: argv.index("--")] if "--" in argv else argv
    at = next((i for i, word in enumerate(words) if word in commands), None)
    if at is None:
        return
    word = words[at]
    command = commands[word]
    for given in argv[:at]:
        option = given.split("=", 1)[0]
        if option.startswith("-") and option not in parser._option_string_actions:
            if option in command._option_string_actions:
                command.error(f"{option} goes after the command: pgtick {word} {option} ...")


def _parse_known(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, extras = parser.parse_known_args(argv)
    _refuse_extras(parser, args, extras)
    return args


def _refuse_extras(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> None:
    """Words no option took: reported by the command they were given to."""
    if extras:
        _subparser(parser, getattr(args, "command", None)).error(
            f"unrecognized arguments: {' '.join(extras)}"
        )


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands' parsers by name."""
    for action in parser._actions:  # argparse keeps its subparsers there, and only there
        if isinstance(action, argparse._SubParsersAction):
            found: dict[str, argparse.ArgumentParser] = action.choices
            return found
    return {}


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of ``command`` (the top-level parser when there is none)."""
    return _commands(parser).get(command or "", parser)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``sys.argv[1:]`` unless given); returns the exit code. A Ctrl-C at
    any point of it, from building the parser to the command's last line, is exit 130 and
    nothing on stderr."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130


def _main(argv: Sequence[str] | None) -> int:
    from pgtick.logs import setup_logging

    if sys.stderr is None:  # started with standard error closed (2>&-): its lines go nowhere
        _discard_stderr()
    parser = build_parser()
    try:
        import argcomplete

        argcomplete.autocomplete(parser)
    except ImportError:  # completion is a convenience; the CLI works without it
        pass
    if not utf8(sys.stdout) and isinstance(sys.stdout, io.TextIOWrapper):
        # An output that is not UTF-8 (a legacy locale): a name it cannot encode is shown as
        # "?" rather than ending the command in a traceback; JSON escapes it instead.
        sys.stdout.reconfigure(errors="replace")
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, undecodable = _argv_as_text(argv)
    if undecodable is not None:
        _say(f"pgtick: error: an argument is not valid UTF-8: {undecodable!r}")
        return 2
    try:
        args = _parse(parser, argv)  # --help is written here
        if args.version:
            if args.command is not None:
                parser.error(f"--version takes no command (got {args.command})")
            print(f"pgtick {__version__}", flush=True)
            return 0
    except BrokenPipeError:  # the reader left: stop quietly, as a command does
        _discard_stdout()
        return 1
    except OSError as exc:  # a full disk, a closed descriptor
        _discard_stdout()
        _say(f"pgtick: error: cannot write the output: {exc.strerror or exc}")
        return 1
    setup_logging(
        verbose=args.verbose,
        log_format=getattr(args, "log_format", None),
        outcomes=args.command == "run",
    )
    if args.command is None:  # the help, as the usage of a usage error: on stderr, exit 2
        parser.print_help(sys.stderr)
        return 2
    if sys.stdout is None and args.command not in _SILENT_COMMANDS:
        _error(args.command, "standard output is closed: nothing done, as nothing could be shown")
        return 1
    ran = False  # the command's work is done (committed): only its output is left to write
    try:
        if args.command not in _UNDISPLAYED_COMMANDS:
            # PGTICK_NOW, read like an argument before anything is done: a command that
            # changes something shows its result with it only after its commit.
            display_now()
        # The SQL API's bad input -> InvalidArgument / NotFound (exit 2); a refused privilege ->
        # PermissionDenied naming the role this command needs (exit 1).
        with translate_errors(Session(role=_role_needed(args), what=f"pgtick {args.command}")):
            result = args.fn(args)
        ran = True
        code = _emit(args, result) if isinstance(result, Result) else int(result)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full disk fails here, as an error line, not in the flush at exit
        return code
    except UsageError as exc:
        _error(args.command, str(exc))
        return 2
    except PgtickError as exc:
        _error(args.command, str(exc))
        return 1
    except psycopg.Error as exc:
        _error(args.command, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        return 1
    except BrokenPipeError:  # the reader left (`pgtick runs | head`): stop quietly
        _discard_stdout()
        return 1
    except OSError as exc:  # mostly the output cannot be written: a full disk, a closed descriptor
        _discard_stdout()
        what = exc.filename if exc.filename is not None else "cannot write the output"
        if ran and exc.filename is None and args.command in _CHANGING_COMMANDS:
            what += " (the change itself was made)"  # run again, an enqueue would queue a second run
        _error(args.command, f"{what}: {exc.strerror or exc}")
        return 1


#: Commands that only read: the console role jobs_reader runs them (docs/cli.md).
_READING_COMMANDS = frozenset({"status", "runs", "show", "definitions", "workers", "preview"})


def _role_needed(args: argparse.Namespace) -> str | None:
    """The role a login needs to run this command (docs/cli.md), to name when the database
    refused it a privilege; None where it depends on more than the command (run, migrate,
    web)."""
    if args.command in _READING_COMMANDS or (args.command == "prune" and args.dry_run):
        return "jobs_reader"
    if args.command in ("run", "migrate", "web", "dsn"):
        return None
    return "jobs_operator"


#: Commands whose work is not their standard output (a worker, a locked command's own).
_SILENT_COMMANDS = frozenset({"run", "lock"})

#: Commands that show nothing with the display clock (PGTICK_NOW).
_UNDISPLAYED_COMMANDS = _SILENT_COMMANDS | {"web"}

#: Commands that change what the database holds: their output comes after their commit.
_CHANGING_COMMANDS = frozenset(
    {
        "migrate", "define", "backfill", "enqueue", "run-now", "cancel", "pause", "resume",
        "pause-queue", "resume-queue", "scope-worker", "unscope-worker", "retry", "undefine", "prune",
    }
)  # fmt: skip


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so that the flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no descriptor to replace
        pass
    finally:
        os.close(devnull)


def entry() -> NoReturn:
    """The ``pgtick`` command: ``main()``, then exit with its code even when job code left
    threads of its own running (Python would wait for them at exit, for ever)."""
    code = main()
    left = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if left:
        log.warning("exiting with threads job code started still running: %s", ", ".join(left))
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or the reader left
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
