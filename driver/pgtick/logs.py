"""Logging for the command line: results on stdout, diagnostics on stderr.

* Every command logs WARNING and up to stderr (``-v``: DEBUG; ``PGTICK_LOG=INFO``
  sets a level explicitly).
* ``pgtick run`` also logs its own facts at INFO: one line per run outcome
  (logger ``pgtick.outcome``), what job code logs through ``ctx.logger`` (``pgtick.job``),
  start and stop, leadership, moves to history and catch-up progress (``pgtick.run``,
  ``pgtick.worker``, ``pgtick.scheduler``, ``pgtick.supervisor``), the embedded server
  (``pgtick.embedded``), the metrics endpoint (``pgtick.metrics``: its address, the gauges
  left out and back).
* the human format is ``time level logger message``, and on a terminal shorter:
  ``05:02:50 run=12 kind=tick ...`` (the level only from WARNING up); each message on one
  line, its control characters written out (``^[``, ``^J``);
* ``--log-format json`` (or ``PGTICK_LOG_FORMAT=json``) writes one JSON object per
  line with stable field names (docs/cli.md): ``ts``, ``level``, ``logger``,
  ``message``, and for run outcomes ``event: "run_outcome"``, ``run_id``, ``kind``,
  ``definition``, ``status``, ``attempt``, ``duration_s``, ``worker``, ``error``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

from pgtick.terminal import compact_duration, json_controls_escaped, printable, printable_line

#: Loggers ``pgtick run`` shows at INFO even without -v: these lines are its output.
RUN_LOGGERS = (
    "pgtick.outcome",
    "pgtick.job",
    "pgtick.run",
    "pgtick.worker",
    "pgtick.scheduler",
    "pgtick.supervisor",
    "pgtick.embedded",
    "pgtick.metrics",
)

outcome_log = logging.getLogger("pgtick.outcome")

_handler: logging.Handler | None = None


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``extra={"fields": {...}}`` adds stable fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        # What job code logs through ctx.logger carries its run (LoggerAdapter extras).
        for attr, key in (("run", "run_id"), ("kind", "kind"), ("attempt", "attempt")):
            if hasattr(record, attr):
                entry[key] = getattr(record, attr)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # C1 controls (U+009B is CSI) escaped as in every JSON the CLI writes: a terminal
        # tailing the log would obey them; JSON escapes C0 itself.
        return json_controls_escaped(json.dumps(entry, ensure_ascii=False, default=str))


class HumanFormatter(logging.Formatter):
    """The human format, whose lines show what was logged and do nothing else. Job code logs
    what its payload holds: a message's control characters are written out (``^[``,
    ``\\x9b``, a line break as ``^J``), so it can neither clear nor recolour the operator's
    screen nor forge a line of its own; a traceback's too, but its line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable_line(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info))


class TerminalFormatter(HumanFormatter):
    """For a person at a terminal: ``05:02:50 run=12 kind=tick ...``; the level only from
    WARNING up, no logger name (the line fits 100 columns)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            stamp, _, rest = text.partition(" ")
            text = f"{stamp} {record.levelname} {rest}"
        return text


class _Quiet(logging.StreamHandler):  # type: ignore[type-arg]
    """A line that cannot be written is dropped: job code that closed or replaced stderr must
    not make every later log call raise in the worker's threads (logging's own report of
    the failure goes to that same stderr, and raises again)."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


#: The levels PGTICK_LOG names.
_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}


def setup_logging(*, verbose: bool, log_format: str | None, outcomes: bool) -> None:
    """Configure the root logger once for this process (see the module doc)."""
    fmt = (log_format or os.environ.get("PGTICK_LOG_FORMAT") or "human").strip().lower()  # as PGTICK_LOG
    handler = _Quiet(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    elif sys.stderr.isatty():
        handler.setFormatter(TerminalFormatter())
    else:
        handler.setFormatter(HumanFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    global _handler
    root = logging.getLogger()
    if _handler is not None:  # configured before in this process (tests call main() again)
        root.removeHandler(_handler)
    _handler = handler
    root.addHandler(handler)
    explicit = (os.environ.get("PGTICK_LOG") or "").strip().upper()
    level = logging.DEBUG if verbose else _LEVELS.get(explicit, logging.WARNING)
    root.setLevel(level)
    said = logging.getLogger("pgtick.logs")
    if explicit and explicit not in _LEVELS:
        names = ", ".join(_LEVELS)
        said.warning("PGTICK_LOG=%s is not a level (%s): logging WARNING and up", explicit, names)
    if fmt not in ("human", "json"):
        said.warning("PGTICK_LOG_FORMAT=%s is not a log format (human, json): logging for humans", fmt)
    for name in RUN_LOGGERS:
        logging.getLogger(name).setLevel(min(level, logging.INFO) if outcomes else logging.NOTSET)
    # pgserver logs a failed start as ERROR lines that carry the whole server log; pgtick.embedded
    # says it in one line with the log's FATAL (the log stays in the data directory).
    logging.getLogger("pgserver").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.CRITICAL)


def log_outcome(
    *,
    run_id: int,
    kind: str,
    definition: str | None,
    status: str,
    attempt: int,
    duration: float,
    worker: str,
    error: str | None = None,
    retry_run_id: int | None = None,
    snoozed_for: float | None = None,
) -> None:
    """One line per run outcome: ``run=12 kind=report definition=nightly status=COMPLETED
    attempt=1 duration=0.53s``; the same facts as fields in JSON."""
    level = logging.WARNING if status in ("FAILED", "FENCED") else logging.INFO
    if not outcome_log.isEnabledFor(level):
        return  # nobody reads it: a worker finishing thousands of runs a second builds no line
    fields: dict[str, Any] = {
        "event": "run_outcome",
        "run_id": run_id,
        "kind": kind,
        "definition": definition,
        "status": status,
        "attempt": attempt,
        "duration_s": round(duration, 3),
        "worker": worker,
        "error": error,
    }
    if retry_run_id is not None:
        fields["retry_run_id"] = retry_run_id
    if snoozed_for is not None:
        fields["snoozed_for_s"] = snoozed_for
    text = (
        f"run={run_id} kind={kind} definition={definition or '-'} status={status} attempt={attempt}"
        f" duration={compact_duration(duration)}"
    )
    if retry_run_id is not None:
        text += f" retry=run {retry_run_id}"
    if snoozed_for is not None:
        text += f" due_in={compact_duration(snoozed_for)}"
    if error:  # its control characters written out: a terminal would obey them, journald hides the line
        lines = printable(error).splitlines()
        text += f" error={lines[0] if lines else ''}"
    outcome_log.log(level, "%s", text, extra={"fields": fields})
